"""Message transport between producers (collectors, replays) and the stream processor.

One message carries one Arrow IPC stream holding exactly one record batch of one record
kind (events.md), keyed by job id, on topic ``failslow.<kind>``. Headers carry the event
contract version and the kind. The processor publishes each anomaly report as a JSON message
(diagnosis.md shape) on ``failslow.anomalies``; messages it cannot decode go, unchanged and
with the reason in a header, to ``failslow.deadletter``.

:class:`Transport` is the contract; :class:`InProcessTransport` an embedded in-memory broker
with one consumer (what the demo and the tests use). A Kafka transport implements the same
four operations (``produce``, ``poll``, ``commit``, ``close``).
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.ipc as ipc

from failslow import events
from failslow.diagnosis import VERSION as DIAGNOSIS_VERSION
from failslow.diagnosis import Anomaly
from failslow.events import ContractError, JobMeta

TOPIC_PREFIX = "failslow."
ANOMALIES_TOPIC = "failslow.anomalies"
DEADLETTER_TOPIC = "failslow.deadletter"
#: Topics of the record kinds, ``meta`` first.
EVENT_TOPICS: tuple[str, ...] = tuple(TOPIC_PREFIX + k for k in events.KINDS)

H_VERSION = "failslow-schema-version"
H_KIND = "failslow-kind"
H_CONTENT_TYPE = "content-type"
H_ERROR = "failslow-error"
H_ERROR_CLASS = "failslow-error-class"
H_SOURCE_TOPIC = "failslow-source-topic"
H_SOURCE_OFFSET = "failslow-source-offset"
H_SOURCE_PARTITION = "failslow-source-partition"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON = "application/json"


def topic_for(kind: str) -> str:
    """The topic of record kind ``kind``."""
    if kind not in events.KINDS:
        raise ValueError(f"unknown record kind {kind!r}")
    return TOPIC_PREFIX + kind


def kind_of(topic: str) -> str | None:
    """The record kind carried on ``topic``, or None for other topics."""
    if topic.startswith(TOPIC_PREFIX):
        kind = topic[len(TOPIC_PREFIX):]
        if kind in events.KINDS:
            return kind
    return None


@dataclass(frozen=True)
class Message:
    """One message as delivered by :meth:`Transport.poll`."""

    topic: str
    key: str  # the job id
    value: bytes
    headers: dict[str, str] = field(default_factory=dict)
    offset: int = -1  # position within the topic (partition); -1 before it is published
    timestamp_ns: int = 0  # wall time of publication
    partition: int = 0  # offsets count per (topic, partition)


class DecodeError(ValueError):
    """A message that breaks the contract; ``reason_class`` is a short category for counting
    (``unknown_kind``, ``schema_version``, ``malformed``, ``contract``, ``key``)."""

    def __init__(self, reason_class: str, message: str) -> None:
        self.reason_class = reason_class
        super().__init__(message)


# ---------------------------------------------------------------------------------------------
# encoding


def encode(kind: str, table: pa.Table, compression: str | None = None) -> bytes:
    """``table`` (conforming to ``kind``) as an Arrow IPC stream of one record batch."""
    table = events.conform(table, kind)
    combined = table.combine_chunks()
    batches = combined.to_batches()
    if not batches:  # no rows
        batch = pa.RecordBatch.from_arrays(
            [pa.array([], type=f.type) for f in combined.schema], schema=combined.schema)
    else:
        batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    sink = pa.BufferOutputStream()
    options = ipc.IpcWriteOptions(compression=compression)
    with ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


def event_headers(kind: str) -> dict[str, str]:
    return {H_VERSION: str(events.VERSION), H_KIND: kind, H_CONTENT_TYPE: ARROW_STREAM}


def decode(message: Message) -> tuple[str, pa.Table]:
    """Kind and conforming table of an event message; :class:`DecodeError` says why not."""
    kind = kind_of(message.topic)
    if kind is None:
        raise DecodeError("unknown_kind", f"topic {message.topic!r} carries no known record "
                                          f"kind (expected one of {', '.join(EVENT_TOPICS)})")
    version = message.headers.get(H_VERSION)
    if version != str(events.VERSION):
        raise DecodeError("schema_version", f"schema version {version!r} is not supported "
                                            f"(expected {events.VERSION})")
    header_kind = message.headers.get(H_KIND, kind)
    if header_kind != kind:
        raise DecodeError("unknown_kind", f"kind header {header_kind!r} does not match "
                                          f"topic {message.topic!r}")
    try:
        reader = ipc.open_stream(pa.BufferReader(message.value))
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as e:
        raise DecodeError("malformed", f"not an Arrow IPC stream ({e})") from None
    if len(batches) != 1:
        raise DecodeError("malformed", f"expected one record batch, found {len(batches)}")
    source = f"{message.topic}@{message.offset}"
    try:
        table = events.conform(pa.Table.from_batches(batches), kind, source)
    except ContractError as e:
        raise DecodeError("contract", str(e)) from None
    if table.num_rows:
        jobs = table.column("job").unique().to_pylist()
        if jobs != [message.key]:
            raise DecodeError("key", f"{source}: rows of job(s) {sorted(jobs)} under key "
                                     f"{message.key!r} (one message holds one job's rows)")
    return kind, table


def encode_anomaly(job: str, anomaly: Anomaly, version: int) -> tuple[bytes, dict[str, str]]:
    """An anomaly report as a JSON message value (diagnosis.md's anomaly object plus ``job``
    and ``version``) and its headers."""
    body = {"job": job, "version": version, **anomaly.to_dict()}
    headers = {H_VERSION: str(DIAGNOSIS_VERSION), H_KIND: "anomaly", H_CONTENT_TYPE: JSON}
    return json.dumps(body, default=str).encode(), headers


def decode_anomaly(message: Message) -> tuple[str, int, Anomaly]:
    """Inverse of :func:`encode_anomaly`: ``(job, version, anomaly)``."""
    body = json.loads(message.value)
    job, version = body.pop("job"), int(body.pop("version"))
    return job, version, Anomaly.from_dict(body)


# ---------------------------------------------------------------------------------------------
# the contract


class Transport(ABC):
    """Publish to topics; consume the subscribed topics with committed positions.

    ``poll`` returns messages after the consumer's position and advances it; ``commit``
    makes the position of everything polled so far durable. After a restart a consumer
    resumes at the committed position, so messages polled but not committed are delivered
    again (at-least-once)."""

    @abstractmethod
    def produce(self, topic: str, key: str, value: bytes,
                headers: Mapping[str, str] | None = None) -> int:
        """Publish raw bytes; returns the message's offset in ``topic`` (-1 if unknown)."""

    @abstractmethod
    def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        """Up to ``max_messages`` messages of the subscribed topics, waiting at most
        ``timeout`` seconds for the first one."""

    @abstractmethod
    def commit(self) -> None:
        """Commit the position after the last polled message."""

    @abstractmethod
    def close(self) -> None:
        """Release the transport."""

    def publish(self, topic: str, key: str, table: pa.Table) -> int:
        """Publish ``table`` (one job's rows of the kind of ``topic``) as one message."""
        kind = kind_of(topic)
        if kind is None:
            raise ValueError(f"{topic!r} is not an event topic")
        return self.produce(topic, key, encode(kind, table), event_headers(kind))

    def publish_meta(self, meta: JobMeta) -> int:
        return self.publish(topic_for("meta"), meta.job,
                            events.from_rows("meta", [meta.to_row()]))

    def publish_batch(self, job: str, batch: Mapping[str, pa.Table]) -> int:
        """Publish one message per non-empty kind of ``batch``; returns how many."""
        n = 0
        for kind in events.KINDS:
            table = batch.get(kind)
            if table is not None and table.num_rows:
                self.publish(topic_for(kind), job, table)
                n += 1
        return n

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessTransport(Transport):
    """An embedded broker: every topic is an in-memory log, one consumer reads the subscribed
    topics in publication order. Thread-safe; ``poll`` waits on a condition variable.

    ``keep_committed=False`` drops committed messages (bounded memory for long replays);
    with the default they stay readable through :meth:`messages`.
    """

    def __init__(self, subscribe: Iterable[str] = EVENT_TOPICS,
                 keep_committed: bool = True) -> None:
        self._subscribed = frozenset(subscribe)
        self._keep = keep_committed
        self._log: deque[Message] = deque()  # all topics, publication order
        self._base = 0  # global index of self._log[0]
        self._next_offset: dict[str, int] = {}
        self._cursor = 0  # global index of the next message to consider
        self._committed_cursor = 0
        self._position: dict[str, int] = {}  # topic -> next offset to deliver
        self._committed: dict[str, int] = {}
        self._cond = threading.Condition()
        self._closed = False

    # producer side

    def produce(self, topic: str, key: str, value: bytes,
                headers: Mapping[str, str] | None = None) -> int:
        with self._cond:
            if self._closed:
                raise RuntimeError("transport is closed")
            offset = self._next_offset.get(topic, 0)
            self._next_offset[topic] = offset + 1
            self._log.append(Message(topic, key, bytes(value), dict(headers or {}), offset,
                                     time.time_ns()))
            self._cond.notify_all()
            return offset

    # consumer side

    def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while True:
                out = self._take(max_messages)
                remaining = deadline - time.monotonic()
                if out or remaining <= 0 or self._closed:
                    return out
                self._cond.wait(remaining)

    def _take(self, max_messages: int) -> list[Message]:
        out: list[Message] = []
        end = self._base + len(self._log)
        while self._cursor < end and len(out) < max_messages:
            msg = self._log[self._cursor - self._base]
            self._cursor += 1
            if msg.topic in self._subscribed:
                out.append(msg)
                self._position[msg.topic] = msg.offset + 1
        return out

    def commit(self) -> None:
        with self._cond:
            self._committed_cursor = self._cursor
            self._committed.update(self._position)
            if not self._keep:
                self._trim()

    def _trim(self) -> None:
        while self._base < self._committed_cursor and self._log:
            self._log.popleft()
            self._base += 1

    def seek_to_committed(self) -> None:
        """Rewind the consumer to the committed position, as a restarted consumer would."""
        with self._cond:
            self._cursor = self._committed_cursor
            self._position = dict(self._committed)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # inspection (tests, demo)

    def messages(self, topic: str) -> list[Message]:
        """Every retained message of ``topic``, in offset order."""
        with self._cond:
            return [m for m in self._log if m.topic == topic]

    def committed(self, topic: str) -> int:
        """The committed offset (next to read) of ``topic``."""
        with self._cond:
            return self._committed.get(topic, 0)

    def end_offset(self, topic: str) -> int:
        with self._cond:
            return self._next_offset.get(topic, 0)

    def lag(self) -> int:
        """Messages of subscribed topics published but not yet committed."""
        with self._cond:
            return sum(1 for i, m in enumerate(self._log)
                       if self._base + i >= self._committed_cursor
                       and m.topic in self._subscribed)
