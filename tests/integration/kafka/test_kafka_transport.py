"""KafkaTransport against a real Apache Kafka broker (KRaft, one node, 127.0.0.1).

The broker is the session fixture ``broker`` of tests/conftest.py (failslow.infra.kafka_broker on
free ports in a temporary state dir, unless ``FAILSLOW_KAFKA`` names one). Every test uses its own
topic prefix and consumer groups.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from conftest import Broker
from failslow import events
from failslow.infra import kafka_broker as infra
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import (
    ANOMALIES_TOPIC,
    Message,
    decode,
    encode,
    event_headers,
    topic_for,
)

COLL = topic_for("coll")
BIG_COMMS = np.array([2**64 - 1, 2**63 + 12345, 7, 2**40 + 1], dtype=np.uint64)


def sim_coll(job: str, rounds: int, ranks: int = 8, seed: int = 0) -> pa.Table:
    """Simulated all-reduce rounds: enter and end rows per rank per round, uint64 comm ids
    over the full range, nullable columns partly null."""
    rng = np.random.default_rng(seed)
    n = rounds * ranks * 2
    rnd = np.repeat(np.arange(rounds), ranks * 2)
    rank = np.tile(np.repeat(np.arange(ranks), 2), rounds).astype(np.int32)
    phase = np.tile([events.ENTER, events.END], rounds * ranks).astype(np.int8)
    t_enter = 1_750_000_000_000_000_000 + rnd * 10_000_000 + rng.integers(0, 1_000_000, n)
    t = t_enter + phase.astype(np.int64) * 2_000_000
    t_start = np.where(phase == events.END, t - 1_000_000, events.NULL_TIME)
    counts = np.where(phase == events.END, rng.integers(0, 2**63, n, dtype=np.uint64)
                      + np.uint64(2**63), events.NULL_COUNT).astype(np.uint64)
    cols = {
        "job": job, "rank": rank, "comm": BIG_COMMS[rnd % len(BIG_COMMS)],
        "comm_rank": rank, "comm_size": np.full(n, ranks, np.int32),
        "seq": (rnd // len(BIG_COMMS)).astype(np.uint64),
        "op": np.full(n, events.OP["allreduce"], np.int8),
        "bytes": np.full(n, 1 << 20, np.uint64), "peer": np.full(n, -1, np.int32),
        "phase": phase, "t": t.astype(np.int64), "t_start": t_start.astype(np.int64),
        "send_count": counts, "recv_count": counts,
    }
    return events.from_columns(cols, "coll")


def transport(broker: Broker, **kw: Any) -> KafkaTransport:
    kw.setdefault("group_id", f"g-{uuid.uuid4().hex[:8]}")
    return KafkaTransport(broker.bootstrap, **kw)


def consume(tr: KafkaTransport, n: int, timeout: float = 30.0) -> list[Message]:
    """Poll until ``n`` messages arrived (or ``timeout``)."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += tr.poll(500, timeout=1.0)
    return got


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}."


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_roundtrip_identical_rows_keys_headers(broker: Broker) -> None:
    pfx = prefix()
    jobs = ["job-a", "job.b_2"]
    sent: dict[str, list[pa.Table]] = {j: [] for j in jobs}
    with transport(broker, topic_prefix=pfx, subscribe=[COLL, ANOMALIES_TOPIC],
                   partitions=3) as tr:
        assert tr.wait_connected(20)
        for i in range(12):
            job = jobs[i % 2]
            table = sim_coll(job, rounds=5 + i, seed=i)
            sent[job].append(table)
            assert tr.publish(COLL, job, table) == -1
        tr.produce(ANOMALIES_TOPIC, "job-a", b'{"x": 1}', {"content-type": "application/json"})
        assert tr.flush(20)
        stats = tr.stats()
        assert (stats["sent"], stats["dropped"], stats["errors"]) == (13, 0, 0)

        got = consume(tr, 13)
    assert len(got) == 13
    anomalies = [m for m in got if m.topic == ANOMALIES_TOPIC]
    assert [(m.key, m.value, m.headers) for m in anomalies] == [
        ("job-a", b'{"x": 1}', {"content-type": "application/json"})]
    colls = [m for m in got if m.topic == COLL]
    assert {m.topic for m in colls} == {COLL}  # logical names, prefix stripped
    for job in jobs:
        mine = sorted((m for m in colls if m.key == job), key=lambda m: m.offset)
        assert all(m.headers == event_headers("coll") for m in mine)
        assert all(m.timestamp_ns > 0 for m in mine)
        tables = [decode(m)[1] for m in mine]  # decode checks key == every row's job
        assert len(tables) == len(sent[job])
        for got_t, want_t in zip(tables, sent[job], strict=True):
            assert got_t.equals(want_t)
            assert got_t.column("comm").type == pa.uint64()
        comms = pa.concat_tables(tables).column("comm").to_numpy()
        assert comms.max() == np.uint64(2**64 - 1)
    for job in jobs:  # key = job: one partition per job, offsets count per partition
        assert len({m.partition for m in colls if m.key == job}) == 1
    for part in {m.partition for m in colls}:
        offsets = sorted(m.offset for m in colls if m.partition == part)
        assert offsets == list(range(len(offsets)))


