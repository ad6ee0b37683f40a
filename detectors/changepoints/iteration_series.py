"""Change points of a whole iteration-time series by the three methods compared in
``failslow bench accuracy`` (Greyhound Tables 3 and 4): ``bocd+v`` (BOCD candidates
verified against the pre-anomaly baseline), plain ``bocd`` and ``window``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from failslow.detectors.changepoints.candidates import bocd_candidates, window_candidates
from failslow.detectors.changepoints.tracker import ChangeConfig, ChangeTracker


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
