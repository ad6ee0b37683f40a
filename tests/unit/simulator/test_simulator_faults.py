"""Fault injection: the trace shows each injected fault, and truth.json describes it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from failslow.diagnosis import Diagnosis
from failslow.simulator import (
    ScenarioError,
    SimResult,
    preset,
    scenario_from_dict,
    simulate,
)


def frames(res: SimResult) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    df = res.tables["coll"].to_pandas()
    enter = df[df.phase == "enter"].set_index(["comm", "rank", "seq"])
    end = df[df.phase == "end"].set_index(["comm", "rank", "seq"])
    return df, enter, end


def in_flight(res: SimResult) -> pd.DataFrame:
    _, enter, end = frames(res)
    return enter[~enter.index.isin(end.index)].reset_index()


def iteration_times(res: SimResult) -> np.ndarray:
    """True-ish iteration time from the trace: consecutive optimizer ends of rank 0."""
    sp = res.tables["span"].to_pandas()
    opt = sp[(sp["rank"] == 0) & (sp.op == "optimizer")].sort_values("step")
    return np.diff(opt.t_end.to_numpy()) / 1e9


def job(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"job": "tf", "parallel": {"tp": 2, "pp": 4, "dp": 2},
                         "microbatches": 4, "iterations": 12, "noise": {"gc_prob": 0.0}}
    d.update(over)
    return d


# ---------------------------------------------------------------------------------------------
# slow faults


def test_compute_straggler_slows_iterations_by_its_compute_share() -> None:
    """Pure data parallelism: iteration = compute + DP sync, so a rank whose compute is
    `sev` x slower makes every iteration 1 + (sev - 1) * compute share slower."""
    base = job(parallel={"tp": 1, "pp": 1, "dp": 4}, iterations=16, gpus_per_node=1)
    healthy = simulate(scenario_from_dict(base), seed=1)
    sp = healthy.tables["span"].to_pandas()
    r0 = sp[(sp["rank"] == 0) & (sp.step == 5)]
    compute = (r0.t_end - r0.t_start)[r0.op.isin(["forward-compute", "backward-compute",
                                                  "optimizer"])].sum()
    share = compute / (iteration_times(healthy)[4] * 1e9)
    assert 0.5 < share < 0.95
    sev = 1.5
    faulty = simulate(scenario_from_dict({**base, "faults": [
        {"cause": "compute", "ranks": [2], "start": 6, "duration": 6, "severity": sev}]}),
        seed=1)
    (a,) = faulty.truth.anomalies
    expected = 1 + (sev - 1) * share
    assert a.slowdown == pytest.approx(expected, rel=0.05)
    t_fault = iteration_times(faulty)[6:10].mean()
    t_before = iteration_times(faulty)[1:5].mean()
    assert t_fault / t_before == pytest.approx(expected, rel=0.05)
    assert (a.kind, a.cause, a.ranks, a.link, a.stage) == ("slow", "compute", [2], None, None)
    assert a.extra["iteration_start"] == 6 and a.extra["iteration_end"] == 12
    # the straggler enters DP rounds last; its peers wait for it
    df, enter, _ = frames(faulty)
    dp = enter.reset_index()
    dp = dp[dp.op == "reducescatter"]
    late = dp.loc[dp.groupby("seq").t.idxmax()]
    in_fault = late[late.seq.between(2 * 6 + 1, 2 * 11 + 1)]   # grads-sync of iterations 6-11
    assert len(in_fault) == 6 and (in_fault["rank"] == 2).all()
    assert (late[late.seq < 2 * 6]["rank"] == 2).mean() < 0.8


def test_compute_straggler_only_in_backward() -> None:
    res = simulate(scenario_from_dict(job(faults=[
        {"cause": "compute", "ranks": [5], "start": 4, "severity": 2.0,
         "stage": "backward"}])), seed=2)
    (a,) = res.truth.anomalies
    assert a.stage == "backward" and a.end_ns is None and a.extra["iteration_end"] is None
    sp = res.tables["span"].to_pandas()
    sp["d"] = sp.t_end - sp.t_start
    mine = sp[sp["rank"] == 5]
    other = sp[sp["rank"] == 7]   # same stage, other dp replica

    def ratio(op: str) -> float:
        a_ = mine[(mine.op == op) & (mine.step >= 5)].d.median()
        b_ = other[(other.op == op) & (other.step >= 5)].d.median()
        return float(a_ / b_)

    assert ratio("backward-compute") > 1.6
    assert ratio("forward-compute") < 1.1


def test_time_windowed_fault_starts_at_its_time() -> None:
    res = simulate(scenario_from_dict(job(faults=[
        {"cause": "compute", "ranks": [9], "start": "1.5s", "duration": "1s",
         "severity": 1.5}])), seed=0)
    (a,) = res.truth.anomalies
    t0 = res.meta.t
    assert 1.5e9 <= a.start_ns - t0 < 1.6e9
    assert 2.4e9 < a.end_ns - t0 < 2.7e9
    assert a.slowdown is not None and a.slowdown > 1.0


def test_slow_link_slows_only_transfers_crossing_it() -> None:
    sc = preset("link")
    sc.iterations = 14
    sc.faults[0].start_iteration, sc.faults[0].duration_iterations = 6, 5
    res = simulate(sc, seed=0)
    (a,) = res.truth.anomalies
    assert (a.kind, a.cause, a.comm_kind, a.stage) == ("slow", "communication", "dp",
                                                        "dp_sync")
    assert a.link == [6, 8] and a.ranks == [6, 8]
    nodes = res.meta.nodes
    assert {nodes[6], nodes[8]} == {"node000", "node001"}
    comms = {c.comm: c for c in res.meta.comms}
    assert a.comm is not None and {6, 8} <= set(comms[a.comm].ranks)
    # ring neighbours in the communicator
    ring = comms[a.comm].ranks
    assert ring.index(8) == ring.index(6) + 1
    df, _, end = frames(res)
    e = end.reset_index()
    e["xfer"] = e.t - e.t_start
    e["kind"] = e.comm.map({c: v.kind for c, v in comms.items()})
    e["stage"] = e["rank"] // 16
    seq_iter = e.seq // 2  # two DP rounds per iteration

    def xfer(kind: str, stage: int, its: range) -> float:
        sel = (e.kind == kind) & (e.stage == stage) & seq_iter.isin(list(its))
        return float(e[sel].xfer.median())

    slow = xfer("dp", 0, range(6, 11)) / xfer("dp", 0, range(1, 5))
    assert slow == pytest.approx(3.0, rel=0.1)
    assert xfer("dp", 1, range(6, 11)) / xfer("dp", 1, range(1, 5)) == pytest.approx(1, rel=.1)
    assert set(a.extra["comms"]) == {c.comm for c in res.meta.comms
                                     if c.kind == "dp" and (6 in c.ranks or 7 in c.ranks)}
    assert a.slowdown is not None and a.slowdown > 1.15
    # link rows: the bandwidth (bytes slope) of rank 6's queue pair to node001 drops
    lk = res.tables["link"].to_pandas()
    q = lk[(lk["rank"] == 6) & (lk.peer_node == "node001")].sort_values("t")
    assert len(q) > 10 and q.bytes.is_monotonic_increasing


def test_pp_slow_link_and_mixed_truth() -> None:
    demo = preset("demo")
    demo.iterations = 40
    demo.faults[0].start_iteration, demo.faults[0].duration_iterations = 5, 8
    demo.faults[1].start_iteration, demo.faults[1].duration_iterations = 22, 10
    res = simulate(demo, seed=0)
    a, b = res.truth.anomalies
    assert (a.cause, a.ranks) == ("compute", [21])
    assert (b.cause, b.comm_kind, b.stage, b.link) == ("communication", "pp", "pp_p2p",
                                                        [32, 48])
    assert a.end_ns < b.start_ns   # at different times, not overlapping
    assert b.extra["nodes"] == ["node004", "node006"]
    assert a.slowdown > 1.05 and b.slowdown > 1.03
    mixed = preset("mixed")
    mixed.iterations = 16
    mixed.faults[0].start_iteration = 8
    res = simulate(mixed, seed=0)
    (m,) = res.truth.anomalies
    assert (m.kind, m.cause, m.ranks, m.link, m.comm_kind) == ("slow", "mixed", [37],
                                                                [32, 48], "pp")
    assert m.extra["severity"] == 1.3 and m.extra["link_severity"] == 6.0


def test_compute_multi_preset_truth() -> None:
    sc = preset("compute-multi")
    sc.iterations = 20
    sc.faults[0].start_iteration = 10
    res = simulate(sc, seed=0)
    (a,) = res.truth.anomalies
    assert (a.kind, a.cause, a.ranks) == ("slow", "compute", [9, 42])


def test_truth_json_shape(tmp_path: Any) -> None:
    from failslow.simulator import write_sim

    res = simulate(scenario_from_dict(job(faults=[
        {"cause": "compute", "ranks": [3], "start": 4, "duration": 4, "severity": 1.4}])))
    write_sim(res, tmp_path, "parquet")
    truth = Diagnosis.load(tmp_path / "truth.json")
    assert truth.job == "tf" and truth.whatif is None
    it = truth.iterations
    assert it is not None and it["count"] == 12
    # rank 0: 4 fwd + 4 bwd x 2 TP rounds, 4 sends + 4 recvs, params- and grads-sync
    assert it["period_ops"] == 16 + 8 + 2
    assert 0.1 < it["median_s"] < 1.0
    (a,) = truth.anomalies
    assert a.id == "fault-0" and a.ranks == [3] and a.start_ns is not None
    assert a.start_ns < a.end_ns


# ---------------------------------------------------------------------------------------------
# hangs


def test_hang_not_entered() -> None:
    res = simulate(preset("hang-not-entered"), seed=0)
    assert res.stats["hung"]
    (a,) = res.truth.anomalies
    assert (a.kind, a.cause, a.ranks, a.comm_kind, a.stage) == ("hang", "not_entered", [21],
                                                                "tp", "tp_collective")
    assert a.end_ns is None and a.slowdown is None and a.extra["iteration_start"] == 12
    fl = in_flight(res)
    hung_round = fl[(fl.comm == a.comm) & (fl.seq == a.extra["seq"])]
    assert sorted(hung_round["rank"]) == [20]      # the peer waits ...
    _, enter, _ = frames(res)
    assert (a.comm, 21, a.extra["seq"]) not in enter.index   # ... the root never entered
    assert (a.comm, 21, a.extra["seq"] - 1) in enter.index
    # everybody ends up blocked; the trace keeps a tail of progress samples
    assert fl["rank"].nunique() == 63
    pr = res.tables["progress"].to_pandas()
    last_coll = res.tables["coll"].to_pandas().t.max()
    tail = pr[pr.t > last_coll]
    assert (tail.t.max() - last_coll) / 1e9 >= 29.9
    waiting = tail[(tail.comm == a.comm) & (tail["rank"] == 20)]
    assert len(waiting) > 500 and (waiting.send_count == 0).all()
    assert res.stats["iterations"] == 13 and res.truth.iterations["count"] == 12


def test_hang_inconsistent() -> None:
    res = simulate(preset("hang-inconsistent"), seed=0)
    (a,) = res.truth.anomalies
    assert (a.cause, a.ranks, a.comm_kind, a.stage) == ("inconsistent", [42], "dp", "dp_sync")
    df, enter, end = frames(res)
    seq = a.extra["seq"]
    rnd = enter.reset_index()
    rnd = rnd[(rnd.comm == a.comm) & (rnd.seq == seq)].set_index("rank")
    assert len(rnd) == 8                              # everybody entered
    assert rnd.bytes[42] * 2 == rnd.bytes.drop(42).iloc[0]
    ended = {r for (c, r, s) in end.index if c == a.comm and s == seq}
    assert ended == {42}                              # only the odd rank completes
    pr = res.tables["progress"].to_pandas()
    stuck = pr[(pr.comm == a.comm) & (pr.seq == seq)]
    final = stuck.sort_values("t").groupby("rank").last()
    assert set(final.index) == set(rnd.index) - {42}
    assert (final.send_count > 0).all() and final.send_count.nunique() == 1


def test_hang_hardware_progress_and_link() -> None:
    res = simulate(preset("hang-hardware"), seed=0)
    (a,) = res.truth.anomalies
    assert (a.cause, a.ranks, a.link, a.comm_kind) == ("hardware", [22], [22, 24], "dp")
    seq = a.extra["seq"]
    fl = in_flight(res)
    members = fl[(fl.comm == a.comm) & (fl.seq == seq)]
    assert sorted(members["rank"]) == list(range(16, 32, 2))   # all entered, none ended
    pr = res.tables["progress"].to_pandas()
    p = pr[(pr.comm == a.comm) & (pr.seq == seq)].sort_values("t")
    final = p.groupby("rank").last()
    assert final.send_count.idxmin() == 22
    assert (final.send_count.drop(22) > final.send_count[22]).all()
    # counts stop growing: the last minute of samples is flat
    late = p[p.t > p.t.max() - 20e9]
    assert late.groupby("rank").send_count.nunique().max() == 1
    lk = res.tables["link"].to_pandas()
    t_hang = a.start_ns
    after = lk[lk.t > t_hang + 1e9]
    broken = after[(after["rank"] == 22) & (after.peer_node == "node003")].sort_values("t")
    assert broken.completed.nunique() == 1                     # no completions ...
    assert broken.posted.iloc[-1] - broken.posted.iloc[0] > 50  # ... posted keeps growing
    others = after[~((after["rank"] == 22) & (after.peer_node == "node003"))]
    growth = others.groupby(["rank", "peer_node"]).posted.agg(lambda s: s.max() - s.min())
    assert growth.max() == 0
    gpu = res.tables["gpu"].to_pandas()
    assert (gpu[gpu.t > t_hang + 2e9].util_pct == 100).all()


def test_hang_on_pp_not_entered_and_hardware() -> None:
    for cause in ("not_entered", "hardware"):
        res = simulate(scenario_from_dict(job(faults=[
            {"cause": cause, "ranks": [5], "start": 3, "comm": "pp", "microbatch": 1}])))
        (a,) = res.truth.anomalies
        assert (a.cause, a.comm_kind, a.stage, a.ranks) == (cause, "pp", "pp_p2p", [5])
        fl = in_flight(res)
        if cause == "not_entered":
            # rank 5 (stage 1) never posts the send of micro-batch 1; rank 9 waits for it
            waiting = fl[(fl.comm == a.comm) & (fl.op == "recv")]
            assert 9 in set(waiting["rank"])
            _, enter, _ = frames(res)
            assert (a.comm, 5, a.extra["seq"]) not in enter.index
            assert (a.comm, 5, a.extra["seq"] - 1) in enter.index
        else:
            both = fl[(fl.comm == a.comm) & (fl["rank"].isin([5, 9]))]
            assert {"send", "recv"} <= set(both.op)
            assert a.link == [5, 9]


def test_fault_validation_errors() -> None:
    with pytest.raises(ScenarioError, match="rank 999"):
        scenario_from_dict(job(faults=[{"cause": "compute", "ranks": [999]}]))
    with pytest.raises(ScenarioError, match="cause"):
        scenario_from_dict(job(faults=[{"cause": "cosmic-rays", "ranks": [1]}]))
    with pytest.raises(ScenarioError, match="at most one hang"):
        scenario_from_dict(job(faults=[{"cause": "hardware", "ranks": [1]},
                                       {"cause": "not_entered", "ranks": [2]}]))
    with pytest.raises(ScenarioError, match="no traffic"):
        simulate(scenario_from_dict(job(gpus_per_node=4, faults=[
            {"cause": "communication", "nodes": [0, 3]}])))


def test_inconsistent_op_mismatch_on_tp() -> None:
    res = simulate(scenario_from_dict(job(faults=[
        {"cause": "inconsistent", "ranks": [6], "start": 2, "comm": "tp", "mismatch": "op",
         "phase": "backward", "microbatch": 2, "index": 1}])))
    (a,) = res.truth.anomalies
    assert (a.cause, a.ranks, a.comm_kind) == ("inconsistent", [6], "tp")
    _, enter, end = frames(res)
    seq = a.extra["seq"]
    assert enter.loc[(a.comm, 6, seq)].op == "allgather"
    assert enter.loc[(a.comm, 7, seq)].op == "allreduce"
    assert (a.comm, 6, seq) in end.index and (a.comm, 7, seq) not in end.index


@pytest.mark.parametrize("name", ["default", "demo", "compute-multi", "link", "mixed",
                                  "hang-not-entered", "hang-inconsistent", "hang-hardware",
                                  "gpipe", "cp"])
def test_every_preset_truth_matches_its_faults(name: str) -> None:
    sc = preset(name)
    res = simulate(sc, seed=11)
    assert len(res.truth.anomalies) == len(sc.faults)
    fl = in_flight(res)
    for f, a in zip(sc.faults, res.truth.anomalies, strict=True):
        assert a.cause == f.cause
        assert a.kind == ("hang" if f.is_hang else "slow")
        if f.cause == "communication":
            assert a.link is not None and a.ranks == sorted(a.link)
            nodes = res.meta.nodes
            assert sorted(int(nodes[r][4:]) for r in a.link) == sorted(f.nodes or [])
        else:
            assert a.ranks == sorted(f.ranks)
        if f.is_hang:
            assert a.slowdown is None and len(fl) > 0
            assert res.tables["progress"].to_pandas().t.max() > \
                res.tables["coll"].to_pandas().t.max() + 29e9
        else:
            assert a.slowdown is not None and a.slowdown > 1.03
            assert len(fl) == 0
            assert a.extra["iteration_start"] == f.start_iteration


def test_gpu_throttle_shows_in_gpu_rows_and_unobserved_faults_are_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    res = simulate(scenario_from_dict(job(
        iterations=20, sampling={"gpu_ms": 200.0},
        faults=[{"cause": "compute", "ranks": [3], "start": 5, "duration": 8, "severity": 2.0,
                 "gpu_throttle": True},
                {"cause": "compute", "ranks": [4], "start": 99}])), seed=0)
    (a,) = res.truth.anomalies
    assert a.ranks == [3]
    assert "never took effect" in caplog.text
    g = res.tables["gpu"].to_pandas()
    inside = g[(g.t > a.start_ns + 2e8) & (g.t < a.end_ns - 2e8)]
    outside = g[(g.t < a.start_ns - 2e8) | (g.t > a.end_ns + 2e8)]
    assert len(inside[inside["rank"] == 3]) >= 3
    assert (inside[inside["rank"] == 3].sm_clock_mhz < 1000).all()
    assert (inside[inside["rank"] == 3].throttle_reasons != 0).all()
    assert (outside.throttle_reasons == 0).all()
    assert (inside[inside["rank"] != 3].throttle_reasons == 0).all()
