"""``failslow schema [FILE] [--cluster NAME] [--database DB]``: the ClickHouse schema, generated
from the output contract (:mod:`failslow.results`), for one server or a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _cmd_schema(args: argparse.Namespace) -> int:
    from failslow.stream.clickhouse import schema_sql, write_schema

    if args.file is None:
        sys.stdout.write(schema_sql(args.database, args.cluster))
        return 0
    write_schema(args.file, args.cluster, database=args.database)
    print(f"wrote {args.file}")
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``failslow schema``."""
    from failslow.stream.clickhouse import DEFAULT_DATABASE

    p = subparsers.add_parser(
        "schema", help="print or write the ClickHouse schema (one server or a cluster)",
        description="The ClickHouse DDL of every table failslow stores, generated from the "
                    "output contract. Without --cluster: single-server tables (what "
                    "docker-compose mounts from infra/clickhouse/schema.sql). With --cluster "
                    "NAME: Replicated tables created ON CLUSTER and Distributed tables over "
                    "them, under the same names.")
    p.add_argument("file", nargs="?", default=None, metavar="FILE",
                   help="write the schema here (default: print it)")
    p.add_argument("--cluster", default=None, metavar="NAME",
                   help="the schema for the ClickHouse cluster NAME")
    p.add_argument("--database", default=DEFAULT_DATABASE,
                   help="database name (default: %(default)s)")
    p.set_defaults(func=_cmd_schema)
