"""The node agent (``failslow agent``): rings of local processes -> event batches -> a sink.

The in-process collectors (the native NCCL interposer / profiler plugin / verbs shim, and the
PyTorch collector :mod:`failslow.collectors.torch_collector`) write fixed records into one
shared-memory ring per process (:mod:`failslow.collectors.ring`). The agent, one per node:

- discovers the rings in ``FAILSLOW_RING_DIR`` (:func:`~failslow.collectors.ring.find_rings`),
- drains them with a vectorized copy (no per-record Python work) and converts the records to
  the event contract's Arrow tables tagged with job, node and rank (events.md),
- keeps communicator membership from the rings' lifecycle records and publishes it as
  ``meta.comms`` (CCL-D's Trace ID needs the members of each communicator; ccl-d.md §5.1),
- samples node collectors (GPUs with NVML, RDMA port counters from sysfs; MegaTrace §III-B,
  Greyhound §6), each kept apart as *unavailable* (no data) or *failed* (an error),
- and hands everything to one :class:`Sink`: Kafka (the stream path) or a trace directory.

Crash safety: a ring whose producer died is drained to its end and then removed; the read
index lives in the ring header, so a restarted agent resumes exactly where the previous one
stopped and nothing the ring still holds is lost. Records drained but refused by the sink stay
in memory and are offered again on the next flush.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.collectors.inspector_follow import InspectorFollower
from failslow.collectors.ras import RasCollector
from failslow.collectors.ring import RingError, RingReader, comm_table, find_rings, memory_order
from failslow.events import Comm, JobMeta
from failslow.settings import get_settings

__all__ = ["Sink", "TraceDirSink", "TransportSink", "NodeCollector", "Agent", "CollectorStatus",
           "COLLECTORS", "run_agent"]

log = logging.getLogger(__name__)


class Sink(Protocol):
    """Where the agent's batches go."""

    def write(self, job: str, batch: Mapping[str, pa.Table]) -> None: ...

    def write_meta(self, meta: JobMeta) -> None: ...

    def close(self) -> None: ...


class TraceDirSink:
    """Accumulates batches and writes a trace directory (``meta.json``, ``<kind>.parquet``)
    at every :meth:`flush` and at :meth:`close` (offline use and tests). One job per sink:
    other jobs go to ``DIR/<job>``."""

    def __init__(self, path: str | Path, fmt: str = "parquet") -> None:
        self.path = Path(path)
        self.fmt = fmt
        self._tables: dict[str, dict[str, list[pa.Table]]] = {}
        self._metas: dict[str, JobMeta] = {}
        self._first_job: str | None = None

    def write(self, job: str, batch: Mapping[str, pa.Table]) -> None:
        per = self._tables.setdefault(job, {})
        for kind, t in batch.items():
            if t.num_rows:
                per.setdefault(kind, []).append(t)

    def write_meta(self, meta: JobMeta) -> None:
        self._metas[meta.job] = meta

    def _dir(self, job: str) -> Path:
        if self._first_job is None:
            self._first_job = job
        return self.path if job == self._first_job else self.path / job

    def flush(self) -> None:
        from failslow.tracedir import write_trace

        for job, meta in self._metas.items():
            per = self._tables.get(job, {})
            tables = {k: pa.concat_tables(v) for k, v in per.items() if v}
            per.update({k: [t] for k, t in tables.items()})
            write_trace(self._dir(job), [meta], tables, self.fmt)

    def close(self) -> None:
        self.flush()

    def sync(self) -> bool:
        """Make everything written so far durable (the trace directory is rewritten)."""
        self.flush()
        return True


