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

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MS = 1_000_000
US = 1_000
T0 = 1_760_000_000_000_000_000
DIMS = ("tp", "dp", "pp")


@dataclass
class Fault:
    """One injected fault. ``cause``: ``compute`` | ``communication`` | ``not_entered`` |
    ``inconsistent`` | ``hardware``. Slow faults last iterations ``[start, end)``; hangs hit
    the ``index``-th operation of kind ``comm`` (``tp``/``pp``/``dp``) of ``rank`` in
    iteration ``start`` (for ``tp``/``pp``: in micro-batch ``microbatch``)."""

    cause: str
    rank: int
    peer: int | None = None  # communication: the other end of the slow link
    start: int = 12
    end: int | None = None
    factor: float = 2.0
    comm: str = "tp"
    microbatch: int = 1
    index: int = 0
    mismatch: str = "bytes"  # inconsistent: "bytes" or "op"
    phase: str | None = None  # compute: only this pass is slowed, "f" or "b" (None: all)


@dataclass
class Spec:
    """A whole held-out job. Times in ms unless named otherwise."""

    tp: int = 2
    pp: int = 2
    dp: int = 4
    microbatches: int = 4
    iterations: int = 36
    order: tuple[str, ...] = ("tp", "dp", "pp")  # fastest-varying dimension first
    gpus_per_node: int = 8
    forward_ms: float = 3.0
    backward_ratio: float = 2.0
    optimizer_ms: float = 2.0
    last_stage: float = 1.1
    tp_per_pass: int = 2
    tp_bytes: int = 8 << 20
    pp_bytes: int = 8 << 20
    dp_bytes: int = 256 << 20
    dp_mode: str = "allreduce"  # or "rs_ag" (distributed optimizer)
    pp_comm: str = "pipeline"  # one PP group per pipeline, or "pair"
    small_allreduce: bool = False  # a 4-byte loss all-reduce per iteration
    intra_gbps: float = 150.0
    inter_gbps: float = 20.0
    intra_lat_us: float = 4.0
    inter_lat_us: float = 12.0
    jitter: str = "lognormal"  # lognormal | pareto | bimodal | uniform
    jitter_scale: float = 0.03
    comm_jitter: str = "pareto"
    seqlen_sigma: float = 0.03
    burst_prob: float = 0.0  # per node and iteration: node 10-25% slower
    gc_prob: float = 0.0  # per rank and iteration: 20-90 ms pause
    # host pauses (checkpoint writes, long GC): (iteration, seconds, ranks; empty: all ranks)
    # at the start of that iteration, before its first operation
    pauses: list[tuple[int, float, tuple[int, ...]]] = field(default_factory=list)
    skew_ms: float = 1.5  # per-node clock offset in +-this
    drift_ppm: float = 20.0  # per-node clock drift in +-this
    clock_step_ms: float = 0.0  # node 1's clock jumps by this (NTP step)
    clock_step_s: float = 1.0  # ... this long after the job start
    missing_t_start: float = 0.0  # chance an end row has no t_start
    comms_in_meta: bool = False
    meta_degrees: bool = True  # microbatches/schedule known in meta
    fmt: str = "jsonl"
    shuffle: bool = True
    progress_ms: float = 50.0  # 0: no progress rows
    link_rows: bool = False
    link_ms: float = 20.0
    tail_s: float = 15.0  # how long a hung job keeps being traced
    post_mortem: bool = False  # import.json says post-mortem
    seed: int = 0
    job: str = "heldout"
    faults: list[Fault] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


# ---------------------------------------------------------------------------------------------
# layout


