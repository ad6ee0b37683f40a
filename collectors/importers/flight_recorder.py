"""Import PyTorch NCCL Flight Recorder dumps into the failslow event contract.

PyTorch's ``ProcessGroupNCCL`` keeps a per-rank ring buffer of the communication operations
it issued (the "Flight Recorder") and dumps it, one file per rank, when a collective times out
or fails. Each dump holds ``pg_config`` (process group name -> description and member global
ranks), ``pg_status`` and ``entries``: one dict per operation with the process group,
``profiling_name`` (``nccl:all_reduce``, ``nccl:send 0->3``, ...), the per-group counters
``collective_seq_id`` / ``p2p_seq_id`` / ``op_id``, tensor sizes and dtypes, ``state``
(``scheduled`` / ``started`` / ``completed``) and host timestamps. That is CCL-D's Trace ID
view (communicator + sequence number, §3) of the last operations before a hang, which is what
failslow's hang detectors need (events.md, ``coll`` kind; diagnosis.md, ``hang``).

Mapping (one ``enter`` row per operation, one ``end`` row when the dump says it completed):

- ``comm``: a stable hash of the process group name and its member ranks (names can repeat
  after ``split_group``), so it is identical on every member. Point-to-point operations of a
  group are put on a second communicator of the same members and kind (hash with ``p2p``):
  PyTorch numbers collectives and point-to-point operations of a group with two separate
  counters, and keeping them on separate communicators is the only way to keep
  (``comm``, ``seq``) naming the same collective round on every member (stages of a pipeline
  group issue different numbers of sends and receives, so one shared counter would disagree
  between members). PyTorch itself runs unbatched sends and receives on separate NCCL
  communicators.
- ``seq`` on the collective communicator: ``collective_seq_id - 1``. PyTorch counts
  collectives per group from 1 on every member, so this names the same round everywhere
  (the matching key of PyTorch's own analyzer). A coalesced group (``*_coalesced`` ops, or
  individual ops followed by a ``coalesced`` record, all sharing one ``collective_seq_id``) is
  one round, i.e. one operation: bytes summed, state from the ``coalesced`` record.
- ``seq`` on the point-to-point communicator: ``op_id - collective_seq_id - 1``, the number of
  point-to-point calls the rank made on the group before this one. It equals
  ``p2p_seq_id - 1`` when nothing is coalesced and stays unique when a batched send/recv group
  shares one ``p2p_seq_id``. Point-to-point rounds are matched by order per peer (events.md),
  not by ``seq``. Without ``op_id`` (old dumps): ``p2p_seq_id - 1``.
- ``t`` of ``enter`` = ``time_created_ns`` (host enqueue); ``t`` of ``end`` =
  ``time_discovered_completed_ns`` (when the watchdog saw completion, an upper bound of device
  completion) with ``t_start`` = ``time_discovered_started_ns`` when known.
- ``op`` from ``profiling_name`` (see :data:`OP_BY_NAME`); ``gather`` / ``scatter`` become
  ``allgather`` / ``reducescatter`` (closest shape), ``barrier`` an ``allreduce`` of its small
  buffer; unknown names are skipped and counted. ``bytes`` = element count x dtype size of this
  rank's own buffer (input; output for ``reducescatter`` / ``recv``). ``peer`` for send/recv
  comes from ``send a->b`` / ``recv a<-b`` (group ranks); the root of ``broadcast`` / ``reduce``
  is not recorded, so it is -1.
- Extra columns on ``coll`` rows: ``fr_pg`` (group name), ``fr_seq_id`` (the raw PyTorch id)
  and ``fr_state``.

Meta: job from the dump folder name; ``world_size`` from the default group; tp/pp/dp/cp
from the Megatron group descriptions (``TENSOR_MODEL_PARALLEL_GROUP``, ...) when they multiply
to the world size, else tp=pp=cp=1, dp=world; schedule ``unknown``; micro-batches 0; nodes
``node<rank // 8>`` (dumps do not name hosts); ``comms``: every process group (and the
point-to-point communicators in use) with its kind from the description. ``t`` is the latest
``time_created_ns`` in the dumps (a lower bound of the dump time).

What a dump covers: the entries still in the ring buffer, or, when it was taken with PyTorch's
"only active" option, only the operations that had not completed (as in NVIDIA's
``gpu_error_1st`` test dumps: every entry ``scheduled``, and each group's entry count equals
``last_enqueued - last_completed`` of ``pg_status``). Then an operation a rank issued but that
is absent from its dump had completed. Ranks' windows differ. ``import.json`` says whether
every imported entry is incomplete (``only_incomplete_entries``) and keeps each rank's
``pg_status`` (last enqueued / started / completed id per group) for consumers that want the
completed frontier.

Reading the dumps (pickles loaded without any class, or JSON) and their process groups is in
:mod:`failslow.collectors.importers.flight_recorder_dumps`; this module converts them.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow import events
from failslow.collectors.importers import ImportResult, sanitize_job
from failslow.collectors.importers.flight_recorder_dumps import (  # all re-exported
    KIND_BY_DESC,  # noqa: F401
    ProcessGroup,
    find_dumps,
    group_kind,  # noqa: F401
    infer_degrees,
    normalize_desc,
    parse_pg_config,
    read_dump,
)
from failslow.events import Comm, ContractError, JobMeta

log = logging.getLogger(__name__)

SOURCE = "pytorch-flight-recorder"

#: profiling name (after ``nccl:``) -> contract op.
OP_BY_NAME: dict[str, str] = {
    "all_reduce": "allreduce", "allreduce": "allreduce", "allreduce_coalesced": "allreduce",
    "all_reduce_coalesced": "allreduce", "allreduce_sparse": "allreduce",
    "all_reduce_barrier": "allreduce", "barrier": "allreduce",
    "_all_gather_base": "allgather", "_allgather_base": "allgather", "all_gather": "allgather",
    "allgather": "allgather", "all_gather_single": "allgather", "all_gather_v": "allgather",
    "all_gather_into_tensor": "allgather", "all_gather_into_tensor_coalesced": "allgather",
    "allgather_coalesced": "allgather", "allgather_into_tensor_coalesced": "allgather",
    "ALLGATHER_coalesced": "allgather", "gather": "allgather",
    "_reduce_scatter_base": "reducescatter", "reduce_scatter": "reducescatter",
    "reduce_scatter_single": "reducescatter", "reduce_scatter_v": "reducescatter",
    "reduce_scatter_tensor": "reducescatter", "reduce_scatter_tensor_coalesced": "reducescatter",
    "reduce_scatter_coalesced": "reducescatter", "REDUCE_SCATTER_coalesced": "reducescatter",
    "scatter": "reducescatter",
    "all_to_all": "alltoall", "alltoall": "alltoall", "alltoall_base": "alltoall",
    "all_to_all_single": "alltoall", "all_to_all_v_single": "alltoall",
    "broadcast": "broadcast", "_broadcast_oop": "broadcast", "broadcast_coalesced": "broadcast",
    "reduce": "reduce", "_reduce_oop": "reduce",
    "send": "send", "recv": "recv",
}
#: Names mapped to an op of a different shape (counted in the import warnings).
APPROXIMATED = frozenset({"gather", "scatter", "barrier", "all_reduce_barrier"})
#: Operations whose own buffer is the output (receive) buffer.
_OUTPUT_BUFFER_OPS = frozenset({"reducescatter", "recv"})
#: Records that only mark the end of a coalesced group.
_COALESCED = "coalesced"

#: Bytes per element of PyTorch dtype names as Flight Recorder writes them.
DTYPE_BYTES: dict[str, int] = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "ComplexHalf": 4, "ComplexFloat": 8, "ComplexDouble": 16,
    "QInt8": 1, "QUInt8": 1, "QInt32": 4, "QUInt4x2": 1, "QUInt2x4": 1,
    "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1, "Float4_e2m1fn_x2": 1, "UInt16": 2, "UInt32": 4, "UInt64": 8,
    "UInt1": 1, "UInt2": 1, "UInt3": 1, "UInt4": 1, "UInt5": 1, "UInt6": 1, "UInt7": 1,
    "Int1": 1, "Int2": 1, "Int3": 1, "Int4": 1, "Int5": 1, "Int6": 1, "Int7": 1,
    "Bits1x8": 1, "Bits2x4": 1, "Bits4x2": 1, "Bits8": 1, "Bits16": 2,
}

_REQUIRED_ENTRY_KEYS = ("process_group", "profiling_name", "collective_seq_id",
                        "time_created_ns")
_SEND = re.compile(r"^(\d+)->(\d+)$")
_RECV = re.compile(r"^(\d+)<-(\d+)$")
GPUS_PER_NODE = 8


# ---------------------------------------------------------------------------------------------
# conversion


@dataclass
class _Op:
    """One contract operation of one rank (a coalesced collective group is one op)."""

    group: ProcessGroup
    p2p: bool
    op: str
    seq: int
    fr_seq_id: int
    t_enter: int
    nbytes: int
    peer: int
    state: str = "scheduled"
    t_started: int | None = None
    t_end: int | None = None
    own_states: list[str] = field(default_factory=list)
    own_ends: list[int | None] = field(default_factory=list)


def _numel(shape: Any) -> int:
    if not isinstance(shape, list | tuple):
        return 0
    return math.prod(int(x) for x in shape) if shape else 1


def _buffer_bytes(entry: Mapping[str, Any], op: str, result: ImportResult) -> int:
    side = "output" if op in _OUTPUT_BUFFER_OPS else "input"
    sizes = entry.get(f"{side}_sizes") or []
    dtypes = entry.get(f"{side}_dtypes") or entry.get("input_dtypes") or []
    total = 0
    for i, shape in enumerate(sizes):
        dtype = dtypes[i] if i < len(dtypes) else (dtypes[-1] if dtypes else None)
        width = DTYPE_BYTES.get(str(dtype))
        if width is None:
            result.warn(f"unknown dtype {dtype!r}: its bytes count as 0")
            continue
        total += _numel(shape) * width
    return total


def _split_name(profiling_name: str) -> tuple[str, str | None]:
    name = profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name
    parts = name.split()
    return (parts[0] if parts else ""), (parts[1] if len(parts) > 1 else None)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


class _RankConverter:
    """Turns one rank's dump into contract operations."""

    def __init__(self, rank: int, dump: Mapping[str, Any], source: str,
                 groups: dict[str, ProcessGroup], by_name: dict[str, list[ProcessGroup]],
                 result: ImportResult) -> None:
        self.rank, self.dump, self.source = rank, dump, source
        self.groups, self.by_name, self.result = groups, by_name, result
        self.colls: dict[tuple[int, int], _Op] = {}
        self.p2ps: list[tuple[_Op, tuple[int, int]]] = []
        self.markers: dict[tuple[bool, int, int], Mapping[str, Any]] = {}
        self.pg_ids: dict[str, str] = {}  # local pg_id -> group name, learnt from entries

    def group_of(self, entry: Mapping[str, Any], index: int) -> ProcessGroup | None:
        pg = entry["process_group"]
        if not isinstance(pg, list | tuple) or not pg:
            raise ContractError(f"entry {index}: 'process_group' must be (name, desc)",
                                source=self.source)
        name = str(pg[0])
        group = self.groups.get(name)
        if group is None:
            candidates = self.by_name.get(name, [])
            if len(candidates) == 1:
                group = candidates[0]
        if group is None:
            self.result.warn("entry on a process group missing from pg_config: skipped")
            return None
        if self.rank not in group.ranks:
            self.result.warn("entry on a process group the rank is not a member of: skipped")
            return None
        return group

    def convert(self) -> None:
        entries = self.dump["entries"]
        order = list(range(len(entries)))
        if all(isinstance(e, Mapping) and isinstance(e.get("record_id"), int) for e in entries):
            order.sort(key=lambda i: entries[i]["record_id"])
        for i in order:
            self.entry(entries[i], i)
        self.finish()

    def entry(self, entry: Any, index: int) -> None:
        if not isinstance(entry, Mapping):
            raise ContractError(f"entry {index} is a {type(entry).__name__}, expected a dict",
                                source=self.source)
        for key in _REQUIRED_ENTRY_KEYS:
            if key not in entry:
                raise ContractError(f"entry {index}: missing key '{key}'", source=self.source)
        group = self.group_of(entry, index)
        if group is None:
            return
        if entry.get("pg_id") is not None:
            self.pg_ids[str(entry["pg_id"])] = group.name
        base, arg = _split_name(str(entry["profiling_name"]))
        is_p2p = bool(entry.get("is_p2p", base in ("send", "recv")))
        cs = _int_or_none(entry["collective_seq_id"])
        t_enter = _int_or_none(entry["time_created_ns"])
        if cs is None or t_enter is None:
            self.result.warn("entry without an integer collective_seq_id / time_created_ns: "
                             "skipped")
            return
        gi = id(group)
        if base == _COALESCED:
            fr_id = _int_or_none(entry.get("p2p_seq_id")) if is_p2p else cs
            self.markers[(is_p2p, gi, fr_id if fr_id is not None else -1)] = entry
            return
        op = OP_BY_NAME.get(base)
        if op is None:
            self.result.warn(f"unsupported operation {entry['profiling_name']!r}: skipped")
            return
        if base in APPROXIMATED:
            self.result.warn(f"'{base}' imported as '{op}' (closest contract operation)")
        nbytes = _buffer_bytes(entry, op, self.result)
        state = str(entry.get("state", "scheduled"))
        t_end = _int_or_none(entry.get("time_discovered_completed_ns"))
        t_started = _int_or_none(entry.get("time_discovered_started_ns"))
        if is_p2p or op in ("send", "recv"):
            self.p2p_entry(entry, group, op, arg, cs, t_enter, nbytes, state, t_started, t_end)
            return
        if cs < 1:
            self.result.warn("collective with collective_seq_id < 1: skipped")
            return
        current = self.colls.get((gi, cs))
        if current is None:
            current = self.colls[(gi, cs)] = _Op(group, False, op, cs - 1, cs, t_enter, 0, -1)
        elif current.op != op:  # another op of a coalesced group
            self.result.warn("coalesced group mixes operations: imported as its first")
        current.t_enter = min(current.t_enter, t_enter)
        current.nbytes += nbytes
        current.own_states.append(state)
        current.own_ends.append(t_end)
        if t_started is not None:
            current.t_started = (t_started if current.t_started is None
                                 else min(current.t_started, t_started))

    def p2p_entry(self, entry: Mapping[str, Any], group: ProcessGroup, op: str,
                  arg: str | None, cs: int, t_enter: int, nbytes: int, state: str,
                  t_started: int | None, t_end: int | None) -> None:
        p2p_id = _int_or_none(entry.get("p2p_seq_id"))
        op_id = _int_or_none(entry.get("op_id"))
        seq = op_id - cs - 1 if op_id is not None else None
        if seq is None or seq < 0:
            seq = p2p_id - 1 if p2p_id is not None and p2p_id >= 1 else None
        if seq is None:
            self.result.warn("point-to-point entry without usable op_id / p2p_seq_id: skipped")
            return
        me = group.ranks.index(self.rank)
        peer = -1
        match = (_SEND if op == "send" else _RECV).match(arg or "")
        if match is not None:
            own, other = int(match.group(1)), int(match.group(2))
            if own != me:
                self.result.warn("send/recv names a group rank other than the dumping rank")
            if 0 <= other < len(group.ranks):
                peer = other
        if peer < 0:
            self.result.warn(f"{op} without a valid peer in {entry['profiling_name']!r}")
        done = state == "completed" or t_end is not None
        item = _Op(group, True, op, seq, p2p_id if p2p_id is not None else seq + 1, t_enter,
                   nbytes, peer, state=state, t_started=t_started,
                   t_end=t_end if done else None)
        item.own_states.append(state)
        self.p2ps.append((item, (id(group), p2p_id if p2p_id is not None else -1)))

    def finish(self) -> None:
        """Settle the state of coalesced groups and point-to-point ops from their markers."""
        for (gi, cs), item in self.colls.items():
            marker = self.markers.get((False, gi, cs))
            if marker is not None:
                self._apply_marker(item, marker)
            elif all(s == "completed" or e is not None
                     for s, e in zip(item.own_states, item.own_ends, strict=True)):
                item.state = "completed"
                ends = [e for e in item.own_ends if e is not None]
                item.t_end = max(ends) if ends else None
            else:
                item.state = ("started" if any(s in ("started", "completed")
                                               for s in item.own_states) else "scheduled")
        for item, key in self.p2ps:
            marker = self.markers.get((True, *key))
            if marker is not None and item.state != "completed":
                self._apply_marker(item, marker)

    def _apply_marker(self, item: _Op, marker: Mapping[str, Any]) -> None:
        item.state = str(marker.get("state", item.state))
        item.t_end = _int_or_none(marker.get("time_discovered_completed_ns"))
        started = _int_or_none(marker.get("time_discovered_started_ns"))
        if started is not None:
            item.t_started = started

    def ops(self) -> list[_Op]:
        return list(self.colls.values()) + [op for op, _ in self.p2ps]


