"""Contract tables (events.md) from the engine's column blocks: :class:`TraceBuilder`.

Tables are built in chunks of whole iterations so a 4096-rank run never holds all its rows as
Python objects or as one Arrow table; :func:`.output.write_sim` streams the chunks into Parquet
row groups (or JSON Lines).

Derived records:

* ``progress``: for every operation in flight longer than ``sampling.progress_ms``, a sample
  every ``progress_ms`` after its enter; for a hung operation, samples until the end of the
  trace's tail. Counts are zero until the transfer starts (events.md), then grow linearly with
  time to the operation's total steps, or to the step at which a hung transfer stalled.
* ``link``: one queue pair per (rank, remote node) carrying that rank's inter-node traffic: PP
  messages it sends, and ring-collective traffic to its ring successor on another node. Work
  requests (one per ``timing.chunk_bytes``) are posted at most ``WR_WINDOW`` ahead of
  completions; cumulative counters sampled every ``sampling.link_ms`` in the node's clock. On a
  link broken by a hardware hang, completions stop and posted requests keep accumulating.
* ``gpu``: per rank every ``sampling.gpu_ms``; a compute fault with ``gpu_throttle`` shows as
  lower SM clocks and HW slowdown throttle reasons.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.simulator.engine import Engine
from failslow.simulator.ground_truth import median_iteration_ns
from failslow.simulator.scenario import Fault
from failslow.simulator.topology import K_CP, K_DP, K_PP, K_TP, Topology

CHUNK_ROWS = 2_000_000
WR_WINDOW = 16                 # work requests posted ahead of completions on a busy QP
STALL_POST_RATE = 4.0          # posted WRs per second on a broken link after it stalls
STALL_POST_CAP = 4096
GPU_SM_MHZ, GPU_MEM_MHZ = 1980, 2619
THROTTLE_HW = 0x8 | 0x40       # HW slowdown | HW thermal slowdown (NVML clocks-event reasons)


def _str_col(values: tuple[str, ...], codes: np.ndarray) -> pa.Array:
    return pc.take(pa.array(values, pa.string()), pa.array(codes.astype(np.int32)))


def _const(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


def _u64(values: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    return pa.array(values.astype(np.uint64), pa.uint64(), mask=null)


class TraceBuilder:
    """Turns an engine's recorder into contract tables, in chunks."""

    def __init__(self, eng: Engine, seed: int) -> None:
        self.eng = eng
        self.sc = eng.sc
        self.topo: Topology = eng.topo
        self.S = eng.S
        self.t0 = self.sc.start_time_ns
        skew_ns = self.sc.noise.clock_skew_ms * 1e6
        rng = np.random.default_rng([seed, 2])
        self.node_skew = np.rint(rng.uniform(-skew_ns, skew_ns, self.topo.n_nodes)
                                 ).astype(np.int64)
        self.rank_skew = self.node_skew[np.arange(self.topo.world) // self.sc.gpus_per_node]
        self._gpu_rng_seed = [seed, 3]
        rec = eng.rec
        self.n_rec = len(rec.meta)
        self.meta = (np.asarray(rec.meta, dtype=np.int64).reshape(-1, 9) if self.n_rec
                     else np.zeros((0, 9), np.int64))
        self.sizes = np.array([self.topo.sizes[k] for k in range(4)], dtype=np.int32)
        # chunks: consecutive records (whole iterations) of about CHUNK_ROWS rows
        per = max(1, CHUNK_ROWS // (2 * self.S))
        its = self.meta[:, 8]
        bounds = [0]
        for i in range(1, self.n_rec):
            if i - bounds[-1] >= per and its[i] != its[i - 1]:
                bounds.append(i)
        bounds.append(self.n_rec)
        self.chunks = list(zip(bounds[:-1], bounds[1:], strict=True))
        self.t_last = self._last_time()
        hang = eng.faults.hang
        self.hung = hang is not None and hang.triggered
        self.median_iter_ns = median_iteration_ns(eng.iter_end)
        tail = 0.0
        if self.hung:
            s = self.sc.sampling.hang_tail_s
            tail = s * 1e9 if s is not None else max(30e9, 10 * self.median_iter_ns)
        self.t_end = self.t_last + tail

    def _last_time(self) -> float:
        last = 0.0
        rec = self.eng.rec
        for a, b in self.chunks:
            for arrs in (rec.enter[a:b], rec.end[a:b]):
                if not arrs:
                    continue
                block = np.stack(arrs)
                fin = block[np.isfinite(block)]
                if fin.size:
                    last = max(last, float(fin.max()))
        return last

    def kinds(self) -> tuple[str, ...]:
        sp = self.sc.sampling
        out = ["coll"]
        if sp.spans:
            out.append("span")
        if sp.progress_ms > 0:
            out.append("progress")
        if sp.link_ms > 0:
            out.append("link")
        if sp.gpu_ms > 0:
            out.append("gpu")
        return tuple(out)

    def iter_tables(self, kind: str) -> Iterator[pa.Table]:
        if kind == "coll":
            for a, b in self.chunks:
                if b > a:
                    yield self._coll(a, b)
        elif kind == "progress":
            for a, b in self.chunks:
                if b > a:
                    t = self._progress(a, b)
                    if t.num_rows:
                        yield t
        elif kind == "span":
            yield from self._spans()
        elif kind == "link":
            t = self._link()
            if t.num_rows:
                yield t
        elif kind == "gpu":
            t = self._gpu()
            if t.num_rows:
                yield t
        else:
            raise ValueError(f"unknown kind {kind!r}")

    # -----------------------------------------------------------------------------------------

    def _time(self, rel: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        return np.rint(rel).astype(np.int64) + self.t0 + self.rank_skew[ranks]

    def _block(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rec = self.eng.rec
        return np.stack(rec.enter[a:b]), np.stack(rec.start[a:b]), np.stack(rec.end[a:b])

    def _coll(self, a: int, b: int) -> pa.Table:
        S = self.S
        E, ST, EN = self._block(a, b)
        meta = self.meta[a:b]
        parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for phase_code, times in ((events.ENTER, E), (events.END, EN)):
            flat = np.flatnonzero(np.isfinite(times).ravel())
            row, col = np.divmod(flat, S)
            parts.append((phase_code, flat, row, col, times.ravel()[flat]))
        phase = np.concatenate([np.full(p[1].size, p[0], np.int8) for p in parts])
        row = np.concatenate([p[2] for p in parts])
        col = np.concatenate([p[3] for p in parts])
        trel = np.concatenate([p[4] for p in parts])
        n_enter = parts[0][1].size
        stage, kind = meta[row, 0], meta[row, 1]
        rank = stage * S + col
        op = meta[row, 2].astype(np.int8)
        nbytes = meta[row, 4].copy()
        scount, rcount = meta[row, 6].copy(), meta[row, 7].copy()
        for rec, elem, ocode, obytes, osc, orc in self.eng.rec.overrides:
            if a <= rec < b:
                hit = (row == rec - a) & (col == elem)
                op[hit], nbytes[hit] = ocode, obytes
                scount[hit], rcount[hit] = osc, orc
        tstart = np.zeros(row.size)
        tstart[n_enter:] = ST.ravel()[parts[1][1]]
        t = self._time(trel, rank)
        ts = self._time(tstart, rank)
        is_enter = phase == events.ENTER
        order = np.argsort(t, kind="stable")
        rank, kind, row, op, nbytes = rank[order], kind[order], row[order], op[order], \
            nbytes[order]
        is_enter, t, ts = is_enter[order], t[order], ts[order]
        scount, rcount, phase = scount[order], rcount[order], phase[order]
        n = rank.size
        cols = [
            _const(self.sc.job, n),
            pa.array(rank.astype(np.int32)),
            pa.array(self.topo.comm[kind, rank]),
            pa.array(self.topo.comm_rank[kind, rank]),
            pa.array(self.sizes[kind]),
            _u64(meta[row, 3]),
            _str_col(events.COLL_OPS, op),
            _u64(nbytes),
            pa.array(meta[row, 5].astype(np.int32)),
            _str_col(events.PHASES, phase),
            pa.array(t),
            pa.array(ts, pa.int64(), mask=is_enter),
            _u64(scount, is_enter),
            _u64(rcount, is_enter),
        ]
        return pa.Table.from_arrays(cols, schema=events.SCHEMAS["coll"])

    # -----------------------------------------------------------------------------------------

    def _progress(self, a: int, b: int) -> pa.Table:
        S = self.S
        dt = self.sc.sampling.progress_ms * 1e6
        E, ST, EN = self._block(a, b)
        meta = self.meta[a:b]
        fin_e = np.isfinite(E)
        hung = fin_e & ~np.isfinite(EN)
        until = np.where(hung, self.t_end, EN)
        with np.errstate(invalid="ignore"):
            span = np.where(fin_e, until - E, 0.0)
        nsamp = np.where(hung, np.floor(span / dt), np.ceil(span / dt) - 1)
        nsamp = np.maximum(nsamp, 0).astype(np.int64).ravel()
        cells = np.flatnonzero(nsamp)
        if cells.size == 0:
            return events.empty("progress")
        counts = nsamp[cells]
        rep = np.repeat(cells, counts)
        offsets = np.cumsum(counts) - counts
        k = np.arange(rep.size) - np.repeat(offsets, counts) + 1
        row, col = np.divmod(rep, S)
        ts = E.ravel()[rep] + k * dt
        st, en = ST.ravel()[rep], EN.ravel()[rep]
        is_hung = hung.ravel()[rep]
        sc_tot, rc_tot = meta[row, 6], meta[row, 7]
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.clip((ts - st) / np.maximum(en - st, 1.0), 0.0, 1.0)
        frac = np.where(is_hung | ~np.isfinite(st), 0.0, frac)
        scount = np.floor(sc_tot * frac).astype(np.int64)
        rcount = np.floor(rc_tot * frac).astype(np.int64)
        for rec, (ssc, src, stall_t) in self.eng.rec.stall.items():
            if not a <= rec < b:
                continue
            sel = np.flatnonzero((row == rec - a) & is_hung)
            if sel.size == 0:
                continue
            c = col[sel]
            s0 = st[sel]
            with np.errstate(invalid="ignore", divide="ignore"):
                f = np.clip((ts[sel] - s0) / np.maximum(stall_t[c] - s0, 1.0), 0.0, 1.0)
            f = np.where(np.isfinite(s0) & np.isfinite(stall_t[c]), f, 0.0)
            scount[sel] = np.floor(ssc[c] * f).astype(np.int64)
            rcount[sel] = np.floor(src[c] * f).astype(np.int64)
        rank = meta[row, 0] * S + col
        kind = meta[row, 1]
        t = self._time(ts, rank)
        order = np.argsort(t, kind="stable")
        rank, kind, row, t = rank[order], kind[order], row[order], t[order]
        n = rank.size
        cols = [
            _const(self.sc.job, n),
            pa.array(rank.astype(np.int32)),
            pa.array(self.topo.comm[kind, rank]),
            _u64(meta[row, 3]),
            pa.array(t),
            _u64(scount[order]),
            _u64(rcount[order]),
        ]
        return pa.Table.from_arrays(cols, schema=events.SCHEMAS["progress"])

    # -----------------------------------------------------------------------------------------

    def _spans(self) -> Iterator[pa.Table]:
        rec = self.eng.rec
        S = self.S
        n = len(rec.span_meta)
        if n == 0 and not rec.gc:
            return
        meta = np.asarray(rec.span_meta, dtype=np.int64).reshape(-1, 4)
        per = max(1, CHUNK_ROWS // S)
        for a in range(0, n, per):
            b = min(n, a + per)
            t0, t1 = np.stack(rec.span_start[a:b]), np.stack(rec.span_end[a:b])
            flat = np.flatnonzero((np.isfinite(t0) & np.isfinite(t1)).ravel())
            row, col = np.divmod(flat, S)
            m = meta[a:b][row]
            rank = m[:, 0] * S + col
            yield self._span_table(rank, m[:, 2], m[:, 3], m[:, 1].astype(np.int8),
                                   t0.ravel()[flat], t1.ravel()[flat])
        if rec.gc:
            ranks = np.concatenate([g[0] for g in rec.gc])
            its = np.concatenate([np.full(g[0].size, g[1]) for g in rec.gc])
            g0 = np.concatenate([g[2] for g in rec.gc])
            g1 = np.concatenate([g[3] for g in rec.gc])
            ok = np.isfinite(g0) & np.isfinite(g1)
            yield self._span_table(ranks[ok], its[ok], np.full(int(ok.sum()), -1),
                                   np.full(int(ok.sum()), events.SPAN_OP["gc"], np.int8),
                                   g0[ok], g1[ok])

    def _span_table(self, rank: np.ndarray, step: np.ndarray, mb: np.ndarray, op: np.ndarray,
                    t0: np.ndarray, t1: np.ndarray) -> pa.Table:
        a, b = self._time(t0, rank), self._time(t1, rank)
        order = np.argsort(b, kind="stable")
        n = rank.size
        cols = [
            _const(self.sc.job, n),
            pa.array(rank[order].astype(np.int32)),
            pa.array(step[order].astype(np.int64)),
            pa.array(mb[order].astype(np.int32)),
            pa.array(np.full(n, -1, np.int32)),
            _str_col(events.SPAN_OPS, op[order]),
            pa.array(a[order]),
            pa.array(b[order]),
        ]
        return pa.Table.from_arrays(cols, schema=events.SCHEMAS["span"])

    # -----------------------------------------------------------------------------------------

    def _transfers(self) -> dict[str, np.ndarray]:
        """Inter-node transfers: QP key (rank, remote node), start, end, WRs, bytes, stall."""
        eng, topo, S = self.eng, self.topo, self.S
        tm = self.sc.timing
        gpn = self.sc.gpus_per_node
        sent = {K_TP: eng.tp_sent, K_CP: eng.cp_sent, K_DP: eng.dp_sent,
                K_PP: float(tm.pp_bytes)}
        keys, starts, ends, wrs, nbytes, stall_f, stall_t = [], [], [], [], [], [], []
        n_nodes = topo.n_nodes
        for a, b in self.chunks:
            if b <= a:
                continue
            _, ST, EN = self._block(a, b)
            meta = self.meta[a:b]
            ranks = meta[:, 0:1] * S + np.arange(S)[None, :]
            kind = meta[:, 1]
            is_send = (kind == K_PP) & (meta[:, 2] == events.OP["send"])
            peer_rank = np.where(meta[:, 5:6] > meta[:, 0:1], ranks + S, ranks - S)
            ring = (kind != K_PP)
            succ_cross = topo.succ_crosses[np.where(ring, kind, 0)[:, None], ranks]
            dest_node = np.where(ring[:, None], topo.succ_node[np.where(ring, kind, 0)[:, None],
                                                                 ranks], peer_rank // gpn)
            cross = np.where(ring[:, None], succ_cross & ring[:, None],
                             is_send[:, None] & (dest_node != ranks // gpn))
            cross &= np.isfinite(ST)
            flat = np.flatnonzero(cross.ravel())
            if flat.size == 0:
                continue
            row, col = np.divmod(flat, S)
            r = ranks.ravel()[flat]
            k = kind[row]
            vol = np.array([sent[int(x)] for x in range(4)])[k]
            keys.append(r * n_nodes + dest_node.ravel()[flat])
            starts.append(ST.ravel()[flat])
            ends.append(EN.ravel()[flat])
            wrs.append(np.maximum(1.0, np.ceil(vol / tm.chunk_bytes)))
            nbytes.append(vol)
            sf = np.zeros(flat.size)
            stt = np.full(flat.size, math.inf)
            for rec, (ssc, src, st_t) in eng.rec.stall.items():
                if not a <= rec < b:
                    continue
                sel = np.flatnonzero(row == rec - a)
                tot = np.maximum(meta[rec - a, 6], meta[rec - a, 7])
                c = col[sel]
                sf[sel] = np.maximum(ssc[c], src[c]) / max(1, tot)
                stt[sel] = st_t[c]
            stall_f.append(sf)
            stall_t.append(stt)
        if not keys:
            return {}
        return {"key": np.concatenate(keys), "start": np.concatenate(starts),
                "end": np.concatenate(ends), "wr": np.concatenate(wrs),
                "bytes": np.concatenate(nbytes), "stall_f": np.concatenate(stall_f),
                "stall_t": np.concatenate(stall_t)}

    def _link(self) -> pa.Table:
        tr = self._transfers()
        if not tr:
            return events.empty("link")
        dt = self.sc.sampling.link_ms * 1e6
        topo = self.topo
        K = int(self.t_end // dt) + 1
        qkeys, q = np.unique(tr["key"], return_inverse=True)
        Q = qkeys.size
        grid = np.arange(K) * dt
        part_c = np.zeros((Q, K))
        part_p = np.zeros((Q, K))
        part_b = np.zeros((Q, K))
        start, end, wr, vol = tr["start"], tr["end"], tr["wr"], tr["bytes"]
        done = np.isfinite(end)
        kc = np.minimum(np.ceil(end[done] / dt), K).astype(np.int64)
        cell = q[done] * (K + 1) + kc
        full_wr = np.bincount(cell, weights=wr[done], minlength=Q * (K + 1)).reshape(Q, K + 1)
        full_b = np.bincount(cell, weights=vol[done], minlength=Q * (K + 1)).reshape(Q, K + 1)
        kp = np.ceil(start / dt).astype(np.int64)
        k_hi = np.where(done, np.minimum(np.ceil(np.where(done, end, 0.0) / dt), K), K)
        cnt = np.maximum(k_hi.astype(np.int64) - kp, 0)
        cells = np.flatnonzero(cnt)
        if cells.size:
            c = cnt[cells]
            rep = np.repeat(cells, c)
            k = kp[rep] + np.arange(rep.size) - np.repeat(np.cumsum(c) - c, c)
            tk = grid[k]
            s0, e0 = start[rep], end[rep]
            live = done[rep]
            with np.errstate(invalid="ignore", divide="ignore"):
                f_live = np.clip((tk - s0) / np.maximum(e0 - s0, 1.0), 0.0, 1.0)
                st_t = tr["stall_t"][rep]
                f_hung = tr["stall_f"][rep] * np.clip(
                    (tk - s0) / np.maximum(st_t - s0, 1.0), 0.0, 1.0)
            frac = np.where(live, f_live, np.nan_to_num(f_hung))
            w = wr[rep]
            comp = np.floor(w * frac)
            posted = np.minimum(w, comp + WR_WINDOW)
            broken = self._broken_qp(qkeys)
            if broken is not None:
                on_broken = (q[rep] == broken) & ~live
                grow = np.minimum(STALL_POST_CAP,
                                  np.floor(STALL_POST_RATE * np.maximum(tk - st_t, 0) / 1e9))
                posted = np.where(on_broken, comp + WR_WINDOW + grow, posted)
            cell = q[rep] * K + k
            part_c += np.bincount(cell, weights=comp, minlength=Q * K).reshape(Q, K)
            part_p += np.bincount(cell, weights=posted, minlength=Q * K).reshape(Q, K)
            part_b += np.bincount(cell, weights=np.floor(vol[rep] * frac),
                                  minlength=Q * K).reshape(Q, K)
        cum_wr = np.cumsum(full_wr, axis=1)[:, :K]
        cum_b = np.cumsum(full_b, axis=1)[:, :K]
        completed = cum_wr + part_c
        posted_all = cum_wr + part_p
        nbytes = cum_b + part_b
        rank = (qkeys // topo.n_nodes).astype(np.int64)
        peer = (qkeys % topo.n_nodes).astype(np.int64)
        node = rank // self.sc.gpus_per_node
        n = Q * K
        r_rows = np.repeat(rank, K)
        t = np.tile(grid, Q)
        trow = np.rint(t).astype(np.int64) + self.t0 + self.node_skew[np.repeat(node, K)]
        cols = [
            _const(self.sc.job, n),
            _str_col(tuple(topo.node_names), np.repeat(node, K)),
            pa.array(r_rows.astype(np.int32)),
            _str_col(tuple(topo.device_names), topo.device_of_rank[r_rows]),
            _str_col(tuple(topo.node_names), np.repeat(peer, K)),
            pa.array(trow),
            _u64(posted_all.ravel()),
            _u64(completed.ravel()),
            _u64(nbytes.ravel()),
        ]
        table = pa.Table.from_arrays(cols, schema=events.SCHEMAS["link"])
        return table.take(pa.array(np.argsort(trow, kind="stable")))

    def _broken_qp(self, qkeys: np.ndarray) -> int | None:
        h = self.eng.faults.hang
        if h is None or not h.triggered or h.cause != "hardware" or h.peer_rank is None:
            return None
        key = h.rank * self.topo.n_nodes + h.peer_rank // self.sc.gpus_per_node
        pos = int(np.searchsorted(qkeys, key))
        return pos if pos < qkeys.size and qkeys[pos] == key else None

    # -----------------------------------------------------------------------------------------

    def _gpu(self) -> pa.Table:
        dt = self.sc.sampling.gpu_ms * 1e6
        topo = self.topo
        K = int(self.t_end // dt) + 1
        W = topo.world
        rng = np.random.default_rng(self._gpu_rng_seed)
        grid = np.arange(K) * dt
        sm = GPU_SM_MHZ - rng.integers(0, 30, size=(W, K))
        temp = 58 + rng.integers(0, 12, size=(W, K))
        util = 88 + rng.integers(0, 12, size=(W, K))
        power = 520.0 + rng.normal(0.0, 25.0, size=(W, K))
        reasons = np.zeros((W, K), dtype=np.uint64)
        for f, cf in zip(self._compute_faults(), self.eng.faults.compute, strict=True):
            if not f.gpu_throttle or cf.observed.it_first is None:
                continue
            on = (grid >= cf.observed.first_ns) & (grid <= cf.observed.last_ns)
            for r in f.ranks:
                sm[r, on] = int(GPU_SM_MHZ / cf.severity)
                temp[r, on] = 87
                power[r, on] = 380.0
                reasons[r, on] = THROTTLE_HW
        h = self.eng.faults.hang
        if h is not None and h.triggered:
            after = grid > h.trigger_ns
            util[:, after] = 100
            power[:, after] = 240.0
        n = W * K
        ranks = np.repeat(np.arange(W), K)
        node = ranks // self.sc.gpus_per_node
        t = np.rint(np.tile(grid, W)).astype(np.int64) + self.t0 + self.node_skew[node]
        cols = [
            _const(self.sc.job, n),
            _str_col(tuple(topo.node_names), node),
            pa.array(ranks.astype(np.int32)),
            pa.array((ranks % self.sc.gpus_per_node).astype(np.int32)),
            pa.array(t),
            pa.array(sm.ravel().astype(np.int32)),
            pa.array(np.full(n, GPU_MEM_MHZ, np.int32)),
            pa.array(temp.ravel().astype(np.int32)),
            pa.array(np.round(power.ravel(), 1)),
            pa.array(util.ravel().astype(np.int32)),
            pa.array(reasons.ravel(), pa.uint64()),
        ]
        table = pa.Table.from_arrays(cols, schema=events.SCHEMAS["gpu"])
        return table.take(pa.array(np.argsort(t, kind="stable")))

    def _compute_faults(self) -> list[Fault]:
        return [self.sc.faults[cf.fault_index] for cf in self.eng.faults.compute]
