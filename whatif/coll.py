"""OpDuration tensors derived from ``coll`` rows alone (what-if §3.1-§3.2 without framework
timers): the communication operations are traced, compute is the gaps between them.

1. Each worker's operations (its first TP/CP member's, TP collapsed as in §7) are classified
   by communicator kind: ``pp`` send/recv give the four pipeline operations (direction from
   ``peer`` versus the rank's own pipeline rank, micro-batch = occurrence in the step);
   ``dp`` all-gather is ``params-sync``, other ``dp`` collectives ``grads-sync``; ``tp``,
   ``cp`` and ``ep`` collectives run inside compute; other kinds are standalone collectives.
2. Steps: every ``params-sync`` starts one; its number is the round (``seq``) divided by
   the DP collectives per step, so all stages agree. Without DP, the pipeline operations
   number the steps (``seq`` over the stage's pipeline operations per step).
3. Compute: the schedule (``meta.schedule`` 1F1B or GPipe, ``meta.microbatches``) says
   which forward/backward/optimizer runs between two communication steps of a stage; it
   spans from the end of the previous one (the last end of a batch) to the start of the next
   one. The optimizer ends where the next step's ``params-sync`` starts. When one gap holds
   several computes (the last stage's forward and backward), it is split in the ratio of the
   kinds' mean single-gap durations; only their sum matters to the simulation, which runs
   them back to back on one stream.

The result is a table of synthetic ``span`` rows, turned into tensors by
:func:`~.whatif_ops.from_spans` (with the same ``coll`` rows for transfer durations and TP
parts).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.events import JobMeta
from failslow.whatif.ops import (
    CollOps,
    OpTrace,
    WhatIfInputError,
    coll_ops,
    occurrence,
    worker_coords,
)
from failslow.whatif.spans import from_spans

_K = {k: i for i, k in enumerate(events.COMM_KINDS)}
_INSIDE = (_K["tp"], _K["cp"], _K["ep"])
#: fallback weights of a compute kind when splitting a gap that holds several
_WEIGHT = {"forward-compute": 1.0, "backward-compute": 2.0, "optimizer": 0.5}


def _peer_ranks(ops: CollOps) -> np.ndarray:
    """Global rank of each operation's ``peer`` (a communicator rank), -1 when unknown."""
    sizes = np.array([len(m) for m in ops.comm_ranks], dtype=np.int64)
    if not sizes.size or not sizes.sum():
        return np.full(len(ops), -1, dtype=np.int64)
    flat = np.concatenate([np.asarray(m, dtype=np.int64) for m in ops.comm_ranks])
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    ok = (ops.comm_index >= 0) & (ops.peer >= 0)
    ci = np.where(ok, ops.comm_index, 0)
    ok &= ops.peer < sizes[ci]
    return np.where(ok, flat[np.where(ok, first[ci] + ops.peer, 0)], -1)


#: a DP collective this many times smaller than its communicator's largest is no gradient sync
SMALL_SYNC = 64


def _small(ops: CollOps) -> np.ndarray:
    """Operations of at most 1/:data:`SMALL_SYNC` of the bytes of the largest operation on
    their communicator (False when the sizes are unknown)."""
    if ops.nbytes is None or not len(ops):
        return np.zeros(len(ops), dtype=bool)
    _, inv = np.unique(ops.comm_index, return_inverse=True)
    inv = inv.reshape(-1)
    top = np.zeros(int(inv.max()) + 1, dtype=np.int64)
    np.maximum.at(top, inv, ops.nbytes)
    return (top[inv] > 0) & (ops.nbytes * SMALL_SYNC <= top[inv])


def _names(ops: CollOps, stage_of: np.ndarray) -> np.ndarray:
    """Operation name per coll operation ("" for TP-like ones and unknown kinds)."""
    n = len(ops)
    out = np.full(n, "", dtype=object)
    send, recv = ops.op == events.OP["send"], ops.op == events.OP["recv"]
    pp = ops.kind == _K["pp"]
    # the direction from the peer's pipeline stage: a communicator of two stages (one per
    # pair) need not list its members in stage order
    peer = _peer_ranks(ops)
    known = peer >= 0
    mine = stage_of[ops.rank]
    theirs = stage_of[np.where(known, peer, ops.rank)]
    up = np.where(known, theirs == mine + 1, ops.peer == ops.comm_rank + 1)
    down = np.where(known, theirs == mine - 1, ops.peer == ops.comm_rank - 1)
    out[pp & send & up] = "forward-send"
    out[pp & send & down] = "backward-send"
    out[pp & recv & down] = "forward-recv"
    out[pp & recv & up] = "backward-recv"
    dp = ops.kind == _K["dp"]
    out[dp & (ops.op == events.OP["allgather"])] = "params-sync"
    out[dp & (ops.op != events.OP["allgather"])] = "grads-sync"
    # a DP collective of a few bytes beside the gradient sync (a loss or grad-norm
    # all-reduce) is no gradient sync: like a TP collective, it runs inside a compute gap
    out[dp & _small(ops)] = ""
    other = (ops.kind >= 0) & ~pp & ~dp & ~np.isin(ops.kind, _INSIDE)
    for i in np.flatnonzero(other).tolist():
        out[i] = f"{events.COMM_KINDS[int(ops.kind[i])]}-{events.COLL_OPS[int(ops.op[i])]}"
    return out


