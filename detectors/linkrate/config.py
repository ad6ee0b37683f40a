"""Settings of the link-rate detector (:mod:`failslow.detectors.linkrate`)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class LinkRateConfig:
    """Thresholds of the per-link transfer-rate rule (MEGATRACE §III-B's bandwidth drop,
    VCCL's queue condition). A window is one job iteration long (its baseline duration)."""

    #: a link is degraded when its rate is this many times lower than its own baseline
    #: and than its peers' median: MEGATRACE §III-B's 20% bandwidth drop (1 / 0.8);
    #: persistence (below), not a larger drop, keeps jitter out
    factor: float = 1.25
    #: with ``link`` rows at the link's ends, VCCL's queue condition must hold too (a queue
    #: pair of one end towards the other's node filled) unless the drop in coll timing
    #: alone is this large: every hop of a slow ring is slower in coll timing, and the
    #: queues single out the slow one
    factor_without_queue_growth: float = 1.8
    #: a degraded link is healthy again below this rate ratio (hysteresis)
    relief_factor: float = 1.1
    #: windows of a link's own baseline (its first judged windows not slower than its peers)
    baseline_windows: int = 5
    #: window length in job iterations (the baseline iteration time)
    window_iterations: float = 1.0
    #: window length when no iteration time is known after ``staging_s`` of trace
    fallback_window_s: float = 1.0
    staging_s: float = 20.0
    #: persistence: of the last ``persist_windows`` judged windows of a link, enough must be
    #: degraded that a healthy link with ``chance`` per window would do so with probability
    #: below ``alpha`` (binomial tail): 3 of 4 by default (4.8e-4 by chance; 4 of 6 is
    #: below alpha too, but one window later)
    persist_windows: int = 4
    chance: float = 0.05
    alpha: float = 1e-3
    #: a strong drop persists sooner: a link this many times slower than its own baseline
    #: and its peers' median in every one of its last ``strong_count()`` judged windows
    #: (2: a healthy link does so with ``strong_chance`` per window, 4e-4 for two in a
    #: row). In 10 clean held-out jobs 15 of 67,434 link windows reached 1.5, each alone
    #: (pauses), none twice in a row; degraded DP links run 1.9-3.7x slower window after
    #: window (issue 14, deliverable 6: latency at most 3 iterations)
    strong_factor: float = 1.5
    strong_chance: float = 0.02
    #: consecutive healthy windows that close a report
    close_windows: int = 3
    #: transfers smaller than this are latency-bound: no rate
    min_bytes: int = 1 << 20
    #: peers (other links of the same communicator kind, op and bytes) needed for the
    #: comparison with peers; with fewer, the link's own baseline decides alone
    min_peers: int = 3
    #: VCCL's queue condition with ``link`` rows: the time-averaged in-flight work
    #: requests of a queue pair at the link's ends grew by this factor (plus ``queue_abs``)
    queue_factor: float = 2.0
    queue_abs: float = 0.05
    queue_min_wrs: int = 4
    #: the job cost below which a degraded link is ``info`` (absorbed) rather than
    #: ``warning``
    info_cost: float = 0.02
    #: a link degraded while the job slowed down with it (``min_job_slowdown`` below)
    #: waits this many windows after its persistence for the slow-down detector to name
    #: the link itself (no duplicate). That detector names a slow-down it can localize in
    #: 2-3 iterations; waiting longer only makes the slow-downs it cannot localize late
    #: (issue 14: at most 5 iterations)
    defer_windows: int = 1
    #: job iterations before the onset that form the cost's reference
    cost_reference_iterations: int = 10
    #: a job slow-down since a link degraded is the slow-down detector's to name (the link
    #: waits for it) when that detector is localizing it, or when the job's median
    #: iteration is this much above its healthy level (the least change its change tracker
    #: confirms, ``ChangeConfig.threshold``) and ``stand_out_sigmas`` robust deviations
    #: above it; the healthy level is the lower quartile of this many iterations before
    min_job_slowdown: float = 0.04
    stand_out_sigmas: float = 3.0
    slowed_reference_iterations: int = 40
    #: pending rows older than this (trace time) are dropped
    max_pending_s: float = 120.0

    def open_count(self) -> int:
        """Degraded windows among ``persist_windows`` needed to report (binomial tail)."""
        n, p = self.persist_windows, self.chance
        for k in range(1, n + 1):
            tail = sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))
            if tail < self.alpha:
                return k
        return n

    def strong_count(self) -> int:
        """Consecutive strongly degraded windows that report: the fewest a healthy link
        shows by chance with probability below ``alpha``."""
        n = 1
        while self.strong_chance ** n >= self.alpha and n < self.persist_windows:
            n += 1
        return n
