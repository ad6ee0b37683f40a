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
  slow-down during an open one is its own onset. A caller with evidence of its own
  (the slow-down detector: one rank the root of every slow iteration) may confirm an onset
  of a few values together with the series' test (Fisher's combination,
  :meth:`ChangeTracker._corroborated`).
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

Modules: :mod:`.candidates` (BOCD, sliding window), :mod:`.tracker` (verification and the
online state machine), :mod:`.iteration_series` (whole iteration-time series, the three
methods) and :mod:`.segmentation` (any series).
"""

from failslow.detectors.changepoints.candidates import (
    BOCD,
    DEFAULT_THRESHOLD,
    BOCDConfig,
    bocd_candidates,
    window_candidates,
)
from failslow.detectors.changepoints.iteration_series import (
    METHODS,
    changepoints,
    detect_changepoints,
)
from failslow.detectors.changepoints.segmentation import (
    SERIES_METHODS,
    bocpd_map,
    segment,
    standardize,
    verify,
    window_series,
    winsorize,
)
from failslow.detectors.changepoints.tracker import (
    Change,
    ChangeConfig,
    ChangeTracker,
    binom_sf,
    fisher_combined,
    run_chance,
)

__all__ = [
    "BOCD", "DEFAULT_THRESHOLD", "METHODS", "SERIES_METHODS", "BOCDConfig", "Change",
    "ChangeConfig", "ChangeTracker", "binom_sf", "bocd_candidates", "bocpd_map", "changepoints",
    "detect_changepoints", "fisher_combined", "run_chance", "segment", "standardize", "verify",
    "window_candidates", "window_series", "winsorize",
]
