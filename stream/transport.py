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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

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
#: Optional on event messages: every row of this kind of this job with a time up to this
#: value (ns) has been published, so a consumer need not wait for more of it.
H_WATERMARK = "failslow-watermark"
#: ``post-mortem`` on the last messages of a replayed post-mortem trace (Flight Recorder
#: dumps): nothing will follow, and what is in flight at the watermark never completed.
H_END = "failslow-end"
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
    return one_batch_stream(events.conform(table, kind), compression)


def one_batch_stream(table: pa.Table, compression: str | None = None) -> bytes:
    """``table`` as an Arrow IPC stream of one record batch (no rows: an empty one)."""
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


_READABLE = tuple(str(v) for v in events.READABLE_VERSIONS)


def event_headers(kind: str) -> dict[str, str]:
    return {H_VERSION: str(events.VERSION), H_KIND: kind, H_CONTENT_TYPE: ARROW_STREAM}


def decode(message: Message) -> tuple[str, pa.Table]:
    """Kind and conforming table of an event message; :class:`DecodeError` says why not."""
    kind = kind_of(message.topic)
    if kind is None:
        raise DecodeError("unknown_kind", f"topic {message.topic!r} carries no known record "
                                          f"kind (expected one of {', '.join(EVENT_TOPICS)})")
    version = message.headers.get(H_VERSION)
    if version not in _READABLE:
        raise DecodeError("schema_version", f"schema version {version!r} is not supported "
                                            f"(expected one of {', '.join(_READABLE)})")
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


class AssignmentListener(Protocol):
    """Told which partition numbers a consumer owns. A partition number stands for that
    partition of every subscribed topic: all topics have the same partition count and
    messages are keyed by job, so one job's messages of every kind share one number."""

    def on_assigned(self, partitions: set[int]) -> None: ...

    def on_revoked(self, partitions: set[int]) -> None:
        """Taken away: another consumer may own them already, so nothing more is written
        or committed for them (their next owner reads again what was not committed)."""


