"""Slow-down detection on simulated jobs (failslow.simulator): no alarm on clean noisy runs,
CCL-D's R and P (§4.2.1-4.2.2) pointing at computation or communication, a second
slow-down during an open one, and GPU throttling attached as evidence (Greyhound §4)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from support.snapshots import roundtrip

from failslow.bench import accuracy
from failslow.detectors.slowdown import persistence_chance
from failslow.diagnosis import Anomaly
from failslow.engine.offline import KINDS, run_analyzer
from failslow.simulator import scenario_from_dict, simulate


def _case(name: str, seed: int | None = None) -> accuracy.CaseResult:
    case = next(c for c in accuracy.suite(1.0) if c.name == name)
    if seed is not None:
        case = dataclasses.replace(case, seed=seed)
    return accuracy.run_case(case)


def _diagnose(spec: dict[str, Any], seed: int = 0) -> tuple[list[Anomaly], list[Anomaly]]:
    sim = simulate(scenario_from_dict(spec, spec.get("job", "t")), seed)
    tables = {k: pa.concat_tables(list(sim.iter_tables(k))) for k in sim.kinds if k in KINDS}
    found = run_analyzer(sim.meta, tables).diagnosis().anomalies
    return found, sim.truth.anomalies


# ------------------------------------------------------------------------- clean noisy runs


@pytest.mark.parametrize(("name", "seed"), [("h64-all-noise", 103), ("h32-seqlen", 103),
                                          ("h64-comm-jitter", 100), ("h64-comm-jitter", 106)])
def test_clean_noisy_jobs_that_used_to_false_alarm(name: str, seed: int) -> None:
    """Seeds that raised a compute anomaly on a clean job: h64-all-noise (GC pauses,
    sequence lengths, jitter, heavy last stage) had a burst of slow iterations whose
    per-iteration roots were five to nine ranks each; after the burst was relieved without
    a persistent root the same stretch was proposed again and a rank named in three of those
    large sets passed. h32-seqlen named rank 19 among four and five ranks in two iterations.
    h64-comm-jitter (transfers jitter by 15%) had one DP ring 20-50% slower for three
    iterations: within its own noise, no slow link. Seed 106: a DP ring 25-50% slower over
    four iterations right after a four-iteration reference, with CCL-D's P at 0.54: its
    rounds lost as much time to late arrivals as to the transfer, no slow link (only
    P < alpha is communication)."""
    res = _case(name, seed)
    assert res.truth == [] and res.found == []


def test_persistence_chance_is_small_only_for_specific_roots() -> None:
    # one root in each of two iterations of a 64-rank job: unlikely by accident
    assert 64 * persistence_chance([1 / 64, 1 / 64], 2) < 0.05
    # one of four and one of five ranks named, 32 ranks: a common rank is likely
    assert 32 * persistence_chance([4 / 32, 5 / 32], 2) > 0.5
    # Poisson-binomial tail against a direct enumeration
    p = [0.2, 0.5, 0.1]
    direct = sum(np.prod([p[i] if b >> i & 1 else 1 - p[i] for i in range(3)])
                 for b in range(8) if bin(b).count("1") >= 2)
    assert persistence_chance(p, 2) == pytest.approx(direct)
    assert persistence_chance(p, 0) == pytest.approx(1.0)


# ------------------------------------------------------------------------- CCL-D R and P


def test_p_is_small_for_slow_links_and_large_for_stragglers() -> None:
    """CCL-D Eq. 4: with a slow link every member arrives on time and the extra time is
    transfer (P -> 0); with a straggler the last arrival explains it (P -> 1). R is the
    round's slow-down over T_base from the rounds before the anomaly: a 2x DP ring is ~1."""
    dp_link = _case("l64-tp2pp4dp8-dp-2")
    (m,) = dp_link.matches
    assert m["cause"] and m["got"]["P"] is not None and m["got"]["P"] < 0.4
    assert m["got"]["R"] == pytest.approx(1.0, abs=0.25)
    pp_link = _case("l16-tp2pp2dp4-pp-3")
    (m,) = pp_link.matches
    assert m["cause"] and m["got"]["P"] is not None and m["got"]["P"] < 0.4
    assert m["got"]["R"] is not None and m["got"]["R"] > 0.3
    comp = _case("c16-tp2pp2dp4-1.5")
    (m,) = comp.matches
    assert m["cause"] and m["got"]["P"] is not None and m["got"]["P"] > 0.6
    assert m["got"]["R"] is not None and m["got"]["R"] > 0.3


# ------------------------------------------------------------------------- two at once


def test_a_link_fault_during_an_open_compute_slowdown_is_its_own_anomaly() -> None:
    res = _case("x64-link-during-compute")
    assert res.false_positives == 0 and res.misses == 0 and len(res.matches) == 2
    by_cause = {m["got"]["cause"]: m for m in res.matches}
    assert set(by_cause) == {"compute", "communication"}
    assert by_cause["compute"]["ranks"] and by_cause["communication"]["link"]
    found = {f["id"]: f for f in res.found}
    comp = found[by_cause["compute"]["found"]]
    link = found[by_cause["communication"]["found"]]
    # the link fault opened while the compute one was open, and closed before it
    assert comp["detected_ns"] < link["detected_ns"] < comp["end_ns"]
    assert link["end_ns"] < comp["end_ns"]


# ------------------------------------------------------------------------- GPU evidence


