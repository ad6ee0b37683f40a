"""CCL-D's ``R`` and ``P`` (§4.2, Eqs. 3-4) of one communicator over an anomaly window: the
share of the extra time that is late arrival (computation) rather than transfer
(communication)."""

from __future__ import annotations

import numpy as np

from failslow.detectors.slowdown.accounting import BinnedStats
from failslow.detectors.slowdown.levels import Window


def rp(stats: BinnedStats, cidx: int, win: Window, ranks: list[int] | None = None
       ) -> tuple[float | None, float | None]:
    """CCL-D's R and P (§4.2, Eqs. 3-4) of one communicator over the anomaly window,
    for its round class (op, bytes; for point-to-point, the pair, preferring pairs that
    involve ``ranks``: the slow link's ends or the root) that lost the most time.

    The window's rounds are summarized by their mean ``T_max`` and ``T_min`` rather than
    by the single round with the largest range (Eq. 2, which :class:`CCLDMonitor` uses
    to *detect*): over a window of many rounds that one round is an outlier by
    construction (a pause, a pipeline's first receive) and would say "late arrival"
    whatever the cause. With ``T_base`` and the healthy range from the class's first
    rounds (Eq. 1, :meth:`CCLDMonitor.base`), ``R = (T_max - T_base) / T_base`` and ``P =
    (T_max - T_min - range_base) / (T_max - T_base)``: the share of the extra time that
    is late arrival (computation) rather than transfer (communication); near 1 for a
    compute straggler, near 0 for a slow link."""
    w = stats.grp.query(win.lo, win.hi, ("cidx", "group", "cls"))
    rows = np.flatnonzero(w["cidx"] == cidx)
    onset_ns = win.b_hi << stats.shift
    if ranks and len(rows):
        g = w["group"][rows]
        mine = (g >= 0) & (np.isin(g >> 32, ranks) | np.isin(g & 0xFFFFFFFF, ranks))
        if len(ranks) >= 2:
            mine = (g >= 0) & np.isin(g >> 32, ranks) & np.isin(g & 0xFFFFFFFF, ranks)
        if mine.any():
            rows = rows[mine]
    best: tuple[float, float | None, float | None] | None = None
    for j in rows.tolist():
        key = int(stats.ccld_key(np.array([cidx]), np.array([w["group"][j]]),
                                 np.array([w["cls"][j]]))[0])
        # T_base from the class's baseline rounds before the anomaly: in a job that
        # has not yet completed its m baseline rounds when the anomaly begins, the slow
        # rounds would otherwise enter the baseline they are compared with
        t_base, skew = stats.ccld.base(key, until=onset_ns)
        n = float(w["n"][j])
        if not t_base or n <= 0:
            continue
        t_max, t_min = float(w["dmax"][j]) / n, float(w["dmin"][j]) / n
        late = max(t_max - t_min - skew, 0.0)
        slower = max(t_min - (t_base - skew), 0.0)
        r_val = round((t_max - t_base) / t_base, 4)
        p_val = round(late / (late + slower), 4) if late + slower > 0 else None
        lost = (t_max - t_base) * n
        if best is None or lost > best[0]:
            best = (lost, r_val, p_val)
    return (best[1], best[2]) if best is not None else (None, None)