class Layout:
    """Ranks, nodes and communicators under ``spec.order`` (fastest dimension first)."""

    def __init__(self, spec: Spec, rng: random.Random) -> None:
        self.spec = spec
        deg = {"tp": spec.tp, "dp": spec.dp, "pp": spec.pp}
        self.coord: list[dict[str, int]] = []
        for r in range(spec.world):
            c, x = {}, r
            for d in spec.order:
                c[d] = x % deg[d]
                x //= deg[d]
            self.coord.append(c)
        self.rank_of = {(c["tp"], c["dp"], c["pp"]): r for r, c in enumerate(self.coord)}
        n_nodes = (spec.world + spec.gpus_per_node - 1) // spec.gpus_per_node
        names = [f"h{rng.randrange(10**6):06d}-{i}" for i in range(n_nodes)]
        self.node = [r // spec.gpus_per_node for r in range(spec.world)]
        self.node_names = names
        # communicators: list of (id, kind, ranks in comm-rank order)
        self.comms: list[tuple[int, str, list[int]]] = []
        self.comm_of: dict[tuple[str, int], int] = {}  # (kind, rank) -> comm index
        groups: dict[str, dict[tuple[int, ...], list[int]]] = {"tp": {}, "dp": {}, "pp": {}}
        for r, c in enumerate(self.coord):
            groups["tp"].setdefault((c["dp"], c["pp"]), []).append(r)
            groups["dp"].setdefault((c["tp"], c["pp"]), []).append(r)
            groups["pp"].setdefault((c["tp"], c["dp"]), []).append(r)
        for kind, by in groups.items():
            for members in by.values():
                members.sort(key=lambda r, k=kind: self.coord[r][k])  # type: ignore[misc]
                if len(members) < 2:
                    continue
                if kind == "pp" and spec.pp_comm == "pair":
                    for a, b in zip(members, members[1:], strict=False):
                        self._add(rng, "pp", [a, b], pair=True)
                else:
                    self._add(rng, kind, members)
        self.pair_comm: dict[tuple[int, int], int] = {}
        for i, (_, kind, members) in enumerate(self.comms):
            if kind == "pp" and spec.pp_comm == "pair":
                self.pair_comm[(members[0], members[1])] = i

    def _add(self, rng: random.Random, kind: str, members: list[int], pair: bool = False) -> None:
        cid = rng.getrandbits(64) or 1
        self.comms.append((cid, kind, list(members)))
        if not pair:
            for r in members:
                self.comm_of[(kind, r)] = len(self.comms) - 1

    def pp_neighbour(self, r: int, step: int) -> int:
        c = self.coord[r]
        return self.rank_of[(c["tp"], c["dp"], c["pp"] + step)]

    def p2p(self, r: int, peer: int) -> tuple[int, int]:
        """(comm index, peer's comm rank) of a PP message between ``r`` and ``peer``."""
        if self.spec.pp_comm == "pair":
            a, b = sorted((r, peer), key=lambda x: self.coord[x]["pp"])
            ci = self.pair_comm[(a, b)]
        else:
            ci = self.comm_of[("pp", r)]
        return ci, self.comms[ci][2].index(peer)

    def bw_lat(self, a: int, b: int) -> tuple[float, float]:
        """Bytes per ns and latency in ns of the hop a -> b."""
        s = self.spec
        if self.node[a] == self.node[b]:
            return s.intra_gbps, s.intra_lat_us * US
        return s.inter_gbps, s.inter_lat_us * US


# ---------------------------------------------------------------------------------------------
# programs: per rank a list of steps; ("c", ms, phase, it) or ("g", [op, ...], it, tag)


def _programs(spec: Spec, lay: Layout) -> list[list[tuple[Any, ...]]]:
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


# ---------------------------------------------------------------------------------------------
# time


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


# ---------------------------------------------------------------------------------------------
# output


def _clock(spec: Spec, lay: Layout, rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    n = len(lay.node_names)
    off = np.array([rng.uniform(-spec.skew_ms, spec.skew_ms) * MS for _ in range(n)])
    drift = np.array([rng.uniform(-spec.drift_ppm, spec.drift_ppm) * 1e-6 for _ in range(n)])
    return off, drift


def generate(
    spec: Spec, keep: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, pa.Table], dict[str, Any]]:
    """(meta, tables by kind, truth) of one held-out job; ``keep`` (when given) receives the
    job's ``layout``, ``executor`` and observed clock ``obs(rank, true_ns)`` (probes of the
    generated cluster, :mod:`failslow.bench.heldout_probes`)."""
    rng = random.Random(spec.seed)
    lay = Layout(spec, rng)
    progs = _programs(spec, lay)
    ex = Executor(spec, lay, progs)
    ex.run()
    off, drift = _clock(spec, lay, rng)
    node = np.array(lay.node)

    def obs(rank: np.ndarray, t: np.ndarray) -> np.ndarray:
        n = node[rank]
        step = np.where(
            (n == 1) & (t >= T0 + spec.clock_step_s * 1e9), spec.clock_step_ms * MS, 0.0
        )
        return (t + off[n] + drift[n] * (t - T0) + step).astype(np.int64)

    if keep is not None:
        keep.update(layout=lay, executor=ex, obs=obs)
    ops = ex.ops
    rank = np.array([o.rank for o in ops], dtype=np.int32)
    enter = np.array([o.enter for o in ops])
    done = np.array([o.end is not None for o in ops])
    end = np.array([o.end if o.end is not None else 0.0 for o in ops])
    tstart = np.array([o.start if o.start is not None else 0.0 for o in ops])
    cids = np.array([lay.comms[o.comm][0] for o in ops], dtype=np.uint64)
    crank = np.array([ex.comm_rank(o) for o in ops], dtype=np.int32)
    csize = np.array([len(lay.comms[o.comm][2]) for o in ops], dtype=np.int32)
    seq = np.array([o.seq for o in ops], dtype=np.uint64)
    opn = np.array([o.op for o in ops], dtype=object)
    nbytes = np.array([o.nbytes for o in ops], dtype=np.uint64)
    peer = np.array([o.peer for o in ops], dtype=np.int32)
    chunk = 512 << 10
    p2p_steps = np.maximum(1, nbytes // chunk)
    steps = np.array([o.steps for o in ops], dtype=np.uint64)
    sendc = np.where(opn == "send", p2p_steps, np.where(opn == "recv", 0, steps))
    recvc = np.where(opn == "recv", p2p_steps, np.where(opn == "send", 0, steps))
    e_idx = np.flatnonzero(done)
    n_in, n_end = len(ops), len(e_idx)
    t_col = np.concatenate([obs(rank, enter), obs(rank[e_idx], end[e_idx])])
    ts = obs(rank[e_idx], tstart[e_idx])
    missing = np.array([rng.random() < spec.missing_t_start for _ in range(n_end)], dtype=bool)
    idx = np.concatenate([np.arange(n_in), e_idx])
    coll = pa.table(
        {
            "job": pa.array([spec.job] * (n_in + n_end)),
            "rank": pa.array(rank[idx], pa.int32()),
            "comm": pa.array(cids[idx], pa.uint64()),
            "comm_rank": pa.array(crank[idx], pa.int32()),
            "comm_size": pa.array(csize[idx], pa.int32()),
            "seq": pa.array(seq[idx], pa.uint64()),
            "op": pa.array(opn[idx].tolist(), pa.string()),
            "bytes": pa.array(nbytes[idx], pa.uint64()),
            "peer": pa.array(peer[idx], pa.int32()),
            "phase": pa.array(["enter"] * n_in + ["end"] * n_end),
            "t": pa.array(t_col, pa.int64()),
            "t_start": pa.array(
                np.concatenate([np.zeros(n_in, np.int64), ts]),
                pa.int64(),
                mask=np.concatenate([np.ones(n_in, bool), missing]),
            ),
            "send_count": pa.array(
                np.concatenate([np.zeros(n_in, np.uint64), sendc[e_idx].astype(np.uint64)]),
                pa.uint64(),
                mask=np.concatenate([np.ones(n_in, bool), np.zeros(n_end, bool)]),
            ),
            "recv_count": pa.array(
                np.concatenate([np.zeros(n_in, np.uint64), recvc[e_idx].astype(np.uint64)]),
                pa.uint64(),
                mask=np.concatenate([np.ones(n_in, bool), np.zeros(n_end, bool)]),
            ),
        }
    )
    tables: dict[str, pa.Table] = {"coll": coll}
    hang_t = min((h[2] for h in ex.hung), default=None)
    horizon = float(np.nanmax(end[done])) if done.any() else T0
    if hang_t is not None:
        horizon = max(horizon, float(enter.max())) + spec.tail_s * 1e9
    if spec.progress_ms > 0:
        tables["progress"] = _progress(spec, ex, ops, done, horizon, obs)
    if spec.link_rows:
        tables["link"] = _links(spec, lay, ex, horizon, off, drift)
    meta = {
        "job": spec.job,
        "t": T0,
        "world_size": spec.world,
        "tp": spec.tp,
        "pp": spec.pp,
        "dp": spec.dp,
        "cp": 1,
        "microbatches": spec.microbatches if spec.meta_degrees else 0,
        "schedule": "1f1b" if spec.meta_degrees else "unknown",
        "nodes": {str(r): lay.node_names[lay.node[r]] for r in range(spec.world)},
        "comms": [{"comm": c, "kind": k, "ranks": m} for c, k, m in lay.comms]
        if spec.comms_in_meta
        else [],
    }
    truth = _truth(spec, lay, ex, obs)
    return meta, tables, truth


def _progress(
    spec: Spec, ex: Executor, ops: list[Op], done: np.ndarray, horizon: float, obs: Any
) -> pa.Table:
    """Samples every ``progress_ms`` of operations in flight longer than that (and of the
    operations a hang left in flight, until ``horizon``)."""
    per = spec.progress_ms * MS
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "comm", "seq", "t", "s", "r")}
    for o in ops:
        stop = o.end if o.end is not None else horizon
        n = int((stop - o.enter) // per)
        if n <= 0:
            continue
        ts = o.enter + per * np.arange(1, n + 1)
        if o.end is not None:
            assert o.start is not None
            frac = np.clip((ts - o.start) / max(1.0, o.end - o.start), 0, 1)
            sc = (frac * (o.steps or 1)).astype(np.int64)
            rc = sc
        elif o.stall_steps is not None and o.start is not None:
            sc = np.where(ts >= o.start, o.stall_steps[0], 0)
            rc = np.where(ts >= o.start, o.stall_steps[1], 0)
        else:
            sc = rc = np.zeros(n, np.int64)
        cols["rank"].append(np.full(n, o.rank))
        cols["comm"].append(np.full(n, ex.lay.comms[o.comm][0], dtype=np.uint64))
        cols["seq"].append(np.full(n, o.seq, dtype=np.uint64))
        cols["t"].append(obs(np.full(n, o.rank), ts))
        cols["s"].append(np.asarray(sc, np.uint64))
        cols["r"].append(np.asarray(rc, np.uint64))
    cat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}
    m = len(cat["t"])
    return pa.table(
        {
            "job": pa.array([spec.job] * m),
            "rank": pa.array(cat["rank"], pa.int32()),
            "comm": pa.array(cat["comm"].astype(np.uint64), pa.uint64()),
            "seq": pa.array(cat["seq"].astype(np.uint64), pa.uint64()),
            "t": pa.array(cat["t"].astype(np.int64), pa.int64()),
            "send_count": pa.array(cat["s"].astype(np.uint64), pa.uint64()),
            "recv_count": pa.array(cat["r"].astype(np.uint64), pa.uint64()),
        }
    )


