"""Fault injection at simulation time: when and where each injected fault applies, and what
was actually affected (the ground truth written to ``truth.json``).

Causes follow CCL-D's taxonomy (§2.2): slow = S1 computation (compute durations of the root
ranks x severity), S2 communication (transfer times of every round whose traffic crosses the
slow node pair x severity, see :meth:`Topology.crossing`), S3 mixed (both at once); hang =
H1 not entered (the root rank never calls the collective), H2 inconsistent (the root rank
calls another operation or byte count; it completes, its peers never do), H3 hardware (all
entered, the transfer stalls; the root rank has the fewest SendCount/RecvCount steps).

Windows: a fault applies to an operation when the iteration is inside the iteration window
and the operation's start time is inside the time window (both default to unbounded). A window
given as a start iteration and a duration in seconds (or the reverse) ends that long after the
first operation the fault affected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from failslow.simulator.scenario import Fault, Scenario, ScenarioError
from failslow.simulator.schedule import BWD, DPSYNC, FWD, P2P, Step
from failslow.simulator.topology import K_CP, K_DP, K_PP, K_TP, KIND_NAMES, Topology

NS = 1e9
INF = math.inf


@dataclass
class Window:
    """Iteration window [it_lo, it_hi) and time window [t_lo, t_hi) (relative ns)."""

    it_lo: int
    it_hi: float
    t_lo: float
    t_hi: float
    dur_it: int | None
    dur_ns: float | None

    @classmethod
    def of(cls, f: Fault) -> Window:
        it_lo = f.start_iteration or 0
        t_lo = (f.start_s or 0.0) * NS
        it_hi: float = INF
        t_hi = INF
        if f.duration_iterations is not None and f.start_s is None:
            it_hi = it_lo + f.duration_iterations
        if f.duration_s is not None and f.start_iteration is None:
            t_hi = t_lo + f.duration_s * NS
        dur_it = f.duration_iterations if f.start_s is not None else None
        dur_ns = f.duration_s * NS if (f.duration_s is not None
                                       and f.start_iteration is not None) else None
        return cls(it_lo, it_hi, t_lo, t_hi, dur_it, dur_ns)

    def iteration_ok(self, it: int) -> bool:
        return self.it_lo <= it < self.it_hi

    def time_mask(self, t: np.ndarray) -> np.ndarray:
        return (t >= self.t_lo) & (t < self.t_hi)

    def activated(self, it: int, t_first: float) -> None:
        """Fix the open end of a mixed window at the first affected operation."""
        if self.dur_it is not None:
            self.it_hi = min(self.it_hi, it + self.dur_it)
            self.dur_it = None
        if self.dur_ns is not None:
            self.t_hi = min(self.t_hi, t_first + self.dur_ns)
            self.dur_ns = None


@dataclass
class Observed:
    """What a fault actually touched during the run."""

    first_ns: float = INF
    last_ns: float = -INF
    it_first: int | None = None
    it_last: int | None = None
    ops: int = 0

    def add(self, it: int, start: np.ndarray, end: np.ndarray) -> None:
        if start.size == 0:
            return
        self.first_ns = min(self.first_ns, float(start.min()))
        fin = end[np.isfinite(end)]
        if fin.size:
            self.last_ns = max(self.last_ns, float(fin.max()))
        self.it_first = it if self.it_first is None else self.it_first
        self.it_last = it
        self.ops += int(start.size)


@dataclass
class ComputeRT:
    """A compute slowdown (CCL-D S1) on some ranks."""

    fault_index: int
    severity: float
    window: Window
    by_stage: dict[int, np.ndarray]      # stage -> flat element indices inside the stage
    forward: bool
    backward: bool
    optimizer: bool
    observed: Observed = field(default_factory=Observed)

    def factor(self, s: int, is_fwd: bool, is_bwd: bool, it: int, tstart: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray] | None:
        """(elements, active mask) of stage ``s`` slowed at this compute step, or None."""
        elems = self.by_stage.get(s)
        if elems is None or not self.window.iteration_ok(it):
            return None
        if (is_fwd and not self.forward) or (is_bwd and not self.backward) or (
                not is_fwd and not is_bwd and not self.optimizer):
            return None
        t = tstart.reshape(-1)[elems]
        active = self.window.time_mask(t)
        if not active.any():
            return None
        if self.observed.it_first is None:
            self.window.activated(it, float(t[active].min()))
            active = self.window.time_mask(t)
        return elems, active


@dataclass
class LinkRT:
    """A slow link between two nodes (CCL-D S2): transfers of rounds crossing it x severity."""

    fault_index: int
    nodes: tuple[int, int]
    severity: float
    window: Window
    masks: dict[int, np.ndarray]        # kind -> per-stage (or per PP edge) round masks
    stage_any: dict[int, np.ndarray]    # kind -> bool per stage / edge
    observed: Observed = field(default_factory=Observed)

    def factor(self, kind: int, s: int, start: np.ndarray, it: int) -> np.ndarray | None:
        """Affected-round mask (shape of ``start``) at stage ``s`` (PP: edge s->s+1)."""
        if not self.stage_any[kind][s] or not self.window.iteration_ok(it):
            return None
        mask = self.masks[kind][s] & self.window.time_mask(start)
        if not mask.any():
            return None
        if self.observed.it_first is None:
            self.window.activated(it, float(np.min(start[mask])))
            mask = self.masks[kind][s] & self.window.time_mask(start)
        return mask


@dataclass
class HangRT:
    """A hang (CCL-D H1-H3) at one round of one rank."""

    fault_index: int
    cause: str
    rank: int
    stage: int
    elem: int                 # flat index inside the stage
    kind: int                 # K_TP / K_CP / K_DP / K_PP
    step: int                 # index in the stage program
    sub: int                  # collective index inside a compute step, op index in a p2p batch
    it_lo: int
    t_lo: float
    mismatch: str
    frac: float               # hardware: how far the transfer got before it stalled
    triggered: bool = False
    trigger_ns: float = INF
    trigger_it: int | None = None
    comm: int | None = None
    peer_rank: int | None = None   # hardware: the other end of the broken link
    seq: int | None = None

    def due(self, s: int, step: int, sub: int, it: int, t_victim: float) -> bool:
        return (not self.triggered and s == self.stage and step == self.step
                and sub == self.sub and it >= self.it_lo and t_victim >= self.t_lo)


@dataclass
class FaultSet:
    """All runtime fault objects of one simulation."""

    compute: list[ComputeRT]
    links: list[LinkRT]
    hang: HangRT | None


def build_faults(sc: Scenario, topo: Topology, programs: list[list[Step]],
                 rng: np.random.Generator) -> FaultSet:
    """Resolve the scenario's faults against the topology and the stage programs."""
    compute: list[ComputeRT] = []
    links: list[LinkRT] = []
    hang: HangRT | None = None
    for i, f in enumerate(sc.faults):
        if f.cause in ("compute", "mixed"):
            by_stage: dict[int, list[int]] = {}
            for r in sorted(set(f.ranks)):
                s, e = divmod(r, topo.stage_size)
                by_stage.setdefault(s, []).append(e)
            compute.append(ComputeRT(
                i, f.severity, Window.of(f),
                {s: np.array(v, dtype=np.int64) for s, v in by_stage.items()},
                forward=f.stage in (None, "forward"), backward=f.stage in (None, "backward"),
                optimizer=f.stage is None))
        if f.cause in ("communication", "mixed"):
            a, b = link_nodes(f, topo)
            masks = topo.crossing(a, b)
            sev = f.severity if f.cause == "communication" else (f.link_severity or 4.0)
            stage_any: dict[int, np.ndarray] = {
                k: np.asarray(m.reshape(m.shape[0], -1).any(axis=1)) for k, m in masks.items()}
            if not any(v.any() for v in stage_any.values()):
                raise ScenarioError(f"faults[{i}]: no traffic of this job crosses the link "
                                    f"{topo.node_names[a]}-{topo.node_names[b]}")
            links.append(LinkRT(i, (a, b), sev, Window.of(f), masks, stage_any))
        if f.is_hang:
            hang = _build_hang(i, f, sc, topo, programs, rng)
    return FaultSet(compute, links, hang)


