"""The link-rate detector: degraded links reported even when the job absorbs them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.snapshots import roundtrip

from failslow.bench import heldout as hg
from failslow.detectors.linkrate import LinkRateConfig
from failslow.engine.analyzer import JobAnalyzer
from failslow.engine.offline import run_analyzer
from failslow.events import parse_meta_row
from failslow.replay import replay
from failslow.simulator import scenario_from_dict, simulate

S, F = hg.Spec, hg.Fault
#: 128 ranks (tp4 pp4 dp8, 16 nodes), small DP buckets: a DP ring hop 2.4x / 4.2x slower
#: or a PP link 3x slower costs the job well under 1% (the pipeline absorbs it)
BIG = {"tp": 4, "pp": 4, "dp": 8, "microbatches": 8, "dp_bytes": 8 << 20, "fmt": "parquet"}
CASES = {
    "dp-2.4-linkrows": S(**BIG, iterations=30, link_rows=True, seed=101,
                         faults=[F("communication", 36, peer=40, start=12, factor=2.4)]),
    "dp-4.2-nolink": S(**BIG, iterations=30, seed=102,
                       faults=[F("communication", 36, peer=40, start=12, factor=4.2)]),
    "pp-3-after-straggler": S(**BIG, iterations=36, pp_bytes=16 << 20, seed=103,
                              faults=[F("compute", 100, start=6, factor=1.4),
                                      F("communication", 33, peer=65, start=20,
                                        factor=3.0)]),
}


def _tables(spec: hg.Spec) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    meta, tables, truth = hg.generate(spec)
    return parse_meta_row(meta), tables, truth


@pytest.fixture(scope="module")
def traces() -> dict[str, tuple[Any, dict[str, Any], dict[str, Any]]]:
    return {name: _tables(spec) for name, spec in CASES.items()}


def _linkrate(diag: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in diag["anomalies"] if a["id"].startswith("linkrate-")]


def test_open_count_is_a_binomial_tail() -> None:
    assert LinkRateConfig().open_count() == 3  # 3 of 4 windows at 5% chance < 1e-3
    assert LinkRateConfig(persist_windows=6).open_count() == 4  # 4 of 6
    assert LinkRateConfig(alpha=0.05).open_count() == 2


def test_absorbed_dp_ring_hop_named_by_its_queue(traces: dict[str, Any]) -> None:
    meta, tables, truth = traces["dp-2.4-linkrows"]
    assert truth["anomalies"][0]["slowdown"] < 1.01  # absorbed: under 1% of job time
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    found = _linkrate(diag)
    assert len(found) == 1 and len(diag["anomalies"]) == 1, diag["anomalies"]
    a = found[0]
    assert (a["kind"], a["cause"], a["comm_kind"], a["stage"]) == (
        "slow", "communication", "dp", "dp_sync")
    assert sorted(a["link"]) == a["ranks"] == [36, 40]
    assert a["severity"] == "info" and a["absorbed"] is True
    assert a["cost_fraction"] < 0.02 and abs(a["slowdown"] - 1) < 0.02
    assert a["link_slowdown"] > 1.8 and a["localized_by"] == "queue"
    scored = hg.score(truth, diag)
    assert scored["false_alarms"] == [] and scored["matches"][0]["link"] is True


@pytest.mark.parametrize("link_rows", [True, False])
def test_a_20_percent_drop_is_reported_and_the_queue_pins_the_hop(link_rows: bool) -> None:
    """A DP ring hop 1.75x slower (its transfers measure about 1.55x: latency is part of
    them), above MEGATRACE's 20% drop: with link rows the grown queue pins the hop among
    the ring's (all slower in coll timing, none by ``factor_without_queue_growth``);
    without them the ring is reported, with no link."""
    spec = S(**BIG, iterations=30, link_rows=link_rows, seed=111,
             faults=[F("communication", 36, peer=40, start=12, factor=1.75)])
    meta, tables, truth = _tables(spec)
    found = _linkrate(run_analyzer(meta, tables).diagnosis().to_dict())
    assert len(found) == 1, found
    a = found[0]
    assert 1.5 <= a["link_slowdown"] < 1.8 and a["severity"] == "info"
    if not link_rows:
        assert a["link"] is None and {36, 40} <= set(a["ranks"]) and a["why_no_link"]
        return
    assert sorted(a["link"]) == a["ranks"] == [36, 40] and a["localized_by"] == "queue"


def test_absorbed_dp_ring_without_link_rows_names_the_ring(traces: dict[str, Any]) -> None:
    """Without link rows every hop of the slow ring is slower in coll timing: the ring is
    reported, with no link and the reason."""
    meta, tables, _ = traces["dp-4.2-nolink"]
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    found = _linkrate(diag)
    assert len(found) == 1 and len(diag["anomalies"]) == 1, diag["anomalies"]
    a = found[0]
    assert a["link"] is None and a["comm_kind"] == "dp" and a["why_no_link"]
    assert {36, 40} <= set(a["ranks"]) and a["severity"] == "info"
    assert a["link_slowdown"] > 3.0


def test_slow_link_after_a_compute_straggler(traces: dict[str, Any]) -> None:
    meta, tables, truth = traces["pp-3-after-straggler"]
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    scored = hg.score(truth, diag)
    assert scored["false_alarms"] == [], scored
    assert all(m["found"] and m["cause"] and m["ranks"] for m in scored["matches"]), scored
    (a,) = _linkrate(diag)
    assert a["link"] == [33, 65] and a["comm_kind"] == "pp" and a["stage"] == "pp_p2p"
    assert a["severity"] == "info"
    # the reference is the job just before the link degraded (the straggler included)
    assert abs(a["slowdown"] - 1) < 0.02


def _reports(analyzer: JobAnalyzer, batches: list[Any]) -> list[dict[str, Any]]:
    out = []
    for now, batch in batches:
        for o in (analyzer.update(batch), analyzer.on_tick(now)):
            out += [a.to_dict() for a in o.anomalies]
    return out


def test_snapshot_restore_mid_trace_gives_the_same_reports(traces: dict[str, Any]) -> None:
    meta, tables, _ = traces["dp-2.4-linkrows"]
    batches = list(replay({k: v for k, v in tables.items() if k in ("coll", "link")}))
    whole = _reports(JobAnalyzer(meta), batches)
    cut = len(batches) * 2 // 5
    first = JobAnalyzer(meta)
    part = _reports(first, batches[:cut])
    state = roundtrip(first.snapshot())
    second = JobAnalyzer(meta)
    second.restore(state)
    part += _reports(second, batches[cut:])
    assert [a for a in whole if a["id"].startswith("linkrate-")]
    assert part == whole


@pytest.mark.parametrize("name", ["c-128-parquet-gc", "c-heavy-gc-64", "c-jitter-10pct",
                                  "c-bimodal-heavy", "c-skew-drift-parquet",
                                  "c-tp-cross-node-skew-drift", "c-long-gc-rank5-3s"])
def test_clean_heldout_runs_report_no_link(name: str) -> None:
    meta, tables, _ = _tables(hg.scenarios()[name])
    assert _linkrate(run_analyzer(meta, tables).diagnosis().to_dict()) == []


def test_simulator_healthy_and_gc_report_no_link() -> None:
    for over in ({}, {"noise": {"gc_prob": 0.02, "comm_jitter": 0.08}}):
        sc = scenario_from_dict({"preset": "healthy", **over})
        res = simulate(sc, seed=3)
        diag = run_analyzer(res.meta, res.tables).diagnosis().to_dict()
        assert diag["anomalies"] == []


def test_simulator_absorbed_pp_link_reported() -> None:
    """A node-level fault on the PP link node004-node006 (stage 2 -> 3), small activations:
    every PP pair over it slows; one anomaly names the first pair, severity info."""
    sc = scenario_from_dict({
        "preset": "healthy", "iterations": 40, "timing": {"pp_bytes": 4 << 20},
        "faults": [{"cause": "communication", "nodes": [4, 6], "start": 15,
                    "duration": 20, "severity": 3.0}]})
    res = simulate(sc, seed=1)
    truth = res.truth.to_dict()["anomalies"][0]
    diag = run_analyzer(res.meta, res.tables).diagnosis().to_dict()
    (a,) = _linkrate(diag)
    assert sorted(a["link"]) == sorted(truth["link"])
    assert a["severity"] == "info" and a["nodes"] == ["node004", "node006"]
    assert a["end_ns"] is not None and a["end_ns"] > a["start_ns"]


def test_slow_hop_of_a_dp_ring_inside_one_node_is_reported_unpinned() -> None:
    """A DP ring of four ranks on one node (NVLink), hop 1 -> 2 3x slower, absorbed: the
    ring's rates are judged like any link's; every hop inside the node is a distinct path
    that coll timing slows alike, so the anomaly names the ring with its hops as candidates
    and no link (not the lowest hop by convention)."""
    spec = S(tp=1, pp=2, dp=4, microbatches=4, dp_bytes=64 << 20, iterations=30, seed=111,
             faults=[F("communication", 1, peer=2, start=10, factor=3.0)])
    meta, tables, _ = _tables(spec)
    found = _linkrate(run_analyzer(meta, tables).diagnosis().to_dict())
    assert [(a["cause"], a["link"], a["comm_kind"], a["ranks"]) for a in found] == [
        ("communication", None, "dp", [0, 1, 2, 3])]
    assert [1, 2] in found[0]["link_candidates"] and len(found[0]["link_candidates"]) == 4
    assert "inside one node" in found[0]["why_no_link"]


def test_two_member_dp_group_inside_one_node_is_its_link() -> None:
    """A DP group of two ranks on one node, 3x slower: both ring directions are the one
    pair, so the link is named."""
    spec = S(tp=1, pp=4, dp=2, microbatches=4, dp_bytes=64 << 20, iterations=30, seed=112,
             faults=[F("communication", 2, peer=3, start=10, factor=3.0)])
    meta, tables, _ = _tables(spec)
    found = _linkrate(run_analyzer(meta, tables).diagnosis().to_dict())
    assert [(a["link"], a["ranks"]) for a in found] == [([2, 3], [2, 3])]


def test_ring_member_without_t_start_is_not_a_slow_hop() -> None:
    """Two compute stragglers in a 32-rank job whose DP rings each lie in one node, and a
    third of the end rows without ``t_start``: a member timed from its enter row waited for
    the stragglers, not for its link, so it takes its round's best rate and no link is
    reported (the slow-down detector names the stragglers)."""
    spec = S(tp=1, pp=4, dp=8, microbatches=8, iterations=31, dp_bytes=256 << 20,
             dp_mode="rs_ag", pp_comm="pair", missing_t_start=0.3, jitter_scale=0.03,
             seed=1453913678,
             faults=[F("compute", 0, start=9, end=20, factor=1.5),
                     F("compute", 20, start=9, end=20, factor=2.2)])
    meta, tables, _ = _tables(spec)
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    assert _linkrate(diag) == []
    assert [sorted(a["ranks"]) for a in diag["anomalies"]] == [[0, 20]]


def test_slow_pipeline_pair_inside_one_node_is_its_link() -> None:
    """Pipeline neighbours 1 and 2 on one node of a pipeline that spans two nodes (rank
    order pp, tp, dp; four GPUs a node), their send/recv 4x slower: a point-to-point pair
    is its own path, inside a node too, so the link is named."""
    spec = S(tp=1, pp=8, dp=4, microbatches=8, iterations=30, order=("pp", "tp", "dp"),
             gpus_per_node=4, pp_bytes=32 << 20, seed=2069,
             faults=[F("communication", 1, peer=2, start=10, end=22, factor=4.0)])
    meta, tables, _ = _tables(spec)
    found = _linkrate(run_analyzer(meta, tables).diagnosis().to_dict())
    assert [(a["link"], a["stage"]) for a in found] == [([1, 2], "pp_p2p")]


def test_a_link_the_slow_down_detector_cannot_name_is_reported_within_5_iterations() -> None:
    """``link-pp-5`` of the held-out suite (seed 3): a pipeline link 4.2x slower costs the
    job 2%, too little for the slow-down detector's change tracker to open a level, so only
    this detector reports it. Held back 10 windows for the slow-down detector, it came 7.7
    iterations after the onset; the issue's worst case is 5."""
    from failslow.bench.heldout_score import elapsed_iterations

    spec = S(tp=2, pp=2, dp=8, microbatches=2, iterations=30, order=("pp", "tp", "dp"),
             gpus_per_node=8, forward_ms=2.1665, backward_ratio=1.9189, last_stage=1.114,
             pp_bytes=32 << 20, dp_bytes=256 << 20, small_allreduce=True, jitter="bimodal",
             jitter_scale=0.0454, comm_jitter="lognormal", seqlen_sigma=0.0546,
             burst_prob=0.02, gc_prob=0.0, skew_ms=1.927, drift_ppm=80.89,
             missing_t_start=1.0, fmt="parquet", seed=206946903, job="heldout-link-pp-5",
             faults=[F("communication", 14, peer=15, start=10, end=21, factor=4.1889)])
    meta, tables, truth = _tables(spec)
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    (a,) = diag["anomalies"]
    assert (a["cause"], sorted(a["link"] or [])) == ("communication", [14, 15])
    assert elapsed_iterations(int(a["detected_ns"]), truth["anomalies"][0]) <= 5


