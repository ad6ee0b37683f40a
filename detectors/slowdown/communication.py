"""The communication side of localization (Greyhound §4.3): the cross-group comparison of
transfer times (groups slower than their own reference and than their comparable cluster,
beyond their own noise) and the slow link (ring-neighbour analysis over the node pairs the
slow groups cross, ties broken by RDMA queue-pair occupancy, MEGATRACE §III-B)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from failslow.detectors.iterations import _group_starts
from failslow.detectors.slowdown.accounting import BinnedStats
from failslow.detectors.slowdown.bins import _lookup
from failslow.detectors.slowdown.config import SlowdownConfig
from failslow.detectors.slowdown.levels import Window


class TransferNoise:
    """Per group: ``noise_z`` times the relative noise of its mean transfer time (see
    :meth:`__call__`), the per-group spreads of the latest reference window cached."""

    def __init__(self) -> None:
        self._cached: tuple[Any, ...] = (None,)

    def __call__(self, stats: BinnedStats, config: SlowdownConfig, win: Window,
                 keys: np.ndarray, n_win: np.ndarray) -> np.ndarray:
        """Per group (``keys`` as in :func:`slow_groups`, ``n_win`` its rounds in the
        window): ``noise_z`` times the relative noise of its mean transfer time over
        ``n_win`` rounds, from the robust spread of its per-bin means in the reference
        window (Greyhound §4.2's jitter, per group: a fabric whose transfers jitter by 15%
        makes single slow iterations of a ring, and those are no slow link) -- at least
        the spread pooled over its comparable cluster (Greyhound §4.3: groups of one kind,
        op and bytes share one fabric): a short reference holds a few bins of a group, and
        their spread can be far below the fabric's. 0 where neither is known."""
        c = config
        by = ("cidx", "group", "cls")
        b = stats.grp.query(win.b_lo, win.b_hi, ("bin", *by))
        if len(b["bin"]) == 0:
            return np.zeros(len(keys))
        if self._cached[0] is not b:  # the reference's sums changed (or another window)
            self._cached = (b, *group_noise(b, stats.kinds_of))
        _, uk, sigma, per_bin = self._cached
        sig = _lookup(keys, uk, sigma)
        rounds = _lookup(keys, uk, per_bin)
        return c.noise_z * sig * np.sqrt(np.maximum(rounds, 1.0) / np.maximum(n_win, 1.0))


