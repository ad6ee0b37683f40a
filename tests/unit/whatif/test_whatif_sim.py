"""What-if analysis on simulated traces with known ground truth (what-if paper §6:
simulation fidelity and the accuracy of slowdown estimation)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from support.snapshots import roundtrip

from failslow.replay import replay
from failslow.simulator import SimResult, scenario_from_dict, simulate
from failslow.whatif import analysis as wi

NO_SAMPLES = {"progress_ms": 0, "link_ms": 0, "gpu_ms": 0}


def _sim(seed: int = 0, **over: Any) -> SimResult:
    d: dict[str, Any] = {"preset": "healthy", "iterations": 12, "sampling": NO_SAMPLES}
    d.update(over)
    return simulate(scenario_from_dict(d), seed)


def _tables(res: SimResult, kinds: tuple[str, ...] = ("span", "coll")) -> dict[str, pa.Table]:
    return {k: res.tables[k] for k in kinds}


@pytest.fixture(scope="module")
def default() -> SimResult:
    """tp2 pp4 dp8, rank 21 (stage 1, DP rank 2, TP rank 1) 1.5x slower in steps 5-14."""
    return _sim(iterations=20, faults=[{"cause": "compute", "ranks": [21], "start": 5,
                                        "duration": 10, "severity": 1.5}])


@pytest.mark.parametrize("severity", [1.7, 2.3, 3.7])
def test_estimate_matches_injected_slowdown(severity: float) -> None:
    """§6: slow down rank 0 at three levels (measured 1.15 / 1.41 / 2.04 here; the paper's
    1.16 / 1.40 / 2.03); the estimate -- the original over the original with the top
    workers' stragglers removed -- must be within 3 % of the slowdown measured by simulating
    the job with and without the fault (same seed)."""
    faulty = _sim(faults=[{"cause": "compute", "ranks": [0], "severity": severity}])
    healthy = _sim()
    measured = faulty.truth.anomalies[0].slowdown          # vs the fault-free run, same seed
    assert measured is not None and measured > 1.1
    r = wi.whatif(_tables(faulty), faulty.meta)
    rh = wi.whatif(_tables(healthy), healthy.meta)
    assert r is not None and rh is not None
    assert r["t_actual_s"] / rh["t_actual_s"] == pytest.approx(measured, rel=0.01)
    detail = r["M_W_detail"]
    estimate = detail["tori"] / detail["trem"]
    assert r["slowdown_top_workers"] == pytest.approx(estimate)
    assert estimate == pytest.approx(measured, rel=0.03)
    assert r["workers"][0]["rank"] == 0 and detail["workers"][0]["rank"] == 0
    assert r["slowdown"] > rh["slowdown"]


def test_discrepancy_small_on_simulator_traces() -> None:
    """§6: the simulated original reproduces the traced step time (paper: 1.3 % median)."""
    values = []
    for i, preset in enumerate(("default", "gpipe", "cp", "link", "mixed")):
        res = simulate(scenario_from_dict({"preset": preset, "iterations": 10,
                                           "sampling": NO_SAMPLES}), i)
        r = wi.whatif(_tables(res), res.meta)
        assert r is not None, preset
        values.append(r["discrepancy"])
        assert r["discrepancy_steps"]["median"] < 0.015, preset
    assert float(np.median(values)) <= 0.015
    assert max(values) < 0.05


def test_no_stragglers_no_slowdown() -> None:
    """Without noise, imbalance or faults every operation of a type lasts the same: the ideal
    equals the original, which equals the trace."""
    res = _sim(timing={"last_stage_factor": 1.0, "launch_us": 0.0},
               noise={"compute_jitter": 0.0, "comm_jitter": 0.0, "seqlen_sigma": 0.0,
                      "gc_prob": 0.0, "clock_skew_ms": 0.0, "start_jitter_ms": 0.0})
    r = wi.whatif(_tables(res), res.meta)
    assert r is not None
    assert r["discrepancy"] < 1e-4
    assert r["slowdown"] == pytest.approx(1.0, abs=2e-3)
    assert max(r["by_op_type"].values()) == pytest.approx(1.0, abs=2e-3)


def test_default_attribution(default: SimResult) -> None:
    r = wi.whatif(_tables(default), default.meta)
    assert r is not None
    top = r["workers"][0]
    assert (top["pp"], top["dp"], top["ranks"]) == (1, 2, [20, 21])
    assert top["rank"] == 21               # the TP member that keeps its peer waiting
    assert r["worker_grid"][1][2] == pytest.approx(top["slowdown"], abs=1e-5)
    assert r["by_stage"]["1"] == max(r["by_stage"].values()) or r["by_stage"]["3"] > 1.03
    bt = r["by_op_type"]
    assert bt["forward-compute"] > 1.02 and bt["backward-compute"] > 1.02
    assert bt["tp-communication"] == pytest.approx(1.0, abs=0.01)
    assert r["M_S"] > 0.1                  # the 15 % heavier last stage (§5.2)
    steps = r["per_step"]
    faulty = np.mean([steps[str(s)] for s in range(5, 15)])
    clean = np.mean([steps[str(s)] for s in range(15, 20)])
    assert faulty > clean + 0.05           # §4.2: the fault shows in its steps only
    assert r["fwd_bwd_correlation"]["stage"] == 1
    assert r["fwd_bwd_correlation"]["r"] > 0.8          # per-micro-batch sequence lengths
    approx = np.asarray(r["worker_grid_approx"])
    assert np.unravel_index(np.argmax(approx), approx.shape) == (1, 2)
    json.dumps(r)


def test_op_duration_tensors(default: SimResult) -> None:
    ops = wi.build_ops(_tables(default), default.meta)
    t = ops.op_durations()
    assert t["forward-compute"].shape == (20, 8, 4, 8)     # [step, micro-batch, PP, DP]
    assert np.isnan(t["forward-recv"][:, :, 0]).all()      # stage 0 receives no activation
    assert not np.isnan(t["forward-recv"][:, :, 1:]).any()
    # transfer (not blocking) durations: a p2p message of 16 MiB over 25 GB/s
    fr = t["forward-recv"][:, :, 1:]
    assert 0.0005 < float(np.median(fr)) < 0.001
    span = default.tables["span"]
    recv = span.filter(pc.equal(span.column("op"), "forward-recv"))
    blocking = (np.asarray(recv.column("t_end")) - np.asarray(recv.column("t_start"))) / 1e9
    assert np.mean(blocking) > 2 * np.mean(fr)            # recvs wait for their sender
    # without coll rows: end minus the latest start of the pair, across node clocks
    no_coll = wi.build_ops({"span": span}, default.meta).op_durations()["forward-recv"]
    assert np.median(no_coll[:, :, 1:]) == pytest.approx(np.median(fr), rel=0.5)


def test_coll_only_derivation(default: SimResult) -> None:
    with_spans = wi.whatif(_tables(default), default.meta)
    coll_only = wi.whatif({"coll": default.tables["coll"]}, default.meta)
    assert with_spans is not None and coll_only is not None
    assert coll_only["source"] == "coll" and with_spans["source"] == "span"
    assert coll_only["slowdown"] == pytest.approx(with_spans["slowdown"], rel=0.02)
    assert coll_only["discrepancy"] < 0.015
    assert coll_only["workers"][0]["ranks"] == [20, 21]
    assert coll_only["workers"][0]["rank"] == 21
    for cat in ("forward-compute", "backward-compute", "pp-communication",
                "dp-communication"):
        assert coll_only["by_op_type"][cat] == pytest.approx(with_spans["by_op_type"][cat],
                                                             abs=0.02), cat
    ops = wi.build_ops({"coll": default.tables["coll"]}, default.meta)
    spans = wi.build_ops(_tables(default), default.meta)
    f_c = ops.op_durations()["forward-compute"]
    f_s = spans.op_durations()["forward-compute"][: f_c.shape[0]]
    assert np.nanmedian(np.abs(f_c[:, :, :3] - f_s[:, :, :3])) < 2e-5   # 20 us of 8 ms


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_coll_only_without_dp(schedule: str) -> None:
    """No params-sync to open the steps: the pipeline operations number them."""
    res = _sim(parallel={"tp": 2, "pp": 4, "dp": 1, "cp": 1}, schedule=schedule,
               faults=[{"cause": "compute", "ranks": [2], "severity": 1.5}])
    with_spans = wi.whatif(_tables(res), res.meta)
    coll_only = wi.whatif({"coll": res.tables["coll"]}, res.meta)
    assert with_spans is not None and coll_only is not None
    assert coll_only["slowdown"] == pytest.approx(with_spans["slowdown"], rel=0.01)
    assert coll_only["discrepancy"] < 0.01
    assert coll_only["workers"][0]["ranks"] == [2, 3] == with_spans["workers"][0]["ranks"]
    an = wi.WhatIfAnalyzer(res.meta, every_steps=4)
    outs = [o for _, b in replay({"coll": res.tables["coll"]}, 100_000_000)
            if (o := an.update(b)) is not None]
    assert len(outs) == 2 and an.error is None


def test_refuses_large_discrepancy(default: SimResult) -> None:
    """Untraced DP synchronization (as with NDTimeline's missing operations, §7): the
    simulated step is far shorter than the traced one, so the results are refused (§6)."""
    span = default.tables["span"]
    keep = pc.invert(pc.is_in(span.column("op"), pa.array(["params-sync", "grads-sync"])))
    tables = {"span": span.filter(keep)}
    with pytest.raises(wi.WhatIfRefused, match="discrepancy .* > 5%"):
        wi.analyze_tables(tables, default.meta)
    errors: list[str] = []
    assert wi.whatif(tables, default.meta, errors=errors) is None
    assert "simulation discrepancy" in errors[0]
    loose = wi.Options(max_discrepancy=0.5)
    r = wi.analyze_tables(tables, default.meta, loose)
    assert r["discrepancy"] > 0.05


def test_missing_inputs(default: SimResult) -> None:
    errors: list[str] = []
    assert wi.whatif({}, default.meta, errors=errors) is None
    assert "neither span nor coll" in errors[0]
    unknown = default.meta.__class__(**{**default.meta.__dict__, "schedule": "unknown"})
    assert wi.whatif({"coll": default.tables["coll"]}, unknown, errors=errors) is None
    assert "schedule" in errors[1]


def test_heatmaps(default: SimResult, tmp_path: Path) -> None:
    r = wi.whatif(_tables(default), default.meta)
    assert r is not None
    assert np.asarray(r["per_step_worker_grid"]).shape == (20, 4, 8)
    paths = wi.heatmaps(r, tmp_path / "png")
    assert [p.name for p in paths] == ["whatif-workers.png", "whatif-steps.png"]
    for p in paths:
        assert p.stat().st_size > 5000
        assert p.read_bytes()[:4] == b"\x89PNG"


def test_gc_pauses() -> None:
    """§5.4: GC pauses on any TP member; their cost is the simulated original with and
    without them, compared with simulating the job with and without GC (same seed)."""
    noise = {"gc_prob": 0.02, "gc_ms": [60.0, 80.0]}
    res = _sim(noise=noise)
    clean = _sim(noise={"gc_prob": 0.0})
    r = wi.whatif(_tables(res), res.meta)
    rc = wi.whatif(_tables(clean), clean.meta)
    assert r is not None and rc is not None
    gc = r["gc"]
    assert gc["source"] == "span" and gc["pauses"] > 5
    assert any(x % 2 for x in gc["ranks"]) and any(x % 2 == 0 for x in gc["ranks"])
    measured = r["t_actual_s"] / rc["t_actual_s"]
    assert measured > 1.05
    assert gc["slowdown"] == pytest.approx(measured, rel=0.03)
    coll_only = wi.whatif({"coll": res.tables["coll"]}, res.meta)
    assert coll_only is not None
    inferred = coll_only["gc"]
    assert inferred["source"] == "inferred" and inferred["pauses"] >= 1
    assert set(inferred["ranks"]) <= set(range(0, 64, 2))      # workers' first ranks


@pytest.mark.parametrize("kinds", [("span", "coll"), ("coll",)])
def test_stream_analyzer(default: SimResult, kinds: tuple[str, ...]) -> None:
    meta = default.meta
    an = wi.WhatIfAnalyzer(meta, every_steps=5)
    results = []
    for _, batch in replay(_tables(default, kinds), 100_000_000):
        out = an.update(batch)
        if out is not None:
            results.append(out)
    assert an.error is None
    assert len(results) == 3 and an.computed == 3          # steps 0-4, 5-9, 10-14
    assert results[0]["workers"][0]["rank"] != 21          # before the fault
    assert results[1]["workers"][0]["rank"] == 21
    assert results[1]["slowdown"] > results[0]["slowdown"] + 0.05
    assert max(results[1]["steps"]) - min(results[1]["steps"]) <= 4
    state = roundtrip(an.snapshot())
    again = wi.WhatIfAnalyzer(meta, every_steps=1)
    again.restore(state)
    assert again.result == an.result and again.every_steps == 5
    with pytest.raises(ValueError):
        again.restore({"version": 99})


def test_benchmark_runs_small() -> None:
    import argparse

    from failslow.bench.whatif import BENCHMARKS

    out = BENCHMARKS["whatif"](argparse.Namespace(json=True, scale=0.02))
    assert out["top_worker"] == out["injected_rank"]
    assert out["discrepancy"] < 0.015
    assert out["scaling_64_exact_seconds"] >= 0


def test_windowed_analysis_joined_mid_trace_waits_for_a_whole_window(default: SimResult
                                                                     ) -> None:
    """An analyzer that joins a running job (the offline input past its row budget, a
    processor started late) computes only once it holds a whole window of steps: its first
    result is not an error over an empty window."""
    windows = list(replay(_tables(default), 100_000_000))
    w = wi.WhatIfAnalyzer(default.meta, every_steps=4)
    errors = []
    for _, batch in windows[len(windows) // 3:]:
        before = w.computed
        w.update(batch)
        if w.computed > before and w.error:
            errors.append(w.error)
    assert w.computed >= 1
    assert errors == []
    assert w.result is not None


def test_lazy_analyzer_analyses_only_the_slowest_window_once(default: SimResult) -> None:
    """Offline keeps one result: the lazy analyzer cuts the eager one's windows and analyses
    the one with the largest mean step time once (the straggler's steps 5-14 here), with the
    eager analyzer's result for that window."""
    eager = wi.WhatIfAnalyzer(default.meta, every_steps=4)
    lazy = wi.WhatIfAnalyzer(default.meta, every_steps=4, lazy=True)
    results = []
    for _, batch in replay(_tables(default), 100_000_000):
        new = eager.update(batch)
        if new is not None:
            results.append(new)
        lazy.update(batch)
    assert len(results) >= 3 and lazy.computed == 0
    got = lazy.finish()
    assert lazy.computed == 1 and got is not None
    window = got.pop("window")
    assert window["chosen"] == "slowest"
    assert window["last_step"] >= 5 and window["first_step"] <= 14  # overlaps the fault
    assert got in results
    assert got["slowdown"] == max(r["slowdown"] for r in results)