def test_a_mixed_slow_down_without_a_link_covers_its_ring() -> None:
    """``mixed-0`` of the held-out suite (seed 1, scale 0.3): rank 0 computes 1.9x slower
    and its DP hop 24 -> 0 is 2.8x slower. The slow-down detector reports one mixed
    anomaly on rank 0 with the ring's hops as candidates. Rank 0's late entries also make
    hop 16 -> 24 look slow here; that ring is the mixed anomaly's, so no second anomaly
    names a wrong hop of it."""
    spec = S(tp=8, pp=1, dp=4, microbatches=2, iterations=29, order=("tp", "dp", "pp"),
             gpus_per_node=8, forward_ms=3.6956, backward_ratio=1.876, last_stage=1.1404,
             dp_bytes=256 << 20, jitter="pareto", jitter_scale=0.0401, comm_jitter="pareto",
             seqlen_sigma=0.051, burst_prob=0.0, gc_prob=0.0, skew_ms=4.763,
             drift_ppm=45.92, comms_in_meta=True, fmt="parquet", seed=1161581042,
             job="heldout-mixed-0",
             faults=[F("compute", 0, start=8, end=20, factor=1.8614),
                     F("communication", 24, peer=0, start=8, end=20, factor=2.7524)])
    meta, tables, _ = _tables(spec)
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    assert [(a["cause"], a["ranks"]) for a in diag["anomalies"]] == [("mixed", [0])]