def convert(dumps: Mapping[int, Mapping[str, Any]], job: str,
            sources: Mapping[int, str] | None = None) -> ImportResult:
    """Convert parsed dumps (rank -> dump dict, as :func:`read_dump` returns) of one job."""
    sources = dict(sources or {})
    result = ImportResult(meta=_placeholder_meta(job), tables={})
    per_rank_groups: dict[int, dict[str, ProcessGroup]] = {}
    unique: dict[tuple[str, tuple[int, ...]], ProcessGroup] = {}
    for rank, dump in sorted(dumps.items()):
        source = sources.get(rank, f"rank {rank}")
        groups = parse_pg_config(dump, source)
        canonical = {}
        for name, g in groups.items():
            key = (g.name, g.ranks)
            if key in unique and unique[key].desc != g.desc:
                result.warn("a process group has different descriptions on different ranks")
            canonical[name] = unique.setdefault(key, g)
        per_rank_groups[rank] = canonical
    by_name: dict[str, list[ProcessGroup]] = {}
    for g in unique.values():
        by_name.setdefault(g.name, []).append(g)
    world = _world_size(unique.values(), dumps.keys())
    missing = sorted(set(range(world)) - set(dumps))
    if missing:
        named = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        plural = "s" if len(missing) > 1 else ""
        result.warn(f"no dump for {len(missing)} of {world} ranks (rank{plural} {named}): "
                    "reported as unknown, never as a root cause", len(missing))

    converters = []
    for rank, dump in sorted(dumps.items()):
        conv = _RankConverter(rank, dump, sources.get(rank, f"rank {rank}"),
                              per_rank_groups[rank], by_name, result)
        conv.convert()
        converters.append(conv)

    ops = [(conv.rank, op) for conv in converters for op in conv.ops()]
    p2p_groups = {id(op.group): op.group for _, op in ops if op.p2p}
    comms = [Comm(g.comm, g.kind, g.ranks) for g in sorted(unique.values(),
                                                           key=lambda g: (g.name, g.ranks))]
    comms += [Comm(g.p2p_comm, g.kind, g.ranks)
              for g in sorted(p2p_groups.values(), key=lambda g: (g.name, g.ranks))]
    tp, pp, dp, cp = infer_degrees(list(unique.values()), world, result)
    t_meta = max((op.t_enter for _, op in ops), default=0)
    result.meta = JobMeta(job=job, t=t_meta, world_size=world, tp=tp, pp=pp, dp=dp, cp=cp,
                          microbatches=0, schedule="unknown",
                          nodes={r: f"node{r // GPUS_PER_NODE}" for r in range(world)},
                          comms=tuple(comms))
    result.tables = {"coll": _coll_table(job, ops)}
    result.info = _info(dumps, sources, converters, ops)
    result.info["unobserved_ranks"] = missing
    return result


