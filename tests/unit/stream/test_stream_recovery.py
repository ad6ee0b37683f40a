"""Checkpoints of the stream processor: a crash between the sink write and the commit, a
restart from the snapshot and the logged cuts, a rebalance, back-pressure with a paused
consumer, and the wall clock that does not mistake a backlog for a hang (in process)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import pyarrow as pa
import pytest
from support import stream_synth as synth

from failslow.events import JobMeta
from failslow.stream import transport as tr
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.sink import MemorySink, SinkBackpressureError, SinkBatch
from failslow.stream.state import MemoryStateStore, pack, unpack
from failslow.stream.transport import InProcessTransport

JOB = "synth-1"


Crash, CrashingBus, DedupSink = synth.Crash, synth.CrashingBus, synth.DedupSink


def _factory(made: dict[str, list[synth.FakeAnalyzer]]) -> Any:
    def make(meta: JobMeta) -> synth.FakeAnalyzer:
        a = synth.FakeAnalyzer(meta)
        made.setdefault(meta.job, []).append(a)
        return a
    return make


def _publish(bus: InProcessTransport, coll: pa.Table, first: int, last: int) -> None:
    seq = coll.column("seq").to_pylist()
    for it in range(first, last):
        bus.publish("failslow.coll", JOB, coll.take([i for i, s in enumerate(seq) if s == it]))


def _key_counts(table: pa.Table | None) -> Counter[tuple[Any, ...]]:
    assert table is not None
    cols = [table.column(c).to_pylist() for c in ("comm", "seq", "rank", "phase")]
    return Counter(zip(*cols, strict=True))


def test_state_payload_round_trips() -> None:
    state = {"jobs": {"a": {"x": [1, 2, 3], "big": 2**64 - 1}}, "pending": {}}
    assert unpack(pack(state)) == state


def test_crash_after_the_sink_write_restart_adds_nothing_twice() -> None:
    bus, sink, store = CrashingBus(), DedupSink(), MemoryStateStore()
    made: dict[str, list[synth.FakeAnalyzer]] = {}
    coll = synth.coll(iterations=30, slow_from=20)
    bus.publish_meta(synth.meta())
    _publish(bus, coll, 0, 10)
    first = StreamProcessor(bus, sink, ProcessorConfig(clock="event", max_messages=2,
                                                       checkpoint_messages=2,
                                                       snapshot_interval_s=1e9), state=store,
                            analyzer_factory=_factory(made))
    first.run()
    first.snapshot_all()  # state after iteration 9, at the committed offsets
    assert store.snapshots and first.stats.snapshots == 1
    _publish(bus, coll, 10, 30)
    bus.crash_at = bus.commits + 4  # three more checkpoints commit, the fourth does not
    with pytest.raises(Crash):
        first.run()
    written_before = sink.table("coll")
    assert written_before is not None and written_before.num_rows > 10 * 8 * 2
    reports_before = bus.messages(tr.ANOMALIES_TOPIC)

    # The restarted processor: same group, same store; the transport rewinds to the
    # committed offsets and assigns the partition again.
    bus.reassign()
    second = StreamProcessor(bus, sink, ProcessorConfig(clock="event", max_messages=3,
                                                        checkpoint_messages=1,
                                                        snapshot_interval_s=1e9), state=store,
                             analyzer_factory=_factory(made))  # checkpoints due while re-cutting
    second.run()
    assert second.stats.restored_jobs == 1 and second.stats.replayed_cuts >= 4
    restored = made[JOB][-1]
    assert getattr(restored, "restored", None) is not None  # not relearned from scratch
    # every operation row stored exactly once, none lost
    counts = _key_counts(sink.table("coll"))
    assert sum(counts.values()) == coll.num_rows and set(counts.values()) == {1}
    # the anomaly opened at iteration 20 was reported once: not again after the restart
    reports = sink.table("anomalies")
    assert reports is not None
    keys = list(zip(reports.column("id").to_pylist(), reports.column("version").to_pylist(),
                    strict=True))
    assert [k[0] for k in keys] == ["slow-6"] and len(set(keys)) == len(keys)
    published = [tr.decode_anomaly(m) for m in bus.messages(tr.ANOMALIES_TOPIC)]
    assert len({(j, v, a.id) for j, v, a in published}) == len(published) == 1
    assert len(reports_before) <= 1
    assert bus.lag() == 0


def test_restart_without_crash_resumes_from_the_snapshot() -> None:
    bus, sink, store = InProcessTransport(), DedupSink(), MemoryStateStore()
    made: dict[str, list[synth.FakeAnalyzer]] = {}
    coll = synth.coll(iterations=12)
    bus.publish_meta(synth.meta())
    _publish(bus, coll, 0, 6)
    first = StreamProcessor(bus, sink, ProcessorConfig(clock="event"), state=store,
                            analyzer_factory=_factory(made))
    first.run()
    first.close()
    _publish(bus, coll, 6, 12)
    bus.reassign()
    second = StreamProcessor(bus, sink, ProcessorConfig(clock="event"), state=store,
                             analyzer_factory=_factory(made))
    second.run()
    assert second.stats.replayed_cuts == 0 and second.stats.restored_jobs == 1
    assert second.stats.messages == 6  # only the new messages
    assert sum(b["coll"].num_rows for b in made[JOB][-1].batches) == 6 * 8 * 2
    assert sum(_key_counts(sink.table("coll")).values()) == coll.num_rows


def test_revoked_partition_writes_nothing_and_is_read_again_by_its_next_owner() -> None:
    """A revoked partition may belong to another consumer already: nothing is written or
    committed for it, and its jobs are dropped; when it comes back, its input is read again
    from the committed offsets and stored once."""
    bus, sink, store = InProcessTransport(), DedupSink(), MemoryStateStore()
    coll = synth.coll(iterations=4)
    bus.publish_meta(synth.meta())
    _publish(bus, coll, 0, 4)
    proc = StreamProcessor(bus, sink, ProcessorConfig(clock="event", checkpoint_messages=10**6,
                                                      checkpoint_interval_s=1e9), state=store,
                           analyzer_factory=synth.FakeAnalyzer)
    proc.step()
    proc.step()
    assert proc.jobs() == [JOB]
    proc.on_revoked({0})
    assert proc.jobs() == [] and sink.batches == [] and not store.snapshots
    assert bus.committed("failslow.coll") == 0
    bus.reassign()
    proc.run()
    assert sum(_key_counts(sink.table("coll")).values()) == coll.num_rows
    assert bus.committed("failslow.coll") == 4


class ThrottledSink(MemorySink):
    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy

    def write(self, batch: SinkBatch) -> None:
        if self.busy:
            self.busy -= 1
            raise SinkBackpressureError(0.01, "down")
        super().write(batch)


def test_backpressure_pauses_the_consumer_and_holds_the_clock() -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    _publish(bus, synth.coll(iterations=3), 0, 3)
    paused: list[bool] = []
    original_pause = bus.pause

    def pause() -> None:
        paused.append(True)
        original_pause()

    bus.pause = pause  # type: ignore[method-assign]
    sink = ThrottledSink(busy=3)
    proc = StreamProcessor(bus, sink, ProcessorConfig(max_backoff_s=0.02),
                           analyzer_factory=synth.FakeAnalyzer)
    proc.run()
    assert paused == [True] and not bus._paused  # paused once, resumed
    assert proc.stats.backpressure == 3 and proc.stats.paused == 0
    assert proc.stats.paused_seconds > 0 and len(sink.batches) == 1 and bus.lag() == 0


def test_wall_clock_stands_still_while_input_waits() -> None:
    """A backlog is no hang: the job's clock moves with wall time only once its partition
    is read to the end, after a grace period, at the pace the stream had."""
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=30)
    _publish(bus, coll, 0, 5)  # a backlog
    made: dict[str, list[synth.FakeAnalyzer]] = {}
    proc = StreamProcessor(bus, None, ProcessorConfig(clock="wall", max_messages=1,
                                                      silence_grace_s=0.2, window_ns=10**15,
                                                      min_batch_rows=0,
                                                      analyzer_kinds=("coll",)),
                           analyzer_factory=_factory(made))
    for _ in range(3):
        proc.step()
    ticks = made[JOB][0].ticks
    times = set(coll.column("t").to_pylist())
    assert ticks and all(t in times for t in ticks)  # event time while behind

    def live() -> None:  # then the job streams in real time (100 ms per iteration)
        for it in range(5, 30):
            _publish(bus, coll, it, it + 1)
            time.sleep(0.1)

    thread = threading.Thread(target=live)
    thread.start()
    while thread.is_alive():
        proc.step(timeout=0.02)
    thread.join()
    proc.run()
    last = max(times)
    assert ticks[-1] <= last + 200_000_000  # no jump while the stream flowed
    silent = time.monotonic()
    while time.monotonic() - silent < 0.8:  # the stream stops: time moves on
        proc.step(timeout=0.05)
    assert ticks[-1] - last > 300_000_000


def test_snapshot_survives_json_and_keeps_pending_messages() -> None:
    bus, store = InProcessTransport(), MemoryStateStore()
    _publish(bus, synth.coll(iterations=2), 0, 2)  # before the meta: pending
    proc = StreamProcessor(bus, MemorySink(), ProcessorConfig(clock="event"), state=store,
                           analyzer_factory=synth.FakeAnalyzer)
    proc.run()
    assert proc.stats.pending_messages == 2
    proc.close()
    saved = store.snapshots[("inprocess", 0)]
    state = unpack(saved[3])
    assert len(state["pending"][JOB]) == 2 and json.dumps(state)
    bus.publish_meta(synth.meta())
    bus.reassign()
    made: dict[str, list[synth.FakeAnalyzer]] = {}
    again = StreamProcessor(bus, MemorySink(), ProcessorConfig(clock="event"), state=store,
                            analyzer_factory=_factory(made))
    again.run()
    assert sum(b["coll"].num_rows for b in made[JOB][0].batches) == 2 * 8 * 2


class RecordingAnalyzer(synth.FakeAnalyzer):
    """Remembers the event-time range of every batch it is given."""

    def __init__(self, meta: JobMeta) -> None:
        super().__init__(meta)
        self.ranges: list[tuple[int, int]] = []

    def update(self, batch: dict[str, pa.Table]) -> synth.Output:
        times = [t for k, tab in batch.items()
                 for t in tab.column("t").to_pylist()] if batch else []
        if times:
            self.ranges.append((min(times), max(times)))
        return super().update(batch)


def test_kinds_consumed_out_of_order_are_analysed_in_time_order() -> None:
    """Topics are fetched independently (Kafka): later progress rows may come before earlier
    coll rows. The processor holds them until every kind has reached their time."""
    from failslow import events

    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=10)
    progress = events.from_rows("progress", [
        {"job": JOB, "rank": 0, "comm": 22, "seq": i, "t": synth.T0 + i * synth.ITER_NS + 50,
         "send_count": 1, "recv_count": 1} for i in range(10)])
    bus.publish("failslow.progress", JOB, progress)  # all ten iterations first
    _publish(bus, coll, 0, 10)
    made: list[RecordingAnalyzer] = []

    def factory(meta: JobMeta) -> RecordingAnalyzer:
        made.append(RecordingAnalyzer(meta))
        return made[-1]

    proc = StreamProcessor(bus, None, ProcessorConfig(clock="event", max_messages=1,
                                                      analyzer_kinds=("coll", "progress"),
                                                      align=True, min_batch_rows=0),
                           analyzer_factory=factory)
    for _ in range(14):
        proc.step()
    ranges = made[0].ranges
    assert len(ranges) >= 5
    for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False):
        assert hi <= lo  # never a later window before an earlier one


def test_silent_jobs_are_retired_and_revived_afresh() -> None:
    """A processor that runs for weeks sees jobs end: a job without a message for
    ``retire_after_s`` lets its detector state go (its held windows analysed first); records
    that come later start it afresh from its kept meta."""
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=6)
    _publish(bus, coll, 0, 3)
    made: dict[str, list[synth.FakeAnalyzer]] = {}
    proc = StreamProcessor(bus, MemorySink(), ProcessorConfig(clock="event", retire_after_s=0.05,
                                                             analyzer_kinds=("coll",)),
                           analyzer_factory=_factory(made))
    proc.run()
    first = made[JOB][0]
    assert sum(b["coll"].num_rows for b in first.batches) > 0  # analysed before retiring
    for _ in range(200):  # polls until the job has been silent long enough
        proc.step(timeout=0.01)
        if proc.stats.jobs_retired:
            break
    assert proc.stats.jobs_retired == 1 and proc.stats.jobs == 0
    assert proc.snapshot()["jobs"] == {}  # no state kept for it
    _publish(bus, coll, 3, 6)  # the job comes back, without a new meta
    proc.run()
    assert len(made[JOB]) == 2 and proc.stats.jobs == 1  # started afresh
    assert sum(b["coll"].num_rows for b in made[JOB][1].batches) > 0
