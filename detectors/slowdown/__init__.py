"""Slow-down detection and root-cause localization (CCL-D §4.2, Greyhound §4.2-4.3,
MEGATRACE §III).

Accounting, per batch of records (vectorized; a batch costs no per-row Python):

1. :class:`RoundJoiner` joins ``enter``/``end`` rows into *rounds*: a collective round is
   one ``(comm, seq)`` on every member (CCL-D's Trace ID); a point-to-point round is the
   k-th ``send`` from a to b matched with the k-th ``recv`` on b from a. Only incomplete
   rounds are kept as state; completed ones become :data:`failslow.results` ``rounds`` rows.
2. Every member's *wait* in a round is its duration (``end - enter``, one host clock) minus
   the round's shortest duration: it waited for the member with the shortest duration, the
   last to enter (CCL-D: "the rank with minimal communication time is the root cause").
   Waits, transfer times (``end - t_start``, else the shortest duration) and CCL-D's
   ``T_max``/``T_min`` are summed into time bins (:class:`BinTable`).
3. :class:`GapTracker`: each rank's compute, the gaps between its operations, placed in the
   1F1B schedule (forward / backward) when spans are absent (in a pure data-parallel job a
   gap counts at its middle: its one long gap per iteration ends on the boundary);
   :class:`LinkTracker`: RDMA queue-pair occupancy from ``link`` rows; GPU clocks and
   throttle reasons from ``gpu`` rows; :class:`CCLDMonitor`: CCL-D's ``T_base``,
   detection windows, threshold and repetition count per round class.

Decisions, at the end of every job iteration (:class:`~failslow.detectors.iterations.
IterationTracker`), on the data before that end only -- so they do not depend on how the
records were batched, and ``detected_ns`` is the trace time of the evidence:

4. :class:`~failslow.detectors.changepoints.ChangeTracker` turns the iteration times into
   slow *levels* (onset, further onset during an open one, relief). Where pauses make
   the iteration times too noisy to confirm a slow-down within a few iterations, the
   ranks may: when one same compute root, or one same slow link, is named in each of
   the last (at most 3) iterations, localized on their own against the healthy
   reference, the chance of that by accident joins the iteration times' sign test
   (Fisher's combination, :meth:`.anomalies.AnomalyLifecycle.corroborate`).
5. A level becomes an anomaly once its root *persists*: each slow iteration is localized
   on its own against the reference window before the onset, and a compute root (or a slow
   link) must be found again over the slow iterations (:mod:`.anomalies`),
   more often than chance allows: noise names many ranks per iteration, so a rank shared
   by two such sets is no evidence (:func:`persistence_chance`). An iteration whose window
   holds no round of the slow groups' slow operation class says nothing about them (a
   once-per-iteration sync that ends at the iteration boundary falls into every other
   window of whole time bins); nor does one shorter than healthy right after a longer one
   (a pause before a rank's first call held the boundary between them late). A first
   slow iteration several healthy iterations long is judged by its two halves; so is,
   every two slow iterations from the fourth on, the stretch since the onset when no
   root persisted iteration by iteration (a weak straggler): each half must name the
   same single root or the same link. A fail-slow is a persistent slow component; GC
   pauses and bursts of jitter hit random ranks, and such levels are dropped -- and once
   relieved, not proposed again. A further level with the same root is the same anomaly
   grown worse; with another root it is a second anomaly. A slow link and compute roots
   none of which is at an end of it found together are two faults, reported as two
   anomalies (CCL-D's S1 and S2, not S3).
6. Localization of a window against its reference window:
   * communication (Greyhound §4.3 cross-group comparison): groups (a communicator, or the
     pair of a point-to-point channel) whose transfer time grew by more than 10% over their
     own reference and beyond the median of their *comparable cluster* (same kind, op and
     bytes) -- or the whole cluster when a link every group crosses is slow; the link is
     the node pair the slow groups' edges share (ring-neighbour analysis, ties broken by
     queue-pair occupancy), named by two ranks at its ends (the edge whose queue pairs
     alone filled, with ``link`` rows); a group's noise is its own reference spread, at
     least its comparable cluster's pooled spread;
   * computation: ranks whose own compute per iteration grew by a share of the time lost
     and whom their peers wait on more (MEGATRACE: the timing of the calls shows the
     computation), else the sinks of the wait-for graph (each rank's largest time bin
     left out, a pause's place, except in one iteration's window for a rank that
     computes in a few long gaps); the stage from spans or from the schedule, judged
     again over the first ``refine_iterations`` of the anomaly;
   * both: mixed (CCL-D S3), when a compute root is an end of the slow link (or of a slow
     edge over the link's node pair). One anomaly: ``cause`` ``mixed``, ``ranks`` the slow
     rank (not its link peer), ``link`` the slow link named as for a communication anomaly
     (the simulator's convention: the rank and its peer when that pair alone is slow, the
     first pipeline pair of a slow node pair). Two sides of it that a share of the lost
     time would miss: the root's own transfers, ``own_link_ratio`` slower than their
     reference, are its slow link however little time they cost (a late arrival leaves a
     transfer, timed from the last entry, as it was); and when the link took most of the
     time, an end of it whose compute grew and stands out of every other rank
     (``minor_share``, ``minor_lead``) is the slow rank. Likewise a second straggler whose
     slowness a stronger one partly hides is named next to it (one anomaly: stragglers
     slowed over the same iterations are one fault, as the simulator's and the held-out
     generator's truths count them). CCL-D's ``R`` and ``P`` (:func:`.attribution.rp`)
     are reported for the communicator that shows the anomaly (P near 1: late arrival,
     computation; near 0: transfer, communication; a mixed anomaly's, of the link's),
     over the rounds from the anomaly's start on and against the ``T_base`` of the rounds
     before it, and used where the compute evidence is only the wait graph; a
     communication verdict needs ``P < alpha``.

Modules, in the order of the pipeline: :mod:`.config` (settings), :mod:`.comms`
(communicators), :mod:`.rounds` (1), :mod:`.bins` (time-binned tables), :mod:`.gaps`,
:mod:`.links` and :mod:`.accounting` (2-3), :mod:`.reducer` (1-3 for the rows one
evidence reducer is given), :mod:`.shards` (which rows, when several reducers share a
job), :mod:`.kernel` (the C forms of 1 and 3), :mod:`.ccld` (CCL-D's monitor, R and P),
:mod:`.timeline` and :mod:`.levels` (job iterations, slow levels, windows),
:mod:`.anomalies` (5), :mod:`.localizer` with :mod:`.communication`, :mod:`.compute`,
:mod:`.wait_graph` and :mod:`.attribution` (6), and :mod:`.detector`
(:class:`SlowdownDetector`, which wires them together).
"""