def test_large_table_is_split_and_reassembled(broker: Broker) -> None:
    table = sim_coll("big-job", rounds=400, seed=3)  # 6400 rows, ~600 kB encoded
    with transport(broker, topic_prefix=prefix(), subscribe=[COLL],
                   max_message_bytes=100_000, ipc_compression=None) as tr:
        assert tr.wait_connected(20)
        tr.publish(COLL, "big-job", table)
        assert tr.flush(20)
        n = tr.stats()["sent"]
        assert n > 5
        got = consume(tr, n)
    assert len(got) == n
    assert all(len(m.value) <= 100_000 for m in got)
    parts = [decode(m)[1] for m in sorted(got, key=lambda m: m.offset)]
    assert pa.concat_tables(parts).equals(table)


def test_messages_are_zstd_compressed_arrow_and_decode_unchanged(broker: Broker) -> None:
    table = sim_coll("zjob", rounds=400, seed=4)
    plain = len(encode("coll", table))
    with transport(broker, topic_prefix=prefix(), subscribe=[COLL]) as tr:
        assert tr.wait_connected(20)
        tr.publish(COLL, "zjob", table)
        assert tr.flush(20)
        [got] = consume(tr, 1)
    assert len(got.value) < plain / 2  # the IPC buffers are compressed
    assert decode(got)[1].equals(table)


