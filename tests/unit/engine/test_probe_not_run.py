"""A probe that times out or fails leaves the diagnosis as it was and logs why (issue 17),
end to end: the engine's own anomaly, probes run for real against endpoints on 127.0.0.1,
their rows fed back through ``JobAnalyzer.update``."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from failslow.bench import heldout as hg
from failslow.collectors.probes import LinkShape, P2PProbe, ProbeEndpoint, ProbeRunner
from failslow.collectors.probes.p2p import resolver
from failslow.collectors.probes.runner import rows_table
from failslow.diagnosis import validate
from failslow.engine.offline import run_analyzer
from failslow.engine.probes import ProbeRequester
from failslow.tracedir import TraceDir


def _closed_port() -> int:
    """A port on 127.0.0.1 nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_probes_that_time_out_or_fail_leave_the_diagnosis_and_log_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the held-out ring whose slow hop 7 -> 8 timing cannot pin (link null, four candidates)
    spec = hg.Spec(tp=1, pp=1, dp=16, microbatches=1, gpus_per_node=4, iterations=30,
                   dp_bytes=512 << 20, link_rows=False, seed=7,
                   faults=[hg.Fault("communication", 7, peer=8, start=12, factor=4.0)])
    hg.write(spec, tmp_path)
    td = TraceDir(tmp_path)
    meta = td.meta()
    analyzer = run_analyzer(meta, {k: td.read(k) for k in td.kinds})
    [before] = analyzer.diagnosis().anomalies
    assert (before.cause, before.link, before.end_ns) == ("communication", None, None)
    requests = ProbeRequester(meta, frozenset({meta.job}), deadline_s=0.3).requests([before])
    assert len(requests) == 4
    # the slow hop's receiver stops answering (timeout); every other node's endpoint is down
    hung = meta.nodes[8]
    ep = ProbeEndpoint(default=LinkShape(delay_s=30.0), lifetime_s=60)
    closed = ("127.0.0.1", _closed_port())
    resolve = resolver({n: (ep.address if n == hung else closed)
                        for n in set(meta.nodes.values())})
    try:
        rows = [ProbeRunner(r.node, {"p2p": P2PProbe(r.node, resolve, 1 << 20)},
                            jobs={meta.job}).run(r) for r in requests]
    finally:
        ep.close()
    status = {(r["rank"], r["peer"]): r["status"] for r in rows}
    assert status == {(3, 4): "failed", (7, 8): "timeout", (11, 12): "failed",
                      (15, 0): "failed"}

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="failslow.engine.probes"):
        out = analyzer.update({"probe": rows_table(rows)})
    diag = analyzer.diagnosis()
    [after] = diag.anomalies
    # nothing the detectors said changed: root cause, ranks, link, timing, candidates
    assert (after.id, after.kind, after.cause, after.ranks, after.link, after.comm,
            after.stage, after.start_ns, after.end_ns, after.slowdown) == (
        before.id, before.kind, before.cause, before.ranks, None, before.comm,
        before.stage, before.start_ns, None, before.slowdown)
    assert {k: v for k, v in after.extra.items() if k not in ("probe", "probe_cost")} == \
        before.extra
    assert [a.id for a in out.anomalies] == [before.id]  # re-reported with the reasons
    probe = after.extra["probe"]
    assert len(probe["not_run"]) == 4 and "link_named_by" not in probe
    assert any(n.startswith("p2p 7-8: timeout") for n in probe["not_run"])
    assert probe["verdict"] == "inconclusive: no probe completed"
    # no measurement, but the time they held the link until they failed or timed out is
    # charged: none was skipped
    cost = after.extra["probe_cost"]
    assert cost["training_lost_s"] == cost["probe_s"] > 0
    validate(diag.to_dict())
    # one log line saying why
    lines = [r for r in caplog.records if r.name == "failslow.engine.probes"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    msg = lines[0].getMessage()
    assert f"anomaly {before.id}" in msg and "left as it was" in msg
    assert "p2p 7-8: timeout" in msg and msg.count(": failed (") == 3
    # the same rows delivered again change nothing and log nothing more
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="failslow.engine.probes"):
        again = analyzer.update({"probe": rows_table(rows)})
    assert again.anomalies == [] and analyzer.diagnosis().anomalies[0] == after
    assert not [r for r in caplog.records if r.name == "failslow.engine.probes"]
