"""The ClickHouse DDL of the output contract (:data:`failslow.results.TABLES`): column types
and codecs, the CREATE statements for one server or a cluster (:func:`ddl`,
:func:`schema_sql`), and the schema version carried in every table's comment, with the
upgrade of an older store (:func:`upgrade_schema`; infra/clickhouse/MIGRATIONS.md).
:mod:`failslow.stream.clickhouse` re-exports all of it."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow import events, results
from failslow.results import SPECS, TABLES, TableSpec

log = logging.getLogger(__name__)

DEFAULT_DATABASE = "failslow"
#: Blocks per table whose tokens ClickHouse remembers; a restarted processor re-writes at
#: most the cuts since its partition's last snapshot, far fewer.
DEDUP_WINDOW = 10_000

_TIMES = frozenset({"t", "t_start", "t_end", "t_first_enter", "t_last_enter", "start_ns",
                    "detected_ns", "end_ns", "reported_ns", "computed_ns", "updated_ns",
                    "created_ns", "version"})
_SEQUENCES = frozenset({"seq", "iteration", "step"})
_SIZES = frozenset({"bytes", "send_count", "recv_count", "duration_max_ns", "duration_min_ns",
                    "duration_ns", "members", "comm_size", "comm_rank", "rank", "gpu"})
_TEXT = frozenset({"nodes", "comms", "extra", "result", "iterations", "ranges", "offsets",
                   "state"})


def codec_for(spec: TableSpec, f: pa.Field) -> str | None:
    """The codec of column ``f`` of ``spec`` (None: ClickHouse's default, LZ4)."""
    if f.name in spec.codecs:
        return spec.codecs[f.name]
    typ = f.type
    if f.name in _TIMES and pa.types.is_integer(typ):
        return "Delta, ZSTD(1)"
    if f.name in _SEQUENCES and pa.types.is_integer(typ):
        return "Delta, ZSTD(1)"
    if f.name in _SIZES and pa.types.is_integer(typ):
        return "T64, ZSTD(1)"
    if f.name in _TEXT and pa.types.is_string(typ):
        return "ZSTD(3)"
    if pa.types.is_floating(typ):
        return "ZSTD(1)"
    return None


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


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _check_name(kind: str, name: str) -> None:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"{kind} name {name!r}: letters, digits and _ only")


def create_table(spec: TableSpec, database: str, cluster: str | None = None) -> str:
    """The CREATE TABLE statement of ``spec``: on one server, or (``cluster``) the
    replicated local table ``<name>_local`` on every node of the cluster."""
    width = max(len("ingested_at"), *(len(f.name) for f in spec.schema)) + 2
    cols = []
    for f in spec.schema:
        codec = codec_for(spec, f)
        typ = clickhouse_type(f, f.name in spec.low_cardinality)
        cols.append(f"    {f'`{f.name}`':<{width}} {typ}"
                    + (f" CODEC({codec})" if codec else ""))
    if "t" in spec.schema.names:  # readable time for dashboards; not stored
        cols.append(f"    {'`time`':<{width}} DateTime64(9) ALIAS fromUnixTimestamp64Nano(t)")
    cols.append(f"    {'`ingested_at`':<{width}} DateTime DEFAULT now() CODEC(Delta, ZSTD(1))")
    args = [spec.version] if spec.version else []
    if cluster:
        name, engine = f"{spec.name}_local", f"Replicated{spec.engine}"
        args = ["'/clickhouse/tables/{shard}/{database}/{table}'", "'{replica}'", *args]
        where, window = f" ON CLUSTER `{cluster}`", "replicated_deduplication_window"
    else:
        name, engine = spec.name, spec.engine
        where, window = "", "non_replicated_deduplication_window"
    text = (f"CREATE TABLE IF NOT EXISTS `{database}`.`{name}`{where}\n(\n"
            + ",\n".join(cols) + f"\n)\nENGINE = {engine}"
            + (f"({', '.join(args)})" if args else "") + "\n")
    if spec.partition_time:
        text += f"PARTITION BY toDate(fromUnixTimestamp64Nano({spec.partition_time}), 'UTC')\n"
    text += f"ORDER BY ({', '.join(spec.order_by)})\n"
    if spec.ttl_days:
        text += f"TTL ingested_at + INTERVAL {spec.ttl_days} DAY\n"
    settings = {window: DEDUP_WINDOW, **spec.settings}
    text += "SETTINGS " + ", ".join(f"{k} = {v}" for k, v in settings.items()) + "\n"
    return text + f"COMMENT {_quote(versioned_comment(spec))}"


#: The tag of the schema version in a table's comment.
_VERSION_TAG = re.compile(r" \[failslow schema v(\d+)\]$")


def versioned_comment(spec: TableSpec, version: int = results.SCHEMA_VERSION) -> str:
    """A table's comment with the schema version it was made by."""
    return f"{spec.comment} [failslow schema v{version}]"


def create_distributed_table(spec: TableSpec, database: str, cluster: str) -> str:
    """The Distributed table ``<name>`` over the local tables of :func:`create_table`."""
    return (f"CREATE TABLE IF NOT EXISTS `{database}`.`{spec.name}` ON CLUSTER `{cluster}`\n"
            f"AS `{database}`.`{spec.name}_local`\n"
            f"ENGINE = Distributed({_quote(cluster)}, {_quote(database)}, "
            f"{_quote(spec.name + '_local')}, cityHash64({spec.shard_key}))\n"
            f"COMMENT {_quote(spec.comment)}")