def test_the_peers_of_a_link_between_nodes_are_links_between_nodes() -> None:
    """A pipeline hop between two nodes is several times slower than the NVLink hops of
    the same pipeline: compared with them it looked degraded from its first window, never
    learned its own baseline and was never judged. Its peer class is the hops that join
    two nodes; without node names every hop shares one class, as before."""
    from failslow.detectors.linkrate.samples import CommTable, LinkRegistry

    meta = parse_meta_row({"job": "j", "t": 0, "world_size": 4, "tp": 1, "pp": 4, "dp": 1,
                           "cp": 1, "microbatches": 4, "schedule": "1f1b",
                           "nodes": {"0": "a", "1": "a", "2": "b", "3": "b"},
                           "comms": [{"comm": 7, "kind": "pp", "ranks": [0, 1, 2, 3]}]})
    comms = CommTable(meta)  # the declared communicator is index 0
    keys = np.array([[0, 0, 1, -1, 1 << 26], [0, 1, 2, -1, 1 << 26], [0, 2, 3, -1, 1 << 26]])
    links = LinkRegistry(meta.nodes)
    ids = links.ids(keys, comms)
    cls = links.cls[ids]
    assert cls[0] == cls[2] != cls[1]
    blind = LinkRegistry()
    blind_ids = blind.ids(keys, comms)
    assert len(set(blind.cls[blind_ids].tolist())) == 1
    # a snapshot from before the node crossing was part of the class restores as 0
    old = blind.snapshot()
    old["cls"] = [[*k[:4], v] for k, v in blind.cls_index.items()]
    again = LinkRegistry(meta.nodes)
    again.restore(old)
    assert [k[4] for k in again.cls_index] == [0]


