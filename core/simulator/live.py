"""A simulated job that never ends: :class:`LiveSimulator` (``failslow simulate --live``).

The job is simulated in chunks of a few iterations, each one run of the ordinary simulator
(:class:`~failslow.simulator.engine.Engine` and
:class:`~failslow.simulator.trace_tables.TraceBuilder`) whose ``start_time_ns`` is where the
previous chunk ended, so the records carry current wall-clock times when the first chunk
starts now. Only one chunk is held at a time: the memory used does not grow with the run.

The chunks are stitched into one job: sequence numbers continue where the engine's counters
(per pipeline stage and communicator kind) stopped, iteration numbers (``span.step``)
continue, and the link counters (cumulative per queue pair) continue from their last values.
Every chunk starts ``GAP_NS`` after the previous one's last record, more than twice the clock
skew, so each rank's records stay in time order.

Faults: fault ``k`` starts ``first_fault_s + k * fault_every_s`` seconds after the start and
lasts ``fault_for_s``; its cause is ``causes[k % len(causes)]`` and its ranks (or link) are
drawn at random. A slow fault (compute, communication, mixed) slows every chunk that starts
inside its window. A hang fires once, early in the first chunk after its start; the hung job
then stays silent but for its progress, link and GPU samples for ``hang_tail_s``, and the job
is restarted under a new id (``JOB-r1``, ``JOB-r2``...) with fresh communicators, as a
scheduler's restart would be (under the same id, the dead run's open rounds would be taken for
new hangs of the next run).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.events import JobMeta
from failslow.simulator.engine import Engine
from failslow.simulator.ground_truth import job_meta
from failslow.simulator.scenario import (
    CAUSES,
    HANG_CAUSES,
    Fault,
    Parallel,
    Scenario,
    ScenarioError,
    validate,
)
from failslow.simulator.trace_tables import TraceBuilder

#: Time between one chunk's last record and the next chunk's first (> 2 x clock skew).
GAP_NS = 10_000_000
TP, PP = 2, 4


@dataclass
class LiveConfig:
    """What the live job looks like and when its faults come."""

    ranks: int = 64
    job: str = "live-job"
    fault_every_s: float = 180.0
    fault_for_s: float = 60.0
    first_fault_s: float = 20.0
    causes: tuple[str, ...] = CAUSES
    chunk_iterations: int = 5
    hang_tail_s: float = 30.0
    seed: int = 0

    def check(self) -> None:
        if self.ranks % 64 or not 64 <= self.ranks <= 1024:
            raise ScenarioError(f"--ranks {self.ranks}: a multiple of 64 from 64 to 1024 "
                                "(tp2 pp4 dp ranks/8)")
        if self.fault_every_s <= 0 or self.fault_for_s <= 0 or self.first_fault_s < 0:
            raise ScenarioError("fault times: --fault-every and --fault-for must be > 0, "
                                "--first-fault >= 0")
        if self.fault_for_s > self.fault_every_s:
            raise ScenarioError("--fault-for must not be longer than --fault-every")
        if self.chunk_iterations < 1:
            raise ScenarioError("chunk iterations must be >= 1")
        if self.hang_tail_s <= 0:
            raise ScenarioError("--hang-tail must be > 0")
        bad = [c for c in self.causes if c not in CAUSES]
        if bad or not self.causes:
            raise ScenarioError(f"--causes: {', '.join(bad) or 'none given'}: use "
                                f"{', '.join(CAUSES)}")


@dataclass
class LiveFault:
    """One scheduled fault: when, what, and (after it started) in which job."""

    index: int
    cause: str
    start_ns: int
    end_ns: int
    spec: Fault
    job: str = ""

    def describe(self) -> str:
        f = self.spec
        where = f"rank {f.ranks[0]}" if f.ranks else ""
        if f.nodes is not None:
            link = f"link node{f.nodes[0]:03d}-node{f.nodes[1]:03d}"
            where = f"{where} and {link}" if where else link
        if f.is_hang:
            return f"{self.cause} hang of {where} on its {f.comm} communicator"
        factor = f"x{f.severity:g}" + (f", link x{f.link_severity:g}"
                                       if f.link_severity else "")
        return f"{self.cause} slow-down of {where} ({factor}) for " \
               f"{(self.end_ns - self.start_ns) / 1e9:g} s"


@dataclass
class LiveChunk:
    """One chunk of the live job: its records (contract tables) and what happened."""

    job: str
    meta: JobMeta
    tables: dict[str, pa.Table]
    start_ns: int
    end_ns: int
    first_iteration: int
    iterations: int
    new_job: bool
    fault: LiveFault | None
    fault_started: bool = False
    hung: bool = False

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables.values())


@dataclass
class _JobState:
    job: str
    seq: np.ndarray | None = None                # rounds so far per (stage, comm kind)
    kind_of: dict[int, int] = field(default_factory=dict)    # comm id -> kind
    link: dict[tuple[int, str], tuple[int, int, int]] = field(default_factory=dict)
    iterations: int = 0
    announced: bool = False


class LiveSimulator:
    """Generates a job's records chunk by chunk from ``start_ns`` on (default: now)."""

    def __init__(self, config: LiveConfig, start_ns: int | None = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        config.check()
        self.config = config
        self.start_ns = clock() if start_ns is None else int(start_ns)
        self.t_ns = self.start_ns
        self.base = self._scenario()
        self.chunk_index = 0
        self.restarts = 0
        self.state = _JobState(config.job)
        self._last_started = -1                 # faults come in index order
        self._last_hang = -1

    def _scenario(self) -> Scenario:
        c = self.config
        sc = Scenario(name="live", job=c.job, iterations=c.chunk_iterations,
                      parallel=Parallel(tp=TP, pp=PP, dp=c.ranks // (TP * PP), cp=1))
        sc.sampling.hang_tail_s = c.hang_tail_s
        validate(sc, "live")
        return sc

    # -- the fault schedule ---------------------------------------------------------------

    def fault(self, index: int) -> LiveFault:
        """Fault ``index`` of the schedule (deterministic for a seed)."""
        c = self.config
        start = self.start_ns + int((c.first_fault_s + index * c.fault_every_s) * 1e9)
        cause = c.causes[index % len(c.causes)]
        rng = np.random.default_rng([c.seed, 7, index])
        return LiveFault(index, cause, start, start + int(c.fault_for_s * 1e9),
                         self._spec(cause, index, rng))

    def _spec(self, cause: str, index: int, rng: np.random.Generator) -> Fault:
        sc = self.base
        world = sc.world_size
        gpn = sc.gpus_per_node
        nps = world // PP // gpn                 # nodes per pipeline stage
        fid = f"live-{index}"
        if cause == "compute":
            return Fault(cause, ranks=[int(rng.integers(world))], severity=1.5,
                         gpu_throttle=bool(index % 2), id=fid)
        if cause == "communication":
            stage = int(rng.integers(PP - 1))
            if index % 2 == 0:                   # a PP link between two stages' nodes
                a = stage * nps + int(rng.integers(nps))
                nodes = [a, a + nps]
            else:                                # a DP ring link inside a stage
                a = stage * nps + int(rng.integers(nps - 1))
                nodes = [a, a + 1]
            return Fault(cause, nodes=nodes, severity=4.0, id=fid)
        if cause == "mixed":
            rank = int(rng.integers(world - world // PP))   # not the last stage
            node = rank // gpn
            return Fault(cause, ranks=[rank], nodes=[node, node + nps], severity=1.3,
                         link_severity=6.0, id=fid)
        rank = int(rng.integers(world))
        if cause == "not_entered":
            return Fault(cause, ranks=[rank], comm="tp", phase="forward",
                         microbatch=int(rng.integers(sc.microbatches)), start_iteration=1,
                         id=fid)
        return Fault(cause, ranks=[rank], comm="dp", op="reducescatter", mismatch="bytes",
                     start_iteration=1, id=fid)

    def active_fault(self, t_ns: int) -> LiveFault | None:
        """The fault whose window holds ``t_ns`` (None between faults)."""
        c = self.config
        since = (t_ns - self.start_ns) / 1e9 - c.first_fault_s
        if since < 0:
            return None
        index = int(since // c.fault_every_s)
        f = self.fault(index)
        return f if f.start_ns <= t_ns < f.end_ns else None

    # -- chunks ---------------------------------------------------------------------------

    def chunks(self) -> Iterator[LiveChunk]:
        """Chunks for ever, in time order."""
        while True:
            yield self.next_chunk()

    def next_chunk(self) -> LiveChunk:
        t0 = self.t_ns
        fault = self.active_fault(t0)
        if fault is not None and fault.cause in HANG_CAUSES and fault.index <= self._last_hang:
            fault = None                         # a hang fires once, then the job restarts
        sc = copy.deepcopy(self.base)
        sc.job = self.state.job
        sc.start_time_ns = t0
        sc.faults = [copy.deepcopy(fault.spec)] if fault is not None else []
        seed = self.config.seed * 1_000_003 + self.chunk_index
        eng = Engine(sc, seed)
        eng.run()
        builder = TraceBuilder(eng, seed)
        tables = {}
        for kind in builder.kinds():
            parts = list(builder.iter_tables(kind))
            tables[kind] = pa.concat_tables(parts) if parts else events.empty(kind)
        st = self.state
        new_job = not st.announced
        st.announced = True
        self._stitch(tables, st, eng)
        started = False
        if fault is not None:
            fault.job = st.job
            started = fault.index > self._last_started
            self._last_started = fault.index
        chunk = LiveChunk(job=st.job, meta=job_meta(eng), tables=tables, start_ns=t0,
                          end_ns=t0 + int(builder.t_end), first_iteration=st.iterations,
                          iterations=eng.iterations_run, new_job=new_job, fault=fault,
                          fault_started=started, hung=builder.hung)
        st.iterations += eng.iterations_run
        self.chunk_index += 1
        self.t_ns = chunk.end_ns + GAP_NS
        if builder.hung and fault is not None:
            self._last_hang = fault.index
            self.restarts += 1
            self.state = _JobState(f"{self.config.job}-r{self.restarts}")
        return chunk

    def _stitch(self, tables: dict[str, pa.Table], st: _JobState, eng: Engine) -> None:
        """Continue sequence numbers, iteration numbers and link counters of ``st``.

        The engine numbers the rounds of each (pipeline stage, communicator kind) from 0; a
        chunk's rows go on from the earlier chunks' counts."""
        topo = eng.topo
        if st.seq is None:
            st.seq = np.zeros((eng.P, 4), np.uint64)
            ids = topo.comm.ravel()
            st.kind_of = dict(zip(ids.tolist(), np.repeat(np.arange(4), topo.world).tolist(),
                                  strict=True))
        for kind in ("coll", "progress"):
            table = tables.get(kind)
            if table is None or not table.num_rows:
                continue
            comm = table.column("comm").to_numpy()
            uniq, inv = np.unique(comm, return_inverse=True)
            ckind = np.array([st.kind_of[int(c)] for c in uniq.tolist()], np.int64)[inv]
            stage = table.column("rank").to_numpy().astype(np.int64) // eng.S
            seq = table.column("seq").to_numpy() + st.seq[stage, ckind]
            tables[kind] = _replace(table, "seq", pa.array(seq, pa.uint64()))
        st.seq += np.asarray(eng.seq, dtype=np.uint64)
        span = tables.get("span")
        if span is not None and span.num_rows and st.iterations:
            step = span.column("step").to_numpy()
            step = np.where(step >= 0, step + st.iterations, step)
            tables["span"] = _replace(span, "step", pa.array(step, pa.int64()))
        link = tables.get("link")
        if link is not None and link.num_rows:
            tables["link"] = _stitch_link(link, st)


def _replace(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), column)


def _stitch_link(link: pa.Table, st: _JobState) -> pa.Table:
    """Add each queue pair's last counters of the earlier chunks; remember the new last."""
    rank = link.column("rank").to_numpy().astype(np.int64)
    peer = np.asarray(link.column("peer_node").to_pylist(), dtype=object)
    peers, pinv = np.unique(peer.astype(str), return_inverse=True)
    key = rank * len(peers) + pinv
    uniq, inv = np.unique(key, return_inverse=True)
    names = ("posted", "completed", "bytes")
    base = np.zeros((uniq.size, 3), np.uint64)
    ids = [(int(k // len(peers)), str(peers[k % len(peers)])) for k in uniq.tolist()]
    for j, qp in enumerate(ids):
        base[j] = st.link.get(qp, (0, 0, 0))
    out = link
    cols = []
    for n, name in enumerate(names):
        values = link.column(name).to_numpy() + base[inv, n]
        cols.append(values)
        out = _replace(out, name, pa.array(values, pa.uint64()))
    t = link.column("t").to_numpy()
    last = np.zeros(uniq.size, np.int64)            # the row of each queue pair's last sample
    order = np.lexsort((t, inv))
    ends = np.flatnonzero(np.r_[inv[order][1:] != inv[order][:-1], True])
    last[inv[order][ends]] = order[ends]
    for j, qp in enumerate(ids):
        r = last[j]
        st.link[qp] = (int(cols[0][r]), int(cols[1][r]), int(cols[2][r]))
    return out

