"""The output contract: every table failslow writes, defined once.

A :class:`TableSpec` names a table, its :class:`Column` s (Arrow type, nullability, how a
record's value is stored) and how ClickHouse keeps it (sorting key, the version column of its
ReplacingMergeTree, partitioning, expiry). From :data:`TABLES` derive:

- the Arrow schemas of the outputs (:data:`SCHEMAS`, :func:`empty`);
- the ClickHouse DDL, single-server or replicated on a cluster
  (:func:`failslow.stream.clickhouse.ddl`, infra/clickhouse/schema.sql);
- the rows the sinks write and read (:func:`to_table`, :func:`from_table`, :func:`to_record`:
  a record dataclass such as :class:`~failslow.diagnosis.Anomaly` maps field by field onto the
  columns of the same name);
- the type checks of :func:`failslow.diagnosis.validate` (:func:`record_types`).

The raw event tables keep the columns of the event contract (:data:`failslow.events.SCHEMAS`);
only their storage is defined here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import pyarrow as pa

from failslow import events

RecordT = TypeVar("RecordT")

#: How a record's value is stored: ``json`` a dict (or list) as JSON text, ``empty_list``
#: None as an empty array (ClickHouse arrays cannot be Nullable).
Encoding = Literal["json", "empty_list"]


@dataclass(frozen=True)
class Column:
    """One column of an output table."""

    name: str
    type: pa.DataType
    nullable: bool = False
    encoding: Encoding | None = None

    @property
    def field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)

    def python_types(self) -> tuple[type, ...]:
        """The Python types a record may hold in this column (None included when allowed)."""
        typ = self.type
        types: tuple[type, ...]
        if self.encoding == "json":
            types = (dict, list)
        elif pa.types.is_list(typ):
            types = (list,)
        elif pa.types.is_boolean(typ):
            types = (bool,)
        elif pa.types.is_integer(typ):
            types = (int,)
        elif pa.types.is_floating(typ):
            types = (float, int)
        elif pa.types.is_string(typ):
            types = (str,)
        else:
            raise TypeError(f"no Python type for column {self.name}: {typ}")
        if self.nullable or self.encoding == "empty_list":
            types += (type(None),)
        return types

    def encode(self, value: Any) -> Any:
        """A record's value as stored in this column."""
        if self.encoding == "json":
            return json.dumps(value, default=_json_default, sort_keys=True)
        if value is None:
            return [] if self.encoding == "empty_list" else None
        typ = self.type
        if pa.types.is_list(typ):
            item = typ.value_type
            if pa.types.is_integer(item):
                return [int(x) for x in value]
            return [float(x) for x in value] if pa.types.is_floating(item) else list(value)
        if pa.types.is_integer(typ):
            return int(value)
        if pa.types.is_floating(typ):
            return float(value)
        return value

    def decode(self, value: Any) -> Any:
        """Inverse of :meth:`encode` (an empty JSON text reads as None)."""
        if self.encoding == "json":
            return json.loads(value) if value else None
        if pa.types.is_list(self.type):
            items = list(value or [])
            return (items or None) if self.encoding == "empty_list" else items
        return value


@dataclass(frozen=True)
class TableSpec:
    """One stored table: its columns and how ClickHouse keeps it."""

    name: str
    columns: tuple[Column, ...]
    #: the record's natural key (ClickHouse sorting key; rows with the same key collapse)
    order_by: tuple[str, ...]
    comment: str
    #: column whose largest value wins among rows of the same key; None: the last inserted
    version: str | None = None
    #: string columns stored as LowCardinality (enumerations and small name sets)
    low_cardinality: frozenset[str] = frozenset()
    #: the event-time column (ns) whose UTC day partitions the table; None: one partition
    partition_time: str | None = None
    #: days after ingestion a row expires; None: kept
    ttl_days: int | None = None
    #: column -> ClickHouse codec, where the defaults for the column's shape do not fit
    codecs: Mapping[str, str] = field(default_factory=dict)
    #: more ClickHouse table settings
    settings: Mapping[str, int] = field(default_factory=dict)
    #: the ClickHouse engine family (its replicated form on a cluster)
    engine: str = "ReplacingMergeTree"

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        missing = [k for k in (*self.order_by, self.version, self.partition_time)
                   if k is not None and k not in names]
        if missing or len(set(names)) != len(names):
            raise ValueError(f"table {self.name}: unknown or repeated columns {missing or names}")

    @functools.cached_property
    def schema(self) -> pa.Schema:
        return pa.schema([c.field for c in self.columns])

    @functools.cached_property
    def column(self) -> dict[str, Column]:
        """Columns by name."""
        return {c.name: c for c in self.columns}

    @property
    def shard_key(self) -> str:
        """The column rows are spread over shards by (the first sorting column, so that
        rows that collapse meet on one shard)."""
        return self.order_by[0]


