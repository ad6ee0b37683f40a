"""The stream processor asks the node agents to probe the suspects of open anomalies
(issue 17): for a job with probes enabled, an anomaly whose link timing cannot pin gets one
request per candidate hop on ``failslow.probe-requests``, once; a job without probes gets
none. The engine reads ``probe`` rows as one of its input kinds, online and offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow.bench import heldout as hg
from failslow.engine import registry
from failslow.engine.probes import PROBE_REQUESTS_TOPIC, ProbeRequest
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.sink import MemorySink
from failslow.stream.transport import InProcessTransport
from failslow.tracedir import TraceDir

#: one hop (7 -> 8) of a 16-rank DP ring over four nodes 4x slower, no queue telemetry
RING = hg.Spec(tp=1, pp=1, dp=16, microbatches=1, gpus_per_node=4, iterations=30,
               dp_bytes=512 << 20, link_rows=False, seed=7, job="ring-probe",
               faults=[hg.Fault("communication", 7, peer=8, start=12, factor=4.0)])


def _run(tmp_path: Path) -> tuple[StreamProcessor, list[ProbeRequest]]:
    hg.write(RING, tmp_path / "ring")
    td = TraceDir(tmp_path / "ring")
    bus, sink = InProcessTransport(), MemorySink()
    bus.publish_meta(td.meta())
    bus.publish_batch(RING.job, {k: td.read(k) for k in td.kinds})
    proc = StreamProcessor(bus, sink, ProcessorConfig(clock="event"))
    proc.run()
    return proc, [ProbeRequest.from_json(m.value) for m in bus.messages(PROBE_REQUESTS_TOPIC)]


def test_processor_asks_for_probes_of_an_unpinned_link(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILSLOW_PROBE_JOBS", RING.job)
    proc, asks = _run(tmp_path)
    [slow] = [a for a in proc.diagnosis(RING.job).anomalies if a.link is None]
    assert sorted((r.probe, r.rank, r.peer) for r in asks if r.role == "suspect") == sorted(
        ("p2p", a, b) for a, b in slow.extra["link_candidates"])
    assert all(r.job == RING.job and r.t > 0 and r.node for r in asks)
    assert len({r.id for r in asks}) == len(asks)  # each asked once
    assert proc.stats.probe_requests_published == len(asks)


def test_no_probe_requests_unless_the_job_enabled_them(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAILSLOW_PROBE_JOBS", raising=False)
    proc, asks = _run(tmp_path)
    assert asks == [] and proc.stats.probe_requests_published == 0
    assert any(a.link is None for a in proc.diagnosis(RING.job).anomalies)


def test_probe_rows_are_an_input_kind_of_the_engine() -> None:
    assert "probe" in registry.KINDS