def _placeholder_meta(job: str) -> JobMeta:
    return JobMeta(job=job, t=0, world_size=1, tp=1, pp=1, dp=1, cp=1, microbatches=0,
                   schedule="unknown", nodes={}, comms=())


def _world_size(groups: Any, ranks: Any) -> int:
    groups = list(groups)
    default = [g for g in groups if normalize_desc(g.desc) == "DEFAULT_PG"]
    world = len(default[0].ranks) if len(default) == 1 and default[0].ranks else 0
    highest = max([max(g.ranks) for g in groups if g.ranks] + list(ranks), default=0)
    return max(world, highest + 1)


def _coll_table(job: str, ops: Sequence[tuple[int, _Op]]) -> pa.Table:
    cols: dict[str, list[Any]] = {k: [] for k in (
        "rank", "comm", "comm_rank", "comm_size", "seq", "op", "bytes", "peer", "phase", "t",
        "t_start", "fr_pg", "fr_seq_id", "fr_state")}

    def row(rank: int, op: _Op, phase: str, t: int, t_start: int | None) -> None:
        g = op.group
        cols["rank"].append(rank)
        cols["comm"].append(g.p2p_comm if op.p2p else g.comm)
        cols["comm_rank"].append(g.ranks.index(rank))
        cols["comm_size"].append(len(g.ranks))
        cols["seq"].append(op.seq)
        cols["op"].append(op.op)
        cols["bytes"].append(op.nbytes)
        cols["peer"].append(op.peer)
        cols["phase"].append(phase)
        cols["t"].append(t)
        cols["t_start"].append(t_start)
        cols["fr_pg"].append(g.name)
        cols["fr_seq_id"].append(op.fr_seq_id)
        cols["fr_state"].append(op.state)

    for rank, op in ops:
        row(rank, op, "enter", op.t_enter, None)
        if op.state == "completed" or op.t_end is not None:
            # a completion without its time: the latest time known to precede it
            t_end = op.t_end if op.t_end is not None else max(op.t_enter, op.t_started or 0)
            row(rank, op, "end", t_end, op.t_started)
    n = len(cols["rank"])
    schema = events.SCHEMAS["coll"]
    arrays = {f.name: pa.array(cols[f.name], type=f.type) if f.name in cols
              else pa.nulls(n, f.type) for f in schema}
    arrays["job"] = pa.array([job] * n, type=pa.string())
    table = pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)
    table = table.append_column("fr_pg", pa.array(cols["fr_pg"], type=pa.string()))
    table = table.append_column("fr_seq_id", pa.array(cols["fr_seq_id"], type=pa.int64()))
    table = table.append_column("fr_state", pa.array(cols["fr_state"], type=pa.string()))
    return events.conform(table, "coll")


