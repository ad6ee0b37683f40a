"""Stream processor: per-job analyzers, dead letters, checkpoints, back-pressure, clocks."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from support import stream_synth as synth
from support.snapshots import roundtrip

from failslow.events import JobMeta
from failslow.stream import transport as tr
from failslow.stream.processor import ProcessorConfig, SinkError, StreamProcessor
from failslow.stream.sink import MemorySink, Sink, SinkBackpressureError, SinkBatch
from failslow.stream.transport import EVENT_TOPICS, InProcessTransport

JOB = "synth-1"


def _processor(bus: InProcessTransport, sink: Sink | None = None,
               **kwargs: Any) -> tuple[StreamProcessor, dict[str, synth.FakeAnalyzer]]:
    made: dict[str, synth.FakeAnalyzer] = {}

    def factory(meta: JobMeta) -> synth.FakeAnalyzer:
        made[meta.job] = synth.FakeAnalyzer(meta)
        return made[meta.job]

    kwargs.setdefault("clock", "event")
    # FakeAnalyzer derives a round from one batch only: no event-time windows here
    kwargs.setdefault("window_ns", 10**15)
    kwargs.setdefault("min_batch_rows", 0)  # every poll analysed, no merged windows
    kwargs.setdefault("analyzer_kinds", ("coll",))  # the synthetic jobs send coll only
    sleep = kwargs.pop("sleep", None)
    return StreamProcessor(bus, sink, ProcessorConfig(**kwargs), analyzer_factory=factory,
                           sleep=sleep), made


def _publish_iterations(bus: InProcessTransport, coll: pa.Table, job: str = JOB) -> int:
    """One message per iteration (a round is complete inside one iteration)."""
    seq = coll.column("seq").to_pylist()
    n = 0
    for it in sorted(set(seq)):
        rows = [i for i, s in enumerate(seq) if s == it]
        bus.publish("failslow.coll", job, coll.take(rows))
        n += 1
    return n


def test_processes_a_job_and_commits_after_the_sink_write() -> None:
    bus, sink = InProcessTransport(), MemorySink()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=20, slow_from=10)
    n = _publish_iterations(bus, coll)
    proc, made = _processor(bus, sink, max_messages=4)
    stats = proc.run()
    assert stats.messages == n + 1 and stats.rows["coll"] == coll.num_rows
    assert stats.dead_letters == 0 and stats.errors == 0
    analyzer = made[JOB]
    assert sum(b["coll"].num_rows for b in analyzer.batches) == coll.num_rows
    # stored: the raw events, the derived tables and the anomaly report
    stored = sink.table("coll")
    assert stored is not None and stored.num_rows == coll.num_rows
    rounds = sink.table("rounds")
    assert rounds is not None and rounds.num_rows == 20 * 4
    iterations = sink.table("iterations")
    assert iterations is not None and iterations.num_rows == 20
    latest = sink.anomalies()
    assert list(latest) == [(JOB, "slow-6")] and latest[(JOB, "slow-6")].ranks == [6]
    # published on the anomalies topic, and everything committed
    published = bus.messages(tr.ANOMALIES_TOPIC)
    assert [tr.decode_anomaly(m)[2].id for m in published] == ["slow-6"]
    assert bus.lag() == 0 and bus.committed("failslow.coll") == n
    assert proc.anomalies(JOB)[0].id == "slow-6"
    assert proc.diagnosis(JOB).anomalies[0].ranks == [6]


def test_event_clock_ticks_with_the_largest_event_time() -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=5)
    _publish_iterations(bus, coll)
    proc, made = _processor(bus, max_messages=1)
    proc.run()
    ticks = made[JOB].ticks
    assert ticks == sorted(set(ticks)) and len(ticks) == 5
    t = coll.column("t").to_numpy()
    assert ticks[-1] == int(t.max())


def test_injected_clock_is_used() -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    _publish_iterations(bus, synth.coll(iterations=3))
    now = iter(range(1000, 2000, 10))
    proc, made = _processor(bus, clock=lambda: next(now), max_messages=1)
    proc.run()
    assert made[JOB].ticks[:3] == [1000, 1010, 1020]


def test_dead_letters_do_not_stop_the_processor() -> None:
    bus = InProcessTransport(subscribe=EVENT_TOPICS + ("failslow.bogus",))
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=4)
    good = coll.slice(0, 8)
    headers = tr.event_headers("coll")
    bus.produce("failslow.coll", JOB, b"garbage", headers)                   # malformed
    bad = good.drop_columns(["phase"])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, bad.schema) as w:
        w.write_table(bad)
    bus.produce("failslow.coll", JOB, bytes(sink.getvalue()), headers)      # wrong schema
    bus.produce("failslow.bogus", JOB, tr.encode("coll", good), headers)     # unknown kind
    bus.produce("failslow.coll", JOB, tr.encode("coll", good),
                {**headers, tr.H_VERSION: "99"})                             # future version
    _publish_iterations(bus, coll)                                           # then good ones
    proc, made = _processor(bus, MemorySink())
    stats = proc.run()
    assert stats.dead_letters == 4
    assert stats.dead_letter_reasons == {"malformed": 1, "contract": 1, "unknown_kind": 1,
                                         "schema_version": 1}
    assert sum(b["coll"].num_rows for b in made[JOB].batches) == coll.num_rows
    letters = bus.messages(tr.DEADLETTER_TOPIC)
    assert [m.headers[tr.H_ERROR_CLASS] for m in letters] == [
        "malformed", "contract", "unknown_kind", "schema_version"]
    assert letters[0].value == b"garbage"
    assert letters[1].headers[tr.H_SOURCE_TOPIC] == "failslow.coll"
    assert "phase" in letters[1].headers[tr.H_ERROR]
    assert bus.lag() == 0  # dead-lettered messages are committed too


def test_records_before_meta_wait_for_it() -> None:
    bus = InProcessTransport()
    coll = synth.coll(iterations=3)
    _publish_iterations(bus, coll)
    proc, made = _processor(bus, MemorySink())
    proc.run()
    assert made == {} and proc.stats.pending_messages == 3
    bus.publish_meta(synth.meta())
    proc.run()
    assert proc.stats.pending_messages == 0
    assert sum(b["coll"].num_rows for b in made[JOB].batches) == coll.num_rows


def test_too_many_records_without_meta_are_dead_lettered() -> None:
    bus = InProcessTransport()
    _publish_iterations(bus, synth.coll(iterations=5))
    proc, _ = _processor(bus, max_pending_messages=2)
    stats = proc.run()
    assert stats.pending_messages == 2 and stats.dead_letter_reasons == {"no_meta": 3}


def test_two_jobs_get_separate_analyzers() -> None:
    bus, sink = InProcessTransport(), MemorySink()
    for job in ("job-a", "job-b"):
        bus.publish_meta(synth.meta(job))
    _publish_iterations(bus, synth.coll(job="job-a", iterations=12, slow_rank=6), "job-a")
    _publish_iterations(bus, synth.coll(job="job-b", iterations=12, slow_rank=3), "job-b")
    proc, made = _processor(bus, sink)
    proc.run()
    assert set(made) == {"job-a", "job-b"}
    assert {k: a.ranks for k, a in sink.anomalies().items()} == {
        ("job-a", "slow-6"): [6], ("job-b", "slow-3"): [3]}


def test_analyzer_failure_is_counted_and_processing_goes_on() -> None:
    bus, sink = InProcessTransport(), MemorySink()
    bus.publish_meta(synth.meta())
    _publish_iterations(bus, synth.coll(iterations=3))
    proc, made = _processor(bus, sink, max_messages=2)
    proc.step()  # meta + first iteration
    made[JOB].fail_on_rank = 0
    proc.step()
    made[JOB].fail_on_rank = None
    stats = proc.run()
    assert stats.errors == 1 and stats.rows["coll"] == synth.coll(iterations=3).num_rows
    stored = sink.table("coll")
    assert stored is not None and stored.num_rows == stats.rows["coll"]  # still stored
    with pytest.raises(RuntimeError):
        bus2 = InProcessTransport()
        bus2.publish_meta(synth.meta())
        _publish_iterations(bus2, synth.coll(iterations=1))
        strict, made2 = _processor(bus2, strict=True, max_messages=1)
        strict.step()
        made2[JOB].fail_on_rank = 0
        strict.step()


class FlakySink(MemorySink):
    def __init__(self, busy: int = 0, fail: int = 0) -> None:
        super().__init__()
        self.busy, self.fail = busy, fail
        self.tokens: list[str] = []

    def write(self, batch: SinkBatch) -> None:
        self.tokens.append(batch.token)
        if self.busy:
            self.busy -= 1
            raise SinkBackpressureError(0.25)
        if self.fail:
            self.fail -= 1
            raise ConnectionError("down")
        super().write(batch)


def test_backpressure_pauses_and_offers_the_same_batch_again() -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    _publish_iterations(bus, synth.coll(iterations=3))
    sink = FlakySink(busy=2)
    slept: list[float] = []
    proc, _ = _processor(bus, sink, sleep=slept.append)
    stats = proc.run()
    assert slept == [0.25, 0.5] and stats.backpressure == 2  # the delay doubles
    assert len(set(sink.tokens)) == 1 and len(sink.tokens) == 3  # one batch, three offers
    assert len(sink.batches) == 1 and bus.lag() == 0


def test_failing_sink_commits_nothing_and_a_restart_redelivers() -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    n = _publish_iterations(bus, synth.coll(iterations=3))
    broken = FlakySink(fail=100)
    proc, _ = _processor(bus, broken, max_sink_attempts=3, sleep=lambda s: None)
    with pytest.raises(SinkError):
        proc.run()
    assert broken.batches == [] and bus.committed("failslow.coll") == 0
    assert bus.lag() == n + 1
    bus.seek_to_committed()  # the restarted processor
    healthy = MemorySink()
    again, _ = _processor(bus, healthy)
    again.run()
    stored = healthy.table("coll")
    assert stored is not None and stored.num_rows == synth.coll(iterations=3).num_rows
    assert bus.lag() == 0


def test_tokens_differ_between_batches_and_repeat_for_the_same_input() -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    _publish_iterations(bus, synth.coll(iterations=4))
    sink = FlakySink()
    proc, _ = _processor(bus, sink, max_messages=2, checkpoint_messages=2)
    proc.run()
    assert len(sink.tokens) >= 2 and len(set(sink.tokens)) == len(sink.tokens)
    # Another processor of the same group reading the same input in the same cuts makes
    # the same tokens (what lets the store drop a re-written batch).
    bus.seek_to_committed()
    for topic in ("failslow.meta", "failslow.coll"):
        bus.seek(topic, 0, 0)
    again = FlakySink()
    other, _ = _processor(bus, again, max_messages=2, checkpoint_messages=2)
    other.run()
    assert again.tokens == sink.tokens


def test_later_reports_have_larger_versions() -> None:
    bus, sink = InProcessTransport(), MemorySink()
    bus.publish_meta(synth.meta())
    _publish_iterations(bus, synth.coll(iterations=20, slow_from=5))
    proc, made = _processor(bus, sink, max_messages=8)
    proc.run()
    analyzer = made[JOB]
    assert analyzer.open is not None
    ended = synth.Anomaly(**{**analyzer.open.__dict__, "end_ns": 123})
    analyzer.open = None
    original = analyzer.on_tick

    def tick(now: int) -> synth.Output:
        original(now)
        return synth.Output(anomalies=[ended])

    analyzer.on_tick = tick  # type: ignore[method-assign,assignment]
    bus.publish("failslow.coll", JOB, synth.coll(iterations=21).slice(20 * 8 * 2))
    proc.run()
    versions = sink.table("anomalies")
    assert versions is not None
    assert versions.column("version").to_pylist() == sorted(versions.column("version")
                                                            .to_pylist())
    assert sink.anomalies()[(JOB, "slow-6")].end_ns == 123


def test_snapshot_and_restore_resume_a_job() -> None:

    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    _publish_iterations(bus, synth.coll(iterations=15, slow_from=5))
    proc, made = _processor(bus, MemorySink())
    proc.run()
    state = roundtrip(proc.snapshot())  # survives the snapshot payload
    fresh, made2 = _processor(bus, MemorySink())
    fresh.restore(state)
    assert fresh.jobs() == [JOB] and fresh.meta(JOB) == synth.meta()
    reopened = made2[JOB].open
    assert reopened is not None and reopened.ranks == [6]
    assert [a.id for a in fresh.anomalies(JOB)] == ["slow-6"]
    with pytest.raises(ValueError):
        fresh.restore({"version": 1})
