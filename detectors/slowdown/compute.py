"""The computation side of localization (MEGATRACE §III-B/C, CCL-D §4.2): ranks whose own
compute per iteration grew (the gaps between their operations), the wait-for graph of
excess waits, whether slow groups are a side effect of compute roots, the pipeline pass
(forward / backward) that grew, and GPU throttling (Greyhound's thermal case)."""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.detectors.iterations import _group_starts
from failslow.detectors.slowdown.accounting import BinnedStats
from failslow.detectors.slowdown.bins import BinTable, _aggregate, _lookup
from failslow.detectors.slowdown.config import SlowdownConfig
from failslow.detectors.slowdown.gaps import PASS_BIN_SHIFT, PASS_BWD, PASS_FWD
from failslow.detectors.slowdown.levels import Window
from failslow.detectors.slowdown.wait_graph import WaitGraph


def excess_rates(table: BinTable, value: str, by: tuple[str, ...], win: Window
                 ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per key of ``by``: rate of ``value`` in the window minus the baseline rate. The
    window leaves out each key's largest bin when it spans several iterations: a
    pause (GC) fills one bin, a straggler all of them."""
    w = table.query(win.lo, win.hi, ("bin", *by))
    by_key = _aggregate({**{k: w[k] for k in by}, value: w[value], "m": w[value]}, by,
                        (value,), "m", ())
    drop = by_key["m"] if win.iterations >= 2.5 else 0.0
    b = table.query(win.b_lo, win.b_hi, by)
    both = {k: np.concatenate([by_key[k], b[k]]) for k in by}
    both["v"] = np.concatenate([(by_key[value] - drop) / win.win_ns,
                                -b[value] / win.base_ns])
    agg = _aggregate(both, by, ("v",), None, ())
    return {k: agg[k] for k in by}, agg["v"]


#: below this many iterations, a window keeps the largest compute bin of a rank ...
WHOLE_GAP_ITERATIONS = 2.5
#: ... whose largest bin of an iteration holds at least this share of its compute
WHOLE_GAP_SHARE = 0.5
#: ... their median growth is left out when they are at least this many
WHOLE_GAP_PEERS = 4
#: a rank's pause explains this share of the time lost per iteration: the rest is compared
PAUSE_SHARE = 0.5
#: ... while the rest of its compute grew by less than this share of it
PAUSE_GROWTH = 0.1
#: ... and the rest of the time lost is at least this share of the reference iteration (the
#: change tracker's floor of a slow-down)
PAUSE_REST = 0.04


def compute_excess(stats: BinnedStats, win: Window) -> tuple[np.ndarray, np.ndarray] | None:
    """Per rank, how much its own compute per iteration (the gaps between its
    operations) grew, as a share of the time lost per iteration; None without gap data.
    Each rank's largest time bin is left out of both windows: a pause (GC) fills one
    bin, a slow rank all of them. Not in a window of under :data:`WHOLE_GAP_ITERATIONS`
    iterations for a rank that computes in a few long gaps, whose largest bin of a
    reference iteration holds :data:`WHOLE_GAP_SHARE` of its compute or more (a pure
    data-parallel job; a pipeline stage without tensor parallelism, whose passes run
    between its sends and receives): there that bin is most of a straggler's extra
    compute in one iteration. The growth those ranks share (their median, when there are
    :data:`WHOLE_GAP_PEERS` of them) is left out of theirs. The time lost that a rank's
    pause explains is left out of the time lost (:func:`_lost_without_pause`)."""
    w = stats.comp.query(win.lo, win.hi, ("bin", "rank"))
    if len(w["rank"]) == 0:
        return None
    b = stats.comp.query(win.b_lo, win.b_hi, ("bin", "rank"))
    bin_ns = float(1 << stats.shift)
    rw, sw = _summed(w["rank"], w["d"])
    tw = _trimmed(w["rank"], w["d"])[1]
    rb, sb = _summed(b["rank"], b["d"])
    tb = _trimmed(b["rank"], b["d"])[1]
    whole = np.zeros(len(rw), dtype=bool)
    # its largest bins of the reference, as many as it has iterations (one pause there
    # fills one of them, not all)
    k = max(int(round(win.ref_iterations)), 1)
    top_b = _top_sums(b["rank"], b["d"], k)
    if win.iterations < WHOLE_GAP_ITERATIONS:
        # the share of its compute in its largest bin of each reference iteration
        whole = stats.pure_dp | (_lookup(rw, rb, top_b / np.maximum(sb, 1.0))
                                 >= WHOLE_GAP_SHARE)
    rate_w = np.where(whole, sw / max(win.win_ns, bin_ns),
                      tw / max(win.win_ns - bin_ns, bin_ns))
    rate_b = np.where(whole, _lookup(rw, rb, sb) / max(win.base_ns, bin_ns),
                      _lookup(rw, rb, tb) / max(win.base_ns - bin_ns, bin_ns))
    has_b = _lookup(rw, rb, np.ones(len(rb))) > 0
    grown = np.where(has_b, rate_w * win.iter_ns - rate_b * win.ref_iter_ns, 0.0)
    excess = grown / _lost_without_pause(
        win, np.where(whole | ~has_b, 0.0, sw - tw - _lookup(rw, rb, top_b) / k), grown)
    common = whole & has_b
    if common.sum() >= WHOLE_GAP_PEERS:
        # a long gap that ends on either side of a window edge moves a whole gap in or
        # out of one iteration's window: the growth those ranks share is no one rank's
        # (a straggler stands out of its peers)
        excess = np.where(common, excess - float(np.median(excess[common])), excess)
    return rw, excess


def _lost_without_pause(win: Window, beyond: np.ndarray, grown: np.ndarray) -> float:
    """The time lost per iteration (ns) that a pause does not explain. ``beyond``: per
    rank, how far its largest time bin (which :func:`compute_excess` leaves out) exceeds
    its largest bin of a reference iteration; ``grown``: how much its compute per
    iteration grew without that bin. A pause (GC) stalls the rank's peers at their next
    collective, so the job loses about the pause itself. A rank whose largest bin sticks
    out by at least :data:`PAUSE_SHARE` of the time lost, while the rest of its compute
    grew by under :data:`PAUSE_GROWTH` of it, paused. The time lost beside that pause is
    what a straggler's growth is compared with, when it is a slow-down itself (at least
    :data:`PAUSE_REST` of the reference iteration; else the pause is all there is): a
    straggler in an iteration that also held a pause computes as much more as in the
    others, but a far smaller share of the time lost."""
    lost = win.iter_ns - win.ref_iter_ns
    if lost <= 0 or not len(beyond):
        return max(lost, 1.0)
    paused = (beyond / win.iterations >= PAUSE_SHARE * lost) & (grown < PAUSE_GROWTH * lost)
    if paused.any():
        rest = lost - float(beyond[paused].max()) / win.iterations
        if rest >= PAUSE_REST * win.ref_iter_ns:
            return max(rest, 1.0)
    return max(lost, 1.0)


def compute_roots(stats: BinnedStats, config: SlowdownConfig, win: Window,
                  graph: WaitGraph | None = None) -> list[int] | None:
    """Ranks whose own compute per iteration grew (:func:`compute_excess`) by at least
    ``compute_share`` of the time lost per iteration and by at least ``compute_top`` of
    the largest such growth, strongest first, and after them the weaker ones that stand
    out of the rest (:func:`_minor`); ``[]`` when no rank did; None when the
    gaps say nothing (no gap data, or so many ranks qualify that waiting shows in the
    gaps: hosts that block outside the library calls). With the wait-for ``graph``, a
    root must also be waited on more than before by its peers in some round: a host
    that blocks outside the library (an implicit barrier, a device synchronization) has
    longer gaps without making anyone wait (CCL-D: the slow rank is the one that enters
    last). In a pipeline, one rank nobody waits on more may still be a root when its
    growth stands out (:func:`_absorbed`)."""
    c = config
    got = compute_excess(stats, win)
    if got is None:
        return None
    rw, excess = got
    grown = dict(zip(rw.tolist(), excess.tolist(), strict=True))
    standout: list[int] = []
    if graph is not None and graph.in_by:
        waited = np.array([sum(graph.in_by.get(int(r), {}).values()) for r in rw])
        is_waited = waited > c.waited_share * win.lost
        if stats.meta.pp > 1:  # only a pipeline's bubbles absorb a rank's extra compute
            standout = _absorbed(rw, excess, is_waited, c)
        excess = np.where(is_waited, excess, 0.0)
    top = float(excess.max())
    hit = (excess >= c.compute_share) & (excess >= c.compute_top * top)
    n = int(hit.sum())
    if n > c.max_roots:
        return None
    order = np.argsort(-excess, kind="stable")
    roots = [int(r) for r in rw[order[:_minor(excess[order], n, c)]]] if n else []
    # strongest first, the absorbed straggler among them
    return sorted(set(roots) | set(standout), key=lambda r: (-grown[r], r))


def _absorbed(rw: np.ndarray, excess: np.ndarray, is_waited: np.ndarray,
              config: SlowdownConfig) -> list[int]:
    """The rank nobody waits on more whose own compute grew the most, as a root: a
    straggler whose extra compute the schedule absorbs (a pipeline bubble, or a second
    straggler that the job waits for instead). Only when its growth is at least
    ``compute_share`` of the time lost and ``compute_top`` of the largest growth, and
    stands out: ``minor_lead`` times that of every rank that is no root by its waits (a
    host that blocks outside the library grows the gaps of every rank that waits, not
    of one)."""
    c = config
    free = np.flatnonzero(~is_waited)
    if len(rw) < 2 or len(free) == 0:
        return []
    cand = int(free[np.argmax(excess[free])])
    top = float(excess.max())
    if excess[cand] < max(c.compute_share, c.compute_top * top):
        return []
    waited_top = float(excess[is_waited].max()) if is_waited.any() else 0.0
    root_by_waits = is_waited & (excess >= max(c.compute_share, c.compute_top * waited_top))
    rest = np.delete(np.where(root_by_waits, 0.0, excess), cand)
    nxt = float(rest.max()) if len(rest) else 0.0
    return [int(rw[cand])] if excess[cand] >= c.minor_lead * max(nxt, 0.0) else []


def _minor(ranked: np.ndarray, n: int, config: SlowdownConfig) -> int:
    """How many of the excesses ``ranked`` (descending) name roots: the first ``n``
    and after them each that is at least ``minor_share`` and ``minor_lead`` times the
    next one (a second straggler whose slowness the first one's partly hides), up to
    ``max_roots``."""
    c = config
    k = n
    while k < min(len(ranked), c.max_roots):
        nxt = float(ranked[k + 1]) if k + 1 < len(ranked) else 0.0
        if ranked[k] < c.minor_share or ranked[k] < c.minor_lead * max(nxt, 0.0):
            break
        k += 1
    return k


def hidden_roots(stats: BinnedStats, config: SlowdownConfig, win: Window,
                 known: list[int]) -> list[int]:
    """Stragglers the job does not wait for, over an open compute anomaly's whole window:
    ranks besides the ``known`` roots whose own compute grew (:func:`compute_excess`) by at
    least ``compute_share`` of the lost time more than the median rank's, and
    ``minor_lead`` times more than the next rank's, strongest first. A second straggler
    slower than healthy but less than the first is hidden behind it: its stage waits for
    the first one's pipeline or group instead, so it is no root of any one iteration, yet
    it is the next bottleneck once the first is fixed (what-if analysis §3.2: fixing only
    some stragglers leaves the job slowed by the others). Its gaps over several iterations
    still show it; one iteration's do not stand out of the noise. Only windows of
    ``hidden_iterations``."""
    c = config
    if win.iterations < c.hidden_iterations:
        return []
    got = compute_excess(stats, win)
    if got is None or len(got[0]) < 4:
        return []
    rw, excess = got
    dev = excess - float(np.median(excess))
    free = ~np.isin(rw, np.asarray(known, dtype=rw.dtype))
    cand = np.flatnonzero(free)[np.argsort(-dev[free], kind="stable")]
    out: list[int] = []
    for i, idx in enumerate(cand):
        if len(known) + len(out) >= c.max_roots:
            break
        nxt = float(dev[cand[i + 1]]) if i + 1 < len(cand) else 0.0
        if dev[idx] < c.compute_share or dev[idx] < c.minor_lead * max(nxt, 0.0):
            break
        out.append(int(rw[idx]))
    return out


def link_end_root(stats: BinnedStats, config: SlowdownConfig, win: Window,
                  graph: WaitGraph, ends: set[int]) -> list[int]:
    """The compute side of a mixed slow-down whose link took most of the lost time: the
    rank whose own compute grew the most (:func:`compute_excess`) when it is an end of
    the slow link (``ends``), grew by at least ``minor_share`` of the time lost and
    ``minor_lead`` times more than any other rank, and is waited on more by its peers.
    Its share of the lost time stays below ``compute_share`` because the slow transfers
    took the rest; a slow link alone makes no single end compute longer."""
    c = config
    got = compute_excess(stats, win)
    if got is None or len(got[0]) < 2 or not ends:
        return []
    rw, excess = got
    top = int(np.argmax(excess))
    waited = sum(graph.in_by.get(int(rw[top]), {}).values())
    if int(rw[top]) in ends and waited > c.waited_share * win.lost and \
            _minor(np.sort(excess)[::-1], 0, c) >= 1:
        return [int(rw[top])]
    return []


def explained_by(stats: BinnedStats, config: SlowdownConfig, win: Window, roots: list[int],
                 slow: list[dict[str, Any]]) -> bool:
    """Are the slow groups a side effect of the compute roots? When the roots' own
    extra compute accounts for the time lost and every slow group has an end among
    the roots or the ranks that share a communicator with them (their transfers end
    late because the roots' neighbours wait for them: batched point-to-point calls,
    hosts that complete calls late), the slow-down is computation, not also a link."""
    if not roots or not slow:
        return False
    got = compute_excess(stats, win)
    if got is None:
        return False
    rw, excess = got
    share = float(excess[np.isin(rw, roots)].sum())
    if share < config.explained_share:
        return False
    near = set(roots)
    for i in range(len(stats.registry.ids)):
        ranks = stats.registry.ranks(i)
        if near.intersection(ranks) and set(roots) & set(ranks):
            near.update(ranks)
    # a collective round is timed from its last member's entry: a root outside it delays
    # its entry, not its transfer (a pipeline neighbour of a root on a slow data-parallel
    # ring is no side effect of the root)
    return all(set(g["ranks"]) & (near if g["group"] >= 0 else set(roots)) for g in slow)


def wait_graph(stats: BinnedStats, win: Window) -> WaitGraph:
    """The wait-for graph of ``win``: excess waits over the reference window."""
    ok, ov = excess_rates(stats.out_w, "w", ("rank", "cidx"), win)
    ik, iv = excess_rates(stats.in_w, "w", ("cidx", "waitee"), win)
    return WaitGraph(stats.registry, ok["rank"], ok["cidx"], ov, ik["cidx"], ik["waitee"], iv)


#: one pass's compute grew this many times more than the other's: the stage is that pass
#: (a straggler slowed in both passes stays within it; gaps that straddle the two passes
#: blur the split)
STAGE_RATIO = 1.15


def compute_stage(stats: BinnedStats, ranks: list[int], win: Window) -> str | None:
    """``forward`` or ``backward`` when only that pass of the root ranks' compute grew:
    from framework spans when the trace has them (:func:`_stage_of`), else from the gaps
    placed in the pipeline schedule or among the tensor-parallel collectives
    (:class:`GapTracker`), one pass :data:`STAGE_RATIO` times more than the other; None
    when both grew alike or neither is known."""
    if not ranks:
        return None
    if len(stats.spans):
        w = stats.spans.query(win.lo, win.hi, ("rank", "op"))
        b = stats.spans.query(win.b_lo, win.b_hi, ("rank", "op"))
        ratio = {}
        for code in (0, 1):
            sw = np.isin(w["rank"], ranks) & (w["op"] == code)
            sb = np.isin(b["rank"], ranks) & (b["op"] == code)
            if w["n"][sw].sum() == 0 or b["n"][sb].sum() == 0:
                return None
            ratio[code] = ((w["d"][sw].sum() / w["n"][sw].sum())
                           / (b["d"][sb].sum() / b["n"][sb].sum()))
        return _stage_of(ratio[0], ratio[1])
    if len(stats.passes) == 0:
        return None
    k = PASS_BIN_SHIFT
    lo, hi = win.lo >> k, max(win.hi >> k, (win.lo >> k) + 1)
    b_lo, b_hi = win.b_lo >> k, max(win.b_hi >> k, (win.b_lo >> k) + 1)
    if b_hi > lo:
        b_hi = lo
    if b_hi <= b_lo:
        return None
    w = stats.passes.query(lo, hi, ("rank", "pass"))
    b = stats.passes.query(b_lo, b_hi, ("rank", "pass"))
    sums = {}
    for code in (PASS_FWD, PASS_BWD):
        sw = np.isin(w["rank"], ranks) & (w["pass"] == code)
        sb = np.isin(b["rank"], ranks) & (b["pass"] == code)
        if not sw.any() or not sb.any():
            return None
        sums[code] = (float(w["d"][sw].sum()), float(b["d"][sb].sum()))
    # the passes measured over the same windows: how much more one grew than the other
    (fw, fb), (bw, bb) = sums[PASS_FWD], sums[PASS_BWD]
    if min(fw, fb, bw, bb) <= 0:
        return None
    r = (fw / bw) / (fb / bb)
    if r > STAGE_RATIO:
        return "forward"
    if r < 1 / STAGE_RATIO:
        return "backward"
    return None


def gpu_evidence(stats: BinnedStats, ranks: list[int], win: Window) -> dict[str, Any] | None:
    """Greyhound's thermal case: the root ranks' GPUs throttled (NVML clocks-event
    reasons) or lost SM clock in the window, compared with the reference window."""
    if len(stats.gpu) == 0:
        return None
    w = stats.gpu.query(win.lo, win.hi, ("rank",))
    b = stats.gpu.query(win.b_lo, win.b_hi, ("rank",))
    out = []
    for r in ranks:
        sw, sb = w["rank"] == r, b["rank"] == r
        if not sw.any():
            continue
        n = float(w["n"][sw].sum())
        clock = float(w["sm"][sw].sum()) / n
        throttled = float(w["thr"][sw].sum()) / n
        base_clock = float(b["sm"][sb].sum() / b["n"][sb].sum()) if sb.any() else None
        drop = base_clock is not None and clock < 0.9 * base_clock
        if throttled >= 0.5 or drop:
            out.append({"rank": int(r), "sm_clock_mhz": round(clock, 1),
                        "baseline_sm_clock_mhz": None if base_clock is None
                        else round(base_clock, 1), "throttled": round(throttled, 3)})
    return {"throttling": out} if out else None


def _stage_of(fwd: float, bwd: float) -> str | None:
    """The pass whose compute grew alone: by more than 10%, the other by less than 5%."""
    if fwd > 1.10 and bwd < 1.05:
        return "forward"
    if bwd > 1.10 and fwd < 1.05:
        return "backward"
    return None


def _summed(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key (sorted unique keys): the sum of its values."""
    uniq, inv = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inv.reshape(-1), values.astype(np.float64), minlength=len(uniq))


def _top_sums(keys: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
    """Per key (sorted unique keys): the sum of its ``k`` largest values."""
    if len(keys) == 0:
        return np.zeros(0)
    order = np.lexsort((-values, keys))
    sk, v = keys[order], values[order].astype(np.float64)
    starts = _group_starts(sk)
    nth = np.arange(len(sk)) - np.repeat(starts, np.diff(np.append(starts, len(sk))))
    return np.add.reduceat(np.where(nth < k, v, 0.0), starts)


def _trimmed(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per key (sorted unique keys): the sum of its values without the largest one."""
    if len(keys) == 0:
        return keys, np.zeros(0)
    order = np.lexsort((values, keys))
    k, v = keys[order], values[order].astype(np.float64)
    starts = _group_starts(k)
    sums = np.add.reduceat(v, starts)
    last = np.append(starts[1:], len(k)) - 1
    return k[starts], sums - v[last]
