"""The dependency-driven executor: per-rank programs timed with rings of hops, jitter,
bursts and pauses, and the injected faults."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .model import MS, T0, US, Fault, Layout, Spec


class Noise:
    def __init__(self, spec: Spec, seed: int) -> None:
        self.spec = spec
        self.rng = np.random.default_rng(seed)
        self.seqlen = np.exp(
            self.rng.normal(0, spec.seqlen_sigma, (spec.iterations, spec.dp, spec.microbatches))
        )
        n_nodes = (spec.world + spec.gpus_per_node - 1) // spec.gpus_per_node
        self.burst = np.where(
            self.rng.random((spec.iterations, n_nodes)) < spec.burst_prob,
            self.rng.uniform(1.10, 1.25, (spec.iterations, n_nodes)),
            1.0,
        )
        self.gc = np.where(
            self.rng.random((spec.iterations, spec.world)) < spec.gc_prob,
            self.rng.uniform(20, 90, (spec.iterations, spec.world)),
            0.0,
        )

    def factor(self, shape: str, scale: float, size: int | tuple[int, int] | None = None) -> Any:
        g = self.rng
        if shape == "pareto":  # heavy right tail, minimum 1 - scale/2
            x = 1 - scale / 2 + scale * 0.5 * (g.pareto(2.2, size))
        elif shape == "bimodal":
            x = np.where(g.random(size) < 0.3, 1 + 3 * scale, 1.0) * g.uniform(
                1 - scale / 3, 1 + scale / 3, size
            )
        elif shape == "uniform":
            x = g.uniform(1 - scale, 1 + scale, size)
        else:
            x = np.exp(g.normal(0, scale, size))
        return x


@dataclass
class Op:
    rank: int
    comm: int
    seq: int
    op: str
    nbytes: int
    peer: int
    enter: float
    it: int
    key: tuple[Any, ...]
    kind: str
    end: float | None = None
    start: float | None = None
    steps: int = 0
    stall_steps: tuple[int, int] | None = None
    h3: bool = False


def _fault_active(f: Fault, it: int) -> bool:
    return f.start <= it < (f.end if f.end is not None else 1 << 30)


class Executor:
    """Runs the programs: a group of operations is entered at once; a rank resumes when all
    the group's operations completed; an operation completes when all its participants
    entered (and its inputs agree)."""

    def __init__(self, spec: Spec, lay: Layout, progs: list[list[tuple[Any, ...]]]) -> None:
        self.spec, self.lay, self.progs = spec, lay, progs
        self.noise = Noise(spec, spec.seed + 1)
        self.ops: list[Op] = []
        self.rounds: dict[tuple[Any, ...], list[Op]] = {}
        self.hung: list[tuple[Fault, Op | None, float]] = []  # (fault, op, true time)
        self.iter_end = np.full((spec.iterations, spec.world), np.nan)
        self.iter_start = np.full((spec.iterations, spec.world), np.nan)

    def compute_ms(self, r: int, step: tuple[Any, ...]) -> float:
        _, ms, phase, it, mb = step
        s = self.spec
        c = self.lay.coord[r]
        x = ms * float(self.noise.factor(s.jitter, s.jitter_scale))
        if mb >= 0:
            x *= self.noise.seqlen[it, c["dp"], mb]
        return x * self.gpu_factor(r, it, phase)

    def gpu_factor(self, r: int, it: int, phase: str | None) -> float:
        """The compute model of rank ``r``'s GPU in iteration ``it``: how much slower than
        nominal it runs ``phase`` (``f``/``b``/``o``; None: work of no pass, such as a probe's
        GEMM, slowed only by what slows every pass): its node's burst and its faults."""
        x = float(self.noise.burst[it, self.lay.node[r]])
        for f in self.spec.faults:
            if (
                f.cause == "compute"
                and f.rank == r
                and _fault_active(f, it)
                and (f.phase is None or f.phase == phase)
            ):
                x *= f.factor
        return x

    def link_factor(self, a: int, b: int, it: int) -> float:
        x = 1.0
        for f in self.spec.faults:
            if f.cause == "communication" and {a, b} == {f.rank, f.peer} and _fault_active(f, it):
                x *= f.factor
        return x

    def path(self, a: int, b: int, it: int) -> tuple[float, float]:
        """The network model of the path a -> b in iteration ``it``: bytes per ns and latency
        in ns. Every transfer of the trace (ring hops, point-to-point messages) and every
        probe of :mod:`failslow.bench.heldout_probes` is timed by it."""
        bw, lat = self.lay.bw_lat(a, b)
        return bw / self.link_factor(a, b, it), lat

    def transfer_ns(self, ops: list[Op]) -> float:
        s = self.spec
        o = ops[0]
        if o.op in ("send", "recv"):
            snd = next(x for x in ops if x.op == "send")
            rcv = next(x for x in ops if x.op == "recv")
            bw, lat = self.path(snd.rank, rcv.rank, o.it)
            return (lat + o.nbytes / bw) * float(self.noise.factor(s.comm_jitter, 0.05))
        members = [x.rank for x in sorted(ops, key=lambda x: self.comm_rank(x))]
        n = len(members)
        hop = np.empty(n)
        for i in range(n):
            a, b = members[i], members[(i + 1) % n]
            bw, lat = self.path(a, b, o.it)
            chunk = o.nbytes / n if o.op == "allreduce" else o.nbytes
            hop[i] = lat + chunk / bw
        steps = 2 * (n - 1) if o.op == "allreduce" else n - 1
        for x in ops:
            x.steps = steps
        jit = self.noise.factor(s.comm_jitter, 0.04, (steps, n))
        return float((hop[None, :] * jit).max(axis=1).sum())

    def comm_rank(self, o: Op) -> int:
        return self.lay.comms[o.comm][2].index(o.rank)

    def resolve(self, key: tuple[Any, ...], ops: list[Op]) -> bool:
        """All participants entered: complete the round unless a hang fault holds it."""
        start = max(x.enter for x in ops)
        sig = {(x.op if x.op not in ("send", "recv") else "p2p", x.nbytes) for x in ops}
        if len(sig) > 1:  # H2: the round never completes
            for x in ops:
                x.stall_steps = (0, 0)
            return False
        for f in self.spec.faults:
            if f.cause == "hardware" and any(x.h3 and x.rank == f.rank for x in ops):
                steps = max(2, 2 * (len(ops) - 1))
                k = steps // 2
                for x in ops:
                    x.start = start + 2 * US
                    x.steps = steps
                    x.stall_steps = (k, k) if x.rank == f.rank else (k + 1, k + 1)
                self.hung.append((f, next(x for x in ops if x.rank == f.rank), start))
                return False
        dur = self.transfer_ns(ops)
        for x in ops:
            x.start = start + float(self.noise.rng.uniform(0, 3 * US))
            x.end = start + dur + float(self.noise.rng.uniform(0, 20 * US))
        return True

    def run(self) -> None:
        s, lay = self.spec, self.lay
        W = s.world
        clock = [T0 + float(self.noise.rng.uniform(0, 2 * MS)) for _ in range(W)]
        pc = [0] * W
        waiting: list[list[Op]] = [[] for _ in range(W)]
        dead = [False] * W
        seq: dict[tuple[int, int], int] = {}
        ncoll: dict[tuple[int, int], int] = {}
        np2p: dict[tuple[int, int, int, str], int] = {}
        hang_count: dict[int, int] = {}
        hang_faults = [
            f for f in s.faults if f.cause in ("not_entered", "inconsistent", "hardware")
        ]
        work = list(range(W))
        last_it = [-1] * W
        while work:
            r = work.pop()
            if dead[r]:
                continue
            if waiting[r]:
                if any(o.end is None for o in waiting[r]):
                    continue
                clock[r] = max(o.end for o in waiting[r] if o.end is not None) + 6 * US
                waiting[r] = []
                pc[r] += 1
            prog = self.progs[r]
            while pc[r] < len(prog):
                step = prog[pc[r]]
                it = step[3] if step[0] == "c" else step[2]
                if it != last_it[r]:
                    if last_it[r] >= 0:
                        self.iter_end[last_it[r], r] = clock[r]
                    self.iter_start[it, r] = clock[r]
                    last_it[r] = it
                    gc = self.noise.gc[it, r]
                    if gc:
                        clock[r] += gc * MS
                    for p_it, p_s, p_ranks in s.pauses:
                        if p_it == it and (not p_ranks or r in p_ranks):
                            clock[r] += p_s * 1e9
                if step[0] == "c":
                    clock[r] += self.compute_ms(r, step) * MS
                    pc[r] += 1
                    continue
                _, ops, it, tag = step
                # hang faults hitting this group: the index-th group of that kind
                hit: Fault | None = None
                for fi, f in enumerate(hang_faults):
                    if (
                        f.rank == r
                        and f.start == it
                        and tag[0] == f.comm
                        and (f.comm == "dp" or tag[2] == f.microbatch)
                    ):
                        n = hang_count.get(fi, 0)
                        hang_count[fi] = n + 1
                        if n == f.index:
                            hit = f
                if hit is not None and hit.cause == "not_entered":
                    dead[r] = True
                    self.hung.append((hit, None, clock[r]))
                    break
                entered: list[Op] = []
                t = clock[r]
                for ci, name, nbytes, pcr, _peer in ops:
                    sk = (ci, r)
                    q = seq.get(sk, 0)
                    seq[sk] = q + 1
                    if name in ("send", "recv"):
                        me = lay.comms[ci][2].index(r)
                        src, dst = (me, pcr) if name == "send" else (pcr, me)
                        pk = (ci, src, dst, name)
                        k = np2p.get(pk, 0)
                        np2p[pk] = k + 1
                        key: tuple[Any, ...] = (ci, src, dst, k)
                        kind = "p2p"
                    else:
                        k = ncoll.get(sk, 0)
                        ncoll[sk] = k + 1
                        key = (ci, "coll", k)
                        kind = "coll"
                    o = Op(r, ci, q, name, nbytes, pcr, t, it, key, kind)
                    if hit is not None and hit.cause == "inconsistent" and not entered:
                        if hit.mismatch == "op" and kind == "coll":
                            o.op = "allgather" if name != "allgather" else "reducescatter"
                        else:
                            o.nbytes = nbytes // 2
                    if hit is not None and hit.cause == "hardware" and not entered:
                        o.h3 = True
                    t += 2 * US
                    self.ops.append(o)
                    entered.append(o)
                    members = self.rounds.setdefault(key, [])
                    members.append(o)
                    need = 2 if kind == "p2p" else len(lay.comms[ci][2])
                    if len(members) == need and self.resolve(key, members):
                        for x in members:
                            if x.rank != r:
                                work.append(x.rank)
                if hit is not None and hit.cause == "inconsistent":
                    self.hung.append((hit, entered[0], t))
                clock[r] = t
                if all(o.end is not None for o in entered):
                    clock[r] = max(o.end for o in entered if o.end is not None) + 6 * US
                    pc[r] += 1
                    continue
                waiting[r] = entered
                break
            else:
                if last_it[r] >= 0:
                    self.iter_end[last_it[r], r] = clock[r]
        if not hang_faults:
            stuck = [r for r in range(W) if pc[r] < len(self.progs[r])]
            if stuck:
                raise RuntimeError(f"deadlock in the held-out program at ranks {stuck[:8]}")