def _kafka_topics(broker: Broker) -> dict[str, int]:
    """Every topic of the broker with its partition count (asked with an admin client, which
    creates nothing)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, client_id="test-admin")
    try:
        return {t["name"]: len(t["partitions"]) for t in admin.describe_topics()}
    finally:
        admin.close()


def test_a_requested_rejoin_rebalances_the_group(broker: Broker) -> None:
    """``kafka_compat.request_rejoin``, which a one-shot reader uses when its group gave it
    no partition of a topic that exists, makes this kafka-python rejoin its group."""
    from failslow.stream import kafka_compat

    pfx = prefix()
    with transport(broker, topic_prefix=pfx, subscribe=(), partitions=2) as producer:
        assert producer.ensure_topics()
    consumer = transport(broker, topic_prefix=pfx, produce=False, partitions=2)
    try:
        deadline = time.monotonic() + 60
        while not consumer.drained():
            assert time.monotonic() < deadline, consumer.drain_wait
            consumer.poll(10, timeout=0.5)
        joined = consumer.stats()["joins"]
        assert kafka_compat.request_rejoin(consumer._consumer)
        while consumer.stats()["joins"] == joined:
            assert time.monotonic() < deadline, "no rebalance after request_rejoin"
            consumer.poll(10, timeout=0.5)
        assert consumer.drained()
    finally:
        consumer.close()


#: A consumer that joined its group before its topics existed gets their partitions and
#: their messages within this many seconds of their creation.
SUBSCRIBE_BEFORE_CREATE_S = 10.0


def test_consumer_started_before_its_topics_exist_consumes_soon_after_they_are_created(
        broker: Broker) -> None:
    """The processor's case on a fresh cluster: it joins its group while the topics are not
    there yet (so it is assigned nothing), then someone creates them and publishes."""
    pfx = prefix()
    consumer = transport(broker, topic_prefix=pfx, produce=False, create_topics=False,
                         partitions=4)
    try:
        # join the group with no topic there: the join completes with no partitions
        deadline = time.monotonic() + 60
        while consumer.stats()["joins"] == 0:
            assert time.monotonic() < deadline, "the consumer never joined its group"
            assert consumer.poll(10, timeout=0.5) == []
        for _ in range(3):  # and stays so: subscribing creates no topic
            assert consumer.poll(10, timeout=0.2) == []
        assert not [t for t in _kafka_topics(broker) if t.startswith(pfx)]
        joined = consumer.stats()["joins"]

        with transport(broker, topic_prefix=pfx, subscribe=(), partitions=4) as producer:
            assert producer.ensure_topics()  # now they exist, with 4 partitions each
            created = time.monotonic()
            assert producer.wait_connected(20)
            jobs = [f"job-{i}" for i in range(8)]  # keyed over (very likely) every partition
            for i, job in enumerate(jobs):
                producer.publish(COLL, job, sim_coll(job, 1, ranks=2, seed=i))
            assert producer.flush(20)

            got: list[Message] = []
            polls = 0
            while len(got) < len(jobs):
                waited = time.monotonic() - created
                assert waited < SUBSCRIBE_BEFORE_CREATE_S, (
                    f"{len(got)} of {len(jobs)} messages {waited:.1f} s after the topics "
                    f"were created ({polls} polls, joins {consumer.stats()['joins']})")
                got += consumer.poll(100, timeout=0.2)
                polls += 1
        assert sorted(m.key for m in got) == jobs
        assert consumer.stats()["joins"] > joined  # rebalanced onto the new partitions
        parts = _kafka_topics(broker)
        assert parts[pfx + COLL] == 4  # made by ensure_topics, not by the consumer's asking
        assert {m.partition for m in got} <= set(range(4))
    finally:
        consumer.close()


def test_offsets_commit_only_on_commit(broker: Broker) -> None:
    pfx, group = prefix(), f"g-{uuid.uuid4().hex[:8]}"
    with transport(broker, topic_prefix=pfx, subscribe=[COLL], group_id=group) as tr:
        assert tr.wait_connected(20)
        for i in range(5):
            tr.publish(COLL, "j1", sim_coll("j1", 2, seed=i))
        assert tr.flush(20)
        first = consume(tr, 5)
        assert [m.offset for m in first] == [0, 1, 2, 3, 4]
        # closed without commit()

    # a linger far longer than the commit's flush timeout (30 s): only a flush that commit()
    # forces gets the report acknowledged
    with transport(broker, topic_prefix=pfx, subscribe=[COLL], group_id=group,
                   linger_ms=600_000, delivery_timeout_ms=900_000) as again:
        assert again.wait_connected(20)
        reread = consume(again, 5)
        assert [m.offset for m in reread] == [0, 1, 2, 3, 4]
        assert [m.value for m in reread] == [m.value for m in first]
        # As the processor does: publish a report, then commit the input. The commit waits
        # for the report's acknowledgement, which it forces (not for the linger).
        again.produce(ANOMALIES_TOPIC, "j1", b"{}", {})
        assert again.stats()["pending"] == 1
        again.commit()
        stats = again.stats()
        assert (stats["pending"], stats["sent"], stats["commits"]) == (0, 1, 1), stats
        assert stats["commit_errors"] == 0
        assert again.committed(COLL) == 5

    with transport(broker, topic_prefix=pfx, subscribe=[COLL], group_id=group) as after:
        assert after.poll(100, timeout=3.0) == []
        after.publish(COLL, "j1", sim_coll("j1", 1, seed=9))
        assert after.flush(20)
        rest = consume(after, 1)
        assert [m.offset for m in rest] == [5]


class _Assignments:
    """An assignment listener that notes what it is told."""

    def __init__(self) -> None:
        self.assigned: list[set[int]] = []
        self.revoked: list[set[int]] = []

    def on_assigned(self, partitions: set[int]) -> None:
        self.assigned.append(set(partitions))

    def on_revoked(self, partitions: set[int]) -> None:
        self.revoked.append(set(partitions))

    def on_lost(self, partitions: set[int]) -> None:
        self.revoked.append(set(partitions))


def test_a_partition_assigned_again_starts_at_its_committed_offset(broker: Broker) -> None:
    """A rebalance revokes every partition (eager protocol) and assigns them again. Records
    fetched meanwhile for a revoked partition are dropped (its next owner reads them), so a
    partition that comes back must start at its committed offset, as the Java consumer does;
    kafka-python 3.0 keeps its position instead, and the records polled since the commit
    were never delivered again."""
    pfx, group = prefix(), f"g-{uuid.uuid4().hex[:8]}"
    heard = _Assignments()
    # the range assignor orders members by id (client id first): this one keeps partition 0
    with transport(broker, topic_prefix=pfx, subscribe=[COLL], group_id=group, partitions=1,
                   client_id="a-keeps") as tr:
        tr.set_listener(heard)
        assert tr.wait_connected(20)
        for i in range(6):
            tr.publish(COLL, "j1", sim_coll("j1", 1, seed=i))
        assert tr.flush(20)
        assert [m.offset for m in consume(tr, 6)] == [0, 1, 2, 3, 4, 5]
        tr.commit({(COLL, 0): 2})
        assert len(heard.assigned) == 1
        # a second member of the group makes it rebalance; this consumer keeps its partition
        stop = threading.Event()

        def member() -> None:
            with transport(broker, topic_prefix=pfx, subscribe=[COLL], group_id=group,
                           partitions=1, client_id="b-joins") as other:
                while not stop.is_set():
                    other.poll(10, timeout=0.2)

        thread = threading.Thread(target=member, daemon=True)
        thread.start()
        try:
            again: list[Message] = []
            deadline = time.monotonic() + 60
            while (len(heard.assigned) < 2 or len(again) < 4) and time.monotonic() < deadline:
                again += tr.poll(100, timeout=0.5)
        finally:
            stop.set()
            thread.join(30)
        assert heard.revoked and heard.assigned[-1] == {0}, (heard.revoked, heard.assigned)
        assert [m.offset for m in again] == [2, 3, 4, 5]


def test_full_buffer_drops_and_counts_without_blocking(broker: Broker) -> None:
    table = sim_coll("j1", rounds=40, seed=1)
    size = len(encode("coll", table))
    budget = 5 * size + size // 2  # room for 5 messages
    # A long linger keeps the first messages unacknowledged while the buffer fills up.
    with transport(broker, topic_prefix=prefix(), subscribe=[COLL], buffer_memory=budget,
                   linger_ms=2000, batch_size=4 * 1024 * 1024, on_full="drop",
                   max_block_ms=5000, ipc_compression=None) as tr:
        assert tr.wait_connected(20)
        for _ in range(20):
            tr.publish(COLL, "j1", table)
        stats = tr.stats()
        assert stats["dropped"] == 15, stats
        assert stats["pending"] == 5 and stats["pending_bytes"] <= budget
        assert stats["blocked"] == 0, stats  # dropping does not wait for max_block_ms
        assert tr.flush(20)
        stats = tr.stats()
        assert (stats["sent"], stats["dropped"], stats["errors"]) == (5, 15, 0)
        assert len(consume(tr, 5)) == 5
        assert tr.poll(100, timeout=1.0) == []

    with transport(broker, topic_prefix=prefix(), subscribe=[COLL], buffer_memory=budget,
                   linger_ms=3000, batch_size=4 * 1024 * 1024, on_full="block",
                   max_block_ms=400, ipc_compression=None) as blocking:
        assert blocking.wait_connected(20)
        for _ in range(5):
            blocking.publish(COLL, "j1", table)
        assert blocking.stats()["blocked"] == 0  # room for these
        blocking.publish(COLL, "j1", table)
        stats = blocking.stats()
        # waited (max_block_ms) for room, which the 3 s linger does not make, then dropped
        assert (stats["blocked"], stats["dropped"], stats["pending"]) == (1, 1, 5), stats


def test_broker_restart_mid_stream_loses_nothing_acknowledged(broker: Broker) -> None:
    if broker.state_dir is None:
        pytest.skip(f"{infra.ENV_BOOTSTRAP} names an external broker; cannot restart it")
    total, pfx = 300, prefix()
    published = threading.Event()
    with transport(broker, topic_prefix=pfx, subscribe=[COLL], linger_ms=5) as tr:
        assert tr.wait_connected(20)

        def produce() -> None:
            for i in range(total):
                one = sim_coll("restart-job", 1, ranks=2, seed=i)
                tr.publish(COLL, "restart-job",
                           one.set_column(5, "seq", pa.array([i] * one.num_rows, pa.uint64())))
                time.sleep(0.02)
            published.set()

        thread = threading.Thread(target=produce)
        thread.start()
        _wait_for(lambda: tr.stats()["sent"] > 10, 60, "10 messages acknowledged")
        assert infra.kafka_down(broker.state_dir, timeout=30)
        down_at = tr.stats()["sent"]
        # published while the broker was down
        _wait_for(lambda: tr.stats()["pending"] > 0, 60, "messages waiting for the broker")
        infra.kafka_up(broker.port, controller_port=broker.controller_port,
                       state_dir=broker.state_dir, max_lifetime=3 * 3600, timeout=150)
        thread.join(60)
        assert published.is_set()
        assert tr.flush(60)
        stats = tr.stats()
        assert stats["sent"] > down_at
        assert (stats["sent"], stats["dropped"], stats["errors"]) == (total, 0, 0), stats

    with transport(broker, topic_prefix=pfx, subscribe=[COLL], produce=False) as reader:
        got = consume(reader, total, timeout=60)
    seqs = [int(decode(m)[1].column("seq")[0].as_py()) for m in got]
    assert sorted(set(seqs)) == list(range(total))  # nothing acknowledged was lost
    assert len(seqs) == total  # and the idempotent producer wrote nothing twice
    assert seqs == sorted(seqs)  # one job, one partition: in order


def test_infra_status_cli_reports_the_running_broker(broker: Broker) -> None:
    if broker.state_dir is None:
        pytest.skip(f"{infra.ENV_BOOTSTRAP} names an external broker")
    status = infra.kafka_status(broker.state_dir, check=True)
    assert status.running and status.ready and status.port == broker.port
    assert status.stops_at is not None and status.stops_at > time.time()
    out = subprocess.run(
        [sys.executable, "-m", "failslow", "infra", "status", "--state-dir",
         str(broker.state_dir), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["running"] and data["bootstrap"] == broker.bootstrap and data["ready"]
    # `up` on a running broker of the same state dir leaves it alone.
    again = infra.kafka_up(broker.port, state_dir=broker.state_dir)
    assert again.pid == status.pid


def test_broker_stops_by_itself_after_max_lifetime(broker: Broker,
                                                   tmp_path: Path) -> None:
    if broker.state_dir is None:
        pytest.skip("needs the local broker set-up")
    status = infra.kafka_up(0, state_dir=tmp_path, max_lifetime=20, timeout=60, heap="256m")
    assert status.running
    deadline = time.monotonic() + 90
    while infra.kafka_status(tmp_path).running and time.monotonic() < deadline:
        time.sleep(0.5)
    try:
        assert not infra.kafka_status(tmp_path).running
    finally:
        infra.kafka_down(tmp_path)


def test_a_broker_that_cannot_start_fails_with_its_log_tail(broker: Broker,
                                                            tmp_path: Path) -> None:
    if broker.state_dir is None:
        pytest.skip("needs the local broker set-up")
    # the exit is noticed: "exited with status", not "did not answer ... within" the timeout
    with pytest.raises(infra.InfraError, match="exited with status") as err:
        infra.kafka_up(0, state_dir=tmp_path, heap="1k", timeout=60)  # no JVM starts on 1 kB
    assert "heap" in str(err.value).lower()  # the JVM's complaint, from the log tail
    assert not infra.kafka_status(tmp_path).running


def test_lag_is_unknown_while_a_subscribed_topic_waits_for_its_partitions(
        broker: Broker) -> None:
    """After a broker restart a topic's metadata can come back later than the others': the
    consumer holds partition p of one topic and not yet of the other, which the group assigns
    at its next rebalance. Its lag is unknown then, not 0 ("caught up" with a topic unread:
    a test stopped its processor on that and lost rows)."""
    pfx = prefix()
    span = topic_for("span")
    consumer = transport(broker, topic_prefix=pfx, produce=False, create_topics=False,
                         subscribe=(COLL, span), partitions=2)
    try:
        with transport(broker, topic_prefix=pfx, subscribe=(), partitions=2, produce=False,
                       create_topics=False) as admin:
            assert admin.ensure_topics([COLL])
            deadline = time.monotonic() + 60
            while len(consumer._consumer.assignment() if consumer._consumer else ()) < 2:
                assert time.monotonic() < deadline, "coll's partitions never assigned"
                consumer.poll(10, timeout=0.2)
            assert consumer.lag() == 0
            assert admin.ensure_topics([span])
        kafka = consumer._consumer
        deadline = time.monotonic() + 30
        while not kafka._cluster.partitions_for_topic(pfx + span):  # known, not yet assigned
            assert time.monotonic() < deadline, "the new topic never reached the metadata"
            kafka._cluster.request_update()
            time.sleep(0.2)
        assert {tp.topic for tp in kafka.assignment()} == {pfx + COLL}
        assert consumer.lag() is None
        deadline = time.monotonic() + 60
        while len(kafka.assignment()) < 4:  # the rebalance onto the new topic
            assert time.monotonic() < deadline, "the new topic's partitions never assigned"
            consumer.poll(10, timeout=0.2)
        assert consumer.lag() == 0
    finally:
        consumer.close()
