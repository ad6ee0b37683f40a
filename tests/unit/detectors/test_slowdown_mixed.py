"""Mixed slow-downs and simultaneous faults (CCL-D §4.2.2: S1 compute, S2 communication,
S3 mixed), on the simulator and on the independent held-out generator, at 32 to 256 ranks
and with seeds the detector was not tuned on:

* a rank that computes slower while its own inter-node link is slow is ONE anomaly, cause
  ``mixed``, ``ranks`` = that rank (not its link peer), ``link`` = the slow link's two ranks
  (the simulator's convention for a link between two nodes; the rank and its peer when the
  held-out generator slows that one rank pair);
* two stragglers slowed over the same iterations in different DP and PP groups, one much
  weaker than the other, are both named, exactly (one anomaly: both truths, the
  simulator's multi-rank fault and the held-out scorer, count them as one fault);
* a straggler and a slow link it does not use are two anomalies, compute and communication.

Only the slow-down detector's reports (``slow-*``) are checked: the link-rate detector
(``linkrate-*``) reports slow links on its own terms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from failslow.bench import heldout as hg
from failslow.bench.accuracy import _job
from failslow.engine.offline import analyze
from failslow.simulator import scenario_from_dict, simulate, write_sim

F = hg.Fault
GPN = 8


def _slowdowns(path: Path) -> list[dict[str, Any]]:
    found = analyze(path).to_dict()["anomalies"]
    return [a for a in found if str(a["id"]).startswith("slow-")]


def _heldout(spec: hg.Spec, path: Path) -> list[dict[str, Any]]:
    hg.write(spec, path)
    return _slowdowns(path)


def _mixed_faults(rank: int, peer: int, factor: float, link: float) -> list[hg.Fault]:
    """A compute fault on ``rank`` and a link fault on its own link to ``peer``, over the
    same iterations: the held-out generator's mixed slow-down."""
    return [F("compute", rank, start=12, end=30, factor=factor),
            F("communication", rank, peer=peer, start=12, end=30, factor=link)]


HELDOUT_MIXED = {
    # name: (spec, slow rank, its link peer)
    "dp-ring-hop-32": (hg.Spec(tp=2, dp=8, pp=2, faults=_mixed_faults(7, 9, 1.5, 3.0),
                               seed=311), 7, 9),
    "pp-64": (hg.Spec(tp=2, dp=8, pp=4, faults=_mixed_faults(13, 29, 1.5, 3.0), seed=312),
              13, 29),
    "pp-128": (hg.Spec(tp=4, dp=8, pp=4, faults=_mixed_faults(100, 68, 1.5, 3.0), seed=313),
               100, 68),
    "pp-last-stage-256": (hg.Spec(tp=8, dp=8, pp=4, faults=_mixed_faults(203, 139, 1.6, 3.0),
                                  seed=314), 203, 139),
}


@pytest.mark.parametrize("name", list(HELDOUT_MIXED))
def test_heldout_mixed_is_one_anomaly_on_the_slow_rank(name: str, tmp_path: Path) -> None:
    """The slow rank and its own slow link: one ``mixed`` anomaly naming the rank (not its
    link peer) and the link between them; R and P of the link's communicator."""
    spec, rank, peer = HELDOUT_MIXED[name]
    assert spec.world in (32, 64, 128, 256) and rank // GPN != peer // GPN
    found = _heldout(spec, tmp_path / name)
    assert [(a["kind"], a["cause"], a["ranks"], sorted(a["link"] or [])) for a in found] == [
        ("slow", "mixed", [rank], sorted([rank, peer]))], name
    assert found[0]["R"] is not None and found[0]["P"] is not None
    assert found[0]["end_ns"] is not None


SIM_MIXED = {
    # name: (tp, pp, dp, slow rank, severity, link severity, seed)
    "sim-32": (2, 4, 4, 13, 1.5, 4.0, 71),
    "sim-64": (2, 4, 8, 20, 1.4, 5.0, 72),
    "sim-128": (4, 4, 8, 45, 1.4, 3.0, 73),
    "sim-256": (4, 4, 16, 70, 1.5, 4.0, 74),
}