class TransportSink:
    """Publishes to a :class:`failslow.stream.transport.Transport` (Kafka or in-process)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._losses = 0

    def write(self, job: str, batch: Mapping[str, pa.Table]) -> None:
        self.transport.publish_batch(job, batch)

    def write_meta(self, meta: JobMeta) -> None:
        self.transport.publish_meta(meta)

    def sync(self, timeout: float = 30.0) -> bool:
        """Wait for the acknowledgement of everything published so far; False on timeout or
        if any message since the previous sync was not queued or not delivered."""
        flush = getattr(self.transport, "flush", None)
        ok = bool(flush(timeout)) if flush is not None else True
        stats = getattr(self.transport, "stats", None)
        counts = stats() if stats is not None else {}
        losses = int(counts.get("dropped", 0)) + int(counts.get("errors", 0))
        ok = ok and losses == self._losses
        self._losses = losses
        return ok

    def close(self) -> None:
        self.transport.close()


class NodeCollector(Protocol):
    """A node-level sampler (one module per collector, as node_exporter)."""

    name: str
    reason: str

    @property
    def available(self) -> bool: ...

    def sample(self, now_ns: int | None = None) -> dict[str, pa.Table]: ...

    def close(self) -> None: ...


def _gpu(job: str, node: str) -> NodeCollector:
    from failslow.collectors.gpu import GpuCollector

    return GpuCollector(job, node)


def _rdma(job: str, node: str) -> NodeCollector:
    from failslow.collectors.rdma import RdmaCollector

    return RdmaCollector(job, node)


#: Registry of node collectors: name -> (factory(job, node), enabled by default).
COLLECTORS: dict[str, tuple[Callable[[str, str], NodeCollector], bool]] = {
    "gpu": (_gpu, True),
    "rdma": (_rdma, True),
}


@dataclass
class CollectorStatus:
    """Per collector: ``unavailable`` (no data, with the reason) vs ``failures`` (errors)."""

    name: str
    available: bool
    reason: str = ""
    samples: int = 0
    failures: int = 0
    last_error: str = ""


@dataclass
class _Ring:
    reader: RingReader
    rank: int


@dataclass
class _CommInfo:
    kind: str
    size: int
    members: dict[int, int] = field(default_factory=dict)  # comm_rank -> global rank


class Agent:
    """Drains the rings of ``ring_dir`` into ``sink``; call :meth:`poll` periodically."""

    def __init__(self, sink: Sink, ring_dir: str | Path | None = None, *, job: str | None = None,
                 node: str | None = None, collectors: Mapping[str, bool] | None = None,
                 degrees: Mapping[str, int] | None = None, microbatches: int = 0,
                 schedule: str = "unknown", remove_dead: bool = True,
                 sample_period_s: float = 1.0,
                 rank_nodes: Mapping[int, str] | None = None,
                 inspector: InspectorFollower | None = None, ras: RasCollector | None = None,
                 ) -> None:
        self.sink = sink
        memory_order()  # refuses (RingError, one line) where ring reads would be unordered
        self.ring_dir = Path(ring_dir or get_settings().collector.ring_dir)
        self.job_filter = job
        self.node = node or socket.gethostname()
        #: node names of ranks this agent drains but that run on another (emulated) node, e.g.
        #: ranks in their own network namespaces; every other rank is on ``node``
        self.rank_nodes = dict(rank_nodes or {})
        self.degrees = dict(degrees or {})
        self.microbatches = microbatches
        self.schedule = schedule
        self.remove_dead = remove_dead
        self.sample_period_s = sample_period_s
        self._rings: dict[Path, _Ring] = {}
        self._bad: set[Path] = set()
        self._comms: dict[str, dict[int, _CommInfo]] = {}
        self._nodes: dict[str, dict[int, str]] = {}
        self._world: dict[str, int] = {}
        self._meta_dirty: set[str] = set()
        self._pending: list[tuple[str, dict[str, pa.Table]]] = []
        self._last_sample = 0.0
        self.stats = {"records": 0, "rings_removed": 0, "dropped": 0, "sink_errors": 0}
        #: a live NCCL Inspector dump directory (positions saved after acknowledgement)
        self.inspector = inspector
        self._inspector_saved = 0.0
        #: seconds between saves of the Inspector positions (each waits for acknowledgements)
        self.inspector_save_s = 1.0
        #: the NCCL RAS client (hang evidence; see :mod:`failslow.collectors.ras`)
        self.ras = ras
        #: active validation probes (``--probes``; :mod:`failslow.collectors.probes`)
        self.probes: Any = None
        enabled = {n: d for n, (_, d) in COLLECTORS.items()}
        enabled.update(collectors or {})
        self.collectors: list[NodeCollector] = []
        self.status: dict[str, CollectorStatus] = {}
        for name, on in enabled.items():
            if not on or name not in COLLECTORS:
                continue
            try:
                c = COLLECTORS[name][0](job or "default", self.node)
            except Exception as e:  # a collector that cannot even start has failed
                self.status[name] = CollectorStatus(name, False, failures=1,
                                                    last_error=f"{type(e).__name__}: {e}")
                continue
            self.status[name] = CollectorStatus(name, c.available, c.reason)
            if c.available:
                self.collectors.append(c)

    # -- rings -------------------------------------------------------------------------------

    def _discover(self) -> None:
        for p in find_rings(self.ring_dir, job=self.job_filter):
            if p in self._rings or p in self._bad:
                continue
            try:
                r = RingReader(p)
            except (RingError, OSError) as e:  # a ring being created, or a foreign file
                log.debug("ring %s not readable yet: %s", p, e)
                continue
            self._rings[p] = _Ring(r, r.info.rank)
            self._nodes.setdefault(r.info.job, {})
            if r.info.rank >= 0:
                self._nodes[r.info.job][r.info.rank] = self._node_of(r.info.rank)
            if r.info.world_size > 0:
                self._world[r.info.job] = max(self._world.get(r.info.job, 0), r.info.world_size)

    def _node_of(self, rank: int) -> str:
        return self.rank_nodes.get(rank, self.node)

    def _learn_comms(self, job: str, recs: np.ndarray, rank: int) -> None:
        ct = comm_table(recs, rank)
        if not ct.num_rows:
            return
        per = self._comms.setdefault(job, {})
        d = ct.to_pydict()
        for comm, r, cr, cs, ev, name in zip(d["comm"], d["rank"], d["comm_rank"],
                                             d["comm_size"], d["event"], d["name"], strict=True):
            if ev != "init":
                continue
            kind = name if name in events.COMM_KINDS else "other"
            info = per.setdefault(int(comm), _CommInfo(kind, int(cs)))
            info.members[int(cr)] = int(r)
            if int(r) >= 0:
                self._nodes.setdefault(job, {})[int(r)] = self._node_of(int(r))
            self._meta_dirty.add(job)

    def meta(self, job: str) -> JobMeta:
        """``meta`` of ``job`` as far as this node knows it."""
        comms = self._comms.get(job, {})
        nodes = self._nodes.get(job, {})
        world = max([self._world.get(job, 0), *(r + 1 for r in nodes)], default=1)
        deg = {k: int(self.degrees.get(k, 0)) for k in ("tp", "pp", "dp", "cp")}
        for k in ("tp", "pp", "dp", "cp"):
            if not deg[k]:
                sizes = [c.size for c in comms.values() if c.kind == k]
                deg[k] = max(sizes) if sizes else 1
        if deg["tp"] * deg["pp"] * deg["dp"] * deg["cp"] != world:
            deg = {"tp": 1, "pp": 1, "dp": world, "cp": 1}
        clist = tuple(Comm(cid, c.kind, tuple(c.members[i] for i in sorted(c.members)))
                      for cid, c in sorted(comms.items()) if len(c.members) == c.size)
        return JobMeta(job=job, t=time.time_ns(), world_size=world, tp=deg["tp"], pp=deg["pp"],
                       dp=deg["dp"], cp=deg["cp"], microbatches=self.microbatches,
                       schedule=self.schedule, nodes=dict(nodes), comms=clist)

    def drain_rings(self) -> int:
        """One pass over all rings; returns the number of records drained."""
        self._discover()
        total = 0
        for path, ring in list(self._rings.items()):
            r = ring.reader
            dead = not r.alive()  # checked before draining: nothing can follow the last drain
            recs = r.drain()
            total += len(recs)
            if len(recs):
                job = r.info.job
                self._learn_comms(job, recs, ring.rank)
                tables = r.tables(recs, node=self._node_of(ring.rank))
                self._pending.append((job, {k: t for k, t in tables.items() if t.num_rows}))
            if dead and r.pending == 0:
                self.stats["dropped"] += r.dropped
                r.close()
                del self._rings[path]
                if self.remove_dead:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                self.stats["rings_removed"] += 1
        self.stats["records"] += total
        return total

    def drain(self) -> list[tuple[str, dict[str, pa.Table]]]:
        """:meth:`drain_rings`, returning the batches of this pass (they also wait for the
        sink): the rows just drained, for a caller that watches them live, such as a probe
        service or an engine beside the agent (examples/hybrid_job.py)."""
        start = len(self._pending)
        self.drain_rings()
        return self._pending[start:]

    def add(self, job: str, batch: Mapping[str, pa.Table]) -> None:
        """Queue ``batch`` of ``job``, made beside the rings (probe rows), for the sink."""
        self._pending.append((job, dict(batch)))

    def sample_collectors(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_sample < self.sample_period_s:
            return
        self._last_sample = now
        jobs = list(self._nodes) or [self.job_filter or "default"]
        for c in self.collectors:
            st = self.status[c.name]
            try:
                batch = c.sample()
            except Exception as e:
                st.failures += 1
                st.last_error = f"{type(e).__name__}: {e}"
                continue
            st.samples += 1
            for job in jobs:
                if batch:
                    self._pending.append((job, {k: t.set_column(
                        t.schema.get_field_index("job"), "job",
                        pa.array([job] * t.num_rows, pa.string())) for k, t in batch.items()}))

    def flush(self) -> None:
        """Hand pending batches and changed metas to the sink (kept on a sink error)."""
        try:
            for job in sorted(self._meta_dirty | {j for j, _ in self._pending}):
                self.sink.write_meta(self.meta(job))
            self._meta_dirty.clear()
            while self._pending:
                job, batch = self._pending[0]
                self.sink.write(job, batch)
                self._pending.pop(0)
            flush = getattr(self.sink, "flush", None)
            if flush is not None:
                flush()
        except Exception as e:
            self.stats["sink_errors"] += 1
            log.warning("sink error (kept %d batches for the next flush): %s",
                        len(self._pending), e)

    def drain_inspector(self) -> int:
        """New records of the followed Inspector files -> pending ``coll`` batches."""
        f = self.inspector
        if f is None:
            return 0
        before = f.stats["records"]
        batch = f.poll()
        job = f.job
        nodes = self._nodes.setdefault(job, {})
        if nodes != {**nodes, **f.nodes} or self._world.get(job, 0) < f.world:
            self._meta_dirty.add(job)
        nodes.update(f.nodes)
        self._world[job] = max(self._world.get(job, 0), f.world)
        per = self._comms.setdefault(job, {})
        for cid, c in f.comms.items():
            info = per.setdefault(cid, _CommInfo(c.kind, c.size))
            if info.members != c.members:
                info.members = dict(c.members)
                self._meta_dirty.add(job)
        if batch:
            self._pending.append((job, batch))
        return int(f.stats["records"] - before)

    def _save_inspector(self, force: bool = False) -> None:
        """Save the Inspector positions once everything read was acknowledged by the sink
        (at most every ``inspector_save_s`` unless ``force``)."""
        if self.inspector is None or not self.inspector.dirty or self._pending:
            return
        if not force and time.monotonic() - self._inspector_saved < self.inspector_save_s:
            return
        sync = getattr(self.sink, "sync", None)
        if sync is not None and not sync():
            self.stats["sink_errors"] += 1
            log.warning("sink did not acknowledge every record: Inspector positions not saved")
            return
        self.inspector.commit()
        self._inspector_saved = time.monotonic()

    def drain_ras(self) -> int:
        """``ras`` rows of the RAS reports so far -> a pending batch of the job: ``--job``,
        else the followed Inspector's, else the one job of the rings (``default`` when
        none or several); the reports' hosts and world size go into its ``meta``."""
        ras = self.ras
        if ras is None:
            return 0
        jobs = sorted(self._nodes)
        job = (self.job_filter or (self.inspector.job if self.inspector is not None else None)
               or (jobs[0] if len(jobs) == 1 else "default"))
        table = ras.take(job, self.node)
        if table is None:
            return 0
        nodes = self._nodes.setdefault(job, {})
        hosts = {r: h for r, h in ras.hosts.items() if r not in nodes}
        if hosts or self._world.get(job, 0) < ras.world:
            nodes.update(hosts)
            self._world[job] = max(self._world.get(job, 0), ras.world)
            self._meta_dirty.add(job)
        self._pending.append((job, {"ras": table}))
        return table.num_rows

    def poll(self) -> int:
        n = self.drain_rings() + self.drain_inspector()
        self.sample_collectors()
        if self.ras is not None:
            self.ras.maybe_query()
            self.drain_ras()
        if self.probes is not None:  # sees the drained coll rows, returns probe rows
            self._pending += self.probes.poll(self._pending)
        self.flush()
        self._save_inspector()
        return n

    @property
    def rings(self) -> list[Path]:
        return sorted(self._rings)

    def close(self) -> None:
        self.drain_rings()
        self.drain_inspector()
        if self.ras is not None:
            self.ras.close()
            self.drain_ras()
        if self.probes is not None:
            self.probes.close()
            self._pending += self.probes.take_rows()
        self.flush()
        self._save_inspector(force=True)
        for r in self._rings.values():
            r.reader.close()
        self._rings.clear()
        for c in self.collectors:
            c.close()
        self.sink.close()


