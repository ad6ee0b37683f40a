"""The node side of active validation: :class:`ProbeRunner` runs one request at a time
under the rules of issue 17, :class:`ProbeService` connects it to the agent.

Rules, in order: the job must have probes enabled (a per-job set, default empty); the
request must be recent (``max_age_s``: an agent that was down does not run old ones); the rank
(and its peer, when local) must not be inside a collective it is part of: the runner waits
for the collective to end until the request's deadline, else the row says ``skipped``
("rank busy in a collective"); a token bucket per node and one per job bound the load
(``skipped``, "rate limit ..."); then the probe runs with what is left of the deadline. A
probe that times out or fails changes nothing on the node and logs one line. Every request
gets exactly one ``probe`` row.
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import pyarrow as pa

from failslow import events
from failslow.collectors.probes.base import Deadline, Probe, ProbeFailed, ProbeTimeout, make_row
from failslow.engine.probes import ProbeRequest

__all__ = ["TokenBucket", "BusyTracker", "ProbeRunner", "ProbeService", "RequestSource",
           "rows_table"]

log = logging.getLogger(__name__)

BUSY_DETAIL = "rank busy in a collective"
STOPPING_DETAIL = "the agent stopped before the probe ran"


class TokenBucket:
    """``rate_per_s`` tokens per second, at most ``capacity``; ``clock`` in seconds."""

    def __init__(self, rate_per_s: float, capacity: float = 3.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.capacity = max(1.0, capacity)
        self.clock = clock
        self.tokens = self.capacity
        self.at = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now

    def available(self) -> bool:
        self._refill()
        return self.tokens >= 1.0

    def take(self) -> bool:
        if not self.available():
            return False
        self.tokens -= 1.0
        return True


class BusyTracker:
    """Which local ranks are inside a collective, from the ``coll`` rows drained from their
    rings: per rank and communicator, the last ``enter`` sequence number against the last
    ``end`` one (rows seen twice change nothing)."""

    def __init__(self) -> None:
        self._enter: dict[tuple[int, int], int] = {}
        self._end: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()  # the agent observes, the probe worker asks

    def observe(self, coll: pa.Table | None) -> None:
        if coll is None or not coll.num_rows:
            return
        groups = coll.select(["rank", "comm", "phase", "seq"]).group_by(
            ["rank", "comm", "phase"]).aggregate([("seq", "max")]).to_pydict()
        with self._lock:
            for rank, comm, phase, seq in zip(groups["rank"], groups["comm"], groups["phase"],
                                              groups["seq_max"], strict=True):
                into = self._enter if phase == "enter" else self._end
                key = (int(rank), int(comm))
                into[key] = max(into.get(key, -1), int(seq))

    def busy(self, rank: int) -> bool:
        with self._lock:
            return any(seq > self._end.get(key, -1)
                       for key, seq in self._enter.items() if key[0] == rank)


class ProbeRunner:
    """Runs requests on node ``node`` (module docstring). ``probes``: the probe of each
    kind; ``jobs``: jobs with probes enabled (``*``: all); ``busy(rank)``: the rank is inside
    a collective; ``clock`` / ``sleep`` (seconds) drive the waiting and the rate limits.
    Earlier results are kept per (kind, rank, peer): their median is a probe's baseline; a
    ``gemm`` without earlier runs of its own is compared with its node peers' latest."""

    def __init__(self, node: str, probes: Mapping[str, Probe], *,
                 jobs: Iterable[str] = (), busy: Callable[[int], bool] | None = None,
                 node_per_minute: float = 6.0, job_per_minute: float = 12.0,
                 burst: float = 3.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, wait_step_s: float = 0.005,
                 history: int = 8, max_age_s: float = 60.0,
                 wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.node = node
        self.probes = dict(probes)
        self.jobs = frozenset(jobs)
        self.busy = busy
        self.clock, self.sleep = clock, sleep
        self.wait_step_s = wait_step_s
        self.node_per_minute, self.job_per_minute, self.burst = (node_per_minute,
                                                                 job_per_minute, burst)
        self.node_bucket = TokenBucket(node_per_minute / 60, burst, clock)
        #: buckets of the other nodes this runner serves (emulated nodes of one host)
        self.node_buckets: dict[str, TokenBucket] = {}
        self.job_buckets: dict[str, TokenBucket] = {}
        self.history: dict[tuple[str, int, int | None], list[int]] = {}
        self.max_history = history
        self.counts = {"ok": 0, "timeout": 0, "failed": 0, "skipped": 0}
        #: a request older than this (its ``t``) is not run: its anomaly has moved on
        self.max_age_s = max_age_s
        self.wall_ns = wall_ns

    def enabled(self, job: str) -> bool:
        return "*" in self.jobs or job in self.jobs

    def _job_bucket(self, job: str) -> TokenBucket:
        if job not in self.job_buckets:
            self.job_buckets[job] = TokenBucket(self.job_per_minute / 60, self.burst,
                                                self.clock)
        return self.job_buckets[job]

    def _node_bucket(self, node: str) -> TokenBucket:
        if not node or node == self.node:
            return self.node_bucket
        if node not in self.node_buckets:
            self.node_buckets[node] = TokenBucket(self.node_per_minute / 60, self.burst,
                                                  self.clock)
        return self.node_buckets[node]

    def _wait_idle(self, request: ProbeRequest, deadline: Deadline) -> bool:
        ranks = [request.rank] + ([request.peer] if request.peer is not None else [])
        busy = self.busy
        while busy is not None and any(busy(r) for r in ranks):
            left = deadline.left()
            if left <= 0:
                return False
            self.sleep(min(self.wait_step_s, left))
        return True

    def baseline(self, request: ProbeRequest) -> int | None:
        own = self.history.get((request.probe, request.rank, request.peer))
        if own:
            return int(statistics.median(own))
        if request.probe == "gemm":
            peers = [h[-1] for (kind, rank, _), h in self.history.items()
                     if kind == "gemm" and rank != request.rank and h]
            if peers:
                return int(statistics.median(peers))
        return None

    def cancel(self, request: ProbeRequest, detail: str) -> dict[str, Any]:
        """The ``skipped`` row of a request that will not run (the agent is stopping)."""
        self.counts["skipped"] += 1
        return make_row(request, self.node, "skipped", 0, detail=detail)

    def run(self, request: ProbeRequest) -> dict[str, Any]:
        """One request -> its ``probe`` row (never raises)."""
        # the probe's own time: from here, or from when its ranks were idle (waiting for
        # them costs the job nothing)
        t0 = [time.perf_counter_ns()]
        deadline = Deadline(request.deadline_s, self.clock)

        def done(status: str, detail: str | None = None, elapsed: int | None = None,
                 nbytes: int | None = None, baseline: int | None = None) -> dict[str, Any]:
            self.counts[status] += 1
            return make_row(request, self.node, status, time.perf_counter_ns() - t0[0],
                            elapsed, nbytes, baseline, detail)

        if not self.enabled(request.job):
            return done("skipped", f"probes disabled for job {request.job}")
        age_s = (self.wall_ns() - request.t) / 1e9 if request.t > 0 else 0.0
        if age_s > self.max_age_s:
            return done("skipped", f"request expired ({age_s:.0f} s old)")
        probe = self.probes.get(request.probe)
        if probe is None:
            return done("skipped", f"no {request.probe} probe on node {self.node}")
        if not self._wait_idle(request, deadline):
            return done("skipped", BUSY_DETAIL)
        t0[0] = time.perf_counter_ns()
        job_bucket = self._job_bucket(request.job)
        node_bucket = self._node_bucket(request.node)
        if not node_bucket.available():
            return done("skipped", f"rate limit of node {request.node or self.node}")
        if not job_bucket.take():
            return done("skipped", f"rate limit of job {request.job}")
        node_bucket.take()
        baseline = self.baseline(request)
        try:
            elapsed, nbytes = probe.measure(request, deadline)
        except (ProbeTimeout, ProbeFailed) as e:
            status = "timeout" if isinstance(e, ProbeTimeout) else "failed"
            log.warning("probe %s (%s rank %d%s) %s: %s", request.id, request.probe,
                        request.rank, "" if request.peer is None else f" -> {request.peer}",
                        status, e)
            return done(status, str(e))
        except Exception as e:  # noqa: BLE001 - a probe never takes the agent down
            log.warning("probe %s (%s rank %d) failed: %s: %s", request.id, request.probe,
                        request.rank, type(e).__name__, e)
            return done("failed", f"{type(e).__name__}: {e}")
        runs = self.history.setdefault((request.probe, request.rank, request.peer), [])
        runs.append(elapsed)
        del runs[:-self.max_history]
        return done("ok", None, elapsed, nbytes, baseline)


def rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    """``probe`` rows as the contract's table."""
    return events.conform(pa.Table.from_pylist(rows, schema=events.SCHEMAS["probe"]), "probe")


class RequestSource(Protocol):
    """Where requests come from (Kafka: :class:`~.requests.KafkaRequests`)."""

    def poll(self) -> list[ProbeRequest]: ...

    def close(self) -> None: ...


class ProbeService:
    """The agent's side: requests for this node's ranks from ``source`` run one at a time on
    a worker thread (the agent's loop never waits for a probe); :meth:`poll` takes the rings'
    new ``coll`` rows (for :class:`BusyTracker`) and returns the finished rows as batches for
    the agent's sink. A ``runner`` without a busy predicate gets the tracker's. ``nodes``:
    other nodes whose requests it runs too (nodes emulated on this host, each with its own
    rate limit in the runner)."""

    def __init__(self, node: str, source: RequestSource | None, runner: ProbeRunner,
                 *, closers: Iterable[Any] = (), nodes: Iterable[str] = ()) -> None:
        self.node = node
        self.nodes = frozenset(nodes) | {node}
        self.source = source
        self.runner = runner
        self.tracker = BusyTracker()
        if runner.busy is None:
            runner.busy = self.tracker.busy
        self._inflight = 0
        self._closers = list(closers)
        self._queue: queue.Queue[ProbeRequest | None] = queue.Queue()
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self.stats = {"requests": 0, "foreign": 0, "rows": 0}
        self._worker = threading.Thread(target=self._work, daemon=True,
                                        name="failslow-probe-runner")
        self._worker.start()

    def _work(self) -> None:
        while True:
            request = self._queue.get()
            if request is None:
                return
            row = self.runner.run(request)
            with self._lock:
                self._rows.append(row)
                self._inflight -= 1

    def submit(self, request: ProbeRequest) -> bool:
        """Queue ``request`` if it is for a rank of this node."""
        if request.node and request.node not in self.nodes:
            self.stats["foreign"] += 1
            return False
        self.stats["requests"] += 1
        with self._lock:
            self._inflight += 1
        self._queue.put(request)
        return True

    def observe(self, pending: Iterable[tuple[str, Mapping[str, pa.Table]]]) -> None:
        for _, batch in pending:
            self.tracker.observe(batch.get("coll"))

    def take_rows(self) -> list[tuple[str, dict[str, pa.Table]]]:
        """Finished rows, one batch per job."""
        with self._lock:
            rows, self._rows = self._rows, []
        self.stats["rows"] += len(rows)
        out = []
        for job in sorted({r["job"] for r in rows}):
            table = rows_table([r for r in rows if r["job"] == job])
            out.append((job, {"probe": table}))
        return out

    def poll(self, pending: Iterable[tuple[str, Mapping[str, pa.Table]]] = ()
             ) -> list[tuple[str, dict[str, pa.Table]]]:
        """The agent's hook: observe the drained batches, take new requests, return the rows
        finished since the last call."""
        self.observe(pending)
        if self.source is not None:
            for request in self.source.poll():
                self.submit(request)
        return self.take_rows()

    def stop_requests(self) -> None:
        """Take no new requests (the job ended); those taken still run."""
        if self.source is not None:
            self.source.close()
            self.source = None

    def idle(self) -> bool:
        """Nothing queued or running."""
        with self._lock:
            return self._inflight == 0

    def close(self, timeout: float = 5.0) -> None:
        """Stop: requests still queued are answered ``skipped`` at once, the one running
        finishes (its deadline bounds it) within ``timeout``; :meth:`take_rows` then has a
        row for every request (a probe still running after ``timeout`` is logged)."""
        cancelled = []
        while True:
            try:
                request = self._queue.get_nowait()
            except queue.Empty:
                break
            if request is not None:
                cancelled.append(self.runner.cancel(request, STOPPING_DETAIL))
        with self._lock:
            self._rows.extend(cancelled)
            self._inflight -= len(cancelled)
        self._queue.put(None)
        self._worker.join(timeout)
        if self._worker.is_alive():
            log.warning("a probe still runs %.0f s after the agent stopped: its row is lost",
                        timeout)
        if self.source is not None:
            self.source.close()
        for c in self._closers:
            c.close()
