"""The Kafka transport: the :class:`~failslow.stream.transport.Transport` contract on Apache
Kafka topics, with kafka-python.

Node agents publish record batches (one Arrow IPC stream per message, keyed by job id, so one
job's messages of one kind stay in order on one partition); the stream processor consumes
them in a consumer group and commits only after its sink write (at-least-once), as the
pipeline of the design (README, Architecture; events.md "Record kinds") requires.

The producer side must never stall a training job's node agent:

- records are batched by size and time (``batch_size``, ``linger_ms``) and compressed: the
  Arrow IPC buffers with zstd or lz4 (``ipc_compression``, default the setting
  ``FAILSLOW_KAFKA_COMPRESSION``, done in Arrow's C++ code: zstd about 6x smaller than plain
  IPC, lz4 about 3.5x and about 3x faster to decode), else by Kafka (lz4 when the lz4
  package is there, else gzip);
  ``acks="all"`` and idempotent retries, so a broker restart loses nothing that was
  acknowledged. Kafka's record batches carry CRC-32C checksums: install the ``crc32c``
  package (part of the ``kafka`` extra), without it kafka-python computes them in pure
  Python at about 5 MB/s;
- memory is bounded: at most ``buffer_memory`` bytes of messages wait for acknowledgement.
  When that is full, ``on_full="drop"`` drops the message at once and counts it;
  ``on_full="block"`` waits up to ``max_block_ms`` for room first. The same holds while the
  broker is unreachable at start-up (the connection is made in the background);
- :meth:`KafkaTransport.stats` counts sent, dropped and failed messages.

The consumer side (group, rebalances, positions, commits) is in
:mod:`failslow.stream.kafka_consumer`: it commits only when asked, after the sink write.
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

from failslow.settings import get_settings
from failslow.stream import kafka_compat, kafka_topics
from failslow.stream.kafka_consumer import KafkaConsumerSide
from failslow.stream.transport import (
    EVENT_TOPICS,
    AssignmentListener,
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


#: ``ipc_compression`` default: the codec of the settings (``FAILSLOW_KAFKA_COMPRESSION``)
SETTINGS_CODEC = "settings"


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


class KafkaTransport(KafkaConsumerSide, Transport):
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
                 ipc_compression: str | None = SETTINGS_CODEC,
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
        if ipc_compression == SETTINGS_CODEC:
            codec = get_settings().kafka.ipc_compression
            ipc_compression = None if codec == "none" else codec
        if ipc_compression not in (None, "zstd", "lz4"):
            raise ValueError(f"ipc_compression must be 'zstd', 'lz4' or None, not "
                             f"{ipc_compression!r}")
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
        self._next_rejoin = 0.0
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

    # -- consumer: KafkaConsumerSide (failslow.stream.kafka_consumer) ---------------------

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
