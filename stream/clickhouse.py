"""ClickHouse storage: the schema, generated from the Arrow schemas of the contract
(failslow.events.SCHEMAS, failslow.results.SCHEMAS and the anomalies record), and a sink
that writes Arrow tables with ``insert_arrow``.

By default the database is embedded chDB in a local directory (no server to run); with a
URL the same code talks to a ClickHouse server. chDB runs one engine per process: close the
client (``ClickHouseSink.close()`` or ``client.close()``) before opening another directory.

Idempotence: every table sets ``non_replicated_deduplication_window`` and each write passes
``insert_deduplication_token`` derived from the checkpoint's input offsets, so a batch that
is written again after a timeout or back-pressure is dropped by ClickHouse instead of
duplicated. A processor restart that re-reads uncommitted messages may cut them into
different batches; then the derived tables (ReplacingMergeTree: ``rounds``, ``iterations``,
``anomalies``, ``meta``) still collapse duplicates on merge (read them with ``FINAL``), while
the raw event tables (plain MergeTree) may hold the re-read rows twice.

Run ``python -m failslow.stream.clickhouse --write-schema infra/clickhouse/schema.sql`` to
regenerate the committed DDL.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow import events, results
from failslow.diagnosis import Anomaly
from failslow.stream.sink import (
    ANOMALY_SCHEMA,
    Sink,
    SinkBackpressureError,
    SinkBatch,
    anomalies_from_table,
    select_schema,
)

DEFAULT_DATABASE = "failslow"
DEDUP_WINDOW = 1000


@dataclass(frozen=True)
class TableSpec:
    """How one Arrow schema is stored."""

    name: str
    schema: pa.Schema
    engine: str
    order_by: tuple[str, ...]
    comment: str
    #: string columns stored as LowCardinality (enumerations and small name sets)
    low_cardinality: frozenset[str] = frozenset()


def _enum_columns(kind: str) -> frozenset[str]:
    return frozenset(events.ENUMS.get(kind, {}))


_NAMES = frozenset({"job", "node", "device", "peer_node"})

#: Every table, in creation order.
TABLES: tuple[TableSpec, ...] = (
    TableSpec("meta", events.SCHEMAS["meta"], "ReplacingMergeTree(t)", ("job",),
              "job descriptions; the row with the largest t wins",
              _enum_columns("meta") | {"job"}),
    TableSpec("coll", events.SCHEMAS["coll"], "MergeTree", ("job", "comm", "seq", "rank"),
              "collective and point-to-point operations, enter and end rows",
              _enum_columns("coll") | {"job"}),
    TableSpec("progress", events.SCHEMAS["progress"], "MergeTree",
              ("job", "comm", "seq", "rank", "t"), "in-flight progress samples",
              frozenset({"job"})),
    TableSpec("link", events.SCHEMAS["link"], "MergeTree", ("job", "node", "device", "t"),
              "RDMA work-request counters", _NAMES),
    TableSpec("gpu", events.SCHEMAS["gpu"], "MergeTree", ("job", "node", "gpu", "t"),
              "device samples", frozenset({"job", "node"})),
    TableSpec("span", events.SCHEMAS["span"], "MergeTree", ("job", "rank", "step", "t_start"),
              "framework spans", _enum_columns("span") | {"job"}),
    TableSpec("rounds", results.SCHEMAS["rounds"], "ReplacingMergeTree",
              ("job", "comm", "seq", "t_first_enter", "last_rank"),
              "completed rounds (derived by the detectors)", frozenset({"job", "op"})),
    TableSpec("iterations", results.SCHEMAS["iterations"], "ReplacingMergeTree",
              ("job", "rank", "iteration"),
              "training iterations per rank, rank -1 = the job (derived)", frozenset({"job"})),
    TableSpec("anomalies", ANOMALY_SCHEMA, "ReplacingMergeTree(version)", ("job", "id"),
              "one row per anomaly report; the largest version of (job, id) wins",
              frozenset({"job", "kind", "cause", "comm_kind", "stage"})),
)
SPECS: dict[str, TableSpec] = {s.name: s for s in TABLES}

_SCALARS: dict[pa.DataType, str] = {
    pa.int8(): "Int8", pa.int16(): "Int16", pa.int32(): "Int32", pa.int64(): "Int64",
    pa.uint8(): "UInt8", pa.uint16(): "UInt16", pa.uint32(): "UInt32", pa.uint64(): "UInt64",
    pa.float32(): "Float32", pa.float64(): "Float64", pa.bool_(): "Bool",
    pa.string(): "String",
}


def clickhouse_type(field: pa.Field, low_cardinality: bool = False) -> str:
    """The ClickHouse type of an Arrow field."""
    typ = field.type
    if pa.types.is_list(typ):
        inner = clickhouse_type(typ.value_field)
        return f"Array({inner})"  # arrays cannot be Nullable; empty stands for none
    if typ not in _SCALARS:
        raise TypeError(f"no ClickHouse type for {field.name}: {typ}")
    name = _SCALARS[typ]
    if field.nullable:
        name = f"Nullable({name})"
    if low_cardinality and pa.types.is_string(typ):
        name = f"LowCardinality({name})"
    return name


def create_table(spec: TableSpec, database: str) -> str:
    width = max(len(f.name) for f in spec.schema)
    cols = [f"    `{f.name}`{' ' * (width - len(f.name))} "
            f"{clickhouse_type(f, f.name in spec.low_cardinality)}" for f in spec.schema]
    if "t" in spec.schema.names:  # readable time for dashboards; not stored
        cols.append(f"    `time`{' ' * (width - 4)} DateTime64(9) ALIAS "
                    "fromUnixTimestamp64Nano(t)")
    return (f"CREATE TABLE IF NOT EXISTS `{database}`.`{spec.name}`\n(\n"
            + ",\n".join(cols)
            + f"\n)\nENGINE = {spec.engine}\nORDER BY ({', '.join(spec.order_by)})\n"
            f"SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}\n"
            f"COMMENT '{spec.comment}'")


def ddl(database: str = DEFAULT_DATABASE) -> list[str]:
    """The statements that create the database and every table (idempotent)."""
    if not database.replace("_", "").isalnum():
        raise ValueError(f"database name {database!r}: letters, digits and _ only")
    return [f"CREATE DATABASE IF NOT EXISTS `{database}`"] + [create_table(s, database)
                                                              for s in TABLES]


def schema_sql(database: str = DEFAULT_DATABASE) -> str:
    """:func:`ddl` as one SQL file."""
    head = ("-- failslow ClickHouse schema (event contract v"
            f"{events.VERSION}). Generated by\n"
            "--   python -m failslow.stream.clickhouse --write-schema "
            "infra/clickhouse/schema.sql\n-- Do not edit by hand.\n\n")
    return head + ";\n\n".join(ddl(database)) + ";\n"


# ---------------------------------------------------------------------------------------------
# connecting


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/failslow``, else ``~/.local/share/failslow``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "failslow"


def connect(data_dir: str | Path | None = None, url: str | None = None) -> Any:
    """A clickhouse-connect client: a server when ``url`` is given (e.g.
    ``http://default:@127.0.0.1:8123``), else embedded chDB storing in ``DATA_DIR/clickhouse``
    (default :func:`default_data_dir`)."""
    import clickhouse_connect

    if url:
        return clickhouse_connect.get_client(dsn=url)
    path = Path(data_dir) if data_dir is not None else default_data_dir()
    (path / "clickhouse").mkdir(parents=True, exist_ok=True)
    return clickhouse_connect.get_client(interface="chdb", path=str(path / "clickhouse"))


# ---------------------------------------------------------------------------------------------
# the sink


class ClickHouseSink(Sink):
    """Writes the processor's tables into ClickHouse (one ``insert_arrow`` per table per
    checkpoint) and reads them back. Creates the schema on construction."""

    def __init__(self, client: Any, database: str = DEFAULT_DATABASE,
                 create: bool = True) -> None:
        self.client = client
        self.database = database
        if create:
            self.create_schema()

    def create_schema(self) -> None:
        for statement in ddl(self.database):
            self.client.command(statement)

    def drop(self) -> None:
        """Drop the database (demo re-runs)."""
        self.client.command(f"DROP DATABASE IF EXISTS `{self.database}`")

    def write(self, batch: SinkBatch) -> None:
        from clickhouse_connect.driver.exceptions import OperationalError

        for name, table in batch.tables.items():
            spec = SPECS.get(name)
            if spec is None:
                raise ValueError(f"no ClickHouse table for {name!r}")
            if not table.num_rows:
                continue
            settings = {"insert_deduplication_token": f"{batch.token}/{name}"} \
                if batch.token else None
            try:
                self.client.insert_arrow(f"`{self.database}`.`{name}`",
                                         select_schema(table, spec.schema), settings=settings)
            except OperationalError as e:  # server unreachable or overloaded: retry later
                raise SinkBackpressureError(1.0, f"ClickHouse: {e}") from e

    def close(self) -> None:
        self.client.close()

    # reading back

    def read(self, name: str, job: str | None = None, final: bool = True) -> pa.Table:
        """All rows of table ``name`` (of one job), with the contract's Arrow schema."""
        spec = SPECS[name]
        cols = ", ".join(f"`{c}`" for c in spec.schema.names)
        fin = " FINAL" if final and "Replacing" in spec.engine else ""
        where = " WHERE job = {job:String}" if job is not None else ""
        order = f" ORDER BY {', '.join(spec.order_by)}"
        result = self.client.query_arrow(
            f"SELECT {cols} FROM `{self.database}`.`{name}`{fin}{where}{order}",
            parameters={"job": job} if job is not None else None)
        return select_schema(_plain_strings(result), spec.schema)

    def anomalies(self, job: str | None = None) -> list[tuple[str, Anomaly]]:
        """The latest report of every anomaly, ordered by job and start time."""
        rows = anomalies_from_table(self.read("anomalies", job))
        return sorted(rows, key=lambda ja: (ja[0], ja[1].start_ns or 0, ja[1].id))

    def count(self, name: str, job: str | None = None) -> int:
        where = " WHERE job = {job:String}" if job is not None else ""
        rows = self.client.query(f"SELECT count() FROM `{self.database}`.`{name}`{where}",
                                 parameters={"job": job} if job is not None else None
                                 ).result_rows
        return int(rows[0][0])


def _plain_strings(table: pa.Table) -> pa.Table:
    """Dictionary-encoded (LowCardinality) and large string columns as plain strings."""
    cols = []
    for col in table.columns:
        typ = col.type
        if pa.types.is_dictionary(typ):
            col = col.cast(typ.value_type)
            typ = col.type
        if pa.types.is_large_string(typ):
            col = col.cast(pa.string())
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m failslow.stream.clickhouse",
                                     description="Print or write the ClickHouse schema.")
    parser.add_argument("--write-schema", metavar="FILE",
                        help="write the DDL to FILE instead of standard output")
    parser.add_argument("--database", default=DEFAULT_DATABASE)
    args = parser.parse_args(argv)
    sql = schema_sql(args.database)
    if args.write_schema:
        Path(args.write_schema).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write_schema).write_text(sql)
    else:
        sys.stdout.write(sql)
    return 0


if __name__ == "__main__":
    sys.exit(main())
