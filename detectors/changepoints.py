"""Change points (Greyhound §4.2, "Slow iteration detection"), for iteration times and for
any series.

Iteration times (the slow-down detector, :class:`ChangeTracker`):

* :class:`BOCD`, Bayesian online change-point detection (Adams & MacKay 2007) with a
  Normal-Gamma conjugate prior, a Student-t posterior predictive and a constant hazard,
  vectorized over a truncated run-length posterior, on ``log(iteration time)``; and a
  sliding-window baseline detector (:func:`window_candidates`). Both only propose
  candidates.
* Greyhound's verification step compares the level before and after a change and drops
  it as jitter under 10%. We verify against the *pre-anomaly baseline* (a slow-down that
  builds up in small steps is still caught; the relief is the return to that baseline) with
  a sign test robust to pauses (:meth:`ChangeTracker._test_up`): the floor is 5%, raised by
  the baseline's own noise, and how often the baseline's values exceed the limit (GC pauses
  and other spikes) sets how many slow values a change needs. Slow levels stack: a second
  slow-down during an open one is its own onset.
* :func:`changepoints` / :func:`detect_changepoints` run it over a whole series, with the
  three methods compared in ``failslow bench accuracy`` (Greyhound Tables 3 and 4):
  ``bocd+v``, plain ``bocd`` and ``window``.

Any series (``failslow changepoints``, :func:`segment`): z-scored columns (several columns
are one multivariate series with a diagonal Normal-Gamma model), lone outliers clipped,
BOCPD's maximum a posteriori segmentation (hazard 1/100) and a verification that keeps a
candidate only when a change of level, trend or variance there pays for its BIC penalty,
each kept change point moved to the best split between its neighbours
(:func:`verify`). ``failslow bench changepoints`` (:mod:`failslow.bench.changepoints`)
scores it on the TCPD benchmark against the published BOCPD results.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

#: The relative change below which a level shift is jitter (Greyhound §4.2: 10%).
DEFAULT_THRESHOLD = 0.10


@dataclass
class BOCDConfig:
    """Hyper-parameters of :class:`BOCD` (values on the log scale)."""

    hazard: float = 1.0 / 100.0  # constant hazard H = 1/lambda
    max_run: int = 128  # truncation of the run-length posterior
    kappa0: float = 0.05  # prior pseudo-count of the mean
    alpha0: float = 2.0  # Gamma shape of the precision
    sigma0: float = 0.03  # prior noise scale (3% in log-time)
    cp_mass: float = 0.9  # posterior mass on short runs that makes a candidate (Greyhound: 0.9)
    short_run: int = 4  # "short" run lengths: r <= short_run


class BOCD:
    """Adams & MacKay's run-length posterior over a univariate stream (Greyhound §4.2, 1)).

    ``update(x)`` returns the index of a change-point candidate, or None. A candidate is
    reported when the posterior mass on run lengths ``<= short_run`` exceeds ``cp_mass``;
    its index is the start of the most probable short run. Each change is reported once.
    """

    def __init__(self, config: BOCDConfig | None = None) -> None:
        self.config = config or BOCDConfig()
        self.t = 0  # observations seen
        self.mu0 = math.nan  # prior mean, set from the first observation
        self.log_r = np.zeros(1)  # log P(r_t = r | x_1:t), r = 0..len-1
        self.mu = np.zeros(1)
        self.kappa = np.zeros(1)
        self.alpha = np.zeros(1)
        self.beta = np.zeros(1)
        self.last_cp = 0  # index of the last reported change (start of the current run)
        a = self.config.alpha0 + 0.5 * np.arange(self.config.max_run + 1)
        self._lgamma_ratio = np.array([math.lgamma(v + 0.5) - math.lgamma(v) for v in a])

    def _prior(self) -> tuple[float, float, float, float]:
        c = self.config
        return self.mu0, c.kappa0, c.alpha0, c.alpha0 * c.sigma0 ** 2

    def update(self, x: float) -> int | None:
        c = self.config
        if self.t == 0:
            self.mu0 = float(x)
            mu, kappa, alpha, beta = self._prior()
            # r_1 = 1: the first observation opens the first run
            self.mu = np.array([mu, (kappa * mu + x) / (kappa + 1)])
            self.kappa = np.array([kappa, kappa + 1])
            self.alpha = np.array([alpha, alpha + 0.5])
            self.beta = np.array([beta, beta])
            self.log_r = np.array([-np.inf, 0.0])
            self.t = 1
            return None
        # Student-t predictive of x under every run length (vectorized over r); alpha at
        # index r is alpha0 + r/2, so the Gamma-function terms come from a fixed table
        scale2 = self.beta * (self.kappa + 1) / (self.alpha * self.kappa)
        nu = 2 * self.alpha
        z = (x - self.mu) ** 2 / (nu * scale2)
        log_pred = (self._lgamma_ratio[:len(nu)] - 0.5 * np.log(nu * np.pi * scale2)
                    - (nu + 1) / 2 * np.log1p(z))
        log_joint = self.log_r + log_pred
        log_growth = log_joint + math.log1p(-c.hazard)
        log_cp = np.logaddexp.reduce(log_joint) + math.log(c.hazard)
        # r_t = 0 is "a run starts after x_t"; r_t = r + 1 grows the run containing x_t
        new_log_r = np.concatenate(([log_cp], log_growth))
        mu, kappa, alpha, beta = self._prior()
        new_mu = np.concatenate(([mu], (self.kappa * self.mu + x) / (self.kappa + 1)))
        new_beta = np.concatenate(([beta], self.beta + self.kappa * (x - self.mu) ** 2
                                   / (2 * (self.kappa + 1))))
        new_kappa = np.concatenate(([kappa], self.kappa + 1))
        new_alpha = np.concatenate(([alpha], self.alpha + 0.5))
        if len(new_log_r) > c.max_run:
            # truncation: fold the tail into the longest kept run length
            tail = np.logaddexp.reduce(new_log_r[c.max_run - 1:])
            new_log_r = new_log_r[:c.max_run]
            new_log_r[-1] = tail
            new_mu, new_beta = new_mu[:c.max_run], new_beta[:c.max_run]
            new_kappa, new_alpha = new_kappa[:c.max_run], new_alpha[:c.max_run]
        new_log_r -= np.logaddexp.reduce(new_log_r)
        self.log_r, self.mu, self.beta = new_log_r, new_mu, new_beta
        self.kappa, self.alpha = new_kappa, new_alpha
        self.t += 1
        short = np.exp(new_log_r[1:c.short_run + 1])
        if short.sum() < c.cp_mass:
            return None
        run = 1 + int(np.argmax(short))  # observations in the most probable short run
        start = self.t - run
        if start <= self.last_cp:
            return None
        self.last_cp = start
        return start

    def run_length_posterior(self) -> np.ndarray:
        return np.exp(self.log_r)

    def snapshot(self) -> dict[str, Any]:
        return {"t": self.t, "mu0": None if math.isnan(self.mu0) else self.mu0,
                "log_r": _floats(self.log_r), "mu": _floats(self.mu),
                "kappa": _floats(self.kappa), "alpha": _floats(self.alpha),
                "beta": _floats(self.beta), "last_cp": self.last_cp}

    def restore(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        self.mu0 = math.nan if state["mu0"] is None else float(state["mu0"])
        for name in ("log_r", "mu", "kappa", "alpha", "beta"):
            setattr(self, name, _array(state[name]))
        self.last_cp = int(state["last_cp"])


def _floats(a: np.ndarray) -> list[float | str]:
    """JSON-safe floats (``-inf`` is kept as a string)."""
    return [float(v) if math.isfinite(v) else str(float(v)) for v in a]


def _array(values: list[Any]) -> np.ndarray:
    return np.array([float(v) for v in values], dtype=np.float64)


def bocd_candidates(series: np.ndarray, config: BOCDConfig | None = None) -> list[int]:
    """Unverified BOCD change-point candidates of ``series`` (positive values, log scale)."""
    detector = BOCD(config)
    out = []
    for x in np.log(np.asarray(series, dtype=np.float64)):
        cp = detector.update(float(x))
        if cp is not None:
            out.append(cp)
    return out


def window_candidates(series: np.ndarray, w: int = 3, big_w: int = 10,
                      threshold: float = DEFAULT_THRESHOLD) -> list[int]:
    """Sliding-window baseline detector: index ``i`` is a candidate when the median of
    ``series[i:i+w]`` and ``series[i]`` itself differ from the median of ``series[i-W:i]``
    by more than ``threshold``; a run of such indices yields its first index."""
    x = np.asarray(series, dtype=np.float64)
    n = len(x)
    if n < w + 2:
        return []
    idx = np.arange(1, n - w + 1)
    before = np.array([np.median(x[max(0, i - big_w):i]) for i in idx])
    after = np.array([np.median(x[i:i + w]) for i in idx])
    first = x[idx]
    hit = (np.abs(after / before - 1.0) > threshold) & (np.abs(first / before - 1.0) > threshold)
    starts = idx[hit & ~np.concatenate(([False], hit[:-1]))]
    return [int(i) for i in starts]


# ---------------------------------------------------------------------------------------------
# verification and the online state machine


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X >= k)`` for ``X ~ Binomial(n, p)``."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    p = min(max(p, 0.0), 1.0)
    return float(sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1)))


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
    median_z: float = 2.0  # the median of the new values clears the floor by z sigma/sqrt(n)
    min_baseline: int = 5  # iterations of baseline before an onset can be declared
    min_after: int = 2  # fewest values of the new level that confirm a change ...
    max_after: int = 12  # ... and most (noisy jobs need more)
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
    and a single pause is never enough. Reliefs are the mirror test against the slow level:
    the values fall below the midpoint between it and a lower level, and the levels above
    that are closed. The first index of a new level is the CUSUM split between the two
    levels (values clipped to them, so a lone spike does not pull it), moved to an adjacent
    BOCD (or sliding-window) candidate. Speed-ups while healthy (the end of warm-up)
    re-learn the baseline.
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
        self.min_start = 0  # first index a new level may start at (after a reject)

    # ------------------------------------------------------------------ caller's verdicts

    def reject(self) -> None:
        """The top level was not confirmed by the caller (e.g. its slow iterations had no
        common root: pauses on random ranks): drop it without a relief. Its values stay in
        the segment below, so the baseline learns how often such spikes come."""
        if self.levels:
            self.levels.pop()
            self.candidates.clear()
            self.min_start = self.n  # the evidence of a new onset must be new values

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
        """Median and robust relative sigma of the healthy segment before ``hi``."""
        c = self.config
        return self._stats(self._slice(max(self.seg_start, hi - c.baseline_window), hi))

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
        c = self.config
        med, sigma = self._stats(ref)
        if not len(ref) or not med > 0:
            return False, med, sigma
        thr = max(c.threshold, c.noise_z * sigma)
        # the level itself: the median of the n values clears the floor by its own noise
        margin = max(thr, c.threshold + c.median_z * sigma / math.sqrt(len(tail)))
        if down:
            limit = med * (1 - thr)
            k = int(np.count_nonzero(tail < limit))
            p = (float(np.count_nonzero(ref < limit)) + 0.5) / (len(ref) + 1.0)
            level_ok = float(np.median(tail)) < med * (1 - margin)
        else:
            limit = med * (1 + thr)
            k = int(np.count_nonzero(tail > limit))
            p = (float(np.count_nonzero(ref > limit)) + 0.5) / (len(ref) + 1.0)
            level_ok = float(np.median(tail)) > med * (1 + margin)
        return level_ok and binom_sf(k, len(tail), p) <= c.alpha, med, sigma

    def _check_onset(self, i: int) -> list[Change]:
        c = self.config
        if i - c.min_after + 1 - self.seg_start < c.min_baseline:
            return []
        self.baseline, self.sigma = self._baseline_level(i - c.min_after + 1)
        # speed-up (e.g. the end of warm-up): re-learn the baseline from the faster level
        for n in range(c.min_after, c.max_after + 1):
            hi = i - n + 1
            if hi - self.seg_start < c.min_baseline:
                break
            ref = self._slice(max(self.seg_start, hi - c.baseline_window), hi)
            if self._test_up(ref, self._slice(hi, i + 1), down=True)[0]:
                self.seg_start = hi
                self.candidates.clear()
                self.baseline, self.sigma = self._baseline_level(i + 1)
                return []
        for n in range(c.min_after, c.max_after + 1):
            hi = i - n + 1
            if hi - self.seg_start < c.min_baseline or hi < self.min_start:
                return []
            ref = self._slice(max(self.seg_start, hi - c.baseline_window), hi)
            ok, base, sigma = self._test_up(ref, self._slice(hi, i + 1))
            if ok:
                self.baseline, self.sigma = base, sigma
                return [self._open(i, n, base, max(self.seg_start + 1, self.offset,
                                                    self.min_start))]
        return []

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
            ok, ref_level, _ = self._test_up(ref, self._slice(hi, i + 1))
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
        lower = refs[target]
        start = self._split(i, n, lower, refs[target + 1], max(upper.start + 1, self.offset),
                            slow=False)
        level = float(np.median(self._slice(start, i + 1)))
        del self.levels[target:]
        if not self.levels:
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
        change-point candidate next to it."""
        lo = max(floor, i - 2 * n - 4)
        vals = self._slice(lo, i + 1)
        a, b = min(low, high), max(low, high)
        mid = 0.5 * (a + b)
        clipped = np.clip(vals, a, b)
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
                "allow_further": self.allow_further, "min_start": self.min_start}

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


