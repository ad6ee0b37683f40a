"""S2 of Greyhound's mitigation (§5.2): re-balance micro-batches across DP groups.

Choose integers m_i >= 1 with sum m_i = M that minimize max_i m_i * t_i, where t_i is DP
group i's time per micro-batch. Greyhound solves this as a QP with cvxpy (36 s at 512
groups); it has an exact combinatorial solution: the optimal makespan T* is the larger of
max_i t_i and the M-th smallest element of the multiset {k * t_i : k >= 1, all i}, because
floor(T / t_i) is the number of group i's elements <= T. We find it from the continuous
bound T >= M / sum(1/t_i), which leaves at most n elements to pick with a heap, so the
whole solve is O(n log n).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Allocation:
    m: list[int]          # micro-batches per DP group
    max_time: float       # max_i m_i * t_i, the optimal makespan


def _count_upto(t: np.ndarray, bound: float) -> np.ndarray:
    """Exact floor(bound / t_i) for float products: #{k >= 1 : k * t_i <= bound}."""
    k = np.floor(bound / t)
    k += (k + 1) * t <= bound
    k -= k * t > bound
    return k.astype(np.int64)


def allocate_microbatches(times: np.ndarray | list[float], total: int,
                          multiple_of: int = 1) -> Allocation:
    """Optimal integer micro-batch counts per DP group (see module docstring).

    ``multiple_of`` = P restricts every m_i to a multiple of P (1F1B with P stages wants
    whole rounds); then ``total`` must be a multiple of P.
    """
    t = np.asarray(times, dtype=np.float64)
    if t.ndim != 1 or t.size == 0:
        raise ValueError("times: need a non-empty list of per-micro-batch times")
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("times: every time must be a positive finite number")
    if multiple_of < 1:
        raise ValueError("multiple_of must be >= 1")
    if total % multiple_of:
        raise ValueError(f"total {total} is not a multiple of {multiple_of}")
    units = total // multiple_of
    n = t.size
    if units < n:
        raise ValueError(f"total {total} cannot give every one of {n} groups at least "
                         f"{multiple_of} micro-batch(es)")
    step = t * multiple_of                      # time of one unit of P micro-batches
    floor_value = float(step.max())             # every group gets at least one unit
    lower = units / float(np.sum(1.0 / step))   # continuous bound: T* >= lower
    start = np.maximum(_count_upto(step, np.nextafter(lower, 0.0)), 0)
    need = units - int(start.sum())
    if need <= 0:
        best = lower
    else:
        heap = [(float((k + 1) * s), i) for i, (k, s) in enumerate(zip(start, step, strict=True))]
        heapq.heapify(heap)
        best = lower
        for _ in range(need):
            best, i = heapq.heappop(heap)
            start[i] += 1
            heapq.heappush(heap, (float((start[i] + 1) * step[i]), i))
    makespan = max(best, floor_value)
    k = np.maximum(_count_upto(step, makespan), 1)
    excess = int(k.sum()) - units
    while excess > 0:  # more than M fit under T*: take one unit back from each of the
        # groups with the largest loads, round by round, so that the slack is spread
        # (no group drops far below its share; the makespan stays T*)
        cand = np.flatnonzero(k > 1)
        top = cand[np.argsort(-(k[cand] * step[cand]), kind="stable")[:excess]]
        k[top] -= 1
        excess -= int(top.size)
    m = k * multiple_of
    return Allocation(m=[int(x) for x in m], max_time=float(np.max(m * t)))


# ---------------------------------------------------------------------------------------------
# S2 from a trace: per-DP-group micro-batch times and the predicted iteration time with
# uneven micro-batch counts (Greyhound §5.2, evaluated as in §7.3 with the what-if
# dependency simulator of what-if §3.2).

#: Kinds the S2 prediction keeps (the rest of a trace's kinds, e.g. GC parts or untyped
#: collectives, are dropped from both the before and the after prediction).
_CORE = ("forward-compute", "backward-compute", "optimizer", "params-sync", "grads-sync",
         "forward-send", "forward-recv", "backward-send", "backward-recv")
_DP_SYNC = ("params-sync", "grads-sync")
_COMPUTE = ("forward-compute", "backward-compute")
#: Smallest relative gain for which S2 is worth applying (below it: noise).
MIN_GAIN = 0.01

Program = list[tuple[tuple[str, int], ...]]


def schedule_programs(schedule: str, pp: int, m: int) -> list[Program]:
    """The what-if program of every stage for ``m`` micro-batches under Megatron's
    non-interleaved ``1f1b`` or ``gpipe`` schedule (the simulator's
    :func:`failslow.simulator.schedule.build_program`, in what-if notation)."""
    from failslow.schedule import BWD, DPSYNC, FWD, OPT, P2P, build_program

    out: list[Program] = []
    for s in range(pp):
        prog: Program = []
        for st in build_program(schedule, s, pp, m):
            if st.kind == FWD:
                prog.append((("forward-compute", st.mb),))
            elif st.kind == BWD:
                prog.append((("backward-compute", st.mb),))
            elif st.kind == P2P:
                prog.append(tuple((("backward-" if o.grad else "forward-")
                                   + ("send" if o.send else "recv"), o.mb) for o in st.ops))
            elif st.kind == DPSYNC:
                prog.append((("params-sync" if st.dp_op == "allgather" else "grads-sync", 0),))
            elif st.kind == OPT:
                prog.append((("optimizer", 0),))
        out.append(prog)
    return out


