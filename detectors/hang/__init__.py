"""Hang detection, classification and localisation (CCL-D §2.2, §4.2; MEGATRACE §III-C).

Detection (CCL-D §4.2.1, MEGATRACE Algorithm 1 line 3): an operation with an ``enter`` and no
``end`` that has been in flight longer than ``n x T_expected`` is stuck. ``T_expected`` is
learned per (communicator, operation, size class) from completed history (a high quantile of
the last ``history`` end-enter durations, at least the longest ever: a periodic long
collective is normal after its first occurrence), pooled over the communicators of the same
size while a communicator's own history is short, and clamped to ``[floor_ns, ceiling_ns]``;
CCL-D's 5-minute cutoff is the ceiling and the threshold of operations never seen completing
and of small operations that once blocked for seconds (synchronisation points where ranks wait
while one works on the host: checkpoint writes, evaluation). Tiny allreduces
(<= ``barrier_bytes``, CCL-D's barrier filter) never trigger. A rank that emits nothing for
``n x`` its longest usual gap while a peer waits for it is a hang too (MEGATRACE's heartbeat
timeout); nobody waiting (a pause with nothing in flight) is not. Detection runs on
``on_tick`` as time passes, and on ``update`` at the latest record time.

Time is judged per rank up to its *horizon*, ``now`` less its delivery lag (how far its newest
records trail the job's newest when they arrive): a rank whose records come late (a slow
collector, a lagging partition) is not taken for one that stopped, and its operations do not
age early.

Classification (CCL-D §4.2.2, Figure 7) over the Trace ID ``(comm, seq)`` of the stuck round
(for send/recv: the k-th operation between a sender and a receiver, events.md):

* H1 ``not_entered``: a member's seq counter on the communicator is behind the round (for
  send/recv: the peer has not posted the matching k-th operation). That member is the root,
  once it has been silent for ``idle_floor_ns``: only H1 can be mimicked by a healthy rank
  that is merely busy on the host (a GC pause, a checkpoint write) while its peers wait.
* H2 ``inconsistent``: everyone entered but with different operations or byte counts (the
  deviating minority is the root; a tie goes against the signature the sibling
  communicators called at that seq, else against the one the members called one iteration
  earlier, else against the rarer in history), or some members completed the round while
  the others hang (CCL-D: "the non-hang ranks are the root cause").
* H3 ``hardware``: everyone entered consistently and nothing completes. The rank with the
  fewest send/recv steps (``progress`` rows, compared within the round) is the root; a queue
  pair whose posted work requests accumulate without completions (MEGATRACE §III-B2, §III-C
  step 2) names the link, and the report waits a few link samples for that evidence. A member
  that holds in flight rounds its peers completed *and passed* stopped completing work (its
  device: a GPU error), which is H3 with that member as root, not H2.
  An all-entered round is stuck from its *last* entry on (the transfer cannot start before:
  CCL-D §4.1), so a member that arrives late and then completes is neither H1 nor H3.

Cascades: the wait graph goes rank -> its head operations (the earliest in flight: a rank runs
its calls in order, later ones are queued behind) -> the members missing from those rounds.
It is followed from every stuck operation to a root: an idle rank (H1), a round every member
entered (H2/H3), or a hang already reported (the operation is a victim: no new report). One
anomaly is reported per root, with MEGATRACE's *halt point*: the first operation the root
failed to call or complete in its own program order (a pipeline or data-parallel round
counts only once a rank in lockstep with the root, a member of its TP or CP group, reached
the same point), and the training stage (§III-C step 3). The halt point is placed in the
1F1B or GPipe schedule rebuilt from ``meta`` (:func:`failslow.schedule.stage_program`): for
pipeline send/recv from the direction and the pair index, for tensor- and context-parallel
collectives from the last pipeline transfer or data-parallel sync before them among the rank's
recent operations; ``extra`` carries ``pass`` (forward/backward), ``microbatch`` and
``schedule_phase`` (warmup/steady/cooldown).

Modules: :mod:`.config` (thresholds), :mod:`.tables` (vectorised keyed tables),
:mod:`.comms` (communicators and members), :mod:`.flight` (the in-flight table and seq
counters), :mod:`.history` (durations, completed signatures), :mod:`.ranks` (per-rank clocks,
recent operations), :mod:`.links` (queue pairs), :mod:`.state` (snapshots),
:mod:`.detector` (:class:`HangDetector`: ingestion and detection), :mod:`.ras` (NCCL RAS
findings, ``ras`` rows: evidence beside the ``coll`` rows, and hangs RAS alone shows where
those stopped), and per detection pass
:mod:`.graph` (the wait graph), :mod:`.classify` (H2/H3), :mod:`.halt` (halt point in the
schedule) and :mod:`.reports`. The benchmark ``failslow bench hang`` is
:mod:`failslow.bench.hang`.
"""

from __future__ import annotations

from failslow.detectors.hang.config import HangConfig
from failslow.detectors.hang.detector import HangDetector, replay_with_ticks
from failslow.schedule import schedule_phase, stage_program

__all__ = ["HangConfig", "HangDetector", "replay_with_ticks", "schedule_phase", "stage_program"]