def slow_groups(stats: BinnedStats, config: SlowdownConfig, win: Window,
                noise: TransferNoise, force: bool = False, roots: Sequence[int] = ()
                ) -> list[dict[str, Any]]:
    """Greyhound §4.3 cross-group comparison on transfer times: groups slower than their
    own baseline by more than 10%, and than the median of their comparable cluster by
    more than 10% -- or the whole cluster is slower (a link every group crosses).

    A group slow that way, ``own_link_ratio`` times slower than its reference and with
    one of the ``roots`` (compute roots) as a member is kept however little time it
    costs, flagged ``own``: the root's own link may be slow too (CCL-D S3, mixed; a late
    arrival leaves the transfer itself, timed from the last entry, as it was)."""
    c = config
    by = ("cidx", "group", "cls")
    w = stats.grp.query(win.lo, win.hi, by)
    base = stats.grp.query(win.b_lo, win.b_hi, by)
    if len(w["cidx"]) == 0:
        return []
    wk, bk = _group_key(w), _group_key(base)
    w_mean = w["xfer"] / np.maximum(w["n"], 1)
    b_n = _lookup(wk, bk, base["n"])
    b_mean = _lookup(wk, bk, base["xfer"]) / np.maximum(b_n, 1)
    kinds = stats.kinds_of(w["cidx"])
    cluster = np.char.add(np.char.add(kinds.astype(str), "/"),
                          np.char.add(w["cls"].astype(str),
                                      np.where(w["group"] >= 0, "/p2p", "")))
    own = np.where(b_n > 0, w_mean / np.maximum(b_mean, 1.0), 0.0)
    _, cinv = np.unique(cluster, return_inverse=True)
    cinv = cinv.reshape(-1)
    med = np.empty(len(w_mean))
    med_own = np.empty(len(w_mean))
    csize = np.bincount(cinv)[cinv]
    order = np.argsort(cinv, kind="stable")
    starts = _group_starts(cinv[order])
    for j, st in enumerate(starts.tolist()):
        end = starts[j + 1] if j + 1 < len(starts) else len(order)
        sel = order[st:end]
        med[sel] = np.median(w_mean[sel])
        med_own[sel] = np.median(own[sel])
    cross = w_mean / np.maximum(med, 1.0)
    impact = (w_mean - b_mean) * w["n"] / win.win_ns
    # a group is slower than its own baseline by more than 10% and by more than its
    # own noise (the spread of its transfer times over the reference window)
    limit = 1 + np.maximum(c.transfer_threshold, noise(stats, config, win, wk, w["n"]))
    everyone = med_own > 1 + c.transfer_threshold
    ok = ((b_n > 0) & (own > limit)
          & ((cross > 1 + c.group_threshold) | (csize < 3) | everyone))
    # a group matters when its extra transfer time is a share of the lost time; a
    # cluster slowed as a whole matters by its summed impact
    csum = np.bincount(cinv, weights=np.where(ok, impact, 0.0))[cinv]
    matters = (impact > c.comm_share * win.lost) | (everyone & (csum > c.comm_share
                                                                 * win.lost))
    if not (ok & matters).any() and force:
        # the slow link persisted iteration by iteration: keep its strongest groups
        matters = impact >= 0.5 * float(np.max(np.where(ok, impact, 0.0)))
    mine = np.zeros(len(ok), dtype=bool)
    if len(roots):
        mine = ok & (own >= c.own_link_ratio) & _member_of(stats, w["cidx"], w["group"], roots)
        if mine.any():
            # kept however little time they cost, so an inter-node link (CCL-D S3: the
            # rank's own network link; transfers inside a host slow down with its CPU),
            # slow bin after bin (a few late transfers of a loaded host, one 25 ms recv
            # among 0.2 ms ones, are no link) and both ways: a link slows both of its
            # directions, while a late root's receive whose data had arrived before it
            # was posted times its own host
            mine[mine] = _crosses_nodes(stats, w["cidx"][mine], w["group"][mine])
        if mine.any():
            sel = np.flatnonzero(mine)
            g = w["group"][sel]
            back = np.where(g >= 0, ((g & 0xFFFFFFFF) << 32) | (g >> 32), g)
            rev = _group_key({"cidx": w["cidx"][sel], "group": back, "cls": w["cls"][sel]})
            typical = _typical_ratio(stats, win, np.concatenate([wk[sel], rev]), by)
            fwd, bwd = typical[:len(sel)], typical[len(sel):]
            mine[sel] = (fwd >= c.own_link_ratio) & (
                (g < 0) | np.isnan(bwd) | (bwd >= c.own_link_ratio))
    ok &= matters | mine
    out = []
    for j in np.flatnonzero(ok)[np.argsort(-impact[ok])].tolist():
        cidx, group = int(w["cidx"][j]), int(w["group"][j])
        ranks = ([group >> 32, group & 0xFFFFFFFF] if group >= 0
                 else stats.registry.ranks(cidx))
        out.append({"cidx": cidx, "group": group, "cls": int(w["cls"][j]),
                    "kind": str(kinds[j]),
                    "ranks": [int(x) for x in ranks], "ratio": float(own[j]),
                    "cross": float(cross[j]), "impact": float(impact[j]),
                    "own": bool(mine[j])})
    return out


def _group_key(d: dict[str, np.ndarray]) -> np.ndarray:
    """The key of each group row of ``d``: communicator, point-to-point pair, size class."""
    return (d["cidx"] << 40) ^ (d["group"] * 1_000_003) ^ d["cls"]


