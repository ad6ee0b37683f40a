"""The held-out accuracy suite (``failslow.bench.heldout_suite``): its draw, its scoring on
hand-made diagnoses and a shrunken run end to end. The detectors' floors are not asserted
here (only that every figure is computed and in range)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
import pytest

from failslow.bench import heldout as hg
from failslow.bench import heldout_score as hsc
from failslow.bench import heldout_suite as hs

SMALL = 0.05


def test_suite_draws_the_issue_s_ranges_and_follows_the_seed() -> None:
    jobs = hs.suite(1.0, seed=0)
    assert {j.family for j in jobs} == set(hs.FAMILIES)
    assert len(jobs) == sum(hs.FAMILIES.values())
    worlds = [j.world for j in jobs]
    assert min(worlds) == 16 and max(worlds) == 1024
    assert all(j.spec.dp <= 64 and j.spec.tp in (1, 2, 4, 8) and j.spec.pp in (1, 2, 4, 8)
               for j in jobs)
    pure = [j for j in jobs if j.spec.tp == j.spec.pp == 1]
    assert pure and any(j.family == "compute" for j in pure)
    assert {u.stage for j in jobs for u in j.units if u.family == "compute-pass"} <= {
        "forward", "backward"}
    mixed = [u for j in jobs for u in j.units if u.cause == "mixed"]
    assert mixed and all(u.link and u.ranks[0] in u.link for u in mixed)
    assert all(len(j.units) == 2 for j in jobs if j.family == "compute-then-link")
    assert all(len(j.units[0].ranks) == 2 for j in jobs if j.family == "two-stragglers")
    # the same seed draws the same suite; another seed another one
    again = hs.suite(1.0, seed=0)
    assert [(j.name, j.spec) for j in again] == [(j.name, j.spec) for j in jobs]
    other = hs.suite(1.0, seed=1)
    assert [j.spec for j in other] != [j.spec for j in jobs]
    assert [j.spec.seed for j in other] != [j.spec.seed for j in jobs]
    small = hs.suite(SMALL)
    assert len(small) == len(hs.FAMILIES) and max(j.world for j in small) <= 64


def _job(family: str) -> hs.Job:
    return next(j for j in hs.suite(SMALL, seed=3) if j.family == family)


def _perfect(job: hs.Job, truth: dict[str, Any]) -> dict[str, Any]:
    """A diagnosis that names every true fault exactly, one iteration after its onset."""
    out = []
    for u in hs.truth_units(job, truth):
        if u["kind"] == "hang" and not u["triggered"]:
            continue
        out.append({"kind": u["kind"], "cause": u["cause"], "ranks": list(u["ranks"]),
                    "link": u["link"], "stage": u["stage"], "start_ns": u["start_ns"],
                    "end_ns": u["end_ns"],
                    "detected_ns": u["start_ns"] + int((u["baseline_s"] or 0.1) * 1e9)})
    return {"anomalies": out}


@pytest.fixture(scope="module")
def generated() -> dict[str, tuple[hs.Job, dict[str, Any]]]:
    out = {}
    for family in ("compute-then-link", "two-stragglers", "mixed", "clean", "hang-h2"):
        job = _job(family)
        _, _, truth = hg.generate(job.spec)
        out[family] = (job, truth)
    return out


def _summary(generated: dict[str, tuple[hs.Job, dict[str, Any]]],
             diags: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    diags = diags or {}
    results = [hs.result(job, truth, diags.get(f) or _perfect(job, truth))
               for f, (job, truth) in generated.items()]
    return hs.summarize(results)


def test_perfect_diagnosis_scores_one(generated: dict[str, Any]) -> None:
    out = _summary(generated)
    fig = out["figures"]
    assert fig["slow_faults"] == 4 and fig["hang_faults"] == 1
    for key in ("slow_f1", "cause_accuracy", "exact_rank_accuracy", "link_accuracy",
                "stage_accuracy", "hang_f1", "hang_class_accuracy", "hang_root_accuracy"):
        assert fig[key] == 1.0, key
    # detected one baseline iteration after the onset: less than one (slow) iteration
    assert fig["latency_median_baseline_iterations"] == pytest.approx(1.0)
    assert 0 < fig["latency_median_iterations"] < 1.0
    assert fig["clean_run_anomalies"] == 0
    assert out["all_floors_pass"]
    assert set(out["floors"]) == set(hsc.FLOORS)
    assert out["families"]["mixed"]["link_accuracy"] == 1.0


def test_wrong_rank_set_lowers_exact_rank_accuracy(generated: dict[str, Any]) -> None:
    job, truth = generated["two-stragglers"]
    diag = _perfect(job, truth)
    diag["anomalies"][0]["ranks"] = diag["anomalies"][0]["ranks"][:1]  # one rank missed
    out = _summary(generated, {"two-stragglers": diag})
    fig = out["figures"]
    assert fig["slow_f1"] == 1.0 and fig["cause_accuracy"] == 1.0
    assert fig["exact_rank_accuracy"] == 0.75
    assert out["families"]["two-stragglers"]["exact_rank_accuracy"] == 0.0
    assert not out["floors"]["exact_rank_accuracy"]["pass"]


def test_links_a_trace_cannot_pin_are_counted_apart() -> None:
    """A slow hop of a DP ring inside a node (no link rows there) leaves no trace of which
    hop it was: every ring member ends each step together. Naming the ring instead of the
    pair lowers the link and exact-rank figures, not those where the trace can pin it."""
    import dataclasses
    import random

    def layout(job: hs.Job) -> hg.Layout:
        return hg.Layout(job.spec, random.Random(0))

    def intra_node(job: hs.Job) -> bool:
        a, b = job.units[0].link or (0, 0)
        return bool(layout(job).node[a] == layout(job).node[b])

    pp = next(j for j in hs.suite(1.0, 3) if j.family == "link-pp")
    dp = next(j for j in hs.suite(1.0, 3) if j.family == "link-dp" and intra_node(j))
    dp = dataclasses.replace(dp, spec=dataclasses.replace(dp.spec, link_rows=True))
    results = []
    for job, pinnable in ((pp, True), (dp, False)):
        _, _, truth = hg.generate(job.spec)
        unit = hs.truth_units(job, truth)[0]
        assert unit["pinnable"] is pinnable, job.name
        diag = _perfect(job, truth)
        if not pinnable:  # the ring, as the detector names it without a probe
            ring = next(m for _, kind, m in layout(job).comms
                        if kind == "dp" and set(unit["link"]) <= set(m))
            diag["anomalies"][0].update(link=None, ranks=sorted(ring))
        results.append(hs.result(job, truth, diag))
    fig = hs.summarize(results)["figures"]
    assert (fig["link_accuracy"], fig["exact_rank_accuracy"]) == (0.5, 0.5)
    assert fig["link_faults_pinnable"] == 1
    assert fig["link_accuracy_where_pinnable"] == 1.0
    assert fig["exact_rank_accuracy_where_pinnable"] == 1.0


def test_split_report_of_two_stragglers_is_one_find(generated: dict[str, Any]) -> None:
    job, truth = generated["two-stragglers"]
    diag = _perfect(job, truth)
    a = diag["anomalies"][0]
    b = copy.deepcopy(a)
    a["ranks"], b["ranks"] = a["ranks"][:1], a["ranks"][1:]
    diag["anomalies"].append(b)
    fig = _summary(generated, {"two-stragglers": diag})["figures"]
    assert fig["slow_false_positives"] == 0 and fig["exact_rank_accuracy"] == 1.0


def test_a_superseded_report_is_scored_as_the_one_that_took_it_over(
        generated: dict[str, Any]) -> None:
    """The link-rate detector reported the degraded link's ring while the job absorbed it;
    the slow-down detector named it later and the first report ended ``superseded_by`` the
    second: one report of one fault. Without that mark the wider report is a false alarm."""
    job, truth = generated["compute-then-link"]
    diag = _perfect(job, truth)
    link = next(a for a in diag["anomalies"] if a["link"])
    link["id"] = "slow-1"
    early = copy.deepcopy(link)
    early.update(id="linkrate-0", link=None, superseded_by="slow-1",
                 ranks=sorted(set(link["ranks"]) | {max(link["ranks"]) + 1000}),
                 detected_ns=link["detected_ns"] - 10**6)
    diag["anomalies"].append(early)
    fig = _summary(generated, {"compute-then-link": diag})["figures"]
    assert fig["slow_false_positives"] == 0 and fig["exact_rank_accuracy"] == 1.0
    assert fig["link_accuracy"] == 1.0

    def link_latency() -> float:
        rows = hs.result(job, truth, diag)["faults"]
        return next(f["latency_base_it"] for f in rows if f["true"]["link"])

    # the link was detected when the first report named it (a ring reported as a link,
    # taken over by a straggler in it, was not that)
    first = link_latency()
    early["cause"] = "compute"
    later = link_latency()
    assert first < later
    early["cause"] = link["cause"]
    del early["superseded_by"]
    fig = _summary(generated, {"compute-then-link": diag})["figures"]
    assert fig["slow_false_positives"] == 1


def test_a_fault_reported_twice_was_detected_at_its_first_report(
        generated: dict[str, Any]) -> None:
    """A degraded link reported early and briefly, then again later for longer (held-out
    seed 8 ``link-dp-1``): the longer report is matched to the fault and the early one is a
    split report of it; the fault was detected when the early one was made. A split report
    of another cause does not count."""
    job, truth = generated["compute-then-link"]
    diag = _perfect(job, truth)
    link = next(a for a in diag["anomalies"] if a["link"])
    base_ns = next(u["baseline_s"] for u in hs.truth_units(job, truth) if u["link"]) * 1e9
    early = copy.deepcopy(link)
    early.update(end_ns=link["start_ns"] + int(2 * base_ns))
    link.update(start_ns=link["start_ns"] + int(3 * base_ns),
                detected_ns=link["detected_ns"] + int(4 * base_ns))
    diag["anomalies"].append(early)

    def link_fault() -> dict[str, Any]:
        rows = hs.result(job, truth, diag)["faults"]
        return next(f for f in rows if f["true"]["link"])

    first = link_fault()
    assert first["split"] == 1 and first["link"]
    assert first["latency_base_it"] == pytest.approx(1.0)
    early["cause"] = "compute"
    assert link_fault()["latency_base_it"] == pytest.approx(5.0)


def test_clean_run_anomaly_is_a_false_positive(generated: dict[str, Any]) -> None:
    job, truth = generated["compute-then-link"]
    fake = copy.deepcopy(_perfect(job, truth)["anomalies"][0])
    out = _summary(generated, {"clean": {"anomalies": [fake]}})
    fig = out["figures"]
    assert fig["clean_run_anomalies"] == 1 and fig["slow_false_positives"] == 1
    assert fig["slow_precision"] == 0.8 and fig["slow_recall"] == 1.0
    assert not out["floors"]["clean_run_anomalies"]["pass"]
    assert not out["floors"]["slow_f1"]["pass"]


def test_misses_wrong_cause_link_and_hang_class(generated: dict[str, Any]) -> None:
    job, truth = generated["compute-then-link"]
    diag = _perfect(job, truth)
    diag["anomalies"] = [a for a in diag["anomalies"] if a["cause"] != "communication"]
    mjob, mtruth = generated["mixed"]
    mixed = _perfect(mjob, mtruth)
    mixed["anomalies"][0].update(cause="compute", link=None)  # the issue's mixed miss
    hjob, htruth = generated["hang-h2"]
    hang = _perfect(hjob, htruth)
    hang["anomalies"][0]["cause"] = "not_entered"
    out = _summary(generated, {"compute-then-link": diag, "mixed": mixed, "hang-h2": hang})
    fig = out["figures"]
    assert fig["slow_recall"] == 0.75 and fig["slow_precision"] == 1.0
    assert fig["cause_accuracy"] == pytest.approx(2 / 3, abs=1e-3)
    assert fig["link_accuracy"] == 0.0  # the mixed fault's link, the only link found
    assert fig["hang_f1"] == 1.0 and fig["hang_class_accuracy"] == 0.0
    assert out["families"]["compute-then-link"]["slow_recall"] == 0.5


def test_shrunken_suite_end_to_end() -> None:
    out = hs.heldout_suite(SMALL, seed=0)
    fig = out["figures"]
    assert fig["jobs"] == len(out["per_job"]) == len(hs.FAMILIES)
    assert fig["slow_faults"] >= 7 and fig["hang_faults"] == 3 and fig["clean_runs"] == 1
    ratios = ("slow_precision", "slow_recall", "slow_f1", "cause_accuracy",
              "exact_rank_accuracy", "link_accuracy", "stage_accuracy", "hang_precision",
              "hang_recall", "hang_f1", "hang_class_accuracy", "hang_root_accuracy")
    for key in ratios:
        assert fig[key] is None or 0.0 <= fig[key] <= 1.0, key
    assert fig["slow_f1"] is not None and fig["hang_f1"] is not None
    for key in ("latency_median_iterations", "latency_p95_iterations",
                "latency_max_iterations"):
        assert fig[key] is None or fig[key] >= -1.0, key
    assert fig["clean_run_anomalies"] >= 0
    assert set(out["floors"]) == set(hsc.FLOORS)
    assert all(isinstance(f["pass"], bool) for f in out["floors"].values())
    assert set(out["families"]) >= set(hs.FAMILIES) - {"link-dp"}
    text = hs.table(out)
    assert "slow_f1" in text and "two-stragglers" in text


def test_latency_counts_elapsed_iterations_not_baseline_times() -> None:
    """Detected half-way through the third iteration after the onset, each 2x the
    baseline: 2.5 iterations elapsed, 5 baseline iteration times."""
    base = 100_000_000
    t = {"start_ns": 0, "baseline_s": base / 1e9,
         "iteration_ends_ns": [2 * base, 4 * base, 6 * base]}
    assert hsc.elapsed_iterations(5 * base, t) == 2.5
    # past the last known end: the rest in baseline iterations
    assert hsc.elapsed_iterations(7 * base, t) == 4.0
    assert hsc.elapsed_iterations(base, {**t, "iteration_ends_ns": []}) == 1.0


def test_pipeline_stage_of_a_rank_follows_the_rank_order() -> None:
    job = {"shape": "tp2pp2dp2", "order": "tdp"}  # Megatron: tp fastest, then dp
    assert [hsc._stage_of(job, r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    job = {"shape": "tp2pp2dp2", "order": "tpd"}
    assert [hsc._stage_of(job, r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert hsc._stage_of({"shape": "tp4pp1dp2", "order": "tdp"}, 7) == 0
    assert hsc._stage_of({}, 3) is None


def test_deliverable_six_latencies_cover_their_faults_only() -> None:
    """Deliverable 6 of issue 14: the worst latency of compute faults confined to one
    pipeline stage, and of slow DP links in jobs of 256 ranks or more; a suite without
    such faults has no figure and fails no floor."""
    def fault(cause: str, ranks: list[int], stage: str | None, lat: float,
              found: bool = True) -> dict[str, Any]:
        return {"kind": "slow", "family": "f", "found": found, "marginal": False,
                "latency_it": lat, "true": {"cause": cause, "ranks": ranks, "stage": stage}}

    results = [
        {"shape": "tp2pp2dp2", "order": "tdp", "ranks": 8, "faults": [
            fault("compute", [5], "forward", 2.5), fault("compute", [1, 5], None, 9.0),
            fault("compute", [4], None, 7.0, found=False)]},
        {"shape": "tp2pp1dp4", "order": "tdp", "ranks": 8, "faults": [
            fault("compute", [3], None, 8.0)]},
        {"shape": "tp8pp4dp8", "order": "tdp", "ranks": 256, "faults": [
            fault("communication", [3, 67], "dp_sync", 3.5),
            fault("mixed", [3], "dp_sync", 6.0), fault("communication", [0, 64], "pp_p2p", 6.0)]},
        {"shape": "tp2pp2dp32", "order": "tdp", "ranks": 128, "faults": [
            fault("communication", [1, 3], "dp_sync", 6.0)]},
    ]
    assert hsc._latency_max_where(results, None, "stage_compute") == 2.5
    assert hsc._latency_max_where(results, None, "dp_link_256") == 3.5
    fig = {"latency_max_stage_compute_iterations": 2.5,
           "latency_max_dp_link_256_iterations": 3.5}
    got = hsc.floors(fig)
    assert got["latency_max_stage_compute_iterations"]["pass"]
    assert not got["latency_max_dp_link_256_iterations"]["pass"]
    none = hsc.floors({k: None for k in fig})
    assert none["latency_max_stage_compute_iterations"]["pass"]
    assert not none["slow_f1"]["pass"]


def test_a_fault_costs_what_it_slows_not_the_pauses_in_its_window() -> None:
    """A rank 1.08x slower for 12 iterations, with two host pauses of 80 ms (the whole job)
    in its window: the mean iteration time over the window is far above the healthy one,
    but the fault costs the job what the iterations no pause touched say, about the same
    as without the pauses."""
    fault = hg.Fault("compute", 5, start=10, end=22, factor=1.08)
    spec = hg.Spec(tp=2, pp=2, dp=2, iterations=30, jitter_scale=0.01, seed=7,
                   faults=[fault])
    paused = dataclasses.replace(spec, pauses=[(13, 0.08, ()), (17, 0.08, ())])
    (cost, _), (with_pauses, truth) = (
        (t["anomalies"][0]["slowdown"], t) for t in (hg.generate(s)[2] for s in (spec, paused)))
    assert 1.02 < cost < 1.08
    assert with_pauses == pytest.approx(cost, abs=0.01)
    # the mean over the window, pauses included, would say far more
    ends = np.array(truth["anomalies"][0]["iteration_ends_ns"], dtype=float)
    mean = float(np.mean(np.diff(ends)[:11])) / (truth["anomalies"][0]["baseline_s"] * 1e9)
    assert mean > cost + 0.1
