"""Rounds, CCL-D R/P and the localization of slow-downs (CCL-D §4.2, Greyhound §4.3)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest
from support.synth_jobs import Fault, generate

from failslow import events
from failslow.comms import rank_order
from failslow.detectors.slowdown import (
    CommRegistry,
    RoundJoiner,
    SlowdownDetector,
    cause_from_p,
    ccld_ratios,
    infer_comm_kind,
    infer_comms,
    rounds_table,
)
from failslow.events import Comm, JobMeta
from failslow.replay import replay

MS = 1_000_000


def _meta(world: int = 4, comms: tuple[Comm, ...] = ()) -> JobMeta:
    return JobMeta(job="j", t=0, world_size=world, tp=world, pp=1, dp=1, cp=1, microbatches=0,
                   schedule="unknown", nodes={}, comms=comms)


def _row(rank: int, comm: int, cr: int, size: int, seq: int, op: str, phase: str, t: int,
         peer: int = -1, t_start: int | None = None) -> dict[str, object]:
    return {"job": "j", "rank": rank, "comm": comm, "comm_rank": cr, "comm_size": size,
            "seq": seq, "op": op, "bytes": 1024, "peer": peer, "phase": phase, "t": t,
            "t_start": t_start}


def test_collective_round_join_across_batches() -> None:
    comm = 2**64 - 5
    joiner = RoundJoiner(CommRegistry(_meta(3)))
    enters = [_row(r, comm, r, 3, 0, "allreduce", "enter", (10 + 5 * r) * MS) for r in range(3)]
    ends = [_row(r, comm, r, 3, 0, "allreduce", "end", 30 * MS + r, t_start=20 * MS)
            for r in range(3)]
    first = joiner.update(events.from_rows("coll", ends[:2] + enters[1:]))
    assert len(first) == 0 and len(joiner.pending["rank"]) == 3
    second = joiner.update(events.from_rows("coll", [enters[0], ends[2]]))
    table = rounds_table("j", second).to_pylist()
    assert len(joiner.pending["rank"]) == 0
    (r,) = table
    assert r["comm"] == comm and r["seq"] == 0 and r["members"] == 3
    assert r["t_first_enter"] == 10 * MS and r["t_last_enter"] == 20 * MS
    assert r["last_rank"] == 2  # shortest duration: entered last
    assert r["duration_max_ns"] == 20 * MS and r["duration_min_ns"] == 10 * MS + 2
    assert second.transfer[0] == pytest.approx(10 * MS + 1)


def test_point_to_point_pairs_match_kth_send_with_kth_recv() -> None:
    comm = 77
    rows = []
    for k in range(3):  # rank 0 sends three times to rank 1 (its seq 0..2)
        rows += [_row(0, comm, 0, 2, k, "send", "enter", (100 * k + 10) * MS, peer=1),
                 _row(0, comm, 0, 2, k, "send", "end", (100 * k + 30) * MS, peer=1)]
        # rank 1 interleaves another op on the communicator: its recv seqs are 0, 2, 4
        rows += [_row(1, comm, 1, 2, 2 * k, "recv", "enter", (100 * k) * MS, peer=0),
                 _row(1, comm, 1, 2, 2 * k, "recv", "end", (100 * k + 31) * MS, peer=0)]
    joiner = RoundJoiner(CommRegistry(_meta(2)))
    out = joiner.update(events.from_rows("coll", rows[::-1]))
    table = rounds_table("j", out).sort_by("t_first_enter").to_pylist()
    assert [r["seq"] for r in table] == [0, 1, 2]  # the sender's seq
    assert all(r["op"] == "send" and r["members"] == 2 for r in table)
    assert all(r["last_rank"] == 0 for r in table)  # the receiver waited on the sender
    assert table[0]["duration_max_ns"] == 31 * MS and table[0]["duration_min_ns"] == 20 * MS


def test_ccld_ratios() -> None:
    base = 10.0
    # compute-bound: the last rank to enter has a base-like duration, the others wait
    r, p = ccld_ratios(base, np.array([12.0, 40.0, 15.0]), np.array([10.0, 10.5, 11.0]))
    assert r == pytest.approx(3.0) and p is not None and p > 0.95
    assert cause_from_p(p) == "compute"
    # communication-bound: everyone's transfer is slow
    r, p = ccld_ratios(base, np.array([40.0, 41.0]), np.array([39.0, 40.0]))
    assert r == pytest.approx(3.0) and p is not None and p < 0.1
    assert cause_from_p(p) == "communication"
    assert cause_from_p(0.5) == "mixed"
    # no slow-down: P undefined
    assert ccld_ratios(base, np.array([9.0]), np.array([8.0]))[1] is None


def test_infer_comm_kinds_from_membership() -> None:
    meta = JobMeta(job="j", t=0, world_size=16, tp=2, pp=2, dp=4, cp=1, microbatches=4,
                   schedule="1f1b", nodes={}, comms=())
    assert infer_comm_kind([4, 5], meta) == "tp"
    assert infer_comm_kind([0, 2, 4, 6], meta) == "dp"
    assert infer_comm_kind([1, 9], meta) == "pp"
    assert infer_comm_kind(list(range(16)), meta) == "world"
    assert infer_comm_kind([0, 3, 5], meta) == "other"
    # pure data parallelism: the whole world is the DP group (its gradient sync)
    pure_dp = dataclasses.replace(meta, tp=1, pp=1, dp=16)
    assert infer_comm_kind(list(range(16)), pure_dp) == "dp"
    pure_pp = dataclasses.replace(meta, tp=1, pp=16, dp=1)
    assert infer_comm_kind(list(range(16)), pure_pp) == "world"
    assert infer_comm_kind(list(range(16)), pure_pp, p2p_only=True) == "pp"
    # a send/recv pair that is a pipeline pair in another rank order than Megatron's
    # (tp, pp, dp: 50 and 52 are stages 1 and 2), where Megatron's order would make it dp
    big = dataclasses.replace(meta, world_size=64, tp=2, pp=4, dp=8)
    assert infer_comm_kind([50, 52], big, p2p_only=True) == "pp"
    assert infer_comm_kind([50, 52], big) == "other"
    # dp == pp: both rank orders fit each group; the job's order is the one under which
    # the groups' use agrees (rank order pp, dp: the stride-8 all-reduce groups are DP, the
    # consecutive send/recv groups pipelines)
    alike = dataclasses.replace(meta, world_size=64, tp=1, pp=8, dp=8)
    groups = [(list(range(d, 64, 8)), False) for d in range(8)] + [
        (list(range(8 * d, 8 * d + 8)), True) for d in range(8)]
    order = rank_order(groups, alike)
    assert order.index("pp") < order.index("dp")
    assert infer_comm_kind(list(range(1, 64, 8)), alike, prefer=order) == "dp"
    assert infer_comm_kind(list(range(8, 16)), alike, True, prefer=order) == "pp"
    # Megatron's order, where the same membership would read the other way round
    assert infer_comm_kind(list(range(1, 64, 8)), alike) == "pp"


def test_tp_and_dp_of_one_size_are_told_apart_by_how_often_they_call(tmp_path) -> None:
    """tp == dp: orders that swap them explain every group alike, and Megatron's order won
    the tie, so in a job whose DP index varies fastest each DP ring was labelled TP (held-out
    seed 11 ``link-dp-4``, tp4 pp8 dp4: a slow DP ring reported as ``tp_collective``). The
    groups that call collectives more often are the TP ones."""
    meta = dataclasses.replace(_meta(16), tp=4, pp=1, dp=4)
    contiguous = [(list(range(4 * g, 4 * g + 4)), False) for g in range(4)]
    strided = [(list(range(g, 16, 4)), False) for g in range(4)]
    groups = contiguous + strided
    assert rank_order(groups, meta) == ("tp", "cp", "dp", "pp")  # no calls: Megatron's
    dp_first = rank_order(groups, meta, [2.0] * 4 + [40.0] * 4)
    assert dp_first.index("dp") < dp_first.index("tp")
    assert infer_comm_kind(list(range(4)), meta, prefer=dp_first) == "dp"
    assert infer_comm_kind([1, 5, 9, 13], meta, prefer=dp_first) == "tp"
    tp_first = rank_order(groups, meta, [40.0] * 4 + [2.0] * 4)
    assert tp_first.index("tp") < tp_first.index("dp")
    # end to end, from the rows of the independent generator's job in that rank order
    from failslow.bench import heldout as hg
    from failslow.engine.offline import _membership
    from failslow.tracedir import TraceDir

    spec = hg.Spec(tp=4, pp=2, dp=4, microbatches=2, iterations=6, order=("dp", "tp", "pp"),
                   gpus_per_node=8, dp_mode="allreduce", seed=11, faults=[])
    hg.write(spec, tmp_path / "job")
    td = TraceDir(tmp_path / "job")
    for rows in (_membership(td), td.read("coll")):
        kinds = {c.ranks: c.kind for c in infer_comms(rows, td.meta())}
        assert kinds[(0, 1, 2, 3)] == "dp" and kinds[(0, 4, 8, 12)] == "tp"


@pytest.mark.parametrize(("dims", "order"), [((4, 2, 4), ("dp", "tp", "pp")),
                                             ((2, 4, 4), ("pp", "tp", "dp"))])
def test_communicators_learned_live_get_the_kinds_of_the_whole_trace(
        tmp_path, dims: tuple[int, int, int], order: tuple[str, ...]) -> None:
    """A job whose meta lists no communicators, processed live: the slow-down detector's
    registry labels each group as :func:`infer_comms` does on the whole trace (what
    ``failslow analyze`` runs). Each group used to get the first rank order it fitted, so
    with tp == dp and DP first every DP ring was labelled TP, and with dp == pp and the
    pipeline first every DP ring was labelled PP (held-out seeds 11 and 29: the live
    processor reported ``tp_collective`` where ``analyze`` said ``dp_sync``)."""
    from failslow.bench import heldout as hg
    from failslow.tracedir import TraceDir

    tp, pp, dp = dims
    spec = hg.Spec(tp=tp, pp=pp, dp=dp, microbatches=pp, iterations=4, order=order,
                   gpus_per_node=8, dp_mode="allreduce", seed=11, faults=[])
    hg.write(spec, tmp_path / "job")
    td = TraceDir(tmp_path / "job")
    meta, coll = td.meta(), td.read("coll")
    assert not meta.comms
    det = SlowdownDetector(meta)
    for _, batch in replay({"coll": coll}, 20 * MS):
        det.update(batch)
    reg = det.registry
    live = {reg.ids[i]: reg.kind(i) for i in range(len(reg.ids))}
    whole = {c.comm: c.kind for c in infer_comms(coll, meta)}
    assert live == whole
    assert {"tp", "dp", "pp"} <= set(whole.values())


def test_infer_comms_from_rows_matches_meta() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=2)
    bare = dataclasses.replace(job.meta, comms=())
    inferred = {c.comm: (c.kind, c.ranks) for c in infer_comms(job.tables["coll"], bare)}
    assert inferred == {c.comm: (c.kind, c.ranks) for c in job.meta.comms}


def _detect(job, meta: JobMeta | None = None) -> list:
    det = SlowdownDetector(meta or job.meta)
    out = []
    for _, batch in replay(job.tables, 20 * MS):
        out += det.update(batch)
    return out


def test_compute_straggler_is_found() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40,
                   faults=[Fault("compute", 15, 30, 1.5, rank=5)])
    opened, closed = _detect(job)
    assert opened.id == closed.id and opened.end_ns is None and closed.end_ns is not None
    assert opened.cause == "compute" and opened.ranks == [5] and opened.link is None
    iteration = np.median(job.true_iter_ns)
    assert abs(opened.start_ns - job.fault_start_ns[0]) < iteration
    assert opened.detected_ns - job.fault_start_ns[0] < 4 * iteration
    assert closed.slowdown is not None and closed.slowdown > 1.1
    assert opened.P is not None and opened.P > 0.6  # CCL-D: computation


def test_compute_straggler_without_comms_in_meta() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=30,
                   faults=[Fault("compute", 12, None, 1.5, rank=2)])
    (opened,) = _detect(job, dataclasses.replace(job.meta, comms=()))
    assert opened.cause == "compute" and opened.ranks == [2]


def test_slow_pipeline_link_is_communication() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40,
                   faults=[Fault("link", 15, 30, 6, link=(2, 6))])
    opened, closed = _detect(job)
    assert opened.cause == "communication"
    assert sorted(opened.link or []) == [2, 6] and sorted(opened.ranks) == [2, 6]
    assert opened.comm_kind == "pp" and opened.stage == "pp_p2p"


def test_slow_dp_ring_is_communication() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, dp_ms=30,
                   faults=[Fault("link", 15, 30, 4, link=(1, 3))])
    opened, _ = _detect(job)
    assert opened.cause == "communication" and sorted(opened.link or []) == [1, 3]
    assert opened.comm_kind == "dp" and opened.stage == "dp_sync"


def test_healthy_job_has_no_anomaly() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, jitter=0.04, seed=9)
    assert _detect(job) == []


def test_rounds_rows_follow_the_schema() -> None:
    job = generate(tp=2, pp=1, dp=2, iterations=3)
    det = SlowdownDetector(job.meta)
    tables = []
    for _, batch in replay(job.tables, 20 * MS):
        det.update(batch)
        tables.append(det.last_rounds)
    rounds = pa.concat_tables(tables)
    assert rounds.schema.equals(__import__("failslow.results").results.SCHEMAS["rounds"])
    # every operation of the trace ended up in exactly one round
    assert int(np.sum(rounds["members"].to_numpy())) == job.tables["coll"].num_rows // 2


# --------------------------------------------------------------------------- CCL-D R and P


def test_r_and_p_point_at_computation_or_communication() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[Fault("compute", 15, 30, 1.5,
                                                                  rank=5)])
    opened, _ = _detect(job)
    assert opened.R is not None and opened.R > 0 and opened.P is not None and opened.P > 0.6
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[Fault("link", 15, 30, 6,
                                                                  link=(2, 6))])
    opened, _ = _detect(job)
    assert opened.cause == "communication"
    # non-blocking sends queue behind the slow transfers, so part of the extra time shows
    # as late arrival: not computation (P < beta), though not pure communication either
    assert opened.R is not None and opened.R > 0.3 and opened.P is not None and opened.P < 0.6


def test_ccld_ratios_subtract_the_healthy_range() -> None:
    # a pipeline receive waits 30 in healthy rounds; a slower transfer adds 20 to both
    r, p = ccld_ratios(40.0, np.array([60.0]), np.array([30.0]), skew_base=30.0)
    assert r == pytest.approx(0.5) and p == pytest.approx(0.0)
    r, p = ccld_ratios(40.0, np.array([60.0]), np.array([30.0]))
    assert p == pytest.approx(1.0)  # Eq. 4 as is would call it computation


def test_ccld_monitor_threshold_and_repetition() -> None:
    from failslow.detectors.slowdown import CCLDMonitor, SlowdownConfig

    cfg = SlowdownConfig(ccld_window_s=1.0, ccld_repeat=2, baseline_rounds=20)
    mon = CCLDMonitor(cfg)
    t = np.arange(0, 12_000, 10, dtype=np.int64) * MS  # one round every 10 ms, 12 s
    slow = (t >= 8_000 * MS) & (t < 10_000 * MS)
    dmax = np.where(slow, 40 * MS, 10 * MS) + (np.arange(len(t)) % 3) * MS // 10
    dmin = np.full(len(t), 9 * MS)
    key = np.full(len(t), 7, dtype=np.int64)
    for lo in range(0, len(t), 37):  # arbitrary batches
        mon.update(key[lo:lo + 37], t[lo:lo + 37], dmax[lo:lo + 37], dmin[lo:lo + 37])
    alarms = mon.close(12_000 * MS)
    assert len(alarms) == 1  # windows 8 and 9 are slow: one alarm, on the second
    assert alarms[0]["window"] == 9 and alarms[0]["R"] > alarms[0]["theta"]
    assert mon.base(7)[0] == pytest.approx(float(dmax[:20].mean()))


# --------------------------------------------------------------------------- compute gaps


def test_gap_tracker_places_gaps_in_the_pipeline_schedule() -> None:
    from failslow.detectors.slowdown import PASS_BWD, PASS_FWD, GapTracker

    # a middle stage: recv from prev, 2 compute gaps, send+recv, 2 gaps, send+recv ...
    rows = []  # (t, enter?, kind)
    t = 0
    for _ in range(4):
        for kind_in, kind_out in ((1, 3), (2, 4)):
            rows += [(t, True, kind_in), (t + 1, False, 0)]  # receive
            t += 2
            for _ in range(2):
                t += 10  # compute
                rows += [(t, True, 0), (t + 1, False, 0)]  # TP all-reduce
                t += 2
            rows += [(t, True, kind_out), (t + 1, False, 0)]  # send
            t += 2
    arr = np.array([(r[0], r[1], r[2]) for r in rows], dtype=np.int64)
    g = GapTracker()
    out = [g.update(np.zeros(len(p), dtype=np.int64), p[:, 0], p[:, 1].astype(bool), p[:, 2])
           for p in (arr[:7], arr[7:30], arr[30:])]
    passes = np.concatenate([o[3] for o in out])
    gaps = np.concatenate([o[2] for o in out])
    compute = gaps >= 10
    assert set(passes[compute].tolist()) == {PASS_FWD, PASS_BWD}
    assert passes[compute].tolist() == [PASS_FWD, PASS_FWD, PASS_BWD, PASS_BWD] * 4


def test_gap_tracker_places_gaps_among_tensor_parallel_collectives() -> None:
    """No pipeline: two micro-batches of four TP all-reduces each (two in the forward, two
    in the backward), then the DP gradient sync. Once a run's length is known, the gaps
    before each micro-batch's first two TP operations are forward, the others and the gap
    before the sync backward; however the rows are batched."""
    from failslow.detectors.slowdown import PASS_BWD, PASS_FWD, GapTracker

    rows = []  # (t, enter?, tp?)
    t = 0
    for _ in range(3):  # iterations
        for _ in range(2 * 4):
            t += 10  # compute
            rows += [(t, True, True), (t + 1, False, True)]
            t += 2
        t += 10
        rows += [(t, True, False), (t + 1, False, False)]  # DP sync
        t += 2
    arr = np.array(rows, dtype=np.int64)
    F, B = PASS_FWD, PASS_BWD
    want = [0] * 9 + ([F, F, B, B] * 2 + [B]) * 2  # the first run only measures itself
    for cuts in ((len(arr),), (5, 17, 31, 40)):
        g = GapTracker(microbatches=2)
        parts = np.split(arr, list(cuts)[:-1]) if len(cuts) > 1 else [arr]
        out = [g.update(np.zeros(len(p), dtype=np.int64), p[:, 0], p[:, 1].astype(bool),
                        None, p[:, 2].astype(bool)) for p in parts]
        passes = np.concatenate([o[3] for o in out])
        assert passes.tolist() == want[len(want) - len(passes):]


def test_forward_only_slowdown_without_spans() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[
        Fault("compute", 15, 30, 2.0, rank=1, phase="forward")])
    opened, _ = _detect(job)
    assert opened.ranks == [1] and opened.stage == "forward"
    job = generate(tp=2, pp=2, dp=2, iterations=40, faults=[
        Fault("compute", 15, 30, 1.6, rank=5, phase="backward")])
    opened, _ = _detect(job)
    assert opened.ranks == [5] and opened.stage == "backward"


def test_pauses_on_random_ranks_are_not_a_slowdown() -> None:
    """Bursts of long pauses, each on some rank, slow iterations down but have no common
    root: no anomaly (the roots do not persist)."""
    job = generate(tp=2, pp=2, dp=2, iterations=50, seed=11)
    coll = job.tables["coll"]
    rng = np.random.default_rng(0)
    t = coll.column("t").to_numpy().copy()
    rank = coll.column("rank").to_numpy()
    t_min, t_max = int(t.min()), int(t.max())
    for _ in range(25):  # 25 pauses of 20-40 ms on random ranks at random times
        r, at, d = int(rng.integers(0, 8)), int(rng.integers(t_min, t_max)), \
            int(rng.integers(20, 40)) * MS
        t[(rank == r) & (t > at)] += d
    shifted = coll.set_column(coll.schema.get_field_index("t"), "t", pa.array(t))
    det = SlowdownDetector(job.meta)
    out = []
    for _, batch in replay({"coll": shifted}, 20 * MS):
        out += det.update(batch)
    assert out == []


def test_a_second_slowdown_during_an_open_one_is_reported_on_its_own() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=60, faults=[
        Fault("compute", 10, 50, 1.3, rank=5), Fault("compute", 25, 40, 2.5, rank=2)])
    reports = _detect(job)
    opened = {}
    for a in reports:
        opened.setdefault(a.id, a)
    assert [a.ranks for a in opened.values()] == [[5], [2]]
    closed = {a.id: a for a in reports if a.end_ns is not None}
    assert set(closed) == set(opened)
    assert closed["slow-1"].end_ns < closed["slow-0"].end_ns


def test_a_second_slow_link_between_the_same_two_nodes_is_its_own_anomaly() -> None:
    """Two DP links join the same two nodes (two ranks per node, one NIC each): a mild fault
    on one, then a strong one on the other, are two faults, each named by its link."""
    job = generate(tp=2, pp=2, dp=2, iterations=45, dp_ms=30, ranks_per_node=2, faults=[
        Fault("link", 15, None, 1.6, link=(0, 2)), Fault("link", 28, None, 6, link=(1, 3))])
    assert job.meta.nodes[0] == job.meta.nodes[1] and job.meta.nodes[2] == job.meta.nodes[3]
    reports = _detect(job)
    assert [(a.id, a.cause, sorted(a.link or [])) for a in reports] == [
        ("slow-0", "communication", [0, 2]), ("slow-1", "communication", [1, 3])]
    slowdowns = [a.slowdown or 0.0 for a in reports]
    assert slowdowns[1] > 1.5 * slowdowns[0]


def test_a_slow_link_that_grows_worse_is_reported_again_with_its_new_slowdown() -> None:
    job = generate(tp=2, pp=2, dp=2, iterations=45, dp_ms=30, ranks_per_node=2, faults=[
        Fault("link", 15, None, 2, link=(1, 3)), Fault("link", 28, None, 3, link=(1, 3))])
    first, again = _detect(job)
    assert first.id == again.id and sorted(again.link or []) == [1, 3]
    assert first.start_ns == again.start_ns and first.detected_ns == again.detected_ns
    assert again.slowdown is not None and first.slowdown is not None
    assert again.slowdown > 1.5 * first.slowdown and again.end_ns is None


def test_a_far_stronger_step_on_the_same_link_is_reported_with_its_own_onset() -> None:
    """A link 2x slow (iterations 1.26x), then failing hard (iterations 5x): a new event on
    the link, with its own onset, not folded into the mild one's (whose onset would then
    date the hard failure 13 iterations early)."""
    job = generate(tp=2, pp=2, dp=2, iterations=45, dp_ms=30, ranks_per_node=2, faults=[
        Fault("link", 15, None, 2, link=(1, 3)), Fault("link", 28, None, 8, link=(1, 3))])
    reports = _detect(job)
    assert [(a.id, sorted(a.link or []), a.to_dict()["onset_iteration"]) for a in reports] == [
        ("slow-0", [1, 3], 15), ("slow-1", [1, 3], 28)]
    assert reports[1].slowdown is not None and reports[1].slowdown > 3