class Transport(ABC):
    """Publish to topics; consume the subscribed topics with committed positions.

    ``poll`` returns messages after the consumer's position and advances it; ``commit``
    makes a position durable. After a restart a consumer resumes at the committed position,
    so messages polled but not committed are delivered again (at-least-once). A consumer
    may also keep its positions elsewhere (the processor's checkpoints) and :meth:`seek` to
    them when a partition is assigned to it (:meth:`set_listener`)."""

    #: The consumer group (checkpoints are kept per group and partition).
    group: str = "failslow"
    #: Whether :meth:`poll` delivers the messages of all topics in publication order (an
    #: in-process log); Kafka fetches topics independently, so a consumer must align them.
    ordered: bool = False

    @abstractmethod
    def produce(self, topic: str, key: str, value: bytes,
                headers: Mapping[str, str] | None = None) -> int:
        """Publish raw bytes; returns the message's offset in ``topic`` (-1 if unknown)."""

    @abstractmethod
    def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        """Up to ``max_messages`` messages of the subscribed topics, waiting at most
        ``timeout`` seconds for the first one."""

    @abstractmethod
    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        """Commit ``offsets`` (``(topic, partition) -> next offset to read``), or the
        position after the last polled message of every partition."""

    @abstractmethod
    def close(self) -> None:
        """Release the transport."""

    # optional consumer controls (the in-process and Kafka transports implement them)

    def set_listener(self, listener: AssignmentListener | None) -> None:
        """Call ``listener`` when partitions are assigned to or revoked from this consumer
        (from within :meth:`poll`, before messages of a newly assigned partition)."""
        self._listener = listener

    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Make the next :meth:`poll` of ``(topic, partition)`` start at ``offset``."""
        raise NotImplementedError(f"{type(self).__name__} cannot seek")

    def committed_offset(self, topic: str, partition: int) -> int | None:
        """The committed position of ``(topic, partition)`` (None: nothing committed)."""
        return None

    def pause(self) -> None:  # noqa: B027 - optional
        """Stop fetching: :meth:`poll` returns nothing (but keeps the consumer alive in its
        group) until :meth:`resume`."""

    def resume(self) -> None:  # noqa: B027 - optional
        """Undo :meth:`pause`."""

    def lag(self) -> int | None:
        """Messages published to the assigned partitions after this consumer's position
        (None: unknown)."""
        return None

    def caught_up(self, partition: int) -> bool | None:
        """Whether this consumer has read every subscribed topic of ``partition`` to its end
        as far as it knows (None: unknown)."""
        return None

    def drained(self) -> bool:
        """Whether the consumer holds its partitions and has read them to their ends now
        (a one-shot reader stops then); a transport that polls synchronously always has."""
        return True

    def stats(self) -> dict[str, Any]:
        """Producer and consumer counters (``sent``, ``dropped``, ``errors``, ...)."""
        return {}

    def publish(self, topic: str, key: str, table: pa.Table,
                headers: Mapping[str, str] | None = None) -> int:
        """Publish ``table`` (one job's rows of the kind of ``topic``) as one message, with
        ``headers`` besides the event headers."""
        kind = kind_of(topic)
        if kind is None:
            raise ValueError(f"{topic!r} is not an event topic")
        return self.produce(topic, key, encode(kind, table),
                            {**event_headers(kind), **(headers or {})})

    def publish_meta(self, meta: JobMeta) -> int:
        return self.publish(topic_for("meta"), meta.job,
                            events.from_rows("meta", [meta.to_row()]))

    def publish_batch(self, job: str, batch: Mapping[str, pa.Table],
                      watermark: int | None = None, kinds: Iterable[str] = (),
                      end: str | None = None) -> int:
        """Publish one message per non-empty kind of ``batch``; returns how many. With
        ``watermark`` (ns), each carries the ``failslow-watermark`` header, and each of
        ``kinds`` without rows in ``batch`` gets an empty message with it (the kind has
        nothing up to that time), so a consumer does not wait for it. ``end``
        (``"post-mortem"``, with a watermark): the trace ends there (header ``failslow-end``)."""
        n = 0
        also = set(kinds)
        headers = {H_WATERMARK: str(int(watermark))} if watermark is not None else None
        if headers is not None and end is not None:
            headers[H_END] = end
        for kind in events.KINDS:
            table = batch.get(kind)
            if table is not None and table.num_rows:
                self.publish(topic_for(kind), job, table, headers)
                n += 1
            elif headers is not None and kind in also and kind != "meta":
                self.publish(topic_for(kind), job, events.empty(kind), headers)
                n += 1
        return n

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessTransport(Transport):
    """An embedded broker: every topic is an in-memory log with one partition (0); one
    consumer reads the subscribed topics in publication order. Thread-safe; ``poll`` waits on
    a condition variable.

    ``keep_committed=False`` drops committed messages (bounded memory for long replays);
    with the default they stay readable through :meth:`messages`.
    """

    group = "inprocess"
    ordered = True

    def __init__(self, subscribe: Iterable[str] = EVENT_TOPICS,
                 keep_committed: bool = True) -> None:
        self._subscribed = tuple(dict.fromkeys(subscribe))
        self._keep = keep_committed
        self._logs: dict[str, list[tuple[int, Message]]] = {}  # topic -> (global seq, message)
        self._base: dict[str, int] = {}  # topic -> offset of the first retained message
        self._seq = 0
        self._position: dict[str, int] = {}  # topic -> next offset to deliver
        self._committed: dict[str, int] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._paused = False
        self._listener: AssignmentListener | None = None
        self._assigned = False

    # producer side

    def produce(self, topic: str, key: str, value: bytes,
                headers: Mapping[str, str] | None = None) -> int:
        with self._cond:
            if self._closed:
                raise RuntimeError("transport is closed")
            log = self._logs.setdefault(topic, [])
            offset = self._base.setdefault(topic, 0) + len(log)
            log.append((self._seq, Message(topic, key, bytes(value), dict(headers or {}),
                                           offset, time.time_ns())))
            self._seq += 1
            self._cond.notify_all()
            return offset

    # consumer side

    def set_listener(self, listener: AssignmentListener | None) -> None:
        self._listener = listener

    def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        self._assign_once()
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while True:
                out = [] if self._paused else self._take(max_messages)
                remaining = deadline - time.monotonic()
                if out or remaining <= 0 or self._closed:
                    return out
                self._cond.wait(remaining)

    def _assign_once(self) -> None:
        if not self._assigned:
            self._assigned = True
            if self._listener is not None:
                self._listener.on_assigned({0})

    def reassign(self) -> None:
        """What a consumer restarted after a crash sees: the positions rewind to the
        committed ones and partition 0 is assigned again on the next poll (to the listener
        set by then)."""
        self.seek_to_committed()
        self._assigned = False

    def _take(self, max_messages: int) -> list[Message]:
        out: list[Message] = []
        while len(out) < max_messages:
            best: tuple[int, Message] | None = None
            for topic in self._subscribed:
                log = self._logs.get(topic)
                if not log:
                    continue
                i = self._position.get(topic, self._base.get(topic, 0)) - self._base[topic]
                if 0 <= i < len(log) and (best is None or log[i][0] < best[0]):
                    best = log[i]
            if best is None:
                break
            msg = best[1]
            self._position[msg.topic] = msg.offset + 1
            out.append(msg)
        return out

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        with self._cond:
            if offsets is None:
                self._committed.update(self._position)
            else:
                for (topic, _partition), offset in offsets.items():
                    self._committed[topic] = int(offset)
            if not self._keep:
                self._trim()

    def _trim(self) -> None:
        for topic, log in self._logs.items():
            drop = self._committed.get(topic, 0) - self._base.get(topic, 0)
            if drop > 0:
                del log[:drop]
                self._base[topic] += drop

    def seek(self, topic: str, partition: int, offset: int) -> None:
        with self._cond:
            self._position[topic] = max(int(offset), self._base.get(topic, 0))

    def committed_offset(self, topic: str, partition: int) -> int | None:
        with self._cond:
            return self._committed.get(topic)

    def seek_to_committed(self) -> None:
        """Rewind the consumer to the committed position, as a restarted consumer would."""
        with self._cond:
            self._position = dict(self._committed)

    def caught_up(self, partition: int) -> bool | None:
        with self._cond:
            return all(self._position.get(t, self._base.get(t, 0))
                       >= self._base.get(t, 0) + len(self._logs.get(t, []))
                       for t in self._subscribed)

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # inspection (tests, demo)

    def messages(self, topic: str) -> list[Message]:
        """Every retained message of ``topic``, in offset order."""
        with self._cond:
            return [m for _, m in self._logs.get(topic, [])]

    def committed(self, topic: str) -> int:
        """The committed offset (next to read) of ``topic``."""
        with self._cond:
            return self._committed.get(topic, 0)

    def end_offset(self, topic: str) -> int:
        with self._cond:
            return self._base.get(topic, 0) + len(self._logs.get(topic, []))

    def lag(self) -> int:
        """Messages of subscribed topics published but not yet committed."""
        with self._cond:
            return sum(self._base.get(t, 0) + len(self._logs.get(t, []))
                       - max(self._committed.get(t, 0), self._base.get(t, 0))
                       for t in self._subscribed)