def test_ring_slowed_by_a_compute_straggler_in_it_is_not_a_link() -> None:
    """A GPU 2.4x slower in a tensor-parallel ring that spans two nodes, and no
    ``t_start`` in the end rows: every hop of its ring measures slower in coll timing (the
    ring reported as the node pair's link before). The slow-down detector names the rank;
    the ring's slowness is its compute anomaly's, not a slow link of its own (no queue
    singles a hop out)."""
    spec = S(tp=8, pp=1, dp=4, microbatches=4, gpus_per_node=4, iterations=30, seed=113,
             missing_t_start=1.0, faults=[F("compute", 6, start=10, factor=2.4)])
    meta, tables, truth = _tables(spec)
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    assert [(a["cause"], a["ranks"]) for a in diag["anomalies"]] == [("compute", [6])], \
        diag["anomalies"]
    assert hg.score(truth, diag)["false_alarms"] == []


def test_later_hops_of_a_ring_reported_without_a_link_join_its_report() -> None:
    """A DP ring hop 2x slower, absorbed, no link rows: every hop crossing nodes slows. The
    hops whose degraded windows reach the count first are reported as the ring (no link);
    one that reaches it a window later is the same fault and joins that report (same id,
    its hop among the candidates), not a second anomaly that names it as the link."""
    spec = S(tp=4, pp=4, dp=8, microbatches=4, iterations=29, order=("tp", "dp", "pp"),
             forward_ms=3.925, backward_ratio=2.058, last_stage=1.158, dp_bytes=64 << 20,
             dp_mode="allreduce", jitter="pareto", jitter_scale=0.0442,
             comm_jitter="lognormal", seqlen_sigma=0.0355, gc_prob=1 / 512, skew_ms=2.4,
             drift_ppm=87.7, comms_in_meta=False, seed=1069855683,
             faults=[F("communication", 126, peer=98, start=9, factor=2.07)])
    meta, tables, _ = _tables(spec)
    found = _linkrate(run_analyzer(meta, tables).diagnosis().to_dict())
    assert len(found) == 1, [(a["ranks"], a["link"], a["localized_by"]) for a in found]
    (a,) = found
    assert a["link"] is None and a["comm_kind"] == "dp"
    assert {98, 126} <= set(a["ranks"])
    assert any(sorted(h) == [98, 126] for h in a["link_candidates"])


