"""What-if straggler analysis (ByteDance, papers/whatif-stragglers.md; SMon §8).

``whatif(tables, meta)`` answers "how fast would this job run without stragglers, and who is
to blame" from a trace's ``span`` rows (else its ``coll`` rows):

1. OpDuration tensors per operation type [step, micro-batch, PP rank, DP rank] (§3.2),
   with transfer durations for communication (:mod:`.whatif_ops`, :mod:`.whatif_coll`);
2. the dependency model and simulator (§3.2, :mod:`.whatif_sim`): the original durations are
   replayed (simulated original, T_ori) and compared with the actual step time (the
   *simulation discrepancy*, §6; above 5 % the analysis is refused, as the paper discards
   such traces); then the idealized ones: the mean for compute, the median for
   communication (T_ideal);
3. metrics (§3.3, §4-§5): slowdown S = T_ori / T_ideal (Eq. 1), per step (§4.2), per
   operation type S_t (Eq. 2: only type t keeps its traced durations), per DP rank and per PP
   rank, per worker S_w (Eq. 4; exactly, and with the paper's approximation min(S_dp, S_pp)),
   M_W (Eq. 5: share of the slowdown removed by fixing the top 3 % workers), M_S (§5.2: the
   same for the last stage), the forward-backward correlation of sequence-length imbalance
   (§5.3) and GC pauses (§5.4).

The result is diagnosis.md's ``whatif`` object plus extra fields; :func:`heatmaps` draws
SMon's worker heatmap (DP x PP) and per-step heatmap (§8). :class:`WhatIfAnalyzer` wraps it
for the stream processor (recomputed every N steps over the recent steps).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.events import EventBatch, JobMeta
from failslow.whatif.ops import (
    CATEGORIES,
    OpTrace,
    WhatIfInputError,
    worker_table,
)
from failslow.whatif.plot import heatmaps
from failslow.whatif.sim import Plan, Variants

log = logging.getLogger(__name__)

__all__ = ["MAX_DISCREPANCY", "Options", "WhatIfAnalyzer", "WhatIfInputError", "WhatIfRefused",
           "analyze_ops", "analyze_tables", "build_ops", "heatmaps", "whatif"]

#: The paper discards traces whose simulated original differs more from the actual (§6).
MAX_DISCREPANCY = 0.05
#: Top share of workers for M_W (§5.1).
TOP_SHARE = 0.03
#: Forward-backward correlation above which sequence-length imbalance is likely (§5.3).
SEQLEN_CORRELATION = 0.9
#: Per-step worker grids are kept in the result up to this many numbers (steps x workers).
MAX_STEP_GRID = 50_000
#: With a slowdown below 1, the steps whose simulated original is this much faster than
#: their straggler-free simulation are named (``caveat``): the idealized durations are
#: slower than the traced ones there.
IDEAL_SLACK = 0.05


class WhatIfRefused(WhatIfInputError):
    """The simulated original differs too much from the trace to trust the analysis (§6)."""


@dataclass
class Options:
    """Settings of :func:`analyze_ops`."""

    max_discrepancy: float = MAX_DISCREPANCY
    exact_workers: bool = True       # S_w by one simulation per worker (else only min(dp, pp))
    top_share: float = TOP_SHARE
    top_workers: int = 20            # entries of the ``workers`` list


def whatif(tables: dict[str, pa.Table], meta: JobMeta, options: Options | None = None,
           errors: list[str] | None = None) -> dict[str, Any] | None:
    """The diagnosis ``whatif`` object of a trace, or None when the trace lacks what is
    needed or the simulation disagrees with it (the reason is logged and appended to
    ``errors``)."""
    try:
        return analyze_tables(tables, meta, options)
    except WhatIfInputError as e:
        log.warning("what-if analysis not done: %s", e)
        if errors is not None:
            errors.append(str(e))
        return None


def build_ops(tables: dict[str, pa.Table], meta: JobMeta) -> OpTrace:
    """OpDuration tensors from ``span`` rows when present, else from ``coll`` rows."""
    span = tables.get("span")
    coll = tables.get("coll")
    if meta.pp < 1 or meta.dp < 1:
        raise WhatIfInputError("meta lacks the PP and DP degrees")
    if span is not None and span.num_rows:
        from failslow.whatif.spans import from_spans

        return from_spans(span, meta, coll)
    if coll is None or coll.num_rows == 0:
        raise WhatIfInputError("neither span nor coll rows")
    from failslow.whatif.coll import from_coll

    return from_coll(coll, meta)


def analyze_tables(tables: dict[str, pa.Table], meta: JobMeta,
                   options: Options | None = None) -> dict[str, Any]:
    """Like :func:`whatif` but raises :class:`WhatIfInputError` / :class:`WhatIfRefused`."""
    return analyze_ops(build_ops(tables, meta), options)


# ---------------------------------------------------------------------------------------------


def idealized(ops: OpTrace) -> dict[str, np.ndarray]:
    """The straggler-free duration of every kind (§3.2): the mean over all steps,
    micro-batches and workers for compute, the median for communication."""
    S = ops.steps.size
    out = {}
    for name, arr in ops.dur.items():
        v = arr[~np.isnan(arr)]
        val = 0.0 if v.size == 0 else float(np.median(v) if ops.kinds[name].comm else v.mean())
        out[name] = np.full(S, val)
    return out


def _keep(plan: Plan, B: int, J: int) -> np.ndarray:
    return np.zeros((B, len(plan.kind_names), plan.P, J), dtype=bool)


def _kind_mask(plan: Plan, ops: OpTrace, pred: Any) -> np.ndarray:
    return np.array([bool(pred(n, ops.kinds[n])) for n in plan.kind_names])


def analyze_ops(ops: OpTrace, options: Options | None = None) -> dict[str, Any]:
    """Run the what-if analysis on OpDuration tensors (see the module docstring)."""
    opt = options or Options()
    plan = Plan(ops)
    P, D, S = ops.pp, ops.dp, ops.steps.size
    ideal = idealized(ops)
    cats = [*CATEGORIES, "other", "gc"]
    fine = list(plan.kind_names)

    # run 1: original, ideal, per category, per kind, per stage, last stage removed
    n1 = 2 + len(cats) + len(fine) + P + 1
    keep = _keep(plan, n1, D)
    keep[0] = True
    b = 2
    for c in cats:
        keep[b] = _kind_mask(plan, ops, lambda n, k, c=c: k.category == c)[:, None, None]
        b += 1
    for n in fine:
        keep[b, plan.kind_id[n]] = True
        b += 1
    for p in range(P):
        keep[b, :, p, :] = True
        b += 1
    keep[b] = True
    keep[b, :, P - 1, :] = False
    T1 = plan.run(Variants(keep), ideal)
    t_ori, t_ideal = T1[0], T1[1]
    mo, mi = float(t_ori.mean()), float(t_ideal.mean())

    actual = ops.actual
    disc_step = np.abs(t_ori - actual) / actual
    discrepancy = abs(mo - float(actual.mean())) / float(actual.mean())
    if discrepancy > opt.max_discrepancy:
        raise WhatIfRefused(
            f"simulation discrepancy {discrepancy:.1%} > {opt.max_discrepancy:.0%}: the "
            f"simulated original step ({mo:.4f} s) does not reproduce the traced one "
            f"({float(actual.mean()):.4f} s), so the what-if results would not be trustworthy "
            "(what-if §6: launch delays, untraced operations or clock errors)")

    def ratio(x: np.ndarray) -> float:
        return float(x.mean()) / mi

    by_cat = {c: ratio(T1[2 + i]) for i, c in enumerate(cats)}
    base = 2 + len(cats)
    by_op = {n: ratio(T1[base + i]) for i, n in enumerate(fine)}
    base += len(fine)
    by_stage = {p: ratio(T1[base + p]) for p in range(P)}
    t_rem_last = T1[base + P]

    # run 2: per DP rank and per worker, two virtual pipelines (own, idealized)
    W = P * D
    n2 = D + (W if opt.exact_workers else 0)
    keep2 = _keep(plan, n2, 2)
    src = np.zeros((n2, 2), dtype=np.int64)
    keep2[:D, :, :, 0] = True
    src[:D, 0] = np.arange(D)
    if opt.exact_workers:
        w = np.arange(W)
        keep2[D + w, :, w // D, 0] = True
        src[D:, 0] = w % D
    T2 = plan.run(Variants(keep2, src), ideal)
    by_dp = {d: ratio(T2[d]) for d in range(D)}
    approx = np.minimum(np.array([by_stage[p] for p in range(P)])[:, None],
                        np.array([by_dp[d] for d in range(D)])[None, :])
    exact = None
    step_grid = None
    if opt.exact_workers:
        TW = T2[D:]                                       # (W, S)
        exact = (TW.mean(axis=1) / mi).reshape(P, D)
        if W * S <= MAX_STEP_GRID:
            step_grid = (TW / t_ideal[None, :]).T.reshape(S, P, D)
    grid = exact if exact is not None else approx

    # run 3: M_W and M_S (explain_slowdown: remove / add back the selected workers, §5.1-5.2)
    n_top = max(1, math.ceil(W * opt.top_share))
    order = np.lexsort((np.arange(W), -approx.reshape(-1)))
    top = order[:n_top]
    keep3 = _keep(plan, 2, D)
    cells = np.zeros((P, D), dtype=bool)
    cells.reshape(-1)[top] = True
    keep3[0] = ~cells[None, :, :]
    keep3[1] = cells[None, :, :]
    T3 = plan.run(Variants(keep3), ideal)
    gap = mo - mi
    mw = _explain(mo, mi, float(T3[0].mean()), float(T3[1].mean()))
    ms = _explain(mo, mi, float(t_rem_last.mean()), by_stage[P - 1] * mi)

    workers = _worker_list(ops, grid, opt.top_workers)
    result: dict[str, Any] = {
        "slowdown": mo / mi,
        "by_op_type": {c: by_cat[c] for c in CATEGORIES},
        "workers": workers,
        "per_step": {str(int(s)): float(x) for s, x in zip(ops.steps, t_ori / t_ideal,
                                                            strict=True)},
        "M_W": mw["rem"],
        "M_S": ms["rem"],
        "M_W_detail": {**mw, "workers": [_worker_ref(ops, int(i)) for i in top]},
        "slowdown_top_workers": mw["tori"] / mw["trem"] if mw["trem"] > 0 else 1.0,
        "M_S_detail": ms,
        "discrepancy": discrepancy,
        "discrepancy_steps": {"median": float(np.median(disc_step)),
                              "p90": float(np.quantile(disc_step, 0.9)),
                              "max": float(disc_step.max())},
        "t_actual_s": float(actual.mean()),
        "t_original_s": mo,
        "t_ideal_s": mi,
        "waste": 1.0 - mi / mo if gap > 0 else 0.0,
        "by_op": by_op,
        "by_category": by_cat,
        "by_dp_rank": {str(d): v for d, v in by_dp.items()},
        "by_stage": {str(p): v for p, v in by_stage.items()},
        "worker_grid": _rounded(grid),
        "worker_grid_approx": _rounded(approx),
        "fwd_bwd_correlation": fwd_bwd_correlation(ops),
        "gc": _gc_summary(ops, plan, ideal, mo),
        "source": ops.source,
        "steps": [int(s) for s in ops.steps],
        "pp": P,
        "dp": D,
        "microbatches": ops.microbatches,
        "method": {"exact_workers": opt.exact_workers, "top_share": opt.top_share,
                   "ideal": "mean (compute), median (communication) over steps, "
                            "micro-batches and workers"},
    }
    if step_grid is not None:
        result["per_step_worker_grid"] = _rounded(step_grid)
    faster = [int(st) for st, x in zip(ops.steps, t_ori / t_ideal, strict=True)
              if x < 1.0 - IDEAL_SLACK]
    if mo < mi and faster:
        result["caveat"] = {
            "steps_faster_than_ideal": faster,
            "text": f"the straggler-free simulation is slower than the job: {len(faster)} of "
                    f"{len(ops.steps)} steps ran faster than it, because the ideal durations "
                    "(the median of communication over steps, §3.2) take a slowdown that "
                    "covers most steps for the norm; the slowdown understates it"}
    return result


def _explain(tori: float, tideal: float, trem: float, tadd: float) -> dict[str, float]:
    """StragglerAnalysis' explain_slowdown: ``rem`` = share of T_ori - T_ideal removed by
    fixing the group, ``add`` = share added back by keeping only the group."""
    gap = tori - tideal
    if gap <= 0:
        return {"tori": tori, "tideal": tideal, "trem": trem, "tadd": tadd, "rem": 0.0,
                "add": 0.0}
    return {"tori": tori, "tideal": tideal, "trem": trem, "tadd": tadd,
            "rem": (tori - trem) / gap, "add": (tadd - tideal) / gap}


def _rounded(a: np.ndarray) -> Any:
    return np.round(a, 5).tolist()


def _worker_ref(ops: OpTrace, cell: int) -> dict[str, Any]:
    p, d = divmod(cell, ops.dp)
    return {"rank": int(ops.ranks[p, d]), "pp": p, "dp": d}


def _worker_list(ops: OpTrace, grid: np.ndarray, n: int) -> list[dict[str, Any]]:
    """The ``n`` workers with the largest slowdown. ``rank``: the worker's member that
    entered its TP/CP collectives last clearly more often than its peers (the straggler
    inside the collapsed TP group), else its first member."""
    flat = grid.reshape(-1)
    order = np.lexsort((np.arange(flat.size), -flat))[:n]
    out = []
    for cell in order.tolist():
        ref = _worker_ref(ops, cell)
        p, d = ref["pp"], ref["dp"]
        members = list(ops.members[p][d])
        rank = ref["rank"]
        if ops.late_share is not None and len(members) > 1:
            share = ops.late_share[members]
            best = int(np.argmax(share))
            if share[best] > 1.25 / len(members):
                rank = members[best]
        out.append({"rank": rank, "slowdown": float(flat[cell]), "pp": p, "dp": d,
                    "ranks": members})
    return out


def fwd_bwd_correlation(ops: OpTrace) -> dict[str, Any] | None:
    """Pearson correlation of forward and backward compute time per micro-batch (§5.3), on
    the second stage when there are more than two (the first holds the embedding, the last
    the loss), else the first."""
    f, b = ops.dur.get("forward-compute"), ops.dur.get("backward-compute")
    if f is None or b is None:
        return None
    p = 1 if ops.pp > 2 else 0
    for name, parts in ops.parts.items():
        for part in parts:
            if name == "forward-compute":
                f = f + np.nan_to_num(ops.dur[part])
            elif name == "backward-compute":
                b = b + np.nan_to_num(ops.dur[part])
    n = min(f.shape[1], b.shape[1])
    x, y = f[:, :n, p, :].reshape(-1), b[:, :n, p, :].reshape(-1)
    ok = ~(np.isnan(x) | np.isnan(y))
    if ok.sum() < 3 or np.std(x[ok]) == 0 or np.std(y[ok]) == 0:
        return {"stage": p, "r": None, "sequence_length_imbalance": False}
    r = float(np.corrcoef(x[ok], y[ok])[0, 1])
    return {"stage": p, "r": r, "sequence_length_imbalance": r >= SEQLEN_CORRELATION}


def _gc_summary(ops: OpTrace, plan: Plan, ideal: dict[str, np.ndarray],
                t_ori: float) -> dict[str, Any]:
    """GC pauses (§5.4): from ``gc`` spans (folded into the next operation), else forward
    computes far above their stage's median whose backward is normal. ``slowdown``: the
    simulated original with and without the pauses."""
    info: dict[str, Any] = dict(ops.gc)
    gc_kinds = [n for n in plan.kind_names if ops.kinds[n].category == "gc"]
    if info.get("pauses"):
        info["source"] = "span"
        info["slowdown"] = 1.0
        if gc_kinds:
            keep = _keep(plan, 1, ops.dp)
            keep[0] = True
            no_gc = dict(ideal)
            for n in gc_kinds:
                keep[0, plan.kind_id[n]] = False
                no_gc[n] = np.zeros_like(ideal[n])
            t = float(plan.run(Variants(keep), no_gc).mean())
            info["slowdown"] = t_ori / t if t > 0 else 1.0
        return info
    f, b = ops.dur.get("forward-compute"), ops.dur.get("backward-compute")
    info.update({"source": "inferred", "pauses": 0, "total_s": 0.0, "ranks": []})
    if f is None or b is None:
        return info
    med = np.nanmedian(f, axis=(0, 3), keepdims=True)       # per micro-batch and stage
    mad = np.nanmedian(np.abs(f - med), axis=(0, 3), keepdims=True)
    bmed = np.nanmedian(b, axis=(0, 3), keepdims=True)
    excess = f - med
    n = min(f.shape[1], b.shape[1])
    hit = excess > np.maximum(10 * mad, 0.1 * med)
    hit[:, :n] &= ~(b[:, :n] > 1.1 * bmed[:, :n])
    idx = np.argwhere(np.nan_to_num(hit))
    info["pauses"] = int(idx.shape[0])
    info["total_s"] = float(excess[hit].sum()) if idx.size else 0.0
    info["ranks"] = sorted({int(ops.ranks[p, d]) for _, _, p, d in idx.tolist()})
    return info


# ---------------------------------------------------------------------------------------------
# stream processor


STATE_VERSION = 1
#: Columns of the buffered rows (the rest is dropped to save memory; one job's rows, so
#: no ``job``).
SPAN_COLUMNS = ("rank", "step", "microbatch", "chunk", "op", "t_start", "t_end",
                "optype")
COLL_COLUMNS = ("rank", "comm", "comm_rank", "comm_size", "seq", "op", "peer", "phase",
                "t", "t_start", "bytes")


@dataclass(frozen=True)
class WindowRows:
    """The rows of one lazy window, to read again from the trace: ``span`` rows of steps
    ``first..last`` with ``t_end <= span_until``, ``coll`` rows with ``coll_from <= t <=
    coll_until`` (no lower bound when ``coll_from`` is None); each kind in replay order,
    only the :data:`SPAN_COLUMNS` / :data:`COLL_COLUMNS`: what the buffering analyzer
    would have held."""

    first: int
    last: int
    coll_from: int | None
    span_until: int
    coll_until: int


def _trim(parts: list[pa.Table], column: str, lo: int | None = None,
          hi: int | None = None) -> list[pa.Table]:
    """``parts`` without their rows whose ``column`` is below ``lo`` or above ``hi``; a
    part wholly kept is not copied (the window's rows are held once, however many windows
    share them). None of them kept: one empty part (its schema)."""
    out = []
    for part in parts:
        mm = pc.min_max(part.column(column)).as_py()
        if mm["max"] is None or (lo is not None and mm["max"] < lo) or (
                hi is not None and mm["min"] > hi):
            continue
        keep = []
        if lo is not None and mm["min"] < lo:
            keep.append(pc.greater_equal(part.column(column), lo))
        if hi is not None and mm["max"] > hi:
            keep.append(pc.less_equal(part.column(column), hi))
        for mask in keep:
            part = part.filter(mask)
        out.append(part)
    return out or [parts[0].slice(0, 0)]


class WhatIfAnalyzer:
    """The what-if analysis for the stream processor: accumulates the ``span`` and ``coll``
    rows of the most recent ``window_steps`` steps and recomputes :func:`whatif` every
    ``every_steps`` completed steps (SMon runs it after each profiling session, §8).

    A step counts as completed once two later ones have begun (ranks drift into the next step
    while others finish): from ``span`` rows (their ``step``), else from the first worker's
    ``params-sync`` all-gathers (or, without DP, its pipeline sends). Only the columns the
    analysis reads are kept. ``snapshot()`` keeps the latest result and the step counters,
    not the buffered rows: after ``restore`` the next result comes ``every_steps`` steps
    later. ``lazy`` (offline, where one result is kept): the windows are cut the same way
    but only one is analysed, by :meth:`finish`: the slowest (largest mean step time), where
    a straggler costs most; its steps are in the result's ``window``. With a ``reader`` as
    well (offline, where the trace is on disk) no row is buffered: the chosen
    :class:`WindowRows` are read again by it at :meth:`finish`."""

    def __init__(self, meta: JobMeta, every_steps: int = 10, window_steps: int | None = None,
                 options: Options | None = None, lazy: bool = False,
                 reader: Callable[[WindowRows], dict[str, pa.Table]] | None = None) -> None:
        if every_steps < 1:
            raise ValueError("every_steps must be >= 1")
        self.meta = meta
        self.every_steps = every_steps
        self.window_steps = max(window_steps or every_steps, 2)
        self.options = options or Options()
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.computed = 0
        #: only the last window is analysed, by :meth:`finish` (offline: one result is kept)
        self.lazy = lazy
        self._window: dict[str, pa.Table] | None = None
        self._window_pace = 0.0
        self._window_steps = (0, 0)
        self.reader = reader if lazy else None
        self._rows: WindowRows | None = None  # the chosen window, to read again
        #: the largest time seen per kind (``span``: ``t_end``, ``coll``: ``t``)
        self._seen = {"span": -1, "coll": -1}
        self._span: list[pa.Table] = []
        self._coll: list[pa.Table] = []
        self._step_start: dict[int, int] = {}     # step -> earliest t seen (span rows, else
        #                                           the first worker's params-sync count)
        self._done = -1                           # last completed step at the last compute
        self._rank0 = int(worker_table(meta)[0][0, 0]) if meta.pp and meta.dp else 0
        self._marks = 0

    def update(self, batch: EventBatch) -> dict[str, Any] | None:
        """Take a batch; returns the new ``whatif`` object when it was recomputed."""
        span, coll = batch.get("span"), batch.get("coll")
        if span is not None and span.num_rows:
            span = span.select([c for c in span.column_names if c in SPAN_COLUMNS])
            self._seen["span"] = max(self._seen["span"],
                                     int(pc.max(span.column("t_end")).as_py()))
            if self.reader is None:
                self._span.append(span)
            elif not self._span:  # a mark that span rows came (steps count from them)
                self._span.append(span.slice(0, 0))
            steps = np.asarray(span.column("step").to_numpy(), dtype=np.int64)
            t0 = np.asarray(span.column("t_start").to_numpy(), dtype=np.int64)
            uniq, inv = np.unique(steps, return_inverse=True)
            lo = np.full(uniq.size, np.iinfo(np.int64).max)
            np.minimum.at(lo, inv.reshape(-1), t0)
            for s_, t_ in zip(uniq.tolist(), lo.tolist(), strict=True):
                self._step_start[s_] = min(t_, self._step_start.get(s_, t_))
        if coll is not None and coll.num_rows:
            coll = coll.select([c for c in coll.column_names if c in COLL_COLUMNS])
            self._seen["coll"] = max(self._seen["coll"], int(pc.max(coll.column("t")).as_py()))
            if self.reader is None:
                self._coll.append(coll)
        if coll is not None and coll.num_rows and not self._span:
            self._count_steps(coll)
        if not self._step_start:
            return None
        if self._done < 0:  # joined mid-trace: a whole window of steps before the first result
            self._done = min(self._step_start) - 1
        completed = max(self._step_start) - 2
        if completed - self._done < self.every_steps:
            return None
        self._done = completed
        return self._compute(completed)

    def _count_steps(self, coll: pa.Table) -> None:
        """Steps from ``coll`` rows: the first worker's params-sync all-gathers, or without
        DP its pipeline sends (one per micro-batch and step on the first stage)."""
        op, per = ("allgather", 1) if self.meta.dp > 1 else ("send", self.meta.microbatches)
        if per <= 0:
            return
        mask = pc.and_(pc.and_(pc.equal(coll.column("rank"), self._rank0),
                               pc.equal(coll.column("op"), op)),
                       pc.equal(coll.column("phase"), "enter"))
        for t_ in sorted(coll.filter(mask).column("t").to_pylist()):
            if self._marks % per == 0:
                self._step_start[self._marks // per] = int(t_)
            self._marks += 1

    def _compute(self, completed: int) -> dict[str, Any] | None:
        first = completed - self.window_steps + 1
        keep = [s_ for s_ in self._step_start if s_ >= first]
        t_cut = min(self._step_start[s_] for s_ in keep) if keep else None
        for s_ in [s_ for s_ in self._step_start if s_ < first]:
            del self._step_start[s_]
        tables = self._window_tables(first, completed, t_cut)
        if self.lazy:
            pace = self._pace(first, completed)
            if (self._window is None and self._rows is None) or pace >= self._window_pace:
                self._window_pace = pace
                self._window_steps = (first, completed)
                if self.reader is None:
                    self._window = tables
                else:
                    self._rows = WindowRows(first, completed, t_cut, self._seen["span"],
                                            self._seen["coll"])
            return None
        return self._run(tables)

    def _window_tables(self, first: int, completed: int, t_cut: int | None
                       ) -> dict[str, pa.Table]:
        """The buffered rows of steps ``first..completed`` (``coll``: from ``t_cut`` on);
        the older ones are dropped. Nothing with a :attr:`reader` (no row is kept)."""
        tables: dict[str, pa.Table] = {}
        if self.reader is not None:
            return tables
        if self._span:
            self._span = _trim(self._span, "step", lo=first)
            tables["span"] = pa.concat_tables(_trim(self._span, "step", hi=completed),
                                              promote_options="permissive")
        if self._coll:
            if t_cut is not None:
                self._coll = _trim(self._coll, "t", lo=t_cut)
            tables["coll"] = pa.concat_tables(self._coll, promote_options="permissive")
        return tables

    def _pace(self, first: int, last: int) -> float:
        """Mean step time of steps ``first..last`` (from the step starts; 0 unknown)."""
        starts = [self._step_start.get(s_) for s_ in range(first, last + 2)]
        known = [t for t in starts if t is not None]
        if len(known) < 2:
            return 0.0
        return (known[-1] - known[0]) / (len(known) - 1)

    def finish(self) -> dict[str, Any] | None:
        """Lazy mode: the analysis of the last whole window (None: none, or it failed and
        :attr:`error` says why)."""
        if self._rows is not None and self.reader is not None:
            self._window = self.reader(self._rows)
            self._rows = None
        if self._window is not None:
            tables, self._window = self._window, None
            if self._run(tables) is not None and self.result is not None:
                first, last = self._window_steps
                self.result["window"] = {"first_step": first, "last_step": last,
                                         "chosen": "slowest"}
                log.info("what-if analysis over steps %d-%d, the slowest window", first, last)
        return self.result

    def _run(self, tables: dict[str, pa.Table]) -> dict[str, Any] | None:
        errors: list[str] = []
        result = whatif(tables, self.meta, self.options, errors)
        self.computed += 1
        if result is None:
            self.error = errors[0] if errors else "what-if analysis failed"
            return None
        self.result, self.error = result, None
        return result

    def snapshot(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "every_steps": self.every_steps,
                "window_steps": self.window_steps, "done": self._done,
                "marks": self._marks, "computed": self.computed,
                "result": self.result, "error": self.error}

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported what-if state version {state.get('version')!r}")
        self.every_steps = int(state["every_steps"])
        self.window_steps = int(state["window_steps"])
        self._done = int(state["done"])
        self._marks = int(state["marks"])
        self.computed = int(state["computed"])
        self.result = state.get("result")
        self.error = state.get("error")
        self._span, self._coll, self._step_start = [], [], {}
