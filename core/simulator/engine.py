"""The vectorized discrete-event simulation of one hybrid-parallel training job.

Dependency model: the what-if paper's simulator (§3.2, "Extract operation dependencies" and
"Simulate an alternative timeline"), run forward with injected faults instead of idealized
durations:

* every rank executes its stage's fixed program (:mod:`failslow.simulator.schedule`) in
  order; a compute operation ends ``duration`` after it starts;
* a collective round (TP/CP inside forward and backward compute, DP params-sync and
  grads-sync) starts its transfer when the last member has entered and ends for all members
  at ``last enter + transfer time`` (CCL-D §4.1: a member that entered waits with zero
  progress until then);
* a point-to-point message starts when both the send and the recv are posted; a batch of
  sends/recvs (Megatron's ``batch_isend_irecv``) completes when all its messages have.

Vectorization: all ranks of a pipeline stage run the same program, so one program step is one
numpy operation over the stage's ``(dp, cp, tp)`` array; TP rounds reduce over the ``tp``
axis, CP over ``cp``, DP over ``dp``, and PP messages pair stage ``s`` with ``s + 1``
element-wise. Stages advance round-robin until they block on a message their neighbour has
not posted yet (a topological order of (stage, step)). Hangs are ``+inf`` times: they
propagate through the same max/plus algebra, so every rank runs until it blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from failslow import events
from failslow.simulator.faults import ComputeRT, FaultSet, HangRT, LinkRT, build_faults
from failslow.simulator.scenario import Scenario
from failslow.simulator.schedule import BWD, DPSYNC, FWD, OPT, P2P, P2POp, Step, build_program
from failslow.simulator.topology import K_CP, K_DP, K_PP, K_TP, KIND_AXIS, Topology

INF = math.inf
OPC = events.OP
SPC = events.SPAN_OP
#: The operation a rank calls instead in an "op" mismatch (inconsistent hang).
OTHER_OP = {"allreduce": "allgather", "allgather": "reducescatter",
            "reducescatter": "allgather"}


class Recorder:
    """Column blocks of the records, one block per (stage, step, operation).

    ``coll`` blocks hold one ``(S,)`` array per time column (enter, transfer start, end),
    S = ranks of a stage; the scalar columns are per block. Tables are built once at the end
    (:mod:`failslow.simulator.output`).
    """

    def __init__(self, stage_size: int, enabled: bool = True) -> None:
        self.S = stage_size
        self.enabled = enabled
        # stage, comm kind, op code, seq, bytes, peer, send_count, recv_count, iteration
        self.meta: list[tuple[int, int, int, int, int, int, int, int, int]] = []
        self.enter: list[np.ndarray] = []
        self.start: list[np.ndarray] = []
        self.end: list[np.ndarray] = []
        # stage, span op code, iteration, micro-batch
        self.span_meta: list[tuple[int, int, int, int]] = []
        self.span_start: list[np.ndarray] = []
        self.span_end: list[np.ndarray] = []
        self.gc: list[tuple[np.ndarray, int, np.ndarray, np.ndarray]] = []
        #: record -> (send_count, recv_count, stall time) of members whose op never ends
        self.stall: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        #: (record, element, op code, bytes, send_count, recv_count) of an odd member
        self.overrides: list[tuple[int, int, int, int, int, int]] = []

    def coll(self, stage: int, kind: int, op: int, seq: int, nbytes: int, peer: int,
             scount: int, rcount: int, it: int, enter: np.ndarray, start: np.ndarray,
             end: np.ndarray) -> int:
        if not self.enabled:
            return -1
        self.meta.append((stage, kind, op, seq, nbytes, peer, scount, rcount, it))
        shape = enter.shape
        self.enter.append(np.ascontiguousarray(enter).reshape(-1))
        self.start.append(np.broadcast_to(start, shape).reshape(-1))
        self.end.append(np.broadcast_to(end, shape).reshape(-1))
        return len(self.meta) - 1

    def span(self, stage: int, op: str, it: int, mb: int, start: np.ndarray,
             end: np.ndarray) -> None:
        if not self.enabled:
            return
        self.span_meta.append((stage, SPC[op], it, mb))
        self.span_start.append(np.ascontiguousarray(start).reshape(-1))
        self.span_end.append(np.broadcast_to(end, start.shape).reshape(-1))


@dataclass
class _Msg:
    """One point-to-point message between stage ``edge`` and ``edge + 1`` (all elements)."""

    send_enter: np.ndarray | None = None
    recv_enter: np.ndarray | None = None
    start: np.ndarray | None = None
    end: np.ndarray | None = None
    hw: HangRT | None = None          # a hardware hang stalls this message
    stall: dict[str, float] = field(default_factory=dict)


@dataclass
class _Posted:
    enter: np.ndarray
    seq: int


class Engine:
    """Simulates a :class:`Scenario`; :meth:`run` fills :attr:`rec` and :attr:`iter_end`."""

    def __init__(self, sc: Scenario, seed: int, record: bool = True) -> None:
        self.sc = sc
        p = sc.parallel
        self.topo = topo = Topology(sc.job, p.tp, p.pp, p.dp, p.cp, sc.gpus_per_node,
                                    sc.nics_per_node)
        self.P, self.D, self.C, self.T = p.pp, p.dp, p.cp, p.tp
        self.S = topo.stage_size
        self.M = sc.microbatches
        self.rng = np.random.default_rng([seed, 0])
        self.programs = [build_program(sc.schedule, s, self.P, self.M) for s in range(self.P)]
        self.faults: FaultSet = build_faults(sc, topo, self.programs,
                                             np.random.default_rng([seed, 1]))
        self.rec = Recorder(self.S, record)
        tm = sc.timing
        self.launch = tm.launch_us * 1e3
        factor = np.ones(self.P)
        if self.P > 1:
            factor[-1] = tm.last_stage_factor
        self.fwd_ns = tm.forward_ms * 1e6 * factor
        self.bwd_ns = self.fwd_ns * tm.backward_ratio
        self.opt_ns = tm.optimizer_ms * 1e6
        self.ntp = (tm.tp_colls_forward, tm.tp_colls_backward) if self.T > 1 else (0, 0)
        self.ncp = (tm.cp_colls_forward, tm.cp_colls_backward) if self.C > 1 else (0, 0)
        self._init_transfers()
        self.t = self.rng.uniform(0.0, sc.noise.start_jitter_ms * 1e6, topo.shape)
        self.seq = [[0, 0, 0, 0] for _ in range(self.P)]
        self.iter_end: list[float] = []
        self.iterations_run = 0

    # -----------------------------------------------------------------------------------------
    # transfer model: ring algorithms (n-1 or 2(n-1) steps) at NVLink bandwidth when the whole
    # ring is inside one node, else at the per-rank network bandwidth; p2p: latency + size/bw

    def _init_transfers(self) -> None:
        tm, topo = self.sc.timing, self.topo
        lat = tm.latency_us * 1e3
        chunk = tm.chunk_bytes

        def bw(intra: np.ndarray) -> np.ndarray:
            return np.where(intra, tm.nvlink_gbps, tm.ib_gbps)     # bytes per ns

        def steps(sent: float) -> int:
            return max(1, math.ceil(sent / chunk))

        n = self.T
        self.tp_sent = 2 * (n - 1) / n * tm.tp_bytes
        self.tp_base = 2 * (n - 1) * lat + self.tp_sent / bw(topo.intra[K_TP])
        self.tp_steps = steps(self.tp_sent)
        n = self.C
        self.cp_sent = float((n - 1) * tm.cp_bytes)
        self.cp_base = (n - 1) * lat + self.cp_sent / bw(topo.intra[K_CP])
        self.cp_steps = steps(self.cp_sent)
        n = self.D
        self.dp_rank_bytes = max(1, tm.dp_bytes // n)
        self.dp_sent = float((n - 1) * self.dp_rank_bytes)
        self.dp_base = (n - 1) * lat + self.dp_sent / bw(topo.intra[K_DP])
        self.dp_steps = steps(self.dp_sent)
        self.pp_base = lat + tm.pp_bytes / bw(topo.pp_intra)      # (pp-1, dp, cp, tp)
        self.pp_steps = steps(tm.pp_bytes)

    # -----------------------------------------------------------------------------------------
    # noise, drawn per iteration in a fixed order (so the draws do not depend on faults)

    def _draw(self) -> None:
        rng, nz, P, D, C, T, M = self.rng, self.sc.noise, self.P, self.D, self.C, self.T, self.M
        ncomp = 2 * M + 1
        self.comp_f = np.exp(nz.compute_jitter * rng.standard_normal((P, ncomp, D, C, T)))
        self.seq_f = np.exp(nz.seqlen_sigma * rng.standard_normal((M, D)))[:, :, None, None]
        cj = nz.comm_jitter
        self.tp_f = np.exp(cj * rng.standard_normal((P, max(1, M * sum(self.ntp)), D, C, 1)))
        self.cp_f = np.exp(cj * rng.standard_normal((P, max(1, M * sum(self.ncp)), D, 1, T)))
        self.dp_f = np.exp(cj * rng.standard_normal((P, 2, 1, C, T)))
        self.pp_f = np.exp(cj * rng.standard_normal((max(1, P - 1), 2, M, D, C, T)))
        hits = np.flatnonzero(rng.random(P * self.S) < nz.gc_prob)
        at = rng.integers(0, 2 * M, size=hits.size)
        lo, hi = nz.gc_ms
        durs = rng.uniform(lo, hi, size=hits.size) * 1e6
        self.gc: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for h, a, d in zip(hits.tolist(), at.tolist(), durs.tolist(), strict=True):
            s, e = divmod(h, self.S)
            elems, ds = self.gc.get((s, a), (np.empty(0, np.int64), np.empty(0)))
            self.gc[(s, a)] = (np.append(elems, e), np.append(ds, d))

    # -----------------------------------------------------------------------------------------

    def run(self) -> None:
        for it in range(self.sc.iterations):
            self._draw()
            self._tpi = [0] * self.P
            self._cpi = [0] * self.P
            self._iteration(it)
            self.iterations_run = it + 1
            finite = np.isfinite(self.t)
            self.iter_end.append(float(self.t.max()) - self.launch if finite.all() else math.nan)
            if not finite.any():
                break

    def _iteration(self, it: int) -> None:
        P = self.P
        ptr = [0] * P
        posted: list[list[_Posted] | None] = [None] * P
        msgs: dict[tuple[int, bool, int], _Msg] = {}
        lengths = [len(p) for p in self.programs]
        while True:
            progressed = False
            for s in range(P):
                prog = self.programs[s]
                while ptr[s] < lengths[s]:
                    st = prog[ptr[s]]
                    if st.kind == P2P:
                        if not self._p2p(s, ptr[s], st, it, msgs, posted):
                            break
                    elif st.kind == FWD or st.kind == BWD:
                        self._compute(s, ptr[s], st, it)
                    elif st.kind == DPSYNC:
                        self._dpsync(s, ptr[s], st, it)
                    elif st.kind == OPT:
                        self._optimizer(s, st, it)
                    ptr[s] += 1
                    progressed = True
            if ptr == lengths:
                return
            if not progressed:
                raise RuntimeError(f"pipeline schedule deadlocked at steps {ptr}")

    # -----------------------------------------------------------------------------------------
    # compute

    def _slow_compute(self, s: int, is_fwd: bool, is_bwd: bool, it: int, tstart: np.ndarray,
                      dur: np.ndarray) -> list[tuple[ComputeRT, np.ndarray]]:
        hits: list[tuple[ComputeRT, np.ndarray]] = []
        for cf in self.faults.compute:
            hit = cf.factor(s, is_fwd, is_bwd, it, tstart)
            if hit is None:
                continue
            elems, active = hit
            sel = elems[active]
            dur.reshape(-1)[sel] *= cf.severity
            hits.append((cf, sel))
        return hits

    def _observe_compute(self, hits: list[tuple[ComputeRT, np.ndarray]], it: int,
                         start: np.ndarray, end: np.ndarray) -> None:
        for cf, sel in hits:
            cf.observed.add(it, start.reshape(-1)[sel], end.reshape(-1)[sel])

    def _compute(self, s: int, idx: int, st: Step, it: int) -> None:
        is_fwd = st.kind == FWD
        start = self.t[s].copy()
        dur = (self.fwd_ns[s] if is_fwd else self.bwd_ns[s]) * self.comp_f[s, st.compute_index]
        dur = np.ascontiguousarray(dur * self.seq_f[st.mb])
        hits = self._slow_compute(s, is_fwd, not is_fwd, it, start, dur) \
            if self.faults.compute else []
        gc = self.gc.get((s, st.compute_index))
        if gc is not None:
            elems, durs = gc
            g0 = start.reshape(-1)[elems].copy()
            start.reshape(-1)[elems] += durs
            self.rec.gc.append((s * self.S + elems, it, g0, g0 + durs))
        ntp = self.ntp[0 if is_fwd else 1]
        ncp = self.ncp[0 if is_fwd else 1]
        n = max(ntp, ncp, 1)
        chunk = dur / n
        cur = start
        for j in range(n):
            if j < ncp:
                op = "allgather" if is_fwd else "reducescatter"
                k = self._cpi[s]
                self._cpi[s] += 1
                cur = self._ring(s, idx, j, K_CP, op, cur, it, self.cp_base[s],
                                 self.cp_f[s, k], self.sc.timing.cp_bytes,
                                 self.cp_steps) + self.launch
            cur = cur + chunk
            if j < ntp:
                k = self._tpi[s]
                self._tpi[s] += 1
                cur = self._ring(s, idx, j, K_TP, "allreduce", cur, it, self.tp_base[s],
                                 self.tp_f[s, k], self.sc.timing.tp_bytes,
                                 self.tp_steps) + self.launch
        end = cur - self.launch if ntp else cur
        self.rec.span(s, "forward-compute" if is_fwd else "backward-compute", it, st.mb,
                      start, end)
        if hits:
            self._observe_compute(hits, it, start, end)
        self.t[s] = cur if ntp else cur + self.launch

    def _optimizer(self, s: int, st: Step, it: int) -> None:
        start = self.t[s].copy()
        dur = self.opt_ns * self.comp_f[s, st.compute_index]
        hits = self._slow_compute(s, False, False, it, start, dur) if self.faults.compute else []
        end = start + dur
        self.rec.span(s, "optimizer", it, -1, start, end)
        if hits:
            self._observe_compute(hits, it, start, end)
        self.t[s] = end + self.launch

    # -----------------------------------------------------------------------------------------
    # collectives

    def _link_slow(self, kind: int, s: int, start: np.ndarray, it: int, xfer: np.ndarray
                   ) -> tuple[np.ndarray, list[tuple[LinkRT, np.ndarray]]]:
        hits: list[tuple[LinkRT, np.ndarray]] = []
        for lf in self.faults.links:
            mask = lf.factor(kind, s, start, it)
            if mask is None:
                continue
            xfer = np.where(mask, xfer * lf.severity, xfer)
            hits.append((lf, mask))
        return xfer, hits

    def _ring(self, s: int, idx: int, sub: int, kind: int, op: str, enter: np.ndarray,
              it: int, base: np.ndarray, jit: np.ndarray, nbytes: int, nsteps: int
              ) -> np.ndarray:
        """One collective round per group of stage ``s``; returns every member's end time."""
        axis = KIND_AXIS[kind] - 1
        hang = self.faults.hang
        h: HangRT | None = None
        if hang is not None and hang.kind == kind and hang.due(
                s, idx, sub, it, float(enter.reshape(-1)[hang.elem])):
            h = hang
            if h.cause == "not_entered":
                enter = enter.copy()
                self._trigger(h, it, float(enter.reshape(-1)[h.elem]), kind)
                enter.reshape(-1)[h.elem] = INF
        start = enter.max(axis=axis, keepdims=True)
        xfer = base * jit
        links: list[tuple[LinkRT, np.ndarray]] = []
        if self.faults.links:
            xfer, links = self._link_slow(kind, s, start, it, xfer)
        end = start + xfer
        seq = self.seq[s][kind]
        self.seq[s][kind] = seq + 1
        endfull = np.broadcast_to(end, enter.shape)
        stall = None
        if h is not None and h.cause in ("inconsistent", "hardware"):
            endfull, stall, override = self._hang_round(h, kind, axis, op, nbytes, nsteps,
                                                        enter, start, xfer, it)
        rec = self.rec.coll(s, kind, OPC[op], seq, nbytes, -1, nsteps, nsteps, it, enter,
                            start, endfull)
        if stall is not None and rec >= 0:
            self.rec.stall[rec] = stall
            if override is not None:
                self.rec.overrides.append((rec, *override))
        if h is not None:
            h.seq = seq
        for lf, mask in links:
            lf.observed.add(it, np.broadcast_to(start, mask.shape)[mask],
                            np.broadcast_to(end, mask.shape)[mask])
        return endfull

    def _trigger(self, h: HangRT, it: int, t: float, kind: int) -> None:
        h.triggered = True
        h.trigger_ns = t
        h.trigger_it = it
        h.comm = int(self.topo.comm[kind, h.rank])

    def _round_mask(self, elem: int, axis: int) -> np.ndarray:
        shape = (self.D, self.C, self.T)
        coords = np.unravel_index(elem, shape)
        mask = np.zeros(shape, dtype=bool)
        sl = tuple(slice(None) if a == axis else int(coords[a]) for a in range(3))
        mask[sl] = True
        return mask

    def _hang_round(self, h: HangRT, kind: int, axis: int, op: str, nbytes: int, nsteps: int,
                    enter: np.ndarray, start: np.ndarray, xfer: np.ndarray, it: int
                    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray],
                               tuple[int, int, int, int, int] | None]:
        """Inconsistent (H2) or hardware (H3) round: who never ends, and their step counts."""
        members = self._round_mask(h.elem, axis)
        flat_members = members.reshape(-1)
        s_round = float(np.broadcast_to(start, enter.shape).reshape(-1)[h.elem])
        x_round = float(np.broadcast_to(xfer, enter.shape).reshape(-1)[h.elem])
        end = np.broadcast_to(start + xfer, enter.shape).copy()
        flat_end = end.reshape(-1)
        flat_end[flat_members] = INF
        counts = np.full(self.S, nsteps, dtype=np.int64)
        stall_t = np.full(self.S, INF)
        override = None
        if h.cause == "inconsistent":
            odd_steps = max(1, nsteps // 2)
            if h.mismatch == "bytes":
                odd_op, odd_bytes = op, max(1, nbytes // 2)
            else:
                odd_op, odd_bytes = OTHER_OP.get(op, "allgather"), nbytes
            flat_end[h.elem] = s_round + 0.5 * x_round
            counts[flat_members] = min(odd_steps, nsteps - 1)
            stall_t[flat_members] = s_round + 0.5 * x_round
            override = (h.elem, OPC[odd_op], odd_bytes, odd_steps, odd_steps)
            self._trigger(h, it, s_round, kind)
        else:
            n = self.topo.sizes[kind]
            coord = np.indices((self.D, self.C, self.T))[axis].reshape(-1)
            r0 = coord[h.elem]
            c0 = min(int(h.frac * nsteps), max(0, nsteps - n - 1))
            dist = (coord - r0) % n
            counts[flat_members] = np.minimum(nsteps - 1, c0 + dist[flat_members])
            stall_t[flat_members] = s_round + h.frac * x_round
            self._trigger(h, it, s_round + h.frac * x_round, kind)
            h.peer_rank = int(self.topo.succ[kind, h.rank])
        return end, (counts, counts.copy(), stall_t), override

    def _dpsync(self, s: int, idx: int, st: Step, it: int) -> None:
        if self.D == 1:
            return
        enter = self.t[s].copy()
        k = 0 if st.dp_op == "allgather" else 1
        end = self._ring(s, idx, 0, K_DP, st.dp_op, enter, it, self.dp_base[s],
                         self.dp_f[s, k], self.dp_rank_bytes, self.dp_steps)
        self.rec.span(s, "params-sync" if k == 0 else "grads-sync", it, -1, enter, end)
        self.t[s] = end + self.launch

    # -----------------------------------------------------------------------------------------
    # point-to-point

    def _p2p(self, s: int, idx: int, st: Step, it: int, msgs: dict[tuple[int, bool, int], _Msg],
             posted: list[list[_Posted] | None]) -> bool:
        mine = posted[s]
        if mine is None:
            mine = []
            t0 = self.t[s]
            hang = self.faults.hang
            stuck = False
            for j, op in enumerate(st.ops):
                enter = t0 + j * self.launch
                if hang is not None and hang.kind == K_PP and (stuck or hang.due(
                        s, idx, j, it, float(enter.reshape(-1)[hang.elem]))):
                    if hang.cause == "not_entered":
                        if not stuck:
                            self._trigger(hang, it, float(enter.reshape(-1)[hang.elem]), K_PP)
                            hang.seq = self.seq[s][K_PP]
                        stuck = True
                        enter.reshape(-1)[hang.elem] = INF
                    elif not hang.triggered:
                        hang.triggered = True     # hardware: set off when the transfer starts
                        msgs.setdefault(op.key, _Msg()).hw = hang
                m = msgs.setdefault(op.key, _Msg())
                if op.send:
                    m.send_enter = enter
                else:
                    m.recv_enter = enter
                seq = self.seq[s][K_PP]
                self.seq[s][K_PP] = seq + 1
                mine.append(_Posted(enter, seq))
            posted[s] = mine
        for op in st.ops:
            m = msgs[op.key]
            if (m.recv_enter if op.send else m.send_enter) is None:
                return False
        ends = []
        for j, op in enumerate(st.ops):
            m = msgs[op.key]
            if m.end is None:
                self._transfer(m, op, it)
            assert m.start is not None and m.end is not None
            p = mine[j]
            rec = self.rec.coll(s, K_PP, OPC["send" if op.send else "recv"], p.seq,
                                self.sc.timing.pp_bytes, op.peer,
                                self.pp_steps if op.send else 0,
                                0 if op.send else self.pp_steps, it, p.enter, m.start, m.end)
            if m.stall and rec >= 0:
                self._p2p_stall(rec, m, op)
            if m.hw is not None and m.hw.seq is None and s == m.hw.stage:
                m.hw.seq = p.seq
            self.rec.span(s, ("backward-" if op.grad else "forward-")
                          + ("send" if op.send else "recv"), it, op.mb, p.enter, m.end)
            ends.append(m.end)
        self.t[s] = (ends[0] if len(ends) == 1 else np.maximum.reduce(ends)) + self.launch
        posted[s] = None
        return True

    def _transfer(self, m: _Msg, op: P2POp, it: int) -> None:
        assert m.send_enter is not None and m.recv_enter is not None
        start = np.maximum(m.send_enter, m.recv_enter)
        xfer = self.pp_base[op.edge] * self.pp_f[op.edge, int(op.grad), op.mb]
        links: list[tuple[LinkRT, np.ndarray]] = []
        if self.faults.links:
            xfer, links = self._link_slow(K_PP, op.edge, start, it, xfer)
        end = start + xfer
        h = m.hw
        if h is not None:
            e = h.elem
            s0 = float(start.reshape(-1)[e])
            x0 = float(xfer.reshape(-1)[e])
            end = end.copy()
            end.reshape(-1)[e] = INF
            victim_sends = (h.stage == op.edge) != op.grad
            peer_stage = op.edge + 1 if h.stage == op.edge else op.edge
            h.peer_rank = peer_stage * self.S + e
            self._trigger(h, it, s0 + h.frac * x0, K_PP)
            c0 = min(int(h.frac * self.pp_steps), max(0, self.pp_steps - 2))
            m.stall = {"elem": e, "victim_sends": float(victim_sends), "c0": c0,
                       "t": s0 + h.frac * x0}
        for lf, mask in links:
            lf.observed.add(it, start[mask], end[mask])
        m.start, m.end = start, end

    def _p2p_stall(self, rec: int, m: _Msg, op: P2POp) -> None:
        e = int(m.stall["elem"])
        c0 = int(m.stall["c0"])
        victim_side = (op.send == bool(m.stall["victim_sends"]))
        count = c0 if victim_side else min(self.pp_steps - 1, c0 + 1)
        sc = np.zeros(self.S, dtype=np.int64)
        rc = np.zeros(self.S, dtype=np.int64)
        (sc if op.send else rc)[e] = count
        stall_t = np.full(self.S, INF)
        stall_t[e] = m.stall["t"]
        self.rec.stall[rec] = (sc, rc, stall_t)
