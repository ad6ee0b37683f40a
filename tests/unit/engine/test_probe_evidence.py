"""Active validation, job side (issue 17): which suspects are probed, and the probe rows
(run for real against endpoints on 127.0.0.1) as evidence on the engine's open anomalies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from failslow import events
from failslow.bench import heldout as hg
from failslow.collectors.probes import (
    GemmProbe,
    LinkShape,
    P2PProbe,
    ProbeEndpoint,
    ProbeRunner,
    RttProbe,
)
from failslow.collectors.probes.p2p import resolver
from failslow.collectors.probes.runner import rows_table
from failslow.diagnosis import Anomaly, validate
from failslow.engine.analyzer import JobAnalyzer
from failslow.engine.offline import run_analyzer
from failslow.engine.probes import ProbeRequest, ProbeRequester, apply_probe_evidence
from failslow.events import Comm, JobMeta
from failslow.tracedir import TraceDir

DP = 77
#: 8 ranks, two per node (n0..n3); one DP communicator over all of them
META = JobMeta(job="pj", t=0, world_size=8, tp=1, pp=1, dp=8, cp=1, microbatches=1,
               schedule="1f1b", nodes={r: f"n{r // 2}" for r in range(8)},
               comms=(Comm(DP, "dp", tuple(range(8))),))


def comm_anomaly(aid: str = "slow-0", ranks: list[int] | None = None, **extra: object
                 ) -> Anomaly:
    return Anomaly(aid, "slow", "communication", ranks or [1, 2], None, comm=DP,
                   comm_kind="dp", stage="dp_sync", start_ns=10, detected_ns=20,
                   slowdown=1.4, extra=dict(extra))


def compute_anomaly(aid: str = "slow-1", **extra: object) -> Anomaly:
    return Anomaly(aid, "slow", "compute", [5], None, comm=DP, comm_kind="dp", start_ns=10,
                   detected_ns=20, slowdown=1.2, extra=dict(extra))


def engine() -> JobAnalyzer:
    """The engine of META after one all-reduce of every rank (so every rank sent data)."""
    analyzer = JobAnalyzer(META)
    rows = [{"job": "pj", "rank": r, "comm": DP, "comm_rank": r, "comm_size": 8, "seq": 0,
             "op": "allreduce", "bytes": 1024, "peer": -1, "phase": ph, "t": 1000 + 10 * r + i}
            for r in range(8) for i, ph in enumerate(("enter", "end"))]
    analyzer.update({"coll": events.conform(pa.Table.from_pylist(rows), "coll")})
    return analyzer


def test_requests_only_for_unpinned_suspects_once_and_only_when_enabled() -> None:
    req = ProbeRequester(META, frozenset({"pj"}))
    pinned = comm_anomaly("slow-2")
    pinned.link = [1, 2]
    closed = comm_anomaly("slow-3")
    closed.end_ns = 30
    with_gpu = compute_anomaly("slow-4", gpu={"throttling": [{"rank": 5}]})
    out = req.requests([comm_anomaly(), compute_anomaly(), pinned, closed, with_gpu])
    got = sorted((r.probe, r.rank, r.peer, r.role) for r in out)
    # the unpinned pair, a reference pair on other nodes; the compute rank and a reference
    assert got == [("gemm", 0, None, "reference"), ("gemm", 5, None, "suspect"),
                   ("p2p", 1, 2, "suspect"), ("p2p", 5, 6, "reference")]
    p2p = next(r for r in out if r.probe == "p2p" and r.role == "suspect")
    assert (p2p.node, p2p.peer_node, p2p.job) == ("n0", "n1", "pj")
    assert req.requests([comm_anomaly(), compute_anomaly()]) == []  # once per suspect
    assert ProbeRequester(META).requests([comm_anomaly()]) == []  # off by default
    cand = comm_anomaly("slow-5", [0, 2, 4], candidate_nodes=[["n0", "n1"], ["n1", "n2"]])
    assert sorted((r.rank, r.peer) for r in ProbeRequester(META, frozenset({"*"})).requests(
        [cand])) == [(0, 2), (2, 4)]


@pytest.fixture
def endpoints() -> Iterator[dict[str, ProbeEndpoint]]:
    """Every node's endpoint; the link n0 -> n1 is slow."""
    eps = {f"n{i}": ProbeEndpoint(default=LinkShape(rate_bps=200e6), lifetime_s=120)
           for i in range(4)}
    eps["n1"].shape("n0", LinkShape(delay_s=0.02, rate_bps=20e6))
    try:
        yield eps
    finally:
        for e in eps.values():
            e.close()