def _links(
    spec: Spec, lay: Layout, ex: Executor, horizon: float, off: np.ndarray, drift: np.ndarray
) -> pa.Table:
    """Per queue pair (rank -> peer node) cumulative work requests and bytes, sampled every
    ``link_ms``. A slow link drains slower while its sender keeps posting at the healthy
    rate, so its in-flight count grows (VCCL); hops starved by it keep short queues."""
    chunk = 512 << 10
    qp: dict[tuple[int, int], list[tuple[float, ...]]] = {}
    rounds: dict[tuple[Any, ...], list[Op]] = ex.rounds
    for ops in rounds.values():
        o = ops[0]
        if o.start is None:
            continue
        members = sorted(ops, key=ex.comm_rank)
        if o.kind == "p2p":
            snd = next(x for x in ops if x.op == "send")
            rcv = next(x for x in ops if x.op == "recv")
            pairs = [(snd.rank, rcv.rank, float(o.nbytes))]
        else:
            n = len(members)
            vol = o.nbytes / n * o.steps if o.op == "allreduce" else o.nbytes * o.steps
            pairs = [(members[i].rank, members[(i + 1) % n].rank, vol) for i in range(n)]
        t1 = max(x.end if x.end is not None else horizon for x in ops)
        t0 = float(o.start)
        for a, b, vol in pairs:
            if lay.node[a] == lay.node[b]:
                continue
            slow = ex.link_factor(a, b, o.it)
            hung = o.end is None
            if not hung:
                qp.setdefault((a, lay.node[b]), []).append(
                    (t0, t1, t0 + (t1 - t0) / slow, vol, 1.0, 0.0)
                )
                continue
            # H3: completions stop after the steps done; only the broken queue pair (the
            # root's, towards its ring successor or p2p peer) keeps posting
            root = next((x for x in ops if x.h3), None)
            frac = 0.0
            if root is not None and root.stall_steps is not None and o.steps:
                frac = root.stall_steps[0] / o.steps
            broken = root is not None and a == root.rank
            qp.setdefault((a, lay.node[b]), []).append(
                (
                    t0,
                    t0 + 1 * MS,
                    t0 + 200 * MS if broken else t0 + 1 * MS,
                    vol,
                    frac,
                    1.0 if broken else 0.0,
                )
            )
    cols: dict[str, list[Any]] = {k: [] for k in ("node", "rank", "peer", "t", "p", "c", "b")}
    period = spec.link_ms * MS
    t_lo = T0
    grid = t_lo + period * np.arange(1, int((horizon - t_lo) // period) + 1)
    for (a, pn), xfers in qp.items():
        arr = np.array(xfers)
        a_s0, a_s1, a_sh, a_vol = arr[:, 0:1], arr[:, 1:2], arr[:, 2:3], arr[:, 3:4]
        a_frac, a_broken = arr[:, 4:5], arr[:, 5:6]
        wr = np.ceil(a_vol / chunk)
        done = a_frac * np.clip((grid[None, :] - a_s0) / np.maximum(a_s1 - a_s0, 1.0), 0, 1)
        post = np.clip((grid[None, :] - a_s0) / np.maximum(a_sh - a_s0, 1.0), 0, 1)
        post = np.where(a_broken > 0, np.maximum(post, done), np.where(a_frac < 1, done, post))
        posted = (post * wr).sum(axis=0)
        completed = np.minimum((done * wr).sum(axis=0), posted)
        nbytes = (done * a_vol).sum(axis=0)
        n = lay.node[a]
        k = len(grid)
        cols["node"] += [lay.node_names[n]] * k
        cols["rank"].append(np.full(k, a))
        cols["peer"] += [lay.node_names[pn]] * k
        cols["t"].append((grid + off[n] + drift[n] * (grid - T0)).astype(np.int64))
        cols["p"].append(posted.astype(np.uint64))
        cols["c"].append(completed.astype(np.uint64))
        cols["b"].append(nbytes.astype(np.uint64))
    m = len(cols["node"])
    cat = {
        k: np.concatenate(v) if v else np.zeros(0)
        for k, v in cols.items()
        if k not in ("node", "peer")
    }
    return pa.table(
        {
            "job": pa.array([spec.job] * m),
            "node": pa.array(cols["node"], pa.string()),
            "rank": pa.array(cat["rank"].astype(np.int32), pa.int32()),
            "device": pa.array([f"mlx5_{int(r) % spec.gpus_per_node}" for r in cat["rank"]]),
            "peer_node": pa.array(cols["peer"], pa.string()),
            "t": pa.array(cat["t"].astype(np.int64), pa.int64()),
            "posted": pa.array(cat["p"].astype(np.uint64), pa.uint64()),
            "completed": pa.array(cat["c"].astype(np.uint64), pa.uint64()),
            "bytes": pa.array(cat["b"].astype(np.uint64), pa.uint64()),
        }
    )


STAGE = {"tp": "tp_collective", "pp": "pp_p2p", "dp": "dp_sync"}


def _truth(spec: Spec, lay: Layout, ex: Executor, obs: Any) -> dict[str, Any]:
    """Ground truth in diagnosis.md's shape; times on the root rank's clock."""
    ends = np.where(np.isnan(ex.iter_end), -np.inf, ex.iter_end).max(axis=1)
    starts = np.where(np.isnan(ex.iter_start), np.inf, ex.iter_start).min(axis=1)
    ends[~np.isfinite(ends)] = np.nan  # iterations a hang kept from ending
    starts[~np.isfinite(starts)] = np.nan
    dur = np.diff(np.concatenate([[starts[0]], ends]))
    touched: np.ndarray = np.zeros(spec.iterations, dtype=bool)
    for f in spec.faults:
        hi = (
            f.end
            if f.end is not None and f.cause in ("compute", "communication")
            else spec.iterations
        )
        touched[max(0, f.start) : min(spec.iterations, hi + 1)] = True
    ok = np.isfinite(dur) & ~touched
    ok[0] = False
    base = float(np.median(dur[ok])) if ok.sum() >= 3 else float("nan")
    anomalies: list[dict[str, Any]] = []
    for i, f in enumerate(spec.faults):
        a: dict[str, Any] = {
            "id": f"fault-{i}",
            "cause": f.cause,
            "ranks": [f.rank],
            "link": None,
            "comm_kind": None,
            "stage": None,
            "iteration_start": f.start,
            "iteration_end": f.end,
            "baseline_s": base / 1e9,
        }
        if f.cause in ("compute", "communication"):
            hi = min(spec.iterations, f.end if f.end is not None else spec.iterations)
            sl = slice(f.start, hi)
            a["kind"] = "slow"
            a["start_ns"] = int(obs(np.array([f.rank]), np.array([starts[f.start]]))[0])
            a["end_ns"] = (
                int(obs(np.array([f.rank]), np.array([ends[hi - 1]]))[0])
                if f.end is not None and f.end < spec.iterations
                else None
            )
            a["slowdown"] = round(float(np.nanmean(dur[sl])) / base, 4)
            # the job's iteration ends from the onset on: latency counted in iterations
            # that elapsed (a slow iteration is one iteration, however long)
            fin = ends[f.start:]
            fin = fin[np.isfinite(fin)]
            a["iteration_ends_ns"] = [int(x) for x in obs(np.full(len(fin), f.rank), fin)]
            if f.cause == "compute" and f.phase is not None:
                a["stage"] = {"f": "forward", "b": "backward"}[f.phase]
            if f.cause == "communication":
                assert f.peer is not None
                a["ranks"] = sorted([f.rank, f.peer])
                a["link"] = sorted([f.rank, f.peer])
        else:
            hit = [h for h in ex.hung if h[0] is f]
            a["kind"] = "hang"
            a["comm_kind"] = f.comm
            a["stage"] = STAGE[f.comm]
            a["start_ns"] = int(obs(np.array([f.rank]), np.array([hit[0][2]]))[0]) if hit else None
            a["end_ns"] = None
            a["triggered"] = bool(hit)
            if f.cause == "hardware" and hit and hit[0][1] is not None:
                op = hit[0][1]
                members = lay.comms[op.comm][2]
                nxt = (
                    members[(members.index(f.rank) + 1) % len(members)]
                    if op.kind == "coll"
                    else members[op.peer]
                )
                if lay.node[nxt] != lay.node[f.rank]:
                    a["link"] = [f.rank, nxt]
        anomalies.append(a)
    return {
        "version": 1,
        "job": spec.job,
        "iterations": {
            "median_s": float(np.nanmedian(dur[1:])) / 1e9,
            "count": int(np.isfinite(dur).sum()),
        },
        "anomalies": anomalies,
    }


def write(spec: Spec, path: Path, keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Generate and write a trace directory (plus ``truth.json``); returns the truth
    (``keep``: as :func:`generate`)."""
    meta, tables, truth = generate(spec, keep)
    path.mkdir(parents=True, exist_ok=True)
    for p in path.iterdir():
        p.unlink()
    (path / "meta.json").write_text(json.dumps(meta))
    rng = np.random.default_rng(spec.seed + 7)
    for kind, table in tables.items():
        if not table.num_rows:
            continue
        if spec.shuffle and table.num_rows:
            table = table.take(rng.permutation(table.num_rows))
        if spec.fmt == "parquet":
            pq.write_table(table, path / f"{kind}.parquet", row_group_size=200_000)
        else:
            with (path / f"{kind}.jsonl").open("w") as fh:
                for row in table.to_pylist():
                    fh.write(json.dumps({k: v for k, v in row.items() if v is not None}))
                    fh.write("\n")
    if spec.post_mortem:
        (path / "import.json").write_text(json.dumps({"post_mortem": True}))
    (path / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth


def score(truth: dict[str, Any], diag: dict[str, Any]) -> dict[str, Any]:
    """Match found anomalies to the truth (same kind; slow ones by time overlap, a hang to
    any hang) and score cause, exact root ranks and link; unmatched finds are false alarms.
    ``latency_it``: detection delay after the true onset in baseline iterations."""
    found = list(diag.get("anomalies") or [])
    used: set[int] = set()
    rows = []
    # stragglers slowed over the same iterations are one fault (as the simulator's
    # multi-rank compute faults): their truths merge
    merged: list[dict[str, Any]] = []
    for t in truth["anomalies"]:
        same = next(
            (
                m
                for m in merged
                if t["kind"] == m["kind"] == "slow"
                and t["cause"] == m["cause"] == "compute"
                and (t["iteration_start"], t.get("iteration_end"))
                == (m["iteration_start"], m.get("iteration_end"))
            ),
            None,
        )
        if same is not None:
            same["ranks"] = sorted(same["ranks"] + t["ranks"])
        else:
            merged.append(dict(t))
    for t in merged:
        if t["kind"] == "hang" and not t.get("triggered", True):
            continue
        best: int | None = None
        best_ov: Any = None
        for j, f in enumerate(found):
            if j in used or f["kind"] != t["kind"]:
                continue
            if t["kind"] == "slow":
                lo = max(t["start_ns"], f["start_ns"] or 0)
                hi = min(t["end_ns"] or 1 << 63, f["end_ns"] or 1 << 63)
                ov = hi - lo
                if ov < 0:
                    continue
            else:
                ov = 0
            # among overlapping finds, one of the same cause first (two faults at once
            # are two anomalies over the same time)
            ov = (f.get("cause") == t["cause"], ov)
            if best is None or ov > best_ov:
                best, best_ov = j, ov
        row: dict[str, Any] = {"truth": t["id"], "kind": t["kind"], "found": best is not None}
        if best is not None:
            used.add(best)
            f = found[best]
            row.update(
                cause=f["cause"] == t["cause"],
                ranks=sorted(f["ranks"]) == sorted(t["ranks"]),
                link=(sorted(f["link"] or []) == sorted(t["link"])) if t["link"] else None,
                got={k: f.get(k) for k in ("cause", "ranks", "link", "comm_kind", "stage")},
            )
            if f.get("detected_ns") and t.get("start_ns") and t.get("baseline_s"):
                row["latency_it"] = (f["detected_ns"] - t["start_ns"]) / (t["baseline_s"] * 1e9)
        rows.append(row)
    false = [
        {k: f.get(k) for k in ("kind", "cause", "ranks", "link", "start_ns")}
        for j, f in enumerate(found)
        if j not in used
    ]
    return {"matches": rows, "false_alarms": false}


def scenarios() -> dict[str, Spec]:
    """The held-out grid: name -> job (clean runs `c-`, compute stragglers `s-`, slow links
    `l-`, compound faults `x-`, hangs `h1-`/`h2-`/`h3-`)."""
    S, F = Spec, Fault
    return {
        # clean runs
        "c-lognormal": S(seed=1),
        "c-pareto-gc": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            jitter="pareto",
            jitter_scale=0.05,
            gc_prob=0.01,
            seed=2,
        ),
        "c-bursts-bimodal": S(tp=4, pp=2, dp=4, jitter="bimodal", burst_prob=0.03, seed=3),
        "c-skew-drift-parquet": S(
            tp=2, pp=2, dp=8, skew_ms=5.0, drift_ppm=50, missing_t_start=0.5, fmt="parquet", seed=4
        ),
        "c-order-dp-first-rsag": S(order=("dp", "tp", "pp"), dp_mode="rs_ag", seed=5),
        "c-order-pp-mid-pairs": S(
            order=("tp", "pp", "dp"), pp_comm="pair", small_allreduce=True, seed=6
        ),
        "c-128-parquet-gc": S(
            tp=4, pp=4, dp=8, microbatches=8, gc_prob=0.005, fmt="parquet", iterations=30, seed=7
        ),
        "c-meta-unknown-gpn4": S(meta_degrees=False, gpus_per_node=4, comms_in_meta=True, seed=8),
        # compute stragglers
        "s-compute-1.2-last": S(faults=[F("compute", 13, start=14, end=28, factor=1.2)], seed=11),
        "s-compute-1.5-first": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            faults=[F("compute", 5, start=12, factor=1.5)],
            seed=12,
        ),
        "s-compute-2-mid-pareto": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            jitter="pareto",
            jitter_scale=0.05,
            faults=[F("compute", 17, start=15, end=30, factor=2.0)],
            seed=13,
        ),
        "s-compute-3-skew": S(
            tp=2,
            pp=2,
            dp=8,
            skew_ms=5.0,
            drift_ppm=50,
            missing_t_start=1.0,
            faults=[F("compute", 22, start=10, end=20, factor=3.0)],
            seed=14,
        ),
        "s-compute-1.3-order": S(
            order=("dp", "tp", "pp"), faults=[F("compute", 6, start=14, factor=1.3)], seed=15
        ),
        "s-compute-1.5-gc-bursts": S(
            tp=4,
            pp=2,
            dp=4,
            gc_prob=0.01,
            burst_prob=0.02,
            faults=[F("compute", 30, start=14, end=30, factor=1.5)],
            fmt="parquet",
            seed=16,
        ),
        "s-compute-1.4-128": S(
            tp=4,
            pp=4,
            dp=8,
            microbatches=8,
            iterations=30,
            faults=[F("compute", 100, start=12, factor=1.4)],
            fmt="parquet",
            seed=17,
        ),
        "s-compute-2-tp1": S(
            tp=1,
            pp=4,
            dp=4,
            microbatches=8,
            faults=[F("compute", 9, start=14, end=26, factor=2.0)],
            seed=18,
        ),
        # slow links
        "l-pp-3x": S(
            faults=[F("communication", 3, peer=11, start=14, end=28, factor=3.0)],
            pp_bytes=64 << 20,
            seed=21,
        ),
        "l-pp-5x-pairs": S(
            pp_comm="pair",
            faults=[F("communication", 4, peer=12, start=14, factor=5.0)],
            pp_bytes=64 << 20,
            seed=22,
        ),
        "l-dp-ring-4x-linkrows": S(
            tp=2,
            pp=2,
            dp=8,
            link_rows=True,
            faults=[F("communication", 6, peer=8, start=14, end=28, factor=4.0)],
            seed=23,
        ),
        "l-dp-ring-3x-nolink": S(
            tp=2,
            pp=2,
            dp=8,
            faults=[F("communication", 6, peer=8, start=14, end=28, factor=3.0)],
            seed=24,
        ),
        "l-pp-2x-skew-parquet": S(
            skew_ms=4.0,
            missing_t_start=0.3,
            fmt="parquet",
            faults=[F("communication", 1, peer=9, start=14, factor=2.0)],
            pp_bytes=64 << 20,
            seed=25,
        ),
        # hangs
        "h1-tp": S(
            faults=[F("not_entered", 5, start=15, comm="tp", microbatch=2, index=1)], seed=31
        ),
        "h1-pp": S(
            tp=2,
            pp=4,
            dp=4,
            faults=[F("not_entered", 18, start=15, comm="pp", microbatch=1)],
            seed=32,
        ),
        "h1-dp": S(faults=[F("not_entered", 9, start=15, comm="dp")], seed=33),
        "h2-dp-bytes": S(faults=[F("inconsistent", 10, start=15, comm="dp")], seed=34),
        "h2-dp-op-rsag": S(
            dp_mode="rs_ag",
            faults=[F("inconsistent", 2, start=15, comm="dp", mismatch="op")],
            seed=35,
        ),
        "h2-pp-bytes": S(
            faults=[F("inconsistent", 12, start=15, comm="pp", microbatch=2)], seed=36
        ),
        "h3-dp": S(tp=2, pp=2, dp=8, faults=[F("hardware", 6, start=15, comm="dp")], seed=37),
        "h3-dp-linkrows": S(
            tp=2,
            pp=2,
            dp=8,
            link_rows=True,
            faults=[F("hardware", 6, start=15, comm="dp")],
            seed=38,
        ),
        "h3-tp": S(
            tp=4, pp=2, dp=2, faults=[F("hardware", 2, start=15, comm="tp", microbatch=1)], seed=39
        ),
        "l-dp-ring-wrap-3x-nolink": S(
            tp=2,
            pp=2,
            dp=8,
            faults=[F("communication", 14, peer=0, start=14, end=28, factor=3.0)],
            seed=26,
        ),
        "l-dp-ring-wrap-3x-linkrows": S(
            tp=2,
            pp=2,
            dp=8,
            link_rows=True,
            faults=[F("communication", 14, peer=0, start=14, end=28, factor=3.0)],
            seed=27,
        ),
        "x-compound-compute-link": S(
            tp=2,
            pp=2,
            dp=8,
            faults=[
                F("compute", 20, start=12, end=30, factor=1.6),
                F("communication", 3, peer=19, start=12, end=30, factor=3.0),
            ],
            pp_bytes=64 << 20,
            seed=41,
        ),
        "x-two-episodes": S(
            iterations=44,
            faults=[
                F("compute", 2, start=10, end=18, factor=1.6),
                F("compute", 14, start=28, end=38, factor=1.6),
            ],
            seed=42,
        ),
        "s-compute-1.25-pp-first-order": S(
            order=("pp", "tp", "dp"),
            tp=2,
            pp=4,
            dp=2,
            microbatches=8,
            faults=[F("compute", 9, start=14, factor=1.25)],
            seed=43,
        ),
        "s-compute-1.2-128-pareto": S(
            tp=4,
            pp=4,
            dp=8,
            microbatches=8,
            iterations=30,
            jitter="pareto",
            jitter_scale=0.04,
            faults=[F("compute", 77, start=12, factor=1.2)],
            fmt="parquet",
            seed=44,
        ),
        "c-tp-cross-node-skew-drift": S(
            tp=4, pp=2, dp=2, gpus_per_node=2, skew_ms=3.0, drift_ppm=200, seed=51
        ),
        "c-heavy-gc-64": S(
            tp=2, pp=4, dp=8, microbatches=8, gc_prob=0.02, iterations=30, fmt="parquet", seed=52
        ),
        "s-compute-1.5-tp-cross-node-skew": S(
            tp=4,
            pp=2,
            dp=2,
            gpus_per_node=2,
            skew_ms=3.0,
            drift_ppm=200,
            faults=[F("compute", 6, start=14, end=28, factor=1.5)],
            seed=53,
        ),
        "l-tp-cross-node-3x-linkrows": S(
            tp=4,
            pp=2,
            dp=2,
            gpus_per_node=2,
            link_rows=True,
            tp_bytes=32 << 20,
            faults=[F("communication", 1, peer=2, start=14, end=28, factor=3.0)],
            seed=54,
        ),
        "h1-pp-warmup-mb0": S(
            tp=2,
            pp=4,
            dp=2,
            faults=[F("not_entered", 4, start=15, comm="pp", microbatch=0)],
            seed=55,
        ),
        "h2-tp-bytes": S(
            tp=4,
            pp=2,
            dp=2,
            faults=[F("inconsistent", 9, start=15, comm="tp", microbatch=2, index=1)],
            seed=56,
        ),
        "h3-pp-linkrows": S(
            link_rows=True, faults=[F("hardware", 3, start=15, comm="pp", microbatch=1)], seed=57
        ),
        "c-ntp-step-4ms": S(tp=2, pp=2, dp=4, clock_step_ms=4.0, clock_step_s=1.2, seed=61),
        "s-compute-1.15-last": S(
            tp=2, pp=2, dp=4, faults=[F("compute", 12, start=14, end=30, factor=1.15)], seed=62
        ),
        "l-pp-1.3x": S(
            faults=[F("communication", 2, peer=10, start=14, end=30, factor=1.3)],
            pp_bytes=128 << 20,
            seed=63,
        ),
        "x-two-stragglers-same-time": S(
            tp=2,
            pp=4,
            dp=4,
            microbatches=8,
            faults=[
                F("compute", 3, start=12, end=28, factor=1.5),
                F("compute", 29, start=12, end=28, factor=1.5),
            ],
            seed=64,
        ),
        "s-compute-1.5-ntp-step": S(
            tp=4,
            pp=2,
            dp=2,
            gpus_per_node=2,
            clock_step_ms=-3.0,
            clock_step_s=1.3,
            faults=[F("compute", 2, start=14, end=28, factor=1.5)],
            seed=65,
        ),
        "l-pp-3x-no-tstart": S(
            missing_t_start=1.0,
            faults=[F("communication", 5, peer=13, start=14, end=28, factor=3.0)],
            pp_bytes=64 << 20,
            seed=71,
        ),
        "s-compute-2-early": S(
            iterations=24, faults=[F("compute", 10, start=6, end=16, factor=2.0)], seed=72
        ),
        "l-pp-64": S(
            tp=2,
            pp=4,
            dp=8,
            microbatches=8,
            iterations=30,
            fmt="parquet",
            faults=[F("communication", 20, peer=36, start=12, end=24, factor=3.0)],
            pp_bytes=64 << 20,
            seed=73,
        ),
        "h3-dp-128-linkrows": S(
            tp=4,
            pp=4,
            dp=8,
            microbatches=4,
            iterations=24,
            link_rows=True,
            link_ms=50.0,
            fmt="parquet",
            faults=[F("hardware", 39, start=15, comm="dp")],
            seed=74,
        ),
        "x-slow-then-hang": S(
            faults=[
                F("compute", 5, start=8, factor=1.6),
                F("not_entered", 9, start=24, comm="dp"),
            ],
            seed=75,
        ),
        "c-checkpoint-all-8s": S(pauses=[(20, 8.0, ())], seed=81),
        "c-checkpoint-rank0-8s": S(pauses=[(20, 8.0, (0,))], seed=82),
        "c-long-gc-rank5-3s": S(pauses=[(18, 3.0, (5,))], seed=83),
        "c-checkpoint-rank0-twice": S(
            iterations=44, pauses=[(15, 7.0, (0,)), (35, 7.0, (0,))], seed=84
        ),
        "c-jitter-10pct": S(jitter_scale=0.10, seqlen_sigma=0.08, seed=91),
        "c-bimodal-heavy": S(jitter="bimodal", jitter_scale=0.08, gc_prob=0.02, seed=92),
        "s-compute-1.5-jitter-10pct": S(
            jitter_scale=0.10,
            seqlen_sigma=0.08,
            faults=[F("compute", 3, start=14, end=28, factor=1.5)],
            seed=93,
        ),
        "h1-tp-postmortem": S(
            progress_ms=0,
            post_mortem=True,
            faults=[F("not_entered", 5, start=15, comm="tp", microbatch=2)],
            seed=40,
        ),
    }
