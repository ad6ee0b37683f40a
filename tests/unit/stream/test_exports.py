"""Derived tables exported by one consumer group and imported by another
(failslow.stream.exports, failslow.engine.imports): the message format, what a bad message
is told, the rows an importer takes once, and the settings that wire the stages."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from support.stream_synth import meta as synth_meta

from failslow import results
from failslow.engine.imports import IterationImport
from failslow.engine.registry import JobConfig, build, input_kinds
from failslow.stream.exports import (
    EXPORT_TOPICS,
    T_EMIT,
    decode_export,
    encode_export,
    export_topic,
    exported_of,
    with_emit_time,
)
from failslow.stream.kafka_topics import ALL_TOPICS, topic_configs
from failslow.stream.processor import ProcessorConfig
from failslow.stream.transport import H_WATERMARK, DecodeError, Message


def _iterations(job: str, rows: list[tuple[int, int]]) -> pa.Table:
    """``iterations`` rows (rank, iteration) of ``job``."""
    rank = [r for r, _ in rows]
    it = [i for _, i in rows]
    return pa.table({"job": [job] * len(rows), "rank": rank, "iteration": it,
                     "t_start": [10 * i for i in it], "t_end": [10 * i + 9 for i in it],
                     "duration_ns": [9] * len(rows)})


def _message(value: bytes, headers: dict[str, str], key: str = "j") -> Message:
    return Message(export_topic("iterations"), key, value, headers, offset=3)


def test_an_export_message_round_trips_with_its_watermark() -> None:
    rows = with_emit_time("iterations", _iterations("j", [(0, 1), (-1, 1)]), 1234)
    value, headers = encode_export("iterations", rows, 1233)
    assert headers[H_WATERMARK] == "1233"
    name, table = decode_export(_message(value, headers))
    assert name == "iterations" and table.equals(rows)
    assert table.column(T_EMIT).to_pylist() == [1234, 1234]
    assert table.schema.field("rank").type == results.SCHEMAS["iterations"].field("rank").type
    # a message without rows only moves the watermark on
    empty = with_emit_time("iterations", results.empty("iterations"), 0)
    value, headers = encode_export("iterations", empty, 99)
    assert decode_export(_message(value, headers))[1].num_rows == 0


@pytest.mark.parametrize("breakage, reason", [
    ("version", "schema_version"), ("garbage", "malformed"), ("column", "contract"),
    ("key", "key"), ("null", "contract")])
def test_a_bad_export_message_is_told_what_is_wrong(breakage: str, reason: str) -> None:
    rows = with_emit_time("iterations", _iterations("j", [(0, 1)]), 5)
    value, headers = encode_export("iterations", rows, 4)
    key = "j"
    if breakage == "version":
        headers = {**headers, "failslow-schema-version": "99"}
    elif breakage == "garbage":
        value = b"not arrow"
    elif breakage == "column":
        value, _ = encode_export("iterations", rows, 4)
        table = rows.drop_columns(["duration_ns"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        value = bytes(sink.getvalue())
    elif breakage == "key":
        key = "other"
    elif breakage == "null":
        table = rows.set_column(2, "iteration", pa.array([None], pa.int64()))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        value = bytes(sink.getvalue())
    with pytest.raises(DecodeError) as e:
        decode_export(_message(value, headers, key))
    assert e.value.reason_class == reason


def test_the_export_topics_are_created_like_event_topics() -> None:
    assert EXPORT_TOPICS == ("failslow.derived.evidence", "failslow.derived.iterations")
    assert set(EXPORT_TOPICS) <= set(ALL_TOPICS)
    for topic in EXPORT_TOPICS:
        assert topic_configs(topic) == topic_configs("failslow.coll")
    assert exported_of("failslow.derived.rounds") is None and exported_of("failslow.coll") is None
    with pytest.raises(ValueError, match="cannot be exported"):
        export_topic("rounds")


def test_an_importer_takes_each_iteration_row_once() -> None:
    imp = IterationImport()
    first = imp.take(_iterations("j", [(0, 1), (1, 1), (-1, 1), (0, 2)]))
    assert first.num_rows == 4
    # a republished message (at least once) and a repeat inside one table: only new rows
    again = imp.take(_iterations("j", [(0, 2), (1, 1), (1, 2), (1, 2), (-1, 2), (3, 1)]))
    assert list(zip(again.column("rank").to_pylist(), again.column("iteration").to_pylist(),
                    strict=True)) == [(1, 2), (-1, 2), (3, 1)]
    state = imp.snapshot()
    restored = IterationImport()
    restored.restore(state)
    assert restored.take(_iterations("j", [(3, 1), (3, 2)])).column("iteration").to_pylist() \
        == [2]
    assert np.array_equal(imp.last, state["last"])


def test_an_engine_that_imports_the_iterations_does_not_track_them() -> None:
    meta = synth_meta("j")
    every = build(meta, JobConfig(planner=None), lambda: [])
    imported = build(meta, JobConfig(planner=None, imported=frozenset({"iterations"})),
                     lambda: [])
    assert "iterations" in every and "iterations" not in imported
    assert set(imported) == set(every) - {"iterations"}
    # asked for the slow-down detector alone, it no longer brings the tracker along
    slow = JobConfig(detectors=frozenset({"slowdown"}), imported=frozenset({"iterations"}))
    assert not slow.enabled("iterations") and slow.enabled("slowdown")
    assert input_kinds(slow) == input_kinds(JobConfig(detectors=frozenset({"slowdown"})))


def test_the_processor_settings_wire_the_stages() -> None:
    track = ProcessorConfig(detectors=frozenset({"iterations"}),
                            exports=frozenset({"iterations"}))
    slow = ProcessorConfig(detectors=frozenset({"slowdown"}),
                           imports=frozenset({"iterations"}))
    assert "iterations" not in track.analyzer_kinds
    assert slow.analyzer_kinds[-1] == "iterations" and "coll" in slow.analyzer_kinds
    with pytest.raises(ValueError, match="cannot import 'rounds'"):
        ProcessorConfig(imports=frozenset({"rounds"}))
    with pytest.raises(ValueError, match="cannot export 'anomalies'"):
        ProcessorConfig(exports=frozenset({"anomalies"}))


def test_a_job_snapshot_keeps_the_imported_rows_it_holds() -> None:
    """Rows of an imported table waiting for their window are part of the job's state, as
    held event rows are (they are no event kind: stored as they came)."""
    from failslow.stream.processor import StreamProcessor
    from failslow.stream.state import pack_text, unpack_text
    from failslow.stream.transport import InProcessTransport

    config = ProcessorConfig(detectors=frozenset({"slowdown"}),
                             imports=frozenset({"iterations"}), align=True)
    processor = StreamProcessor(InProcessTransport(), None, config)
    jobs = processor._jobs
    meta = synth_meta("j")
    st = jobs.create(meta, 0)
    rows = with_emit_time("iterations", _iterations("j", [(0, 1), (-1, 1)]), 77)
    jobs.add("j", "iterations", rows, watermark=70)
    assert st.held["iterations"] and st.kind_wm["iterations"] == 77
    state = unpack_text(pack_text(jobs.state_of(st)))
    again = jobs.restore("j", state)
    [held] = again.held["iterations"]
    assert held.equals(rows)


def test_a_kind_several_shards_export_is_complete_up_to_the_least_of_them() -> None:
    """Evidence comes from N reducers: the importer moves the kind on only as far as the
    slowest of them, and not at all before it heard from all N."""
    from failslow.detectors.slowdown.evidence_rows import SCHEMA
    from failslow.stream.processor import StreamProcessor
    from failslow.stream.state import pack_text, unpack_text
    from failslow.stream.transport import InProcessTransport

    config = ProcessorConfig(detectors=frozenset({"slowdown"}),
                             imports=frozenset({"iterations", "evidence"}), align=True)
    assert config.analyzer_kinds[-2:] == ("evidence", "iterations")
    jobs = StreamProcessor(InProcessTransport(), None, config)._jobs
    st = jobs.create(synth_meta("j"), 0)
    none = with_emit_time("evidence", SCHEMA.empty_table(), 0)
    jobs.add("j", "evidence", none, watermark=100, source=(0, 3))
    jobs.add("j", "evidence", none, watermark=40, source=(2, 3))
    assert "evidence" not in st.kind_wm
    jobs.add("j", "evidence", none, watermark=50, source=(1, 3))
    assert st.kind_wm["evidence"] == 40
    jobs.add("j", "evidence", none, watermark=200, source=(2, 3))
    assert st.kind_wm["evidence"] == 50
    again = jobs.restore("j", unpack_text(pack_text(jobs.state_of(st))))
    assert again.source_wm == {"evidence": {0: 100, 1: 50, 2: 200}}


def test_a_shard_is_said_in_the_header_and_checked() -> None:
    from failslow.detectors.slowdown.evidence_rows import SCHEMA
    from failslow.stream.exports import H_SOURCE, parse_shard, source_of

    rows = with_emit_time("evidence", SCHEMA.empty_table(), 0)
    value, headers = encode_export("evidence", rows, 9, source=(1, 4))
    message = Message(export_topic("evidence"), "j", value, headers, offset=1)
    assert decode_export(message)[0] == "evidence" and source_of(message) == (1, 4)
    for bad in ("4/4", "x", "1/2/3", "-1/2"):
        with pytest.raises(DecodeError, match="shard"):
            source_of(Message(message.topic, "j", value, {**headers, H_SOURCE: bad}))
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
    with pytest.raises(ValueError, match="--shard"):
        ProcessorConfig(detectors=frozenset({"evidence"}), exports=frozenset({"evidence"}))
    with pytest.raises(ValueError, match="evidence shard 2/2"):
        ProcessorConfig(evidence_shard=(2, 2))
    reducer = ProcessorConfig(detectors=frozenset({"evidence"}), evidence_shard=(0, 2),
                              exports=frozenset({"evidence"}),
                              imports=frozenset({"iterations"}))
    assert reducer.analyzer_kinds[-1] == "iterations" and "coll" in reducer.analyzer_kinds
    assert "evidence" not in reducer.analyzer_kinds


def test_a_checkpoint_after_analysis_samples_the_cpu_even_without_rows_to_write() -> None:
    """A group that analyses much and writes little (the slow-down group on imported
    evidence) still gives the benchmark its CPU time at its last checkpoint."""
    from failslow.stream.output import Writer
    from failslow.stream.partitions import Partition
    from failslow.stream.stats import ProcessorStats
    from failslow.stream.transport import InProcessTransport

    stats = ProcessorStats()
    writer = Writer(InProcessTransport(), None, ProcessorConfig(), stats, lambda: None)
    part = Partition(0)
    writer.flush(part, None, publish=True)
    assert stats.cpu_samples == []  # nothing done
    stats.seconds["analyze"] += 0.5
    stats.rows["coll"] += 10
    writer.flush(part, None, publish=True)
    assert [rows for _, rows in stats.cpu_samples] == [10]
    writer.flush(part, None, publish=True)
    assert len(stats.cpu_samples) == 1


def test_an_importer_says_once_when_the_exporting_stage_sends_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    """A slow-down group told to import the evidence while no reducer runs would otherwise
    go on silently without it."""
    import logging

    from failslow.stream.processor import StreamProcessor
    from failslow.stream.transport import InProcessTransport

    config = ProcessorConfig(detectors=frozenset({"slowdown"}),
                             imports=frozenset({"evidence"}), align=True, align_idle_s=0.0)
    processor = StreamProcessor(InProcessTransport(), None, config)
    jobs = processor._jobs
    st = jobs.create(synth_meta("j"), 0)
    processor._idle_since[0] = 0
    with caplog.at_level(logging.WARNING, logger="failslow.stream.jobs"):
        jobs.horizon(st)
        jobs.horizon(st)
    said = [r for r in caplog.records if "no evidence rows" in r.getMessage()]
    assert len(said) == 1 and "is it running" in said[0].getMessage()
    assert st.missing_imports == {"evidence"}
