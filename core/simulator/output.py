"""From the engine's column blocks to contract tables (events.md), the ground truth
(diagnosis.md) and a trace directory.

Tables are built in chunks of whole iterations so a 4096-rank run never holds all its rows as
Python objects or as one Arrow table; :func:`write_sim` streams the chunks into Parquet row
groups (or JSON Lines).

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

import itertools
import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from failslow import events
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import JobMeta
from failslow.simulator.engine import Engine
from failslow.simulator.faults import HangRT, LinkRT, Observed
from failslow.simulator.scenario import Fault, Scenario
from failslow.simulator.schedule import BWD, DPSYNC, FWD, OPT, P2P
from failslow.simulator.topology import K_CP, K_DP, K_PP, K_TP, KIND_NAMES, Topology

log = logging.getLogger(__name__)

CHUNK_ROWS = 2_000_000
WR_WINDOW = 16                 # work requests posted ahead of completions on a busy QP
STALL_POST_RATE = 4.0          # posted WRs per second on a broken link after it stalls
STALL_POST_CAP = 4096
GPU_SM_MHZ, GPU_MEM_MHZ = 1980, 2619
THROTTLE_HW = 0x8 | 0x40       # HW slowdown | HW thermal slowdown (NVML clocks-event reasons)
STAGE_OF_KIND = {K_TP: "tp_collective", K_CP: "tp_collective", K_DP: "dp_sync",
                 K_PP: "pp_p2p"}


def _str_col(values: tuple[str, ...], codes: np.ndarray) -> pa.Array:
    return pc.take(pa.array(values, pa.string()), pa.array(codes.astype(np.int32)))


def _const(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


def _u64(values: np.ndarray, null: np.ndarray | None = None) -> pa.Array:
    return pa.array(values.astype(np.uint64), pa.uint64(), mask=null)


@dataclass
class SimResult:
    """A finished simulation: ``meta``, ``truth``, tables (built on demand) and figures."""

    scenario: Scenario
    seed: int
    meta: JobMeta
    truth: Diagnosis
    stats: dict[str, Any]
    builder: TraceBuilder
    _tables: dict[str, pa.Table] | None = field(default=None, repr=False)

    def iter_tables(self, kind: str) -> Iterator[pa.Table]:
        """The rows of ``kind`` in chunks with the contract schema."""
        return self.builder.iter_tables(kind)

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.builder.kinds()

    @property
    def tables(self) -> dict[str, pa.Table]:
        """Every kind as one table (builds all rows in memory: for small jobs and tests)."""
        if self._tables is None:
            out = {}
            for kind in self.kinds:
                parts = list(self.iter_tables(kind))
                out[kind] = pa.concat_tables(parts) if parts else events.empty(kind)
            self._tables = out
        return self._tables


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
        self.median_iter_ns = _median_iteration_ns(eng.iter_end)
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


# ---------------------------------------------------------------------------------------------
# meta and truth


def job_meta(eng: Engine) -> JobMeta:
    sc, topo = eng.sc, eng.topo
    p = sc.parallel
    return JobMeta(job=sc.job, t=sc.start_time_ns, world_size=topo.world, tp=p.tp, pp=p.pp,
                   dp=p.dp, cp=p.cp, microbatches=sc.microbatches, schedule=sc.schedule,
                   nodes=topo.nodes_map(), comms=tuple(topo.comms))


def _median_iteration_ns(iter_end: list[float]) -> float:
    d = _iteration_durations(iter_end)
    d = d[np.isfinite(d)]
    return float(np.median(d)) if d.size else 0.0


def _iteration_durations(iter_end: list[float]) -> np.ndarray:
    ends = np.asarray(iter_end, dtype=float)
    prev = np.concatenate([[0.0], ends[:-1]])
    return ends - prev


def period_ops(eng: Engine) -> int:
    """Operations per iteration on rank 0 (stage 0): its TP/CP rounds, p2p ops and DP syncs."""
    prog = eng.programs[0]
    n = 0
    for st in prog:
        if st.kind == P2P:
            n += len(st.ops)
        elif st.kind == OPT:
            continue
        elif st.kind in (FWD, BWD):
            i = 0 if st.kind == FWD else 1
            n += eng.ntp[i] + eng.ncp[i]
        elif st.kind == DPSYNC and eng.D > 1:
            n += 1
    return n


def build_truth(eng: Engine, counterfactual: Callable[[], Engine] | None = None
                ) -> tuple[Diagnosis, dict[str, Any]]:
    """The ground truth (diagnosis.md) of a finished run, plus figures for the stats.

    ``slowdown`` of a slow fault: the mean true iteration time over the iterations the fault
    touched, over the baseline: the median of the iterations no fault touched (nor the one
    after a fault). With fewer than 3 such iterations the baseline is the same iterations of
    a fault-free run with the same seed (``counterfactual``), the what-if paper's
    straggler-free timeline (§3.2-3.3).
    """
    sc, topo = eng.sc, eng.topo
    t0 = sc.start_time_ns
    dur = _iteration_durations(eng.iter_end)
    complete = np.isfinite(dur)
    iterations = {"period_ops": period_ops(eng),
                  "median_s": round(float(np.median(dur[complete])) / 1e9, 6)
                  if complete.any() else None,
                  "count": int(complete.sum())}
    # iterations touched by any fault (plus the one after, which may still be delayed)
    touched = np.zeros(dur.size, dtype=bool)
    for o in _all_observed(eng):
        if o.it_first is not None:
            lo, hi = o.it_first, (o.it_last if o.it_last is not None else dur.size)
            touched[lo:min(dur.size, hi + 2)] = True
    healthy = complete & ~touched
    healthy[0] = False
    baseline = float(np.median(dur[healthy])) if healthy.sum() >= 3 else None
    cf_cache: list[np.ndarray] = []

    def cf_durations() -> np.ndarray | None:
        if counterfactual is None:
            return None
        if not cf_cache:
            cf_cache.append(_iteration_durations(counterfactual().iter_end))
        return cf_cache[0]

    def slowdown(obs_list: list[Observed]) -> float | None:
        its: set[int] = set()
        for o in obs_list:
            if o.it_first is not None and o.it_last is not None:
                its.update(range(o.it_first, o.it_last + 1))
        idx = np.array(sorted(i for i in its if i < dur.size and complete[i]), dtype=np.int64)
        if idx.size == 0:
            return None
        if baseline is not None:
            return round(float(dur[idx].mean()) / baseline, 4)
        cf_dur = cf_durations()
        if cf_dur is not None:
            ok = idx[idx < cf_dur.size]
            return round(float(dur[ok].mean() / cf_dur[ok].mean()), 4) if ok.size else None
        return None

    anomalies: list[Anomaly] = []
    unobserved: list[int] = []
    compute_by = {cf.fault_index: cf for cf in eng.faults.compute}
    link_by = {lf.fault_index: lf for lf in eng.faults.links}
    for i, f in enumerate(sc.faults):
        fid = f.id or f"fault-{i}"
        if f.is_hang:
            h = eng.faults.hang
            if h is None or not h.triggered or not math.isfinite(h.trigger_ns):
                unobserved.append(i)
                continue
            anomalies.append(_hang_anomaly(fid, f, h, topo, t0))
            continue
        obs: list[Observed] = []
        cf = compute_by.get(i)
        lf = link_by.get(i)
        if cf is not None:
            obs.append(cf.observed)
        if lf is not None:
            obs.append(lf.observed)
        seen = [o for o in obs if o.it_first is not None]
        if not seen or (f.cause == "mixed" and len(seen) < 2):
            unobserved.append(i)
            if not seen:
                continue
        first = min(o.first_ns for o in seen)
        last = max(o.last_ns for o in seen)
        open_ended = f.duration_iterations is None and f.duration_s is None
        extra: dict[str, Any] = {
            "severity": f.severity,
            "iteration_start": min(o.it_first for o in seen if o.it_first is not None),
            "iteration_end": None if open_ended else
            max(o.it_last for o in seen if o.it_last is not None) + 1,
            "baseline_s": round(baseline / 1e9, 6) if baseline else None,
        }
        link_pair: list[int] | None = None
        comm = comm_kind = stage = None
        if lf is not None:
            pair, kind = _link_pair(lf, topo)
            link_pair = pair
            comm, comm_kind, stage = int(topo.comm[kind, pair[0]]), KIND_NAMES[kind], \
                STAGE_OF_KIND[kind]
            extra["nodes"] = [topo.node_names[n] for n in lf.nodes]
            extra["link_severity"] = lf.severity
            extra["comms"] = _link_comms(lf, topo)
        if f.cause == "compute":
            stage = f.stage
            ranks = sorted(set(f.ranks))
        elif f.cause == "communication":
            assert link_pair is not None
            ranks = sorted(link_pair)
        else:
            ranks = sorted(set(f.ranks))
        anomalies.append(Anomaly(
            id=fid, kind="slow", cause=f.cause, ranks=ranks, link=link_pair, comm=comm,
            comm_kind=comm_kind, stage=stage, start_ns=t0 + int(round(first)),
            end_ns=None if open_ended or not math.isfinite(last) else t0 + int(round(last)),
            slowdown=slowdown(seen), extra=extra))
    truth = Diagnosis(job=sc.job, iterations=iterations, anomalies=anomalies, whatif=None)
    stats = {"baseline_iteration_s": None if baseline is None else baseline / 1e9,
             "unobserved_faults": unobserved}
    return truth, stats


def _all_observed(eng: Engine) -> list[Observed]:
    out = [cf.observed for cf in eng.faults.compute] + [lf.observed for lf in eng.faults.links]
    h = eng.faults.hang
    if h is not None and h.trigger_it is not None:
        o = Observed(it_first=h.trigger_it, it_last=10**9)
        out.append(o)
    return out


def _hang_anomaly(fid: str, f: Fault, h: HangRT, topo: Topology, t0: int) -> Anomaly:
    link = None
    if h.cause == "hardware" and h.peer_rank is not None:
        gpn = topo.gpus_per_node
        if h.peer_rank // gpn != h.rank // gpn:
            link = [h.rank, h.peer_rank]
    extra: dict[str, Any] = {"iteration_start": h.trigger_it, "seq": h.seq}
    if h.cause == "inconsistent":
        extra["mismatch"] = h.mismatch
    if h.cause == "hardware" and h.peer_rank is not None:
        extra["peer_rank"] = h.peer_rank
    return Anomaly(id=fid, kind="hang", cause=h.cause, ranks=[h.rank], link=link,
                   comm=h.comm, comm_kind=KIND_NAMES[h.kind], stage=STAGE_OF_KIND[h.kind],
                   start_ns=t0 + int(round(h.trigger_ns)), end_ns=None, slowdown=None,
                   extra=extra)


def _link_pair(lf: LinkRT, topo: Topology) -> tuple[list[int], int]:
    """Two global ranks whose traffic crosses the slow link: a PP pair if PP crosses it, else
    the first ring edge (DP, then TP, then CP) joining the two nodes, in rank order."""
    pp = lf.masks[K_PP]
    if pp.any():
        e, d, c, t = (int(x) for x in np.argwhere(pp)[0])
        a = int(topo.ranks[e, d, c, t])
        return [a, a + topo.stage_size], K_PP
    a_node, b_node = lf.nodes
    for kind in (K_DP, K_TP, K_CP):
        edge = topo.edge_crosses(kind, a_node, b_node).ravel()
        if edge.any():
            r = int(np.flatnonzero(edge)[0])
            return [r, int(topo.succ[kind, r])], kind
    raise ValueError("no traffic crosses the link")


def _link_comms(lf: LinkRT, topo: Topology) -> list[int]:
    ids: set[int] = set()
    pp = lf.masks[K_PP]
    if pp.any():
        lower = topo.ranks[:-1][pp]
        ids.update(int(x) for x in topo.comm[K_PP, lower])
    a, b = lf.nodes
    for kind in (K_DP, K_TP, K_CP):
        edge = topo.edge_crosses(kind, a, b).ravel()
        ids.update(int(x) for x in topo.comm[kind, np.flatnonzero(edge)])
    return sorted(ids)


# ---------------------------------------------------------------------------------------------
# writing


def write_sim(result: SimResult, out_dir: str | Path, fmt: str = "parquet") -> Path:
    """Write a trace directory: meta.json, one file per kind, truth.json, scenario.yaml."""
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"unknown trace format {fmt!r} (parquet or jsonl)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps(result.meta.to_row(), indent=1))
    for kind in ("coll", "progress", "link", "gpu", "span"):
        for stale in (out / f"{kind}.parquet", out / f"{kind}.jsonl"):
            stale.unlink(missing_ok=True)
    counts: dict[str, int] = {}
    for kind in result.kinds:
        path = out / f"{kind}.{fmt}"
        tables = result.iter_tables(kind)
        first = next(tables, None)
        if first is None:
            counts[kind] = 0
            if kind == "coll":           # required even when empty
                if fmt == "parquet":
                    pq.write_table(events.empty(kind), path, compression="zstd")
                else:
                    path.write_text("")
            continue
        chained = itertools.chain([first], tables)
        counts[kind] = (_write_parquet(chained, path, kind) if fmt == "parquet"
                        else _write_jsonl(chained, path))
    result.stats["rows_by_kind"] = counts
    result.stats["rows"] = sum(counts.values())
    (out / "truth.json").write_text(result.truth.to_json() + "\n")
    scen = result.scenario.to_dict()
    scen["seed"] = result.seed
    (out / "scenario.yaml").write_text(yaml.safe_dump(scen, sort_keys=False))
    return out


def _write_parquet(tables: Iterator[pa.Table], path: Path, kind: str) -> int:
    n = 0
    with pq.ParquetWriter(path, events.SCHEMAS[kind], compression="zstd") as writer:
        for table in tables:
            writer.write_table(table)
            n += table.num_rows
    return n


def _write_jsonl(tables: Iterator[pa.Table], path: Path) -> int:
    """One JSON object per line; null columns are left out (events.md allows both)."""
    n = 0
    with path.open("w") as fh:
        for table in tables:
            for batch in table.to_batches(max_chunksize=65536):
                for row in batch.to_pylist():
                    fh.write(json.dumps({k: v for k, v in row.items() if v is not None}))
                    fh.write("\n")
            n += table.num_rows
    return n