def _columns(schema: pa.Schema) -> tuple[Column, ...]:
    return tuple(Column(f.name, f.type, f.nullable) for f in schema)


def _c(name: str, typ: pa.DataType, nullable: bool = False,
       encoding: Encoding | None = None) -> Column:
    return Column(name, typ, nullable, encoding)


_STR, _I16, _I32, _I64 = pa.string(), pa.int16(), pa.int32(), pa.int64()
_U32, _U64, _F64 = pa.uint32(), pa.uint64(), pa.float64()
_RANKS = pa.list_(pa.field("item", _I32, nullable=False))

#: Days raw events and derived rows are kept after ingestion.
EVENT_TTL_DAYS = 14
DERIVED_TTL_DAYS = 90
CUTS_TTL_DAYS = 7


def _event_table(kind: str, order_by: tuple[str, ...], comment: str, *, version: str | None = None,
                 names: frozenset[str] = frozenset({"job"}), partitioned: bool = True,
                 codecs: Mapping[str, str] | None = None,
                 settings: Mapping[str, int] | None = None) -> TableSpec:
    columns = _columns(events.SCHEMAS[kind])
    time = "t" if any(c.name == "t" for c in columns) else "t_start"
    return TableSpec(kind, columns, order_by, comment, version,
                     frozenset(events.ENUMS.get(kind, {})) | names,
                     time if partitioned else None, EVENT_TTL_DAYS if partitioned else None,
                     codecs or {}, settings or {})


_CUMULATIVE = {"posted": "Delta, ZSTD(1)", "completed": "Delta, ZSTD(1)",
               "bytes": "Delta, ZSTD(1)"}

#: The raw event tables (collector rows of :data:`failslow.events.SCHEMAS`).
EVENT_TABLES: tuple[TableSpec, ...] = (
    _event_table("meta", ("job",), "job descriptions; the row with the largest t wins",
                 version="t", partitioned=False),
    _event_table("coll", ("job", "comm", "seq", "rank", "phase"),
                 "collective and point-to-point operations, enter and end rows"),
    _event_table("progress", ("job", "comm", "seq", "rank", "t"), "in-flight progress samples"),
    _event_table("link", ("job", "node", "device", "peer_node", "rank", "t"),
                 "RDMA work-request counters",
                 names=frozenset({"job", "node", "device", "peer_node"}), codecs=_CUMULATIVE,
                 settings={"allow_nullable_key": 1}),
    _event_table("gpu", ("job", "node", "gpu", "t"), "device samples",
                 names=frozenset({"job", "node"})),
    _event_table("span", ("job", "rank", "step", "microbatch", "chunk", "op", "t_start"),
                 "framework spans"),
    _event_table("ras", ("job", "t", "comm", "rank", "finding"), "NCCL RAS findings (contract v2)",
                 names=frozenset({"job", "node", "function"})),
    _event_table("probe", ("job", "request", "rank", "t"),
                 "active validation probes and their outcome (contract v2)",
                 names=frozenset({"job", "node", "request"})),
)