def test_skipping_in_node_tensor_parallel_rows_changes_no_sample(traces: dict[str, Any]
                                                                 ) -> None:
    """The sampler leaves out the collectives of TP / CP groups within one node before it
    joins enter and end rows (most rows): every sample is the one the whole join gives."""
    from failslow.detectors.linkrate.samples import SampleExtractor

    meta, tables, _ = traces["dp-2.4-linkrows"]
    batches = [b["coll"] for _, b in replay({"coll": tables["coll"]}, 100_000_000)]
    config = LinkRateConfig()
    fast, whole = (SampleExtractor(meta, config.min_bytes, int(config.max_pending_s * 1e9))
                   for _ in range(2))
    members = whole._member_arrays

    def nothing_skipped() -> tuple[np.ndarray, ...]:
        *arrays, never = members()
        return (*arrays, np.zeros_like(never))

    whole._member_arrays = nothing_skipped  # type: ignore[method-assign]
    skipped = 0
    for coll in batches:
        a, b = fast.update(coll), whole.update(coll)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
        never = fast._member_arrays()[-1]
        skipped += int(never.any())
    assert skipped == len(batches)  # the tp4 groups lie within a node: they were skipped


def test_strong_count_is_the_chance_of_a_run() -> None:
    assert LinkRateConfig().strong_count() == 2  # 0.02 ** 2 = 4e-4 < 1e-3
    assert LinkRateConfig(strong_chance=0.05).strong_count() == 3  # 0.05 ** 3 = 1.25e-4
    assert LinkRateConfig(strong_chance=0.5).strong_count() == 4  # never past the window


def _dp_ring_256(seed: int) -> hg.Spec:
    """256 ranks (tp4 pp4 dp16), small DP buckets: a DP hop 2x slower costs the job about
    2% and no queue rows pin it, so only this detector reports it (a ring, no link)."""
    return S(tp=4, pp=4, dp=16, microbatches=8, iterations=24, order=("tp", "dp", "pp"),
             dp_bytes=32 << 20, pp_bytes=8 << 20, small_allreduce=True, seed=seed,
             faults=[F("communication", 36, peer=40, start=12, factor=2.0)])