def _info(dumps: Mapping[int, Mapping[str, Any]], sources: Mapping[int, str],
          converters: Sequence[_RankConverter], ops: Sequence[tuple[int, _Op]]) -> dict[str, Any]:
    states = sorted({op.state for _, op in ops})
    p2p_in_use = {id(op.group) for _, op in ops if op.p2p}
    pg_status: dict[str, dict[str, Any]] = {}
    for conv in converters:
        raw = conv.dump.get("pg_status")
        if not isinstance(raw, Mapping):
            continue
        named = {}
        for pg_id, status in raw.items():
            name = conv.pg_ids.get(str(pg_id))
            group = conv.groups.get(name) if name is not None else None
            if group is None or not isinstance(status, Mapping):
                continue
            named[group.name] = {"pg_id": str(pg_id), "comm": group.comm, **dict(status)}
            if id(group) in p2p_in_use:
                named[group.name]["p2p_comm"] = group.p2p_comm
        pg_status[str(conv.rank)] = named
    timeouts = [int(e["time_created_ns"]) + int(e["timeout_ms"]) * 1_000_000
                for d in dumps.values() for e in d["entries"]
                if isinstance(e, Mapping) and isinstance(e.get("timeout_ms"), int)
                and isinstance(e.get("time_created_ns"), int)
                and e.get("state") != "completed"]
    versions = sorted({str(d.get("version")) for d in dumps.values()})
    return {
        "source": SOURCE,
        "fr_versions": versions,
        "nccl_versions": sorted({str(d.get("nccl_version")) for d in dumps.values()}),
        "dumps": {str(r): Path(sources.get(r, "")).name for r in sorted(dumps)},
        "entry_states": states,
        "only_incomplete_entries": bool(ops) and states != ["completed"]
        and "completed" not in states,
        "observed_until_ns": max((op.t_enter for _, op in ops), default=None),
        # Flight Recorder dumps are taken when the watchdog declares the job stuck: an
        # operation in flight in the dump never completed (failslow analyze --post-mortem).
        "post_mortem": True,
        "earliest_timeout_deadline_ns": min(timeouts, default=None),
        "seq_mapping": {
            "collective": "comm = hash(pg name, ranks); seq = collective_seq_id - 1 "
                          "(a coalesced group is one operation)",
            "p2p": "comm = hash(pg name, ranks, 'p2p'); seq = op_id - collective_seq_id - 1 "
                   "(= p2p_seq_id - 1 without coalescing)",
            "pg_status": "raw PyTorch ids (1-based) per group; on a group that also ran "
                         "point-to-point operations they may count those",
        },
        "pg_status": pg_status,
    }


def import_dumps(dump_dir: str | Path, job: str | None = None) -> ImportResult:
    """Read every dump of ``dump_dir`` and convert them; ``job`` defaults to the folder name."""
    dumps: dict[int, dict[str, Any]] = {}
    paths: dict[int, Path] = {}
    for rank, path in find_dumps(dump_dir).items():
        dump = read_dump(path)
        own = dump.get("rank")
        if isinstance(own, int) and not isinstance(own, bool):
            rank = own  # a dump that names its rank wins over the file name
        if rank in dumps:
            raise ContractError(f"two dumps for rank {rank}", source=str(path))
        dumps[rank] = dump
        paths[rank] = path
    root = Path(dump_dir)
    name = root.name if root.is_dir() else root.parent.name
    result = convert(dumps, job or sanitize_job(name, "flight-recorder"),
                     {r: str(p) for r, p in paths.items()})
    result.info["input"] = str(root)
    result.log_warnings(log)
    return result