def ddl(database: str = DEFAULT_DATABASE, cluster: str | None = None) -> list[str]:
    """The statements that create the database and every table of the output contract
    (idempotent): for one server, or replicated and distributed on ``cluster``."""
    _check_name("database", database)
    if not cluster:
        return [f"CREATE DATABASE IF NOT EXISTS `{database}`"] + [create_table(s, database)
                                                                  for s in TABLES]
    _check_name("cluster", cluster)
    out = [f"CREATE DATABASE IF NOT EXISTS `{database}` ON CLUSTER `{cluster}`"]
    for spec in TABLES:
        out += [create_table(spec, database, cluster),
                create_distributed_table(spec, database, cluster)]
    return out


def schema_sql(database: str = DEFAULT_DATABASE, cluster: str | None = None) -> str:
    """:func:`ddl` as one SQL file."""
    where = f", cluster {cluster}" if cluster else ""
    head = (f"-- failslow ClickHouse schema (event contract v{events.VERSION}{where}).\n"
            "-- Generated from failslow.results by `failslow schema FILE`;\n"
            "-- do not edit by hand.\n\n")
    return head + ";\n\n".join(ddl(database, cluster)) + ";\n"


def write_schema(path: str | Path, cluster: str | None = None, *,
                 database: str = DEFAULT_DATABASE) -> None:
    """Write :func:`schema_sql` to ``path`` (the committed copy:
    ``write_schema("infra/clickhouse/schema.sql")``); ``cluster``: the schema for a
    ClickHouse cluster of that name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(schema_sql(database, cluster))



class SchemaError(RuntimeError):
    """The store's tables are not the ones this failslow writes; the message (one line)
    says which table and column, and what to do."""


def _expected_columns(spec: TableSpec) -> dict[str, str]:
    cols = {f.name: clickhouse_type(f, f.name in spec.low_cardinality) for f in spec.schema}
    if "t" in spec.schema.names:
        cols["time"] = "DateTime64(9)"
    cols["ingested_at"] = "DateTime"
    return cols


def _column_sql(spec: TableSpec, name: str) -> str:
    if name == "ingested_at":
        return "`ingested_at` DateTime DEFAULT now() CODEC(Delta, ZSTD(1))"
    if name == "time":
        return "`time` DateTime64(9) ALIAS fromUnixTimestamp64Nano(t)"
    f = spec.schema.field(name)
    codec = codec_for(spec, f)
    return (f"`{name}` {clickhouse_type(f, name in spec.low_cardinality)}"
            + (f" CODEC({codec})" if codec else ""))


def stored_schema(client: Any, database: str
                  ) -> tuple[int | None, dict[str, dict[str, str]], dict[str, int]]:
    """The schema version of ``database`` (the oldest of its failslow tables; 1 for tables
    made before versions; None: no failslow table), the columns of those tables and the
    version of each."""
    rows = client.query(
        "SELECT t.name, t.comment, c.name, c.type FROM system.tables AS t "
        "LEFT JOIN system.columns AS c ON c.database = t.database AND c.table = t.name "
        "WHERE t.database = {db:String}", parameters={"db": database}).result_rows
    columns: dict[str, dict[str, str]] = {}
    versions: dict[str, int] = {}
    for table, comment, column, typ in rows:
        table = str(table)
        if table not in SPECS:
            continue
        if table not in columns:
            m = _VERSION_TAG.search(str(comment or ""))
            versions[table] = int(m.group(1)) if m else 1
            columns[table] = {}
        if column:
            columns[table][str(column)] = str(typ)
    return (min(versions.values()) if versions else None), columns, versions


def upgrade_schema(client: Any, database: str, *, dry_run: bool = False
                   ) -> tuple[int, list[str]]:
    """Create the tables, or bring an older store up to :data:`results.SCHEMA_VERSION`:
    add the missing tables and columns and record the version. Raise :class:`SchemaError`
    (never writing) for a newer store or a table with columns this failslow does not know
    or types it does not expect. Returns the version found (0: no failslow table) and the
    statements run (``dry_run``: that would run)."""
    _check_name("database", database)
    if not dry_run:
        client.command(f"CREATE DATABASE IF NOT EXISTS `{database}`")
    found, columns, versions = stored_schema(client, database)
    want = results.SCHEMA_VERSION
    newest = max(versions.values(), default=0)
    if newest > want:
        raise SchemaError(f"ClickHouse database {database} has schema version {newest}, newer "
                          f"than this failslow's {want}: upgrade failslow (it never writes "
                          "into tables whose columns it does not know)")
    plan: list[str] = []
    for spec in TABLES:
        have = columns.get(spec.name)
        if have is None:
            plan.append(create_table(spec, database))
            continue
        expected = _expected_columns(spec)
        unknown = sorted(set(have) - set(expected))
        if unknown:
            raise SchemaError(
                f"ClickHouse table {database}.{spec.name} has column(s) {', '.join(unknown)} "
                f"that failslow schema v{want} does not know; refusing to write into it "
                f"(upgrade failslow, or see infra/clickhouse/MIGRATIONS.md)")
        for name, typ in expected.items():
            if name in have and have[name] != typ:
                raise SchemaError(
                    f"ClickHouse table {database}.{spec.name}: column {name} is {have[name]}, "
                    f"failslow schema v{want} expects {typ}; run the migration "
                    f"'v{found} -> v{want}' of infra/clickhouse/MIGRATIONS.md")
        table = f"`{database}`.`{spec.name}`"
        plan += [f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {_column_sql(spec, name)}"
                 for name in expected if name not in have]
        if versions.get(spec.name) != want:
            plan.append(f"ALTER TABLE {table} MODIFY COMMENT "
                        f"{_quote(versioned_comment(spec))}")
    if dry_run:
        return found or 0, plan
    if found is not None and found < want:
        log.warning("ClickHouse database %s: upgrading the schema from version %d to %d "
                    "(%d statements)", database, found, want, len(plan))
    for statement in plan:
        client.command(statement)
    return found or 0, plan
