"""Verified onsets and reliefs of slow-downs over a stream of iteration times (Greyhound §4.2,
"Slow iteration detection", the verification step): :class:`ChangeTracker` checks BOCD or
sliding-window candidates against the pre-anomaly baseline with a sign test robust to
pauses, and keeps a stack of slow levels so a second slow-down during an open one is its
own onset."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from failslow.detectors.changepoints.candidates import BOCD, BOCDConfig, window_candidates


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    p = min(max(p, 0.0), 1.0)
    return float(sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1)))


def run_chance(above: np.ndarray, p: float, n: int) -> float:
    """Chance of ``n`` consecutive values above a limit when the reference's exceedances
    (``above``, in time order) follow a first-order Markov chain: ``p`` for the first and
    ``q = P(above | previous above)`` for each next one, ``q`` estimated from the
    reference's consecutive pairs as ``p`` is from its values (Jeffreys). A pause lasts
    an iteration or two, a fail-slow lasts: a reference whose exceedances come alone
    (pauses, warm-up spikes) gives a small ``q``, so three slow iterations in a row are
    news there, where the count of exceedances alone asks for five at ``p = 0.35``
    (Greyhound §4.2's verification, made robust to isolated spikes)."""
    prev = above[:-1]
    pairs = float(np.count_nonzero(prev & above[1:]))
    q = (pairs + 0.5) / (float(np.count_nonzero(prev)) + 1.0)
    return p * q ** (n - 1)


def fisher_combined(p1: float, p2: float) -> float:
    """Fisher's combination of two independent chances: ``P(chi2_4 >= -2 ln(p1 p2))``,
    which is ``p (1 - ln p)`` for ``p = p1 p2``."""
    p = min(max(p1, 0.0), 1.0) * min(max(p2, 0.0), 1.0)
    return p * (1.0 - math.log(p)) if p > 0 else 0.0


@dataclass
class Change:
    """A verified change: ``kind`` is ``onset`` (a slower level) or ``relief`` (back to a
    lower level). ``depth``: the number of slow levels stacked after the change (an onset
    during an open anomaly has depth 2; a relief back to the healthy baseline has depth 0)."""

    kind: str
    index: int  # first iteration of the new level
    detected_index: int  # the iteration whose arrival confirmed it
    baseline: float  # the level below (healthy baseline for a first onset)
    level: float  # iteration time after the change (median of the confirming values)
    depth: int = 1
    closed: int = 0  # relief: how many levels it closed

    @property
    def ratio(self) -> float:
        return self.level / self.baseline if self.baseline > 0 else math.nan


@dataclass
class ChangeConfig:
    """Settings of :class:`ChangeTracker`."""

    method: str = "bocd"  # "bocd" or "window"
    threshold: float = 0.05  # verification: least relative change vs the reference level
    noise_z: float = 1.0  # per-value threshold: also at least noise_z robust sigmas
    alpha: float = 0.001  # sign test level of the verification (the series alone: strict;
    #                       the slow-down detector uses 0.01, backed by localization)
    strong_k: float = 3.0  # onsets: the sign test also at this many thresholds up
    median_z: float = 2.0  # the median of the new values clears the floor by z sigma/sqrt(n)
    min_baseline: int = 5  # iterations of baseline before an onset can be declared
    min_after: int = 2  # fewest values of the new level that confirm a change ...
    max_after: int = 12  # ... and most (noisy jobs need more)
    # onsets of up to this many values may be confirmed together with the caller's own
    # evidence (``ChangeTracker.corroborate``); 0: the series alone
    corroborate_after: int = 0
    corroborate_alpha: float = 0.2  # ... when each of the two chances is at most this
    # a tail whose newest value's excess over the reference is this many times the largest
    # excess of the others mixes two levels (mild noise, then a far larger step): it does
    # not confirm; the next iteration tells the step (confirmed on its own) from a spike
    jump_k: float = 4.0
    baseline_window: int = 50  # the baseline is the median of at most this many values
    history: int = 512  # values kept
    window: int = 3  # sliding-window detector: w
    max_levels: int = 3  # slow levels stacked at most (a second slow-down while one is open)
    bocd: BOCDConfig = field(default_factory=BOCDConfig)


@dataclass
class _Level:
    """One slow level on the stack: where it starts and the level below it."""

    start: int
    detected: int
    below: float  # the reference level it was confirmed against
    level: float
    n_confirm: int
    seg: int = -1  # first index of its current stretch (after a higher level closed)


class ChangeTracker:
    """Onsets and reliefs of slow-downs over a stream of iteration times (Greyhound §4.2:
    BOCD candidates plus a verification step), with a stack of slow levels so that a second
    slow-down during an open one is its own onset.

    Verification is against a *reference segment*: the healthy baseline for a first onset
    (not only the neighbouring segment, so a slow ramp of small steps is still caught), the
    current slow level for a further onset. For ``n`` in ``[min_after, max_after]`` the last
    ``n`` values are tested with a sign test robust to pauses: ``k`` of them exceed
    ``ref x (1 + thr)``, ``thr = max(threshold, noise_z x sigma)`` (``sigma`` the robust
    relative spread of the reference segment); under the reference each value does so with
    probability ``p``, the rate at which the segment's own values exceed it (Jeffreys
    estimate: GC pauses and other one-off spikes raise it), and the change is confirmed when
    ``P(Bin(n, p) >= k) <= alpha`` and the median of the ``n`` values exceeds the limit
    too. A quiet job confirms on two slow iterations, a job with frequent pauses needs more,
    and a single pause is never enough. When all ``n`` values lie ``strong_k`` thresholds
    up, their chance as a run (:func:`run_chance`: how often the reference's exceedances
    followed one another) counts too: pauses that come alone do not make three slow
    iterations in a row likely. So does the count of values between the usual and the strong
    limit, against the reference's rate there, where the reference's exceedances are mostly
    pauses far up: a mild slow-down is what it seldom holds. Reliefs are the mirror test
    against the slow level: the values fall below the midpoint between it and a lower level,
    and the levels above that are closed. The first index of a new level is the CUSUM split
    between the two levels (values clipped to them, so a lone spike does not pull it), moved
    to an adjacent BOCD (or sliding-window) candidate. Speed-ups while healthy (the end of
    warm-up) re-learn the baseline. After a relief back to the baseline, the healthy values
    from before the closed slow-down stay in the reference (``prev_ref``), so a fault that
    follows soon is confirmed as fast as the first one was.
    """

    def __init__(self, config: ChangeConfig | None = None) -> None:
        self.config = config or ChangeConfig()
        self.values: list[float] = []  # the last `history` values
        self.offset = 0  # index of values[0] in the stream
        self.seg_start = 0  # first index of the current healthy segment
        self.baseline = math.nan
        self.sigma = 0.0  # robust relative noise of the baseline
        self.levels: list[_Level] = []
        self.candidates: list[int] = []  # unverified candidate indices
        self.bocd = BOCD(self.config.bocd)
        self.allow_further = True  # the caller may hold further onsets back
        # the caller's evidence on the values ``hi..i`` of a tentative onset: the chance
        # that it arose by accident (:meth:`_corroborated`); not part of the state
        self.corroborate: Callable[[int, int], float] | None = None
        self.min_start = 0  # first index a new level may start at (after a reject)
        # the healthy values before the last closed slow-down (at most ``baseline_window``):
        # the job is back at that baseline, so they stay part of the reference
        self.prev_ref: list[float] = []
        self._prev_undo: list[float] = []  # prev_ref before the last relief

    # ------------------------------------------------------------------ caller's verdicts

    def reject(self) -> None:
        """The top level was not confirmed by the caller (e.g. its slow iterations had no
        common root: pauses on random ranks): drop it without a relief. Its values stay in
        the segment below, so the baseline learns how often such spikes come."""
        if self.levels:
            self.levels.pop()
            self.candidates.clear()
            self.min_start = self.n  # the evidence of a new onset must be new values

    def keep_segment(self, seg_start: int) -> None:
        """The slow level just closed was never confirmed by the caller: its values stay in
        the healthy segment from ``seg_start`` (undoes the relief's new segment)."""
        self.seg_start = seg_start
        self.prev_ref = list(self._prev_undo)

    def merge_top(self) -> None:
        """The top level is the same slow-down as the one below it, grown worse: fold it
        into that level (a ladder-shaped fail-slow is one anomaly)."""
        if len(self.levels) >= 2:
            top = self.levels.pop()
            lower = self.levels[-1]
            lower.level = top.level
            lower.seg = top.start
            lower.n_confirm = max(lower.n_confirm, top.n_confirm)
            self.candidates.clear()

    # ------------------------------------------------------------------ views

    @property
    def n(self) -> int:
        return self.offset + len(self.values)

    @property
    def state(self) -> str:
        return "anomalous" if self.levels else "normal"

    @property
    def level(self) -> float:
        return self.levels[-1].level if self.levels else math.nan

    @property
    def onset(self) -> int:
        return self.levels[0].start if self.levels else -1

    def _slice(self, lo: int, hi: int) -> np.ndarray:
        return np.asarray(self.values[max(0, lo - self.offset):max(0, hi - self.offset)])

    @staticmethod
    def _stats(seg: np.ndarray) -> tuple[float, float]:
        if not len(seg):
            return math.nan, 0.0
        med = float(np.median(seg))
        return med, 1.4826 * float(np.median(np.abs(seg - med))) / med

    def _baseline_level(self, hi: int) -> tuple[float, float]:
        """Median and robust relative sigma of the healthy reference before ``hi``."""
        return self._stats(self._reference(hi))

    def _reference(self, hi: int) -> np.ndarray:
        """The healthy values before ``hi``: the current segment's last ``baseline_window``,
        topped up with the healthy values from before the last closed slow-down."""
        c = self.config
        cur = self._slice(max(self.seg_start, hi - c.baseline_window), hi)
        short = c.baseline_window - len(cur)
        if short > 0 and self.prev_ref:
            return np.concatenate([np.asarray(self.prev_ref[-short:]), cur])
        return cur

    def _reference_ok(self, hi: int) -> bool:
        """Enough healthy values before ``hi`` to test an onset against: ``min_baseline``
        in the current segment, or ``min_after`` there (the job is back at its baseline)
        and ``min_baseline`` with the values from before the last closed slow-down."""
        c = self.config
        seg = hi - self.seg_start
        return seg >= c.min_baseline or (
            seg >= c.min_after and seg + len(self.prev_ref) >= c.min_baseline)

    # ------------------------------------------------------------------ stream

    def push(self, value: float) -> list[Change]:
        """Add one iteration time; return the changes it confirms (at most one)."""
        c = self.config
        if not (value > 0 and math.isfinite(value)):
            return []
        i = self.n
        self.values.append(float(value))
        if len(self.values) > c.history:
            drop = len(self.values) - c.history
            self.values = self.values[drop:]
            self.offset += drop
        if c.method == "bocd":
            cp = self.bocd.update(math.log(value))
            if cp is not None:
                self.candidates.append(cp)
        else:
            lo = max(self.offset, i - c.window - 10)
            for cand in window_candidates(self._slice(lo, i + 1), c.window, 10, c.threshold):
                if lo + cand not in self.candidates:
                    self.candidates.append(lo + cand)
        self.candidates = [x for x in self.candidates if x > i - 3 * c.max_after - 8]
        if not self.levels:
            return self._check_onset(i)
        out = self._check_relief(i)
        if not out and len(self.levels) < c.max_levels and self.allow_further:
            out = self._check_further(i)
        return out

    def _test_up(self, ref: np.ndarray, tail: np.ndarray, down: bool = False
                 ) -> tuple[bool, float, float]:
        """Sign test: are ``tail`` values significantly above (``down``: below) the
        reference segment? Returns (significant, reference median, its relative sigma)."""
        level_ok, chance, med, sigma = self._chance_up(ref, tail, down)
        return level_ok and chance <= self.config.alpha, med, sigma

    def _chance_up(self, ref: np.ndarray, tail: np.ndarray, down: bool = False,
                   floor: bool = False) -> tuple[bool, float, float, float]:
        """:meth:`_test_up`'s parts: (the tail's median clears the floor, the chance of its
        exceedances under the reference, reference median, its relative sigma). With
        ``floor``, the limits are ``threshold`` itself, not raised by the reference's
        noise (:meth:`_corroborated`)."""
        c = self.config
        med, sigma = self._stats(ref)
        if not len(ref) or not med > 0:
            return False, 1.0, med, sigma
        thr = c.threshold if floor else max(c.threshold, c.noise_z * sigma)
        # the level itself: the median of the n values clears the floor by its own noise
        margin = thr if floor else max(
            thr, c.threshold + c.median_z * sigma / math.sqrt(len(tail)))
        if down:
            limit = med * (1 - thr)
            k = int(np.count_nonzero(tail < limit))
            p = (float(np.count_nonzero(ref < limit)) + 0.5) / (len(ref) + 1.0)
            level_ok = float(np.median(tail)) < med * (1 - margin)
            return level_ok, binom_sf(k, len(tail), p), med, sigma
        level_ok = float(np.median(tail)) > med * (1 + margin)
        chance = 1.0
        # the sign test at the usual limit, and at a limit strong_k times as far: a
        # short reference holding one mild outlier cannot reject two values far beyond
        # anything it holds at the first, while pauses in it still count at the second
        low, high = med * (1 + thr), med * (1 + c.strong_k * thr)
        for strong, limit in ((False, low), (True, high)):
            k = int(np.count_nonzero(tail > limit))
            p = (float(np.count_nonzero(ref > limit)) + 0.5) / (len(ref) + 1.0)
            chance = min(chance, binom_sf(k, len(tail), p))
            if strong and k == len(tail):
                # every value far above the reference: no pause run that long there
                chance = min(chance, run_chance(ref > limit, p, k))
        # a mild slow-down in a job whose reference exceedances are mostly pauses far
        # up: values between the two limits are what the reference seldom holds (where
        # its exceedances are mostly mild, noise, the count test above is the one)
        band = int(np.count_nonzero((ref > low) & (ref <= high)))
        if band < int(np.count_nonzero(ref > high)):
            k = int(np.count_nonzero((tail > low) & (tail <= high)))
            p = (band + 0.5) / (len(ref) + 1.0)
            chance = min(chance, binom_sf(k, len(tail), p))
        return level_ok, chance, med, sigma

    def _jump_at_end(self, tail: np.ndarray, ref_level: float) -> bool:
        """The newest value of a confirming tail (of more than ``min_after`` values) is of
        another level than all the others (``jump_k``): mild noise before a far larger step
        would otherwise open a level at the noise, measured at the noise's height."""
        if len(tail) <= self.config.min_after:
            return False
        rest = max(float(tail[:-1].max()) - ref_level, 0.0)
        return float(tail[-1]) - ref_level > self.config.jump_k * rest

    def _check_onset(self, i: int) -> list[Change]:
        c = self.config
        if not self._reference_ok(i - c.min_after + 1):
            return []
        self.baseline, self.sigma = self._baseline_level(i - c.min_after + 1)
        # speed-up (e.g. the end of warm-up): re-learn the baseline from the faster level,
        # once it has lasted as long as a baseline must (a few fast iterations of jitter
        # would otherwise leave a baseline too short to test the next slow-down against)
        for n in range(max(c.min_after, c.min_baseline), c.max_after + 1):
            hi = i - n + 1
            if hi - self.seg_start < c.min_baseline:
                break
            ref = self._slice(max(self.seg_start, hi - c.baseline_window), hi)
            if self._test_up(ref, self._slice(hi, i + 1), down=True)[0]:
                self.seg_start = hi
                self.prev_ref = []
                self.candidates.clear()
                self.baseline, self.sigma = self._baseline_level(i + 1)
                return []
        # the series alone, then (when it confirms nothing) with the caller's evidence
        for corroborated in (False, True):
            for n in range(c.min_after, c.max_after + 1):
                hi = i - n + 1
                if not self._reference_ok(hi) or hi < self.min_start:
                    break
                if corroborated and (self.corroborate is None or n > c.corroborate_after):
                    break
                tail = self._slice(hi, i + 1)
                level_ok, chance, base, sigma = self._chance_up(self._reference(hi), tail,
                                                                floor=corroborated)
                ok = self._corroborated(hi, i, level_ok, chance) if corroborated \
                    else level_ok and chance <= c.alpha
                if ok and self._jump_at_end(tail, base):
                    return []
                if ok:
                    self.baseline, self.sigma = base, sigma
                    return [self._open(i, n, base, max(self.seg_start + 1, self.offset,
                                                        self.min_start))]
        return []

    def _corroborated(self, hi: int, i: int, level_ok: bool, chance: float) -> bool:
        """The caller's own evidence on the values ``hi..i`` (``corroborate``: the chance
        that it arose by accident, such as one rank named the root of every one of those
        iterations) makes an onset of at most ``corroborate_after`` values significant
        together with the series' own test: Fisher's combination of the two chances is
        at most ``alpha``, and each of them points that way on its own (at most
        ``corroborate_alpha``). The series' test is its sign test at the ``threshold``
        limits (``level_ok`` and ``chance``), not at limits raised by the reference's
        noise: pauses in the reference inflate that noise, while a fail-slow that
        job-level noise hides for several iterations may show in every one of them at the
        rank level. Without the caller's evidence that test alone confirms nothing."""
        c = self.config
        if self.corroborate is None or not level_ok or chance > c.corroborate_alpha:
            return False
        evidence = self.corroborate(hi, i)
        return evidence <= c.corroborate_alpha and fisher_combined(chance, evidence) <= c.alpha

    def _check_further(self, i: int) -> list[Change]:
        """A further slow-down on top of the open one(s)."""
        c = self.config
        top = self.levels[-1]
        for n in range(c.min_after, c.max_after + 1):
            hi = i - n + 1
            # the reference: the top level's values, without its first (transition) one
            first = max(top.start, top.seg) + 1
            if hi - first < c.min_baseline:
                return []
            ref = self._slice(max(first, hi - c.baseline_window), hi)
            tail = self._slice(hi, i + 1)
            ok, ref_level, _ = self._test_up(ref, tail)
            if ok and self._jump_at_end(tail, ref_level):
                return []
            if ok:
                top.level = ref_level
                return [self._open(i, n, ref_level, first)]
        return []

    def _open(self, i: int, n: int, below: float, floor: int) -> Change:
        tail = self._slice(i - n + 1, i + 1)
        level = float(np.median(tail))
        start = self._split(i, n, below, level, floor)
        level = float(np.median(self._slice(start, i + 1)))
        self.levels.append(_Level(start, i, below, level, n))
        self.candidates.clear()
        return Change("onset", start, i, below, level, depth=len(self.levels))

    def _check_relief(self, i: int) -> list[Change]:
        """The values fell back to a lower level: close the levels above it."""
        c = self.config
        top = self.levels[-1]
        n = top.n_confirm
        first = max(top.start, top.seg)
        if i - n + 1 <= first:
            return []
        during = self._slice(first, i - n + 1)
        if len(during) >= 3:
            top.level = float(np.median(during))
        tail = self._slice(i - n + 1, i + 1)
        stat = float(tail.max()) if n <= 2 else float(np.median(tail))
        # the lowest level the tail is back to: below the midpoint to the level above it
        refs = [self.baseline] + [lv.level for lv in self.levels]
        target = -1
        for j in range(len(self.levels)):
            if stat < 0.5 * (refs[j] + refs[j + 1]):
                target = j
                break
        if target < 0:
            return []
        if target == 0:
            thr = max(c.threshold, c.noise_z * self.sigma)
            if stat > self.baseline * (1 + thr):
                return []
        closed = len(self.levels) - target
        upper = self.levels[target]
        first_start = self.levels[0].start
        lower = refs[target]
        start = self._split(i, n, lower, refs[target + 1], max(upper.start + 1, self.offset),
                            slow=False)
        level = float(np.median(self._slice(start, i + 1)))
        del self.levels[target:]
        if not self.levels:
            self._prev_undo = list(self.prev_ref)
            before = self._slice(self.seg_start, first_start).tolist()
            self.prev_ref = (self.prev_ref + before)[-c.baseline_window:]
            self.seg_start = start
        else:
            self.levels[-1].seg = start
        self.candidates.clear()
        return [Change("relief", start, i, lower, level, depth=len(self.levels),
                       closed=closed)]

    def _split(self, i: int, n: int, low: float, high: float, floor: int,
               slow: bool = True) -> int:
        """Where the new level starts: the CUSUM estimate (the start maximizing the summed
        excess over the midpoint up to ``i``, values clipped to ``[low, high]``), moved to a
        change-point candidate next to it. A value above the lower level by more than
        ``jump_k`` times the gap between the two is a pause, of neither level: clipped to
        the higher one, a pause just before a mild slow-down and the healthy value after it
        would cancel out, and the level would start at the pause."""
        lo = max(floor, i - 2 * n - 4)
        vals = self._slice(lo, i + 1)
        a, b = min(low, high), max(low, high)
        mid = 0.5 * (a + b)
        clipped = np.where(vals - a > self.config.jump_k * (b - a), mid, np.clip(vals, a, b))
        excess = (clipped - mid) if slow else (mid - clipped)
        gain = np.cumsum(excess[::-1])[::-1]  # sum of excess from each start to i
        best = lo + int(np.argmax(gain))
        near = [x for x in self.candidates if abs(x - best) <= 1 and lo <= x <= i]
        return min(near, key=lambda x: (abs(x - best), x)) if near else best

    # ------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        return {"values": list(self.values), "offset": self.offset,
                "seg_start": self.seg_start,
                "baseline": None if math.isnan(self.baseline) else self.baseline,
                "sigma": self.sigma, "levels": [asdict(lv) for lv in self.levels],
                "candidates": list(self.candidates), "bocd": self.bocd.snapshot(),
                "allow_further": self.allow_further, "min_start": self.min_start,
                "prev_ref": list(self.prev_ref), "prev_undo": list(self._prev_undo)}

    def restore(self, state: dict[str, Any]) -> None:
        self.values = [float(v) for v in state["values"]]
        self.offset = int(state["offset"])
        self.seg_start = int(state["seg_start"])
        self.baseline = math.nan if state["baseline"] is None else float(state["baseline"])
        self.sigma = float(state["sigma"])
        self.levels = [_Level(**lv) for lv in state["levels"]]
        self.candidates = [int(x) for x in state["candidates"]]
        self.bocd.restore(state["bocd"])
        self.allow_further = bool(state.get("allow_further", True))
        self.min_start = int(state.get("min_start", 0))
        self.prev_ref = [float(v) for v in state.get("prev_ref", [])]
        self._prev_undo = [float(v) for v in state.get("prev_undo", [])]
