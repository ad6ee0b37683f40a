"""The live pipeline on the real broker: simulated traces -> ``failslow replay`` -> Kafka ->
``failslow process`` (a subprocess, embedded ClickHouse) -> ``failslow query``.

Checked: the stored anomalies are those of ``failslow analyze`` on the same traces; poison
messages land in the dead-letter topic; a broker stop/start mid-stream loses nothing; a
``kill -9`` of the processor mid-stream and a restart lose nothing and store nothing twice
(the restarted processor resumes from its checkpoint); a store that is unavailable for a
while is caught up with afterwards (a locked chDB directory at start-up, and a sink failing
for seconds mid-stream while the consumer stays paused in its group).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from support import stream_synth as synth
from support.parity import differences

from conftest import Broker
from failslow.engine.offline import analyze
from failslow.infra import kafka_broker as infra
from failslow.stream import clickhouse as ch
from failslow.stream import transport as tr
from failslow.stream.kafka import KafkaTransport
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.sink import MemorySink, SinkBackpressureError, SinkBatch
from failslow.stream.state import MemoryStateStore

PRESETS = {"demo": "sim-demo", "hang-hardware": "sim-hang-hw"}


@dataclass
class Trace:
    path: Path
    job: str
    rows: dict[str, int]
    expected: list[dict[str, Any]]  # failslow analyze's anomalies
    iterations: dict[str, Any] | None
    diagnosis: dict[str, Any] = field(default_factory=dict)  # failslow analyze's diagnosis


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trace]:
    from failslow.simulator import load_scenario, simulate
    from failslow.simulator.output import write_sim

    out: dict[str, Trace] = {}
    for preset, job in PRESETS.items():
        path = tmp_path_factory.mktemp(preset)
        sim = simulate(load_scenario(preset), 0)
        assert sim.meta.job == job
        write_sim(sim, path, "parquet")
        diag = analyze(path)
        assert diag.anomalies, f"failslow analyze finds nothing in {preset}"
        out[preset] = Trace(path, job, {k: t.num_rows for k, t in sim.tables.items()},
                            [a.to_dict() for a in diag.anomalies], diag.iterations,
                            json.loads(diag.to_json()))
    return out


def _env(broker: Broker) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"FAILSLOW_KAFKA": broker.bootstrap, "PYTHONUNBUFFERED": "1"})
    return env


def _cli(broker: Broker, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "failslow", *args],
                          env=_env(broker), capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    metrics_port: int
    stats: Path
    log: Path

    def metrics(self) -> dict[str, float]:
        """The processor's Prometheus metrics, ``name{labels}`` -> value ({} if down)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            m = re.match(r"^(failslow_processor_\S+) (\S+)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"the processor did not stop within {timeout:.0f} s; log:\n"
                                 + self.log.read_text()[-3000:]) from None

    def final_stats(self) -> dict[str, Any]:
        assert self.stats.exists(), self.log.read_text()[-3000:]
        return dict(json.loads(self.stats.read_text()))


def _start(broker: Broker, data_dir: Path, prefix: str, *args: str, name: str = "p") -> Proc:
    port = _free_port()
    stats = data_dir / f"{name}-stats.json"
    log = data_dir / f"{name}.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    popen = subprocess.Popen(
        [sys.executable, "-m", "failslow", "-v", "process", "--data-dir",
         str(data_dir), "--topic-prefix", prefix, "--group", f"g-{prefix}",
         "--metrics-port", str(port), "--stats-json", str(stats), *args],
        env=_env(broker), stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)
    return Proc(popen, port, stats, log)