def _steps(ops: CollOps, names: np.ndarray, main: np.ndarray, stage_of: np.ndarray,
           p2p_per_step: np.ndarray | None) -> np.ndarray:
    """Step number of every main operation: that of the latest step-opening operation of
    its rank. Steps open with the params-sync (numbered by its round over the DP
    collectives per step); without one and without a pipeline, right after the previous
    step's gradient sync; without DP, with the first pipeline operation of the step
    (numbered by its ``seq`` over the stage's pipeline operations per step)."""
    marks = np.flatnonzero(main & (names == "params-sync"))
    grads = np.flatnonzero(main & (names == "grads-sync"))
    after = 0  # marks open their step at their enter (0) or just after it (1)
    if not marks.size and grads.size and not (main & (ops.kind == _K["pp"])).any():
        # no params-sync and no pipeline (data parallelism with an all-reduce): a step ends
        # with its gradient sync, so the operations after one belong to the next step
        marks, after = grads, 1
    if marks.size:
        # DP collectives per step on each communicator: the seq step between marks
        order = np.lexsort((ops.seq[marks], ops.rank[marks]))
        seqs, ranks = ops.seq[marks][order].astype(np.int64), ops.rank[marks][order]
        diff = np.diff(seqs)[ranks[1:] == ranks[:-1]]
        per = int(np.bincount(diff[diff > 0]).argmax()) if (diff > 0).any() else 1
        step_of = ops.seq[marks].astype(np.int64) // per + after
    else:
        pp = np.flatnonzero(main & (ops.kind == _K["pp"]))
        if pp.size == 0 or p2p_per_step is None:
            raise WhatIfInputError("coll-only derivation needs the DP params-sync (all-gather) "
                                   "or the pipeline operations and micro-batches that make "
                                   "up each step; none found")
        # a rank's pipeline operations per step on each of its communicators (``seq`` counts
        # per communicator): all of them on a pipeline communicator, their share on each
        # of the two a middle stage has with per-pair communicators
        rank, comm = ops.rank[pp].astype(np.int64), ops.comm_index[pp].astype(np.int64)
        _, inv, count = np.unique(rank * (int(comm.max()) + 1) + comm, return_inverse=True,
                                  return_counts=True)
        share = count[inv.reshape(-1)] / np.bincount(rank)[rank]
        per_op = np.rint(p2p_per_step[stage_of[rank]] * share).astype(np.int64)
        seq = ops.seq[pp].astype(np.int64)
        first = seq % np.maximum(per_op, 1) == 0
        marks, step_of = pp[first], (seq // np.maximum(per_op, 1))[first]
    if marks.size == 0:
        raise WhatIfInputError("no step boundary (params-sync all-gather or first pipeline "
                               "operation of a step) among the operations")
    out = np.full(len(ops), -1, dtype=np.int64)
    idx = np.flatnonzero(main)
    base = int(ops.enter.min()) - 1
    width = int(ops.enter.max()) - base + 2
    key = ops.rank[marks] * width + (ops.enter[marks] - base + after)
    srt = np.argsort(key)
    q = ops.rank[idx] * width + (ops.enter[idx] - base)
    j = np.clip(np.searchsorted(key[srt], q, side="right") - 1, 0, None)
    ok = (np.searchsorted(key[srt], q, side="right") > 0) & (ops.rank[marks][srt][j]
                                                             == ops.rank[idx])
    out[idx] = np.where(ok, step_of[srt][j], -1)
    return out


def from_coll(coll: pa.Table, meta: JobMeta) -> OpTrace:
    """OpDuration tensors from ``coll`` rows (see the module docstring)."""
    from failslow.schedule import BWD, DPSYNC, FWD, OPT, P2P, build_program

    if meta.schedule not in ("1f1b", "gpipe"):
        raise WhatIfInputError(f"coll-only derivation needs a 1f1b or gpipe schedule, not "
                               f"{meta.schedule!r}")
    ops = coll_ops(coll, meta)
    if len(ops) == 0 or (ops.kind < 0).all():
        raise WhatIfInputError("coll rows without communicator kinds")
    stage_of, dp_of, member_of = worker_coords(meta)
    names = _names(ops, stage_of)
    main = (member_of[ops.rank] == 0) & (names != "")
    M = meta.microbatches
    per_step = None
    if M > 0:
        per_step = np.array([sum(len(s_.ops) for s_ in build_program(meta.schedule, p,
                                                                      meta.pp, M)
                                 if s_.kind == P2P) for p in range(meta.pp)])
    step = _steps(ops, names, main, stage_of, per_step)
    main &= step >= 0
    idx = np.flatnonzero(main)
    nm, rk, st = names[idx], ops.rank[idx], step[idx]
    if M <= 0:
        fs = (nm == "forward-send") & (stage_of[rk] == 0)
        M = int(np.bincount(st[fs] - st[fs].min()).max()) if fs.any() else 0
    if M <= 0:
        raise WhatIfInputError("coll-only derivation needs the number of micro-batches")
    codes = {n: i for i, n in enumerate(sorted(set(nm.tolist())))}
    code = np.array([codes[n] for n in nm.tolist()], dtype=np.int64)
    occ = occurrence([st, rk, code], ops.enter[idx])
    steps = np.unique(st)
    S, P, D = steps.size, meta.pp, meta.dp
    si = np.searchsorted(steps, st)
    p_of, d_of = stage_of[rk], dp_of[rk]
    t_base = int(ops.enter.min())
    enter: dict[str, np.ndarray] = {}
    end: dict[str, np.ndarray] = {}
    for n, c in codes.items():
        sel = code == c
        shape = (S, int(occ[sel].max()) + 1, P, D)
        e0, e1 = np.full(shape, np.nan), np.full(shape, np.nan)
        where = (si[sel], occ[sel], p_of[sel], d_of[sel])
        e0[where] = ops.enter[idx][sel] - t_base
        e1[where] = ops.end[idx][sel] - t_base
        enter[n], end[n] = e0, e1

    expected: set[str] = set()
    gaps: list[tuple[int, list[tuple[str, int, int]], np.ndarray, np.ndarray]] = []
    for p in range(P):
        elems: list[tuple[bool, list[tuple[str, int, int]]]] = []   # (is comm, ops)
        for s_ in build_program(meta.schedule, p, P, M):
            if s_.kind == DPSYNC:
                n = "params-sync" if s_.dp_op == "allgather" else "grads-sync"
                if n in enter:
                    elems.append((True, [(n, 0, 0)]))
            elif s_.kind == P2P:
                elems.append((True, [(_p2p_name(o.send, o.grad), o.mb, 0) for o in s_.ops]))
            else:
                kind = {FWD: "forward-compute", BWD: "backward-compute", OPT: "optimizer"}
                elems.append((False, [(kind[s_.kind], s_.mb, 0)]))
        first = next((i for i, e in enumerate(elems) if e[0]), None)
        if first is None:
            raise WhatIfInputError(f"stage {p} has no traced communication")
        # computes before the first communication run in the gap before the next step's
        order = elems[first:] + [(False, [(n, i, 1)]) for _, ops_ in elems[:first]
                                 for n, i, _ in ops_]
        pending: list[tuple[str, int, int]] = []
        prev_end: np.ndarray | None = None
        for is_comm, ops_ in order:
            if not is_comm:
                pending += ops_
                continue
            for n, i, _ in ops_:
                _need(enter, n, i, p)
                expected.add(n)
            cur = np.fmin.reduce([enter[n][:, i, p, :] for n, i, _ in ops_])
            if pending and prev_end is not None:
                gaps.append((p, pending, prev_end, cur))
            pending = []
            prev_end = np.fmax.reduce([end[n][:, i, p, :] for n, i, _ in ops_])
        if pending and prev_end is not None:
            # trailing computes end where the next step's first communication starts
            n0, i0, _ = order[0][1][0]
            nxt_first = np.full_like(prev_end, np.nan)
            nxt_first[:-1] = enter[n0][1:, i0, p, :]
            gaps.append((p, pending, prev_end, nxt_first))
    extra = [n for n in enter if n not in expected]
    rows: list[tuple[int, str, int, np.ndarray, np.ndarray]] = []
    means = _single_means(gaps)
    for p, pending, g0, g1 in gaps:
        for n in extra:       # a collective the schedule does not know ends the gap early
            e = enter[n][:, :, p, :]
            with np.errstate(invalid="ignore"):
                later = np.where(e > g0[:, None, :], e, np.inf)
            g1 = np.fmin(g1, np.where(np.isfinite(later.min(axis=1)), later.min(axis=1), np.nan))
        w = np.array([means.get(n, _WEIGHT.get(n, 1.0)) for n, _, _ in pending])
        frac = np.concatenate([[0.0], np.cumsum(w) / w.sum()])
        for j, (n, i, shift) in enumerate(pending):
            a = g0 + frac[j] * (g1 - g0)
            b = g0 + frac[j + 1] * (g1 - g0)
            if shift:
                a, b = _shift(a), _shift(b)
            rows.append((p, n, i, a, b))
    for n in enter:
        rows.append((-1, n, -1, enter[n], end[n]))
    trace = from_spans(_span_table(rows, steps, meta, t_base), meta, coll, comm_ops=ops)
    trace.source = "coll"
    return trace


def _p2p_name(send: bool, grad: bool) -> str:
    return ("backward-" if grad else "forward-") + ("send" if send else "recv")


def _need(enter: dict[str, np.ndarray], n: str, i: int, p: int) -> None:
    if n not in enter or i >= enter[n].shape[1]:
        raise WhatIfInputError(f"stage {p}: the schedule expects {n} {i}, not in the coll rows "
                               "(schedule or micro-batches in meta do not match the trace)")


def _shift(a: np.ndarray) -> np.ndarray:
    """Values of step k moved to step k + 1 (a compute that runs at the next step's start)."""
    out = np.full_like(a, np.nan)
    out[1:] = a[:-1]
    return out


def _single_means(gaps: list[tuple[int, list[tuple[str, int, int]], np.ndarray, np.ndarray]]
                  ) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for _, pending, g0, g1 in gaps:
        if len(pending) == 1:
            v = (g1 - g0)[~np.isnan(g1 - g0)]
            if v.size:
                sums.setdefault(pending[0][0], []).append(float(v.mean()))
    return {n: float(np.mean(v)) for n, v in sums.items() if np.mean(v) > 0}


def _span_table(rows: list[tuple[int, str, int, np.ndarray, np.ndarray]],
                steps: np.ndarray, meta: JobMeta, t_base: int) -> pa.Table:
    """Synthetic span rows of the workers' first ranks from (stage or -1, name, index,
    start, end) arrays: (steps, dp) for computes, (steps, index, pp, dp) for comm ops."""
    reps = np.full((meta.pp, meta.dp), -1, dtype=np.int64)
    stage_of, dp_of, member_of = worker_coords(meta)
    r = np.flatnonzero(member_of == 0)
    reps[stage_of[r], dp_of[r]] = r
    cols: dict[str, list[np.ndarray]] = {k: [] for k in
                                         ("rank", "step", "mb", "op", "t0", "t1")}
    op_names: list[str] = []
    for p, n, i, a, b in rows:
        if p >= 0:                                  # (S, D) compute
            S, D = a.shape
            s_idx, d_idx = np.meshgrid(np.arange(S), np.arange(D), indexing="ij")
            rank = reps[p, d_idx].reshape(-1)
            mb = np.full(S * D, i)
            s_flat = s_idx.reshape(-1)
        else:                                       # (S, I, P, D) comm
            S, n_idx, P, D = a.shape
            s_idx, i_idx, p_idx, d_idx = np.meshgrid(np.arange(S), np.arange(n_idx), np.arange(P),
                                                     np.arange(D), indexing="ij")
            rank = reps[p_idx, d_idx].reshape(-1)
            mb = i_idx.reshape(-1)
            s_flat = s_idx.reshape(-1)
        t0, t1 = a.reshape(-1), b.reshape(-1)
        ok = ~(np.isnan(t0) | np.isnan(t1))
        if n not in op_names:
            op_names.append(n)
        cols["rank"].append(rank[ok])
        cols["step"].append(steps[s_flat[ok]])
        cols["mb"].append(mb[ok])
        cols["op"].append(np.full(int(ok.sum()), op_names.index(n)))
        cols["t0"].append(np.rint(t0[ok]).astype(np.int64) + t_base)
        cols["t1"].append(np.rint(t1[ok]).astype(np.int64) + t_base)
    cat = {k: np.concatenate(v) for k, v in cols.items()}
    return pa.table({
        "rank": pa.array(cat["rank"].astype(np.int32)),
        "step": pa.array(cat["step"].astype(np.int64)),
        "microbatch": pa.array(cat["mb"].astype(np.int32)),
        "chunk": pa.array(np.full(cat["rank"].size, -1, np.int32)),
        "op": pc.take(pa.array(op_names, pa.string()), pa.array(cat["op"])),
        "t_start": pa.array(cat["t0"]),
        "t_end": pa.array(cat["t1"]),
    })
