"""The consumer side of the Kafka transport (:class:`~failslow.stream.kafka.KafkaTransport`):
joining the consumer group, polling, rebalances, positions and commits.

The consumer side (created on the first :meth:`~KafkaConsumerSide.poll`) never commits by
itself: :meth:`~KafkaConsumerSide.commit` commits the position after everything polled so far,
or the offsets given. Partitions are assigned with the range assignor, so a consumer owns the
same partition number of every topic (all topics have the same partition count, messages are
keyed by job); :meth:`~KafkaConsumerSide.set_listener` reports assignments as partition
numbers, :meth:`~KafkaConsumerSide.seek` moves a position, :meth:`~KafkaConsumerSide.pause`
stops fetching while the consumer keeps polling (and so keeps its group membership) when the
processor's sink pushes back.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from failslow.stream import kafka_compat
from failslow.stream.transport import AssignmentListener, Message

log = logging.getLogger(__name__)


class KafkaConsumerSide:
    """The consumer methods of :class:`~failslow.stream.kafka.KafkaTransport` (a mixin: the
    transport's ``__init__`` sets the attributes declared here, its producer side has the
    methods declared under ``TYPE_CHECKING``)."""

    bootstrap_servers: str
    group_id: str
    drain_wait: str
    commit_flush_timeout: float
    _security: dict[str, Any]
    _subscribed: tuple[str, ...]
    _consumer_config: dict[str, Any]
    _client_id: str
    _auto_offset_reset: str
    _connect_timeout_ms: int
    _listener: AssignmentListener | None
    _paused: bool
    _changes: queue.SimpleQueue[tuple[str, set[int]]]
    _to_rewind: set[int]
    _closing: bool
    _lock: threading.Condition
    _counts: dict[str, int]
    _last_error: str | None
    _producer: Any
    _consumer: Any
    _next_missing_check: float
    _next_rejoin: float
    _closed: threading.Event

    if TYPE_CHECKING:  # KafkaTransport's topics and producer side
        def kafka_topic(self, topic: str) -> str: ...
        def _logical(self, kafka_topic: str) -> str: ...
        def _topics_once(self) -> None: ...
        def _note_error(self, text: str) -> None: ...
        def flush(self, timeout: float = 30.0) -> bool: ...

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
        broker for the end offsets). None (unknown) before the consumer joined, on error,
        while a position is not known (a partition waiting for its committed offset), and
        while a partition number this consumer holds lacks an existing subscribed topic
        (its metadata came back after a broker restart later than the others': the group
        assigns it at the next rebalance). A lag of 0 then would say "caught up" while a
        whole topic is unread."""
        consumer = self._consumer
        if consumer is None:
            return None
        try:
            assigned = list(consumer.assignment())
            if not assigned:
                return 0
            if self._topic_unassigned(consumer, assigned):
                return None
            ends = consumer.end_offsets(assigned, timeout_ms=2000)
            at = kafka_compat.positions(consumer)
            if any(at.get(tp) is None or tp not in ends for tp in assigned):
                return None
            return sum(max(0, int(ends[tp]) - int(at[tp] or 0)) for tp in assigned)
        except Exception as e:  # noqa: BLE001 - metrics only
            log.debug("kafka lag unknown: %s", e)
            return None

    def _topic_unassigned(self, consumer: Any, assigned: list[Any]) -> bool:
        """Whether a partition number in ``assigned`` lacks a subscribed topic that the
        consumer's metadata knows (the range assignor gives a consumer the same partition
        numbers of every topic)."""
        held = {(tp.topic, tp.partition) for tp in assigned}
        numbers = {p for _, p in held}
        cluster = consumer._cluster  # kafka-python's metadata
        for name in (self.kafka_topic(t) for t in self._subscribed):
            known = cluster.partitions_for_topic(name) or set()
            if any(p in known and (name, p) not in held for p in numbers):
                return True
        return False

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
                self._rejoin_for(consumer, missing)
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

    #: A one-shot reader whose group gave it no partition of a topic that exists asks the
    #: group to rebalance this often (seconds).
    rejoin_every_s = 5.0

    def _rejoin_for(self, consumer: Any, missing: list[str]) -> None:
        """A one-shot reader (:meth:`drained`) must hold partitions of every subscribed
        topic. kafka-python's leader can assign from metadata that lacked a topic for a
        moment (a fresh topic's leader election) while it records the metadata that had it;
        it then sees no change to rebalance for, and the reader waits forever (once in CI:
        joined, 0 assigned, for 120 s). When the metadata shows partitions of a missing
        topic, ask the group to rebalance (:func:`kafka_compat.request_rejoin`)."""
        now = time.monotonic()
        if now < self._next_rejoin or not self._counts["joins"]:
            return
        self._next_rejoin = now + self.rejoin_every_s
        try:
            known = [t for t in missing if consumer._cluster.partitions_for_topic(t)]
        except Exception as e:  # noqa: BLE001 - internals changed: wait as before
            log.debug("kafka metadata not readable: %s", e)
            return
        if known and kafka_compat.request_rejoin(consumer):
            log.info("kafka group %s: no partitions of %s although they exist; rebalancing",
                     self.group_id, ", ".join(known))

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