from failslow.detectors.slowdown.accounting import THROTTLE_MASK, BinnedStats
from failslow.detectors.slowdown.anomalies import AnomalyLifecycle
from failslow.detectors.slowdown.bins import BinTable
from failslow.detectors.slowdown.ccld import CCLDMonitor, cause_from_p, ccld_ratios
from failslow.detectors.slowdown.comms import CommRegistry, infer_comm_kind, infer_comms
from failslow.detectors.slowdown.config import (
    KIND_STAGE,
    RECV,
    SEND,
    SPAN_PASSES,
    SlowdownConfig,
)
from failslow.detectors.slowdown.detector import SlowdownDetector
from failslow.detectors.slowdown.gaps import (
    PASS_BIN_SHIFT,
    PASS_BWD,
    PASS_FWD,
    PASS_OTHER,
    GapTracker,
)
from failslow.detectors.slowdown.levels import agree, persistence_chance
from failslow.detectors.slowdown.links import LinkTracker
from failslow.detectors.slowdown.localizer import Localizer
from failslow.detectors.slowdown.rounds import RoundJoiner, Rounds, rounds_table

__all__ = [
    "KIND_STAGE", "PASS_BIN_SHIFT", "PASS_BWD", "PASS_FWD", "PASS_OTHER", "RECV", "SEND",
    "SPAN_PASSES", "THROTTLE_MASK", "AnomalyLifecycle", "BinTable", "BinnedStats",
    "CCLDMonitor", "CommRegistry", "GapTracker", "LinkTracker", "Localizer", "RoundJoiner",
    "Rounds", "SlowdownConfig", "SlowdownDetector", "agree", "cause_from_p", "ccld_ratios",
    "infer_comm_kind", "infer_comms", "persistence_chance", "rounds_table",
]