def run_on_nodes(eps: dict[str, ProbeEndpoint], requests: list[ProbeRequest],
                 job: str = "pj") -> list[dict[str, Any]]:
    """Each request on a runner of its node (as the agents would)."""
    resolve = resolver({n: e.address for n, e in eps.items()})
    runners = {n: ProbeRunner(n, {"p2p": P2PProbe(n, resolve, 1 << 20)}, jobs={job})
               for n in eps}
    return [runners[r.node].run(r) for r in requests]


def test_engine_names_an_unpinned_link_from_probe_rows(
        endpoints: dict[str, ProbeEndpoint]) -> None:
    analyzer = engine()
    analyzer._record([comm_anomaly()])  # as a detector reports it: link null
    assert analyzer.diagnosis().anomalies[0].link is None
    requests = ProbeRequester(META, frozenset({"pj"})).requests(
        analyzer.diagnosis().anomalies)
    rows = run_on_nodes(endpoints, requests)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    out = analyzer.update({"probe": rows_table(rows)})
    assert [a.id for a in out.anomalies] == ["slow-0"]  # re-reported with the evidence
    diag = analyzer.diagnosis()
    a = diag.anomalies[0]
    assert a.link == [1, 2] and a.ranks == [1, 2] and a.cause == "communication"
    assert a.extra["probe"]["link_named_by"] == "p2p"
    assert a.extra["probe_cost"]["probes"] == 2
    validate(diag.to_dict())
    # the detector later re-reports (closes) it without a link: the evidence stays
    again = comm_anomaly()
    again.end_ns = 99
    analyzer._record([again])
    a = analyzer.diagnosis().anomalies[0]
    assert a.link == [1, 2] and a.end_ns == 99 and "probe" in a.extra
    # restored from a snapshot, the evidence is still there
    other = engine()
    other.restore(analyzer.snapshot())
    assert other.diagnosis().anomalies[0].link == [1, 2]


def test_engine_healthy_probes_name_nothing(endpoints: dict[str, ProbeEndpoint]) -> None:
    analyzer = engine()
    analyzer._record([comm_anomaly("slow-7", [2, 4])])
    requests = ProbeRequester(META, frozenset({"pj"})).requests(
        analyzer.diagnosis().anomalies)
    rows = run_on_nodes(endpoints, requests)
    assert all(r["status"] == "ok" for r in rows)
    analyzer.update({"probe": rows_table(rows)})
    a = analyzer.diagnosis().anomalies[0]
    assert a.link is None and a.ranks == [2, 4]
    assert a.extra["probe"]["verdict"] == "no probed pair is slower than its reference"


def test_gemm_confirms_a_slow_rank_and_clears_a_healthy_one() -> None:
    """A slower GPU is emulated by a larger multiply on the suspect (3.4x the work)."""
    req = ProbeRequester(META, frozenset({"pj"}))
    requests = req.requests([compute_anomaly("slow-8")])
    sizes = {5: 192, 0: 128}
    rows = [ProbeRunner(r.node, {"gemm": GemmProbe(n=sizes[r.rank], repeats=3, device="cpu")},
                        jobs={"pj"}).run(r) for r in requests]
    a = compute_anomaly("slow-8")
    apply_probe_evidence(a, rows)
    assert a.extra["probe"]["gpu_confirmed"] == [5] and a.ranks == [5]
    requests = ProbeRequester(META, frozenset({"pj"})).requests([compute_anomaly("slow-9")])
    rows = [ProbeRunner(r.node, {"gemm": GemmProbe(n=128, repeats=5, device="cpu")},
                        jobs={"pj"}).run(r) for r in requests]
    b = compute_anomaly("slow-9")
    apply_probe_evidence(b, rows)
    assert b.extra["probe"]["gpu_confirmed"] == [] and b.extra["probe"]["gpu_cleared"] == [5]


