"""``failslow replay|process|query`` (options, environment twins, the query output) and the
processor's Prometheus endpoint, without a broker."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from support import stream_synth as synth

from failslow.cli import stream as stream_cli
from failslow.diagnosis import Anomaly
from failslow.stream import clickhouse as ch
from failslow.stream.metrics import MetricsServer, processor_registry, render
from failslow.stream.processor import ProcessorConfig, ProcessorStats, StreamProcessor
from failslow.stream.sink import (
    AnomalyReport,
    MemorySink,
    SinkBatch,
    anomalies_table,
    diagnoses_table,
    whatif_table,
)
from failslow.stream.state import Cut, PartitionSnapshot
from failslow.stream.transport import InProcessTransport


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="failslow")
    stream_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


@pytest.mark.parametrize("command", ["replay", "process", "query"])
def test_every_command_has_help(command: str) -> None:
    out = subprocess.run([sys.executable, "-m", "failslow", command, "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if command != "query":
        for option in ("--kafka", "--clickhouse", "--data-dir"):
            assert option in out.stdout
    if command == "process":
        assert "--exit-when-idle" in out.stdout and "FAILSLOW_KAFKA" in out.stdout


def test_environment_twins_set_the_defaults(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    monkeypatch.setenv("FAILSLOW_KAFKA", "10.0.0.1:9093")
    monkeypatch.setenv("FAILSLOW_CLICKHOUSE", "http://default:@127.0.0.1:8123")
    monkeypatch.setenv("FAILSLOW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FAILSLOW_EXIT_WHEN_IDLE", "7.5")
    args = _parse(["process"])
    assert args.kafka == "10.0.0.1:9093" and args.clickhouse.startswith("http://")
    assert Path(args.data_dir) == tmp_path and args.exit_when_idle == 7.5
    args = _parse(["process", "--kafka", "h:1", "--exit-when-idle", "2"])  # flags win
    assert args.kafka == "h:1" and args.exit_when_idle == 2.0
    args = _parse(["replay", str(tmp_path), "--asap"])
    assert args.asap and args.kafka == "10.0.0.1:9093"
    with pytest.raises(SystemExit):
        _parse(["replay", str(tmp_path), "--asap", "--speed", "2"])  # one or the other
    assert ch.default_data_dir() == tmp_path


def _store_job(data_dir: Path) -> None:
    sink = ch.ClickHouseSink(ch.connect(data_dir))
    try:
        opened = Anomaly(id="slow-6", kind="slow", cause="compute", ranks=[6], comm=2**64 - 1,
                         comm_kind="dp", stage="dp_sync", start_ns=10, detected_ns=20)
        ended = Anomaly(**{**opened.__dict__, "end_ns": 30})
        from failslow import events

        meta = events.from_rows("meta", [synth.meta().to_row()])
        sink.write(SinkBatch({
            "meta": meta,
            "anomalies": anomalies_table([AnomalyReport("synth-1", opened, 5, 1),
                                          AnomalyReport("synth-1", ended, 9, 2)]),
            "diagnoses": diagnoses_table([("synth-1", 3, {"period_ops": 4, "median_s": 0.1,
                                                          "count": 20}, 1, 1)]),
            "whatif": whatif_table([("synth-1", 9, 100, {"slowdown": 1.3,
                                                         "by_op_type": {}}, 1)]),
        }, token="t"))
    finally:
        sink.close()


def test_query_prints_the_stored_diagnosis(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _store_job(tmp_path)
    args = _parse(["query", "anomalies", "--job", "synth-1", "--json", "--data-dir",
                   str(tmp_path)])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1 and out["job"] == "synth-1"
    assert out["iterations"] == {"period_ops": 4, "median_s": 0.1, "count": 20}
    [a] = out["anomalies"]
    assert a["id"] == "slow-6" and a["end_ns"] == 30 and a["comm"] == 2**64 - 1
    assert out["whatif"]["slowdown"] == 1.3
    args = _parse(["query", "anomalies", "--job", "synth-1", "--data-dir", str(tmp_path)])
    assert args.func(args) == 0 and "slow-6" in capsys.readouterr().out
    args = _parse(["query", "anomalies", "--job", "nope", "--data-dir", str(tmp_path)])
    assert args.func(args) == 1
    args = _parse(["query", "jobs", "--json", "--data-dir", str(tmp_path)])
    assert args.func(args) == 0 and json.loads(capsys.readouterr().out) == ["synth-1"]


def test_query_prints_the_stored_advice(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from failslow.mitigation.planner import Advice, advice_table

    _store_job(tmp_path)
    apply = Advice(job="synth-1", anomaly_id="slow-6", strategy="S2", action="apply",
                   t_ns=25, impact_s=6.0, cost_s=5.0, description="re-balance micro-batches",
                   cause="compute", ranks=[6], plan={"m": [7, 9]})
    revert = Advice(**{**apply.__dict__, "action": "revert", "t_ns": 31})
    sink = ch.ClickHouseSink(ch.connect(tmp_path))
    try:  # the same decision written twice (a replay) is stored once
        for token in ("a", "b"):
            sink.write(SinkBatch({"advice": advice_table([revert, apply])}, token=token))
    finally:
        sink.close()
    args = _parse(["query", "advice", "--job", "synth-1", "--json", "--data-dir",
                   str(tmp_path)])
    assert args.func(args) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["strategy"], r["action"], r["t_ns"]) for r in rows] == [("S2", "apply", 25),
                                                                       ("S2", "revert", 31)]
    assert rows[0]["plan"] == {"m": [7, 9]} and rows[0]["ranks"] == [6]
    args = _parse(["query", "advice", "--job", "synth-1", "--data-dir", str(tmp_path)])
    assert args.func(args) == 0 and "revert" in capsys.readouterr().out
    args = _parse(["query", "advice", "--job", "nope", "--data-dir", str(tmp_path)])
    assert args.func(args) == 1


def test_process_rejects_malformed_planner_costs(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["process", "--planner-costs", "S2=five", "--data-dir", str(tmp_path)])
    assert args.func(args) == 2
    assert "S2=five" in capsys.readouterr().err


def test_state_store_in_clickhouse_round_trips(tmp_path: Path) -> None:
    store = ch.Store(ch.connect(tmp_path))
    try:
        state = ch.ClickHouseStateStore(store)
        assert state.load("g", 2) == (None, [])
        state.log_cuts("g", [Cut(2, 1, {"failslow.coll": (0, 9)}),
                             Cut(2, 2, {"failslow.coll": (10, 19), "failslow.meta": (0, 0)})])
        state.save_snapshots("g", [PartitionSnapshot(2, 1, {"failslow.coll": 10},
                                                     {"jobs": {"j": {"x": [2**64 - 1]}}})])
        snap, cuts = state.load("g", 2)
        assert snap is not None and snap.seq == 1 and snap.offsets == {"failslow.coll": 10}
        assert snap.state == {"jobs": {"j": {"x": [2**64 - 1]}}}
        assert [(c.seq, dict(c.ranges)) for c in cuts] == [
            (2, {"failslow.coll": (10, 19), "failslow.meta": (0, 0)})]
        assert state.load("other", 2) == (None, [])
    finally:
        store.close()


def test_metrics_exposition_and_endpoint() -> None:
    stats = ProcessorStats()
    stats.rows["coll"] = 12
    stats.dead_letter_reasons["malformed"] = 2
    stats.lag = None
    text = render(stats, {"dropped": 3}, started=0.0)
    assert 'failslow_processor_rows_total{kind="coll"} 12' in text
    assert 'failslow_processor_dead_letters_total{reason="malformed"} 2' in text
    assert "failslow_processor_lag_messages NaN" in text
    assert "failslow_processor_dropped_total 3" in text
    for line in text.splitlines():  # every sample line is "name{labels} value"
        assert line.startswith("#") or re.match(r"^[a-z_]+(\{[^}]*\})? \S+$", line), line
    server = MetricsServer(processor_registry(lambda: stats), port=0)
    try:
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert b"failslow_processor_messages_total 0" in r.read()
        assert server._server.server_address[0] == "127.0.0.1"
    finally:
        server.close()
    with pytest.raises(ValueError):
        MetricsServer(processor_registry(lambda: stats), host="0.0.0.0")


class FakeWhatIf:
    def __init__(self) -> None:
        self.rows = 0

    def update(self, batch: dict[str, object]) -> dict[str, object] | None:
        self.rows += 1
        return {"slowdown": 1.2, "steps": [self.rows]} if self.rows % 3 == 0 else None

    def snapshot(self) -> dict[str, int]:
        return {"rows": self.rows}

    def restore(self, state: dict[str, int]) -> None:
        self.rows = state["rows"]


def test_whatif_results_are_written_through_the_hook() -> None:
    bus, sink = InProcessTransport(), MemorySink()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=9)
    seqs = coll.column("seq").to_pylist()
    for it in range(9):
        bus.publish("failslow.coll", "synth-1",
                    coll.take([i for i, s in enumerate(seqs) if s == it]))
    proc = StreamProcessor(bus, sink, ProcessorConfig(clock="event", max_messages=1,
                                                      analyzer_kinds=("coll",), window_ns=10**15),
                           analyzer_factory=synth.FakeAnalyzer,
                           whatif_factory=lambda meta: FakeWhatIf())
    stats = proc.run()
    table = sink.table("whatif")
    assert table is not None and stats.whatif_results == table.num_rows == 3
    assert table.column("slowdown").to_pylist() == [1.2, 1.2, 1.2]
    assert table.column("step").to_pylist() == [3, 6, 9]
    assert proc.snapshot()["jobs"]["synth-1"]["whatif"] == {"rows": 9}