def _until(predicate: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    tail = proc.log.read_text()[-3000:] if proc is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


def _replay(broker: Broker, trace: Trace, prefix: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "failslow", "replay", str(trace.path),
         "--topic-prefix", prefix, "--json", *args],
        env=_env(broker), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _replayed(p: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    summary = dict(json.loads(out.strip().splitlines()[-1]))
    assert summary["dropped"] == 0 and summary["errors"] == 0
    return summary


def _query(broker: Broker, data_dir: Path, job: str) -> dict[str, Any]:
    out = _cli(broker, "query", "anomalies", "--job", job, "--json", "--data-dir",
               str(data_dir))
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def _assert_same_as_analyze(stored: dict[str, Any], trace: Trace) -> None:
    """replay -> process -> query gives failslow analyze's diagnosis, every field."""
    assert differences(trace.diagnosis, stored) == []


class Store:
    """Read a chDB directory after the processor released it."""

    def __init__(self, data_dir: Path) -> None:
        self.sink = ch.ClickHouseSink(ch.connect(data_dir), create=False)

    def __enter__(self) -> ch.ClickHouseSink:
        return self.sink

    def __exit__(self, *exc: object) -> None:
        self.sink.close()


def _assert_stored_once(sink: ch.ClickHouseSink, trace: Trace) -> None:
    """Every event row of the trace is stored, and none twice (physically: no FINAL)."""
    for kind in ("coll", "span", "progress"):
        assert sink.count(kind, trace.job) == trace.rows[kind], kind
    for name in ("rounds", "iterations"):
        assert sink.count(name, trace.job) == sink.count(name, trace.job, final=True), name
    reports = sink.client.query(
        "SELECT id, version, count() FROM failslow.anomalies WHERE job = {j:String} "
        "GROUP BY id, version", parameters={"j": trace.job}).result_rows
    assert reports and all(n == 1 for _, _, n in reports), reports


def _prefix() -> str:
    return f"p{uuid.uuid4().hex[:8]}."


class TracePublisher:
    """Publishes a trace as ``failslow replay --asap`` does (its own windows: the metas
    first, then each window of every job with its watermark), in parts: :meth:`publish`
    sends the windows that end before an event time, then (called again) the rest."""

    def __init__(self, broker: Broker, trace: Trace, prefix: str) -> None:
        from failslow.cli.stream import _windows  # the replay's own cut of the trace

        self.metas, windows, _, self.kinds = _windows(trace.path, 100_000_000, None)
        self.windows = list(windows)
        self.transport = KafkaTransport(broker.bootstrap, subscribe=(), topic_prefix=prefix,
                                        on_full="block", max_block_ms=60_000, linger_ms=20)
        self.messages = 0
        self._next = 0

    @property
    def start_ns(self) -> int:
        return int(self.windows[0][0])

    @property
    def end_ns(self) -> int:
        return int(self.windows[-1][0])

    def publish(self, before_ns: int | None = None) -> int:
        """The windows not yet published that end before ``before_ns`` (all: None),
        acknowledged; returns how many messages."""
        tr_ = self.transport
        assert tr_.wait_connected(60), tr_.stats()
        sent = 0
        if self._next == 0:
            for meta in self.metas:
                tr_.publish_meta(meta)
                sent += 1
            assert tr_.flush(60)
        from failslow.cli.stream import _by_job

        jobs = [m.job for m in self.metas]
        while self._next < len(self.windows):
            now, batch = self.windows[self._next]
            if before_ns is not None and now >= before_ns:
                break
            self._next += 1
            for job, part in _by_job(batch, jobs):
                sent += tr_.publish_batch(job, part, watermark=now, kinds=self.kinds)
        assert tr_.flush(60)
        stats = tr_.stats()
        assert stats["dropped"] == 0 and stats["errors"] == 0, stats
        self.messages += sent
        return sent

    @property
    def done(self) -> bool:
        return self._next >= len(self.windows)

    @property
    def coll_midpoint_ns(self) -> int:
        """The end of the first window by which half the ``coll`` rows are published (a
        hang trace's collectives stop long before its end)."""
        counts = [b["coll"].num_rows if "coll" in b else 0 for _, b in self.windows]
        total, seen = sum(counts), 0
        for (now, _), n in zip(self.windows, counts, strict=True):
            seen += n
            if 2 * seen >= total:
                return int(now) + 1
        return self.end_ns

    def close(self) -> None:
        self.transport.close()


def _event_offsets(broker: Broker, prefix: str, group: str) -> tuple[dict[Any, int],
                                                                    dict[Any, int]]:
    """The end offsets of every event topic partition of ``prefix`` and the offsets
    ``group`` committed there (0 when none), read without joining the group."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="test-offsets")
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                           enable_auto_commit=False, client_id="test-offsets")
    try:
        tps = [TopicPartition(prefix + t, p) for t in tr.EVENT_TOPICS
               for p in (reader.partitions_for_topic(prefix + t) or ())]
        ends = {tp: int(o) for tp, o in reader.end_offsets(tps).items()}
        offsets = admin.list_group_offsets({group: None}).get(group, {})
        committed = {tp: int(om.offset) for tp, om in offsets.items()}
        return ends, {tp: committed.get(tp, 0) for tp in tps}
    finally:
        reader.close()
        admin.close()


def _checkpointed(broker: Broker, prefix: str) -> bool:
    """Whether the processor of ``prefix`` (group ``g-<prefix>``) committed everything
    published so far: its checkpoint covers it."""
    from kafka.errors import CoordinatorNotAvailableError

    try:
        ends, committed = _event_offsets(broker, prefix, f"g-{prefix}")
    except CoordinatorNotAvailableError:  # a broker just started: its offsets topic is new
        return False
    return bool(ends) and sum(ends.values()) > 0 and committed == ends


# ---------------------------------------------------------------------------------------------
# one run, several checks


@dataclass
class E2E:
    data_dir: Path
    prefix: str
    stats: dict[str, Any]
    metrics: dict[str, float]
    stored: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def e2e(broker: Broker, traces: dict[str, Trace],
        tmp_path_factory: pytest.TempPathFactory) -> E2E:
    """Two jobs replayed as fast as possible into one processor, plus two poison messages."""
    data_dir = tmp_path_factory.mktemp("e2e")
    prefix = _prefix()
    proc = _start(broker, data_dir, prefix, "--exit-when-idle", "6")
    replays = [_replay(broker, t, prefix, "--asap") for t in traces.values()]
    for r in replays:
        _replayed(r)
    with KafkaTransport(broker.bootstrap, topic_prefix=prefix, subscribe=()) as poison:
        assert poison.wait_connected(20)
        headers = tr.event_headers("coll")
        poison.produce(tr.topic_for("coll"), "sim-demo", b"\x00not arrow", headers)
        bad = synth.coll(job="sim-demo", iterations=1).drop_columns(["phase"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, bad.schema) as w:
            w.write_table(bad)
        poison.produce(tr.topic_for("coll"), "sim-demo", bytes(sink.getvalue()), headers)
        assert poison.flush(20)
    metrics: dict[str, float] = {}

    def scraped() -> bool:
        metrics.update(proc.metrics())
        return metrics.get('failslow_processor_dead_letters_total{reason="contract"}', 0) >= 1

    _until(scraped, 90, "the poison messages to be processed", proc)
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    stored = {t.job: _query(broker, data_dir, t.job) for t in traces.values()}
    return E2E(data_dir, prefix, proc.final_stats(), metrics, stored)


def test_end_to_end_stores_the_anomalies_of_failslow_analyze(
        e2e: E2E, traces: dict[str, Trace]) -> None:
    for trace in traces.values():
        _assert_same_as_analyze(e2e.stored[trace.job], trace)
    assert e2e.stats["errors"] == 0 and e2e.stats["jobs"] == 2
    with Store(e2e.data_dir) as sink:
        for trace in traces.values():
            _assert_stored_once(sink, trace)
        assert sink.jobs() == sorted(t.job for t in traces.values())


def test_poison_messages_land_in_the_dead_letter_topic(e2e: E2E, broker: Broker) -> None:
    assert e2e.stats["dead_letter_reasons"] == {"malformed": 1, "contract": 1}
    with KafkaTransport(broker.bootstrap, topic_prefix=e2e.prefix, produce=False,
                        subscribe=[tr.DEADLETTER_TOPIC], group_id=f"dlq-{e2e.prefix}") as dlq:
        letters: list[tr.Message] = []
        deadline = time.monotonic() + 30
        while len(letters) < 2 and time.monotonic() < deadline:
            letters += dlq.poll(10, timeout=1.0)
    assert sorted(m.headers[tr.H_ERROR_CLASS] for m in letters) == ["contract", "malformed"]
    assert all(m.key == "sim-demo" and m.headers[tr.H_SOURCE_TOPIC] == "failslow.coll"
               for m in letters)
    assert any(m.value == b"\x00not arrow" for m in letters)
    assert any("phase" in m.headers[tr.H_ERROR] for m in letters)


def test_metrics_endpoint_reports_rows_lag_and_errors(e2e: E2E) -> None:
    m = e2e.metrics
    assert m['failslow_processor_rows_total{kind="coll"}'] > 0
    assert m['failslow_processor_dead_letters_total{reason="malformed"}'] == 1
    for name in ("lag_messages", "rows_per_second", "errors_total", "dropped_total",
                 "checkpoints_total", "backpressure_total"):
        assert f"failslow_processor_{name}" in m, name


def test_anomalies_are_published_on_their_topic(e2e: E2E, broker: Broker) -> None:
    with KafkaTransport(broker.bootstrap, topic_prefix=e2e.prefix, produce=False,
                        subscribe=[tr.ANOMALIES_TOPIC], group_id=f"an-{e2e.prefix}") as sub:
        got: list[tr.Message] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(got) < e2e.stats["anomalies_published"]:
            got += sub.poll(50, timeout=1.0)
    reports = [tr.decode_anomaly(m) for m in got]
    assert len(reports) == e2e.stats["anomalies_published"] > 0
    ids = {(job, a.id) for job, _, a in reports}
    assert ids == {(job, a["id"]) for job, d in e2e.stored.items() for a in d["anomalies"]}


# ---------------------------------------------------------------------------------------------
# failures


def test_broker_stop_and_start_mid_stream_loses_nothing(broker: Broker, traces: dict[str, Trace],
                                                       tmp_path: Path) -> None:
    if broker.state_dir is None:
        pytest.skip(f"{infra.ENV_BOOTSTRAP} names an external broker; cannot restart it")
    trace, prefix = traces["demo"], _prefix()
    proc = _start(broker, tmp_path, prefix, "--checkpoint-interval", "1")
    try:
        replay = _replay(broker, trace, prefix, "--speed", "4")  # ~6 s of publishing
        _until(lambda: proc.metrics().get('failslow_processor_rows_total{kind="coll"}', 0) > 0,
               60, "the first rows", proc)
        assert infra.kafka_down(broker.state_dir, timeout=30)
        time.sleep(2.0)
        infra.kafka_up(broker.port, controller_port=broker.controller_port,
                       state_dir=broker.state_dir, max_lifetime=3 * 3600, timeout=150)
        _replayed(replay, timeout=180)

        def done() -> bool:
            # every kind read (at least once), and nothing left: a topic whose metadata
            # came back late is assigned at a later rebalance (lag unknown until then)
            m = proc.metrics()
            return all(m.get(f'failslow_processor_rows_total{{kind="{kind}"}}', 0)
                       >= trace.rows[kind] for kind in ("coll", "span", "progress")) \
                and m.get("failslow_processor_lag_messages", 1) == 0
        _until(done, 120, "the processor to read everything", proc)
        proc.popen.send_signal(signal.SIGTERM)  # graceful: a last checkpoint, then exit
        assert proc.wait(60) == 0, proc.log.read_text()[-3000:]
    finally:
        if proc.popen.poll() is None:
            proc.popen.kill()
    stats = proc.final_stats()
    assert stats["errors"] == 0
    with Store(tmp_path) as sink:
        _assert_stored_once(sink, trace)
    _assert_same_as_analyze(_query(broker, tmp_path, trace.job), trace)


#: a job's detection split over consumer groups (``--detectors``): the killed group's
#: flags, the other groups' flags (run after it, in this order), and a trace with anomalies
#: of the killed one's detectors. ``track``: the stage that tracks the iterations and exports
#: them to the slow-down stage (``--export``/``--import``): restarted, it publishes again
#: what it published after its last committed cut.
SPLITS: dict[str, tuple[tuple[str, ...], list[tuple[str, ...]], str]] = {
    "slowdown,linkrate": (("--detectors", "slowdown,linkrate"), [("--detectors", "hang")],
                          "demo"),
    "hang": (("--detectors", "hang"), [("--detectors", "slowdown,linkrate")], "hang-hardware"),
    "track": (("--detectors", "iterations", "--export", "iterations"),
              [("--detectors", "slowdown,linkrate", "--import", "iterations"),
               ("--detectors", "hang")], "demo"),
    # one of two evidence reducers killed; then the other, the tracking stage, the
    # slow-down group summing both reducers' rows, and the hang group
    "reduce": (("--detectors", "evidence", "--shard", "0/2", "--export", "evidence"),
               [("--detectors", "evidence", "--shard", "1/2", "--export", "evidence"),
                ("--detectors", "iterations", "--export", "iterations"),
                ("--detectors", "slowdown,linkrate", "--import", "iterations,evidence"),
                ("--detectors", "hang")], "demo"),
}


@pytest.mark.parametrize("killed", [None, *SPLITS])
def test_kill_9_mid_stream_and_restart_no_loss_no_duplicates(
        broker: Broker, traces: dict[str, Trace], tmp_path: Path, killed: str | None) -> None:
    """Half of the trace is published and checkpointed (committed, with a detector
    snapshot), the processor is killed with SIGKILL, the rest is published, and a new
    processor resumes from the checkpoint: every row stored once, the same anomalies.
    ``killed``: the processor runs only these detectors, one group of a job split by
    detector (``--detectors``); the other group runs after it, and the store they share
    holds the same diagnosis."""
    trace = traces[SPLITS[killed][2] if killed else "demo"]
    prefix = _prefix()
    # event time: the pauses of this test (checkpoint, kill, restart) are no silence of the job
    args: tuple[str, ...] = ("--checkpoint-interval", "0.3", "--snapshot-interval", "1",
                             "--clock", "event")
    if killed:
        args += SPLITS[killed][0]
    first = _start(broker, tmp_path, prefix, *args, name="first")
    pub = TracePublisher(broker, trace, prefix)
    try:
        half = pub.publish(before_ns=pub.coll_midpoint_ns)
        assert half > 0 and not pub.done

        def checkpointed() -> bool:
            # everything published is committed, and a snapshot was taken after the last
            # cut (the gauge is set before the commit, so it is read after): the snapshot
            # holds the job (an earlier one may predate its meta message)
            if not _checkpointed(broker, prefix):
                return False
            m = first.metrics()
            return m.get("failslow_processor_snapshots_total", 0) >= 1 and \
                m.get("failslow_processor_cuts_since_snapshot") == 0
        _until(checkpointed, 120, "a checkpoint of the first half", first)
        rows_then = first.metrics().get('failslow_processor_rows_total{kind="coll"}', 0)
        first.popen.send_signal(signal.SIGKILL)
        assert first.popen.wait(10) == -signal.SIGKILL
        rest = pub.publish()
        assert pub.done and rest > 0
    finally:
        pub.close()
        if first.popen.poll() is None:
            first.popen.kill()
    assert 0 < rows_then < trace.rows["coll"], "not killed mid-stream"
    second = _start(broker, tmp_path, prefix, *args, "--exit-when-idle", "5", name="second")
    assert second.wait(180) == 0, second.log.read_text()[-3000:]
    stats = second.final_stats()
    assert stats["restored_jobs"] == 1, "the restarted processor relearned the job"
    assert 0 < stats["messages"] < pub.messages  # resumed, not from the start
    assert stats["errors"] == 0
    # the other groups: the embedded store takes one process at a time
    for i, flags in enumerate(SPLITS[killed][1] if killed else []):
        other = _start(broker, tmp_path, prefix, "--clock", "event", *flags,
                       "--group", f"other{i}-{prefix}", "--no-store-events",
                       "--exit-when-idle", "5", name=f"other{i}")
        assert other.wait(180) == 0, other.log.read_text()[-3000:]
        assert other.final_stats()["errors"] == 0
    with Store(tmp_path) as sink:
        _assert_stored_once(sink, trace)
    _assert_same_as_analyze(_query(broker, tmp_path, trace.job), trace)


def test_store_locked_at_start_then_caught_up(broker: Broker, traces: dict[str, Trace],
                                              tmp_path: Path) -> None:
    trace, prefix = traces["hang-hardware"], _prefix()
    holder = ch.connect(tmp_path)  # chDB: one process per directory; the processor waits
    try:
        proc = _start(broker, tmp_path, prefix, "--exit-when-idle", "5")
        _replayed(_replay(broker, trace, prefix, "--asap"))
        _until(lambda: "waiting for the store" in proc.log.read_text(), 60,
               "the processor to wait for the store", proc)
        assert proc.popen.poll() is None
    finally:
        holder.close()
    assert proc.wait(120) == 0, proc.log.read_text()[-3000:]
    with Store(tmp_path) as sink:
        _assert_stored_once(sink, trace)
    _assert_same_as_analyze(_query(broker, tmp_path, trace.job), trace)


class OutageSink(MemorySink):
    """Pushes back for ``seconds`` from its second write on (ClickHouse down); counts the
    writes it refused."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.down_since: float | None = None
        self.writes = 0
        self.refused = 0

    def write(self, batch: SinkBatch) -> None:
        self.writes += 1
        if self.writes == 2:
            self.down_since = time.monotonic()
        if self.down_since is not None and time.monotonic() - self.down_since < self.seconds:
            self.refused += 1
            raise SinkBackpressureError(0.2, "store down")
        super().write(batch)


def test_sink_down_mid_stream_pauses_then_catches_up(broker: Broker, tmp_path: Path) -> None:
    """The consumer stays in its group while paused (max_poll_interval is shorter than the
    outage), nothing is committed before the write succeeds, and everything arrives."""
    prefix, group = _prefix(), f"g-{uuid.uuid4().hex[:6]}"
    coll = synth.coll(iterations=60)
    seqs = coll.column("seq").to_pylist()
    producer = KafkaTransport(broker.bootstrap, topic_prefix=prefix, subscribe=(),
                              partitions=1)
    assert producer.wait_connected(20)
    producer.publish_meta(synth.meta())
    stop = threading.Event()

    def publish() -> None:
        for it in range(60):
            producer.publish("failslow.coll", "synth-1",
                             coll.take([i for i, s in enumerate(seqs) if s == it]))
            time.sleep(0.1)
        stop.set()

    sink = OutageSink(seconds=7.0)
    consumer = KafkaTransport(broker.bootstrap, topic_prefix=prefix, group_id=group,
                              partitions=1, max_poll_interval_ms=3000,
                              session_timeout_ms=6000)
    proc = StreamProcessor(consumer, sink, ProcessorConfig(clock="event", window_ns=10**15,
                                                           checkpoint_interval_s=0.3,
                                                           max_backoff_s=1.0,
                                                           max_backpressure_retries=None),
                           state=MemoryStateStore(), analyzer_factory=synth.FakeAnalyzer)
    # the outage is what is tested, not the group join: publish once the consumer holds its
    # partitions and has read the job's meta
    try:
        _until(lambda: proc.step(timeout=0.2) >= 0 and consumer.drained(), 60,
               "the consumer to join its group")
    except AssertionError as e:
        raise AssertionError(f"{e}: {consumer.drain_wait}") from None
    thread = threading.Thread(target=publish)
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            proc.step(timeout=0.2)
            stored = sink.table("coll")
            if stop.is_set() and stored is not None and stored.num_rows >= coll.num_rows:
                break
        proc.checkpoint()
    finally:
        thread.join(30)
        producer.close()
        consumer.close()
    stored = sink.table("coll")
    seen = (f"sink writes {sink.writes}, refused {sink.refused}; processor {proc.stats.messages} "
            f"messages, rows {dict(proc.stats.rows)}; producer {producer.stats()}; "
            f"consumer {consumer.stats()}")
    assert stored is not None and stored.num_rows == coll.num_rows, seen
    # every refusal paused consumption (the outage outlasts max_poll_interval: 7 s > 3 s)
    assert sink.refused >= 3 and proc.stats.backpressure == sink.refused
    assert proc.stats.paused == 0 and proc.stats.paused_seconds > 0
    assert consumer.stats()["commit_errors"] == 0  # still a member: commits were accepted


class FakeTime:
    """``time`` for the replay command: ``sleep`` advances ``monotonic``, nothing else does
    (every other attribute is the real module's)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_replay_paces_at_the_requested_speed(broker: Broker, traces: dict[str, Trace],
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``--speed X``: each window is published when X times its event-time offset has
    passed since the start (a clock that only the replay's sleeps advance)."""
    from failslow import cli
    from failslow.cli import stream as stream_cli

    trace = traces["hang-hardware"]
    speed = 1e-9 * _trace_span(trace) / 3  # ~3 s of pacing
    clock = FakeTime()
    monkeypatch.setattr(stream_cli, "time", clock)
    code = cli.main(["replay", str(trace.path), "--kafka", broker.bootstrap,
                     "--topic-prefix", _prefix(), "--json", "--speed", str(speed)])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and summary["dropped"] == 0 and summary["errors"] == 0, summary
    _, windows, _, _ = stream_cli._windows(trace.path, 100_000_000, None)
    due = [1e-9 * now for now, _ in windows]
    expected = (due[-1] - due[0]) / speed  # the last window's due time
    assert 2.5 <= expected <= 3.0
    assert summary["seconds"] == pytest.approx(expected, abs=1e-3), summary
    assert clock.now - 1000.0 == pytest.approx(expected)
    # one sleep per window that was not yet due, none longer than a window's pace
    assert 0 < len(clock.sleeps) < len(due)
    assert max(clock.sleeps) <= max(b - a for a, b in pairwise(due)) / speed + 1e-6


def _trace_span(trace: Trace) -> int:
    """From the first to the last event time of any kind."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    lo, hi = [], []
    for kind, column in (("coll", "t"), ("progress", "t"), ("link", "t"), ("gpu", "t"),
                         ("span", "t_end")):
        path = trace.path / f"{kind}.parquet"
        if path.exists():
            mm = pc.min_max(pq.read_table(path, columns=[column]).column(column)).as_py()
            lo.append(mm["min"])
            hi.append(mm["max"])
    return int(max(hi) - min(lo))
