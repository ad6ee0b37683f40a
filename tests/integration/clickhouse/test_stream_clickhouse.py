"""ClickHouse schema and sink, through embedded chDB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support import stream_synth as synth

from conftest import REPO
from failslow import events, results
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta
from failslow.mitigation.planner import ADVICE_SCHEMA
from failslow.stream import clickhouse as ch
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.sink import AnomalyReport, SinkBatch, anomalies_table
from failslow.stream.transport import InProcessTransport

REPO = REPO
SCHEMA_FILE = REPO / "infra" / "clickhouse" / "schema.sql"


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[ch.ClickHouseSink]:
    """A sink on a fresh chDB directory; closed afterwards (chDB: one directory per process)."""
    s = ch.ClickHouseSink(ch.connect(tmp_path), database="t_failslow")
    try:
        yield s
    finally:
        s.close()


def test_committed_schema_file_is_up_to_date() -> None:
    assert SCHEMA_FILE.read_text() == ch.schema_sql(), (
        "infra/clickhouse/schema.sql is stale: regenerate it with "
        "failslow schema infra/clickhouse/schema.sql")


def test_schema_command_writes_the_same_text(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from failslow import cli

    out = tmp_path / "sub" / "schema.sql"
    assert cli.main(["schema", str(out)]) == 0
    assert out.read_text() == ch.schema_sql()
    assert cli.main(["schema", str(out), "--cluster", "prod"]) == 0
    assert out.read_text() == ch.schema_sql(cluster="prod")
    assert "ON CLUSTER `prod`" in out.read_text()
    capsys.readouterr()
    assert cli.main(["schema"]) == 0
    assert capsys.readouterr().out == ch.schema_sql()


def test_ddl_covers_every_contract_column_with_the_right_types() -> None:
    statements = {s.split("`.`")[1].split("`")[0]: s for s in ch.ddl("db")[1:]}
    assert set(statements) == set(events.KINDS) | set(results.SCHEMAS) | {
        "anomalies", "advice", "whatif", "diagnoses", "processor_cuts", "processor_snapshots"}
    for kind, schema in [*events.SCHEMAS.items(), *results.SCHEMAS.items()]:
        for f in schema:
            assert f"`{f.name}`" in statements[kind], (kind, f.name)
    coll = statements["coll"]
    assert "`comm`        UInt64" in coll and "ORDER BY (job, comm, seq, rank, phase)" in coll
    assert "`op`          LowCardinality(String)" in coll
    assert "`t_start`     Nullable(Int64) CODEC(Delta, ZSTD(1))" in coll
    assert "PARTITION BY toDate(fromUnixTimestamp64Nano(t), 'UTC')" in coll
    assert "TTL ingested_at + INTERVAL 14 DAY" in coll
    assert "ENGINE = ReplacingMergeTree\n" in coll
    assert "PARTITION BY" not in statements["anomalies"]  # versions must meet in one part
    assert "ENGINE = ReplacingMergeTree(version)" in statements["anomalies"]
    assert "ORDER BY (job, id)" in statements["anomalies"]
    assert "LowCardinality(Nullable(String))" in statements["anomalies"]  # stage
    assert "ENGINE = ReplacingMergeTree(t)" in statements["meta"]
    for f in ADVICE_SCHEMA:  # the planner's advice rows, keyed by their deterministic id
        assert f"`{f.name}`" in statements["advice"], f.name
    assert "ORDER BY (job, advice_id)" in statements["advice"]
    with pytest.raises(ValueError):
        ch.ddl("bad name; DROP")


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert ch.default_data_dir() == tmp_path / "failslow"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert ch.default_data_dir() == Path.home() / ".local" / "share" / "failslow"


def test_events_round_trip_through_chdb(sink: ch.ClickHouseSink, tmp_path: Path) -> None:
    coll = synth.coll(iterations=5)
    meta = events.from_rows("meta", [synth.meta().to_row()])
    sink.write(SinkBatch({"coll": coll, "meta": meta}, token="a"))
    back = sink.read("coll", "synth-1")
    assert back.schema.equals(events.SCHEMAS["coll"])
    key = ["comm", "seq", "rank", "phase"]
    assert back.sort_by([(k, "ascending") for k in key]).equals(
        coll.sort_by([(k, "ascending") for k in key]))
    assert 2**64 - 1 in back.column("comm").to_pylist()
    assert events.parse_meta_row(sink.read("meta").to_pylist()[0]) == synth.meta()
    assert (tmp_path / "clickhouse").is_dir()
    # the ALIAS time column reads as DateTime64
    first = sink.client.query("SELECT toString(min(time)) FROM t_failslow.coll").result_rows
    assert first[0][0].startswith("2025-06-15")


def test_derived_tables_and_latest_anomaly_report_wins(sink: ch.ClickHouseSink) -> None:
    rounds = synth.rounds_from_coll(synth.coll(iterations=6))
    iterations = synth.iterations_from_rounds(rounds)
    opened = Anomaly(id="a1", kind="slow", cause="compute", ranks=[6], comm=2**64 - 1,
                     comm_kind="dp", stage="dp_sync", start_ns=10, detected_ns=20,
                     slowdown=1.4, R=0.5, P=0.9, extra={"score": 3.5})
    ended = Anomaly(**{**opened.__dict__, "end_ns": 30})
    hang = Anomaly(id="h1", kind="hang", cause="hardware", ranks=[1, 2], link=[1, 2])
    sink.write(SinkBatch({"rounds": rounds, "iterations": iterations,
                          "anomalies": anomalies_table([AnomalyReport("j", opened, 5, 1),
                                                        AnomalyReport("j", hang, 6, 1)])},
                         token="b1"))
    sink.write(SinkBatch({"anomalies": anomalies_table([AnomalyReport("j", ended, 9, 2)])},
                         token="b2"))
    assert sink.count("anomalies") == 3  # one row per report ...
    got = dict((a.id, a) for _, a in sink.anomalies("j"))  # ... the latest wins under FINAL
    assert got == {"a1": ended, "h1": hang}
    assert sink.anomalies("other") == []
    assert sink.read("rounds").num_rows == rounds.num_rows
    it = sink.read("iterations", "synth-1")
    assert it.schema.equals(results.SCHEMAS["iterations"]) and it.num_rows == 6


def test_same_token_is_written_once(sink: ch.ClickHouseSink) -> None:
    """Idempotence note: a retried write (same token) is dropped by ClickHouse; another
    batch with the same rows but another token is stored again (raw events are plain
    MergeTree), while ReplacingMergeTree tables collapse identical rows under FINAL."""
    coll = synth.coll(iterations=2)
    rounds = synth.rounds_from_coll(coll)
    batch = SinkBatch({"coll": coll, "rounds": rounds}, token="retry-me")
    sink.write(batch)
    sink.write(batch)
    assert sink.count("coll") == coll.num_rows and sink.count("rounds") == rounds.num_rows
    sink.write(SinkBatch({"coll": coll, "rounds": rounds}, token="re-read-after-restart"))
    assert sink.count("coll") == 2 * coll.num_rows
    assert sink.read("rounds").num_rows == rounds.num_rows  # FINAL collapses duplicates


def test_processor_into_chdb(sink: ch.ClickHouseSink) -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=15, slow_from=8)
    bus.publish("failslow.coll", "synth-1", coll)
    made: dict[str, Any] = {}

    def factory(meta: JobMeta) -> synth.FakeAnalyzer:
        made[meta.job] = synth.FakeAnalyzer(meta)
        return made[meta.job]

    proc = StreamProcessor(bus, sink, ProcessorConfig(clock="event", window_ns=10**15),
                           analyzer_factory=factory)
    proc.run()
    assert sink.count("coll", "synth-1") == coll.num_rows
    assert sink.count("rounds") == 15 * 4 and sink.count("iterations") == 15
    [(job, anomaly)] = sink.anomalies()
    assert job == "synth-1" and anomaly.ranks == [6] and anomaly.stage == "dp_sync"


def test_extra_producer_columns_are_not_stored(sink: ch.ClickHouseSink) -> None:
    coll = synth.coll(iterations=1)
    coll = coll.append_column("note", pa.array(["x"] * coll.num_rows))
    sink.write(SinkBatch({"coll": coll}, token="x"))
    assert sink.count("coll") == coll.num_rows


def test_unknown_destination_is_refused(sink: ch.ClickHouseSink) -> None:
    with pytest.raises(ValueError):
        sink.write(SinkBatch({"nope": synth.coll(iterations=1)}))
