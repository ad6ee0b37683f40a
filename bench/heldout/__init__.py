"""A held-out trace generator, independent of ``failslow.simulator`` (issue 3, last floor).

It writes event-contract traces (shared/spec/events.md: ``meta`` + ``coll``, optionally
``progress`` and ``link``) of a TP x PP x DP job with its own model of time, so that the
detectors are tested against variations they were not designed for:

* a dependency-driven executor of per-rank programs (Megatron's 1F1B order of
  forward/backward passes with ``send_forward_recv_backward`` groups; TP all-reduces inside
  each pass; a DP gradient all-reduce, or reduce-scatter + all-gather, per iteration);
* collectives timed as rings with a per-hop latency and bandwidth, each of the ring's steps
  waiting for its slowest hop; point-to-point messages timed by the link they cross;
* heavy-tailed jitter (log-normal, Pareto, bimodal), per-node bursts, GC pauses;
* per-node clock offsets *and* drift, ``t_start`` missing on some rows, ``meta.comms`` empty
  (communicators to be inferred), other rank orders than Megatron's, JSON Lines or Parquet,
  rows shuffled;
* injected faults with known truth: a compute straggler, a slow link between two ranks (on
  the PP path or on a DP ring hop), and hangs of each CCL-D class (H1 ``not_entered``, H2
  ``inconsistent``, H3 ``hardware``), MEGATRACE §III-C / CCL-D §2.2.

It shares no code with the simulator nor with ``tests/support/contract_gen.py``.
"""

from __future__ import annotations

from .executor import Executor, Noise, Op
from .model import DIMS, MS, T0, US, Fault, Layout, Spec
from .scenarios import scenarios
from .trace import generate, write
from .truth import STAGE, score

__all__ = ["DIMS", "MS", "STAGE", "T0", "US", "Executor", "Fault", "Layout", "Noise", "Op",
           "Spec", "generate", "scenarios", "score", "write"]