def changepoints(series: np.ndarray, method: str = "bocd",
                 config: ChangeConfig | None = None) -> list[int]:
    """Verified change points of a series of iteration times: the first index of every
    slow-down (onset) and of every return to the baseline (relief), in order.

    ``method`` is ``"bocd"`` (BOCD candidates + verification against the pre-anomaly
    baseline) or ``"window"`` (sliding-window candidates + the same verification); the
    test itself also catches sustained shifts BOCD missed.
    """
    if method not in ("bocd", "window"):
        raise ValueError(f"unknown change-point method {method!r} (bocd or window)")
    cfg = replace(config or ChangeConfig(), method=method)
    tracker = ChangeTracker(cfg)
    out: list[int] = []
    for v in np.asarray(series, dtype=np.float64):
        out.extend(ch.index for ch in tracker.push(float(v)))
    return out


#: The change-point methods compared side by side (Greyhound Tables 3 and 4).
METHODS = ("bocd+v", "bocd", "window")


def detect_changepoints(series: np.ndarray, method: str = "bocd+v") -> list[int]:
    """Change points of an iteration-time series by one of :data:`METHODS`: ``bocd+v``
    (BOCD candidates verified against the pre-anomaly baseline: onsets and reliefs),
    ``bocd`` (plain BOCD candidates, no verification) or ``window`` (Greyhound's sliding
    window baseline: a change of more than 10% from the median of the preceding window)."""
    x = np.asarray(series, dtype=np.float64)
    x = x[np.isfinite(x) & (x > 0)]
    if method == "bocd+v":
        return changepoints(x, "bocd")
    if method == "bocd":
        return bocd_candidates(x)
    if method == "window":
        return window_candidates(x)
    raise ValueError(f"unknown change-point method {method!r} (one of {', '.join(METHODS)})")