@pytest.mark.parametrize("seed", [7, 8])
def test_an_absorbed_dp_link_at_256_ranks_is_reported_within_3_iterations(seed: int) -> None:
    """Issue 14, deliverable 6. The hop's rate is about 1.9x lower from the first window
    after the onset: two such windows in a row persist (``strong_count``), where 3 of 4
    degraded windows took a third (3.06 and 4.03 iterations before: seed 8 costs the job
    2.5%, and the report waited a window for the slow-down detector, which cannot confirm
    a change that small)."""
    from failslow.bench.heldout_score import elapsed_iterations

    meta, tables, truth = _tables(_dp_ring_256(seed))
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    (a,) = diag["anomalies"]
    assert a["id"].startswith("linkrate-") and a["comm_kind"] == "dp" and a["link"] is None
    assert {36, 40} <= set(a["ranks"]) and a["link_slowdown"] >= 1.5
    assert elapsed_iterations(int(a["detected_ns"]), truth["anomalies"][0]) <= 3


def test_the_least_job_slowdown_left_to_the_slowdown_detector_is_its_threshold() -> None:
    from failslow.detectors.slowdown import SlowdownConfig

    assert LinkRateConfig().min_job_slowdown == SlowdownConfig().change.threshold


def test_a_job_slow_down_is_left_to_the_slowdown_detector() -> None:
    """A strong run waits for the slow-down detector when it is localizing a job
    slow-down that began with the link, or when the job slowed down as its change tracker
    confirms: ``min_job_slowdown`` above its healthy level (the lower quartile of the
    iterations before) and ``stand_out_sigmas`` robust deviations (from successive
    differences) above it. A burst among the reference iterations, or a straggler that
    ended among them, hides nothing; noise and small slow-downs are the link's to report."""
    from failslow.detectors.linkrate import LinkRateDetector

    meta, _, _ = _tables(S(tp=1, pp=1, dp=4, iterations=3, seed=1))
    det = LinkRateDetector(meta)
    ms = 1_000_000
    det.width = 100 * ms
    ref = [100, 101, 99, 100, 102, 98, 100, 130, 101, 99]  # one burst at 130 ms

    def ahead(before: list[int], after: list[int], onsets: tuple[int, ...] = ()) -> bool:
        durs = [100] + before + after
        t0 = np.cumsum([0] + durs[:-1]) * ms
        det.iters = np.stack([t0, np.array(durs) * ms], axis=1).astype(np.int64)
        start = sum(durs[:len(before) + 1]) * ms
        return det._slowdown_ahead(start, [start + x * ms for x in onsets])

    assert ahead(ref, [110, 111, 109])  # 10% slower: far beyond the noise
    assert not ahead(ref, [103, 104, 103])  # 3%: under the change tracker's threshold
    assert not ahead(ref, [])  # no iteration since the onset yet
    assert ahead(ref, [], onsets=(-50,))  # the slow-down detector is localizing one
    assert not ahead(ref, [], onsets=(-150,))  # one that began well before the link
    # a 20% straggler that ended 3 iterations before: the link's 20% is still a slow-down
    assert ahead(ref + [120, 121, 119, 120, 100, 101, 99], [120, 121])
    # a noisy job: 6% slower is within its noise
    noisy = [100, 108, 95, 104, 97, 110, 93, 103, 99, 107]
    assert not ahead(noisy, [106, 105, 107])


def test_the_engine_shows_the_linkrate_detector_the_slowdowns_being_localized() -> None:
    from failslow.detectors.slowdown.levels import SlowLevel

    meta, _, _ = _tables(S(tp=1, pp=1, dp=4, iterations=3, seed=1))
    analyzer = JobAnalyzer(meta)
    slowdown, linkrate = analyzer.detectors["slowdown"], analyzer.linkrate
    assert linkrate is not None and linkrate.localizing() == []
    levels = slowdown.lifecycle.levels
    for t, state in ((5, "open"), (7, "pending")):
        levels.append(SlowLevel(anomaly={"start_ns": t}, onset_pos=0, ref_lo_ns=0,
                                ref_iter_ns=1.0, healthy_ns=1.0, state=state))
    assert linkrate.localizing() == [7]  # reported ones are known to it otherwise


