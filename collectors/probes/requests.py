"""Probe requests over Kafka: the job stage publishes :class:`~failslow.engine.probes.
ProbeRequest` s as JSON on :data:`~failslow.engine.probes.PROBE_REQUESTS_TOPIC` (keyed by
job); every node agent reads the topic in its own consumer group (``failslow-probe-NODE``)
and runs the requests for its ranks. The topic name lives with the request type in
:mod:`failslow.engine.probes` (the job side, which cannot import the stream package);
:func:`ensure_topic` creates it next to the pipeline's topics."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable
from typing import Any

from failslow.engine.probes import PROBE_REQUESTS_TOPIC, ProbeRequest

__all__ = ["KafkaRequests", "EmbeddedRequests", "publish_requests", "ensure_topic"]

log = logging.getLogger(__name__)

HEADERS = {"content-type": "application/json", "failslow-kind": "probe-request"}


def ensure_topic(transport: Any) -> None:
    """Create the requests topic on ``transport``'s cluster (a KafkaTransport)."""
    transport.ensure_topics([PROBE_REQUESTS_TOPIC])


def publish_requests(transport: Any, requests: Iterable[ProbeRequest]) -> int:
    """Publish ``requests``; returns how many were queued."""
    n = 0
    for r in requests:
        transport.produce(PROBE_REQUESTS_TOPIC, r.job, r.to_json(), HEADERS)
        n += 1
    return n


class KafkaRequests:
    """The requests topic read by one node agent (its own group: every agent sees every
    request), on a thread of its own so the agent's loop never waits for Kafka. Malformed
    requests are logged and dropped; positions are committed after each fetch (a request is
    worth running once: a crash may lose one, never repeat it)."""

    def __init__(self, bootstrap: str | None, node: str, *, topic_prefix: str = "",
                 group_id: str | None = None, auto_offset_reset: str = "latest",
                 transport: Any = None, fetch_timeout_s: float = 0.5) -> None:
        if transport is None:
            from failslow.stream.kafka import KafkaTransport

            transport = KafkaTransport(bootstrap, group_id=group_id or f"failslow-probe-{node}",
                                       subscribe=(PROBE_REQUESTS_TOPIC,),
                                       topic_prefix=topic_prefix, produce=False,
                                       auto_offset_reset=auto_offset_reset)
        self.transport = transport
        self.fetch_timeout_s = fetch_timeout_s
        self.bad = 0
        self._got: queue.SimpleQueue[ProbeRequest] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fetch, daemon=True,
                                        name="failslow-probe-requests")
        self._thread.start()

    def _fetch(self) -> None:
        while not self._stop.is_set():  # the topic first (Kafka may not be up yet)
            try:
                ensure_topic(self.transport)
                break
            except Exception as e:  # noqa: BLE001 - retried; probes never stop the agent
                log.warning("probe requests: cannot create %s: %s", PROBE_REQUESTS_TOPIC, e)
                self._stop.wait(5.0)
        while not self._stop.is_set():
            try:
                messages = self.transport.poll(100, timeout=self.fetch_timeout_s)
            except Exception as e:  # noqa: BLE001 - keep fetching; the transport reconnects
                log.warning("probe requests: %s: %s", type(e).__name__, e)
                self._stop.wait(1.0)
                continue
            for m in messages:
                try:
                    self._got.put(ProbeRequest.from_json(m.value))
                except ValueError as e:
                    self.bad += 1
                    log.warning("probe request at %s@%d dropped: %s", m.topic, m.offset, e)
            if messages:
                self.transport.commit()

    def poll(self) -> list[ProbeRequest]:
        """The requests fetched since the last call."""
        out = []
        while True:
            try:
                out.append(self._got.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.fetch_timeout_s + 10)
        self.transport.close()


class EmbeddedRequests:
    """The requests topic of an in-process transport (``InProcessTransport``: a stream
    processor embedded beside the agent, as in examples/hybrid_job.py), read from its
    retained log without joining its one consumer. Malformed requests are logged and
    dropped."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.read = 0
        self.bad = 0

    def poll(self) -> list[ProbeRequest]:
        messages = self.transport.messages(PROBE_REQUESTS_TOPIC)
        new, self.read = messages[self.read:], len(messages)
        out = []
        for m in new:
            try:
                out.append(ProbeRequest.from_json(m.value))
            except ValueError as e:
                self.bad += 1
                log.warning("probe request at %s@%d dropped: %s", m.topic, m.offset, e)
        return out

    def close(self) -> None:
        pass