#: What failslow produces: detector results, reports, advice and summaries.
OUTPUT_TABLES: tuple[TableSpec, ...] = (
    # One row per completed collective round (comm, seq) or point-to-point operation.
    TableSpec("rounds", (
        _c("job", _STR), _c("comm", _U64), _c("seq", _U64), _c("op", _STR),
        _c("bytes", _U64), _c("members", _I32), _c("t_first_enter", _I64),
        _c("t_last_enter", _I64), _c("t_end", _I64),
        _c("last_rank", _I32),  # the rank that entered last
        _c("duration_max_ns", _I64),  # max over members of end-enter
        _c("duration_min_ns", _I64),  # min over members of end-enter
    ), ("job", "comm", "seq", "t_first_enter", "last_rank"),
        "completed rounds (derived by the detectors)", None, frozenset({"job", "op"}),
        "t_first_enter", DERIVED_TTL_DAYS),
    # One row per detected training iteration of a rank (rank -1: the job as a whole).
    TableSpec("iterations", (
        _c("job", _STR), _c("rank", _I32), _c("iteration", _I64), _c("t_start", _I64),
        _c("t_end", _I64), _c("duration_ns", _I64),
    ), ("job", "rank", "iteration"),
        "training iterations per rank, rank -1 = the job (derived)", None,
        frozenset({"job"}), "t_start", DERIVED_TTL_DAYS),
    # One row per anomaly report: the fields of failslow.diagnosis.Anomaly (diagnosis.md),
    # its job, and ``version``, which orders the reports of the same (job, id).
    TableSpec("anomalies", (
        _c("job", _STR), _c("id", _STR), _c("version", _U64), _c("kind", _STR),
        _c("cause", _STR), _c("ranks", _RANKS),
        _c("link", _RANKS, encoding="empty_list"),  # [] when the anomaly names no link
        _c("comm", _U64, True), _c("comm_kind", _STR, True), _c("stage", _STR, True),
        _c("start_ns", _I64, True), _c("detected_ns", _I64, True), _c("end_ns", _I64, True),
        _c("slowdown", _F64, True), _c("R", _F64, True), _c("P", _F64, True),
        _c("extra", _STR, encoding="json"),  # the unknown fields
        _c("reported_ns", _I64),  # wall time of the report
    ), ("job", "id"), "one row per anomaly report; the largest version of (job, id) wins",
        "version", frozenset({"job", "kind", "cause", "comm_kind", "stage"})),
    # One row per mitigation decision (failslow.mitigation.planner.Advice.to_row()).
    TableSpec("advice", (
        _c("version", _I16), _c("advice_id", _STR), _c("job", _STR), _c("anomaly_id", _STR),
        _c("cause", _STR), _c("ranks", pa.list_(_I64)), _c("link", pa.list_(_I64), True),
        _c("strategy", _STR), _c("action", _STR), _c("t_ns", _I64), _c("impact_s", _F64),
        _c("cost_s", _F64), _c("slow_iterations", _I64), _c("t_slow_s", _F64, True),
        _c("t_healthy_s", _F64, True), _c("description", _STR), _c("reason", _STR),
        _c("plan", _STR, True),  # JSON text
    ), ("job", "advice_id"),
        "mitigation advice (Greyhound ski-rental planner): one row per decision, "
        "advice_id = anomaly/strategy/action", "t_ns",
        frozenset({"job", "cause", "strategy", "action", "description"}),
        codecs={"t_ns": "Delta, ZSTD(1)", "plan": "ZSTD(3)", "reason": "ZSTD(1)"}),
    # One row per what-if result (the diagnosis ``whatif`` object of the job's recent steps).
    TableSpec("whatif", (
        _c("job", _STR),
        _c("step", _I64),  # the last completed step it covers
        _c("computed_ns", _I64),  # the job's event time then
        _c("slowdown", _F64, True), _c("result", _STR, encoding="json"),
        _c("reported_ns", _I64),
    ), ("job", "step"), "what-if results (diagnosis.md whatif) of the recent steps of a job",
        "computed_ns", frozenset({"job"})),
    # One row per job and checkpoint: the diagnosis' ``iterations`` summary so far.
    TableSpec("diagnoses", (
        _c("job", _STR), _c("version", _U64), _c("iterations", _STR, encoding="json"),
        _c("anomalies", _U32),  # how many anomalies so far
        _c("updated_ns", _I64),
    ), ("job",), "per job: the iterations summary of its diagnosis; the latest version wins",
        "version", frozenset({"job"})),
)

