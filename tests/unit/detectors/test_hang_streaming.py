"""Hang detection in simulated real time (issue 4: "detection within 2 x the expected duration
of the stuck operation plus one tick, tested by streaming a hung job in simulated real time
with an injected clock").

A simulated job is published tick by tick on the in-process transport: every record goes out
once the fake clock passes its event time (plus its rank's delivery lag, for a slow
collector), and the stream processor, whose clock is the fake clock, runs the job's
analyzer (:class:`~failslow.engine.analyzer.JobAnalyzer`, as in production) after each tick.
The hang must be reported no later than one tick after the stuck operation crossed its
threshold ``clamp(2 x T_expected, floor, ceiling)`` (MEGATRACE §III-C Algorithm 1: ``n = 2``;
CCL-D §4.2.1's 5 minutes as the ceiling), and not before; a member that never entered is
named only after the host-pause allowance (``idle_floor_ns``) of silence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from failslow import events
from failslow.bench.accuracy_hang import inject_checkpoint
from failslow.detectors.hang import HangConfig, HangDetector
from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import JobAnalyzer, JobConfig
from failslow.events import JobMeta
from failslow.simulator import scenario_from_dict, simulate
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.transport import InProcessTransport, topic_for

S = 1_000_000_000
MS = 1_000_000
TICK = 100 * MS
KINDS = ("coll", "progress", "link")


def _job(faults: list[dict[str, Any]], iterations: int = 10, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"job": "stream-hang", "parallel": {"tp": 2, "pp": 2, "dp": 4, "cp": 1},
                         "microbatches": 4, "iterations": iterations,
                         "sampling": {"gpu_ms": 0.0, "hang_tail_s": 12.0}, "faults": faults}
    d.update(over)
    return d


@dataclass
class Streamed:
    meta: JobMeta
    tables: dict[str, pa.Table]
    hangs: list[Anomaly]            # every hang report seen, in order
    analyzer: JobAnalyzer
    truth: list[Anomaly]
    ticks: int


def stream(spec: dict[str, Any], seed: int = 0, config: HangConfig | None = None,
           lag: dict[int, float] | None = None,
           checkpoints: tuple[tuple[int, float, str | None], ...] = (),
           tail: int = 2 * S) -> Streamed:
    """Publish the simulated job in real time (one message per kind per tick) and run the
    stream processor with a fake clock; return every hang report."""
    sim = simulate(scenario_from_dict(spec, "stream"), seed=seed)
    tables = {k: sim.tables[k] for k in KINDS if k in sim.kinds}
    meta = sim.meta
    for it, pause, comm in sorted(checkpoints, reverse=True):
        tables, meta = inject_checkpoint(tables, sim.tables["span"], meta, it, pause, comm)
    lag_ns = np.zeros(meta.world_size, dtype=np.int64)
    for r, s in (lag or {}).items():
        lag_ns[r] = int(s * S)
    arrivals: dict[str, tuple[pa.Table, np.ndarray]] = {}
    for kind, table in tables.items():
        if not table.num_rows:
            continue
        t = table.column("t").to_numpy().astype(np.int64)
        rank = pc.fill_null(table.column("rank"), 0).to_numpy().astype(np.int64)
        arr = t + lag_ns[rank]
        order = np.argsort(arr, kind="stable")
        arrivals[kind] = (table.take(pa.array(order)), arr[order])
    start = min(int(a[0]) for _, a in arrivals.values())
    end = max(int(a[-1]) for _, a in arrivals.values()) + tail
    clock = {"now": start}
    made: list[JobAnalyzer] = []

    def factory(m: JobMeta) -> JobAnalyzer:
        made.append(JobAnalyzer(m, JobConfig(hang=config)))
        return made[-1]

    bus = InProcessTransport()
    bus.publish_meta(meta)
    proc = StreamProcessor(bus, None, ProcessorConfig(clock=lambda: clock["now"],
                                                      store_events=False),
                           analyzer_factory=factory)
    sent = dict.fromkeys(arrivals, 0)
    hangs: list[Anomaly] = []
    seen: set[tuple[str, int | None]] = set()
    ticks = 0
    for now in range(start + TICK, end + TICK, TICK):
        clock["now"] = now
        for kind, (table, arr) in arrivals.items():
            upto = int(np.searchsorted(arr, now, side="right"))
            if upto > sent[kind]:
                bus.publish(topic_for(kind), meta.job, table.slice(sent[kind], upto - sent[kind]))
                sent[kind] = upto
        proc.step()
        ticks += 1
        for a in proc.anomalies(meta.job):
            if a.kind == "hang" and (a.id, a.end_ns) not in seen:
                seen.add((a.id, a.end_ns))
                hangs.append(a)
    truth = [a for a in sim.truth.anomalies if a.kind == "hang"]
    return Streamed(meta, tables, hangs, made[0], truth, ticks)


def _round(coll: pa.Table, comm: int, seq: int) -> dict[str, np.ndarray]:
    cols = events.to_columns(coll, "coll")
    sel = (cols["comm"] == np.uint64(comm)) & (cols["seq"] == np.uint64(seq))
    return {k: v[sel] for k, v in cols.items() if k in ("rank", "phase", "t")}


def _last_record(coll: pa.Table, rank: int) -> int:
    cols = events.to_columns(coll, "coll")
    return int(cols["t"][cols["rank"] == rank].max())


def _detector(st: Streamed) -> HangDetector:
    return st.analyzer.hang


# ---------------------------------------------------------------------------------------------
# the bound


BOUND_CASES = {
    # H1 at a tensor-parallel all-reduce of the warm-up forward
    "not_entered": {"cause": "not_entered", "ranks": [5], "start": 5, "comm": "tp",
                    "phase": "forward", "microbatch": 0},
    # H2 at the grads-sync reduce-scatter (half the bytes on one rank)
    "inconsistent": {"cause": "inconsistent", "ranks": [9], "start": 5, "comm": "dp",
                     "op": "reducescatter"},
    # H3 at the grads-sync reduce-scatter
    "hardware": {"cause": "hardware", "ranks": [2], "start": 5, "comm": "dp",
                 "op": "reducescatter"},
}


@pytest.mark.parametrize("cause", list(BOUND_CASES))
def test_detected_within_2x_expected_plus_one_tick(cause: str) -> None:
    """The gradient buffers are large and the data-parallel rings cross nodes (a grads-sync
    takes ~0.8 s), so 2 x T_expected, not the
    1 s floor, sets the threshold of the data-parallel hangs; the host-pause allowance is
    set to the floor, which leaves MEGATRACE's bare rule."""
    cfg = HangConfig(idle_floor_ns=HangConfig().floor_ns)
    st = stream(_job([BOUND_CASES[cause]], timing={"dp_bytes": 24 << 30}, gpus_per_node=4),
                config=cfg)
    assert len(st.truth) == 1 and len(st.hangs) == 1, [a.to_dict() for a in st.hangs]
    got, want = st.hangs[0], st.truth[0]
    assert (got.cause, got.ranks, got.comm) == (want.cause, want.ranks, want.comm)
    hp = got.extra["halt_point"]
    t_exp, thr = _detector(st).expected_ns(hp["comm"], hp["op"], hp["bytes"])
    assert t_exp is not None and thr == max(cfg.floor_ns, int(cfg.n_expected * t_exp))
    assert got.detected_ns is not None
    rnd = _round(st.tables["coll"], hp["comm"], hp["seq"])
    enters = rnd["t"][rnd["phase"] == events.ENTER]
    if cause == "not_entered":
        # the first member waiting is stuck at t_enter + thr, the root silent since its last
        # record: both must hold
        root_last = _last_record(st.tables["coll"], want.ranks[0])
        due = max(int(enters.min()) + thr, root_last + cfg.idle_floor_ns)
    else:
        # stuck once every member entered (the transfer could start then)
        due = int(enters.max()) + thr
        assert thr > cfg.floor_ns          # the 2 x rule, not the floor
    assert due <= got.detected_ns <= due + TICK, (got.detected_ns - due) / S
    assert got.end_ns is None


