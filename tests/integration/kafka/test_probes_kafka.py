"""Active validation over the real broker (issue 17): the job side publishes probe requests on
``failslow.probe-requests``, a node agent (``Agent`` + ``ProbeService``) runs those of its
node against probe endpoints on 127.0.0.1 and publishes ``probe`` rows on ``failslow.probe``;
they decode and name the slow link on the engine's open anomaly."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow import events
from failslow.collectors.agent import Agent, TransportSink
from failslow.collectors.probes import LinkShape, P2PProbe, ProbeEndpoint, ProbeRunner
from failslow.collectors.probes.p2p import resolver
from failslow.collectors.probes.requests import KafkaRequests, ensure_topic, publish_requests
from failslow.collectors.probes.runner import ProbeService
from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import JobAnalyzer
from failslow.engine.probes import ProbeRequest, ProbeRequester
from failslow.events import Comm, JobMeta
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import decode, topic_for

META = JobMeta(job="kj", t=0, world_size=4, tp=1, pp=1, dp=4, cp=1, microbatches=1,
               schedule="1f1b", nodes={0: "n0", 1: "n1", 2: "n2", 3: "n3"},
               comms=(Comm(5, "dp", (0, 1, 2, 3)),))


def test_probe_requests_and_rows_over_kafka(broker: Any, tmp_path: Path) -> None:
    pfx = f"pr{uuid.uuid4().hex[:8]}."
    eps = {n: ProbeEndpoint(default=LinkShape(rate_bps=200e6), lifetime_s=300)
           for n in ("n1", "n2")}
    eps["n1"].shape("n0", LinkShape(delay_s=0.02, rate_bps=20e6))  # the link n0 -> n1
    analyzer = JobAnalyzer(META)
    coll = [{"job": "kj", "rank": r, "comm": 5, "comm_rank": r, "comm_size": 4, "seq": 0,
             "op": "allreduce", "bytes": 64, "peer": -1, "phase": ph, "t": 100 + r * 10 + i}
            for r in range(4) for i, ph in enumerate(("enter", "end"))]
    analyzer.update({"coll": events.conform(pa.Table.from_pylist(coll), "coll")})
    analyzer._record([Anomaly("slow-0", "slow", "communication", [0, 1, 2], None, comm=5,
                              comm_kind="dp", start_ns=1, detected_ns=2)])
    requests = ProbeRequester(META, frozenset({"kj"})).requests(
        analyzer.diagnosis().anomalies)
    assert sorted((r.rank, r.peer) for r in requests) == [(0, 1), (1, 2)]
    # only node n0's agent runs here: its request, and one more of its own for the pair n0-n2
    mine = [r for r in requests if r.node == "n0"]
    mine.append(ProbeRequest("slow-0/p2p/0/2/reference", "kj", "p2p", 0, "n0", 2, "n2",
                             role="reference"))
    publisher = KafkaTransport(broker.bootstrap, topic_prefix=pfx, subscribe=())
    source = KafkaRequests(broker.bootstrap, "n0", topic_prefix=pfx,
                           auto_offset_reset="earliest")
    agent = Agent(TransportSink(KafkaTransport(broker.bootstrap, topic_prefix=pfx,
                                               subscribe=())),
                  tmp_path, node="n0", collectors={"gpu": False, "rdma": False})
    resolve = resolver({n: e.address for n, e in eps.items()})
    service = ProbeService("n0", source, ProbeRunner(
        "n0", {"p2p": P2PProbe("n0", resolve, 1 << 20)}, jobs={"kj"}))
    agent.probes = service
    consumer = KafkaTransport(broker.bootstrap, topic_prefix=pfx, produce=False,
                              group_id=f"g-{uuid.uuid4().hex[:8]}",
                              subscribe=[topic_for("probe")])
    try:
        ensure_topic(publisher)
        assert publish_requests(publisher, requests + mine[1:]) == 3
        assert publisher.flush(30), publisher.stats()
        deadline = time.monotonic() + 60
        while service.stats["rows"] < 2 and time.monotonic() < deadline:
            agent.poll()
            time.sleep(0.05)
        assert service.stats == {"requests": 2, "foreign": 1, "rows": 2}
        agent.close()
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(rows) < 2 and time.monotonic() < deadline:
            for m in consumer.poll(50, timeout=1.0):
                kind, table = decode(m)
                assert kind == "probe" and m.key == "kj"
                rows += table.to_pylist()
    finally:
        consumer.close()
        publisher.close()
        for e in eps.values():
            e.close()
    assert sorted((r["rank"], r["peer"], r["status"], r["node"]) for r in rows) == [
        (0, 1, "ok", "n0"), (0, 2, "ok", "n0")]
    # the foreign request (rank 1 on n1) was not run here; the two rows name the link 0-1
    probe = events.conform(pa.Table.from_pylist(rows, schema=events.SCHEMAS["probe"]), "probe")
    out = analyzer.update({"probe": probe})
    assert out.anomalies and out.anomalies[0].link == [0, 1]
    assert analyzer.diagnosis().anomalies[0].extra["probe"]["link_named_by"] == "p2p"