def _canonical(programs: list[Program]) -> list[list[tuple[tuple[str, int], ...]]]:
    out = []
    for prog in programs:
        rows = [tuple(sorted(op for op in ops if op[0] in _CORE)) for ops in prog]
        out.append([r for r in rows if r])
    return out


def detect_schedule(ops: Any) -> str:
    """``1f1b`` or ``gpipe``: the schedule whose programs the traced ones follow (what-if
    kinds other than the pipeline's own are ignored); raises WhatIfInputError otherwise."""
    from failslow.whatif.ops import WhatIfInputError

    traced = _canonical(ops.programs)
    for schedule in ("1f1b", "gpipe"):
        if _canonical(schedule_programs(schedule, ops.pp, ops.microbatches)) == traced:
            return schedule
    raise WhatIfInputError("the traced per-stage programs follow neither Megatron's 1F1B nor "
                           "GPipe schedule, so uneven micro-batch counts cannot be replayed")


def dp_group_times(ops: Any, dur: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Per DP group (pipeline), the time of one micro-batch in its steady state: the slowest
    stage's median forward plus backward compute (with their TP parts). These are the t_i
    of Greyhound's Eq. (1), measured from the OpDuration tensors instead of profiled."""
    d = ops.dur if dur is None else dur
    total = np.zeros((ops.pp, ops.dp))
    for name in _COMPUTE:
        if name not in d:
            continue
        x = d[name].copy()
        for part in ops.parts.get(name, []):
            if not part.startswith("gc/"):
                x = x + np.nan_to_num(d[part])
        with np.errstate(all="ignore"):
            total += np.nan_to_num(np.nanmedian(x, axis=(0, 1)))
    return np.asarray(total.max(axis=0), dtype=np.float64)


def predict_microbatches(ops: Any, m: list[int] | np.ndarray,
                         dur: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """Simulated time of every step when DP group ``d`` runs ``m[d]`` micro-batches (what-if
    dependency simulator, :class:`~failslow.whatif.sim.Plan`).

    The what-if simulator runs one program per stage for every DP rank, so groups with
    different counts become separate virtual pipelines: virtual stage ``g * P + p`` is stage
    ``p`` of count group ``g`` (its program generated for that count), and each stage's
    params-sync / grads-sync becomes one collective over the same stage of every group and
    every DP rank. Micro-batch ``k`` of a group replays the traced durations of micro-batch
    ``k mod M``; groups with fewer members are padded with copies of a member (identical
    timelines do not change any maximum). With ``m`` all equal to the traced count this
    replays the traced schedule (the simulated original, restricted to the core kinds).
    """
    from failslow.whatif.ops import BASE_KINDS, Kind, OpTrace
    from failslow.whatif.sim import Plan, Variants

    d = ops.dur if dur is None else dur
    counts = np.asarray(m, dtype=np.int64)
    P, D, M = ops.pp, ops.dp, ops.microbatches
    if counts.shape != (D,) or counts.min() < 1:
        raise ValueError(f"m: need {D} micro-batch counts >= 1")
    schedule = detect_schedule(ops)
    values = sorted(set(counts.tolist()))
    members = [np.flatnonzero(counts == v) for v in values]
    G = len(values)
    J = max(len(g) for g in members)
    S = ops.steps.size
    PV = G * P
    kinds: dict[str, Kind] = {}
    dur_v: dict[str, np.ndarray] = {}
    parts: dict[str, list[str]] = {}
    src = np.stack([np.resize(g, J) for g in members])          # (G, J) source DP ranks
    stage_list = {p: tuple(g * P + p for g in range(G)) for p in range(P)}

    def fill(name: str, width: int, per_group: bool) -> np.ndarray:
        out = np.full((S, width, PV, J), np.nan)
        x = d[name]
        for g, v in enumerate(values):
            idx = (np.arange(v) % M) if per_group else np.arange(width)
            if per_group and x.shape[1] < M:
                idx = np.minimum(idx, x.shape[1] - 1)
            block = x[:, idx][:, :, :, src[g]]                 # (S, v|width, P, J)
            out[:, : block.shape[1], g * P:(g + 1) * P, :] = block
        return out

    vmax = max(values)
    for name in _CORE:
        if name not in d or name not in ops.kinds:
            continue
        if name in _DP_SYNC:
            for p in range(P):
                vname = f"{name}@{p}"
                kinds[vname] = Kind(vname, "dp-communication", True, "stages", stage_list[p],
                                    dp_sync=True)
                full = fill(name, 1, False)
                mask = np.zeros(PV, dtype=bool)
                mask[list(stage_list[p])] = True
                full[:, :, ~mask, :] = np.nan
                dur_v[vname] = full
            continue
        per_mb = name != "optimizer"
        kinds[name] = ops.kinds[name]
        dur_v[name] = fill(name, vmax if per_mb else 1, per_mb)
        for part in ops.parts.get(name, []):
            if part.startswith("gc/") or part not in d:
                continue
            kinds[part] = ops.kinds.get(part, BASE_KINDS.get(part, Kind(part, "other")))
            dur_v[part] = fill(part, vmax, True)
            parts.setdefault(name, []).append(part)
    programs: list[Program] = []
    for v in values:
        for p, prog in enumerate(schedule_programs(schedule, P, v)):
            renamed = [tuple(((f"{n}@{p}" if n in _DP_SYNC else n), i) for n, i in step)
                       for step in prog]
            programs.append([tuple(op for op in step if op[0] in kinds) for step in renamed])
    programs = [[step for step in prog if step] for prog in programs]
    virtual = OpTrace(steps=ops.steps, pp=PV, dp=J, kinds=kinds, dur=dur_v, parts=parts,
                      programs=programs, actual=ops.actual,
                      ranks=np.zeros((PV, J), dtype=np.int64),
                      members=[[[0] for _ in range(J)] for _ in range(PV)], source="s2")
    plan = Plan(virtual)
    keep = np.ones((1, len(plan.kind_names), PV, J), dtype=bool)
    zero = {n: np.zeros(S) for n in plan.kind_names}
    return np.asarray(plan.run(Variants(keep), zero)[0])


@dataclass(frozen=True)
class MicrobatchPlan:
    """S2's plan for one job: micro-batches per DP group and the predicted step times."""

    m: list[int]                  # micro-batches per DP group (index = DP rank)
    times: list[float]            # measured time of one micro-batch per DP group, s
    total: int                    # micro-batches per global batch (M x DP)
    multiple_of: int
    max_time: float               # max_i m_i t_i of the plan
    even_max_time: float          # the same with the even split
    predicted_before_s: float | None   # what-if replay with the even split
    predicted_after_s: float | None    # what-if replay with ``m``
    schedule: str | None
    note: str = ""

    @property
    def feasible(self) -> bool:
        """Re-balancing gains at least :data:`MIN_GAIN` on the slowest group's time and
        is predicted (when predicted) to gain at least half of that on the step."""
        if self.max_time > self.even_max_time * (1.0 - MIN_GAIN):
            return False
        return self.predicted_after_s is None or self.predicted_before_s is None or (
            self.predicted_after_s < self.predicted_before_s * (1.0 - MIN_GAIN / 2))

    @property
    def reason(self) -> str:
        if self.feasible:
            return ""
        if self.max_time > self.even_max_time * (1.0 - MIN_GAIN):
            return "the DP groups are equally fast: no room to re-balance"
        return "the re-balanced schedule is not predicted to be faster"

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "strategy": "S2", "m": self.m, "times_s": [round(t, 6) for t in self.times],
            "total": self.total, "multiple_of": self.multiple_of,
            "max_time_s": self.max_time, "even_max_time_s": self.even_max_time,
            "predicted_before_s": self.predicted_before_s,
            "predicted_after_s": self.predicted_after_s,
            "predicted_speedup": (self.predicted_before_s / self.predicted_after_s
                                  if self.predicted_before_s and self.predicted_after_s
                                  else None),
            "schedule": self.schedule, "feasible": self.feasible, "reason": self.reason}
        if self.note:
            doc["note"] = self.note
        return doc


def plan_from_ops(ops: Any, dur: dict[str, np.ndarray] | None = None,
                  multiple_of: int = 1, predict: bool = True) -> MicrobatchPlan:
    """S2 for a trace: t_i from :func:`dp_group_times`, m_i from
    :func:`allocate_microbatches` (global batch = traced micro-batches x DP), and the step
    time before and after predicted by :func:`predict_microbatches` (mean over steps)."""
    from failslow.whatif.ops import WhatIfInputError

    t = dp_group_times(ops, dur)
    M, D = ops.microbatches, ops.dp
    total = M * D
    if not np.all(t > 0):
        raise WhatIfInputError("no compute durations to derive micro-batch times from")
    alloc = allocate_microbatches(t, total, multiple_of)
    before = after = None
    schedule = None
    note = ""
    if predict:
        try:
            schedule = detect_schedule(ops)
            before = float(predict_microbatches(ops, [M] * D, dur).mean())
            after = float(predict_microbatches(ops, alloc.m, dur).mean())
        except WhatIfInputError as e:
            note = str(e)
    return MicrobatchPlan(m=alloc.m, times=[float(x) for x in t], total=total,
                          multiple_of=multiple_of, max_time=alloc.max_time,
                          even_max_time=float(t.max() * M), predicted_before_s=before,
                          predicted_after_s=after, schedule=schedule, note=note)