def run_agent(agent: Agent, *, interval_s: float = 0.1, duration_s: float | None = None,
              until_idle_s: float | None = None) -> None:
    """Poll until ``duration_s`` passed, or for ``until_idle_s`` seconds no ring existed
    and nothing new was read."""
    t0 = time.monotonic()
    idle_since: float | None = None
    try:
        while True:
            n = agent.poll()
            now = time.monotonic()
            if duration_s is not None and now - t0 >= duration_s:
                break
            if until_idle_s is not None:
                if agent.rings or n:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= until_idle_s:
                    break
            time.sleep(interval_s)
    finally:
        agent.close()


def _cmd_agent(args: argparse.Namespace) -> int:
    sink: Sink
    if args.out:
        sink = TraceDirSink(args.out, args.format)
    else:
        from failslow.stream.kafka import KafkaTransport

        prefix = get_settings().kafka.topic_prefix if args.topic_prefix is None \
            else args.topic_prefix
        sink = TransportSink(KafkaTransport(args.kafka or None, subscribe=(),
                                            topic_prefix=prefix))
    enabled = {n: n not in (args.disable or []) for n in COLLECTORS}
    degrees = {k: v for k, v in (("tp", args.tp), ("pp", args.pp), ("dp", args.dp)) if v}
    inspector = None
    if args.inspector_dir:
        from failslow.collectors.importers import sanitize_job

        root = Path(args.inspector_dir)
        if not root.is_dir():
            raise ValueError(f"--inspector-dir {root}: no such directory")
        inspector = InspectorFollower(root, args.job or sanitize_job(root.name, "nccl-inspector"),
                                      args.inspector_state)
    ras = None
    if args.ras is not None:
        ras = RasCollector(args.ras or None, interval_s=args.ras_interval, job=args.job,
                           node=args.node)
    agent = Agent(sink, args.ring_dir, job=args.job, node=args.node, collectors=enabled,
                  degrees=degrees, microbatches=args.microbatches, schedule=args.schedule,
                  inspector=inspector, ras=ras)
    from failslow.collectors.probes.service import from_args as probes_from_args

    agent.probes = probes_from_args(args, args.node)
    for st in agent.status.values():
        log.info("collector %s: %s", st.name,
                 "enabled" if st.available else f"no data ({st.reason or st.last_error})")
    if args.once:
        agent.close()
    else:
        run_agent(agent, interval_s=args.interval, duration_s=args.duration,
                  until_idle_s=args.until_idle)
    if args.json:
        out: dict[str, Any] = {"stats": agent.stats,
                               "collectors": {k: vars(v) for k, v in agent.status.items()}}
        if inspector is not None:
            out["inspector"] = inspector.stats
        if ras is not None:
            out["ras"] = ras.snapshot()
        if agent.probes is not None:
            out["probes"] = {**agent.probes.stats, **agent.probes.runner.counts}
        print(json.dumps(out))
    return 0


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("agent", help="node agent: drain collector rings, publish events")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--kafka", nargs="?", const="", default=None, metavar="BOOTSTRAP",
                   help="publish to Kafka (default servers: $FAILSLOW_KAFKA)")
    g.add_argument("--out", metavar="DIR", help="write a trace directory instead")
    p.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    p.add_argument("--topic-prefix", default=None, metavar="PREFIX",
                   help="Kafka topic name prefix (default: $FAILSLOW_TOPIC_PREFIX)")
    p.add_argument("--ring-dir", default=None, help="ring directory ($FAILSLOW_RING_DIR)")
    p.add_argument("--job", default=None, help="only rings of this job")
    p.add_argument("--node", default=None, help="node name (default: host name)")
    p.add_argument("--tp", type=int, default=0)
    p.add_argument("--pp", type=int, default=0)
    p.add_argument("--dp", type=int, default=0)
    p.add_argument("--microbatches", type=int, default=0)
    p.add_argument("--schedule", choices=events.SCHEDULES, default="unknown")
    p.add_argument("--disable", action="append", choices=sorted(COLLECTORS),
                   help="disable a node collector (repeatable)")
    p.add_argument("--interval", type=float, default=0.1, help="poll interval, seconds")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--until-idle", type=float, default=None,
                   help="stop once no ring has existed for this many seconds")
    p.add_argument("--inspector-dir", metavar="DIR", default=None,
                   help="follow a live NCCL Inspector dump directory (verbose records become "
                        "coll rows; job: --job or the folder name)")
    p.add_argument("--inspector-state", metavar="FILE", default=None,
                   help="where the follow positions are saved (default: "
                        "DIR/.failslow-follow.json)")
    p.add_argument("--ras", nargs="?", const="", default=None, metavar="HOST:PORT",
                   help="query NCCL RAS (JSON, NCCL 2.28.7+) and publish its findings as "
                        "ras rows, hang evidence (default address 127.0.0.1:28028)")
    p.add_argument("--ras-interval", type=float, default=10.0, metavar="S",
                   help="seconds between RAS queries (default: %(default)s)")
    from failslow.collectors.probes.service import add_arguments as probe_arguments

    probe_arguments(p)
    p.add_argument("--once", action="store_true", help="drain once and exit")
    p.add_argument("--json", action="store_true", help="print counters as JSON at exit")
    p.set_defaults(func=_cmd_agent)
