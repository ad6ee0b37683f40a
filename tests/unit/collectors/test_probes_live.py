"""The pieces that let the example job's live engine ask for probes (issue 17): the agent's
public drained-rows hook, requests read from an embedded transport, one service serving the
emulated nodes of a host with a rate limit per node."""

from __future__ import annotations

import time
from pathlib import Path

from support.rings import ring_with_records

from failslow.collectors.agent import Agent, TraceDirSink
from failslow.collectors.probes import GemmProbe, ProbeRunner, ProbeService
from failslow.collectors.probes.requests import EmbeddedRequests, publish_requests
from failslow.collectors.probes.runner import rows_table
from failslow.engine.probes import PROBE_REQUESTS_TOPIC, ProbeRequest
from failslow.stream.transport import InProcessTransport
from failslow.tracedir import TraceDir


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_drain_returns_the_rows_of_this_pass_and_add_queues_more(tmp_path: Path) -> None:
    rings, out = tmp_path / "rings", tmp_path / "out"
    rings.mkdir()
    w = ring_with_records(rings, 0, 300, 4)
    agent = Agent(TraceDirSink(out), rings, node="n0", collectors={"gpu": False, "rdma": False})
    first = agent.drain()
    assert [(job, sorted(b)) for job, b in first] == [("job1", ["coll"])]
    assert first[0][1]["coll"].num_rows == 8
    assert agent.drain() == []  # nothing new since
    row = {"job": "job1", "t": 5, "node": "n0", "request": "a/gemm/0/-1/suspect",
           "probe": "gemm", "rank": 0, "peer": None, "status": "ok", "duration_ns": 9,
           "elapsed_ns": 7, "bytes": None, "baseline_ns": None, "detail": None}
    agent.add("job1", {"probe": rows_table([row])})
    w.close()
    agent.close()
    td = TraceDir(out)
    assert td.read("coll").num_rows == 8  # drained rows still went to the sink
    assert td.read("probe").to_pylist()[0]["request"] == "a/gemm/0/-1/suspect"


def test_embedded_requests_read_the_topic_once_and_drop_bad_ones() -> None:
    transport = InProcessTransport(keep_committed=False)
    source = EmbeddedRequests(transport)
    asks = [ProbeRequest(f"s-{i}/gemm/{i}/-1/suspect", "j", "gemm", i, "n0") for i in range(2)]
    assert publish_requests(transport, asks[:1]) == 1
    transport.produce(PROBE_REQUESTS_TOPIC, "j", b"not json", {})
    assert [r.id for r in source.poll()] == [asks[0].id]
    assert source.bad == 1 and source.poll() == []
    publish_requests(transport, asks[1:])
    assert [r.id for r in source.poll()] == [asks[1].id]
    source.close()


def test_a_service_of_emulated_nodes_runs_theirs_with_a_bucket_per_node() -> None:
    clock = FakeClock()

    def runner() -> ProbeRunner:
        return ProbeRunner("nsA", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")},
                           jobs={"j"}, node_per_minute=60.0, job_per_minute=6000.0, burst=1,
                           clock=clock, sleep=clock.sleep)

    service = ProbeService("nsA", None, runner(), nodes={"nsB"})
    try:
        assert service.submit(ProbeRequest("a/gemm/0/-1/suspect", "j", "gemm", 0, "nsA"))
        assert service.submit(ProbeRequest("a/gemm/4/-1/suspect", "j", "gemm", 4, "nsB"))
        assert not service.submit(ProbeRequest("a/gemm/9/-1/suspect", "j", "gemm", 9, "nsC"))
        assert service.stats == {"requests": 2, "foreign": 1, "rows": 0}
        while not service.idle():
            time.sleep(0.01)
        assert sorted(r["rank"] for _, b in service.take_rows()
                      for r in b["probe"].to_pylist()) == [0, 4]
    finally:
        service.close()
    # one token per node: each node's first probe runs, a second one waits for its own
    r = runner()
    statuses = []
    for rank, node in ((0, "nsA"), (4, "nsB"), (5, "nsB"), (1, "nsA")):
        clock.now += 0.05  # the job's bucket refills (100/s), a node's does not (1/s)
        row = r.run(ProbeRequest(f"b/gemm/{rank}/-1/suspect", "j", "gemm", rank, node))
        statuses.append((row["status"], row["detail"]))
    assert statuses == [("ok", None), ("ok", None), ("skipped", "rate limit of node nsB"),
                        ("skipped", "rate limit of node nsA")]