def link_nodes(f: Fault, topo: Topology) -> tuple[int, int]:
    """The node pair of a link fault: given, or the root rank's node and its PP neighbour's."""
    if f.nodes is not None:
        a, b = f.nodes
        if max(a, b) >= topo.n_nodes:
            raise ScenarioError(f"link nodes {a}, {b}: the job has {topo.n_nodes} nodes")
        return int(a), int(b)
    r = f.ranks[0]
    s = r // topo.stage_size
    mine = r // topo.gpus_per_node
    for other in (r + topo.stage_size, r - topo.stage_size):
        if 0 <= other < topo.world and other // topo.gpus_per_node != mine:
            return mine, other // topo.gpus_per_node
    for kind in (K_DP, K_TP, K_CP):
        if topo.succ_crosses[kind, r]:
            return mine, int(topo.succ_node[kind, r])
    raise ScenarioError(f"rank {r} (stage {s}) has no traffic leaving its node; give 'nodes'")


def _build_hang(i: int, f: Fault, sc: Scenario, topo: Topology,
                programs: list[list[Step]], rng: np.random.Generator) -> HangRT:
    r = f.ranks[0]
    s, e = divmod(r, topo.stage_size)
    kinds = {"tp": K_TP, "cp": K_CP, "dp": K_DP, "pp": K_PP}
    if f.comm is None:
        order = ("tp", "dp", "pp", "cp") if f.cause == "not_entered" else (
            ("dp", "tp", "cp") if f.cause == "inconsistent" else ("dp", "tp", "cp", "pp"))
        usable = [c for c in order if topo.sizes[kinds[c]] > 1]
        if not usable:
            raise ScenarioError(f"faults[{i}]: the job has no communicator for a "
                                f"{f.cause} hang")
        comm = usable[0]
    else:
        comm = f.comm
    kind = kinds[comm]
    if topo.sizes[kind] == 1:
        raise ScenarioError(f"faults[{i}]: the job has no {comm} communicator ({comm}=1)")
    prog = programs[s]
    step_idx, sub = -1, 0
    want_fwd = f.phase == "forward"
    if kind in (K_TP, K_CP):
        t = sc.timing
        n = (t.tp_colls_forward if want_fwd else t.tp_colls_backward) if kind == K_TP else (
            t.cp_colls_forward if want_fwd else t.cp_colls_backward)
        if not 0 <= f.index < n:
            raise ScenarioError(f"faults[{i}].index: the {f.phase} pass has {n} {comm} "
                                "collectives")
        for j, st in enumerate(prog):
            if st.kind == (FWD if want_fwd else BWD) and st.mb == f.microbatch:
                step_idx, sub = j, f.index
                break
    elif kind == K_DP:
        op = f.op or "reducescatter"
        if op not in ("allgather", "reducescatter"):
            raise ScenarioError(f"faults[{i}].op: dp hangs are at allgather (params-sync) or "
                                "reducescatter (grads-sync)")
        for j, st in enumerate(prog):
            if st.kind == DPSYNC and st.dp_op == op:
                step_idx = j
                break
    else:
        if f.cause == "inconsistent":
            raise ScenarioError(f"faults[{i}]: inconsistent hangs are at collectives "
                                "(comm tp, cp or dp)")
        if f.op not in (None, "send", "recv"):
            raise ScenarioError(f"faults[{i}].op: pp hangs are at a send or a recv")
        want_send = f.op == "send" if f.op else s < topo.pp - 1
        for j, st in enumerate(prog):
            if st.kind != P2P:
                continue
            for k, p2p in enumerate(st.ops):
                if (p2p.send == want_send and p2p.grad != want_fwd
                        and p2p.mb == f.microbatch):
                    step_idx, sub = j, k
                    break
            if step_idx >= 0:
                break
    if step_idx < 0:
        raise ScenarioError(f"faults[{i}]: rank {r} (stage {s}) has no such {comm} operation "
                            f"({f.phase}, micro-batch {f.microbatch}, op {f.op})")
    return HangRT(i, f.cause, r, s, e, kind, step_idx, sub, f.start_iteration or 0,
                  (f.start_s or 0.0) * NS, f.mismatch, float(rng.uniform(0.25, 0.6)))


def comm_kind_name(kind: int) -> str:
    return KIND_NAMES[kind]
