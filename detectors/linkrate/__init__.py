"""Degraded links even when the job absorbs them.

The slow-down detector looks for a slow link only once the *job* is slower; a link that
degrades while pipeline bubbles or overlap absorb it (or that follows a compute straggler
whose anomaly is still open) goes unreported, yet it is news for the network team. This
detector judges every link on its own:

1. *Rates* (:mod:`.samples`): per link -- a point-to-point pair, or a ring hop of a DP / TP
   / CP collective in communicator-rank order, crossing nodes -- ``bytes / transfer time``
   from each ``coll`` end row (``end - t_start``; without ``t_start``, ``end - enter`` on the
   rank's own clock, of which a window keeps the fastest). Windows are one baseline job
   iteration long; a window's rate is the median of its samples.
2. *Degraded* (MEGATRACE §III-B's bandwidth rule, its 20% drop): the rate is ``factor``
   (1.25) times lower than the link's own baseline (the median of its first
   ``baseline_windows`` windows not slower than its peers) *and* than its peers' (the
   median of the links of the same communicator kind, op, bytes and size in that window,
   when there are ``min_peers``). With ``link`` rows at the link's ends (:mod:`.queues`),
   VCCL's queue condition must hold too, over the link's degraded windows: a queue pair of
   one end towards the other's node holds more in-flight work requests than in its
   baseline (or coll timing alone shows ``factor_without_queue_growth``, 1.8). Without
   them, coll timing decides.
3. *Persistent*: of the last ``persist_windows`` judged windows, at least as many degraded as
   a healthy link would show with probability below ``alpha`` (binomial tail, chance 5% per
   window; 3 of 4 by default): GC pauses and jitter do not persist on one link. A strong
   drop (``strong_factor``, 1.5x against both) persists after ``strong_count`` windows in a
   row (2: chance ``strong_chance`` per window), unless the job slowed down with the link
   (:meth:`LinkRateDetector._slowdown_ahead`: the slow-down detector is localizing it, or
   the job's iterations rose by that detector's threshold beyond their noise): such a
   slow-down is the slow-down detector's to name, and the count above decides.
4. *Localized*: a point-to-point pair is its own link. In a ring the slowest hop sets every
   member's time, so coll timing slows every hop of that ring: the hop is pinned by the
   queue condition (one hop's queue grew), or when all degraded hops cross one node pair
   (then named by convention, as the slow-down detector does: a PP pair first, then DP, TP,
   CP ring edges, lowest rank first); otherwise the ring is reported with ``link`` null, its
   candidate node pairs and the reason in ``extra``. Pinned links over one node pair (a
   node-level fault slows every pair crossing it) are one anomaly. Hops of a ring that
   turn persistent after it was reported without a link join that report (reported again,
   same id): which hop crosses the count first is chance, not evidence.
5. *Reported* as ``slow`` / ``communication`` with ``ranks`` = the link's ends, ``link``,
   ``comm`` / ``comm_kind`` / ``stage``; ``slowdown`` = the job's median iteration time since
   the link degraded over the ``cost_reference_iterations`` before (close to 1 when
   absorbed); ``extra``: ``severity`` (``info`` when the job cost is under ``info_cost``,
   2%, else ``warning``), ``link_slowdown`` (the rate ratio against its own baseline),
   ``peer_slowdown``, ``queue_growth``, ``cost_fraction`` (1 - 1/slowdown), ``absorbed``
   (cost under ``info_cost``), ``localized_by``, ``nodes``, ``links``. Opened once, closed
   (``end_ns``) after ``close_windows`` healthy windows.

No duplicates of the slow-down detector: a link another detector's slow communication or
mixed anomaly already names (same node pair, or for a ring without a link its communicator
or node pairs), overlapping in time, is skipped. So is a ring that no grown queue pinned
when a compute anomaly overlapping it names one of its members: a straggler slows its own
ring in coll timing (CCL-D §4.2), and a slow link next to it is the mixed cause. A
degraded link while the job slowed down with it (the same test) is held back
``defer_windows`` windows so that the slow-down detector, which
localizes such slow-downs itself, names it first; only if it does not is it reported
here. An open report whose link the slow-down detector names later (or, for a
ring, whose member it names as a compute root) is closed then, with
``extra.superseded_by`` = that anomaly's id: the link escalated from absorbed to a job
slow-down, and that anomaly carries it from there.
"""

from failslow.detectors.linkrate.config import LinkRateConfig
from failslow.detectors.linkrate.detector import LinkRateDetector

__all__ = ["LinkRateConfig", "LinkRateDetector"]