# ---------------------------------------------------------------------------------------------
# change points of any series (``failslow changepoints``)


#: Methods for generic series (:func:`segment`).
SERIES_METHODS = ("bocd+v", "bocd", "window")


def _fill(x: np.ndarray) -> np.ndarray:
    """Missing values (NaN) linearly interpolated, the ends held."""
    ok = np.isfinite(x)
    if ok.all() or not ok.any():
        return np.where(ok, x, 0.0)
    out = x.copy()
    out[~ok] = np.interp(np.flatnonzero(~ok), np.flatnonzero(ok), x[ok])
    return out


def standardize(series: np.ndarray) -> np.ndarray:
    """``(n, d)`` float array: missing values filled, every column z-scored (constant
    columns become 0)."""
    x = np.asarray(series, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    out = np.empty_like(x)
    for j in range(x.shape[1]):
        col = _fill(x[:, j])
        sd = float(np.std(col))
        out[:, j] = (col - float(np.mean(col))) / sd if sd > 0 else 0.0
    return out


def winsorize(z: np.ndarray, width: int = 7, k: float = 4.0) -> np.ndarray:
    """Isolated outliers clipped: each value kept within ``k`` robust deviations of the
    centered running median of ``width`` values. A level shift moves the running median
    within half a window, so it is not clipped; a lone spike is."""
    n = len(z)
    if n < width:
        return z
    h = width // 2
    pad = np.pad(z, ((h, h), (0, 0)), mode="edge")
    med = np.median(np.lib.stride_tricks.sliding_window_view(pad, width, axis=0), axis=2)
    res = z - med
    s = 1.4826 * np.median(np.abs(res - np.median(res, axis=0)), axis=0)
    s = np.where(s > 0, s, np.std(z, axis=0) + 1e-12)
    return med + np.clip(res, -k * s, k * s)


def bocpd_map(z: np.ndarray, hazard: float = 1.0 / 100.0, kappa0: float = 1.0,
              alpha0: float = 1.0, beta0: float = 1.0, max_run: int = 2000) -> list[int]:
    """Adams & MacKay's BOCPD over a ``(n, d)`` series with independent Normal-Gamma
    priors per column (mean ``0``, ``kappa0``, ``alpha0``, ``beta0``: the diagonal
    multivariate Student-t predictive) and a constant hazard, vectorized over run lengths;
    the change points of the maximum a posteriori run-length path (each segment's start,
    from the last observation backwards). Run lengths beyond ``max_run`` are folded into
    the last one ("at least max_run")."""
    n, d = z.shape
    if n < 2:
        return []
    lh, l1h = math.log(hazard), math.log1p(-hazard)
    cap = max(2, min(max_run, n + 1))
    alphas = alpha0 + 0.5 * np.arange(cap + 1)
    lg = np.array([math.lgamma(a + 0.5) - math.lgamma(a) for a in alphas])
    log_r = np.zeros(1)
    mu = np.zeros((1, d))
    kap = np.full(1, kappa0)
    bet = np.full((1, d), beta0)
    best = np.zeros(n, dtype=np.int64)
    for t in range(n):
        x = z[t]
        m = len(log_r)
        alp = alphas[:m]
        scale2 = bet * ((kap + 1) / (alp * kap))[:, None]
        nu = 2 * alp[:, None]
        q = (x - mu) ** 2 / (nu * scale2)
        lp = (lg[:m, None] - 0.5 * np.log(nu * np.pi * scale2)
              - (nu + 1) / 2 * np.log1p(q)).sum(axis=1)
        joint = log_r + lp
        new = np.concatenate(([np.logaddexp.reduce(joint) + lh], joint + l1h))
        mu = np.vstack([np.zeros((1, d)), (kap[:, None] * mu + x) / (kap[:, None] + 1)])
        bet = np.vstack([np.full((1, d), beta0),
                         bet + (kap / (2 * (kap + 1)))[:, None] * (x - mu[1:]) ** 2
                         * ((kap + 1) / kap)[:, None] ** 2])
        kap = np.concatenate(([kappa0], kap + 1))
        if len(new) > cap:
            new = np.concatenate((new[:cap - 1], [np.logaddexp.reduce(new[cap - 1:])]))
            mu, bet, kap = mu[:cap], bet[:cap], kap[:cap]
        new -= np.logaddexp.reduce(new)
        log_r = new
        # index r (>= 1): x_t is the r-th value of its run
        best[t] = int(np.argmax(new[1:])) + 1
    cps = []
    t = n - 1
    while t > 0:
        r = int(best[t])
        if r >= cap - 1:  # a run at least this long: no change within it
            t -= r
            continue
        start = t - r + 1
        if start <= 0:
            break
        cps.append(start)
        t = start - 1
    return sorted(cps)


class _Prefix:
    """Prefix sums for O(1) least-squares costs of segments (per column), vectorized over
    many segments at once."""

    def __init__(self, z: np.ndarray) -> None:
        n = len(z)
        t = np.arange(n, dtype=np.float64)

        def cum(a: np.ndarray) -> np.ndarray:
            return np.concatenate([np.zeros((1, *a.shape[1:])), np.cumsum(a, axis=0)])

        self.st, self.stt = cum(t), cum(t * t)
        self.sx, self.sxt, self.sxx = cum(z), cum(z * t[:, None]), cum(z * z)

    def costs(self, a: np.ndarray, b: np.ndarray, floor: float = 1e-3) -> np.ndarray:
        """``-2 log L`` (up to constants) of every segment ``z[a_i:b_i]`` under a Gaussian
        with its own linear trend and variance per column (a mean only below 3 values)."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        n = (b - a).astype(np.float64)[:, None]
        sx = self.sx[b] - self.sx[a]
        rss = self.sxx[b] - self.sxx[a] - sx * sx / n
        st = (self.st[b] - self.st[a])[:, None]
        vt = (self.stt[b] - self.stt[a])[:, None] - st * st / n
        cxt = self.sxt[b] - self.sxt[a] - sx * st / n
        trend = np.where(n >= 3, cxt * cxt / np.where(vt > 0, vt, 1.0), 0.0)
        rss = rss - trend
        return np.sum(n * np.log(np.maximum(rss / n, floor)), axis=1)

    def cost(self, a: int, b: int, floor: float = 1e-3) -> float:
        return float(self.costs(np.array([a]), np.array([b]), floor)[0])

    def best_split(self, a: int, b: int, lo: int, hi: int) -> int:
        """The split ``p`` in ``[lo, hi]`` minimizing ``cost(a, p) + cost(p, b)``."""
        ps = np.arange(lo, hi + 1)
        total = self.costs(np.full(len(ps), a), ps) + self.costs(ps, np.full(len(ps), b))
        return lo + int(np.argmin(total))


def _prune(cost: _Prefix, b: list[int], pen: float, min_len: int) -> list[int]:
    """Boundaries ``b`` (with 0 and n) after merging segments shorter than ``min_len`` and
    removing, weakest first, every change point whose split gains less than ``pen``."""
    b = list(b)

    def gain(i: int) -> float:
        return cost.cost(b[i - 1], b[i + 1]) - cost.cost(b[i - 1], b[i]) \
            - cost.cost(b[i], b[i + 1])

    merged = True
    while merged and len(b) > 2:
        merged = False
        for i in range(len(b) - 1):
            if b[i + 1] - b[i] < min_len:
                inner = [j for j in (i, i + 1) if 0 < j < len(b) - 1]
                if inner:
                    del b[min(inner, key=gain)]
                    merged = True
                    break
    while len(b) > 2:
        mid = np.arange(1, len(b) - 1)
        bb = np.asarray(b)
        gains = (cost.costs(bb[mid - 1], bb[mid + 1]) - cost.costs(bb[mid - 1], bb[mid])
                 - cost.costs(bb[mid], bb[mid + 1]))
        j = int(np.argmin(gains))
        if gains[j] >= pen:
            break
        del b[j + 1]
    return b


def verify(z: np.ndarray, cps: list[int], penalty: float | None = None,
           min_len: int = 2, refine: int = 10, rounds: int = 3) -> list[int]:
    """The verification step for generic series: change-point candidates are kept only
    where they pay for themselves. Each segment is a Gaussian with its own linear trend and
    variance (so a trend that goes on, or noise, is no change); candidates are removed
    weakest first while the likelihood gained by splitting there is below the BIC penalty
    ``(3 d + 1) log n`` (level, slope and variance per column, plus the location).
    Segments shorter than ``min_len`` are merged into a neighbour first. Each kept change
    point is then moved, within ``refine`` values, to the split that fits best; and for up
    to ``rounds`` rounds every change point moves to the best split anywhere between its
    neighbours and the set is pruned again, until it no longer changes (BOCPD, a model of
    constant level, places a change of slope late or as two changes around a peak)."""
    n, d = z.shape
    cost = _Prefix(z)
    pen = (3 * d + 1) * math.log(max(n, 2)) if penalty is None else penalty
    b = _prune(cost, [0, *sorted({int(c) for c in cps if 0 < c < n}), n], pen, min_len)
    for i in range(1, len(b) - 1):
        lo = max(b[i - 1] + min_len, b[i] - refine)
        hi = min(b[i + 1] - min_len, b[i] + refine)
        if hi > lo:
            b[i] = cost.best_split(b[i - 1], b[i + 1], lo, hi)
    for _ in range(rounds):
        moved = list(b)
        for i in range(1, len(moved) - 1):
            lo, hi = moved[i - 1] + min_len, moved[i + 1] - min_len
            if hi > lo:
                moved[i] = cost.best_split(moved[i - 1], moved[i + 1], lo, hi)
        pruned = _prune(cost, moved, pen, min_len)
        if pruned == b:
            break
        b = pruned
    return b[1:-1]


def _medians_before(z: np.ndarray, idx: np.ndarray, width: int) -> np.ndarray:
    """``median(z[max(0, i - width):i])`` per column for every ``i`` in ``idx`` (``i >= 1``)."""
    out = np.empty((len(idx), z.shape[1]))
    full = idx >= width
    if full.any():
        win = np.lib.stride_tricks.sliding_window_view(z, width, axis=0)  # (n-w+1, d, w)
        out[full] = np.median(win[idx[full] - width], axis=2)
    for k in np.flatnonzero(~full):  # the first few indices only (fewer than `width`)
        out[k] = np.median(z[:idx[k]], axis=0)
    return out


def window_series(z: np.ndarray, w: int = 5, big_w: int = 20, k: float = 3.0) -> list[int]:
    """Sliding-window detector on a standardized series: index ``i`` is a candidate when,
    in some column, the median of the next ``w`` values differs from the median of the
    ``big_w`` before by more than ``k`` robust noise deviations (from the first
    differences); each run of candidates yields one change point, placed where the medians
    of the ``w`` values on either side differ most."""
    n, d = z.shape
    if n < w + 3:
        return []
    diffs = np.diff(z, axis=0)
    noise = 1.4826 * np.median(np.abs(diffs - np.median(diffs, axis=0)), axis=0) / math.sqrt(2)
    noise = np.where(noise > 0, noise, 1.0)
    idx = np.arange(2, n - w + 1)
    after = np.median(np.lib.stride_tricks.sliding_window_view(z, w, axis=0)[idx], axis=2)
    score = np.zeros(n)
    score[idx] = np.max(np.abs(after - _medians_before(z, idx, big_w)) / noise, axis=1)
    local = np.zeros(n)
    local[idx] = np.max(np.abs(after - _medians_before(z, idx, w)) / noise, axis=1)
    hit = score > k
    edges = np.diff(np.concatenate(([0], hit.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [int(a + np.argmax(local[a:b])) for a, b in zip(starts, ends, strict=True)]


def segment(series: np.ndarray, method: str = "bocd+v", hazard: float = 1.0 / 100.0
            ) -> list[int]:
    """Change points of any series, ``(n,)`` or ``(n, d)`` (several columns are one
    multivariate series), missing values allowed (NaN). Each change point is the index of
    the first value of a new segment.

    * ``bocd+v`` (default): z-scored columns, isolated outliers clipped
      (:func:`winsorize`), BOCPD's maximum a posteriori segmentation (:func:`bocpd_map`,
      hazard 1/100) and the verification step (:func:`verify`: a candidate stays only if a
      change of level, trend or variance there is worth its BIC penalty);
    * ``bocd``: plain BOCPD on the z-scored series (Adams & MacKay's defaults: Normal-Gamma
      with ``kappa = alpha = beta = 1``, hazard 1/100), no verification;
    * ``window``: the sliding-window baseline (:func:`window_series`)."""
    if method not in SERIES_METHODS:
        raise ValueError(f"unknown change-point method {method!r} "
                         f"(one of {', '.join(SERIES_METHODS)})")
    z = standardize(series)
    if len(z) < 3:
        return []
    if method == "bocd":
        return bocpd_map(z, hazard)
    if method == "window":
        return window_series(z)
    zc = winsorize(z)
    return verify(zc, bocpd_map(zc, hazard))