@pytest.mark.parametrize("name", list(SIM_MIXED))
def test_simulator_mixed_is_one_anomaly_on_the_slow_rank(name: str, tmp_path: Path) -> None:
    """The simulator's ``mixed`` fault: a rank computes slower and the link between its node
    and its next pipeline stage's node is slower. One ``mixed`` anomaly, ``ranks`` = the
    rank, ``link`` = the truth's pair (the simulator names a link between two nodes by its
    first pipeline pair, lower stage first) over the rank's own node."""
    tp, pp, dp, rank, sev, lsev, seed = SIM_MIXED[name]
    nodes = [rank // GPN, (rank + tp * dp) // GPN]
    spec = _job(tp, pp, dp, mb=8 if tp * pp * dp >= 128 else None,
                timing={"pp_bytes": 64 << 20},
                faults=[{"cause": "mixed", "ranks": [rank], "nodes": nodes, "start": 12,
                         "duration": 12, "severity": sev, "link_severity": lsev}])
    spec["job"] = f"mixed-{name}"
    result = simulate(scenario_from_dict(spec, name), seed)
    write_sim(result, tmp_path / name, "parquet")
    truth = [a for a in result.truth.anomalies if a.kind == "slow"]
    assert [(t.cause, t.ranks) for t in truth] == [("mixed", [rank])]
    found = _slowdowns(tmp_path / name)
    assert [(a["cause"], a["ranks"], sorted(a["link"] or [])) for a in found] == [
        ("mixed", [rank], sorted(truth[0].link or []))], name
    assert rank // GPN in {r // GPN for r in found[0]["link"]}


def test_two_stragglers_in_different_groups_are_both_named(tmp_path: Path) -> None:
    """Rank 5 (stage 0) computes 2x slower and rank 26 (stage 1, another DP and PP group)
    1.3x slower over the same iterations: the stronger one partly hides the weaker one,
    whose share of the lost time stays small, but it stands out of every other rank and
    is named too."""
    spec = hg.Spec(tp=2, dp=8, pp=2, seed=321,
                   faults=[F("compute", 5, start=12, end=30, factor=2.0),
                           F("compute", 26, start=12, end=30, factor=1.3)])
    found = _heldout(spec, tmp_path / "two")
    assert [(a["cause"], sorted(a["ranks"])) for a in found] == [("compute", [5, 26])]


def test_two_simulated_stragglers_in_different_groups(tmp_path: Path) -> None:
    """The simulator's two-rank compute fault, ranks in different stages, DP groups and
    pipelines of a 128-rank job: one anomaly naming exactly both."""
    spec = _job(4, 4, 8, mb=8, faults=[{"cause": "compute", "ranks": [21, 90], "start": 12,
                                        "duration": 12, "severity": 1.4}])
    spec["job"] = "two-stragglers"
    result = simulate(scenario_from_dict(spec, "two"), 75)
    write_sim(result, tmp_path / "two", "parquet")
    found = _slowdowns(tmp_path / "two")
    assert [(a["cause"], sorted(a["ranks"])) for a in found] == [("compute", [21, 90])]


def test_straggler_and_unrelated_link_are_two_anomalies(tmp_path: Path) -> None:
    """Rank 40 (stage 2) computes 1.6x slower while the link 3-19 (another pipeline,
    stages 0-1) is 3x slower: the link has no end on the slow rank, so these are two
    faults, a compute anomaly on 40 and a communication anomaly on 3-19, not one mixed."""
    spec = hg.Spec(tp=2, dp=8, pp=4, pp_bytes=64 << 20, seed=331,
                   faults=[F("compute", 40, start=12, end=30, factor=1.6),
                           F("communication", 3, peer=19, start=12, end=30, factor=3.0)])
    found = _heldout(spec, tmp_path / "apart")
    got = sorted((a["cause"], a["ranks"], sorted(a["link"] or [])) for a in found)
    assert got == [("communication", [3, 19], [3, 19]), ("compute", [40], [])]
    assert len({a["id"] for a in found}) == 2


def test_a_mixed_fault_whose_ring_sync_shows_an_iteration_late(tmp_path: Path) -> None:
    """``mixed-0`` of the held-out suite (seed 1): rank 17 of a tp8 dp4 job computes 1.65x
    slower and its DP ring hop to rank 25 is 3.6x slower, without ``link`` rows. The
    ring's one round per iteration in the onset window was the last healthy one, so its
    slowness persists from the second slow window with a round on, one iteration after
    the rank's; the anomaly opened as ``compute`` and was never refined to ``mixed``
    (a slow group from the third slow iteration on counted as a later fault of its own).
    Now: ``mixed`` on rank 17, its DP sync, the hop unknown (a ring hop is not pinned
    without ``link`` rows or a probe)."""
    spec = hg.Spec(tp=8, pp=1, dp=4, iterations=34, order=("tp", "pp", "dp"),
                   forward_ms=3.1955, backward_ratio=1.94, last_stage=1.0949,
                   pp_comm="pair", jitter="pareto", jitter_scale=0.04232,
                   seqlen_sigma=0.02542, gc_prob=0.003125, skew_ms=4.4774, drift_ppm=63.57,
                   comms_in_meta=True, seed=595721713, job="heldout-mixed-0",
                   faults=[F("compute", 17, start=12, end=23, factor=1.6538, microbatch=1),
                           F("communication", 17, peer=25, start=12, end=23, factor=3.5937,
                             microbatch=1)])
    found = _heldout(spec, tmp_path / "ring")
    assert [(a["cause"], a["ranks"], a["stage"]) for a in found] == [
        ("mixed", [17], "dp_sync")]


def test_a_mixed_fault_whose_slow_rank_shows_an_iteration_after_its_link(
        tmp_path: Path) -> None:
    """``mixed-1`` of the held-out suite (seed 0): rank 18 computes 1.6x slower and its
    DP link to rank 14 (another node) is 3.2x slower. The link persists from the second
    slow iteration, rank 18 as a compute root from the fourth: it was reported as a
    ``communication`` anomaly on the link's two ends, and rank 18 counted as a later
    fault. An end of the open anomaly's link may start one iteration later: one ``mixed``
    anomaly on rank 18 and the link 14-18 (the diagnosis keeps one entry per id)."""
    spec = hg.Spec(tp=4, dp=8, microbatches=2, iterations=30, gpus_per_node=4,
                   forward_ms=4.6218, backward_ratio=1.9335, last_stage=1.1932,
                   jitter="uniform", jitter_scale=0.048, comm_jitter="lognormal",
                   seqlen_sigma=0.04819, gc_prob=0.00390625, skew_ms=4.6384, drift_ppm=99.79,
                   missing_t_start=1.0, comms_in_meta=True, fmt="parquet", link_rows=True,
                   seed=1106960269, job="heldout-mixed-1",
                   faults=[F("compute", 18, start=11, end=22, factor=1.5924, microbatch=1),
                           F("communication", 14, peer=18, start=11, end=22, factor=3.2182,
                             microbatch=1)])
    found = _heldout(spec, tmp_path / "link")
    assert [(a["cause"], a["ranks"], sorted(a["link"] or []), a["stage"]) for a in found] == [
        ("mixed", [18], [14, 18], "dp_sync")]


def test_a_root_off_the_open_links_ends_does_not_make_it_mixed(tmp_path: Path) -> None:
    """``link-pp-1`` of the held-out suite (seed 1): the link 20-21 of a tp4 pp2 dp8 job is
    4.5x slower, with ``link`` rows. The anomaly opened as ``communication`` on the link's
    two ends; a later iteration's window then showed rank 58, on neither end, as a
    persistent compute root, and the refine turned the anomaly into ``mixed`` on rank 58
    although the localizer had found that root independent of the link. A root off the
    link is a second fault, never the compute side of this one: the anomaly stays
    ``communication`` on the link."""
    spec = hg.Spec(tp=4, dp=8, microbatches=2, iterations=29, order=("pp", "tp", "dp"),
                   forward_ms=2.1728, backward_ratio=2.0263, last_stage=1.1634,
                   pp_bytes=67108864, dp_mode="rs_ag", jitter="pareto",
                   jitter_scale=0.02997, comm_jitter="lognormal", seqlen_sigma=0.04644,
                   gc_prob=0.0015625, skew_ms=1.0894, drift_ppm=23.77, missing_t_start=0.3,
                   comms_in_meta=True, link_rows=True, seed=1587053590,
                   job="heldout-link-pp-1",
                   faults=[F("communication", 20, peer=21, start=8, end=19, factor=4.482,
                             microbatch=1)])
    found = _heldout(spec, tmp_path / "pp")
    assert [(a["cause"], a["ranks"], sorted(a["link"] or [])) for a in found] == [
        ("communication", [20, 21], [20, 21])]


def test_a_mixed_fault_that_starts_while_the_ranks_learn_their_period(
        tmp_path: Path) -> None:
    """``mixed-2`` of the held-out suite (seed 1): tp8 dp2, 5 collectives per iteration,
    rank 15 computes 1.8x slower and its DP link to rank 7 is 2.5x slower from iteration
    11, before the ranks have the 96 calls they learn their period from. Rank 7 learned
    last; the median of its period's duration (mostly slow iterations) was 1.6x the median
    of the reference's iterations (mostly healthy ones), so it was taken for a rank of a
    longer period: every other rank learned again, and the job had no iteration and no
    anomaly. Counted over the same stretch of time, both have the same iterations."""
    spec = hg.Spec(tp=8, pp=1, dp=2, microbatches=1, iterations=32, forward_ms=4.2235,
                   backward_ratio=2.025, last_stage=1.0634, jitter="pareto",
                   jitter_scale=0.02415, seqlen_sigma=0.03167, burst_prob=0.02,
                   gc_prob=0.015625, skew_ms=1.6576, drift_ppm=52.82, missing_t_start=0.3,
                   fmt="parquet", seed=1452417163, job="heldout-mixed-2",
                   faults=[F("compute", 15, start=11, end=23, factor=1.8231, microbatch=1),
                           F("communication", 15, peer=7, start=11, end=23, factor=2.5023,
                             microbatch=1)])
    path = tmp_path / "learning"
    hg.write(spec, path)
    diag = analyze(path).to_dict()
    assert diag["iterations"]["count"] >= 30
    found = [a for a in diag["anomalies"] if str(a["id"]).startswith("slow-")]
    assert [(a["cause"], a["ranks"], sorted(a["link"] or [])) for a in found] == [
        ("mixed", [15], [7, 15])]


@pytest.mark.parametrize("case", ["seed-7", "seed-0"])
def test_ranks_slowest_in_healthy_iterations_are_no_persistent_root(tmp_path: Path,
                                                                   case: str) -> None:
    """``link-pp-3`` of the held-out suite (seeds 7 and 0): a pipeline link 1.8x / 4.4x
    slower, which the pipeline mostly absorbs (the link-rate detector reports it). The slow
    level the change tracker opened fell back to the healthy time after two or three
    iterations; ranks of the last stage, always among the slowest, were named in every
    one of those healthy iterations and were reported as a compute slow-down (rank 59;
    ranks 0, 2, 5). An iteration no slower than the level below is now no hit for any rank."""
    common = {"iterations": 28, "order": ("pp", "tp", "dp"), "jitter": "pareto",
              "burst_prob": 0.02, "missing_t_start": 0.3 if case == "seed-7" else 1.0,
              "fmt": "parquet", "job": "heldout-link-pp-3"}
    spec = hg.Spec(tp=4, pp=4, dp=4, microbatches=8, forward_ms=4.57019599219964,
                   backward_ratio=2.0398578521154547, last_stage=1.1363217936073327,
                   pp_bytes=32 << 20, dp_mode="rs_ag", jitter_scale=0.03689614420748491,
                   seqlen_sigma=0.011741469963007402, gc_prob=0.0015625,
                   skew_ms=4.744305443600794, drift_ppm=73.93805426102487, link_rows=True,
                   seed=1046441034, **common,
                   faults=[F("communication", 26, peer=27, start=8, end=16,
                             factor=1.8272203451868279, comm="tp", microbatch=1,
                             mismatch="bytes")]) if case == "seed-7" else hg.Spec(
        tp=2, pp=2, dp=4, microbatches=4, forward_ms=3.852981591973623,
        backward_ratio=1.9095112432401458, last_stage=1.0144375645298835, pp_bytes=128 << 20,
        small_allreduce=True, jitter_scale=0.049292312692067936, comm_jitter="lognormal",
        seqlen_sigma=0.05273304413810289, gc_prob=0.015625, skew_ms=1.3741566149679607,
        drift_ppm=49.57215808810551, seed=1060186814, **common,
        faults=[F("communication", 14, peer=15, start=8, end=16, factor=4.425777570004875,
                  comm="tp", microbatch=1, mismatch="bytes")])
    path = tmp_path / case
    hg.write(spec, path)
    diag = analyze(path).to_dict()
    link = [14, 15] if case == "seed-0" else [26, 27]
    assert [(a["cause"], sorted(a["link"] or [])) for a in diag["anomalies"]] == [
        ("communication", link)]