#: The stream processor's checkpoints (:mod:`failslow.stream.state`).
PROCESSOR_TABLES: tuple[TableSpec, ...] = (
    TableSpec("processor_cuts", (
        _c("consumer_group", _STR), _c("partition_id", _U32), _c("seq", _U64),
        _c("ranges", _STR, encoding="json"),  # {topic: [first, last]}
        _c("created_ns", _I64),
    ), ("consumer_group", "partition_id", "seq"),
        "stream processor: input offset ranges of each sink write, logged before it",
        None, frozenset({"consumer_group"}), None, CUTS_TTL_DAYS),
    TableSpec("processor_snapshots", (
        _c("consumer_group", _STR), _c("partition_id", _U32),
        _c("seq", _U64),  # the last cut it includes
        _c("offsets", _STR, encoding="json"),  # {topic: next offset}
        _c("state", _STR),  # base64 of zstd JSON
        _c("created_ns", _I64),
    ), ("consumer_group", "partition_id"),
        "stream processor: detector state of the jobs of a partition and its offsets",
        "created_ns", frozenset({"consumer_group"})),
)

#: Every stored table, in creation order.
TABLES: tuple[TableSpec, ...] = EVENT_TABLES + OUTPUT_TABLES + PROCESSOR_TABLES
#: Version of the stored tables' shape, carried in each table's comment. Raise it when
#: :data:`TABLES` changes and say what changed in :data:`SCHEMA_CHANGES`: a processor adds
#: the tables and columns an older store lacks and refuses a store whose columns differ
#: (infra/clickhouse/MIGRATIONS.md says what to do then).
SCHEMA_VERSION = 3
SCHEMA_CHANGES: dict[int, str] = {
    1: "the tables of the first releases (their comments carry no version)",
    2: "the schema version in every table's comment",
    3: "event contract v2: the ras and probe tables",
}
SPECS: dict[str, TableSpec] = {t.name: t for t in TABLES}
#: Arrow schemas of the tables failslow writes (not the raw events: failslow.events.SCHEMAS).
SCHEMAS: dict[str, pa.Schema] = {t.name: t.schema for t in OUTPUT_TABLES + PROCESSOR_TABLES}


@functools.cache
def empty(kind: str) -> pa.Table:
    """An empty table of ``kind``, built once (Arrow tables are immutable; building one
    from its schema costs more than detecting on a small batch)."""
    return SCHEMAS[kind].empty_table()


def to_table(name: str, rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows (values by column name, as records hold them) as a table of ``name``: JSON
    columns serialized, None lists as empty arrays, numbers as Python numbers. Keys that
    are not columns are ignored; missing columns are null."""
    columns = SPECS[name].columns
    data = [{c.name: c.encode(row.get(c.name)) for c in columns} for row in rows]
    return pa.Table.from_pylist(data, schema=SPECS[name].schema)


def from_table(name: str, table: pa.Table) -> list[dict[str, Any]]:
    """Inverse of :func:`to_table`: the rows of a table of ``name``, values decoded."""
    columns = [c for c in SPECS[name].columns if c.name in table.column_names]
    return [{c.name: c.decode(row[c.name]) for c in columns} for row in table.to_pylist()]


def record_fields(name: str, cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of the record dataclass ``cls``, each stored in the column of the same
    name of table ``name`` (ValueError when one has no column)."""
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.name not in SPECS[name].column]
    if missing:
        raise ValueError(f"table {name} has no column for {cls.__name__}.{missing}")
    return fields


def record_types(name: str, cls: type) -> dict[str, tuple[type, ...]]:
    """Per field of ``cls``: the Python types its column of table ``name`` accepts."""
    column = SPECS[name].column
    return {f.name: column[f.name].python_types() for f in record_fields(name, cls)}


def record_row(name: str, record: Any) -> dict[str, Any]:
    """The fields of the dataclass instance ``record`` as a row of ``name`` (for
    :func:`to_table`)."""
    return {f.name: getattr(record, f.name) for f in record_fields(name, type(record))}


def to_record(name: str, cls: type[RecordT], row: Mapping[str, Any]) -> RecordT:
    """The record of class ``cls`` in a decoded row of ``name`` (:func:`from_table`); a
    field whose column is null or of another type than its default takes the default."""
    values: dict[str, Any] = {}
    for f in record_fields(name, cls):
        value = row.get(f.name)
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            if not isinstance(value, type(default)):
                value = default
        values[f.name] = value
    return cls(**values)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
