"""A small synthetic training job for the hang detector's tests (GPipe order, injectable
faults) and the driver that replays it through the detector."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.detectors.base import EventBatch
from failslow.detectors.hang import HangConfig, HangDetector
from failslow.diagnosis import Anomaly
from failslow.events import Comm, JobMeta
from failslow.replay import replay

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
S = 1_000_000_000

# ---------------------------------------------------------------------------------------------
# a small synthetic training job (GPipe order: forward of every micro-batch, then backward,
# then the data-parallel gradient allreduce), with injectable faults


@dataclass
class Fault:
    """What happens to ``rank`` at step ``step`` of iteration ``iteration``.

    kinds: ``die`` (the rank never enters anything again: H1), ``bytes`` (enters with other
    byte count, nobody completes: H2), ``op`` (enters another operation: H2), ``deviant_done``
    (other byte count, the deviant completes and goes on, the others hang: H2), ``stall``
    (everyone enters, nothing completes, ``rank`` has the fewest steps: H3), ``late`` (the rank
    enters ``delay`` late, then everything completes: a hang that resolves, or a barrier).
    """

    kind: str
    rank: int
    iteration: int
    step: int
    delay: int = 0
    nbytes: int = 0
    link_peer: int | None = None
    link_every: int = 1             # link samples every this many 100 ms


@dataclass
class Job:
    tp: int = 2
    pp: int = 2
    dp: int = 2
    micro: int = 4
    iterations: int = 12
    seed: int = 0
    barrier_every: int = 0          # a 4-byte world allreduce every k iterations (0: never)
    pause: dict[int, int] = field(default_factory=dict)   # iteration -> pause before it (ns)
    faults: list[Fault] = field(default_factory=list)
    meta_comms: bool = True
    tail: int = 30 * S              # progress/link samples after a hang, for this long

    def __post_init__(self) -> None:
        self.world = self.tp * self.pp * self.dp
        base = 2**63 + 11
        self.tp_comm = {(s, d): base + 100 + s * self.dp + d
                        for s in range(self.pp) for d in range(self.dp)}
        self.pp_comm = {(d, r): base + 200 + d * self.tp + r
                        for d in range(self.dp) for r in range(self.tp)}
        self.dp_comm = {(s, r): base + 300 + s * self.tp + r
                        for s in range(self.pp) for r in range(self.tp)}
        self.world_comm = 2**64 - 1

    def rank(self, r: int, s: int, d: int) -> int:
        return r + self.tp * (d + self.dp * s)

    def comms(self) -> list[Comm]:
        out = [Comm(c, "tp", tuple(self.rank(r, s, d) for r in range(self.tp)))
               for (s, d), c in self.tp_comm.items()]
        out += [Comm(c, "pp", tuple(self.rank(r, s, d) for s in range(self.pp)))
                for (d, r), c in self.pp_comm.items()]
        out += [Comm(c, "dp", tuple(self.rank(r, s, d) for d in range(self.dp)))
                for (s, r), c in self.dp_comm.items()]
        out.append(Comm(self.world_comm, "world", tuple(range(self.world))))
        return out

    def node(self, rank: int) -> str:
        return f"n{rank // 2}"

    def meta(self) -> JobMeta:
        return JobMeta(job="synth", t=T0, world_size=self.world, tp=self.tp, pp=self.pp,
                       dp=self.dp, cp=1, microbatches=self.micro, schedule="gpipe",
                       nodes={r: self.node(r) for r in range(self.world)},
                       comms=tuple(self.comms()) if self.meta_comms else ())

    # the program: steps in an order consistent with every rank's own order ----------------

    def program(self, iteration: int) -> list[tuple[Any, ...]]:
        steps: list[tuple[Any, ...]] = []
        for m in range(self.micro):
            for s in range(self.pp):
                for d in range(self.dp):
                    if s > 0:
                        for r in range(self.tp):
                            steps.append(("p2p", self.pp_comm[(d, r)], self.rank(r, s - 1, d),
                                          self.rank(r, s, d), s - 1, s, 4 * MS, 2 * MS, m))
                    steps.append(("coll", self.tp_comm[(s, d)], "allreduce", 1 << 20,
                                  [self.rank(r, s, d) for r in range(self.tp)], MS, m))
        for m in range(self.micro):
            for s in reversed(range(self.pp)):
                for d in range(self.dp):
                    if s < self.pp - 1:
                        for r in range(self.tp):
                            steps.append(("p2p", self.pp_comm[(d, r)], self.rank(r, s + 1, d),
                                          self.rank(r, s, d), s + 1, s, 4 * MS, 2 * MS, m))
                    steps.append(("coll", self.tp_comm[(s, d)], "allreduce", 1 << 20,
                                  [self.rank(r, s, d) for r in range(self.tp)], MS, m))
        for s in range(self.pp):
            for r in range(self.tp):
                steps.append(("coll", self.dp_comm[(s, r)], "allreduce", 64 << 20,
                              [self.rank(r, s, d) for d in range(self.dp)], 30 * MS, -1))
        if self.barrier_every and iteration % self.barrier_every == 0:
            steps.append(("coll", self.world_comm, "allreduce", 4, list(range(self.world)),
                          MS, -1))
        return steps

    # simulation -------------------------------------------------------------------------------

    def run(self) -> dict[str, pa.Table]:
        rng = np.random.default_rng(self.seed)
        clock = dict.fromkeys(range(self.world), T0)
        seq: dict[tuple[int, int], int] = {}
        rows: dict[str, list[Any]] = {k: [] for k in (
            "rank", "comm", "comm_rank", "comm_size", "seq", "op", "bytes", "peer", "phase", "t")}
        prog: list[dict[str, Any]] = []
        links: list[dict[str, Any]] = []
        blocked: set[int] = set()
        faults = {(f.iteration, f.step): f for f in self.faults}
        members = {c.comm: list(c.ranks) for c in self.comms()}

        def emit(rank: int, comm: int, op: str, nbytes: int, peer: int, phase: str,
                 t: int, s: int | None = None) -> None:
            crank = members[comm].index(rank)
            if s is None:
                s = seq.get((comm, rank), 0)
                seq[(comm, rank)] = s + 1
            for k, v in zip(rows, (rank, comm, crank, len(members[comm]), s, op, nbytes, peer,
                                   phase, t), strict=True):
                rows[k].append(v)

        def compute() -> int:
            return int(5 * MS + rng.integers(0, MS))

        for it in range(self.iterations):
            if it in self.pause:
                top = max(clock.values())
                clock = dict.fromkeys(clock, top + self.pause[it])
            for k, step in enumerate(self.program(it)):
                fault = faults.get((it, k))
                if fault is not None and fault.kind == "die":
                    blocked.add(fault.rank)
                if step[0] == "p2p":
                    _, comm, snd, rcv, _ss, _rs, nbytes, xfer, _m = step
                    parts = [(snd, "send", members[comm].index(rcv)),
                             (rcv, "recv", members[comm].index(snd))]
                else:
                    _, comm, op, nbytes, ranks, xfer, _m = step
                    parts = [(r, op, -1) for r in ranks]
                live = [p for p in parts if p[0] not in blocked]
                enter: dict[int, tuple[int, int]] = {}
                for r, op, peer in live:
                    t = clock[r] + compute()
                    size = nbytes
                    if fault is not None and r == fault.rank:
                        t += fault.delay
                        if fault.kind in ("bytes", "deviant_done"):
                            size = fault.nbytes
                        if fault.kind == "op":
                            op = "allgather"
                    s = seq.get((comm, r), 0)
                    emit(r, comm, op, size, peer, "enter", t)
                    enter[r] = (t, s)
                    clock[r] = t
                ok = len(live) == len(parts) and (
                    fault is None or fault.kind in ("late", "die"))
                if fault is not None and fault.kind == "deviant_done":
                    r = fault.rank
                    t_end = max(t for t, _ in enter.values()) + xfer
                    emit(r, comm, parts[0][1], fault.nbytes, -1, "end", t_end, enter[r][1])
                    clock[r] = t_end
                    blocked.update(p[0] for p in live if p[0] != r)
                    continue
                if not ok:
                    blocked.update(p[0] for p in live)
                    if fault is not None and fault.kind == "stall":
                        self._stall_samples(fault, comm, enter, prog, links)
                    continue
                t_end = max(t for t, _ in enter.values()) + xfer
                for r, op, peer in live:
                    te = t_end + int(rng.integers(0, 20_000))
                    emit(r, comm, op, nbytes, peer, "end", te, enter[r][1])
                    clock[r] = te
            if len(blocked) == self.world:
                break
        arrays: dict[str, Any] = {k: v if k in ("op", "phase") else np.asarray(v, np.int64)
                                  for k, v in rows.items() if k != "comm"}
        arrays["comm"] = np.asarray(rows["comm"], dtype=np.uint64)
        coll = events.from_columns(arrays | {"job": "synth"}, "coll")
        out = {"coll": coll}
        if prog:
            out["progress"] = events.from_rows("progress", prog)
        if links:
            out["link"] = events.from_rows("link", links)
        return out

    def _stall_samples(self, fault: Fault, comm: int, enter: dict[int, tuple[int, int]],
                       prog: list[dict[str, Any]], links: list[dict[str, Any]]) -> None:
        """H3: everyone entered; send/recv steps stop, ``fault.rank`` has the fewest; with
        ``link_peer``, the queue pair from its node to the peer's node accumulates."""
        start = max(t for t, _ in enter.values())
        for k in range(int(self.tail // (100 * MS))):
            t = start + k * 100 * MS
            for r, (_, s) in enter.items():
                steps = min(k, 5) * (3 if r == fault.rank else 7)
                prog.append({"job": "synth", "rank": r, "comm": comm, "seq": s, "t": t + r,
                             "send_count": steps, "recv_count": steps})
        if fault.link_peer is None:
            return
        a, b = fault.rank, fault.link_peer
        every = fault.link_every
        for k in range(-3 * every, int(self.tail // (100 * MS)), every):
            t = start + k * 100 * MS
            # completions advance until the stall (k = 0), then stand still while posted
            # work requests keep accumulating
            completed = 1000 + 10 * min(k, 0)
            links.append({"job": "synth", "node": self.node(a), "rank": a,
                          "device": "mlx5_0", "peer_node": self.node(b), "t": t,
                          "posted": 1000 + 10 * k + 16, "completed": completed,
                          "bytes": 10**6 + completed})
            # a healthy queue pair next to it: nothing outstanding
            links.append({"job": "synth", "node": self.node(b), "rank": b,
                          "device": "mlx5_0", "peer_node": self.node(a), "t": t,
                          "posted": 500, "completed": 500, "bytes": 10**6})


# ---------------------------------------------------------------------------------------------
# driving the detector


@dataclass
class Run:
    reports: list[tuple[int, Anomaly]]
    detector: HangDetector
    last_event: int

    @property
    def opened(self) -> list[Anomaly]:
        return [a for _, a in self.reports if a.end_ns is None]

    @property
    def ended(self) -> list[Anomaly]:
        return [a for _, a in self.reports if a.end_ns is not None]


def drive(job: Job, tables: dict[str, pa.Table], config: HangConfig | None = None,
          tail: int = 60 * S, tick: int = 100 * MS, detector: HangDetector | None = None,
          ticks_only_after: bool = False) -> Run:
    """Replay the trace in 100 ms windows (update + on_tick), then keep ticking ``tail``."""
    det = detector or HangDetector(job.meta(), config)
    reports: list[tuple[int, Anomaly]] = []
    now = prev = T0
    for now, batch in replay(tables, window_ns=tick):
        if not ticks_only_after:   # replay skips empty windows: time still passes
            for t in range(prev + tick, now, tick):
                reports += [(t, a) for a in det.on_tick(t)]
        reports += [(now, a) for a in det.update(batch)]
        if not ticks_only_after:
            reports += [(now, a) for a in det.on_tick(now)]
        prev = now
    last = now
    for t in range(last + tick, last + tail, tick):
        reports += [(t, a) for a in det.on_tick(t)]
    return Run(reports, det, last)


def coll_table(job: Job) -> pa.Table:
    return job.run()["coll"]


def step_index(job: Job, kind: str, pred: Any) -> int:
    """Index of the first step of ``kind`` in iteration 0's program matching ``pred``."""
    for k, step in enumerate(job.program(0)):
        if step[0] == kind and pred(step):
            return k
    raise AssertionError("no such step")


# ---------------------------------------------------------------------------------------------
# hand-made tables and step-by-step feeding


TPC = 2**64 - 5


def tp_rows(rank: int, seq: int, t: int, end: int | None = None, **over: Any
            ) -> list[dict[str, Any]]:
    row = {"job": "synth", "rank": rank, "comm": TPC, "comm_rank": rank, "comm_size": 2,
           "seq": seq, "op": "allreduce", "bytes": 1 << 20, "peer": -1, "phase": "enter",
           "t": t, **over}
    return [row] + ([{**row, "phase": "end", "t": end}] if end is not None else [])


def two_rank_meta() -> JobMeta:
    return JobMeta(job="synth", t=T0, world_size=2, tp=2, pp=1, dp=1, cp=1, microbatches=0,
                   schedule="unknown", nodes={0: "n0", 1: "n0"},
                   comms=(Comm(TPC, "tp", (0, 1)),))


def history(rounds: int = 6) -> list[dict[str, Any]]:
    return [row for s in range(rounds) for r in (0, 1)
            for row in tp_rows(r, s, T0 + s * 10 * MS + r, T0 + s * 10 * MS + MS)]


def timeline(tables: dict[str, pa.Table], tick: int = 100 * MS, tail: int = 0
             ) -> list[tuple[int, EventBatch]]:
    """Replay batches with empty batches filled in every ``tick`` (time passing)."""
    out: list[tuple[int, EventBatch]] = []
    prev = None
    for now, batch in replay(tables, window_ns=tick):
        if prev is not None:
            out += [(t, {}) for t in range(prev + tick, now, tick)]
        out.append((now, batch))
        prev = now
    assert prev is not None
    return out + [(t, {}) for t in range(prev + tick, prev + tail, tick)]


def feed(det: HangDetector, steps: list[tuple[int, EventBatch]]) -> list[Anomaly]:
    out: list[Anomaly] = []
    for now, batch in steps:
        if batch:
            out += det.update(batch)
        out += det.on_tick(now)
    return out
