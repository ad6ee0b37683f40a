"""The failslow event contract (shared/spec/events.md), in code.

Version 1 is shared/spec/events.md. Version 2 adds two optional record kinds, by the spec's
rule (add, never rename or re-type; keep reading version 1), documented in
``docs/events-v2.md``:

* ``ras``: one row per NCCL RAS finding (a rank missing, behind, inconsistent or stalled);
* ``probe``: one row per active validation probe (GEMM timing, point-to-point transfer,
  zero-payload round trip) and its outcome.

This module is the only place that knows the record kinds and their columns. Every
producer (simulator, collectors, importers) and consumer (detectors, stream processor,
ClickHouse sink, trace reader) goes through it.

In memory a record batch is a ``pyarrow.Table`` with the kind's schema; detectors work on
``Columns``: a dict of numpy arrays, one per column, with the enumerated string columns
(``op``, ``phase``) turned into small integer codes and nulls turned into sentinels.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

VERSION = 2
#: Contract versions a consumer accepts (a version-1 record is a valid version-2 record).
READABLE_VERSIONS: tuple[int, ...] = (1, 2)

KINDS: tuple[str, ...] = ("meta", "coll", "progress", "link", "gpu", "span", "ras", "probe")
#: Kinds added after version 1, with the version that added them.
ADDED_IN: dict[str, int] = {"ras": 2, "probe": 2}
#: Kinds written now and then (a RAS report, a probe's outcome) rather than as a job runs:
#: a stream aligns no other kind on them (its absence is the usual case, not a delay).
SPARSE_KINDS: frozenset[str] = frozenset({"ras", "probe"})

#: Records of one job, by kind (``coll``, ``progress``, ``link``, ``gpu``, ``span``); each
#: table conforms to ``SCHEMAS[kind]``. Kinds with no new rows may be absent. What a replay
#: or a stream hands the detectors at a time.
EventBatch = dict[str, pa.Table]

COLL_OPS: tuple[str, ...] = (
    "allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall", "send", "recv",
)
PHASES: tuple[str, ...] = ("enter", "end")
SPAN_OPS: tuple[str, ...] = (
    "forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send",
    "backward-recv", "params-sync", "grads-sync", "optimizer", "gc", "other",
)
SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe", "interleaved", "unknown")
COMM_KINDS: tuple[str, ...] = ("tp", "pp", "dp", "cp", "ep", "world", "other")
#: ``ras.finding``: what a RAS report says about a rank (collectors/ras.py).
RAS_FINDINGS: tuple[str, ...] = ("missing", "behind", "inconsistent", "stalled")
#: ``probe.probe``: the kind of active validation (issue 17).
PROBE_KINDS: tuple[str, ...] = ("gemm", "p2p", "rtt")
#: ``probe.status``: how the probe ended.
PROBE_STATUSES: tuple[str, ...] = ("ok", "timeout", "failed", "skipped")

# Integer codes for the enumerated columns (index in the tuples above).
OP = {name: code for code, name in enumerate(COLL_OPS)}
SPAN_OP = {name: code for code, name in enumerate(SPAN_OPS)}
ENTER, END = 0, 1

#: Sentinel for a null int64 time (``t_start``) in numpy form.
NULL_TIME = np.iinfo(np.int64).min
#: Sentinel for a null uint64 counter or a null int32 rank in numpy form.
NULL_COUNT = np.iinfo(np.uint64).max
NULL_RANK = -1

_JOB_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _f(name: str, typ: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


SCHEMAS: dict[str, pa.Schema] = {
    "meta": pa.schema([
        _f("job", pa.string()), _f("t", pa.int64()), _f("world_size", pa.int32()),
        _f("tp", pa.int32()), _f("pp", pa.int32()), _f("dp", pa.int32()), _f("cp", pa.int32()),
        _f("microbatches", pa.int32()), _f("schedule", pa.string()),
        _f("nodes", pa.string()), _f("comms", pa.string()),
    ]),
    "coll": pa.schema([
        _f("job", pa.string()), _f("rank", pa.int32()), _f("comm", pa.uint64()),
        _f("comm_rank", pa.int32()), _f("comm_size", pa.int32()), _f("seq", pa.uint64()),
        _f("op", pa.string()), _f("bytes", pa.uint64()), _f("peer", pa.int32()),
        _f("phase", pa.string()), _f("t", pa.int64()), _f("t_start", pa.int64(), True),
        _f("send_count", pa.uint64(), True), _f("recv_count", pa.uint64(), True),
    ]),
    "progress": pa.schema([
        _f("job", pa.string()), _f("rank", pa.int32()), _f("comm", pa.uint64()),
        _f("seq", pa.uint64()), _f("t", pa.int64()),
        _f("send_count", pa.uint64()), _f("recv_count", pa.uint64()),
    ]),
    "link": pa.schema([
        _f("job", pa.string()), _f("node", pa.string()), _f("rank", pa.int32(), True),
        _f("device", pa.string()), _f("peer_node", pa.string(), True), _f("t", pa.int64()),
        _f("posted", pa.uint64()), _f("completed", pa.uint64()), _f("bytes", pa.uint64()),
    ]),
    "gpu": pa.schema([
        _f("job", pa.string()), _f("node", pa.string()), _f("rank", pa.int32(), True),
        _f("gpu", pa.int32()), _f("t", pa.int64()), _f("sm_clock_mhz", pa.int32()),
        _f("mem_clock_mhz", pa.int32()), _f("temp_c", pa.int32()), _f("power_w", pa.float64()),
        _f("util_pct", pa.int32()), _f("throttle_reasons", pa.uint64()),
    ]),
    "span": pa.schema([
        _f("job", pa.string()), _f("rank", pa.int32()), _f("step", pa.int64()),
        _f("microbatch", pa.int32()), _f("chunk", pa.int32()), _f("op", pa.string()),
        _f("t_start", pa.int64()), _f("t_end", pa.int64()),
    ]),
    "ras": pa.schema([
        _f("job", pa.string()), _f("t", pa.int64()), _f("node", pa.string()),
        _f("comm", pa.uint64()), _f("comm_size", pa.int32()), _f("rank", pa.int32()),
        _f("finding", pa.string()), _f("function", pa.string(), True),
        _f("count", pa.uint64(), True), _f("expected", pa.uint64(), True),
    ]),
    "probe": pa.schema([
        _f("job", pa.string()), _f("t", pa.int64()), _f("node", pa.string()),
        _f("request", pa.string()), _f("probe", pa.string()), _f("rank", pa.int32()),
        _f("peer", pa.int32(), True), _f("status", pa.string()),
        _f("duration_ns", pa.int64()), _f("elapsed_ns", pa.int64(), True),
        _f("bytes", pa.uint64(), True), _f("baseline_ns", pa.int64(), True),
        _f("detail", pa.string(), True),
    ]),
}

#: Columns whose string values must come from a closed set.
ENUMS: dict[str, dict[str, tuple[str, ...]]] = {
    "meta": {"schedule": SCHEDULES},
    "coll": {"op": COLL_OPS, "phase": PHASES},
    "span": {"op": SPAN_OPS},
    "ras": {"finding": RAS_FINDINGS},
    "probe": {"probe": PROBE_KINDS, "status": PROBE_STATUSES},
}

#: Enumerated columns turned into integer codes by :func:`to_columns`.
_CODED: dict[str, dict[str, tuple[str, ...]]] = {
    "coll": {"op": COLL_OPS, "phase": PHASES},
    "span": {"op": SPAN_OPS},
}

Columns = dict[str, np.ndarray]


class ContractError(ValueError):
    """Input that breaks the event contract: says where (file, line or row) and which column."""

    def __init__(self, message: str, *, source: str = "", row: int | None = None,
                 line: int | None = None, column: str | None = None) -> None:
        self.source, self.row, self.line, self.column = source, row, line, column
        where = [source] if source else []
        if line is not None:
            where.append(f"line {line}")
        elif row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column '{column}'")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


def empty(kind: str) -> pa.Table:
    """An empty table of ``kind``."""
    return SCHEMAS[kind].empty_table()


def conform(table: pa.Table, kind: str, source: str = "", row_offset: int = 0) -> pa.Table:
    """Check ``table`` against the contract of ``kind`` and return it with the exact schema.

    Extra columns are kept (producers may add optional columns); missing or mistyped
    contract columns, nulls in required columns and values outside the enumerations raise
    :class:`ContractError` naming ``source``, the first bad row and the column.
    """
    schema = SCHEMAS[kind]
    arrays: list[pa.Array | pa.ChunkedArray] = []
    names = set(table.column_names)  # (a new list per call: not in the loop)
    for field in schema:
        if field.name not in names:
            if field.nullable:
                arrays.append(pa.nulls(table.num_rows, field.type))
                continue
            raise ContractError("missing required column", source=source, column=field.name)
        col = table.column(field.name)
        if col.type != field.type:
            col = _cast(col, field, source, row_offset)
        if not field.nullable and col.null_count:
            bad = _first_true(pc.is_null(col))
            raise ContractError("null in a required column", source=source,
                                row=row_offset + bad, column=field.name)
        arrays.append(col)
    known = set(schema.names)
    extra = [n for n in table.column_names if n not in known]
    out = pa.Table.from_arrays(arrays, schema=schema)
    for name in extra:
        out = out.append_column(name, table.column(name))
    _check_values(out, kind, source, row_offset)
    return out


def _cast(col: pa.ChunkedArray, field: pa.Field, source: str, row_offset: int) -> pa.ChunkedArray:
    target = field.type
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if pa.types.is_null(col.type):
        return pa.chunked_array([pa.nulls(len(col), target)])
    ok_kind = (
        (pa.types.is_integer(target) and pa.types.is_integer(col.type))
        or (pa.types.is_floating(target) and (pa.types.is_integer(col.type)
                                              or pa.types.is_floating(col.type)))
        or (pa.types.is_string(target) and (pa.types.is_string(col.type)
                                            or pa.types.is_large_string(col.type)))
    )
    if not ok_kind:
        raise ContractError(f"expected {target}, found {col.type}", source=source,
                            column=field.name)
    try:
        return col.cast(target, safe=True)
    except pa.ArrowInvalid:
        bad = _first_unconvertible(col, target)
        raise ContractError(f"value {col[bad].as_py()!r} does not fit {target}", source=source,
                            row=row_offset + bad, column=field.name) from None


def _first_unconvertible(col: pa.ChunkedArray, target: pa.DataType) -> int:
    """Error path only: the first row whose value does not cast safely to ``target``."""
    offset = 0
    for chunk in col.chunks:
        try:
            chunk.cast(target, safe=True)
        except pa.ArrowInvalid:
            for i in range(len(chunk)):
                try:
                    chunk.slice(i, 1).cast(target, safe=True)
                except pa.ArrowInvalid:
                    return offset + i
        offset += len(chunk)
    return 0


def _first_true(mask: pa.ChunkedArray | pa.Array) -> int:
    idx = pc.index(mask, True).as_py()
    return -1 if idx is None else int(idx)


def _check_values(table: pa.Table, kind: str, source: str, row_offset: int) -> None:
    # string columns are checked on their distinct values (a job has one id and a few
    # operation names; the regex over every row took most of ``conform``)
    for column, allowed in ENUMS.get(kind, {}).items():
        col = table.column(column)
        distinct = pc.unique(col)
        unknown = pc.filter(distinct, pc.invert(pc.is_in(distinct, value_set=pa.array(allowed))))
        unknown = unknown.drop_null()
        if len(unknown):
            bad = _first_true(pc.is_in(col, value_set=unknown))
            raise ContractError(
                f"unknown value {col[bad].as_py()!r} (expected one of {', '.join(allowed)})",
                source=source, row=row_offset + bad, column=column)
    if table.num_rows:
        job = table.column("job")
        ids = pc.unique(job)
        lengths = pc.utf8_length(ids)
        bad_len = pc.or_(pc.less(lengths, 1), pc.greater(lengths, 64))
        bad_chars = pc.invert(pc.match_substring_regex(ids, r"^[A-Za-z0-9._-]+$"))
        invalid = pc.filter(ids, pc.fill_null(pc.or_(bad_len, bad_chars), False))
        if len(invalid):
            bad = _first_true(pc.is_in(job, value_set=invalid))
            raise ContractError(f"invalid job id {job[bad].as_py()!r} "
                                "(1-64 characters of A-Z a-z 0-9 . _ -)",
                                source=source, row=row_offset + bad, column="job")
    non_negative = ("rank", "comm_rank", "gpu") + (("peer",) if kind == "probe" else ())
    for column in non_negative:
        if column in table.schema.names and table.num_rows:
            negative = pc.fill_null(pc.less(table.column(column), 0), False)
            bad = _first_true(negative)
            if bad >= 0:
                raise ContractError("must be >= 0", source=source, row=row_offset + bad,
                                    column=column)
    if kind == "meta":
        for i, row in enumerate(table.select(["world_size", "tp", "pp", "dp", "cp"]).to_pylist()):
            if row["tp"] * row["pp"] * row["dp"] * row["cp"] != row["world_size"]:
                raise ContractError("tp*pp*dp*cp must equal world_size", source=source,
                                    row=row_offset + i, column="world_size")


def from_rows(kind: str, rows: Sequence[Mapping[str, Any]], source: str = "") -> pa.Table:
    """Build a conforming table from dict rows (absent nullable columns become null)."""
    schema = SCHEMAS[kind]
    data = {f.name: [r.get(f.name) for r in rows] for f in schema}
    try:
        table = pa.Table.from_pydict(data, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return conform(_rows_to_table_checked(kind, rows, source), kind, source)
    return conform(table, kind, source)


def _rows_to_table_checked(kind: str, rows: Sequence[Mapping[str, Any]], source: str,
                           first_line: Sequence[int] | None = None) -> pa.Table:
    """Slow path: find the first row and column that does not convert, and say so."""
    schema = SCHEMAS[kind]
    for field in schema:
        values = [r.get(field.name) for r in rows]
        try:
            pa.array(values, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            for i, v in enumerate(values):
                try:
                    pa.array([v], type=field.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                    line = first_line[i] if first_line is not None else None
                    raise ContractError(f"expected {field.type}, found {v!r}", source=source,
                                        row=None if line is not None else i, line=line,
                                        column=field.name) from None
    raise ContractError("rows do not convert", source=source)  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# numpy form


def to_columns(table: pa.Table, kind: str) -> Columns:
    """Numpy arrays per column; ``op``/``phase`` as int8 codes; nulls as sentinels."""
    out: Columns = {}
    coded = _CODED.get(kind, {})
    for field in SCHEMAS[kind]:
        col = table.column(field.name)
        if field.name in coded:
            codes = pc.index_in(col, value_set=pa.array(coded[field.name]))
            out[field.name] = codes.to_numpy().astype(np.int8)
        elif pa.types.is_string(field.type):
            out[field.name] = np.asarray(col.to_pylist(), dtype=object)
        elif field.nullable:
            fill: Any = _null_fill(field.type)
            out[field.name] = pc.fill_null(col, pa.scalar(fill, field.type)).to_numpy()
        else:
            out[field.name] = col.to_numpy()
    return out


def _null_fill(typ: pa.DataType) -> int:
    if typ == pa.int64():
        return int(NULL_TIME)
    if typ == pa.uint64():
        return int(NULL_COUNT)
    return NULL_RANK


def from_columns(columns: Mapping[str, Any], kind: str) -> pa.Table:
    """Inverse of :func:`to_columns`: numpy arrays (codes or strings) to a conforming table.

    Scalars are broadcast (e.g. ``job="j1"``). Sentinel values of nullable columns become null.
    """
    schema = SCHEMAS[kind]
    n = max((len(v) for v in columns.values() if isinstance(v, np.ndarray | list)), default=0)
    coded = _CODED.get(kind, {})
    arrays = []
    for field in schema:
        value = columns.get(field.name)
        if value is None:
            if not field.nullable:
                raise ContractError("missing required column", column=field.name)
            arrays.append(pa.nulls(n, field.type))
            continue
        if np.isscalar(value) or isinstance(value, str):
            value = [value] * n if isinstance(value, str) else np.full(n, value)
        if field.name in coded and isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            names = pa.array(coded[field.name])
            arrays.append(pc.take(names, pa.array(value.astype(np.int32))))
            continue
        if field.nullable and isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            mask = value == np.array(_null_fill(field.type)).astype(value.dtype)
            arrays.append(pa.array(value, type=field.type, mask=mask))
            continue
        arrays.append(pa.array(value, type=field.type))
    return conform(pa.Table.from_arrays(arrays, schema=schema), kind)


# ---------------------------------------------------------------------------------------------
# meta


@dataclass(frozen=True)
class Comm:
    """One communicator as described in ``meta.comms``."""

    comm: int
    kind: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class JobMeta:
    """A parsed ``meta`` row."""

    job: str
    t: int
    world_size: int
    tp: int
    pp: int
    dp: int
    cp: int
    microbatches: int
    schedule: str
    nodes: dict[int, str]
    comms: tuple[Comm, ...]

    def to_row(self) -> dict[str, Any]:
        return {
            "job": self.job, "t": self.t, "world_size": self.world_size, "tp": self.tp,
            "pp": self.pp, "dp": self.dp, "cp": self.cp, "microbatches": self.microbatches,
            "schedule": self.schedule,
            "nodes": json.dumps({str(r): n for r, n in sorted(self.nodes.items())}),
            "comms": json.dumps([{"comm": c.comm, "kind": c.kind, "ranks": list(c.ranks)}
                                 for c in self.comms]),
        }

    def node_of(self, rank: int) -> str:
        return self.nodes.get(rank, f"node{rank // 8}")


def parse_meta_row(row: Mapping[str, Any], source: str = "", index: int = 0) -> JobMeta:
    """Validate and parse one ``meta`` row; ``nodes``/``comms`` may be JSON text or objects."""
    table = conform(_meta_table([row], source, index), "meta", source, index)
    r = table.to_pylist()[0]
    nodes_raw = _json_field(row.get("nodes"), "nodes", source, index, {})
    comms_raw = _json_field(row.get("comms"), "comms", source, index, [])
    if not isinstance(nodes_raw, dict):
        raise ContractError("expected a JSON object", source=source, row=index, column="nodes")
    if not isinstance(comms_raw, list):
        raise ContractError("expected a JSON array", source=source, row=index, column="comms")
    comms = []
    for c in comms_raw:
        ok = (isinstance(c, dict) and isinstance(c.get("comm"), int)
              and 0 <= c["comm"] < 2**64 and c.get("kind") in COMM_KINDS
              and isinstance(c.get("ranks"), list)
              and all(isinstance(x, int) and x >= 0 for x in c["ranks"]))
        if not ok:
            raise ContractError(f"bad communicator entry {c!r}", source=source, row=index,
                                column="comms")
        comms.append(Comm(int(c["comm"]), str(c["kind"]), tuple(int(x) for x in c["ranks"])))
    try:
        nodes = {int(k): str(v) for k, v in nodes_raw.items()}
    except ValueError:
        raise ContractError("keys must be global ranks", source=source, row=index,
                            column="nodes") from None
    return JobMeta(job=r["job"], t=r["t"], world_size=r["world_size"], tp=r["tp"], pp=r["pp"],
                   dp=r["dp"], cp=r["cp"], microbatches=r["microbatches"],
                   schedule=r["schedule"], nodes=nodes, comms=tuple(comms))


def _meta_table(rows: Sequence[Mapping[str, Any]], source: str, index: int) -> pa.Table:
    flat = []
    for row in rows:
        if not isinstance(row, Mapping):
            raise ContractError("expected a JSON object", source=source, row=index)
        r = dict(row)
        for key in ("nodes", "comms"):
            if key in r and not isinstance(r[key], str) and r[key] is not None:
                r[key] = json.dumps(r[key])
        flat.append(r)
    schema = SCHEMAS["meta"]
    for f in schema:
        if f.name not in flat[0] or flat[0][f.name] is None:
            raise ContractError("missing required column", source=source, row=index,
                                column=f.name)
    try:
        return pa.Table.from_pylist(flat, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return _rows_to_table_checked("meta", flat, source)


def _json_field(value: Any, column: str, source: str, index: int, default: Any) -> Any:
    if value is None or value == "":
        return default
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ContractError(f"malformed JSON text: {e.msg}", source=source, row=index,
                                column=column) from None
    return value


def latest_meta(metas: Sequence[JobMeta]) -> dict[str, JobMeta]:
    """Per job, the row with the largest ``t`` (a tie: the later one)."""
    out: dict[str, JobMeta] = {}
    for m in metas:
        if m.job not in out or m.t >= out[m.job].t:
            out[m.job] = m
    return out


def node_index(meta: JobMeta) -> dict[str, int]:
    """Stable integer ids for node names."""
    return {name: i for i, name in enumerate(sorted(set(meta.nodes.values())))}
