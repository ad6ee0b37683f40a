"""Hang detector (detectors/hang.py): CCL-D §4.2 classes H1-H3 and MEGATRACE §III-C halt point,
on small synthetic training programs (tests/support/hang_jobs.py). End to end on the
simulator presets: test_hang_presets.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.hang_jobs import (
    MS,
    T0,
    TPC,
    Fault,
    Job,
    S,
    drive,
    feed,
    history,
    step_index,
    timeline,
    tp_rows,
    two_rank_meta,
)
from support.snapshots import roundtrip

from failslow import events
from failslow.detectors.hang import HangConfig, HangDetector
from failslow.diagnosis import Anomaly
from failslow.events import Comm, JobMeta
from failslow.replay import replay

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


