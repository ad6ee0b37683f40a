"""Pipeline schedules: the fixed operation sequence each pipeline stage runs per iteration.

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
"""

from __future__ import annotations

from dataclasses import dataclass

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
