"""Hang detector (detectors/hang.py): CCL-D §4.2 classes H1-H3 and MEGATRACE §III-C halt point,
on small synthetic training programs built here, and end to end on the simulator presets."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.snapshots import roundtrip

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
# healthy traces, pauses and barriers


def test_healthy_trace_with_pause_and_slow_barrier_raises_nothing() -> None:
    job = Job(iterations=14, barrier_every=3, pause={7: 120 * S},
              faults=[Fault("late", 0, 9, len(Job().program(0)), delay=40 * S)])
    # iteration 9's last step is the barrier (barrier_every=3): rank 0 arrives 40 s late,
    # as if it were writing a checkpoint while everybody waits in the barrier
    assert job.program(9)[-1][3] == 4
    tables = job.run()
    run = drive(job, tables, tail=400 * S)
    assert run.reports == []
    # and the slow barrier really was in the trace: 40 s in flight
    coll = events.to_columns(tables["coll"], "coll")
    is_barrier = coll["bytes"] == 4
    assert is_barrier.any()


def test_pause_with_nothing_in_flight_is_not_a_hang() -> None:
    job = Job(iterations=8, pause={4: 200 * S})
    run = drive(job, job.run(), tail=10 * S)
    assert run.reports == []


def test_barrier_excluded_even_when_it_waits_past_the_threshold() -> None:
    """CCL-D §4.2.1: an allreduce of <= 4 bytes (a barrier) never raises a hang."""
    job = Job(iterations=8, barrier_every=1)
    barrier_step = len(job.program(1)) - 1
    job.faults = [Fault("die", 3, 6, barrier_step)]
    run = drive(job, job.run(), tail=120 * S)
    assert run.reports == []
    # the same fault at rank 3's 64 MiB DP allreduce is a hang
    dp_step = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(0, 1)])
    job2 = Job(iterations=8, barrier_every=1, faults=[Fault("die", 3, 6, dp_step)])
    run2 = drive(job2, job2.run(), tail=120 * S)
    assert [a.cause for a in run2.opened] == ["not_entered"]
    assert run2.opened[0].ranks == [3]


# ---------------------------------------------------------------------------------------------
# H1: not entered


def test_not_entered_tp_collective_one_report_with_root_and_halt_point() -> None:
    job = Job(iterations=10)
    k = step_index(job, "coll", lambda s: s[1] == job.tp_comm[(1, 1)] and s[6] == 2)
    job.faults = [Fault("die", job.rank(1, 1, 1), 6, k)]
    run = drive(job, job.run())
    assert len(run.opened) == 1, run.opened
    a = run.opened[0]
    assert (a.kind, a.cause, a.ranks) == ("hang", "not_entered", [job.rank(1, 1, 1)])
    assert a.comm == job.tp_comm[(1, 1)] and a.comm_kind == "tp"
    assert a.stage == "tp_collective"
    hp = a.extra["halt_point"]
    assert hp["op"] == "allreduce" and hp["missing"] == [job.rank(1, 1, 1)]
    assert hp["entered"] == [job.rank(0, 1, 1)]
    # victims in other communicators are listed, not reported
    assert job.rank(1, 1, 1) not in a.extra["victims"]
    assert a.extra["victims_count"] >= 1
    assert a.start_ns is not None and a.detected_ns is not None
    # named once silent for the host-pause allowance (a GC pause looks the same until then)
    latency = a.detected_ns - a.start_ns
    idle = HangConfig().idle_floor_ns
    assert idle - 100 * MS <= latency <= idle + 200 * MS, latency
    # the tensor-parallel halt point placed in the (GPipe) schedule: micro-batch 2's forward
    assert (a.extra["pass"], a.extra["microbatch"]) == ("forward", 2)
    assert "schedule_phase" not in a.extra       # 1F1B phases only


def test_not_entered_without_host_pause_allowance_is_named_at_the_floor() -> None:
    """``idle_floor_ns = floor_ns``: MEGATRACE's bare rule, 2 x T_expected (>= the floor)."""
    job = Job(iterations=10)
    k = step_index(job, "coll", lambda s: s[1] == job.tp_comm[(1, 1)] and s[6] == 2)
    job.faults = [Fault("die", job.rank(1, 1, 1), 6, k)]
    run = drive(job, job.run(), config=HangConfig(idle_floor_ns=S))
    assert [(a.cause, a.ranks) for a in run.opened] == [("not_entered", [job.rank(1, 1, 1)])]
    a = run.opened[0]
    assert a.start_ns is not None and a.detected_ns is not None
    assert S <= a.detected_ns - a.start_ns <= 1.3 * S


