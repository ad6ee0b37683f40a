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
    #: ``warning``; at or above it the report waits ``defer_windows`` windows for the
    #: slow-down detector to name the link itself (no duplicate). That detector names a
    #: slow-down it can localize in 2-3 iterations, before this one's persistence
    #: (``open_count`` of ``persist_windows``) is met; waiting longer only makes the
    #: slow-downs it cannot localize late (issue 14: at most 5 iterations)
    info_cost: float = 0.02
    defer_windows: int = 1
    #: job iterations before the onset that form the cost's reference
    cost_reference_iterations: int = 10
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
