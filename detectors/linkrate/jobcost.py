"""What a degraded link costs the job, and whether the job slowed down with it: read from
the job's iteration rows (``iterations``, rank -1), an array of (start, duration) in ns."""

from __future__ import annotations

import numpy as np

from failslow.detectors.linkrate.config import LinkRateConfig


def iterations_around(iters: np.ndarray, start: int, n: int, end: int | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Durations of the last ``n`` iterations that ended by ``start`` (not the first one
    kept: it may be cut), and of those that began at ``start`` or later (and ended by
    ``end``)."""
    t0, fin = iters[:, 0], iters[:, 0] + iters[:, 1]
    pre = iters[1:][fin[1:] <= start][-n:, 1]
    during = iters[(t0 >= start) & (fin <= (end if end is not None else 1 << 62)), 1]
    return pre, during


def job_cost(iters: np.ndarray, start: int, end: int | None, n: int
             ) -> tuple[float | None, float | None]:
    """The job's median iteration time since ``start`` (to ``end``) over that of the ``n``
    iterations just before it, and the fraction of job time lost (None when unknown)."""
    if len(iters) < 3:
        return None, None
    pre, during = iterations_around(iters, start, n, end)
    if not len(pre) or not len(during):
        return None, None
    ratio = float(np.median(during)) / max(float(np.median(pre)), 1.0)
    return round(ratio, 4), round(max(0.0, 1.0 - 1.0 / ratio), 4)


def job_slowed(iters: np.ndarray, start: int, config: LinkRateConfig) -> bool:
    """Whether the job slowed down since ``start`` as the slow-down detector's change
    tracker confirms: its median iteration since then is ``min_job_slowdown`` or more
    above the healthy level and ``stand_out_sigmas`` robust deviations above it. The
    healthy level is the lower quartile of the ``slowed_reference_iterations`` before (a
    slow-down only adds time, so one that ended among them does not raise it); the
    deviation comes from their successive differences (a level shift among them does not
    widen it). False while no iteration began since ``start``."""
    pre, during = iterations_around(iters, start, config.slowed_reference_iterations)
    if len(pre) < 3 or not len(during):
        return False
    level = float(np.percentile(pre, 25))
    sigma = 1.4826 * float(np.median(np.abs(np.diff(pre)))) / np.sqrt(2.0)
    now = float(np.median(during))
    return bool(now >= level * (1.0 + config.min_job_slowdown)
                and now > level + config.stand_out_sigmas * sigma)
