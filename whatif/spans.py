"""OpDuration tensors and the per-stage program from ``span`` rows (what-if §3.1-§3.2).

The what-if analysis (papers/whatif-stragglers.md) organizes the traced operations of each
type into a tensor indexed by [step, micro-batch, PP rank, DP rank] (§3.2, "Estimate
idealized operation durations"). :func:`from_spans` builds them from ``span`` rows (framework
timers, or the simulator's ground truth); :mod:`.whatif_coll` derives the same from ``coll``
rows alone. Tensor parallelism is collapsed as in the paper (§7): one *worker* per
(PP rank, DP rank), represented by its first TP/CP member.

* Kinds: the span ``op`` (Table 1); for ``other`` and ``optimizer`` spans the importer's
  ``optype`` column when present (NDTimeline names with known semantics, e.g. the
  optimizer's grad-norm all-reduce over every worker); a generic ``other`` span that starts
  with a ``coll`` operation is a collective among that communicator's members.
* Compute operations keep their traced duration. GC pauses (``gc`` spans) become a
  separate ``gc/<op>`` part of the operation they delay (§5.4).
* Communication operations keep only their *transfer duration*: their end minus the latest
  start among the peers of the collective or point-to-point pair (§3.2); when the ``coll``
  row of the operation knows ``t_start`` (the device-side start of the transfer) we use
  ``end - t_start``, which needs no clock alignment between nodes.
* TP/CP collectives issued inside a compute span (seen in ``coll`` rows) become the
  ``forward-tp`` / ``backward-tp`` part of that span, the rest stays compute.

The program of a stage is the order of its operations in one reference (step, DP rank),
with point-to-point operations that were in flight together grouped into one batch
(Megatron's ``batch_isend_irecv``). All DP ranks and steps must run the same program (a
static schedule, §9); steps where some worker misses an operation of it are dropped. The
actual step time is the last end minus the step's start (its first operation, or the end
of the previous step when ranks already drifted into this one: then it is the period).
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.events import JobMeta
from failslow.whatif.ops import (
    BASE_KINDS,
    MB_INDEXED,
    NAMED_KINDS,
    TP_PART,
    CollOps,
    Kind,
    OpTrace,
    WhatIfInputError,
    coll_ops,
    composite_key,
    late_share,
    match_ops,
    occurrence,
    str_codes,
    transfer_ns,
    worker_coords,
    worker_table,
)

log = logging.getLogger(__name__)


def from_spans(span: pa.Table, meta: JobMeta, coll: pa.Table | None = None,
               comm_ops: CollOps | None = None) -> OpTrace:
    """OpDuration tensors and programs from ``span`` rows (see the module docstring);
    ``coll`` rows (or their already paired ``comm_ops``) refine transfer durations."""
    if span.num_rows == 0:
        raise WhatIfInputError("no span rows")
    reps, members = worker_table(meta)
    stage_of, dp_of, member_of = worker_coords(meta)
    rank = np.asarray(span.column("rank").to_numpy(), dtype=np.int64)
    if rank.max() >= meta.world_size:
        raise WhatIfInputError(f"span rank {int(rank.max())} >= world size {meta.world_size}")
    step = np.asarray(span.column("step").to_numpy(), dtype=np.int64)
    mb = np.asarray(span.column("microbatch").to_numpy(), dtype=np.int64)
    chunk = np.asarray(span.column("chunk").to_numpy(), dtype=np.int64)
    t0 = np.asarray(span.column("t_start").to_numpy(), dtype=np.int64)
    t1 = np.asarray(span.column("t_end").to_numpy(), dtype=np.int64)
    names, code = str_codes(span.column("op"))
    if "optype" in span.column_names:
        onames, ocode = str_codes(span.column("optype"))
        override = np.isin(code, [i for i, n in enumerate(names) if n in ("other", "optimizer")])
        code = np.where(override, ocode + len(names), code)
        names = names + onames
    if comm_ops is None and coll is not None and coll.num_rows:
        comm_ops = coll_ops(coll, meta)
    names, code = _split_other(names, code, rank, t0, comm_ops)
    uniq = sorted(set(names))
    code = np.array([uniq.index(n) for n in names], dtype=np.int64)[code]
    names = uniq
    actual = _actual_step_times(step, t0, t1)
    is_gc = code == names.index("gc") if "gc" in names else np.zeros(code.size, dtype=bool)
    keep = (member_of[rank] == 0) & ~is_gc
    if not keep.any():
        raise WhatIfInputError("no span rows of the workers' first ranks")
    kinds: dict[str, Kind] = {}
    for i in np.unique(code[keep]).tolist():
        name = names[i]
        kinds[name] = BASE_KINDS.get(name) or NAMED_KINDS.get(name) or Kind(name, "other")
    kinds = _refine_other_kinds(kinds, names, code[keep], rank[keep], t0[keep], comm_ops,
                                meta, stage_of)

    r, st, c, a, b = rank[keep], step[keep], code[keep], t0[keep], t1[keep]
    m, ch = mb[keep], chunk[keep]
    steps, si = np.unique(st, return_inverse=True)
    S = steps.size
    p_of, d_of = stage_of[r], dp_of[r]
    use_mb = np.isin(c, [i for i, n in enumerate(names) if n in MB_INDEXED]) & (m >= 0)
    if (ch >= 0).any():
        use_mb[:] = False   # interleaved: index compute and p2p by occurrence
    index = np.where(use_mb, m, occurrence([si, r, c], a))
    t_base = int(a.min())
    start: dict[str, np.ndarray] = {}
    end: dict[str, np.ndarray] = {}
    rowpos: dict[str, np.ndarray] = {}
    for name in kinds:
        sel = np.flatnonzero(c == names.index(name))
        shape = (S, int(index[sel].max()) + 1, meta.pp, meta.dp)
        s_arr = np.full(shape, np.nan)
        e_arr = np.full(shape, np.nan)
        pos = np.full(shape, -1, dtype=np.int64)
        where = (si[sel], index[sel], p_of[sel], d_of[sel])
        s_arr[where] = (a[sel] - t_base).astype(np.float64)
        e_arr[where] = (b[sel] - t_base).astype(np.float64)
        pos[where] = sel
        start[name], end[name], rowpos[name] = s_arr, e_arr, pos

    programs = _programs(start, end, kinds, meta)
    missing, first_gap = _gaps(start, programs)
    complete = missing == 0
    if not complete.any():
        raise WhatIfInputError("no step in which every worker ran the whole program ("
                               + _closest(missing, first_gap, steps) + ")")
    if not complete.all():
        log.info("what-if: %d of %d steps dropped (some worker misses an operation)",
                 int((~complete).sum()), S)
    # durations
    base = {n: v[complete] for n, v in start.items()}
    fin = {n: v[complete] for n, v in end.items()}
    dur: dict[str, np.ndarray] = {}
    for name, kind in kinds.items():
        if kind.comm:
            dur[name] = _transfer(name, kind, base, fin, meta)
        else:
            dur[name] = (fin[name] - base[name]) / 1e9
    if comm_ops is not None and len(comm_ops):
        _coll_transfers(dur, kinds, {n: v[complete] for n, v in rowpos.items()}, r, a,
                        comm_ops)
    parts: dict[str, list[str]] = {}
    if comm_ops is not None and len(comm_ops):
        _tp_parts(dur, kinds, parts, base, fin, rowpos, complete, r, a, b, comm_ops)
    gc_info = _gc_parts(dur, kinds, parts, base, fin, steps[complete], rank, step,
                        t0 - t_base, t1 - t_base, is_gc, stage_of, dp_of, member_of)
    late = late_share(comm_ops, meta.world_size) if comm_ops is not None else None
    return OpTrace(steps=steps[complete], pp=meta.pp, dp=meta.dp, kinds=kinds, dur=dur,
                   parts=parts, programs=programs,
                   actual=np.array([actual[int(s)] for s in steps[complete]]),
                   ranks=reps, members=members, source="span", gc=gc_info, late_share=late)


def _split_other(names: list[str], code: np.ndarray, rank: np.ndarray, t0: np.ndarray,
                 ops: CollOps | None) -> tuple[list[str], np.ndarray]:
    """Generic ``other`` spans that start with a ``coll`` operation of their rank become
    ``other:<comm kind>-<op>`` (one kind per kind of collective), the rest stay ``other``."""
    if "other" not in names or ops is None or len(ops) == 0:
        return names, code
    sel = np.flatnonzero(code == names.index("other"))
    j = match_ops(rank[sel], t0[sel], ops.rank, ops.enter, 50_000)
    hit = j >= 0
    hit[hit] = ops.kind[j[hit]] >= 0
    if not hit.any():
        return names, code
    label = ops.kind[j[hit]] * len(events.COLL_OPS) + ops.op[j[hit]]
    out_names = list(names)
    code = code.copy()
    for lab in np.unique(label).tolist():
        k, o = divmod(int(lab), len(events.COLL_OPS))
        out_names.append(f"other:{events.COMM_KINDS[k]}-{events.COLL_OPS[o]}")
        code[sel[hit][label == lab]] = len(out_names) - 1
    return out_names, code


def _actual_step_times(step: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> dict[int, float]:
    """Per step: last end minus its start, the start being its first operation's start or,
    when the previous step is in the trace and ended later, that end (ranks drift into the
    next step while others finish; then the step time is the period between step ends)."""
    steps, si = np.unique(step, return_inverse=True)
    lo = np.full(steps.size, np.iinfo(np.int64).max)
    hi = np.full(steps.size, np.iinfo(np.int64).min)
    np.minimum.at(lo, si, t0)
    np.maximum.at(hi, si, t1)
    out: dict[int, float] = {}
    ends = dict(zip(steps.tolist(), hi.tolist(), strict=True))
    for s, a, b in zip(steps.tolist(), lo.tolist(), hi.tolist(), strict=True):
        begin = max(a, ends.get(s - 1, a))
        out[s] = (b - begin) / 1e9
    return out


def _refine_other_kinds(kinds: dict[str, Kind], names: list[str], code: np.ndarray,
                        rank: np.ndarray, t0: np.ndarray, ops: CollOps | None, meta: JobMeta,
                        stage_of: np.ndarray) -> dict[str, Kind]:
    """Unknown operation names that match a ``coll`` operation (same rank, same start) are
    collectives among that communicator's members (``stages`` group); the rest are compute.
    An embedding all-reduce without coll rows runs between the first and last stage."""
    out = dict(kinds)
    for name, kind in kinds.items():
        if name in BASE_KINDS or (name in NAMED_KINDS and kind.group != "stages"):
            continue
        sel = np.flatnonzero(np.isin(code, [i for i, n in enumerate(names) if n == name]))
        members = None
        if ops is not None and len(ops) and sel.size:
            j = match_ops(rank[sel[:1]], t0[sel[:1]], ops.rank, ops.enter, 50_000)[0]
            ci = int(ops.comm_index[j]) if j >= 0 else -1
            members = ops.comm_ranks[ci] if ci >= 0 else None
        if members is None:
            if kind.group == "stages":
                out[name] = Kind(name, kind.category, True, "stages", (0, meta.pp - 1))
            continue
        idx = np.asarray(members, dtype=np.int64)
        stages = tuple(sorted(set(stage_of[idx].tolist())))
        out[name] = Kind(name, kind.category, True, "stages", stages, idx.size > len(stages))
    return out


# ---------------------------------------------------------------------------------------------
# programs


def _programs(start: dict[str, np.ndarray], end: dict[str, np.ndarray],
              kinds: dict[str, Kind], meta: JobMeta
              ) -> list[list[tuple[tuple[str, int], ...]]]:
    """Per stage: the operation order of the reference step (the first step in which DP
    rank 0 of every stage has the most operations), point-to-point operations that started
    before any of them ended grouped into one batch."""
    names = list(start)
    counts = sum((~np.isnan(start[n][:, :, :, 0])).sum(axis=1) for n in names)  # (S, P)
    ref = int(np.argmax(counts.sum(axis=1)))
    programs: list[list[tuple[tuple[str, int], ...]]] = []
    for p in range(meta.pp):
        rows: list[tuple[float, int, str, int, float]] = []
        for n in names:
            s = start[n][ref, :, p, 0]
            for i in np.flatnonzero(~np.isnan(s)).tolist():
                rows.append((float(s[i]), names.index(n), n, int(i), float(end[n][ref, i, p, 0])))
        rows.sort()
        prog: list[tuple[tuple[str, int], ...]] = []
        batch: list[tuple[str, int]] = []
        batch_end = np.inf
        for t_s, _, n, i, t_e in rows:
            if kinds[n].group == "p2p":
                if batch and t_s < batch_end:
                    batch.append((n, i))
                    batch_end = min(batch_end, t_e)
                    continue
                if batch:
                    prog.append(tuple(batch))
                batch, batch_end = [(n, i)], t_e
                continue
            if batch:
                prog.append(tuple(batch))
                batch, batch_end = [], np.inf
            prog.append(((n, i),))
        if batch:
            prog.append(tuple(batch))
        programs.append(prog)
    return programs


def _gaps(start: dict[str, np.ndarray], programs: list[list[tuple[tuple[str, int], ...]]]
          ) -> tuple[np.ndarray, list[tuple[int, int, str, int] | None]]:
    """Per step: how many operations of the workers' programs no span covers, and the first
    of them (stage, DP replica, operation, its index); a step is complete without any."""
    S = next(iter(start.values())).shape[0]
    missing = np.zeros(S, dtype=np.int64)
    first: list[tuple[int, int, str, int] | None] = [None] * S
    for p, prog in enumerate(programs):
        for ops in prog:
            for n, i in ops:
                gap = np.isnan(start[n][:, i, p, :])
                missing += gap.sum(axis=1)
                for s_ in np.flatnonzero(gap.any(axis=1)).tolist():
                    if first[s_] is None:
                        first[s_] = (p, int(np.flatnonzero(gap[s_])[0]), n, i)
    return missing, first


def _closest(missing: np.ndarray, first: list[tuple[int, int, str, int] | None],
             steps: np.ndarray) -> str:
    """Where the most complete step falls short (:func:`_gaps`), in words."""
    best = int(np.argmin(missing))
    where = first[best]
    if where is None:
        return "no operations"
    p, d, n, i = where
    return (f"step {int(steps[best])}, the most complete, lacks {int(missing[best])} "
            f"operation(s) of the workers' programs, first {n} #{i} of stage {p}, "
            f"DP replica {d}")


# ---------------------------------------------------------------------------------------------
# durations


def group_max(name: str, kind: Kind, arr: dict[str, np.ndarray], pp: int) -> np.ndarray:
    """Per operation, the latest value of ``arr`` among its peers (itself included). A
    pipeline operation's peer is the matching operation of the next / previous stage,
    cyclically (interleaved schedules send from the last stage to the first)."""
    a = arr[name]
    if kind.group == "p2p":
        peer = {"forward-send": ("forward-recv", 1), "forward-recv": ("forward-send", -1),
                "backward-send": ("backward-recv", -1), "backward-recv": ("backward-send", 1)}
        other, shift = peer[name]
        if other not in arr:
            return a
        b = np.roll(arr[other], -shift, axis=2)
        n = min(a.shape[1], b.shape[1])
        src = np.full_like(a, np.nan)
        src[:, :n] = b[:, :n]
        return np.fmax(a, src)
    if kind.group == "dp":
        return np.broadcast_to(np.fmax.reduce(a, axis=3, keepdims=True), a.shape)
    if kind.group == "world":
        return np.broadcast_to(
            np.fmax.reduce(np.fmax.reduce(a, axis=3, keepdims=True), axis=2, keepdims=True),
            a.shape)
    if kind.group == "stages":
        sub = np.fmax.reduce(a[:, :, list(kind.stages), :], axis=2, keepdims=True)
        if kind.dp_sync:
            sub = np.fmax.reduce(sub, axis=3, keepdims=True)
        return np.broadcast_to(sub, a.shape)
    return a


def _transfer(name: str, kind: Kind, start: dict[str, np.ndarray], end: dict[str, np.ndarray],
              meta: JobMeta) -> np.ndarray:
    """end - latest start among the peers (§3.2), clamped at 0 (clock error)."""
    with np.errstate(invalid="ignore"):
        latest = group_max(name, kind, start, meta.pp)
        return np.maximum(end[name] - latest, 0.0) / 1e9


def _coll_transfers(dur: dict[str, np.ndarray], kinds: dict[str, Kind],
                    rowpos: dict[str, np.ndarray], rank: np.ndarray, t0: np.ndarray,
                    ops: CollOps) -> None:
    """Replace transfer durations by ``end - t_start`` of the matching coll operation (same
    rank, ``enter`` at the span's start), which needs no cross-node clock alignment."""
    known = ops.t_start != events.NULL_TIME
    if not known.any():
        return
    for name, kind in kinds.items():
        if not kind.comm or kind.group == "part":
            continue
        pos = rowpos[name]
        ok = pos >= 0
        rows = pos[ok]
        j = match_ops(rank[rows], t0[rows], ops.rank, ops.enter, 1000)
        hit = j >= 0
        hit[hit] = known[j[hit]]
        jj = np.where(hit, j, 0)
        x = np.maximum((ops.end[jj] - ops.t_start[jj]) / 1e9, 0.0)
        d = dur[name].copy()
        d[ok] = np.where(hit, x, d[ok])
        dur[name] = d


def _tp_parts(dur: dict[str, np.ndarray], kinds: dict[str, Kind],
              parts: dict[str, list[str]], start: dict[str, np.ndarray],
              end: dict[str, np.ndarray], rowpos: dict[str, np.ndarray],
              complete: np.ndarray, rank: np.ndarray, t0: np.ndarray, t1: np.ndarray,
              ops: CollOps) -> None:
    """TP/CP collectives inside a compute span: their transfer time becomes the span's
    ``forward-tp`` / ``backward-tp`` part and leaves its compute duration."""
    tpk = (ops.kind == events.COMM_KINDS.index("tp")) | (ops.kind == events.COMM_KINDS.index("cp"))
    if not tpk.any():
        return
    xfer = transfer_ns(ops)[tpk] / 1e9
    orank, oent = ops.rank[tpk], ops.enter[tpk]
    for name, part in TP_PART.items():
        if name not in kinds:
            continue
        pos = rowpos[name][complete]
        ok = pos >= 0
        rows = pos[ok]
        # assign each TP op to the compute span of its rank that contains its enter
        srank, sstart, send = rank[rows], t0[rows], t1[rows]
        # the span of the same rank that started last before the TP op entered
        base = int(min(sstart.min(), oent.min())) - 1
        width = int(max(send.max(), oent.max())) - base + 2
        skey = composite_key(srank, sstart, base, width)
        order = np.argsort(skey, kind="stable")
        j = np.searchsorted(skey[order], composite_key(orank, oent, base, width), side="right") - 1
        sel_span = order[np.clip(j, 0, None)]
        valid = (j >= 0) & (srank[sel_span] == orank) & (oent <= send[sel_span])
        total = np.zeros(rows.size)
        np.add.at(total, sel_span[valid], xfer[valid])
        if not valid.any():
            continue
        tp = np.zeros_like(dur[name])
        tp[ok] = total
        tp[~ok] = np.nan
        dur[part] = tp
        dur[name] = dur[name] - np.nan_to_num(tp)
        kinds[part] = BASE_KINDS[part]
        parts.setdefault(name, []).append(part)


def _gc_parts(dur: dict[str, np.ndarray], kinds: dict[str, Kind], parts: dict[str, list[str]],
              start: dict[str, np.ndarray], end: dict[str, np.ndarray], steps: np.ndarray,
              rank: np.ndarray, step: np.ndarray, t0: np.ndarray, t1: np.ndarray,
              is_gc: np.ndarray, stage_of: np.ndarray, dp_of: np.ndarray,
              member_of: np.ndarray) -> dict[str, object]:
    """GC pauses (§5.4) become ``gc/<kind>`` parts of the worker's operations. A pause of
    the worker's first rank delays the launch of its next operation: the part is added to
    that operation. A pause of another TP member shows inside the first rank's compute that
    waits for it at a TP collective: the part moves out of that compute's duration."""
    info: dict[str, object] = {"pauses": int(is_gc.sum()), "total_s": 0.0, "ranks": []}
    if not is_gc.any():
        return info
    g = np.flatnonzero(is_gc)
    gd = (t1[g] - t0[g]) / 1e9
    info["total_s"] = float(gd.sum())
    info["ranks"] = sorted(set(rank[g].tolist()))
    info["max_s"] = float(gd.max())
    sidx = {int(s): i for i, s in enumerate(steps.tolist())}
    for k in g[t1[g] > t0[g]].tolist():
        si = sidx.get(int(step[k]))
        if si is None:
            continue
        p, d = int(stage_of[rank[k]]), int(dp_of[rank[k]])
        own = member_of[rank[k]] == 0
        best: tuple[float, str, int] | None = None
        for name, s in start.items():
            if not own and kinds[name].comm:
                continue
            v = s[si, :, p, d]
            if own:
                cand = np.flatnonzero(v >= t1[k] - 1000)
            else:
                cand = np.flatnonzero((v <= t1[k]) & (end[name][si, :, p, d] >= t1[k]))
            if cand.size:
                i = int(cand[np.argmin(v[cand])])
                if best is None or v[i] < best[0]:
                    best = (float(v[i]), name, i)
        if best is None:
            continue
        _, name, i = best
        part = f"gc/{name}"
        if part not in dur:
            dur[part] = np.where(np.isnan(dur[name]), np.nan, 0.0)
            kinds[part] = Kind(part, "gc")
            parts.setdefault(name, []).append(part)
        pause = (t1[k] - t0[k]) / 1e9
        if not own:
            pause = min(pause, max(float(dur[name][si, i, p, d]), 0.0))
            dur[name][si, i, p, d] -= pause
        dur[part][si, i, p, d] += pause
    return info
