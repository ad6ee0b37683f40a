"""The Kafka transport: the :class:`~failslow.stream.transport.Transport` contract on Apache
Kafka topics, with kafka-python.

Node agents publish record batches (one Arrow IPC stream per message, keyed by job id, so one
job's messages of one kind stay in order on one partition); the stream processor consumes
them in a consumer group and commits only after its sink write (at-least-once), as the
pipeline of the design (README, Architecture; events.md "Record kinds") requires.

The producer side must never stall a training job's node agent:

- records are batched by size and time (``batch_size``, ``linger_ms``) and compressed: the
  Arrow IPC buffers with zstd (``ipc_compression``, done in Arrow's C++ code, about 6x
  smaller than plain IPC), else by Kafka (lz4 when the lz4 package is there, else gzip);
  ``acks="all"`` and idempotent retries, so a broker restart loses nothing that was
  acknowledged. Kafka's record batches carry CRC-32C checksums: install the ``crc32c``
  package (part of the ``kafka`` extra), without it kafka-python computes them in pure
  Python at about 5 MB/s;
- memory is bounded: at most ``buffer_memory`` bytes of messages wait for acknowledgement.
  When that is full, ``on_full="drop"`` drops the message at once and counts it;
  ``on_full="block"`` waits up to ``max_block_ms`` for room first. The same holds while the
  broker is unreachable at start-up (the connection is made in the background);
- :meth:`KafkaTransport.stats` counts sent, dropped and failed messages.

The consumer side (created on the first :meth:`~KafkaTransport.poll`) never commits by itself:
:meth:`~KafkaTransport.commit` commits the position after everything polled so far, or the
offsets given. Partitions are assigned with the range assignor, so a consumer owns the same
partition number of every topic (all topics have the same partition count, messages are
keyed by job); :meth:`~KafkaTransport.set_listener` reports assignments as partition
numbers, :meth:`~KafkaTransport.seek` moves a position, :meth:`~KafkaTransport.pause` stops
fetching while the consumer keeps polling (and so keeps its group membership) when the
processor's sink pushes back.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from failslow.stream import kafka_compat, kafka_topics
from failslow.stream.transport import (
    EVENT_TOPICS,
    AssignmentListener,
    Message,
    Transport,
    encode,
    event_headers,
    kind_of,
)

log = logging.getLogger(__name__)

DEFAULT_GROUP = "failslow-processor"
#: Largest message value published as one message; :meth:`KafkaTransport.publish` splits
#: larger tables by rows. Below a broker's default ``message.max.bytes`` (1 MiB).
DEFAULT_MAX_MESSAGE_BYTES = 900_000


def _compression() -> str:
    from kafka.codec import has_lz4

    return "lz4" if has_lz4() else "gzip"


def has_fast_crc() -> bool:
    """Whether kafka-python checksums record batches in C (the ``crc32c`` package)."""
    try:
        from kafka.record import util
    except ImportError:  # pragma: no cover - kafka-python is part of the kafka extra
        return False
    return getattr(util, "crc32c_c", None) is not None


class KafkaTransport(Transport):
    """Publish to and consume from Kafka topics.

    ``bootstrap_servers``: ``host:port[,host:port]`` (default: ``failslow.infra.kafka_broker
    .bootstrap_servers()``, i.e. ``$FAILSLOW_KAFKA``). ``group_id``: the consumer group.
    ``subscribe``: the logical topics :meth:`poll` reads (default: every record kind).
    ``topic_prefix`` is put before every Kafka topic name (``"test."`` turns
    ``failslow.coll`` into ``test.failslow.coll``) so that several pipelines can share one
    cluster; messages carry the logical names. ``partitions``: partition count of the topics
    this transport creates (existing topics are left as they are). All topics get the same
    count and messages are keyed by job, so a job's messages of every kind land on the same
    partition number, and a consumer group (range assignment) hands all of a job's topics to
    the same processor.
    """

    def __init__(self, bootstrap_servers: str | None = None,
                 group_id: str = DEFAULT_GROUP, subscribe: Iterable[str] = EVENT_TOPICS, *,
                 topic_prefix: str = "", partitions: int = 4, create_topics: bool = True,
                 client_id: str = "failslow", linger_ms: int = 50,
                 batch_size: int = 512 * 1024, compression: str | None = "auto",
                 ipc_compression: str | None = "zstd",
                 buffer_memory: int = 32 * 1024 * 1024, max_block_ms: int = 1000,
                 on_full: str = "drop", delivery_timeout_ms: int = 120_000,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 auto_offset_reset: str = "earliest", connect_timeout_ms: int = 10_000,
                 commit_flush_timeout: float = 30.0, produce: bool = True,
                 max_poll_interval_ms: int = 300_000, session_timeout_ms: int = 10_000,
                 check_crcs: bool | None = None,
                 security: Mapping[str, Any] | None = None) -> None:
        if on_full not in ("drop", "block"):
            raise ValueError(f"on_full must be 'drop' or 'block', not {on_full!r}")
        from failslow.stream.kafka_security import client_security

        #: kafka-python's security arguments of every client here (producer, consumer,
        #: admin); default: the settings (``FAILSLOW_KAFKA_SECURITY_PROTOCOL``, ...)
        self._security = dict(client_security() if security is None else security)
        if bootstrap_servers is None:
            from failslow.infra.kafka_broker import bootstrap_servers as default_servers

            bootstrap_servers = default_servers()
        self.bootstrap_servers = bootstrap_servers
        self.group_id = group_id
        self.group = group_id
        self.topic_prefix = topic_prefix
        self.partitions = partitions
        self.max_message_bytes = max_message_bytes
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        self.on_full = on_full
        self._subscribed = tuple(subscribe)
        self.ipc_compression = ipc_compression
        if compression == "auto":
            compression = None if ipc_compression else _compression()
        if not has_fast_crc():
            log.warning("the crc32c package is missing: Kafka checksums are computed in pure "
                        "Python (slow); pip install crc32c")
        self._consumer_config: dict[str, Any] = {
            "max_poll_interval_ms": max_poll_interval_ms,
            "session_timeout_ms": session_timeout_ms,
            "heartbeat_interval_ms": max(100, session_timeout_ms // 3),
            "check_crcs": has_fast_crc() if check_crcs is None else check_crcs,
        }
        self._listener: AssignmentListener | None = None
        self._paused = False
        #: what :meth:`drained` last found missing ("" once drained)
        self.drain_wait = "not asked yet"
        self._changes: queue.SimpleQueue[tuple[str, set[int]]] = queue.SimpleQueue()
        self._to_rewind: set[int] = set()  # assigned, not yet at their committed offsets
        self._closing = False
        kafka_compat.install()  # a refused login must reach the client
        self._create_topics = create_topics
        self._client_id = client_id
        self._auto_offset_reset = auto_offset_reset
        self._connect_timeout_ms = connect_timeout_ms
        self.commit_flush_timeout = commit_flush_timeout
        self._producer_config: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers, "client_id": f"{client_id}-producer",
            "acks": "all", "enable_idempotence": True, "linger_ms": linger_ms,
            "batch_size": batch_size,
            "compression_type": compression,
            "max_block_ms": max_block_ms, "delivery_timeout_ms": delivery_timeout_ms,
            "request_timeout_ms": min(30_000, delivery_timeout_ms),
            "retry_backoff_ms": 100, "reconnect_backoff_max_ms": 1000,
            "max_request_size": max(1024 * 1024, max_message_bytes + 64 * 1024),
            "bootstrap_timeout_ms": connect_timeout_ms, **self._security,
        }
        self._lock = threading.Condition()
        self._pending_bytes = 0
        self._pending = 0
        self._counts = {"sent": 0, "dropped": 0, "errors": 0, "bytes_sent": 0, "polled": 0,
                        "commits": 0, "commit_errors": 0, "blocked": 0, "joins": 0}
        self._last_error: str | None = None
        self._producer: Any = None
        self._consumer: Any = None
        self._topics_ready = False
        self._topics_lock = threading.Lock()
        self._next_missing_check = 0.0
        self._closed = threading.Event()
        self._connector: threading.Thread | None = None
        if produce:
            self._connector = threading.Thread(target=self._connect_loop, daemon=True,
                                               name="failslow-kafka-connect")
            self._connector.start()

    # -- topics ---------------------------------------------------------------------------

    def kafka_topic(self, topic: str) -> str:
        """The Kafka topic name of logical ``topic``."""
        return self.topic_prefix + topic

    def _logical(self, kafka_topic: str) -> str:
        prefix = self.topic_prefix
        if prefix and kafka_topic.startswith(prefix):
            return kafka_topic[len(prefix):]
        return kafka_topic

    def ensure_topics(self, topics: Iterable[str] = kafka_topics.ALL_TOPICS) -> list[str]:
        """Create the (logical) ``topics`` that do not exist, with ``partitions`` partitions;
        returns the Kafka names created."""
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                 client_id=f"{self._client_id}-admin",
                                 bootstrap_timeout_ms=self._connect_timeout_ms,
                                 request_timeout_ms=self._connect_timeout_ms,
                                 **self._security)
        try:
            return kafka_topics.create_missing(
                admin, {self.kafka_topic(t): kafka_topics.topic_configs(t) for t in topics},
                self.partitions)
        finally:
            admin.close()

    def _topics_once(self) -> None:
        if not self._create_topics:
            return
        with self._topics_lock:
            if not self._topics_ready:
                self.ensure_topics()
                self._topics_ready = True

    # -- producer -------------------------------------------------------------------------

    def _connect_loop(self) -> None:
        """Background: create the topics and the producer, retrying until it works."""
        from kafka import KafkaProducer

        delay = 0.2
        while not self._closed.is_set():
            try:
                self._topics_once()
                producer = KafkaProducer(**self._producer_config)
            except Exception as e:  # noqa: BLE001 - broker not there yet: retry
                self._note_error(f"connect: {e}")
                log.warning("kafka %s not reachable yet (%s); retrying", self.bootstrap_servers, e)
                self._closed.wait(delay)
                delay = min(delay * 2, 5.0)
                continue
            with self._lock:
                if self._closed.is_set():
                    producer.close(timeout=1)
                    return
                self._producer = producer
                self._lock.notify_all()
            return

    def wait_connected(self, timeout: float = 30.0) -> bool:
        """Wait until the producer is connected; False if it is not within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._producer is None and not self._closed.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return self._producer is not None

    def _note_error(self, text: str) -> None:
        with self._lock:
            self._last_error = text

    def produce(self, topic: str, key: str, value: bytes,
                headers: Mapping[str, str] | None = None) -> int:
        """Queue one message; returns -1 (offsets are known only on acknowledgement).

        Never waits longer than about ``max_block_ms``: when the buffer is full or the broker
        has not been reached yet, the message is dropped and counted (``stats()["dropped"]``).
        """
        if self._closed.is_set():
            raise RuntimeError("transport is closed")
        size = len(value) + len(key) + sum(len(k) + len(v) for k, v in (headers or {}).items())
        if size > self.max_message_bytes + 64 * 1024:
            raise ValueError(f"message of {size} bytes exceeds max_message_bytes "
                             f"{self.max_message_bytes} (publish() splits tables)")
        deadline = time.monotonic() + self.max_block_ms / 1000
        with self._lock:
            waited = False
            while True:
                ready = self._producer is not None
                room = self._pending_bytes + size <= self.buffer_memory
                if ready and room:
                    break
                left = deadline - time.monotonic()
                # Full buffer and policy "drop": give up at once; not yet connected (or
                # policy "block"): wait up to max_block_ms for the condition to change.
                if left <= 0 or (ready and self.on_full == "drop") or self._closed.is_set():
                    self._counts["dropped"] += 1
                    return -1
                if not waited:
                    waited = True
                    self._counts["blocked"] += 1
                self._lock.wait(left)
            self._pending_bytes += size
            self._pending += 1
            producer = self._producer
        try:
            future = producer.send(
                self.kafka_topic(topic), value=value, key=key.encode(),
                headers=[(k, str(v).encode()) for k, v in (headers or {}).items()])
        except Exception as e:  # noqa: BLE001 - metadata timeout, closed producer, ...
            from kafka.errors import KafkaTimeoutError

            self._release(size, "dropped" if isinstance(e, KafkaTimeoutError) else "errors",
                          f"send: {e}")
            return -1
        future.add_callback(self._on_sent, size)
        future.add_errback(self._on_failed, size)
        return -1

    def _release(self, size: int, counter: str, error: str | None = None) -> None:
        with self._lock:
            self._pending_bytes -= size
            self._pending -= 1
            self._counts[counter] += 1
            if counter == "sent":
                self._counts["bytes_sent"] += size
            if error is not None:
                self._last_error = error
            self._lock.notify_all()

    def _on_sent(self, size: int, _metadata: Any) -> None:
        self._release(size, "sent")

    def _on_failed(self, size: int, exc: BaseException) -> None:
        log.warning("kafka delivery failed: %s", exc)
        self._release(size, "errors", f"delivery: {exc}")

    def publish(self, topic: str, key: str, table: pa.Table,
                headers: Mapping[str, str] | None = None) -> int:
        """Publish ``table`` as one message, or as several row slices when its encoding is
        larger than ``max_message_bytes``; returns -1."""
        kind = kind_of(topic)
        if kind is None:
            raise ValueError(f"{topic!r} is not an event topic")
        headers = {**event_headers(kind), **(headers or {})}
        for value in self._encode_split(kind, table):
            self.produce(topic, key, value, headers)
        return -1

    def _encode_split(self, kind: str, table: pa.Table) -> list[bytes]:
        value = encode(kind, table, self.ipc_compression)
        if len(value) <= self.max_message_bytes or table.num_rows <= 1:
            return [value]
        parts = -(-len(value) // self.max_message_bytes) + 1
        step = -(-table.num_rows // parts)
        out: list[bytes] = []
        for start in range(0, table.num_rows, step):
            out.extend(self._encode_split(kind, table.slice(start, step)))
        return out

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued message is acknowledged or failed; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            producer = self._producer
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.flush(timeout=max(0.0, timeout))
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def stats(self) -> dict[str, Any]:
        """Counters: ``sent`` (acknowledged), ``dropped`` (not queued: buffer full or broker
        not reached), ``errors`` (queued but not delivered), ``blocked`` (calls of
        :meth:`produce` that waited for room or the connection), ``pending`` and
        ``pending_bytes`` (awaiting acknowledgement), ``bytes_sent``, ``polled``,
        ``commits``, ``commit_errors``, ``joins`` (consumer group joins completed, with or
        without partitions), ``connected``, ``last_error``."""
        with self._lock:
            return {**self._counts, "pending": self._pending,
                    "pending_bytes": self._pending_bytes,
                    "connected": self._producer is not None, "last_error": self._last_error}

    # -- consumer -------------------------------------------------------------------------

    def _consumer_or_none(self, timeout_ms: int) -> Any:
        if self._consumer is not None:
            return self._consumer
        from kafka import KafkaConsumer
        from kafka.coordinator.assignors.range import RangePartitionAssignor

        try:
            self._topics_once()
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap_servers, group_id=self.group_id,
                client_id=f"{self._client_id}-consumer", enable_auto_commit=False,
                auto_offset_reset=self._auto_offset_reset,
                bootstrap_timeout_ms=max(1000, timeout_ms),
                reconnect_backoff_max_ms=1000, fetch_max_wait_ms=100,
                max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20,
                partition_assignment_strategy=[RangePartitionAssignor],
                # topics are made by ensure_topics (with ``partitions`` partitions), not by
                # the broker's auto-creation (its default count) when the consumer asks
                allow_auto_create_topics=False,
                # a topic whose metadata had not reached this client when the group was
                # joined gets its partitions at the next refresh (and rebalance): seconds,
                # not kafka-python's default five minutes (see also _refresh_missing)
                **{"metadata_max_age_ms": 5000, **self._consumer_config, **self._security})
        except Exception as e:  # noqa: BLE001 - broker not there: poll returns nothing
            self._note_error(f"consumer: {e}")
            log.warning("kafka consumer cannot connect to %s: %s", self.bootstrap_servers, e)
            return None
        # kafka-python 3.0 does not hand allow_auto_create_topics to its metadata: without
        # this, subscribing to topics that do not exist yet creates them with the broker's
        # default partition count (1), and ensure_topics then leaves them so
        cluster_config = getattr(getattr(consumer, "_cluster", None), "config", None)
        if isinstance(cluster_config, dict):
            cluster_config["allow_auto_create_topics"] = False
        consumer.subscribe([self.kafka_topic(t) for t in self._subscribed],
                           listener=self._rebalance_listener())
        self._consumer = consumer
        return consumer

    #: While a subscribed topic is unknown to the consumer's metadata, it is asked for again
    #: this often (seconds).
    missing_topic_refresh_s = 1.0

    def _refresh_missing(self, consumer: Any) -> None:
        """A consumer that joined its group before its topics existed was assigned no
        partitions of them; kafka-python rebalances when its metadata shows them, which it
        refreshes only every ``metadata_max_age_ms``. While a subscribed topic is missing,
        ask for the metadata every ``missing_topic_refresh_s`` instead, so the partitions are
        assigned within about a second of the topic's creation."""
        now = time.monotonic()
        if now < self._next_missing_check:
            return
        self._next_missing_check = now + self.missing_topic_refresh_s
        try:
            cluster = consumer._cluster  # kafka-python's metadata
            missing = [name for name in (self.kafka_topic(t) for t in self._subscribed)
                       if not cluster.partitions_for_topic(name)]
            if missing:
                log.debug("kafka topics not there yet: %s; asking again", missing)
                cluster.request_update()
        except Exception as e:  # noqa: BLE001 - internals changed: the periodic refresh
            log.debug("kafka metadata refresh not requested: %s", e)

    def _rebalance_listener(self) -> Any:
        """kafka-python 3 calls rebalance listeners on its network thread while the polling
        thread waits inside ``consumer.poll``: the listener cannot wait for the polling
        thread (they would wait for each other), and nothing may block on the consumer. So
        it only queues the change, and :meth:`poll` hands it to :meth:`set_listener`'s
        listener after ``consumer.poll`` returns. By then a revoked partition may belong to
        another consumer: the listener writes nothing more for it. A partition lost (the
        group dropped this consumer) is revoked the same way."""
        from kafka import AsyncConsumerRebalanceListener

        transport = self

        class Listener(AsyncConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: Any) -> None:
                numbers = {int(tp.partition) for tp in revoked}
                log.info("kafka partitions revoked: %s", sorted(numbers))
                if numbers and transport._listener is not None and not transport._closing:
                    transport._changes.put(("revoked", numbers))

            async def on_partitions_assigned(self, assigned: Any) -> None:
                numbers = {int(tp.partition) for tp in assigned}
                log.info("kafka partitions assigned: %s", sorted(numbers))
                with transport._lock:
                    transport._counts["joins"] += 1
                if transport._paused and transport._consumer is not None:
                    transport._consumer.pause(*assigned)  # stay paused across a rebalance
                # without a listener no record is dropped, so the kept positions are right
                if numbers and transport._listener is not None and not transport._closing:
                    transport._changes.put(("assigned", numbers))

        return Listener()

    def _dispatch_changes(self) -> set[int]:
        """Hand queued assignment changes to the listener (on the polling thread); returns
        the partition numbers whose records of the current poll are dropped: revoked, or
        assigned (their positions go back to the committed offsets,
        :func:`~failslow.stream.kafka_compat.rewind_to_committed`, before the listener
        hears of them)."""
        dropped: set[int] = set()
        while True:
            try:
                what, numbers = self._changes.get_nowait()
            except queue.Empty:
                break
            if what == "assigned":
                self._to_rewind |= numbers
                self._rewind()
            listener = self._listener
            try:
                if listener is not None:
                    if what == "revoked":
                        listener.on_revoked(numbers)
                    else:
                        listener.on_assigned(numbers)
            except Exception:  # noqa: BLE001 - the rebalance must go on
                log.exception("the assignment listener failed on %s %s", what, sorted(numbers))
            dropped |= numbers
        self._rewind()
        return dropped | self._to_rewind

    def _rewind(self) -> None:
        """Move the partitions assigned since the last call to their committed offsets
        (kept for the next poll while the group coordinator does not answer; their records
        are dropped meanwhile)."""
        consumer = self._consumer
        if not self._to_rewind or consumer is None:
            return
        tps = [tp for tp in consumer.assignment() if tp.partition in self._to_rewind]
        try:
            kafka_compat.rewind_to_committed(consumer, tps, self._auto_offset_reset,
                                             self._connect_timeout_ms)
        except Exception as e:  # noqa: BLE001 - coordinator away: try at the next poll
            log.warning("kafka: cannot read the committed offsets of partitions %s yet (%s); "
                        "their records wait", sorted(self._to_rewind), e)
            return
        self._to_rewind.clear()

    def set_listener(self, listener: AssignmentListener | None) -> None:
        self._listener = listener

    def _tp(self, topic: str, partition: int) -> Any:
        from kafka import TopicPartition

        return TopicPartition(self.kafka_topic(topic), int(partition))

    def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        """Up to ``max_messages`` messages of the subscribed topics (joining the consumer
        group on the first call), waiting at most ``timeout`` seconds for the first."""
        if self._closed.is_set():
            return []
        started = time.monotonic()
        consumer = self._consumer_or_none(int(timeout * 1000))
        if consumer is None:
            return []
        self._refresh_missing(consumer)
        self._dispatch_changes()
        left_ms = max(0, int((timeout - (time.monotonic() - started)) * 1000))
        records = consumer.poll(timeout_ms=left_ms, max_records=max_messages)
        # revoked meanwhile: the next owner reads them; assigned meanwhile: read again
        # from the committed offset
        dropped = self._dispatch_changes()
        out: list[Message] = []
        for tp, batch in records.items():
            if tp.partition in dropped:
                continue
            topic = self._logical(tp.topic)
            for r in batch:
                key = r.key.decode(errors="replace") if r.key is not None else ""
                headers = {k: (v.decode(errors="replace") if v is not None else "")
                           for k, v in (r.headers or [])}
                ts = int(r.timestamp) * 1_000_000 if r.timestamp is not None else 0
                out.append(Message(topic, key, bytes(r.value or b""), headers, int(r.offset),
                                   ts, int(tp.partition)))
        with self._lock:
            self._counts["polled"] += len(out)
        return out

    def seek(self, topic: str, partition: int, offset: int) -> None:
        if self._consumer is None:
            raise RuntimeError("the consumer has not joined its group yet")
        self._consumer.seek(self._tp(topic, partition), int(offset))

    def committed_offset(self, topic: str, partition: int) -> int | None:
        consumer = self._consumer_or_none(self._connect_timeout_ms)
        if consumer is None:
            return None
        offset = consumer.committed(self._tp(topic, partition),
                                    timeout_ms=self._connect_timeout_ms)
        return None if offset is None else int(offset)

    def pause(self) -> None:
        self._paused = True
        if self._consumer is not None:
            self._consumer.pause(*self._consumer.assignment())

    def resume(self) -> None:
        self._paused = False
        if self._consumer is not None:
            self._consumer.resume(*self._consumer.paused())

    def lag(self) -> int | None:
        """Messages after this consumer's positions in its assigned partitions (asks the
        broker for the end offsets); None before the consumer joined or on error."""
        consumer = self._consumer
        if consumer is None:
            return None
        try:
            assigned = list(consumer.assignment())
            if not assigned:
                return 0
            ends = consumer.end_offsets(assigned, timeout_ms=2000)
            at = kafka_compat.positions(consumer)
            return sum(max(0, int(ends[tp]) - int(at[tp] or 0)) for tp in assigned
                       if at.get(tp) is not None and tp in ends)
        except Exception as e:  # noqa: BLE001 - metrics only
            log.debug("kafka lag unknown: %s", e)
            return None

    def drained(self) -> bool:
        """Whether the consumer has joined its group, holds partitions of every subscribed
        topic and has read each of them up to its end offset (asked now): what a one-shot
        reader (``notify --once``) waits for before it stops. While it has not,
        :attr:`drain_wait` says what is missing."""
        consumer = self._consumer
        if consumer is None:
            self.drain_wait = "no consumer yet (the broker was not reached)"
            return False
        try:
            assigned = list(consumer.assignment())
            names = {self.kafka_topic(t) for t in self._subscribed}
            missing = sorted(names - {tp.topic for tp in assigned})
            if not assigned or missing:
                self.drain_wait = (f"no partitions of {', '.join(missing)} assigned yet "
                                   f"({len(assigned)} assigned, group joins so far "
                                   f"{self._counts['joins']})")
                return False
            ends = consumer.end_offsets(assigned, timeout_ms=5000)
            at = kafka_compat.positions(consumer)
            behind = [f"{tp.topic}[{tp.partition}] at {at.get(tp)} of {ends.get(tp)}"
                      for tp in assigned
                      if at.get(tp) is None or int(at[tp] or 0) < int(ends.get(tp, 0))]
            self.drain_wait = "behind: " + ", ".join(behind[:4]) if behind else ""
            return not behind
        except Exception as e:  # noqa: BLE001 - not known yet: keep reading
            log.debug("kafka end offsets unknown: %s", e)
            self.drain_wait = f"end offsets unknown: {type(e).__name__}: {e}"
            return False

    def caught_up(self, partition: int) -> bool | None:
        """Whether the position of every assigned topic of ``partition`` has reached the
        high-water mark of the last fetch response, with the partition's leader connected
        (no network round trip; a broker that is down is no evidence that the job is
        silent); None before the first fetch."""
        consumer = self._consumer
        if consumer is None:
            return None
        try:
            return kafka_compat.caught_up(consumer, partition)
        except Exception:  # noqa: BLE001 - internals changed: unknown
            return None

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit ``offsets`` (``(logical topic, partition) -> next offset``), or the position
        after every message polled so far (synchronously).

        Messages this transport produced before (the processor's anomaly reports, dead
        letters) are flushed first, so an input is committed only after the outputs derived
        from it are acknowledged. If they are not within ``commit_flush_timeout`` seconds,
        or the group was rebalanced meanwhile, nothing is committed: this is logged and
        counted (``commit_errors``), and the inputs are read again after a restart
        (at-least-once)."""
        if self._consumer is None:
            return
        from kafka.errors import CommitFailedError, KafkaError
        from kafka.structs import OffsetAndMetadata

        if self._producer is not None and not self.flush(self.commit_flush_timeout):
            log.warning("kafka commit skipped: produced messages not acknowledged within "
                        "%.0f s", self.commit_flush_timeout)
            with self._lock:
                self._counts["commit_errors"] += 1
                self._last_error = "commit: produced messages not acknowledged"
            return
        explicit = None
        if offsets is not None:
            if not offsets:
                return
            explicit = {self._tp(t, p): OffsetAndMetadata(int(o), "", -1)
                        for (t, p), o in offsets.items()}
        try:
            self._consumer.commit(explicit, timeout_ms=int(self.commit_flush_timeout * 1000))
        except (CommitFailedError, KafkaError) as e:
            log.warning("kafka commit refused: %s", e)
            with self._lock:
                self._counts["commit_errors"] += 1
                self._last_error = f"commit: {e}"
            return
        with self._lock:
            self._counts["commits"] += 1

    def committed(self, topic: str) -> int:
        """The committed offset (next to read) of logical ``topic``, summed over its
        partitions (0 when nothing is committed)."""
        consumer = self._consumer_or_none(self._connect_timeout_ms)
        if consumer is None:
            return 0
        from kafka import TopicPartition

        name = self.kafka_topic(topic)
        parts = consumer.partitions_for_topic(name) or set()
        total = 0
        for p in parts:
            offset = consumer.committed(TopicPartition(name, p))
            total += int(offset or 0)
        return total

    # -- lifetime -------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Flush queued messages (up to ``timeout`` s), then close producer and consumer.
        Does not commit."""
        if self._closed.is_set():
            return
        self._closing = True
        self.flush(timeout)
        self._closed.set()
        with self._lock:
            producer, self._producer = self._producer, None
            self._lock.notify_all()
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=timeout)
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close(autocommit=False)
            self._consumer = None
        if self._connector is not None:
            self._connector.join(timeout=timeout)
