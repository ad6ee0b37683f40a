"""Estimating S3's physical faults from a trace (Greyhound §5.2, with the per-GPU and
per-link validation of §4.3): slow-down factors of the diagnosed stragglers and congested
node pairs, plus those a scan of the fail-slow's steps against the healthy ones finds."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from failslow.mitigation.topology_layout import Layout, PhysicalFaults, _pair
from failslow.mitigation.topology_retime import P2P_EDGE, _kind_family, _structure
from failslow.whatif.ops import OpTrace

#: A link factor that cannot be measured (no healthy reference) is assumed this large.
DEFAULT_LINK_FACTOR = 2.0
#: Scan thresholds (fail-slow over healthy steps) for stragglers and congested links.
SCAN_COMPUTE = 1.10
SCAN_LINK = 1.5


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
