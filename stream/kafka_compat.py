"""Two places where kafka-python 3.0 differs from the Java client, and what we do about them.

**Data read with a close.** The secured clients need the bytes read together with the
broker's close to reach the protocol before the connection is dropped.

kafka-python 3.0.12 (``kafka.net.transport``) reads a socket until it would block; when
the last read finds the peer closed, it aborts the connection and discards what it had
read. A broker that refuses a SASL login answers, then closes the connection
(``connection.failed.authentication.delay.ms``). A client that reads both at once, as a
loaded machine does, never sees the refusal and retries until its timeout: ``failslow
doctor`` then says "did not answer" instead of "authentication failed".

:func:`install` wraps ``_sock_recv`` of the TCP and TLS transports: data read before a
close is returned on its own, and the close on the next read. It changes nothing when the
transport has no ``_sock_recv`` (another kafka-python).

**Positions across a rebalance.** Under the eager protocol the Java consumer forgets its
assignment when it revokes it, so a partition assigned again starts at its committed offset.
kafka-python 3.0 keeps the assignment, and so the position, of a partition that comes back
(``SubscriptionState.assign_from_subscribed``). A consumer that drops the records it fetched
for a revoked partition (it no longer owns them) then resumes after them, and they are never
read: a processor lost rows, and ``notify --once`` saw no report, after a rebalance.
:func:`rewind_to_committed` moves a reassigned partition back to its committed offset (the
reset policy's end where nothing is committed), as Java does.

**A group that assigned nothing.** :func:`request_rejoin` lets a one-shot reader ask for a
rebalance when its group gave it no partition of a topic that exists
(``KafkaConsumerSide.drained``).

**Positions without a round trip.** :func:`positions` and :func:`caught_up` read the
consumer's own bookkeeping (``KafkaConsumer.position`` may block to ask the broker)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

_MARK = "_failslow_keeps_data_before_close"
_PENDING = "_failslow_pending_error"

Recv = Callable[[Any], tuple[bytes, Any]]


def _keeping_data(recv: Recv) -> Recv:
    @functools.wraps(recv)
    def sock_recv(transport: Any) -> tuple[bytes, Any]:
        pending = getattr(transport, _PENDING, None)
        if pending is not None:
            setattr(transport, _PENDING, None)
            return b"", pending
        data, error = recv(transport)
        if data and error is not None:
            setattr(transport, _PENDING, error)
            return data, None
        return data, error

    setattr(sock_recv, _MARK, True)
    return sock_recv


def install() -> bool:
    """Patch kafka-python's transports once; True when they are (or were) patched."""
    try:
        from kafka.net import transport
    except ImportError:
        return False
    patched = False
    for name in ("KafkaTCPTransport", "KafkaSSLTransport"):
        cls = getattr(transport, name, None)
        recv = getattr(cls, "__dict__", {}).get("_sock_recv")
        if cls is None or recv is None:
            continue
        if not getattr(recv, _MARK, False):
            cls._sock_recv = _keeping_data(recv)
        patched = True
    return patched


def rewind_to_committed(consumer: Any, partitions: Collection[Any], reset: str,
                        timeout_ms: int) -> None:
    """Seek each of ``partitions`` (kafka-python ``TopicPartition``) of ``consumer`` to its
    committed offset, or to the start of the log (``reset="earliest"``) or its end where
    nothing is committed. One request for all; raises what kafka-python raises when the
    group coordinator does not answer within ``timeout_ms``."""
    if not partitions:
        return
    fetch = getattr(getattr(consumer, "_coordinator", None), "fetch_committed_offsets", None)
    if fetch is not None:
        committed = fetch(list(partitions), timeout_ms=timeout_ms)
    else:  # another kafka-python: one request per partition
        committed = {tp: consumer.committed(tp, metadata=True) for tp in partitions}
    fresh = []
    for tp in partitions:
        meta = committed.get(tp)
        offset = getattr(meta, "offset", meta)
        if offset is None or int(offset) < 0:
            fresh.append(tp)
        else:
            consumer.seek(tp, int(offset))
    if fresh:
        if reset == "earliest":
            consumer.seek_to_beginning(*fresh)
        else:
            consumer.seek_to_end(*fresh)


def positions(consumer: Any) -> dict[Any, int | None]:
    """The position (next offset to fetch) of each assigned partition as ``consumer`` keeps
    it; None where it is not known yet."""
    out: dict[Any, int | None] = {}
    for tp, state in consumer._subscription.assignment.items():
        position = getattr(state, "position", None)
        offset = getattr(position, "offset", position)
        out[tp] = None if offset is None else int(offset)
    return out


def request_rejoin(consumer: Any) -> bool:
    """Ask the consumer's group coordinator to rebalance at the next poll (kafka-python's
    ``BaseCoordinator.request_rejoin``); False when this kafka-python has none."""
    fn = getattr(getattr(consumer, "_coordinator", None), "request_rejoin", None)
    if fn is None:
        return False
    fn()
    return True


def caught_up(consumer: Any, partition: int) -> bool | None:
    """Whether every assigned topic of ``partition`` is read up to the high-water mark of
    its last fetch response with its leader connected (an unreachable leader says nothing
    about the producers: not caught up); None before the first fetch."""
    states = consumer._subscription.assignment
    mine = [(tp, st) for tp, st in states.items() if tp.partition == partition]
    if not mine:
        return None
    client = consumer._client
    for tp, st in mine:
        leader = client.cluster.leader_for_partition(tp)
        if leader is None or leader < 0 or not client.connected(leader):
            return False
        position = getattr(st, "position", None)
        if st.highwater is None or position is None:
            return None
        if int(getattr(position, "offset", position)) < int(st.highwater):
            return False
    return True