def test_late_member_that_then_completes_is_neither_h1_nor_h3() -> None:
    """A member enters a data-parallel round 3 s late (a GC pause) and the round completes
    right away: the wait is shorter than the host-pause allowance (no H1), and the round
    is stuck only from its last entry on (no H3 for the 3 s the others waited)."""
    job = Job(iterations=10, dp=4, tp=1)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(1, 0)])
    job.faults = [Fault("late", job.rank(0, 1, 2), 6, k, delay=3 * S)]
    # 10 ms ticks: the late entry and the round's end (30 ms later) come in different batches
    run = drive(job, job.run(), tail=8 * S, tick=10 * MS)
    assert run.reports == []
    # the same 3 s are a hang without the allowance
    run2 = drive(job, job.run(), config=HangConfig(idle_floor_ns=S), tail=10 * S)
    assert [(a.cause, a.ranks, a.end_ns is None) for _, a in run2.reports] == [
        ("not_entered", [job.rank(0, 1, 2)], True), ("not_entered", [job.rank(0, 1, 2)], False)]


def test_not_entered_pipeline_send_reports_forward_microbatch() -> None:
    job = Job(iterations=10, pp=3)
    # rank (tp 0, stage 0, dp 1) dies right before sending micro-batch 2's activation
    src = job.rank(0, 0, 1)
    k = step_index(job, "p2p", lambda s: s[2] == src and s[8] == 2)
    job.faults = [Fault("die", src, 5, k)]
    run = drive(job, job.run())
    assert len(run.opened) == 1, run.opened
    a = run.opened[0]
    assert (a.cause, a.ranks) == ("not_entered", [src])
    assert a.comm == job.pp_comm[(1, 0)] and a.comm_kind == "pp" and a.stage == "pp_p2p"
    assert a.extra["pass"] == "forward"
    assert a.extra["microbatch"] == 2 and a.extra["iteration_index"] == 5
    hp = a.extra["halt_point"]
    assert hp["op"] == "recv" and hp["sender"] == src and hp["missing"] == [src]


def test_not_entered_backward_pass() -> None:
    job = Job(iterations=10)
    src = job.rank(1, 1, 0)   # last stage sends gradients back to stage 0
    k = step_index(job, "p2p", lambda s: s[2] == src and s[4] == 1 and s[8] == 3)
    job.faults = [Fault("die", src, 4, k)]
    run = drive(job, job.run())
    assert [(a.cause, a.ranks) for a in run.opened] == [("not_entered", [src])]
    assert run.opened[0].extra["pass"] == "backward"
    assert run.opened[0].extra["microbatch"] == 3


def test_detection_happens_on_tick_without_new_events() -> None:
    """MEGATRACE Algorithm 1 line 3: time passing alone raises the hang."""
    job = Job(iterations=10)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(0, 0)])
    job.faults = [Fault("die", job.rank(0, 0, 1), 7, k)]
    tables = job.run()
    det = HangDetector(job.meta())
    last = 0
    for now, batch in replay(tables, window_ns=100 * MS):
        assert det.update(batch) == []
        last = now
    seen: list[tuple[int, Anomaly]] = []
    for t in range(last, last + 20 * S, 50 * MS):
        seen += [(t, a) for a in det.on_tick(t)]
    assert len(seen) == 1
    t, a = seen[0]
    assert a.detected_ns == t and a.ranks == [job.rank(0, 0, 1)]
    assert a.cause == "not_entered" and a.stage == "dp_sync" and a.comm_kind == "dp"
    # not before the threshold: n x expected (the DP allreduce's learned duration), >= floor
    assert a.start_ns is not None and t - a.start_ns >= S


def test_cascade_reports_only_the_root() -> None:
    """Rank dies in the forward pass: its TP peer waits (H1 root), the next stage waits in
    recv, DP peers wait in the gradient allreduce; victims are not roots (CCL-D §4.2.2)."""
    job = Job(iterations=10, tp=2, pp=3, dp=2)
    root = job.rank(0, 1, 0)
    k = step_index(job, "coll", lambda s: s[1] == job.tp_comm[(1, 0)] and s[6] == 1)
    job.faults = [Fault("die", root, 6, k)]
    run = drive(job, job.run(), tail=120 * S)
    assert len(run.opened) == 1, [(a.cause, a.ranks, a.comm_kind) for a in run.opened]
    a = run.opened[0]
    assert a.ranks == [root]
    # every other rank ends up waiting, directly or through others, on the root
    blocked = set(run.detector.flight.fl["rank"].tolist())
    assert len(blocked) == job.world - 1
    assert (run.detector.flight.fl["hang"] >= 0).all()
    assert root not in a.extra["victims"]


def test_silent_rank_detected_before_a_long_op_threshold() -> None:
    """A rank goes quiet while a peer waits on it: found from the silence (MEGATRACE's
    heartbeat) even when the waiting operation's own threshold is long."""
    job = Job(iterations=14)
    cfg = HangConfig(floor_ns=30 * S, silence_floor_ns=S, silence_min_gaps=20, idle_floor_ns=S)
    k = step_index(job, "coll", lambda s: s[1] == job.tp_comm[(0, 1)] and s[6] == 0)
    job.faults = [Fault("die", job.rank(1, 0, 1), 9, k)]
    run = drive(job, job.run(), config=cfg, tail=60 * S)
    assert len(run.opened) == 1
    a = run.opened[0]
    assert a.ranks == [job.rank(1, 0, 1)] and a.cause == "not_entered"
    assert a.detected_ns is not None and a.start_ns is not None
    assert a.detected_ns - a.start_ns < 5 * S     # the op threshold alone would be 30 s


