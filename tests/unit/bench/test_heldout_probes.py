"""Active validation probes on the held-out generator's cluster
(``failslow.bench.heldout_probes``): the simulated probes measure the generated network and
GPUs, and the held-out suite's jobs are diagnosed with them (issue 17 on issue 14's suite)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from failslow.bench import heldout as hg
from failslow.bench import heldout_probes as hp
from failslow.bench import heldout_suite as hs
from failslow.engine.probes import ProbeRequest, request_id

#: the held-out 16-rank DP ring over four nodes (four ranks each) of the validation bench:
#: hop 7 -> 8 crosses nodes 1 and 2
HOP = (7, 8)


def ring(faults: list[hg.Fault], iterations: int = 24) -> hg.Spec:
    return hg.Spec(tp=1, pp=1, dp=16, microbatches=1, gpus_per_node=4, iterations=iterations,
                   dp_bytes=512 << 20, link_rows=False, seed=7, faults=faults,
                   job="heldout-probe-test")


def cluster(spec: hg.Spec) -> hp.GeneratedCluster:
    keep: dict[str, Any] = {}
    hg.generate(spec, keep)
    return hp.GeneratedCluster(spec, keep)


def at_iteration(c: hp.GeneratedCluster, rank: int, it: int) -> int:
    """An observed time of ``rank``'s node in the middle of iteration ``it``."""
    lo, hi = c.ex.iter_start[it, rank], c.ex.iter_end[it, rank]
    return c.observed(rank, float(lo + hi) / 2)


def probe(c: hp.GeneratedCluster, kind: str, rank: int, peer: int | None, t: int,
          tag: str = "a") -> dict[str, Any]:
    lay = c.lay
    req = ProbeRequest(request_id(f"slow-{tag}", kind, rank, peer, "suspect"), c.spec.job, kind,
                       rank, lay.node_names[lay.node[rank]], peer,
                       None if peer is None else lay.node_names[lay.node[peer]])
    return c.answer(req, t)


def test_p2p_probe_measures_the_slow_path_slower_than_a_healthy_one() -> None:
    c = cluster(ring([hg.Fault("communication", *HOP[:1], peer=HOP[1], start=10, end=18,
                               factor=4.0)]))
    # asked in time order, as the engine asks (a node runs its probes one after another)
    before = probe(c, "p2p", HOP[0], HOP[1], at_iteration(c, HOP[0], 4), "b")
    during = at_iteration(c, HOP[0], 13)
    slow = probe(c, "p2p", HOP[0], HOP[1], during)
    healthy = probe(c, "p2p", 3, 4, during)
    after = probe(c, "p2p", HOP[0], HOP[1], at_iteration(c, HOP[0], 21), "c")
    for row in (slow, healthy, before, after):
        assert row["status"] == "ok", row
        assert row["bytes"] == c.p2p_bytes and row["duration_ns"] >= row["elapsed_ns"] > 0
        assert row["t"] > 0 and row["node"] in c.lay.node_names
    # the path 7 -> 8 is 4x slower only while the generator slows it
    assert slow["elapsed_ns"] > 2.5 * healthy["elapsed_ns"]
    assert slow["elapsed_ns"] > 2.5 * before["elapsed_ns"]
    assert after["elapsed_ns"] < 1.5 * before["elapsed_ns"]
    # a later run of the same probe has the earlier ones as its baseline
    assert before["baseline_ns"] is None and after["baseline_ns"] is not None
    assert c.stats.status["ok"] == 4 and c.stats.probe_s > 0


def test_gemm_probe_follows_the_generated_gpu() -> None:
    c = cluster(ring([hg.Fault("compute", 5, start=10, factor=3.0)]))
    t = at_iteration(c, 5, 14)
    slow, healthy = probe(c, "gemm", 5, None, t), probe(c, "gemm", 6, None, t)
    assert slow["status"] == healthy["status"] == "ok"
    assert slow["elapsed_ns"] > 2 * healthy["elapsed_ns"] and slow["bytes"] is None


def test_probe_past_its_deadline_times_out_and_waits_for_its_node() -> None:
    c = cluster(ring([]))
    t = at_iteration(c, HOP[0], 6)
    c.p2p_bytes = 1 << 40  # a terabyte: far past the 2 s deadline
    late = probe(c, "p2p", HOP[0], HOP[1], t)
    assert late["status"] == "timeout" and late["elapsed_ns"] is None and late["detail"]
    assert late["duration_ns"] <= 2e9 + 1
    c.p2p_bytes = 1 << 20
    queued = probe(c, "p2p", HOP[0], HOP[1], t, "q")  # same node: runs after the first
    assert queued["status"] == "ok" and queued["t"] > late["t"]


def test_probes_name_the_ring_hop_of_a_heldout_job_and_leave_a_clean_one_alone() -> None:
    slow = hs.Job("link-dp-ring", "link-dp", ring(
        [hg.Fault("communication", HOP[0], peer=HOP[1], start=10, factor=4.0)]),
        [hs.Unit("link-dp", "slow", "communication", sorted(HOP), [0], link=sorted(HOP),
                 stage="dp_sync")])
    clean = hs.Job("clean-ring", "clean", ring([]))
    res = [hs.run_job(slow), hs.run_job(clean)]
    [fault] = res[0]["faults"]
    assert fault["found"] and fault["got"]["link"] is None and fault["link"] is False
    [probed] = res[0]["with_probes"]["faults"]
    assert probed["found"] and probed["link"] is True and probed["got"]["link"] == sorted(HOP)
    assert res[0]["with_probes"]["probes_run"] >= 2
    assert res[0]["with_probes"]["named_by_probe"] == [sorted(HOP)]
    # the clean ring: no anomaly, so nothing to probe and nothing raised
    assert res[1]["anomalies"] == 0
    assert res[1]["with_probes"]["anomalies"] == 0 and not res[1]["with_probes"]["false_positives"]
    out = hs.summarize(res)
    fig = out["figures_with_probes"]
    assert out["figures"]["link_accuracy"] == 0.0  # without probes: as before
    assert fig["link_accuracy_with_probes"] == 1.0 and fig["healthy_probe_anomalies"] == 0
    assert fig["probes_run"] == res[0]["with_probes"]["probes_run"] and fig["probe_cost_s"] > 0
    assert out["floors_with_probes"]["link_accuracy_with_probes"]["pass"]
    assert "with probes" in hs.table({**out, "seed": 0, "scale": 0})


@pytest.mark.parametrize("rank", [0, 9])
def test_trace_and_probes_share_one_path_model(rank: int) -> None:
    """The trace's ring hops and the probes are timed by the same ``Executor.path``."""
    c = cluster(ring([hg.Fault("communication", rank, peer=rank + 1, start=3, factor=3.0)]))
    bw_slow, lat = c.ex.path(rank, rank + 1, 5)
    bw, lat2 = c.ex.path(rank, rank + 1, 1)
    assert lat == lat2 and np.isclose(bw / bw_slow, 3.0)


def test_rate_limits_refuse_a_probe_as_the_runner_does() -> None:
    spec = ring([])
    keep: dict[str, Any] = {}
    hg.generate(spec, keep)
    c = hp.GeneratedCluster(spec, keep, limits=(6.0, 12.0, 1.0))  # one probe, then 6/min
    t = at_iteration(c, HOP[0], 6)
    first, second = probe(c, "p2p", HOP[0], HOP[1], t), probe(c, "gemm", HOP[0], None, t)
    assert first["status"] == "ok"
    assert second["status"] == "skipped" and "rate limit" in second["detail"]