def test_not_entered_waits_for_the_host_pause_allowance() -> None:
    """With the default configuration a member that never entered is named once it has been
    silent for ``idle_floor_ns`` (a GC pause or a checkpoint write on one rank looks the
    same until then), one tick at most after that."""
    cfg = HangConfig()
    st = stream(_job([BOUND_CASES["not_entered"]]), tail=3 * S)
    assert [(a.cause, a.ranks) for a in st.hangs] == [("not_entered", [5])]
    got = st.hangs[0]
    root_last = _last_record(st.tables["coll"], 5)
    hp = got.extra["halt_point"]
    _, thr = _detector(st).expected_ns(hp["comm"], hp["op"], hp["bytes"])
    due = max(hp["t_enter"] + thr, root_last + cfg.idle_floor_ns)
    assert got.detected_ns is not None and due <= got.detected_ns <= due + TICK
    # the tensor-parallel halt point is placed in the 1F1B schedule (MEGATRACE §III-C)
    assert (got.extra["pass"], got.extra["microbatch"], got.extra["schedule_phase"]) == (
        "forward", 0, "warmup")


# ---------------------------------------------------------------------------------------------
# late records, pauses


def test_rank_whose_records_arrive_late_is_not_blamed() -> None:
    """Rank 3's collector delivers 3 s late and rank 12's 1.5 s late (longer than the 1 s
    floor): their peers' rounds wait for records that are on their way; no hang."""
    st = stream(_job([], iterations=12), lag={3: 3.0, 12: 1.5}, tail=5 * S)
    assert st.hangs == []
    lag = _detector(st).ranks.lag
    assert lag[3] >= 2.9 * S and lag[12] >= 1.4 * S and lag[0] < 0.25 * S


