"""S3 of Greyhound's mitigation (§5.2, "Adjust parallelism topology"): a new rank placement
and its predicted effect.

Two moves, both expressed as one *placement*: the physical worker (a TP x CP group of GPUs,
moved as a whole so tensor parallelism stays inside its node) that takes each logical
position (pipeline stage p, DP rank d). As a rank permutation, ``placement[new_rank] =
old_slot``: the GPU that held global rank ``old_slot`` runs global rank ``new_rank`` after
the change.

* **Straggler consolidation.** Slow workers are gathered into the minimal number of pipeline
  stages, ``ceil(#stragglers / workers per stage)`` (Greyhound's ceil(#stragglers / #GPUs per
  stage) with TP collapsed; equal when TP = CP = 1), preferring interior stages (the first
  and the last carry the embedding and the loss, §5.2), then stages that already hold the
  most stragglers (fewest moves). A straggler swaps with a healthy worker of a target stage,
  on its own node when possible (a same-node swap keeps every communicator's node
  structure).
* **DP/PP role swap (Figure 11).** A congested node pair that carries heavy DP (or TP) ring
  traffic is handed to light PP traffic (or none) by exchanging the roles of two nodes:
  every worker of one node trades positions with the worker of the same rank of the other.

Prediction (what-if §3.2 dependency simulator). The OpDuration tensors of the trace are
re-timed for the new placement: compute durations follow the physical worker (the estimated
slow-down factor of a straggler moves with it), transfer durations follow the node pairs the
traffic crosses (a congested pair multiplies the transfer time of every ring round or
pipeline message that crosses it, as in the simulator; a ring or message that changes
between intra- and inter-node is scaled by the inter/intra transfer ratio measured in the
trace, else :data:`DEFAULT_INTER_RATIO`). Both timelines are then replayed by
:class:`~failslow.whatif.sim.Plan` over the steps of the fail-slow; candidates
(consolidation, role swaps, both) are ranked by their predicted step time and the plan only
recommends a change predicted to help.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from failslow.diagnosis import Anomaly
from failslow.events import JobMeta
from failslow.whatif.ops import OpTrace, WhatIfInputError

#: Inter-node over intra-node transfer time when the trace shows only one class (the
#: simulator's defaults: NVLink 200 GB/s against 25 GB/s per rank across nodes).
DEFAULT_INTER_RATIO = 8.0
#: A link factor that cannot be measured (no healthy reference) is assumed this large.
DEFAULT_LINK_FACTOR = 2.0
#: Straggler factors below this are noise (workers are not moved for them).
MIN_FACTOR = 1.03
#: A candidate placement must be predicted at least this much faster to be recommended.
MIN_GAIN = 0.005
#: Scan thresholds (fail-slow over healthy steps) for stragglers and congested links.
SCAN_COMPUTE = 1.10
SCAN_LINK = 1.5
#: Candidates replayed together hold at most this many OpDuration values (memory bound).
SIMULATE_BATCH_FLOATS = 4_000_000
#: Alternative consolidation target-stage sets replayed when there are at most this many.
MAX_TARGET_SETS = 64
COMPUTE_KINDS = ("forward-compute", "backward-compute", "optimizer")
#: (edge offset from the operation's stage) of the four pipeline operations: a forward-send
#: of stage p crosses edge p (p -> p+1), a forward-recv edge p-1, ...
P2P_EDGE = {"forward-send": 0, "forward-recv": -1, "backward-send": -1, "backward-recv": 0}


# ---------------------------------------------------------------------------------------------
# layout and faults


@dataclass(frozen=True)
class Layout:
    """Workers and nodes of a job. ``blocks[b]``: the global ranks of worker ``b = p * dp +
    d`` (stage p, DP rank d) in the current placement, its TP/CP members in order;
    ``node[r]``: node index of global rank r."""

    pp: int
    dp: int
    blocks: np.ndarray
    node: np.ndarray
    node_names: tuple[str, ...]

    @classmethod
    def regular(cls, tp: int, pp: int, dp: int, cp: int = 1, gpus_per_node: int = 8) -> Layout:
        """Megatron's rank order ``rank = tp + TP*(cp + CP*(dp + DP*pp))``, consecutive ranks
        on a node."""
        w = tp * cp
        world = w * dp * pp
        blocks = np.arange(world, dtype=np.int64).reshape(pp * dp, w)
        node = np.arange(world, dtype=np.int64) // gpus_per_node
        n = int(node.max()) + 1
        width = max(3, len(str(n - 1)))
        return cls(pp, dp, blocks, node, tuple(f"node{i:0{width}d}" for i in range(n)))

    @classmethod
    def from_meta(cls, meta: JobMeta) -> Layout:
        """Workers from the communicators (what-if's worker table), nodes from ``meta.nodes``."""
        from failslow.whatif.ops import worker_table

        _, members = worker_table(meta)
        sizes = {len(members[p][d]) for p in range(meta.pp) for d in range(meta.dp)}
        if len(sizes) != 1:
            raise WhatIfInputError("workers have different numbers of ranks")
        blocks = np.array([members[p][d] for p in range(meta.pp) for d in range(meta.dp)],
                          dtype=np.int64)
        names: list[str] = []
        index: dict[str, int] = {}
        node = np.zeros(meta.world_size, dtype=np.int64)
        for r in range(meta.world_size):
            name = meta.node_of(r)
            if name not in index:
                index[name] = len(names)
                names.append(name)
            node[r] = index[name]
        return cls(meta.pp, meta.dp, blocks, node, tuple(names))

    @property
    def world(self) -> int:
        return int(self.blocks.size)

    @property
    def block_node(self) -> np.ndarray:
        """Node of every worker (of its first rank)."""
        return np.asarray(self.node[self.blocks[:, 0]])

    def identity(self) -> np.ndarray:
        return np.arange(self.pp * self.dp, dtype=np.int64).reshape(self.pp, self.dp)

    def block_of_rank(self, rank: int) -> int:
        hit = np.flatnonzero((self.blocks == rank).any(axis=1))
        if hit.size == 0:
            raise ValueError(f"rank {rank} is not in the job")
        return int(hit[0])


@dataclass
class PhysicalFaults:
    """Fail-slows attached to hardware, independent of the placement: ``compute[b]`` is the
    compute-duration factor of physical worker b; ``links[(a, b)]`` (a < b, node indices)
    the transfer-time factor of every ring round or pipeline message crossing nodes a, b."""

    compute: dict[int, float] = field(default_factory=dict)
    links: dict[tuple[int, int], float] = field(default_factory=dict)

    def stragglers(self) -> list[int]:
        """Slow workers, the slowest first."""
        return sorted((b for b, f in self.compute.items() if f >= MIN_FACTOR),
                      key=lambda b: (-self.compute[b], b))

    def to_dict(self, layout: Layout) -> dict[str, Any]:
        return {"compute": [{"ranks": layout.blocks[b].tolist(), "factor": round(f, 4)}
                            for b, f in sorted(self.compute.items())],
                "links": [{"nodes": [layout.node_names[a], layout.node_names[b]],
                           "factor": round(f, 4)} for (a, b), f in sorted(self.links.items())]}


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a <= b else (b, a)


# ---------------------------------------------------------------------------------------------
# placements


def rank_permutation(layout: Layout, block_of: np.ndarray) -> np.ndarray:
    """``perm[new_rank] = old_slot`` for the worker placement ``block_of`` (P, D): member t
    of the worker at (p, d) runs the global rank that member t of position (p, d) has."""
    perm = np.empty(layout.world, dtype=np.int64)
    perm[layout.blocks.reshape(-1)] = layout.blocks[block_of.reshape(-1)].reshape(-1)
    return perm


def is_permutation(perm: Sequence[int] | np.ndarray) -> bool:
    p = np.asarray(perm)
    return bool(p.ndim == 1 and np.array_equal(np.sort(p), np.arange(p.size)))


def stages_needed(n_stragglers: int, workers_per_stage: int) -> int:
    """Greyhound §5.2: ceil(#stragglers / #GPUs per stage) (TP collapsed into workers)."""
    return math.ceil(n_stragglers / workers_per_stage) if n_stragglers else 0


def stage_preference(pp: int, straggler_stages: Iterable[int] = ()) -> list[int]:
    """Stages in order of preference for consolidation: interior stages first (the first
    and last stages carry the embedding and the loss, §5.2), among them those that already
    hold the most stragglers, then the middle ones; then the first stage, the last one
    last (it is the heaviest)."""
    held: dict[int, int] = {}
    for s in straggler_stages:
        held[s] = held.get(s, 0) + 1
    mid = (pp - 1) / 2
    interior = sorted(range(1, pp - 1), key=lambda s: (-held.get(s, 0), abs(s - mid), s))
    edges = [s for s in (0, pp - 1) if s not in interior]
    edges = sorted(set(edges), key=lambda s: (s == pp - 1 and pp > 1, -held.get(s, 0)))
    return interior + edges


def consolidate(layout: Layout, stragglers: Sequence[int],
                block_of: np.ndarray | None = None, targets: Sequence[int] | None = None
                ) -> tuple[np.ndarray, list[int]]:
    """Straggler consolidation (see the module docstring): the new placement and the chosen
    target stages (``targets``: force these instead of :func:`stage_preference`'s).
    ``stragglers``: physical workers, the slowest first. When they would need every stage
    there is no room and the placement is returned unchanged."""
    P, D = layout.pp, layout.dp
    place = (layout.identity() if block_of is None else block_of).copy()
    strag = [int(b) for b in stragglers]
    need = stages_needed(len(strag), D)
    if need == 0 or need >= P:
        return place, []
    where = {int(b): divmod(int(i), D) for i, b in enumerate(place.reshape(-1))}
    if targets is None:
        targets = stage_preference(P, (where[b][0] for b in strag))[:need]
    targets = list(targets)
    if len(targets) != need:
        raise ValueError(f"{len(strag)} stragglers need {need} target stages")
    bnode = layout.block_node
    is_strag = set(strag)
    movers = [b for b in strag if where[b][0] not in targets]
    for b in movers:
        p0, d0 = where[b]
        free = [(t, d) for t in targets for d in range(D) if int(place[t, d]) not in is_strag]
        # keep the node structure (same node), then the same pipeline, then the first stage
        t, d = min(free, key=lambda td: (bnode[place[td]] != bnode[b], td[1] != d0,
                                         targets.index(td[0]), td[1]))
        other = int(place[t, d])
        place[t, d], place[p0, d0] = b, other
        where[b], where[other] = (t, d), (p0, d0)
    return place, targets


def node_swap(layout: Layout, block_of: np.ndarray, a: int, b: int) -> np.ndarray | None:
    """Exchange the roles of nodes a and b: the k-th worker on a trades positions with the
    k-th worker on b (None when they hold different numbers of workers)."""
    bnode = layout.block_node
    flat = block_of.reshape(-1)
    on_a = np.flatnonzero(bnode[flat] == a)
    on_b = np.flatnonzero(bnode[flat] == b)
    if on_a.size != on_b.size or on_a.size == 0:
        return None
    out = flat.copy()
    out[on_a], out[on_b] = flat[on_b], flat[on_a]
    return out.reshape(block_of.shape)


def crossing(layout: Layout, block_of: np.ndarray, a: int, b: int) -> dict[str, int]:
    """How much of each traffic kind crosses the node pair {a, b} in a placement: DP ring
    edges and PP messages (pipeline pairs) joining the two nodes."""
    pos = layout.block_node[block_of]
    out = {"dp": 0, "pp": 0}
    if layout.dp > 1:
        nxt = np.roll(pos, -1, axis=1)
        out["dp"] = int((((pos == a) & (nxt == b)) | ((pos == b) & (nxt == a))).sum())
        if layout.dp == 2:
            out["dp"] //= 2
    if layout.pp > 1:
        lo, hi = pos[:-1], pos[1:]
        out["pp"] = int((((lo == a) & (hi == b)) | ((lo == b) & (hi == a))).sum())
    return out


# ---------------------------------------------------------------------------------------------
# re-timing the OpDuration tensors


@dataclass
class _Structure:
    dp_inter: np.ndarray   # (P,) the stage's DP ring crosses nodes
    dp_cong: np.ndarray    # (P,) product of the congested pairs it crosses
    pp_inter: np.ndarray   # (P-1, D)
    pp_cong: np.ndarray    # (P-1, D)


def _structure(layout: Layout, block_of: np.ndarray,
               links: dict[tuple[int, int], float]) -> _Structure:
    pos = layout.block_node[block_of]
    P, D = pos.shape
    dp_inter = np.zeros(P, dtype=bool)
    dp_cong = np.ones(P)
    if D > 1:
        nxt = np.roll(pos, -1, axis=1)
        dp_inter = (pos != nxt).any(axis=1)
        for (a, b), f in links.items():
            hit = (((pos == a) & (nxt == b)) | ((pos == b) & (nxt == a))).any(axis=1)
            dp_cong = np.where(hit, dp_cong * f, dp_cong)
    lo, hi = pos[:-1], pos[1:]
    pp_inter = lo != hi
    pp_cong = np.ones(lo.shape)
    for (a, b), f in links.items():
        hit = ((lo == a) & (hi == b)) | ((lo == b) & (hi == a))
        pp_cong = np.where(hit, pp_cong * f, pp_cong)
    return _Structure(dp_inter, dp_cong, pp_inter, pp_cong)


def _kind_family(ops: OpTrace, name: str) -> str:
    kind = ops.kinds.get(name)
    if name in COMPUTE_KINDS:
        return "compute"
    if kind is None:
        return ""
    if kind.group == "dp" and name in ("params-sync", "grads-sync"):
        return "dp"
    if kind.group == "p2p" and name in P2P_EDGE:
        return "pp"
    return ""


def inter_ratios(ops: OpTrace, layout: Layout, links: dict[tuple[int, int], float],
                 steps: np.ndarray | None = None) -> tuple[dict[str, float], list[str]]:
    """Inter- over intra-node transfer time of DP rings and PP messages, from traced
    instances that cross no congested pair (``steps``: which steps to use)."""
    st = _structure(layout, layout.identity(), links)
    sel = slice(None) if steps is None else steps
    out: dict[str, float] = {}
    notes: list[str] = []
    samples: dict[str, tuple[list[float], list[float]]] = {"dp": ([], []), "pp": ([], [])}
    for name in ops.dur:
        fam = _kind_family(ops, name)
        x = ops.dur[name][sel]
        if fam == "dp":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                per_stage = np.nanmedian(x, axis=(0, 1, 3)) if x.size else np.array([])
            for p, v in enumerate(per_stage.tolist()):
                if st.dp_cong[p] == 1.0 and np.isfinite(v) and v > 0:
                    samples["dp"][int(st.dp_inter[p])].append(v)
        elif fam == "pp":
            off = P2P_EDGE[name]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = np.nanmedian(x, axis=(0, 1)) if x.size else np.zeros((0, 0))
            for p in range(ops.pp):
                e = p + off
                if not 0 <= e < ops.pp - 1:
                    continue
                for d in range(ops.dp):
                    v = float(med[p, d])
                    if st.pp_cong[e, d] == 1.0 and np.isfinite(v) and v > 0:
                        samples["pp"][int(st.pp_inter[e, d])].append(v)
    for fam, (intra, inter) in samples.items():
        if intra and inter:
            out[fam] = float(np.median(inter) / np.median(intra))
    for fam in ("dp", "pp"):
        if fam not in out:
            other = "pp" if fam == "dp" else "dp"
            if other in out:
                out[fam] = out[other]
                notes.append(f"{fam} inter/intra-node ratio taken from {other} traffic")
            else:
                out[fam] = DEFAULT_INTER_RATIO
                notes.append(f"{fam} inter/intra-node ratio assumed {DEFAULT_INTER_RATIO:g} "
                             "(the trace shows one class only)")
    return out, notes


def retime(ops: OpTrace, layout: Layout, observed: PhysicalFaults, target: PhysicalFaults,
           block_of: np.ndarray, ratios: dict[str, float] | None = None,
           observed_block_of: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """OpDuration tensors for placement ``block_of`` with faults ``target``, from tensors
    traced under ``observed_block_of`` (default: the current placement) with faults
    ``observed`` (see the module docstring). Kinds other than compute, DP syncs and
    pipeline messages keep their traced durations."""
    old = layout.identity() if observed_block_of is None else observed_block_of
    r = ratios or {"dp": DEFAULT_INTER_RATIO, "pp": DEFAULT_INTER_RATIO}
    n_blocks = layout.pp * layout.dp

    def factors(f: PhysicalFaults) -> np.ndarray:
        arr = np.ones(n_blocks)
        for b, v in f.compute.items():
            arr[b] = v
        return arr

    comp = factors(target)[block_of] / factors(observed)[old]          # (P, D)
    s_old = _structure(layout, old, observed.links)
    s_new = _structure(layout, block_of, target.links)
    dp_mult = (np.where(s_new.dp_inter, r["dp"], 1.0) * s_new.dp_cong) / (
        np.where(s_old.dp_inter, r["dp"], 1.0) * s_old.dp_cong)       # (P,)
    pp_mult = (np.where(s_new.pp_inter, r["pp"], 1.0) * s_new.pp_cong) / (
        np.where(s_old.pp_inter, r["pp"], 1.0) * s_old.pp_cong)       # (P-1, D)
    out: dict[str, np.ndarray] = {}
    for name, x in ops.dur.items():
        fam = _kind_family(ops, name)
        if fam == "compute" and not np.all(comp == 1.0):
            out[name] = x * comp[None, None, :, :]
        elif fam == "dp" and not np.all(dp_mult == 1.0):
            out[name] = x * dp_mult[None, None, :, None]
        elif fam == "pp" and pp_mult.size and not np.all(pp_mult == 1.0):
            off = P2P_EDGE[name]
            mult = np.ones((ops.pp, ops.dp))
            for p in range(ops.pp):
                if 0 <= p + off < ops.pp - 1:
                    mult[p] = pp_mult[p + off]
            out[name] = x * mult[None, None, :, :]
        else:
            out[name] = x
    return out


def subset_steps(ops: OpTrace, mask: np.ndarray) -> OpTrace:
    """The same trace restricted to the selected steps."""
    return dataclasses.replace(ops, steps=ops.steps[mask], actual=ops.actual[mask],
                               dur={k: v[mask] for k, v in ops.dur.items()})


def simulate_many(ops: OpTrace, durs: Sequence[dict[str, np.ndarray]]) -> np.ndarray:
    """Replay several sets of OpDuration tensors (one per candidate) with the what-if
    dependency simulator in one run, stacked along the step axis: (candidates, steps)."""
    from failslow.whatif.sim import Plan, Variants

    K, S = len(durs), ops.steps.size
    if K == 0:
        return np.zeros((0, S))
    size = sum(v.size for v in ops.dur.values())
    per_run = max(1, min(K, SIMULATE_BATCH_FLOATS // max(size, 1)))
    out = []
    for lo in range(0, K, per_run):
        part = durs[lo:lo + per_run]
        n = len(part)
        plan = Plan(dataclasses.replace(
            ops, steps=np.arange(n * S), actual=np.tile(ops.actual, n),
            dur={k: np.concatenate([d[k] for d in part], axis=0) for k in ops.dur}))
        keep = np.ones((1, len(plan.kind_names), ops.pp, ops.dp), dtype=bool)
        zero = {name: np.zeros(n * S) for name in plan.kind_names}
        out.append(np.asarray(plan.run(Variants(keep), zero)[0]).reshape(n, S))
    return np.concatenate(out, axis=0)


# ---------------------------------------------------------------------------------------------
# estimating the physical faults from a trace


def _instance_sums(ops: OpTrace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per step: compute time of every worker (S, P, D), transfer time of every stage's DP
    syncs (S, P) and of every pipeline pair's messages (S, P-1, D)."""
    S, P, D = ops.steps.size, ops.pp, ops.dp
    comp = np.zeros((S, P, D))
    dp = np.zeros((S, P))
    pp = np.zeros((S, max(P - 1, 0), D))
    for name, x in ops.dur.items():
        fam = _kind_family(ops, name)
        if fam == "compute" and name != "optimizer":
            comp += np.nansum(x, axis=1)
        elif fam == "dp":
            dp += np.nanmean(np.nansum(x, axis=1), axis=2)
        elif fam == "pp" and P > 1:
            off = P2P_EDGE[name]
            v = np.nansum(x, axis=1)                               # (S, P, D)
            lo, hi = max(0, -off), min(P, P - 1 - off)
            pp[:, lo + off:hi + off] += v[:, lo:hi]
    return comp, dp, pp


def scan_faults(ops: OpTrace, layout: Layout, fault_steps: np.ndarray,
                known: PhysicalFaults | None = None) -> tuple[list[int], list[tuple[int, int]]]:
    """Stragglers and congested node pairs the diagnosis may not have named (Greyhound's
    validation benchmarks every GPU and link, §4.3): workers whose compute takes at least
    :data:`SCAN_COMPUTE` times longer during the fail-slow than in the other steps, and the
    fewest node pairs whose crossing DP rings and pipeline pairs are all at least
    :data:`SCAN_LINK` times slower and that explain every such slow instance."""
    healthy = ~fault_steps
    if int(healthy.sum()) < 2 or not fault_steps.any():
        return [], []
    comp, dp, pp = _instance_sums(ops)

    def ratio(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            r = x[fault_steps].mean(axis=0) / x[healthy].mean(axis=0)
        return np.nan_to_num(r, nan=1.0, posinf=1.0)

    stragglers = [int(b) for b in np.flatnonzero(ratio(comp).reshape(-1) >= SCAN_COMPUTE)]
    pos = layout.block_node[layout.identity()]
    P, D = pos.shape
    inst_pairs: dict[tuple[str, int, int], set[tuple[int, int]]] = {}
    if D > 1:
        for p in range(P):
            inst_pairs[("dp", p, 0)] = {_pair(int(pos[p, d]), int(pos[p, (d + 1) % D]))
                                        for d in range(D) if pos[p, d] != pos[p, (d + 1) % D]}
    for e in range(P - 1):
        for d in range(D):
            if pos[e, d] != pos[e + 1, d]:
                inst_pairs[("pp", e, d)] = {_pair(int(pos[e, d]), int(pos[e + 1, d]))}
    rd, rp = ratio(dp), ratio(pp)
    slow = {k for k in inst_pairs
            if (rd[k[1]] if k[0] == "dp" else rp[k[1], k[2]]) >= SCAN_LINK}
    known_pairs = set(known.links) if known else set()
    slow = {k for k in slow if not (inst_pairs[k] & known_pairs)}
    candidates: dict[tuple[int, int], set[tuple[str, int, int]]] = {}
    for k, pairs in inst_pairs.items():
        for pr in pairs:
            candidates.setdefault(pr, set()).add(k)
    consistent = {pr: ks for pr, ks in candidates.items() if ks <= slow | {
        k for k in inst_pairs if inst_pairs[k] & known_pairs} and ks & slow}
    found: list[tuple[int, int]] = []
    left = set(slow)
    while left:
        best = max(consistent, key=lambda pr: (len(consistent[pr] & left), -pr[0], -pr[1]),
                   default=None)
        if best is None or not consistent[best] & left:
            break
        found.append(best)
        left -= consistent[best]
    return stragglers, found


def estimate_faults(ops: OpTrace, layout: Layout, fault_steps: np.ndarray,
                    straggler_ranks: Iterable[int], link_nodes: Iterable[tuple[int, int]],
                    scan: bool = True) -> tuple[PhysicalFaults, list[str]]:
    """Factors of the diagnosed stragglers and slow links over the fail-slow's steps: the
    worker's (the crossing instances') mean duration there over its mean in the other
    steps; without enough other steps, over the same stage's healthy workers (the
    non-crossing instances of the same class). ``scan``: add what :func:`scan_faults`
    finds."""
    notes: list[str] = []
    healthy = ~fault_steps
    use_time = int(healthy.sum()) >= 2 and bool(fault_steps.any())
    faults = PhysicalFaults()
    blocks = sorted({layout.block_of_rank(int(r)) for r in straggler_ranks})
    link_nodes = [_pair(int(a), int(b)) for a, b in link_nodes if a != b]
    if scan and use_time:
        extra_b, extra_l = scan_faults(ops, layout, fault_steps,
                                       PhysicalFaults(links={k: 2.0 for k in link_nodes}))
        added_b = sorted(set(extra_b) - set(blocks))
        added_l = sorted(set(extra_l) - set(link_nodes))
        if added_b:
            notes.append("stragglers found by the scan: " + ", ".join(
                str(layout.blocks[b].tolist()) for b in added_b))
        if added_l:
            notes.append("congested node pairs found by the scan: " + ", ".join(
                f"{layout.node_names[a]}-{layout.node_names[b]}" for a, b in added_l))
        blocks = sorted(set(blocks) | set(added_b))
        link_nodes = link_nodes + added_l
    comp, _, _ = _instance_sums(ops)
    for b in blocks:
        p, d = divmod(b, ops.dp)
        if use_time:
            ref = float(comp[healthy, p, d].mean())
            val = float(comp[fault_steps, p, d].mean())
        else:
            others = [x for x in range(ops.dp) if (p * ops.dp + x) not in blocks]
            sel = fault_steps if fault_steps.any() else np.ones(ops.steps.size, dtype=bool)
            if not others:
                notes.append(f"worker {b}: no healthy reference; factor unknown")
                continue
            ref = float(np.median(comp[sel][:, p, others].mean(axis=0)))
            val = float(comp[sel, p, d].mean())
        if ref > 0:
            faults.compute[b] = max(1.0, val / ref)
    pairs = sorted(set(link_nodes))
    ident = layout.identity()
    for a, b in pairs:
        st = _structure(layout, ident, {(a, b): 2.0})
        num = den = 0.0
        ref_num = ref_den = 0.0
        for name, x in ops.dur.items():
            fam = _kind_family(ops, name)
            if fam == "dp":
                hit = st.dp_cong > 1.0
                inst = np.nansum(x, axis=1)                          # (S, P, D)
                cross = inst[:, hit, :]
                same = inst[:, (~hit) & st.dp_inter, :]
            elif fam == "pp":
                off = P2P_EDGE[name]
                hit = np.zeros((ops.pp, ops.dp), dtype=bool)
                inter = np.zeros((ops.pp, ops.dp), dtype=bool)
                for p in range(ops.pp):
                    if 0 <= p + off < ops.pp - 1:
                        hit[p] = st.pp_cong[p + off] > 1.0
                        inter[p] = st.pp_inter[p + off]
                inst = np.nansum(x, axis=1)
                cross = inst[:, hit]
                same = inst[:, (~hit) & inter]
            else:
                continue
            if cross.size == 0:
                continue
            if use_time:
                num += float(cross[fault_steps].mean()) * cross.shape[1]
                den += float(cross[healthy].mean()) * cross.shape[1]
            elif same.size:
                sel = fault_steps if fault_steps.any() else np.ones_like(fault_steps)
                ref_num += float(cross[sel].mean()) * cross.shape[1]
                ref_den += float(same[sel].mean()) * cross.shape[1]
        if use_time and den > 0:
            faults.links[(a, b)] = max(1.0, num / den)
        elif ref_den > 0:
            faults.links[(a, b)] = max(1.0, ref_num / ref_den)
        else:
            faults.links[(a, b)] = DEFAULT_LINK_FACTOR
            notes.append(f"link {layout.node_names[a]}-{layout.node_names[b]}: factor not "
                         f"measurable, assumed {DEFAULT_LINK_FACTOR:g}")
    return faults, notes


# ---------------------------------------------------------------------------------------------
# the plan


@dataclass
class TopologyPlan:
    """S3's plan: the new placement and its predicted effect (``to_dict`` for JSON)."""

    layout: Layout
    faults: PhysicalFaults
    block_of: np.ndarray
    strategy: str                      # consolidate | role-swap | consolidate+role-swap | none
    stragglers: list[int]              # physical workers
    stages_needed: int
    target_stages: list[int]
    node_swaps: list[tuple[int, int]]
    predicted_before_s: float | None = None
    predicted_after_s: float | None = None
    candidates: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    alternatives: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return not np.array_equal(self.block_of, self.layout.identity())

    @property
    def feasible(self) -> bool:
        """A change is recommended: the placement differs and is not predicted slower."""
        if not self.changed:
            return False
        if self.predicted_before_s is None or self.predicted_after_s is None:
            return True
        return self.predicted_after_s < self.predicted_before_s

    @property
    def placement(self) -> np.ndarray:
        return rank_permutation(self.layout, self.block_of)

    def moves(self) -> list[dict[str, Any]]:
        """Workers that change position: the old and new ranks of their GPUs."""
        lay = self.layout
        out = []
        ident = lay.identity()
        for (p, d), b in np.ndenumerate(self.block_of):
            if b != ident[p, d]:
                out.append({"worker_ranks_before": lay.blocks[b].tolist(),
                            "worker_ranks_after": lay.blocks[ident[p, d]].tolist(),
                            "node": lay.node_names[lay.block_node[b]],
                            "stage_before": int(b) // lay.dp, "stage_after": int(p),
                            "dp_before": int(b) % lay.dp, "dp_after": int(d)})
        return out

    @property
    def reason(self) -> str:
        if self.feasible:
            return ""
        if not self.stragglers and not self.faults.links:
            return "no straggler or slow link to work around"
        if self.stages_needed >= self.layout.pp and not self.faults.links:
            return (f"{len(self.stragglers)} stragglers need every stage: no room for "
                    "consolidation")
        return "no placement is predicted to be faster"

    def to_dict(self) -> dict[str, Any]:
        lay = self.layout
        perm = self.placement
        before, after = self.predicted_before_s, self.predicted_after_s
        return {
            "strategy": "S3",
            "kind": self.strategy,
            "feasible": self.feasible,
            "reason": self.reason,
            "stragglers": [lay.blocks[b].tolist() for b in self.stragglers],
            "stages_needed": self.stages_needed,
            "target_stages": self.target_stages,
            "node_swaps": [[lay.node_names[a], lay.node_names[b]] for a, b in self.node_swaps],
            "placement": perm.tolist(),
            "node_of_rank": [lay.node_names[lay.node[s]] for s in perm.tolist()],
            "moves": self.moves(),
            "faults": self.faults.to_dict(lay),
            "predicted_before_s": before,
            "predicted_after_s": after,
            "predicted_speedup": before / after if before and after else None,
            "candidates": self.candidates,
            "notes": self.notes,
        }


def structure_changes(layout: Layout, before: np.ndarray, after: np.ndarray) -> bool:
    """Whether some DP ring or pipeline pair changes between intra- and inter-node."""
    a, b = _structure(layout, before, {}), _structure(layout, after, {})
    return not (np.array_equal(a.dp_inter, b.dp_inter)
                and np.array_equal(a.pp_inter, b.pp_inter))


def _role_swaps(layout: Layout, start: np.ndarray, links: dict[tuple[int, int], float],
                evaluate: Any | None, max_candidates: int = 24, to_pp: bool = False
                ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Greedy DP/PP role swaps: for each congested pair (worst first) that carries DP ring
    traffic, the node swap of one of its ends after which the pair carries no DP traffic,
    the least traffic, chosen by ``evaluate`` (predicted step time) when given.
    ``to_pp``: only swaps after which the pair carries PP traffic (Figure 11 exactly)."""
    place = start.copy()
    swaps: list[tuple[int, int]] = []
    n_nodes = len(layout.node_names)
    for (a, b), _f in sorted(links.items(), key=lambda kv: -kv[1]):
        if crossing(layout, place, a, b)["dp"] == 0:
            continue
        options: list[tuple[tuple[int, int, int], np.ndarray, tuple[int, int]]] = []
        for end in (b, a):
            for n in range(n_nodes):
                if n in (a, b):
                    continue
                cand = node_swap(layout, place, end, n)
                if cand is None:
                    continue
                c = crossing(layout, cand, a, b)
                if c["dp"] or (to_pp and not c["pp"]):
                    continue
                others = sum(crossing(layout, cand, x, y)["dp"]
                             for (x, y) in links if (x, y) != (a, b))
                options.append(((others, c["pp"], abs(n - end)), cand, (end, n)))
        if not options:
            continue
        options.sort(key=lambda o: o[0])
        options = options[:max_candidates]
        if evaluate is not None:
            times = evaluate([o[1] for o in options] + [place])
            best = int(np.argmin(times[:-1]))
            if times[best] >= times[-1]:
                continue
        else:
            best = 0
        place = options[best][1]
        swaps.append(options[best][2])
    return place, swaps


def plan_topology(layout: Layout, faults: PhysicalFaults, ops: OpTrace | None = None,
                  ratios: dict[str, float] | None = None, notes: Sequence[str] = ()
                  ) -> TopologyPlan:
    """S3 for the given physical faults (see the module docstring). With ``ops`` (the
    OpDuration tensors of the fail-slow's steps, traced under the current placement with
    these faults), every candidate is replayed and the fastest is chosen."""
    strag = faults.stragglers()
    need = stages_needed(len(strag), layout.dp)
    all_notes = list(notes)
    ratio_notes: list[str] = []
    if ops is not None and ratios is None:
        ratios, ratio_notes = inter_ratios(ops, layout, faults.links)
    ident = layout.identity()

    evaluate = None
    if ops is not None:
        trace = ops

        def evaluate(places: Sequence[np.ndarray]) -> np.ndarray:
            durs = [retime(trace, layout, faults, faults, p, ratios) for p in places]
            return simulate_many(trace, durs).mean(axis=1)

    cands: dict[str, tuple[np.ndarray, list[int], list[tuple[int, int]]]] = {
        "none": (ident, [], [])}
    if need >= layout.pp and strag:
        all_notes.append(f"{len(strag)} stragglers need {need} of {layout.pp} stages: no "
                         "room for consolidation")
    if strag and need < layout.pp:
        cons, targets = consolidate(layout, strag)
        cands["consolidate"] = (cons, targets, [])
        if evaluate is not None and math.comb(layout.pp, need) <= MAX_TARGET_SETS:
            # the paper's preference first; other stage sets compete on the prediction
            for other in itertools.combinations(range(layout.pp), need):
                if sorted(other) != sorted(targets):
                    alt, _ = consolidate(layout, strag, targets=list(other))
                    name = "consolidate@" + ",".join(map(str, other))
                    cands[name] = (alt, list(other), [])
    if faults.links:
        swapped, swaps = _role_swaps(layout, ident, faults.links, evaluate)
        cands["role-swap"] = (swapped, [], swaps)
        to_pp, swaps_pp = _role_swaps(layout, ident, faults.links, evaluate, to_pp=True)
        if not np.array_equal(to_pp, swapped):
            cands["role-swap-to-pp"] = (to_pp, [], swaps_pp)
        if "consolidate" in cands:
            base, targets, _ = cands["consolidate"]
            both, swaps2 = _role_swaps(layout, base, faults.links, evaluate)
            cands["consolidate+role-swap"] = (both, targets, swaps2)
    names = list(cands)
    predicted: dict[str, float] = {}
    if evaluate is not None:
        times = evaluate([cands[n][0] for n in names])
        predicted = {n: float(t) for n, t in zip(names, times, strict=True)}
        choice = min(names, key=lambda n: (predicted[n], names.index(n)))
        if predicted[choice] > predicted["none"] * (1.0 - MIN_GAIN):
            choice = "none"
    else:
        order = ["consolidate+role-swap", "consolidate", "role-swap"]
        choice = next((n for n in order if n in cands
                       and not np.array_equal(cands[n][0], ident)), "none")
    place, targets, swaps = cands[choice]
    if ratio_notes and structure_changes(layout, ident, place):
        all_notes += ratio_notes
    return TopologyPlan(layout=layout, faults=faults, block_of=place, strategy=choice,
                        stragglers=strag, stages_needed=need, target_stages=targets,
                        node_swaps=swaps,
                        predicted_before_s=predicted.get("none"),
                        predicted_after_s=predicted.get(choice),
                        candidates=predicted, notes=all_notes,
                        alternatives={n: c[0] for n, c in cands.items()})


# ---------------------------------------------------------------------------------------------
# from a trace and its diagnosis


def step_start_times(tables: dict[str, pa.Table], ops: OpTrace, meta: JobMeta
                     ) -> np.ndarray | None:
    """Start time (ns) of every step of ``ops``: its first span, else the representative
    worker's params-sync enters in order; None when neither works."""
    import pyarrow.compute as pc

    span = tables.get("span")
    if span is not None and span.num_rows:
        step = np.asarray(span.column("step").to_numpy(), dtype=np.int64)
        t0 = np.asarray(span.column("t_start").to_numpy(), dtype=np.int64)
        uniq, inv = np.unique(step, return_inverse=True)
        lo = np.full(uniq.size, np.iinfo(np.int64).max)
        np.minimum.at(lo, inv.reshape(-1), t0)
        pos = np.searchsorted(uniq, ops.steps)
        if np.all(pos < uniq.size) and np.array_equal(uniq[np.minimum(pos, uniq.size - 1)],
                                                      ops.steps):
            return np.asarray(lo[pos])
    coll = tables.get("coll")
    if coll is None or coll.num_rows == 0 or meta.dp < 2:
        return None
    rank0 = int(ops.ranks[0, 0])
    mask = pc.and_(pc.and_(pc.equal(coll.column("rank"), rank0),
                           pc.equal(coll.column("op"), "allgather")),
                   pc.equal(coll.column("phase"), "enter"))
    t = np.sort(np.asarray(coll.filter(mask).column("t").to_numpy(), dtype=np.int64))
    first = int(ops.steps.min()) if ops.steps.size else 0
    idx = ops.steps - first
    if t.size == 0 or idx.max() >= t.size:
        return None
    return np.asarray(t[idx])


def steps_in_window(ops: OpTrace, step_starts: np.ndarray | None,
                    anomalies: Sequence[Anomaly]) -> np.ndarray:
    """Steps that spent at least half their time inside an anomaly's window (none when the
    step times are unknown)."""
    mask = np.zeros(ops.steps.size, dtype=bool)
    if step_starts is None:
        return mask
    begin = step_starts.astype(np.float64)
    end = begin + ops.actual * 1e9
    for a in anomalies:
        lo = float(a.start_ns or 0)
        hi = float(a.end_ns) if a.end_ns is not None else math.inf
        inside = np.clip(np.minimum(end, hi) - np.maximum(begin, lo), 0.0, None)
        mask |= inside >= 0.5 * (end - begin)
    return mask


def anomaly_groups(anomalies: Sequence[Anomaly]) -> list[list[Anomaly]]:
    """Slow anomalies grouped by overlapping time windows (planned together)."""
    slow = sorted((a for a in anomalies if a.kind == "slow"),
                  key=lambda a: (a.start_ns or 0, a.id))
    groups: list[list[Anomaly]] = []
    end = -1
    for a in slow:
        s = a.start_ns or 0
        e = a.end_ns if a.end_ns is not None else np.iinfo(np.int64).max
        if groups and s <= end:
            groups[-1].append(a)
            end = max(end, e)
        else:
            groups.append([a])
            end = e
    return groups


def plan_for_anomalies(ops: OpTrace, meta: JobMeta, anomalies: Sequence[Anomaly],
                       step_starts: np.ndarray | None) -> TopologyPlan:
    """S3 for a group of concurrent slow anomalies: faults estimated over their steps
    (compute and mixed anomalies' ranks are stragglers, their ``link`` ranks' nodes the
    congested pair), candidates replayed over those steps."""
    layout = Layout.from_meta(meta)
    notes: list[str] = []
    mask = steps_in_window(ops, step_starts, anomalies)
    if not mask.any():
        mask[:] = True
        notes.append("step times unknown: all steps used")
    strag: list[int] = []
    links: list[tuple[int, int]] = []
    for a in anomalies:
        if a.cause in ("compute", "mixed"):
            strag += list(a.ranks)
        if a.cause in ("communication", "mixed") and a.link and len(a.link) == 2:
            links.append((int(layout.node[a.link[0]]), int(layout.node[a.link[1]])))
    faults, more = estimate_faults(ops, layout, mask, strag, links)
    notes += more
    sub = subset_steps(ops, mask)
    plan = plan_topology(layout, faults, sub, notes=notes)
    return plan
