"""CCL-D §4.2: ``R`` and ``P`` of a window's rounds (Eqs. 2-4), the attribution from ``P``
and :class:`CCLDMonitor`, the slow detection per round class (§4.2.1: ``T_base``,
detection windows, threshold and repetition count)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from failslow.detectors.iterations import _group_starts, _sorted_groups
from failslow.detectors.slowdown.bins import BinTable, _KeyIndex

if TYPE_CHECKING:
    from failslow.detectors.slowdown.config import SlowdownConfig


def ccld_ratios(t_base: float, dmax: np.ndarray, dmin: np.ndarray, skew_base: float = 0.0
                ) -> tuple[float | None, float | None]:
    """CCL-D §4.2: over the rounds of a window (their longest and shortest member
    durations), take the round with the largest range ``T_max(r) - T_min(r)`` (Eq. 2);
    ``R = (T_max - T_base) / T_base`` (Eq. 3) and ``P = (T_max - T_min) / (T_max - T_base)``
    (Eq. 4, clipped to [0, 1]; None when ``T_max <= T_base``). P > beta (0.6) points at
    computation (the last rank to enter), P < alpha (0.4) at communication.

    ``skew_base``: the range ``T_max - T_min`` of the class's healthy rounds (the rounds that
    made ``T_base``). CCL-D's collectives start nearly together when healthy, so their range
    is ~0 and Eq. 4 is used as is; where healthy rounds already have a range (a pipeline's
    receive is posted long before its send arrives), only the range beyond the healthy one
    is the late arrival's share: ``P = (T_max - T_min - skew_base) / (T_max - T_base)``."""
    if len(dmax) == 0 or t_base <= 0:
        return None, None
    j = int(np.argmax(np.asarray(dmax, dtype=np.float64) - np.asarray(dmin, dtype=np.float64)))
    t_max, t_min = float(dmax[j]), float(dmin[j])
    r_val = (t_max - t_base) / t_base
    p_val = None
    if t_max > t_base:
        share = (t_max - t_min - max(skew_base, 0.0)) / (t_max - t_base)
        p_val = round(min(max(share, 0.0), 1.0), 4)
    return round(r_val, 4), p_val


