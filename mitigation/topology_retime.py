"""Re-timing the OpDuration tensors of a trace for a new placement (S3's prediction,
Greyhound §5.2; replayed by the what-if dependency simulator).

Compute durations follow the physical worker (the estimated slow-down factor of a straggler
moves with it), transfer durations follow the node pairs the traffic crosses (a congested
pair multiplies the transfer time of every ring round or pipeline message that crosses it,
as in the simulator; a ring or message that changes between intra- and inter-node is scaled
by the inter/intra transfer ratio measured in the trace, else :data:`DEFAULT_INTER_RATIO`).
:func:`simulate_many` replays several such timelines with :class:`~failslow.whatif.sim.Plan`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from failslow.mitigation.topology_layout import Layout, PhysicalFaults
from failslow.whatif.ops import OpTrace

#: Inter-node over intra-node transfer time when the trace shows only one class (the
#: simulator's defaults: NVLink 200 GB/s against 25 GB/s per rank across nodes).
DEFAULT_INTER_RATIO = 8.0
#: Candidates replayed together hold at most this many OpDuration values (memory bound).
SIMULATE_BATCH_FLOATS = 4_000_000
COMPUTE_KINDS = ("forward-compute", "backward-compute", "optimizer")
#: (edge offset from the operation's stage) of the four pipeline operations: a forward-send
#: of stage p crosses edge p (p -> p+1), a forward-recv edge p-1, ...
P2P_EDGE = {"forward-send": 0, "forward-recv": -1, "backward-send": -1, "backward-recv": 0}


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


def structure_changes(layout: Layout, before: np.ndarray, after: np.ndarray) -> bool:
    """Whether some DP ring or pipeline pair changes between intra- and inter-node."""
    a, b = _structure(layout, before, {}), _structure(layout, after, {})
    return not (np.array_equal(a.dp_inter, b.dp_inter)
                and np.array_equal(a.pp_inter, b.pp_inter))