def test_a_snapshot_from_before_the_strong_run_restores(traces: dict[str, Any]) -> None:
    """Links saved without their strong-run bits restore with none set: the strong run
    starts again, the 3-of-4 count goes on."""
    from failslow.detectors.linkrate import LinkRateDetector

    meta, tables, _ = traces["dp-4.2-nolink"]
    analyzer = JobAnalyzer(meta)
    for _, batch in replay({"coll": tables["coll"]}):
        analyzer.update(batch)
    assert analyzer.linkrate is not None and analyzer.linkrate.lk["strong"].any()
    state = roundtrip(analyzer.linkrate.snapshot())
    state["links"].pop("strong")
    again = LinkRateDetector(meta)
    again.restore(state)
    assert len(again.lk["strong"]) == len(again.lk["hist"]) > 0
    assert not again.lk["strong"].any()
    np.testing.assert_array_equal(again.lk["hist"], analyzer.linkrate.lk["hist"])


def test_a_ring_round_cut_by_the_window_edge_is_judged_whole() -> None:
    """Held-out seed 17 ``link-dp-1`` (tp8 pp8 dp4, 4 GPUs per node): the members of a DP
    ring round end within the ranks' clock skew of each other. Windows are an iteration
    long, so when a window's edge falls between those ends it does so iteration after
    iteration. A member alone before the edge took its own rate, its wait for the peers
    that entered later included (no ``t_start``), as the round's: the healthy hop
    176 -> 184 looked 1.57x and 2.88x slower in two windows in a row and was reported. A
    round is now judged in the window of its first member's end, all members together."""
    spec = S(tp=8, pp=8, dp=4, microbatches=8, iterations=26, order=("tp", "dp", "pp"),
             gpus_per_node=4, forward_ms=4.3133623992885255, backward_ratio=1.9626307155088702,
             last_stage=1.1148994761744164, dp_bytes=64 << 20, dp_mode="allreduce",
             pp_comm="pair", small_allreduce=True, jitter="lognormal",
             jitter_scale=0.04659225179390102, comm_jitter="pareto",
             seqlen_sigma=0.052314591884041355, gc_prob=0.0009765625,
             skew_ms=1.48785437255903, drift_ppm=46.523775798103664, missing_t_start=1.0,
             comms_in_meta=True, seed=1173646453, job="heldout-link-dp-1",
             faults=[F("communication", 253, peer=229, start=12, end=23,
                       factor=2.2081355803678533)])
    meta, tables, _ = _tables(spec)
    diag = run_analyzer(meta, tables).diagnosis().to_dict()
    assert [(a["cause"], sorted(a["ranks"])) for a in diag["anomalies"]] == [
        ("communication", [229, 237, 245, 253])]


def test_a_ring_round_is_timed_by_its_members_inside_a_node_too() -> None:
    """Held-out seed 5 ``clean-0`` (tp1 pp1 dp16 on two nodes, GC pauses, no ``t_start``):
    only two hops of the DP ring cross nodes (7 -> 8 and 15 -> 0), so only ranks 7 and 15
    gave link samples, each timed from its enter row. When a rank inside a node paused, both
    waited for it, the round's best rate was a wait, and the one node pair looked 2.3x
    slower: a link reported on a clean run. The members whose hop stays in the node time
    the round too (the paused one waited for no one), and nothing is reported."""
    spec = S(tp=1, pp=1, dp=16, microbatches=1, iterations=29, order=("tp", "dp", "pp"),
             forward_ms=3.895081067763906, backward_ratio=1.8457993145026268,
             last_stage=1.155049376268459, dp_bytes=256 << 20, jitter="pareto",
             jitter_scale=0.025866248076250258, comm_jitter="pareto",
             seqlen_sigma=0.04503052771568979, gc_prob=0.015625, skew_ms=1.0919132753044984,
             drift_ppm=70.79613431367153, missing_t_start=1.0, fmt="parquet",
             seed=1164251157, job="heldout-clean-0")
    meta, tables, _ = _tables(spec)
    assert run_analyzer(meta, tables).diagnosis().to_dict()["anomalies"] == []