def pack_class(cidx: np.ndarray, gid: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """One int64 per round class (CCL-D §4.2.1: communicator, op, bytes): the
    communicator's index, a dense id of the point-to-point pair (0 for a collective) and a
    dense id of the (op, bytes) class."""
    return ((np.asarray(cidx, dtype=np.int64) << 40) | (np.asarray(gid, dtype=np.int64) << 20)
            | np.asarray(cls, dtype=np.int64))


def cause_from_p(p: float | None, alpha: float = 0.4, beta: float = 0.6) -> str | None:
    """CCL-D's attribution from P: compute above beta, communication below alpha, mixed
    between; None when P is unknown."""
    if p is None:
        return None
    if p > beta:
        return "compute"
    if p < alpha:
        return "communication"
    return "mixed"


class CCLDMonitor:
    """CCL-D §4.2.1 slow detection per round class (communicator, op, bytes).

    * ``T_base``: the configured initial value (``t_base_init_ns``) until ``m`` rounds were
      seen, then the mean ``T_max`` of the first ``m = min(baseline_rounds, rounds in the
      first baseline_seconds)`` rounds (Eq. 1); the mean range ``T_max - T_min`` of the same
      rounds is kept too (the healthy skew, see :func:`ccld_ratios`).
    * Detection windows of ``window_s`` (one minute by default): in each, the round with the
      largest range gives ``R`` (Eqs. 2-3). A window is slow when ``R`` exceeds ``theta``,
      set from the observed distribution of the class's own past windows (median plus
      ``theta_k`` robust deviations, at least ``theta_min``; CCL-D's practical value 3
      until ``theta_windows`` windows were seen). An alarm is raised when ``repeat``
      consecutive windows are slow, so one-off jitter is not reported.

    The alarms are evidence for the fused diagnosis (they do not open anomalies: a slow
    anomaly is a slower job, diagnosis.md); ``T_base`` and the healthy skew give R and P.
    """

    def __init__(self, config: SlowdownConfig) -> None:
        self.config = config
        self.keys = _KeyIndex()  # class key -> dense index
        self.n = np.zeros(0)  # rounds in the baseline so far
        m = config.baseline_rounds
        # the baseline rounds themselves (end time, T_max, range), so a baseline still being
        # learned is read as of a given trace time
        self.b_t = np.zeros((0, m), dtype=np.int64)
        self.b_max = np.zeros((0, m))
        self.b_range = np.zeros((0, m))
        self.first_t = np.zeros(0, dtype=np.int64)
        self.frozen = np.zeros(0, dtype=bool)
        self.windows = BinTable(("key",), ("n",), arg="range", carried=("tmax", "tmin"))
        self.closed = -1  # last closed window index
        self.hist: dict[int, list[float]] = {}
        self.run: dict[int, int] = {}
        self.alarms: list[dict[str, Any]] = []

    def _dense(self, keys: np.ndarray) -> np.ndarray:
        before = len(self.keys)
        idx = self.keys.lookup(keys)
        grow = len(self.keys) - before
        if grow:
            m = self.config.baseline_rounds
            self.n = np.concatenate([self.n, np.zeros(grow)])
            self.b_t = np.concatenate([self.b_t, np.zeros((grow, m), dtype=np.int64)])
            self.b_max = np.concatenate([self.b_max, np.zeros((grow, m))])
            self.b_range = np.concatenate([self.b_range, np.zeros((grow, m))])
            self.first_t = np.concatenate([self.first_t, np.zeros(grow, dtype=np.int64)])
            self.frozen = np.concatenate([self.frozen, np.zeros(grow, dtype=bool)])
        return idx

    def update(self, key: np.ndarray, t_end: np.ndarray, dmax: np.ndarray, dmin: np.ndarray
               ) -> None:
        """Account completed rounds (arrays per round, any order)."""
        if len(key) == 0:
            return
        d_all = self._dense(key)
        mx_all = dmax.astype(np.float64)
        mn_all = dmin.astype(np.float64)
        self._learn(d_all, t_end, mx_all, mn_all)
        w = t_end // int(self.config.ccld_window_s * 1e9)
        self.windows.add({"bin": w, "key": d_all, "n": np.ones(len(d_all)),
                          "range": mx_all - mn_all, "tmax": mx_all, "tmin": mn_all})

    def learn(self, key: np.ndarray, t_end: np.ndarray, dmax: np.ndarray,
              dmin: np.ndarray) -> np.ndarray:
        """Only the baselines' part of :meth:`update`; returns which rounds belong to a
        class still learning its baseline (the others count only in their window, so a
        reducing stage may send them summed per window: :meth:`add_windows`)."""
        if len(key) == 0:
            return np.zeros(0, dtype=bool)
        d_all = self._dense(key)
        return self._learn(d_all, t_end, dmax.astype(np.float64), dmin.astype(np.float64))

    def add_windows(self, key: np.ndarray, window: np.ndarray, n: np.ndarray,
                    tmax: np.ndarray, tmin: np.ndarray) -> int:
        """Rounds of classes past their baseline, summed per detection window and class
        as :meth:`update` sums them (``n`` rounds; the round with the largest range gives
        ``tmax`` and ``tmin``, the first of them on a tie). Returns how many of these rows
        are of a class whose baseline this monitor has not learned (it saw none of its
        first rounds: a reducing stage ran before it), which keep no ``T_base``."""
        if len(key) == 0:
            return 0
        d = self._dense(key)
        mx, mn = tmax.astype(np.float64), tmin.astype(np.float64)
        self.windows.add({"bin": np.asarray(window, dtype=np.int64), "key": d,
                          "n": np.asarray(n, dtype=np.float64), "range": mx - mn,
                          "tmax": mx, "tmin": mn})
        return int(((self.n[d] < self.config.baseline_rounds) & ~self.frozen[d]).sum())

    def _learn(self, d_all: np.ndarray, t_end: np.ndarray, mx_all: np.ndarray,
               mn_all: np.ndarray) -> np.ndarray:
        """The baselines of the classes still learning (Eq. 1); returns those rounds."""
        c = self.config
        horizon = int(c.baseline_seconds * 1e9)
        # only classes still learning T_base need the per-class bookkeeping
        learning = (self.n[d_all] < c.baseline_rounds) & ~self.frozen[d_all]
        if learning.any():
            d, te = d_all[learning], t_end[learning]
            mx, mn = mx_all[learning], mn_all[learning]
            order, _ = _sorted_groups({"d": d, "t": te}, ("d", "t"))
            d, te, mx, mn = d[order], te[order], mx[order], mn[order]
            starts = _group_starts(d)
            sizes = np.diff(np.append(starts, len(d)))
            ud = d[starts]
            new = self.n[ud] == 0
            self.first_t[ud[new]] = te[starts[new]]
            within = np.arange(len(d)) - np.repeat(starts, sizes)
            in_time = te <= self.first_t[d] + horizon
            slot = (self.n[d] + within).astype(np.int64)
            take = (slot < c.baseline_rounds) & in_time
            self.b_t[d[take], slot[take]] = te[take]
            self.b_max[d[take], slot[take]] = mx[take]
            self.b_range[d[take], slot[take]] = mx[take] - mn[take]
            self.n += np.bincount(d[take], minlength=len(self.n))
            # a class whose rounds run past its first two minutes is frozen (Eq. 1)
            self.frozen[np.unique(d[~in_time])] = True
        return learning

    def base(self, key: int, until: int | None = None) -> tuple[float | None, float]:
        """``(T_base, healthy range)`` of a class from its baseline rounds that ended
        before ``until`` (all when None); the configured initial value until ``m`` rounds
        are in (None when there is none and no round is)."""
        d = self.keys.get(key)
        init = self.config.t_base_init_ns
        if d is None or self.n[d] == 0:
            return (float(init) if init else None), 0.0
        k = int(self.n[d])
        sel = slice(0, k)
        t, mx, rg = self.b_t[d, sel], self.b_max[d, sel], self.b_range[d, sel]
        if until is not None:
            ok = t < until
            t, mx, rg = t[ok], mx[ok], rg[ok]
        if len(t) == 0 or (len(t) < self.config.baseline_rounds and init
                           and not self.frozen[d]):
            return (float(init) if init else None), 0.0
        return float(mx.mean()), float(rg.mean())

    def close(self, now_ns: int) -> list[dict[str, Any]]:
        """Close the detection windows that ended before ``now_ns``; return new alarms."""
        c = self.config
        w_ns = int(c.ccld_window_s * 1e9)
        last = now_ns // w_ns - 1
        if last <= self.closed or len(self.windows) == 0:
            return []
        rows = self.windows.query(self.closed + 1, last + 1, ("bin", "key"))
        self.windows.prune(last + 1)
        self.closed = last
        inv = self.keys.key_of()
        out = []
        for b, d, tmax, tmin in zip(rows["bin"].tolist(), rows["key"].tolist(),
                                    rows["tmax"].tolist(), rows["tmin"].tolist(), strict=True):
            t_base, skew = self.base(int(inv[d]), until=now_ns)
            if not t_base:
                continue
            r_val, p_val = ccld_ratios(t_base, np.array([tmax]), np.array([tmin]), skew)
            if r_val is None:
                continue
            hist = self.hist.setdefault(d, [])
            if len(hist) >= c.theta_windows:
                h = np.array(hist)
                med = float(np.median(h))
                theta = max(c.theta_min, med + c.theta_k * 1.4826
                            * float(np.median(np.abs(h - med))))
            else:
                theta = c.theta_default
            if r_val > theta:
                self.run[d] = self.run.get(d, 0) + 1
                if self.run[d] == c.ccld_repeat:
                    out.append({"key": int(inv[d]), "window": int(b), "R": r_val, "P": p_val,
                                "theta": round(theta, 4), "t_ns": int((b + 1) * w_ns)})
            else:
                self.run[d] = 0
                hist.append(r_val)
                del hist[:-256]
        self.alarms.extend(out)
        return out

    def snapshot(self) -> dict[str, Any]:
        return {"keys": self.keys.pairs(), "n": self.n.copy(),
                "b_t": self.b_t.copy(), "b_max": self.b_max.copy(),
                "b_range": self.b_range.copy(),
                "first_t": self.first_t.copy(), "frozen": self.frozen.copy(),
                "windows": self.windows.snapshot(), "closed": self.closed,
                "hist": [[k, v] for k, v in self.hist.items()],
                "run": [[k, v] for k, v in self.run.items()], "alarms": self.alarms}

    def restore(self, state: dict[str, Any]) -> None:
        self.keys = _KeyIndex([(int(k), int(v)) for k, v in state["keys"]])
        self.n = np.array(state["n"], dtype=np.float64)
        m = self.config.baseline_rounds
        self.b_t = np.array(state["b_t"], dtype=np.int64).reshape(-1, m)
        self.b_max = np.array(state["b_max"], dtype=np.float64).reshape(-1, m)
        self.b_range = np.array(state["b_range"], dtype=np.float64).reshape(-1, m)
        self.first_t = np.array(state["first_t"], dtype=np.int64)
        self.frozen = np.array(state["frozen"], dtype=bool)
        self.windows.restore(state["windows"])
        self.closed = int(state["closed"])
        self.hist = {int(k): [float(x) for x in v] for k, v in state["hist"]}
        self.run = {int(k): int(v) for k, v in state["run"]}
        self.alarms = list(state["alarms"])