def test_hang_that_resolves_is_reported_again_with_end() -> None:
    job = Job(iterations=10)
    k = step_index(job, "coll", lambda s: s[1] == job.tp_comm[(0, 0)] and s[6] == 1)
    job.faults = [Fault("late", job.rank(1, 0, 0), 5, k, delay=8 * S)]
    run = drive(job, job.run())
    assert len(run.opened) == 1 and len(run.ended) == 1
    opened, ended = run.opened[0], run.ended[0]
    assert opened.id == ended.id and opened.ranks == [job.rank(1, 0, 0)]
    assert ended.end_ns is not None and opened.start_ns is not None
    assert 8 * S <= ended.end_ns - opened.start_ns <= 9 * S


# ---------------------------------------------------------------------------------------------
# H2: inconsistent


def test_inconsistent_bytes_minority_is_root() -> None:
    job = Job(iterations=8, dp=4, tp=1)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(1, 0)])
    bad = job.rank(0, 1, 2)
    job.faults = [Fault("bytes", bad, 5, k, nbytes=32 << 20)]
    run = drive(job, job.run())
    assert len(run.opened) == 1
    a = run.opened[0]
    assert (a.cause, a.ranks, a.comm_kind, a.stage) == ("inconsistent", [bad], "dp", "dp_sync")
    assert a.extra["deviating"] == {str(bad): {"op": "allreduce", "bytes": 32 << 20}}


def test_inconsistent_op_on_two_rank_comm_uses_history_to_break_the_tie() -> None:
    job = Job(iterations=8)
    bad = job.rank(1, 0, 1)
    k = step_index(job, "coll", lambda s: s[1] == job.tp_comm[(0, 1)] and s[6] == 3)
    job.faults = [Fault("op", bad, 4, k)]
    run = drive(job, job.run())
    assert [(a.cause, a.ranks) for a in run.opened] == [("inconsistent", [bad])]


def test_inconsistent_deviant_completes_and_is_the_root() -> None:
    """CCL-D: all entered, some ranks did not hang: the non-hang ranks are the root."""
    job = Job(iterations=8, dp=4, tp=1)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(0, 0)])
    bad = job.rank(0, 0, 3)
    job.faults = [Fault("deviant_done", bad, 5, k, nbytes=64 << 20)]
    run = drive(job, job.run())
    assert [(a.cause, a.ranks) for a in run.opened] == [("inconsistent", [bad])]
    assert run.opened[0].extra["completed_round"] == [bad]


# ---------------------------------------------------------------------------------------------
# H3: hardware


def test_hardware_fewest_steps_is_root() -> None:
    job = Job(iterations=8, dp=4, tp=1)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(1, 0)])
    bad = job.rank(0, 1, 1)
    job.faults = [Fault("stall", bad, 5, k)]
    run = drive(job, job.run())
    assert len(run.opened) == 1
    a = run.opened[0]
    assert (a.cause, a.ranks, a.link) == ("hardware", [bad], None)
    assert a.extra["steps"][str(bad)] < a.extra["steps"][str(job.rank(0, 1, 0))]


def test_hardware_broken_link_reports_its_two_ends() -> None:
    job = Job(iterations=8, dp=4, tp=1)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(0, 0)])
    a_end, b_end = job.rank(0, 0, 1), job.rank(0, 0, 2)
    assert job.node(a_end) != job.node(b_end)
    job.faults = [Fault("stall", a_end, 5, k, link_peer=b_end)]
    run = drive(job, job.run())
    assert len(run.opened) == 1
    a = run.opened[0]
    assert a.cause == "hardware" and a.link == [a_end, b_end] and a.ranks == [a_end]


def test_hardware_waits_for_slow_link_samples_before_reporting() -> None:
    """Queue pairs sampled every 1.5 s: the stuck round is reported once the work-request
    evidence arrives (MEGATRACE §III-C step 2), not without the link at the first second."""
    job = Job(iterations=8, dp=4, tp=1)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(0, 0)])
    a_end, b_end = job.rank(0, 0, 1), job.rank(0, 0, 2)
    job.faults = [Fault("stall", a_end, 5, k, link_peer=b_end, link_every=15)]
    run = drive(job, job.run())
    assert len(run.opened) == 1
    a = run.opened[0]
    assert a.link == [a_end, b_end] and a.ranks == [a_end]
    assert a.detected_ns is not None and a.start_ns is not None
    assert 1.4 * S < a.detected_ns - a.start_ns < 2.5 * S
    # without link telemetry the same hang is reported at the threshold, link unknown
    tables = job.run()
    tables.pop("link")
    b = drive(job, tables).opened[0]
    assert b.link is None and b.detected_ns is not None and b.start_ns is not None
    assert b.detected_ns - b.start_ns < 1.3 * S