def test_gpu_throttling_of_the_root_is_attached() -> None:
    spec = accuracy._job(2, 2, 4, faults=[{**accuracy._comp([5], 12, 12, 1.5),
                                          "gpu_throttle": True}])
    (a,), _ = _diagnose(spec)
    assert a.cause == "compute" and a.ranks == [5]
    (ev,) = a.extra["gpu"]["throttling"]
    assert ev["rank"] == 5 and ev["throttled"] >= 0.5
    assert ev["sm_clock_mhz"] < 0.9 * ev["baseline_sm_clock_mhz"]
    # the same straggler without throttling: no GPU evidence
    spec = accuracy._job(2, 2, 4, faults=[accuracy._comp([5], 12, 12, 1.5)])
    (a,), _ = _diagnose(spec)
    assert a.ranks == [5] and "gpu" not in a.extra


def test_sparse_gpu_samples_are_attached_when_the_anomaly_closes() -> None:
    """GPU samples every 3 s: none falls in the few iterations before the anomaly opens,
    so the opening report has no evidence; the closing report looks at the whole anomaly."""
    from failslow.engine.analyzer import JobAnalyzer
    from failslow.replay import replay

    spec = accuracy._job(2, 2, 4, faults=[{**accuracy._comp([5], 12, 12, 1.5),
                                          "gpu_throttle": True}])
    spec["sampling"]["gpu_ms"] = 3000.0
    sim = simulate(scenario_from_dict(spec, "gpu"), 0)
    tables = {k: pa.concat_tables(list(sim.iter_tables(k))) for k in sim.kinds if k in KINDS}
    analyzer = JobAnalyzer(sim.meta)
    reports = [a for _, b in replay(tables, 100_000_000) for a in analyzer.update(b).anomalies]
    opened, closed = reports
    assert opened.end_ns is None and "gpu" not in opened.extra
    assert closed.end_ns is not None and closed.ranks == [5]
    (ev,) = closed.extra["gpu"]["throttling"]
    assert ev["rank"] == 5 and ev["throttled"] == 1.0


# ------------------------------------------------------------------------- latency


def test_a_severe_straggler_is_confirmed_within_its_first_slow_iteration() -> None:
    """A 5x straggler makes its first slow iteration three healthy iterations long; its two
    halves name the same root, so the anomaly opens at that iteration's end instead of
    waiting for a second slow iteration (another three healthy iterations)."""
    res = _case("c32-tp2pp4dp4-5")
    (m,) = res.matches
    assert m["ranks"] and m["cause"]
    assert m["latency"] is not None and m["latency"] < 4.5


# ------------------------------------------------------------------------- streaming


def test_streaming_with_restarts_matches_offline() -> None:
    """The vectorized state (id maps, cached window sums, communicator lookup) gives the same
    reports whatever the batching, and across snapshot/restore through JSON."""

    from failslow.detectors.slowdown import SlowdownDetector
    from failslow.replay import replay

    spec = accuracy._job(2, 2, 4, iterations=30, timing={"pp_bytes": 96 << 20},
                         noise={"gc_prob": 0.01, "gc_ms": [30.0, 120.0]},
                         faults=[accuracy._comp([5], 8, 14, 1.4),
                                 accuracy._link(accuracy._pp_nodes(2, 4, 1), 14, 6, 4.0)])
    sim = simulate(scenario_from_dict(spec, "stream"), 1)
    tables = {k: pa.concat_tables(list(sim.iter_tables(k))) for k in sim.kinds if k in KINDS}

    def run(window_ns: int, restart_every: int = 0) -> list[dict[str, Any]]:
        det = SlowdownDetector(sim.meta)
        out = []
        for i, (_, batch) in enumerate(replay(tables, window_ns)):
            if restart_every and i % restart_every == restart_every - 1:
                state = roundtrip(det.snapshot())
                det = SlowdownDetector(sim.meta)
                det.restore(state)
            out += [a.to_dict() for a in det.update(batch)]
        return out

    offline = run(10**13)
    assert {a["cause"] for a in offline} >= {"compute", "communication"}
    assert run(37_000_000) == offline
    assert run(250_000_000, restart_every=3) == offline


def test_absorbed_straggler_is_a_root_only_when_it_stands_out() -> None:
    """A rank nobody waits on more (its extra compute fits in a pipeline bubble, or the
    job waits for a slower straggler instead) is named when its compute growth stands
    out; ranks that all grow alike (hosts blocking outside the library) are not."""
    from failslow.detectors.slowdown.compute import _absorbed
    from failslow.detectors.slowdown.config import SlowdownConfig

    c = SlowdownConfig()
    rw = np.arange(6)

    def named(excess: list[float], waited: list[bool]) -> list[int]:
        return _absorbed(rw[:len(excess)], np.array(excess), np.array(waited), c)

    # the job waits for rank 0; rank 1 grew 0.99 of the lost time, rank 2 (waited on as
    # rank 0's pipeline peer) 0.16
    assert named([1.7, 0.99, 0.16, 0.0, -0.1, -0.2], [True, False, True, False, False,
                                                        False]) == [1]
    # every rank that waits grows alike: nobody stands out
    assert named([1.0, 0.9, 0.85, 0.8], [False] * 4) == []
    # too small against the waited root
    assert named([1.7, 0.4, 0.1], [True, False, False]) == []
    # nobody waited on anyone, one rank grew three times more than the next
    assert named([2.0, 0.3, 0.2], [False, False, False]) == [0]
    assert named([2.0, 0.7, 0.2], [False, False, False]) == []