def test_rows_of_other_anomalies_are_ignored() -> None:
    a = comm_anomaly("slow-0")
    rows = [{"request": "slow-1/p2p/1/2/suspect", "probe": "p2p", "rank": 1, "peer": 2,
             "status": "ok", "duration_ns": 5, "elapsed_ns": 100, "bytes": 10}]
    assert apply_probe_evidence(a, rows) is False and "probe" not in a.extra


def test_probes_name_the_ring_hop_the_detectors_could_not(tmp_path: Path) -> None:
    """The held-out generator's slow ring hop without queue telemetry (one hop, 7 -> 8, of a
    16-rank DP ring over four nodes, 4x slower from iteration 12 on; the ring test of
    test_slowdown_heldout.py): the engine reports it with ``link: null``
    and four candidate hops. One p2p probe per candidate, on the node of its sender against
    endpoints whose link 7 -> 8 is shaped slow, names the hop."""
    spec = hg.Spec(tp=1, pp=1, dp=16, microbatches=1, gpus_per_node=4, iterations=30,
                   dp_bytes=512 << 20, link_rows=False, seed=7,
                   faults=[hg.Fault("communication", 7, peer=8, start=12, factor=4.0)])
    hg.write(spec, tmp_path)  # the hop stays slow to the trace's end: the anomaly is open
    td = TraceDir(tmp_path)
    meta = td.meta()
    analyzer = run_analyzer(meta, {k: td.read(k) for k in td.kinds})
    [found] = analyzer.diagnosis().anomalies
    assert (found.cause, found.link) == ("communication", None)
    requests = ProbeRequester(meta, frozenset({meta.job})).requests([found])
    assert sorted((r.rank, r.peer) for r in requests) == [(3, 4), (7, 8), (11, 12), (15, 0)]
    nodes = sorted(set(meta.nodes.values()))
    eps = {n: ProbeEndpoint(default=LinkShape(rate_bps=200e6), lifetime_s=120) for n in nodes}
    eps[meta.nodes[8]].shape(meta.nodes[7], LinkShape(delay_s=0.02, rate_bps=20e6))
    try:
        rows = run_on_nodes(eps, requests, meta.job)
    finally:
        for e in eps.values():
            e.close()
    assert [r["status"] for r in rows] == ["ok"] * 4
    analyzer.update({"probe": rows_table(rows)})
    diag = analyzer.diagnosis()
    [a] = diag.anomalies
    # the smallest set explaining it (diagnosis.md): the named link's ends, the candidates'
    # ranks kept in the evidence
    assert a.link == [7, 8] and a.ranks == [7, 8] and a.cause == "communication"
    assert a.extra["probe"]["ranks_before_probe"] == found.ranks
    assert a.extra["link_candidates"] == found.extra["link_candidates"]
    validate(diag.to_dict())


def test_hardware_hang_gets_zero_payload_round_trips(endpoints: dict[str, ProbeEndpoint]
                                                      ) -> None:
    """An H3 hang with two candidate hops: an rtt per hop; the hop whose peer does not answer
    within the deadline is recorded as such, and the diagnosis's link is left alone."""
    hang = Anomaly("hang-0", "hang", "hardware", [1, 2, 3, 4], None, comm=DP, comm_kind="dp",
                   start_ns=1, detected_ns=2, extra={"link_candidates": [[1, 2], [3, 4]]})
    requests = ProbeRequester(META, frozenset({"pj"}), deadline_s=0.3).requests([hang])
    assert [(r.probe, r.rank, r.peer) for r in requests] == [("rtt", 1, 2), ("rtt", 3, 4)]
    endpoints["n2"].shape("n1", LinkShape(delay_s=30.0))  # node n2 stops answering n1
    resolve = resolver({n: e.address for n, e in endpoints.items()})
    rows = [ProbeRunner(r.node, {"rtt": RttProbe(r.node, resolve)}, jobs={"pj"}).run(r)
            for r in requests]
    assert [r["status"] for r in rows] == ["ok", "timeout"]
    apply_probe_evidence(hang, rows)
    assert hang.link is None and hang.ranks == [1, 2, 3, 4]
    assert [(p["pair"], p["answered"]) for p in hang.extra["probe"]["rtt"]] == [
        ([1, 2], True), ([3, 4], False)]