def test_hardware_without_progress_reports_all_stuck_members() -> None:
    job = Job(iterations=8, dp=2, tp=1)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(0, 0)])
    job.faults = [Fault("stall", job.rank(0, 0, 0), 5, k)]
    tables = job.run()
    tables.pop("progress")
    run = drive(job, tables)
    assert [(a.cause, a.ranks) for a in run.opened] == [
        ("hardware", sorted([job.rank(0, 0, 0), job.rank(0, 0, 1)]))]


# ---------------------------------------------------------------------------------------------
# queued operations and devices that stop completing (hand-made tables)

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


def test_operations_queued_behind_a_stuck_one_are_not_separate_hangs() -> None:
    """Ranks enqueue more collectives on the communicator behind a stuck one (they run in
    call order on its stream): one hang, at the first round missing its completion."""
    t = T0 + S
    # rounds 6 and 7 are issued within one batch window (0.5 ms), 8 and 9 later
    offset = {6: 0, 7: MS // 2, 8: 5 * MS, 9: 7 * MS}
    rows = history() + [row for s in (6, 7, 8, 9) for r in (0, 1)
                        for row in tp_rows(r, s, t + offset[s] + r)]
    prog = [{"job": "synth", "rank": r, "comm": TPC, "seq": 6, "t": t + k * 50 * MS,
             "send_count": min(k, 4) * (2 if r == 1 else 5), "recv_count": 0}
            for k in range(40) for r in (0, 1)]
    det = HangDetector(two_rank_meta())
    out = det.update({"coll": events.from_rows("coll", rows),
                      "progress": events.from_rows("progress", prog)})
    for k in range(40):
        out += det.on_tick(t + k * 100 * MS)
    assert [(a.cause, a.ranks, a.extra["halt_point"]["seq"]) for a in out] == [
        ("hardware", [1], 6)]
    assert out[0].stage == "tp_collective" and out[0].comm == TPC


def test_unseen_communicator_borrows_the_expectation_of_its_peers() -> None:
    """A communicator whose operation never completed yet borrows T_expected from
    communicators of the same size (same parallel dimension) instead of the ceiling."""
    other = 2**64 - 9
    meta = JobMeta(job="synth", t=T0, world_size=4, tp=2, pp=1, dp=2, cp=1, microbatches=0,
                   schedule="unknown", nodes={r: "n0" for r in range(4)},
                   comms=(Comm(TPC, "tp", (0, 1)), Comm(other, "tp", (2, 3))))
    t = T0 + S
    rows = history() + [{**tp_rows(2, 0, t)[0], "comm": other, "rank": 2, "comm_rank": 0}]
    det = HangDetector(meta, HangConfig(idle_floor_ns=S))
    out = det.update({"coll": events.from_rows("coll", rows)})
    for k in range(30):
        out += det.on_tick(t + k * 100 * MS)
    assert [(a.cause, a.ranks, a.comm) for a in out] == [("not_entered", [3], other)]
    assert out[0].detected_ns is not None and out[0].detected_ns - t <= 1.2 * S


def test_member_whose_work_stops_completing_is_the_root() -> None:
    """Rank 1 holds rounds 6-8 in flight that rank 0 completed (so rank 1 took part) and
    never issues round 9: rank 1's device stopped completing work (H3), as in the Flight
    Recorder dumps of a GPU error. Not H2: a deviant that completes cannot pass the next
    round."""
    t = T0 + S
    rows = history()
    for s in (6, 7, 8):
        rows += tp_rows(1, s, t + (s - 6) * MS + 1)
        rows += tp_rows(0, s, t + (s - 6) * MS, t + (s - 6) * MS + 500_000)
    rows += tp_rows(0, 9, t + 5 * MS)
    det = HangDetector(two_rank_meta())
    out = det.update({"coll": events.from_rows("coll", rows)})
    for k in range(40):
        out += det.on_tick(t + k * 100 * MS)
    assert [(a.cause, a.ranks) for a in out] == [("hardware", [1])]
    assert out[0].extra["stopped_completing"] == [1]


def test_flight_recorder_gpu_error_dumps_name_ranks_12_and_14(tmp_path: Path) -> None:
    """Real PyTorch NCCL Flight Recorder dumps (shared/data, NVIDIA nvidia-resiliency-ext):
    GPU errors injected on ranks 12 and 14 of a 16-rank Megatron MoE job. Only incomplete
    operations are in the dumps (no history: thresholds are the ceiling)."""
    fr = pytest.importorskip("failslow.collectors.importers.flight_recorder")
    from conftest import SHARED
    from failslow.tracedir import TraceDir

    fr.import_dumps(SHARED / "data" / "flight-recorder" / "gpu_error_1st").write(tmp_path / "t")
    td = TraceDir(tmp_path / "t")
    coll = td.read("coll")
    det = HangDetector(td.meta())
    out = det.update({"coll": coll})
    last = int(np.max(events.to_columns(coll, "coll")["t"]))
    assert det.on_tick(last + HangConfig().ceiling_ns - S) == []
    out += det.on_tick(last + HangConfig().ceiling_ns + S)
    assert sorted(r for a in out for r in a.ranks) == [12, 14]
    assert {a.cause for a in out} == {"hardware"}


# ---------------------------------------------------------------------------------------------
# state, inference, ordering


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


def test_snapshot_restore_resumes_without_rereporting() -> None:
    job = Job(iterations=10)
    k = step_index(job, "coll", lambda s: s[1] == job.tp_comm[(1, 0)] and s[6] == 0)
    job.faults = [Fault("late", job.rank(0, 1, 0), 6, k, delay=6 * S)]
    steps = timeline(job.run())
    ref_reports = feed(HangDetector(job.meta()), steps)
    assert [a.end_ns is None for a in ref_reports] == [True, False]
    detected = ref_reports[0].detected_ns
    assert detected is not None
    opened_at = next(i for i, (now, _) in enumerate(steps) if now >= detected)
    for cut in (len(steps) // 3, opened_at + 2):
        det = HangDetector(job.meta())
        got = feed(det, steps[:cut])
        state = roundtrip(det.snapshot())
        det2 = HangDetector(job.meta())
        det2.restore(state)
        got += feed(det2, steps[cut:])
        assert [a.to_dict() for a in got] == [a.to_dict() for a in ref_reports]


def test_comm_kinds_inferred_without_meta_comms() -> None:
    job = Job(iterations=8, meta_comms=False)
    k = step_index(job, "coll", lambda s: s[1] == job.dp_comm[(1, 1)])
    job.faults = [Fault("die", job.rank(1, 1, 0), 5, k)]
    run = drive(job, job.run())
    assert len(run.opened) == 1
    a = run.opened[0]
    assert (a.ranks, a.comm_kind, a.stage) == ([job.rank(1, 1, 0)], "dp", "dp_sync")
    kinds = {run.detector.comm_kind(run.detector.comms.ids[c]) for c in job.tp_comm.values()}
    assert kinds == {"tp"}
    kinds = {run.detector.comm_kind(run.detector.comms.ids[c]) for c in job.pp_comm.values()}
    assert kinds == {"pp"}


def test_end_before_enter_in_a_later_batch_is_matched() -> None:
    """Rows of a kind may come in any order: an end seen before its enter is kept and
    matched, so the operation is not left in flight (no false hang)."""
    job = Job(iterations=6)
    coll = job.run()["coll"]
    cols = events.to_columns(coll, "coll")
    ends = np.flatnonzero(cols["phase"] == events.END)
    enters = np.flatnonzero(cols["phase"] == events.ENTER)
    det = HangDetector(job.meta())
    det.update({"coll": coll.take(pa.array(ends))})
    det.update({"coll": coll.take(pa.array(enters))})
    assert len(det.flight.fl["t"]) == 0
    assert det.on_tick(int(cols["t"].max()) + 600 * S) == []


def test_unknown_op_history_waits_for_the_ceiling() -> None:
    """No completed history: the threshold is the ceiling (CCL-D's 5 minutes)."""
    job = Job(iterations=1)
    coll = job.run()["coll"]
    cols = events.to_columns(coll, "coll")
    first = coll.take(pa.array(np.flatnonzero(cols["phase"] == events.ENTER)[:1]))
    det = HangDetector(job.meta(), HangConfig(ceiling_ns=60 * S))
    det.update({"coll": first})
    t0 = int(cols["t"].min())
    assert det.on_tick(t0 + 59 * S) == []
    assert len(det.on_tick(t0 + 61 * S)) == 1


def test_memory_bounded_to_in_flight_ops() -> None:
    job = Job(iterations=30)
    run = drive(job, job.run(), tail=S)
    det = run.detector
    assert len(det.flight.fl["t"]) == 0
    assert det.durations.dur.shape[1] == HangConfig().history
    assert len(det.durations.dur) <= len(job.comms()) * 2


# ---------------------------------------------------------------------------------------------
# end to end on the simulator presets


PRESETS = ("hang-not-entered", "hang-inconsistent", "hang-hardware")


def _analyze(path: Path, tick: int = 100 * MS) -> list[Anomaly]:
    """Read a trace directory and replay it through the detector, ticking through gaps."""
    from failslow.tracedir import TraceDir

    td = TraceDir(path)
    tables = {k: td.read(k) for k in td.kinds if k in ("coll", "progress", "link")}
    return feed(HangDetector(td.meta()), timeline(tables, tick))


def _simulated(scenario: Any, out: Path, seed: int = 0) -> tuple[list[Anomaly], list[Any]]:
    from failslow import simulator as sim

    result = sim.simulate(scenario, seed=seed)
    sim.write_sim(result, out, "parquet")
    found = _analyze(out)
    truth = json.loads((out / "truth.json").read_text())
    return found, [a for a in truth["anomalies"] if a["kind"] == "hang"]


def _assert_matches(found: list[Anomaly], hangs: list[dict[str, Any]]) -> float:
    """Exactly one report per true hang with its cause, root rank, link, communicator and
    stage; returns the detection latency in seconds after the true start."""
    opened = [a for a in found if a.end_ns is None]
    assert len(hangs) == 1 and len(opened) == 1, [a.to_dict() for a in opened]
    want, got = hangs[0], opened[0]
    assert (got.cause, got.ranks) == (want["cause"], want["ranks"])
    assert sorted(got.link or []) == sorted(want.get("link") or [])
    assert (got.comm, got.comm_kind, got.stage) == (want["comm"], want["comm_kind"],
                                                     want["stage"])
    assert got.detected_ns is not None and got.start_ns is not None
    assert abs(got.start_ns - want["start_ns"]) < 100 * MS
    return (got.detected_ns - want["start_ns"]) / S


@pytest.mark.parametrize("preset", PRESETS)
def test_simulator_hang_presets(preset: str, tmp_path: Path) -> None:
    found, hangs = _simulated(preset, tmp_path / preset)
    latency = _assert_matches(found, hangs)
    # floor 1 s + 100 ms ticks; a member that never entered: the host-pause allowance
    low = HangConfig().idle_floor_ns / S if preset == "hang-not-entered" else 0.5
    assert low - 0.1 < latency < low + 1.0


@pytest.mark.parametrize("fault", [
    {"cause": "not_entered", "ranks": [21], "comm": "pp", "phase": "forward", "microbatch": 5},
    {"cause": "not_entered", "ranks": [42], "comm": "pp", "phase": "backward", "microbatch": 1},
    {"cause": "not_entered", "ranks": [63], "comm": "dp", "op": "allgather"},
    {"cause": "inconsistent", "ranks": [5], "comm": "tp", "mismatch": "op", "microbatch": 4},
    {"cause": "hardware", "ranks": [42], "comm": "tp", "phase": "backward", "microbatch": 6},
    {"cause": "hardware", "ranks": [63], "comm": "pp", "phase": "forward", "microbatch": 3},
])
def test_simulator_hang_variants(fault: dict[str, Any], tmp_path: Path) -> None:
    """Other communicators, passes and ranks than the presets; pipeline halts name the pass
    and micro-batch (MEGATRACE §III-C "which stage")."""
    from failslow import simulator as sim

    sc = sim.scenario_from_dict({"preset": "healthy", "iterations": 14,
                                 "faults": [{"start": 8, **fault}]})
    found, hangs = _simulated(sc, tmp_path / "t", seed=3)
    _assert_matches(found, hangs)
    if fault["comm"] == "pp":
        got = next(a for a in found if a.end_ns is None)
        assert (got.extra["pass"], got.extra["microbatch"]) == (fault["phase"],
                                                                fault["microbatch"])


@pytest.mark.parametrize("shape,fault", [
    # H2 between two members calling each other's operation: the sibling data-parallel
    # group (other context-parallel index) shows which one was due
    ((1, 1, 2, 2, 4, "1f1b"), {"cause": "inconsistent", "ranks": [0], "comm": "dp",
                               "op": "reducescatter", "mismatch": "op"}),
    # ... and with no sibling (one context-parallel group per stage): the operation the pair
    # called one iteration earlier at that point of the schedule
    ((1, 4, 1, 2, 8, "gpipe"), {"cause": "inconsistent", "ranks": [1], "comm": "cp",
                                "phase": "backward", "microbatch": 2, "mismatch": "op"}),
    # a tensor-parallel halt in the last stage, whose 1F1B gaps hold a forward and a
    # backward: the second all-reduce of micro-batch 2's backward
    ((2, 4, 2, 1, 8, "1f1b"), {"cause": "hardware", "ranks": [13], "comm": "tp",
                               "phase": "backward", "microbatch": 2, "index": 1}),
    # no data parallelism: the first forward follows the previous iteration's cool-down
    ((2, 4, 1, 1, 4, "1f1b"), {"cause": "inconsistent", "ranks": [0], "comm": "tp",
                               "phase": "forward", "microbatch": 0}),
    # a data-parallel round entered by replicas an iteration ahead is not the halt point
    # of a root whose tensor-parallel peer waits in its cool-down backward
    ((4, 3, 4, 1, 2, "1f1b"), {"cause": "not_entered", "ranks": [8], "comm": "tp",
                               "phase": "backward", "microbatch": 1, "index": 1}),
])
def test_simulator_hang_shapes(shape: tuple[int, int, int, int, int, str],
                               fault: dict[str, Any]) -> None:
    """Small shapes that exercise the tie-breaks of H2 and the placement of halt points in
    the schedule (pass, micro-batch, 1F1B phase: MEGATRACE §III-C step 3)."""
    from failslow.bench.accuracy_hang import Case, Shape, run_case, schedule_phase

    tp, pp, dp, cp, mb, sched = shape
    sh = Shape("t", tp, pp, dp, cp, mb, sched)
    expect: dict[str, Any] = {"op": fault["op"]} if fault["comm"] == "dp" else {
        "pass": fault["phase"], "microbatch": fault["microbatch"],
        "schedule_phase": schedule_phase(sh, fault["ranks"][0] // (tp * cp * dp),
                                         fault["phase"], fault["microbatch"])}
    spec = {"job": "shape", "parallel": {"tp": tp, "pp": pp, "dp": dp, "cp": cp},
            "microbatches": mb, "schedule": sched, "iterations": 6,
            "sampling": {"gpu_ms": 0.0, "hang_tail_s": 12.0},
            "faults": [{"start": 3, **fault}]}
    res = run_case(Case("t", "hang", sh, spec, seed=7, cause=fault["cause"], expect=expect))
    assert len(res.reports) == 1 and all(res.checks.values()), (
        res.checks, [a.to_dict() for a in res.reports])


def test_stage_program_is_megatrons_schedule() -> None:
    """The detector's own rebuild of the 1F1B / GPipe stage programs (MEGATRACE §III-C)
    agrees with the simulator's (both after Megatron-LM's non-interleaved schedules)."""
    from failslow.detectors.hang import stage_program
    from failslow.simulator.schedule import BWD, DPSYNC, FWD, P2P, build_program

    for sched in ("1f1b", "gpipe"):
        for pp in (1, 2, 3, 4, 8):
            for mb in (1, 2, 3, 8):
                for stage in range(pp):
                    theirs: list[tuple[str, Any]] = []
                    for st in build_program(sched, stage, pp, mb):
                        if st.kind in (FWD, BWD):
                            theirs.append(("F" if st.kind == FWD else "B", st.mb))
                        elif st.kind == DPSYNC:
                            theirs.append(("D", st.dp_op))
                        elif st.kind == P2P:
                            theirs.append(("P", tuple((o.send, o.grad, o.mb) for o in st.ops)))
                    assert stage_program(sched, stage, pp, mb) == theirs, (sched, pp, mb, stage)


@pytest.mark.parametrize("preset", ["healthy", "link", "gpipe"])
def test_simulator_slow_or_healthy_presets_raise_no_hang(preset: str, tmp_path: Path) -> None:
    found, hangs = _simulated(preset, tmp_path / preset)
    assert hangs == [] and found == []


def test_bench_hang_figures() -> None:
    """``failslow bench hang``: ours within ~1 s of the hang start on every preset, the
    fixed 5-minute threshold (CCL-D's setting, the baseline) after 300 s."""
    import argparse

    from failslow.bench.hang import BENCHMARKS

    figures = BENCHMARKS["hang"](argparse.Namespace(scale=1 / 32, json=True))
    for key in ("not_entered", "inconsistent", "hardware"):
        assert figures[f"{key}_correct"] is True
        low = HangConfig().idle_floor_ns / S if key == "not_entered" else 0.5
        assert low - 0.1 < figures[f"{key}_latency_s"] < low + 1.0
        assert 299.0 < figures[f"{key}_baseline_5min_latency_s"] < 302.0
    assert figures["large_correct"] is True and figures["large_ranks"] == 128
    json.dumps(figures)


# ---------------------------------------------------------------------------------------------
# the vectorised building blocks give what the plain sorts give (issue 3 item 10: speed
# without a change of behaviour)


def _reference_match(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> np.ndarray:
    first: dict[tuple[int, ...], int] = {}
    for i, key in enumerate(zip(*(x.tolist() for x in a), strict=True)):
        first.setdefault(key, i)
    return np.array([first.get(key, -1) for key in zip(*(x.tolist() for x in b), strict=True)],
                    dtype=np.int64)


@pytest.mark.parametrize("seq_top", [50, 2**40, 2**62])
def test_match_is_the_first_equal_key_packed_or_not(seq_top: int) -> None:
    from failslow.detectors.hang.tables import _match

    rng = np.random.default_rng(seq_top % 1000)
    n = 3000
    a = (rng.integers(0, 40, n), rng.integers(0, 4096, n), rng.integers(0, seq_top, n))
    # repeated keys in a (the first one counts) and keys of b both inside and outside a
    a = tuple(np.concatenate([x, x[:200]]) for x in a)
    pick = rng.integers(0, n, 2000)
    b = tuple(np.concatenate([x[pick], rng.integers(0, 40, 500) + 41 * (j == 0)])
              for j, x in enumerate(a))
    got = _match(a, b)
    assert (got == _reference_match(a, b)).all()
    assert (got[:2000] >= 0).all() and (got[2000:] == -1).all()
    unique = tuple(x[:n] for x in a)
    if len(set(zip(*(x.tolist() for x in unique), strict=True))) == n:
        assert (_match(unique, b) == _reference_match(unique, b)).all()


def test_rank_time_and_group_orders_equal_lexsort() -> None:
    from failslow.detectors.hang.tables import _group_order, _rank_time_order

    rng = np.random.default_rng(3)
    for top in (100, 70_000):
        rank = rng.integers(0, top, 5000)
        t = np.sort(rng.integers(0, 2000, 5000))          # time order, with ties
        seq = rng.integers(0, 5, 5000)                     # ties in (rank, t) out of order
        assert (_rank_time_order(rank, t) == np.lexsort((t, rank))).all()
        assert (_rank_time_order(rank, t, seq) == np.lexsort((seq, t, rank))).all()
        shuffled = rng.permutation(t)                      # not in time order
        assert (_rank_time_order(rank, shuffled, seq)
                == np.lexsort((seq, shuffled, rank))).all()
        grow = np.arange(5000)                             # seq rising within each key
        for key in (rank, rank.astype(np.int64) << 40):
            assert (_group_order(key, grow) == np.lexsort((grow, key))).all()
            assert (_group_order(key, seq) == np.lexsort((seq, key))).all()
            order = _group_order(key, seq, any_order=True)
            k, s = key[order], seq[order]
            # grouped: each key one run, seq non-decreasing inside it
            runs = np.flatnonzero(np.diff(k) != 0)
            assert len(runs) + 1 == len(np.unique(key))
            assert not ((k[1:] == k[:-1]) & (s[1:] < s[:-1])).any()


def test_snapshot_ring_is_compressed_and_old_snapshots_restore() -> None:
    job = Job(iterations=4)
    steps = timeline(job.run())
    det = HangDetector(job.meta())
    feed(det, steps[: len(steps) // 2])
    state = roundtrip(det.snapshot())
    assert "ring_z" in state["ranks"] and "ring" not in state["ranks"]
    old = roundtrip(state)
    old["ranks"].pop("ring_z")
    from failslow.detectors.hang.state import _pack

    old["ranks"]["ring"] = _pack(det.ranks.ring)
    for s in (state, old):
        det2 = HangDetector(job.meta())
        det2.restore(s)
        assert (det2.ranks.ring == det.ranks.ring).all()
        for r in range(job.meta().world_size):
            a, b = det.recent_ops(r), det2.recent_ops(r)
            assert all((a[c] == b[c]).all() for c in a)


def test_signature_book_counted_per_batch_equals_counting_into_the_dict() -> None:
    """The per-batch signature counts merged later (CCL-D §4.2.2 tie-break history) give the
    same book, in the same order, as counting each batch straight into it, also when the
    book overflows ``4 x max_signatures`` and keeps the most frequent."""
    rng = np.random.default_rng(5)
    for max_sig in (10_000, 6):
        lazy = HangDetector(two_rank_meta(), HangConfig(max_signatures=max_sig))
        eager = HangDetector(two_rank_meta(), HangConfig(max_signatures=max_sig))
        for k in range(150):
            n = int(rng.integers(1, 40))
            ci = rng.integers(0, 12, n).astype(np.int64)
            op = rng.integers(0, 4, n).astype(np.int64)
            nbytes = rng.choice([4, 1 << 20, 3 << 20, 1 << 40], n).astype(np.int64)
            if k == 70:                      # a size that does not pack: counted at once
                nbytes[0] = 1 << 50
            lazy.signatures.count(ci, op, nbytes)
            eager.signatures.count_now(ci, op, nbytes)
            if k % 37 == 0:
                assert list(lazy.signatures.book.items()) == list(eager.signatures.book.items())
        assert list(lazy.signatures.book.items()) == list(eager.signatures.book.items())
        if max_sig == 6:
            assert len(eager.signatures.book) <= 4 * max_sig


def test_ends_in_the_batch_of_their_enters_with_duplicates_and_orphans() -> None:
    """An end is matched with the operation in flight before the batch first, then with
    the batch's own enters; a duplicate enter of an operation in flight is ignored, a
    duplicate end completes once (its latest time), and an end whose enter comes later
    waits for it. Nothing is left in flight, and the learned durations are the latest end
    less the first enter."""
    t = T0 + S
    first = tp_rows(0, 0, t) + tp_rows(1, 0, t + 1)             # in flight before
    second = (tp_rows(0, 0, t + 5) + tp_rows(1, 1, t + 10, t + 4 * MS)   # dup enter, same batch
              + [{**tp_rows(0, 0, 0, t + 2 * MS)[1]}, {**tp_rows(0, 0, 0, t + 3 * MS)[1]},
                 {**tp_rows(1, 0, 0, t + 3 * MS)[1]},
                 {**tp_rows(0, 1, 0, t + 6 * MS)[1]}])           # end before its enter
    third = tp_rows(0, 1, t + 4 * MS)
    det = HangDetector(two_rank_meta())
    det.update({"coll": events.from_rows("coll", first)})
    det.update({"coll": events.from_rows("coll", second)})
    assert len(det.flight.fl["t"]) == 0
    assert det.flight.orphans["seq"].tolist() == [1]
    det.update({"coll": events.from_rows("coll", third)})
    assert len(det.flight.fl["t"]) == 0 and len(det.flight.orphans["t"]) == 0
    assert int(det.durations.tail.max()) == 4 * MS - 10   # rank 1 seq 1: enter t+10, end t+4ms
    row = det.durations.stat_row[det.comms.ids[TPC]].max()
    durations = sorted(d for d in det.durations.dur[row].tolist() if d >= 0)
    assert durations == [6 * MS - 4 * MS, 3 * MS - 1, 3 * MS, 4 * MS - 10]
