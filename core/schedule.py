"""Pipeline schedules: the fixed operation sequence each pipeline stage runs per iteration.

The one schedule model of failslow: the simulator runs it (:mod:`failslow.simulator`), the hang
detector rebuilds it from ``meta`` to place a halt point (MEGATRACE §III-C step 3: the
expected DAG is rebuilt from the configuration), and the hang benchmarks score against it.

Follows the operation types of the what-if paper (§3.1, Table 1) and Megatron-LM's
non-interleaved schedules: an iteration starts with params-sync (DP all-gather, before the
first forward) and ends with grads-sync (DP reduce-scatter, after the last backward) and the
optimizer step.

* 1F1B (``forward_backward_pipelining_without_interleaving``): stage ``s`` of ``P`` runs
  ``w = min(P - s - 1, M)`` warm-up forwards, then ``M - w`` steady steps (a forward, a
  batched send-forward/recv-backward with the next stage, a backward, a batched
  send-backward/recv-forward with the previous stage), then ``w`` cool-down backwards.
* GPipe: all ``M`` forwards, then all ``M`` backwards.

Point-to-point operations issued together (Megatron's ``batch_isend_irecv``) form one batch;
their order inside the batch is Megatron's: send-prev, recv-prev, send-next, recv-next.

:func:`build_program` is the program as :class:`Step` records; :func:`stage_program` the same
program in the compact form the hang detector matches operations against; and
:func:`schedule_phase` where a forward or backward falls in 1F1B (warm-up, steady, cool-down).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FWD, BWD, P2P, DPSYNC, OPT = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class P2POp:
    """One send or recv between stage ``edge`` and ``edge + 1`` for micro-batch ``mb``."""

    send: bool
    peer: int     # the peer stage (its PP communicator rank)
    edge: int     # the lower stage of the pair
    grad: bool    # True: a gradient (backward pass), False: an activation (forward pass)
    mb: int

    @property
    def key(self) -> tuple[int, bool, int]:
        return (self.edge, self.grad, self.mb)


@dataclass(frozen=True)
class Step:
    """One step of a stage program; ``kind`` is FWD, BWD, P2P, DPSYNC or OPT."""

    kind: int
    mb: int = -1
    ops: tuple[P2POp, ...] = ()
    dp_op: str = ""
    compute_index: int = -1   # index among this stage's compute steps (FWD, BWD, OPT)


def build_program(schedule: str, s: int, pp: int, m: int) -> list[Step]:
    """The steps of stage ``s`` in one iteration."""
    first, last = s == 0, s == pp - 1

    def recv_fwd(k: int) -> list[P2POp]:
        return [] if first else [P2POp(False, s - 1, s - 1, False, k)]

    def send_fwd(k: int) -> list[P2POp]:
        return [] if last else [P2POp(True, s + 1, s, False, k)]

    def recv_bwd(k: int) -> list[P2POp]:
        return [] if last else [P2POp(False, s + 1, s, True, k)]

    def send_bwd(k: int) -> list[P2POp]:
        return [] if first else [P2POp(True, s - 1, s - 1, True, k)]

    steps: list[Step] = [Step(DPSYNC, dp_op="allgather")]

    def p2p(ops: list[P2POp]) -> None:
        if ops:
            steps.append(Step(P2P, ops=tuple(ops)))

    if schedule == "gpipe":
        for i in range(m):
            p2p(recv_fwd(i))
            steps.append(Step(FWD, mb=i))
            p2p(send_fwd(i))
        for i in range(m):
            p2p(recv_bwd(i))
            steps.append(Step(BWD, mb=i))
            p2p(send_bwd(i))
    elif schedule == "1f1b":
        warm = min(pp - s - 1, m)
        steady = m - warm
        for i in range(warm):
            p2p(recv_fwd(i))
            steps.append(Step(FWD, mb=i))
            p2p(send_fwd(i))
        if steady > 0:
            p2p(recv_fwd(warm))
        for i in range(steady):
            steps.append(Step(FWD, mb=warm + i))
            p2p(send_fwd(warm + i) + recv_bwd(i))
            steps.append(Step(BWD, mb=i))
            if i == steady - 1:
                p2p(send_bwd(i))
            else:
                p2p(send_bwd(i) + recv_fwd(warm + i + 1))
        for i in range(steady, m):
            p2p(recv_bwd(i))
            steps.append(Step(BWD, mb=i))
            p2p(send_bwd(i))
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    steps.append(Step(DPSYNC, dp_op="reducescatter"))
    steps.append(Step(OPT))
    out: list[Step] = []
    ci = 0
    for st in steps:
        if st.kind in (FWD, BWD, OPT):
            st = Step(st.kind, st.mb, st.ops, st.dp_op, ci)
            ci += 1
        out.append(st)
    return out


def stage_program(schedule: str, stage: int, stages: int, micro: int) -> list[tuple[str, Any]]:
    """:func:`build_program` of pipeline ``stage`` of ``stages`` as tuples, without the
    optimizer step: ``("D", "allgather")`` params-sync first, ``("F", mb)`` / ``("B", mb)``
    forward / backward compute of a micro-batch, ``("P", ops)`` one ``batch_isend_irecv``
    with ops ``(send, grad, mb)`` (``grad``: a gradient of the backward pass, else an
    activation), ``("D", "reducescatter")`` grads-sync last. Any schedule other than GPipe
    is taken as 1F1B."""
    steps: list[tuple[str, Any]] = []
    for st in build_program("gpipe" if schedule == "gpipe" else "1f1b", stage, stages, micro):
        if st.kind == FWD:
            steps.append(("F", st.mb))
        elif st.kind == BWD:
            steps.append(("B", st.mb))
        elif st.kind == P2P:
            steps.append(("P", tuple((o.send, o.grad, o.mb) for o in st.ops)))
        elif st.kind == DPSYNC:
            steps.append(("D", st.dp_op))
    return steps


def schedule_phase(schedule: str, stage: int, stages: int, micro: int, pas: str, mb: int
                   ) -> str | None:
    """``warmup``, ``steady`` or ``cooldown``: where the forward or backward (``pas``) of
    micro-batch ``mb`` falls in the 1F1B schedule of ``stage`` (None for other schedules or
    without pipeline parallelism)."""
    if schedule != "1f1b" or stages <= 1 or micro <= 0:
        return None
    warm = min(stages - stage - 1, micro)
    if pas == "forward":
        return "warmup" if mb < warm else "steady"
    return "cooldown" if mb >= micro - warm else "steady"


__all__ = ["BWD", "DPSYNC", "FWD", "OPT", "P2P", "P2POp", "Step", "build_program",
           "schedule_phase", "stage_program"]