def test_hang_with_a_late_victim_names_the_root() -> None:
    """The root's tensor-parallel peer (rank 4) lags 3 s: the hang is still the root's."""
    st = stream(_job([BOUND_CASES["not_entered"]]), lag={4: 3.0}, tail=4 * S)
    assert [(a.cause, a.ranks) for a in st.hangs] == [("not_entered", [5])]


def test_late_root_is_named_after_its_lag() -> None:
    """The root itself lags 2 s: it is named, later by its lag, not before."""
    cfg = HangConfig()
    st = stream(_job([BOUND_CASES["not_entered"]]), lag={5: 2.0}, tail=4 * S)
    assert [(a.cause, a.ranks) for a in st.hangs] == [("not_entered", [5])]
    got = st.hangs[0]
    root_last = _last_record(st.tables["coll"], 5)
    assert got.detected_ns is not None
    assert got.detected_ns >= root_last + 2 * S + cfg.idle_floor_ns - TICK


def test_checkpoint_pauses_with_a_collective_in_flight_are_not_hangs() -> None:
    """Three checkpoints: the first rank of each data-parallel group writes for 8, 30 and
    20 s while its peers wait in an 8-byte all-gather on the group. The first time, that
    small all-gather was never seen on the group (its parameter all-gathers are another size
    class: no borrowed expectation); from then on a small operation that blocked for
    seconds is a synchronisation point with the ceiling as threshold (CCL-D §4.2.1: a
    threshold that considers such long operations), however long the next write takes;
    the parameter all-gathers keep their own expectation."""
    st = stream(_job([], iterations=9), checkpoints=((2, 8.0, "dp"), (4, 30.0, "dp"),
                                                     (6, 20.0, "dp")), tail=S)
    assert st.hangs == []
    det = _detector(st)
    dp = next(c for c in st.meta.comms if c.kind == "dp")
    assert det.expected_ns(dp.comm, "allgather", 8) == (None, HangConfig().ceiling_ns)
    t_exp, thr = det.expected_ns(dp.comm, "allgather", 1 << 28)
    assert t_exp is not None and t_exp < S and thr == HangConfig().floor_ns


def test_first_checkpoint_in_a_known_small_operation_is_a_hang_until_learned() -> None:
    """The limit of learning: a small operation the job has run quickly before (here the
    checkpoint all-reduce itself, first with a 2 s write) gets its learned threshold; a
    write ten times longer the next time is reported, and reported as ended."""
    st = stream(_job([], iterations=8), checkpoints=((2, 2.0, "world"), (5, 20.0, "world")),
                tail=S)
    assert [(a.cause, a.ranks, a.end_ns is None) for a in st.hangs] == [
        ("not_entered", [0], True), ("not_entered", [0], False)]


def test_hang_after_a_learned_checkpoint_pause_is_still_found() -> None:
    """A long learned tail on the checkpoint all-gather does not hide a later hang in the
    ordinary rounds."""
    st = stream(_job([{"cause": "hardware", "ranks": [6], "start": 6, "comm": "dp",
                       "op": "reducescatter"}], iterations=8),
                checkpoints=((2, 10.0, "dp"),), tail=3 * S)
    assert [(a.cause, a.ranks) for a in st.hangs] == [("hardware", st.truth[0].ranks)]