def _crosses_nodes(stats: BinnedStats, cidx: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per group row: does it join two nodes (a point-to-point pair on two nodes, a
    collective whose members span more than one)?"""
    node = stats.meta.node_of
    return np.array([node(int(g) >> 32) != node(int(g) & 0xFFFFFFFF) if g >= 0 else
                     len({node(int(r)) for r in stats.registry.ranks(int(ci))}) > 1
                     for ci, g in zip(cidx.tolist(), group.tolist(), strict=True)], dtype=bool)


def _typical_ratio(stats: BinnedStats, win: Window, keys: np.ndarray,
                   by: tuple[str, ...]) -> np.ndarray:
    """Per group of ``keys`` (as in :func:`slow_groups`): the median of its per-bin mean
    transfer times in the window over that median in the reference window (NaN where
    either window has none)."""
    now = _bin_medians(stats.grp.query(win.lo, win.hi, ("bin", *by)))
    ref = _bin_medians(stats.grp.query(win.b_lo, win.b_hi, ("bin", *by)))
    w_med, b_med = _lookup(keys, *now, np.nan), _lookup(keys, *ref, np.nan)
    return w_med / np.maximum(b_med, 1.0)


def _bin_medians(b: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per group of the per-bin rows ``b``: its key and the median of its per-bin mean
    transfer times."""
    k = _group_key(b)
    m = b["xfer"] / np.maximum(b["n"], 1)
    order = np.lexsort((m, k))
    k, m = k[order], m[order]
    if len(k) == 0:
        return k, m
    starts = _group_starts(k)
    cnt = np.diff(np.append(starts, len(k)))
    return k[starts], 0.5 * (m[starts + (cnt - 1) // 2] + m[starts + cnt // 2])


def _member_of(stats: BinnedStats, cidx: np.ndarray, group: np.ndarray,
               ranks: Sequence[int]) -> np.ndarray:
    """Per group row: has it one of ``ranks`` at an end (a point-to-point pair) or as a
    member (a collective)?"""
    want = np.asarray(list(ranks), dtype=np.int64)
    p2p = group >= 0
    out = p2p & (np.isin(group >> 32, want) | np.isin(group & 0xFFFFFFFF, want))
    coll = np.unique(cidx[~p2p])
    hit = [int(ci) for ci in coll.tolist() if np.isin(stats.registry.ranks(int(ci)), want).any()]
    return out | (~p2p & np.isin(cidx, hit))


def group_noise(b: dict[str, np.ndarray], kinds_of: Callable[[np.ndarray], np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group of the per-bin rows ``b`` (``kinds_of``: the kind of each communicator
    index, :meth:`BinnedStats.kinds_of`): its key, the robust relative spread of its
    per-bin mean transfer times (0 with fewer than 3 bins; at least the spread of the
    relative deviations pooled over its comparable cluster, with 6 bins or more) and
    its rounds per bin."""
    k = _group_key(b)
    m = b["xfer"] / np.maximum(b["n"], 1)
    order = np.lexsort((m, k))
    k, m, nb = k[order], m[order], b["n"][order]
    # the comparable cluster of each row: kind, class, point-to-point or not
    _, kind = np.unique(kinds_of(b["cidx"][order]), return_inverse=True)
    cl = (kind.reshape(-1).astype(np.int64) << 32) | (b["cls"][order] << 1) | (
        b["group"][order] >= 0)
    starts = _group_starts(k)
    cnt = np.diff(np.append(starts, len(k)))
    med = 0.5 * (m[starts + (cnt - 1) // 2] + m[starts + cnt // 2])
    dev = np.abs(m - np.repeat(med, cnt))
    o2 = np.lexsort((dev, np.repeat(np.arange(len(starts)), cnt)))
    dev = dev[o2]
    mad = 0.5 * (dev[starts + (cnt - 1) // 2] + dev[starts + cnt // 2])
    per_bin = np.add.reduceat(nb, starts) / cnt  # rounds per bin
    sigma = np.where(cnt >= 3, 1.4826 * mad / np.maximum(med, 1.0), 0.0)
    # pooled: the median relative deviation of every bin of the cluster's groups
    rel = np.abs(m / np.maximum(np.repeat(med, cnt), 1.0) - 1.0)
    o3 = np.lexsort((rel, cl))
    rel, cls_sorted = rel[o3], cl[o3]
    c_starts = _group_starts(cls_sorted)
    c_cnt = np.diff(np.append(c_starts, len(rel)))
    c_med = 0.5 * (rel[c_starts + (c_cnt - 1) // 2] + rel[c_starts + c_cnt // 2])
    pooled = np.where(c_cnt >= 6, 1.4826 * c_med, 0.0)
    sigma = np.maximum(sigma, _lookup(cl[starts], cls_sorted[c_starts], pooled))
    return k[starts], sigma, per_bin


def link_occupancy(stats: BinnedStats, config: SlowdownConfig, win: Window,
                   pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Per candidate node pair: how much fuller its queue pairs ran in the window than
    in the reference window (time-averaged in-flight work requests, :class:`LinkTracker`;
    both directions together). On a ring whose rounds are slow, the hop over the slow
    link keeps its queue full while the other hops wait for data, so its occupancy grows
    the most. Pairs with fewer than ``link_min_wrs`` completed work requests in either
    window are left out."""
    c = config
    if len(stats.qp) == 0 or not pairs:
        return {}
    w = stats.qp.query(win.lo, win.hi, ("qp",))
    b = stats.qp.query(win.b_lo, win.b_hi, ("qp",))
    if len(w["qp"]) == 0 or len(b["qp"]) == 0:
        return {}
    names = stats.links.node_names
    want = {(min(p), max(p)) for p in pairs}
    acc: dict[tuple[str, str], list[float]] = {}
    for tab, off in ((w, 0), (b, 2)):
        node = stats.links.qp_node[tab["qp"]]
        peer = stats.links.qp_peer[tab["qp"]]
        for j in np.flatnonzero(peer >= 0).tolist():
            a, b_ = str(names[node[j]]), str(names[peer[j]])
            pair = (min(a, b_), max(a, b_))
            if pair not in want:
                continue
            cur = acc.setdefault(pair, [0.0, 0.0, 0.0, 0.0])
            cur[off] += float(tab["lt"][j])
            cur[off + 1] += float(tab["dc"][j])
    out = {}
    for pair, (lt_w, dc_w, lt_b, dc_b) in acc.items():
        if dc_w < c.link_min_wrs or dc_b < c.link_min_wrs:
            continue
        occ_w, occ_b = lt_w / win.win_ns, lt_b / win.base_ns
        out[pair] = (occ_w + 0.05) / (occ_b + 0.05)
    return out


def find_link(stats: BinnedStats, config: SlowdownConfig, win: Window,
              slow: list[dict[str, Any]]
              ) -> tuple[list[int] | None, list[str], int, dict[tuple[str, str], float] | None,
                         list[list[int]]]:
    """The slow link (Greyhound §4.3, ring-neighbour analysis): among the node pairs
    crossed by the slow groups' edges (point-to-point pairs, ring neighbours of
    collectives), those with the largest total impact; ties (every hop of a slow ring
    crosses a node pair) are broken by the queue pairs' occupancy when ``link`` rows
    exist (:func:`link_occupancy`); without them the link is unknown: ``None`` and the
    candidate hops (two ranks each; an active probe can tell them apart). Reported as two ranks at
    its ends: an edge of a slow group when one crosses it, a pipeline pair if pipeline
    traffic crosses it (lower stage first), else a ring edge (DP, then TP, then CP),
    lowest rank first; with its communicator."""
    node = stats.meta.node_of
    score: dict[tuple[str, str], float] = {}
    for g in slow:
        seen: set[tuple[str, str]] = set()
        for a, b in edges_of(g):
            na, nb = sorted((node(a), node(b)))
            if na != nb and (na, nb) not in seen:
                seen.add((na, nb))
                score[(na, nb)] = score.get((na, nb), 0.0) + g["impact"]
    if not score:  # every slow edge stays inside a node (NVLink, PCIe)
        return _link_in_node(stats, config, win, slow)
    best = max(score.values())
    tied: list[tuple[str, str]] = sorted(k for k, v in score.items() if v >= best * 0.999)
    occ = link_occupancy(stats, config, win, tied) if len(tied) > 1 else {}
    if len(tied) > 1 and not occ:
        # every hop of one slow ring crosses a node pair and nothing tells them apart
        # (no queue-pair telemetry): the link is unknown, one of these hops; naming the
        # lowest would send the network team to a cable chosen by convention
        cands = [_link_pair(stats, config, win, na, nb, slow)[0] for na, nb in tied]
        cidx = int(slow[0]["cidx"]) if slow else -1
        return None, [], cidx, {k: 0.0 for k in tied}, [p for p in cands if p]

    def preference(k: tuple[str, str]) -> tuple[float, tuple[str, str]]:
        return -occ.get(k, 0.0), k

    chosen: tuple[str, str] = min(tied, key=preference)
    nodes = list(chosen)
    pair, cidx = _link_pair(stats, config, win, nodes[0], nodes[1], slow)
    if cidx < 0 and slow:
        cidx = int(slow[0]["cidx"])
    return pair, list(nodes), cidx, occ, []


def _link_in_node(stats: BinnedStats, config: SlowdownConfig, win: Window,
                  slow: list[dict[str, Any]]
                  ) -> tuple[list[int] | None, list[str], int, dict[tuple[str, str], float] | None,
                             list[list[int]]]:
    """:func:`find_link` when every slow edge stays inside one node: the edges with the
    largest total impact. One such edge (a point-to-point pair, or the one hop that slow
    rings share) is the link; the hops of one slow ring tie, and no queue-pair telemetry
    covers NVLink or PCIe, so the link is unknown: None and those hops as candidates."""
    node = stats.meta.node_of
    score: dict[tuple[int, int], float] = {}
    for g in slow:
        for a, b in {tuple(sorted(e)) for e in edges_of(g)}:
            if node(a) == node(b):
                score[(a, b)] = score.get((a, b), 0.0) + g["impact"]
    cidx = int(slow[0]["cidx"]) if slow else -1
    if not score:
        return None, [], cidx, None, []
    best = max(score.values())
    tied = sorted(k for k, v in score.items() if v >= best * 0.999)
    if len(tied) > 1:
        return None, [], cidx, None, [list(e) for e in tied]
    here = node(tied[0][0])
    pair, pair_cidx = _link_pair(stats, config, win, here, here, slow)
    return pair, [here, here], pair_cidx if pair_cidx >= 0 else cidx, {}, []


def edges_of(g: dict[str, Any]) -> list[tuple[int, int]]:
    """A slow group's edges: its point-to-point pair, or its ring's neighbour pairs."""
    if g["group"] >= 0:
        return [(g["ranks"][0], g["ranks"][1])]
    ring = g["ranks"]
    return [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))
            ] if len(ring) > 1 else []


def _link_pair(stats: BinnedStats, config: SlowdownConfig, win: Window, na: str, nb: str,
               slow: list[dict[str, Any]]) -> tuple[list[int] | None, int]:
    """Two ranks at the ends of the link between nodes ``na`` and ``nb`` (see
    :func:`find_link`) and the communicator of that pair."""
    node = stats.meta.node_of
    ends = {na, nb}
    # the impact of the strongest slow group using each edge: edges of the groups that
    # lost the most (within half of the strongest) come first, then the convention
    strength: dict[frozenset[int], float] = {}
    for g in slow:
        for e in edges_of(g):
            key = frozenset(e)
            strength[key] = max(strength.get(key, 0.0), float(g["impact"]))
    top = max(strength.values(), default=0.0)
    strong = {k for k, v in strength.items() if v >= 0.5 * top}
    # with ``link`` rows: how much the queue pairs of an edge's ends towards each other's
    # node filled (the hop over the slow link keeps its sender's queue full)
    growth = qp_growth(stats, config, win)
    limit = 1 + config.link_threshold
    cands: list[tuple[int, int, int, int, list[int]]] = []
    order = {"pp": 0, "dp": 1, "tp": 2, "cp": 3}
    for i in range(len(stats.registry.ids)):
        kind = stats.registry.kind(i)
        ranks = stats.registry.ranks(i)
        if len(ranks) < 2:
            continue
        if kind == "pp" or stats.registry.p2p_only[i]:
            edges = [(ranks[j], ranks[j + 1]) for j in range(len(ranks) - 1)]
            rank_kind = 0
        else:
            edges = [(ranks[j], ranks[(j + 1) % len(ranks)]) for j in range(len(ranks))]
            rank_kind = order.get(kind, 4)
        for a, b in edges:
            if {node(a), node(b)} != ends:
                continue
            pair = [a, b] if rank_kind else sorted((a, b))
            cands.append((int(frozenset((a, b)) not in strong), rank_kind, pair[0], i, pair))
    # the queue growth of an edge: its ends' queue pairs towards each other's node
    queue = {}
    for c in cands:
        a, b = c[4]
        got = [growth[k] for k in ((a, node(b)), (b, node(a))) if k in growth]
        if got:
            queue[(a, b)] = max(got)
    grown = {e for e, v in queue.items() if v > limit}
    # when the queues of one edge over the node pair filled and those of every other
    # did not, the slow hop is that edge (a rank pair's fault: its NIC, its cable);
    # when several filled, the link is slow as a whole and the convention names it
    by_queue = len(grown) == 1 and len(queue) > 1
    best: tuple[Any, ...] | None = None
    for c in cands:
        e = (c[4][0], c[4][1])
        q = -1.0 if by_queue and e in grown else 0.0
        # an edge of a strongly slow group first (rank-level evidence), then the one
        # whose queue pairs alone filled, then the convention
        cand = (c[0], q, c[1], c[2], c[3], c[4])
        if best is None or cand[:4] < best[:4]:
            best = cand
    if best is None:
        for g in slow:
            for a, b in edges_of(g):
                if {node(a), node(b)} == ends:
                    return [int(a), int(b)], int(g["cidx"])
        return None, -1
    return [int(x) for x in best[5]], best[4]


def qp_growth(stats: BinnedStats, config: SlowdownConfig, win: Window
              ) -> dict[tuple[int, str], float]:
    """Per queue pair's owner rank and remote node (``link`` rows with a rank): the
    growth of its time-averaged in-flight work requests from the reference window to
    ``win`` (as :func:`link_occupancy`, one direction). Queue pairs with fewer than
    ``link_min_wrs`` completed work requests in either window are left out."""
    c = config
    if len(stats.qp) == 0:
        return {}
    w = stats.qp.query(win.lo, win.hi, ("qp",))
    b = stats.qp.query(win.b_lo, win.b_hi, ("qp",))
    if len(w["qp"]) == 0 or len(b["qp"]) == 0:
        return {}
    q = w["qp"]
    dc_b = _lookup(q, b["qp"], b["dc"])
    lt_b = _lookup(q, b["qp"], b["lt"])
    ok = ((stats.links.qp_rank[q] >= 0) & (stats.links.qp_peer[q] >= 0)
          & (w["dc"] >= c.link_min_wrs) & (dc_b >= c.link_min_wrs))
    ratio = (w["lt"] / win.win_ns + 0.05) / (lt_b / win.base_ns + 0.05)
    names = stats.links.node_names
    out: dict[tuple[int, str], float] = {}
    for j in np.flatnonzero(ok).tolist():
        key = (int(stats.links.qp_rank[q[j]]), str(names[stats.links.qp_peer[q[j]]]))
        out[key] = max(out.get(key, 0.0), float(ratio[j]))
    return out
