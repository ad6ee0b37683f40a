"""The critical path of one training iteration from ``coll`` rows, and the iteration as a
Chrome trace for Perfetto.

Critical path (the chain of work that decided when the iteration ended; MEGATRACE §IV-C
follows the same dependencies to find the stage that slows the step): a collective round
cannot complete before its last member enters (CCL-D's observation that the straggler is the
last to arrive), and a rank cannot enter an operation before it finished the previous one and
computed in between. So, walking backwards from the operation that completed last in the
iteration:

1. the round's transfer, from its last member entering to its completion, is on the path;
2. the last member to enter is the one the round waited for: its compute gap since its
   previous operation is on the path (``compute``), then that previous operation's round,
   and so on, until the walk leaves the iteration.

Point-to-point operations pair the k-th ``send`` from communicator rank a to b with the
k-th ``recv`` of b from a (events.md). Cross-node clock offsets of a few ms can put a rank
that entered a few ms earlier on the path; a straggler still dominates by its compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.diagnosis import Anomaly
from failslow.events import JobMeta


@dataclass(frozen=True)
class Segment:
    """One piece of the critical path: ``compute`` on ``rank`` between two operations, or
    the ``communication`` of a round after its last member (``rank``) entered."""

    kind: str
    rank: int
    t0: int
    t1: int
    op: str = ""
    comm: int | None = None
    seq: int | None = None

    @property
    def duration_ns(self) -> int:
        return max(self.t1 - self.t0, 0)


@dataclass(frozen=True)
class _Ops:
    rank: np.ndarray
    comm: np.ndarray
    seq: np.ndarray
    op: np.ndarray  # object (str)
    enter: np.ndarray
    end: np.ndarray
    round_id: np.ndarray


def _operations(coll: pa.Table, t_start: int, t_end: int) -> _Ops | None:
    """One row per (rank, comm, seq) with an enter and an end inside ``[t_start, t_end]``,
    and the round each belongs to."""
    if coll.num_rows == 0:
        return None
    win = coll.filter(pc.and_(pc.greater_equal(coll.column("t"), t_start),
                              pc.less_equal(coll.column("t"), t_end)))
    keys = ["rank", "comm", "seq"]
    enters = win.filter(pc.equal(win.column("phase"), "enter")).select(
        [*keys, "op", "comm_rank", "peer", "t"]).rename_columns(
        [*keys, "op", "comm_rank", "peer", "t_enter"])
    ends = win.filter(pc.equal(win.column("phase"), "end")).select([*keys, "t"]) \
        .rename_columns([*keys, "t_done"])
    ops = enters.join(ends, keys, join_type="inner")
    if ops.num_rows == 0:
        return None
    rank = ops.column("rank").to_numpy().astype(np.int64)
    comm = ops.column("comm").to_numpy().astype(np.uint64)
    seq = ops.column("seq").to_numpy().astype(np.uint64)
    op = np.asarray(ops.column("op").to_pylist(), dtype=object)
    comm_rank = ops.column("comm_rank").to_numpy().astype(np.int64)
    peer = ops.column("peer").to_numpy().astype(np.int64)
    enter = ops.column("t_enter").to_numpy().astype(np.int64)
    end = ops.column("t_done").to_numpy().astype(np.int64)
    # round identity: (comm, seq) for collectives; (comm, sender, receiver, k) for p2p
    is_send = op == "send"
    is_p2p = is_send | (op == "recv")
    src = np.where(is_send, comm_rank, peer)
    dst = np.where(is_send, peer, comm_rank)
    order = np.lexsort((seq, is_send, dst, src, comm, ~is_p2p))
    k = np.zeros(len(op), np.int64)
    if is_p2p.any():
        o = order[is_p2p[order]]
        new = np.ones(len(o), bool)
        for col in (comm[o], src[o], dst[o], is_send[o]):
            new[1:] |= col[1:] != col[:-1]
        group = np.cumsum(new) - 1
        first = np.flatnonzero(new)
        k[o] = np.arange(len(o)) - first[group]
    labels: dict[tuple[Any, ...], int] = {}
    round_id = np.empty(len(op), np.int64)
    for i in range(len(op)):  # one dict lookup per operation of one iteration (not per event)
        rk: tuple[Any, ...] = (("p", int(comm[i]), int(src[i]), int(dst[i]), int(k[i]))
                               if is_p2p[i] else ("c", int(comm[i]), int(seq[i])))
        round_id[i] = labels.setdefault(rk, len(labels))
    return _Ops(rank, comm, seq, op, enter, end, round_id)


def critical_path(coll: pa.Table, t_start: int, t_end: int,
                  max_segments: int = 100_000) -> list[Segment]:
    """The critical path of the iteration ``[t_start, t_end]`` (see the module docstring), in
    time order and without gaps: it starts at ``t_start`` (or the first operation) and ends
    when the last operation of the window completed. Empty when the window holds no completed
    operation.

    Each step goes strictly back in time (a round's last member entered before the point
    reached; the operation before it on that rank ended before it entered), so the walk
    ends even when asynchronous point-to-point operations overlap."""
    ops = _operations(coll, t_start, t_end)
    if ops is None:
        return []
    # members of each round, and each rank's operations ordered by completion
    by_round = np.argsort(ops.round_id, kind="stable")
    r_ids, r_first = np.unique(ops.round_id[by_round], return_index=True)
    r_bounds = dict(zip(r_ids.tolist(), zip(r_first.tolist(), [*r_first[1:].tolist(),
                                                                len(by_round)], strict=True),
                        strict=True))
    by_rank_end: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    order = np.lexsort((ops.end, ops.rank))
    ranks, starts = np.unique(ops.rank[order], return_index=True)
    for r, a, b in zip(ranks.tolist(), starts.tolist(), [*starts[1:].tolist(), len(order)],
                       strict=True):
        idx = order[a:b]
        by_rank_end[r] = (ops.end[idx], idx)

    segments: list[Segment] = []
    cur = int(np.argmax(ops.end))
    t_cur = int(ops.end[cur])
    while len(segments) < max_segments:
        a, b = r_bounds[int(ops.round_id[cur])]
        members = by_round[a:b]
        members = members[ops.enter[members] <= t_cur]
        if len(members) == 0:
            break
        gate = int(members[np.argmax(ops.enter[members])])
        r, t_in = int(ops.rank[gate]), int(ops.enter[gate])
        segments.append(Segment("communication", r, t_in, t_cur, str(ops.op[gate]),
                                int(ops.comm[gate]), int(ops.seq[gate])))
        ends, idx = by_rank_end[r]
        k = int(np.searchsorted(ends, t_in, side="right")) - 1
        while k >= 0 and ops.round_id[idx[k]] == ops.round_id[gate]:
            k -= 1
        if k < 0:
            if t_in > t_start:
                segments.append(Segment("compute", r, t_start, t_in))
            break
        prev = int(idx[k])
        segments.append(Segment("compute", r, int(ops.end[prev]), t_in))
        cur, t_cur = prev, int(ops.end[prev])
    segments.reverse()
    return [s for s in segments if s.t1 > s.t0]


def summarize(path: Sequence[Segment]) -> dict[str, Any]:
    """Totals of a path: time by kind, compute by rank, communication by op."""
    by_kind: dict[str, int] = {}
    compute: dict[int, int] = {}
    comm_ops: dict[str, int] = {}
    for s in path:
        by_kind[s.kind] = by_kind.get(s.kind, 0) + s.duration_ns
        if s.kind == "compute":
            compute[s.rank] = compute.get(s.rank, 0) + s.duration_ns
        else:
            comm_ops[s.op] = comm_ops.get(s.op, 0) + s.duration_ns
    return {"by_kind_ns": by_kind,
            "compute_by_rank_ns": dict(sorted(compute.items(), key=lambda kv: -kv[1])),
            "communication_by_op_ns": dict(sorted(comm_ops.items(), key=lambda kv: -kv[1]))}


def slow_iteration(iterations: pa.Table, anomalies: Sequence[Anomaly]) -> tuple[int, int, int]:
    """``(iteration, t_start, t_end)`` of the iteration to explain: the slowest job-level
    iteration inside a diagnosed slow-down (else the slowest one)."""
    if iterations.num_rows == 0:
        raise ValueError("no iterations")
    rows = iterations
    if (iterations.column("rank").to_numpy() == -1).any():
        rows = iterations.filter(pc.equal(iterations.column("rank"), -1))
    it = rows.column("iteration").to_numpy()
    t0 = rows.column("t_start").to_numpy()
    t1 = rows.column("t_end").to_numpy()
    dur = rows.column("duration_ns").to_numpy()
    inside = np.zeros(len(it), bool)
    for a in anomalies:
        if a.kind == "slow" and a.start_ns is not None:
            end = a.end_ns if a.end_ns is not None else np.iinfo(np.int64).max
            inside |= (t1 >= a.start_ns) & (t0 <= end)
    cand = np.flatnonzero(inside) if inside.any() else np.arange(len(it))
    i = int(cand[np.argmax(dur[cand])])
    return int(it[i]), int(t0[i]), int(t1[i])


# ---------------------------------------------------------------------------------------------
# Chrome trace (Perfetto)


def chrome_trace(meta: JobMeta, coll: pa.Table, t_start: int, t_end: int,
                 span: pa.Table | None = None, path: Sequence[Segment] = (),
                 anomalies: Sequence[Anomaly] = (),
                 comm_kinds: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The iteration ``[t_start, t_end]`` in the Chrome trace event format (Perfetto opens
    it): one process per pipeline stage, one thread per rank, framework spans when present,
    communication operations, the critical path as its own track, anomalies as instants.
    Times are microseconds since ``t_start``."""
    kinds = dict(comm_kinds or {c.comm: c.kind for c in meta.comms})
    inner = max(meta.tp * meta.cp * meta.dp, 1)
    events: list[dict[str, Any]] = []

    def us(ns: int) -> float:
        return round((ns - t_start) / 1000.0, 3)

    stages = sorted({r // inner for r in range(meta.world_size)})
    for stage in stages:
        events.append({"ph": "M", "name": "process_name", "pid": stage,
                       "args": {"name": f"pipeline stage {stage}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": stage,
                       "args": {"sort_index": stage}})
    for r in range(meta.world_size):
        events.append({"ph": "M", "name": "thread_name", "pid": r // inner, "tid": r,
                       "args": {"name": f"rank {r} ({meta.node_of(r)})"}})
    cp_pid = len(stages)
    events.append({"ph": "M", "name": "process_name", "pid": cp_pid,
                   "args": {"name": "critical path"}})
    events.append({"ph": "M", "name": "process_sort_index", "pid": cp_pid,
                   "args": {"sort_index": -1}})
    if span is not None and span.num_rows:
        sel = span.filter(pc.and_(pc.less_equal(span.column("t_start"), t_end),
                                  pc.greater_equal(span.column("t_end"), t_start)))
        for row in sel.to_pylist():
            events.append({"ph": "X", "name": row["op"], "cat": "span",
                           "pid": row["rank"] // inner, "tid": row["rank"] + 100_000,
                           "ts": us(row["t_start"]), "dur": us(row["t_end"]) - us(row["t_start"]),
                           "args": {"step": row["step"], "microbatch": row["microbatch"]}})
        for r in range(meta.world_size):
            events.append({"ph": "M", "name": "thread_name", "pid": r // inner,
                           "tid": r + 100_000, "args": {"name": f"rank {r} spans"}})
    ops = _operations(coll, t_start, t_end)
    if ops is not None:
        for i in range(len(ops.rank)):
            r = int(ops.rank[i])
            comm = int(ops.comm[i])
            events.append({"ph": "X", "name": str(ops.op[i]), "cat": kinds.get(comm, "comm"),
                           "pid": r // inner, "tid": r, "ts": us(int(ops.enter[i])),
                           "dur": max(us(int(ops.end[i])) - us(int(ops.enter[i])), 0.0),
                           "args": {"comm": str(comm), "seq": int(ops.seq[i]),
                                    "kind": kinds.get(comm, "")}})
    for j, s in enumerate(path):
        events.append({"ph": "X", "name": f"{s.kind}: rank {s.rank}" + (
            f" {s.op}" if s.op else ""), "cat": f"critical,{s.kind}", "pid": cp_pid,
            "tid": 0, "ts": us(s.t0), "dur": us(s.t1) - us(s.t0),
            "args": {"rank": s.rank, "op": s.op, "comm": None if s.comm is None else str(s.comm),
                     "seq": s.seq, "index": j}})
    for a in anomalies:
        if a.start_ns is None:
            continue
        events.append({"ph": "i", "s": "g", "name": f"{a.id}: {a.kind}/{a.cause}",
                       "cat": "anomaly", "pid": cp_pid, "tid": 0,
                       "ts": us(max(a.start_ns, t_start)),
                       "args": {k: v for k, v in a.to_dict().items()
                                if k in ("id", "ranks", "link", "stage", "slowdown")}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"job": meta.job, "t_start_ns": str(t_start),
                          "t_end_ns": str(t_end), "generator": "failslow report --perfetto"}}
