"""Per-rank programs: Megatron's 1F1B order of passes, TP all-reduces inside each pass,
the DP gradient synchronization per iteration."""

from __future__ import annotations

from typing import Any

from .model import Layout, Spec


def rank_programs(spec: Spec, lay: Layout) -> list[list[tuple[Any, ...]]]:
    """Per rank, its steps in order: ``("c", ms, phase, it)`` computes, ``("g", [op, ...],
    it, tag)`` is a group of communication operations."""
    progs: list[list[tuple[Any, ...]]] = []
    P, M = spec.pp, spec.microbatches
    for r in range(spec.world):
        s = lay.coord[r]["pp"]
        prog: list[tuple[Any, ...]] = []
        tpc = lay.comm_of.get(("tp", r))
        dpc = lay.comm_of.get(("dp", r))
        stage_f = spec.last_stage if s == P - 1 else 1.0

        def p2p(
            kind: str, step: int, it: int, mb: int, prog: list[tuple[Any, ...]] = prog, r: int = r
        ) -> tuple[Any, ...]:
            peer = lay.pp_neighbour(r, step)
            ci, pcr = lay.p2p(r, peer)
            return (ci, kind, spec.pp_bytes, pcr, peer)

        def group(
            ops: list[tuple[Any, ...]],
            it: int,
            tag: tuple[Any, ...],
            prog: list[tuple[Any, ...]] = prog,
        ) -> None:
            if ops:
                prog.append(("g", ops, it, tag))

        def compute(
            phase: str,
            it: int,
            mb: int,
            prog: list[tuple[Any, ...]] = prog,
            tpc: int | None = tpc,
            stage_f: float = stage_f,
        ) -> None:
            ms = spec.forward_ms * stage_f * (spec.backward_ratio if phase == "b" else 1.0)
            n = spec.tp_per_pass if tpc is not None else 0
            for k in range(n + 1):
                prog.append(("c", ms / (n + 1), phase, it, mb))
                if k < n and tpc is not None:
                    prog.append(
                        (
                            "g",
                            [(tpc, "allreduce", spec.tp_bytes, -1, None)],
                            it,
                            ("tp", phase, mb, k),
                        )
                    )

        for it in range(spec.iterations):
            warm = min(P - s - 1, M)
            rest = M - warm
            fwd = bwd = 0
            for _ in range(warm):
                if s > 0:
                    group([p2p("recv", -1, it, fwd)], it, ("pp", "f", fwd, 0))
                compute("f", it, fwd)
                if s < P - 1:
                    group([p2p("send", 1, it, fwd)], it, ("pp", "f", fwd, 1))
                fwd += 1
            if rest > 0 and s > 0:
                group([p2p("recv", -1, it, fwd)], it, ("pp", "f", fwd, 0))
            for i in range(rest):
                compute("f", it, fwd)
                if s < P - 1:
                    group(
                        [p2p("send", 1, it, fwd), p2p("recv", 1, it, bwd)], it, ("pp", "f", fwd, 1)
                    )
                fwd += 1
                compute("b", it, bwd)
                if s > 0:
                    if i == rest - 1:
                        group([p2p("send", -1, it, bwd)], it, ("pp", "b", bwd, 1))
                    else:
                        group(
                            [p2p("send", -1, it, bwd), p2p("recv", -1, it, fwd)],
                            it,
                            ("pp", "b", bwd, 1),
                        )
                bwd += 1
            for _ in range(warm):
                if s < P - 1:
                    group([p2p("recv", 1, it, bwd)], it, ("pp", "b", bwd, 0))
                compute("b", it, bwd)
                if s > 0:
                    group([p2p("send", -1, it, bwd)], it, ("pp", "b", bwd, 1))
                bwd += 1
            if dpc is not None:
                if spec.dp_mode == "rs_ag":
                    n = len(lay.comms[dpc][2])
                    group(
                        [(dpc, "reducescatter", spec.dp_bytes // n, -1, None)],
                        it,
                        ("dp", "rs", 0, 0),
                    )
                    prog.append(("c", spec.optimizer_ms, "o", it, -1))
                    group(
                        [(dpc, "allgather", spec.dp_bytes // n, -1, None)], it, ("dp", "ag", 0, 1)
                    )
                else:
                    group([(dpc, "allreduce", spec.dp_bytes, -1, None)], it, ("dp", "ar", 0, 0))
                    prog.append(("c", spec.optimizer_ms, "o", it, -1))
                if spec.small_allreduce:
                    group([(dpc, "allreduce", 4, -1, None)], it, ("dp", "loss", 0, 2))
            else:
                prog.append(("c", spec.optimizer_ms, "o", it, -1))
        progs.append(prog)
    return progs
