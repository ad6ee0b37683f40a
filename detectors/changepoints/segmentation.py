"""Change points of any series (``failslow changepoints``, :func:`segment`): z-scored
columns (several columns are one multivariate series with a diagonal Normal-Gamma model),
lone outliers clipped, BOCPD's maximum a posteriori segmentation (Adams & MacKay 2007,
hazard 1/100) and a verification that keeps a candidate only when a change of level, trend
or variance there pays for its BIC penalty (:func:`verify`). ``failslow bench
changepoints`` (:mod:`failslow.bench.changepoints`) scores it on the TCPD benchmark."""

from __future__ import annotations

import math

import numpy as np

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
