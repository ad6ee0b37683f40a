"""A mixed slow-down whose slow rank is known but not its link (``link: null``, no candidate
hops): the engine asks for p2p probes on that rank's own inter-node hops."""

from __future__ import annotations

from failslow.diagnosis import Anomaly
from failslow.engine.probes import ProbeRequester
from failslow.events import Comm, JobMeta

#: 8 ranks, two per node (n0..n3); a DP ring over all of them and a TP pair on node n2
META = JobMeta(job="pj", t=0, world_size=8, tp=1, pp=1, dp=8, cp=1, microbatches=1,
               schedule="1f1b", nodes={r: f"n{r // 2}" for r in range(8)},
               comms=(Comm(1, "dp", tuple(range(8))), Comm(2, "tp", (4, 5))))


def test_mixed_anomaly_of_one_rank_asks_for_its_own_inter_node_hops() -> None:
    a = Anomaly("slow-0", "slow", "mixed", [5], None, comm=1)
    requests = ProbeRequester(META, frozenset({"pj"})).requests([a])
    p2p = sorted((r.rank, r.peer) for r in requests if r.probe == "p2p")
    # 5's DP neighbours are 4 (same node) and 6 (node n3): only the hop that leaves the node,
    # plus a reference pair elsewhere in the ring
    suspects = sorted((r.rank, r.peer) for r in requests
                      if r.probe == "p2p" and r.role == "suspect")
    assert suspects == [(5, 6)]
    assert len(p2p) == 2
    assert {r.probe for r in requests} == {"p2p", "gemm"}  # and its GPU, as before

