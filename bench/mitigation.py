"""``failslow bench mitigation``: Greyhound's mitigation evaluation (§7.3, §7.5) reproduced in
simulation, our figures next to the paper's.

Iteration times come from the training simulator (:func:`failslow.simulator.simulate`)
where it can express the situation, and otherwise from the what-if dependency simulator
(what-if §3.2) replaying OpDuration tensors re-timed for the mitigation
(:mod:`.topology_plan`, :mod:`.microbatches`):

* **S2, one slow DP group of 4** (§7.3, Figure 15 left: 1.31 s -> 0.83 s): 4 DP x 2 PP on one
  8-GPU node, every GPU of DP group 0 computing ``severity`` x slower; the trace's
  OpDuration tensors give each DP group's micro-batch time, :func:`allocate_microbatches`
  the counts, :func:`predict_microbatches` the step time with them (the training simulator
  runs one micro-batch count for every DP group, so the after time is the what-if
  prediction). Swept over 0-4 slow groups as in the figure.
* **S3, straggler consolidation** (§7.3, Figure 15 right: 1.6/1.7/1.9x -> 1.3/1.3/1.7x for
  1/2/3 congested links, each slowing its two end GPUs): 4 DP x 4 PP, 2/4/6 straggler GPUs
  scattered over the stages; the plan comes from the trace (its diagnosis by the detectors,
  or the injected truth at small scales); the after time is measured by re-simulating with
  the stragglers where the plan puts them (exact: one node, so no traffic changes between
  intra- and inter-node), next to the what-if prediction.
* **S3, congested links** (1-3 congested node pairs carrying DP ring traffic, 4 DP x 4 PP
  with two GPUs per node) and the **DP/PP role swap** of Figure 16 (paper: up to 1.23x at
  PP=4, 1.14x at PP=8 under severe congestion): node-level swaps, so re-simulating with the
  congested pair renamed to the nodes that now run it is exact.
* **End to end** (§7.5, Figure 20, Table 6: 12 fail-slows, 2 communication and 10 compute
  (3 weak, 5 medium, 2 severe), 37.4 -> 18.9 -> 29.8 iterations/min, 1.58x): a 2 PP x 16 DP
  job (Greyhound's 8TP x 16DP x 2PP with TP collapsed) over a fixed schedule; each iteration
  lasts the what-if replay of the healthy tensors with the active faults and mitigations;
  faults are reported after a detection delay (Greyhound's measured 10.56 s); policies:
  S1 only, always S4 on detection, apply the addressing strategy at once, and the
  ski-rental :class:`~.planner.MitigationPlanner` with S2/S3 plans computed on the spot.
  Action costs are pauses: S2 its measured profile-and-solve time (no restart, §5.2;
  about a millisecond), S3 60 s (Greyhound: under a minute; reverting costs the same), S4
  420 s (Figure 19: disk checkpoint-and-restart up to 6.72x S3's pause). While S2 is
  applied the counts follow the measured per-group times (re-solved one iteration after
  the situation changes). The planner charges an anomaly the slow iterations before its
  report. :func:`breakdown` splits the gap to healthy into what S2/S3 leave, the report
  and relief delays, the pauses and ski rental's wait. The schedule's faults cost S1 30 %
  of the healthy throughput where the paper's unmitigated run lost 49.5 %, which caps any
  mitigation at 1.43x over S1 (the paper's cap: 1.98x); the run is repeated with every
  fault's excess slowdown scaled until S1 loses what the paper's did
  (:func:`calibrate_to_paper_s1`), the mitigated runs not fitted.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from failslow import results
from failslow.diagnosis import Anomaly
from failslow.mitigation.microbatches import plan_from_ops, predict_microbatches
from failslow.mitigation.planner import MitigationPlanner, PlannerConfig
from failslow.mitigation.topology import (
    Layout,
    PhysicalFaults,
    plan_for_anomalies,
    plan_topology,
    rank_permutation,
    retime,
    simulate_many,
    step_start_times,
)
from failslow.whatif.analysis import build_ops
from failslow.whatif.ops import OpTrace

PAPER: dict[str, dict[str, Any]] = {
    "s2_one_slow_dp_group": {"before_s": 1.31, "after_s": 0.83, "speedup": round(1.31 / 0.83, 2)},
    "s3_consolidation": {"links": [1, 2, 3], "before_x": [1.6, 1.7, 1.9],
                         "after_x": [1.3, 1.3, 1.7]},
    "s3_role_swap": {"pp4_speedup_severe": 1.23, "pp8_speedup_severe": 1.14},
    "end_to_end": {"healthy_it_per_min": 37.4, "s1_it_per_min": 18.9,
                   "greyhound_it_per_min": 29.8, "speedup_vs_s1": 1.58},
}
COSTS = {"S2": 2.0, "S3": 60.0, "S4": 420.0}
DETECTION_DELAY_S = 10.56
SEVERITY = {"weak": 1.5, "medium": 2.0, "severe": 3.0}
LINK_MEDIUM = 4.0


def _sim(parallel: dict[str, int], faults: list[dict[str, Any]], iterations: int,
         gpus_per_node: int, microbatches: int = 8, seed: int = 0) -> Any:
    from failslow.simulator import scenario_from_dict, simulate

    sc = scenario_from_dict({"job": "mitigation-eval", "parallel": {**parallel, "cp": 1},
                             "microbatches": microbatches, "iterations": iterations,
                             "gpus_per_node": gpus_per_node, "faults": faults,
                             "sampling": {"progress_ms": 0, "link_ms": 0, "gpu_ms": 0}})
    return simulate(sc, seed)


def _mean_time(result: Any, first: int = 0) -> float:
    ops = build_ops(result.tables, result.meta)
    return float(ops.actual[ops.steps >= first].mean())


def _sim_time(parallel: dict[str, int], faults: list[dict[str, Any]], iterations: int,
              gpus_per_node: int, first: int = 0) -> float:
    """Mean iteration time of a simulated job from iteration ``first`` on; a link fault no
    traffic crosses any more is dropped."""
    from failslow.simulator import ScenarioError

    kept = list(faults)
    while True:
        try:
            return _mean_time(_sim(parallel, kept, iterations, gpus_per_node), first)
        except ScenarioError as e:
            bad = [i for i, f in enumerate(kept)
                   if f["cause"] == "communication" and f"faults[{i}]" in str(e)]
            if not bad:
                raise
            del kept[bad[0]]


# ---------------------------------------------------------------------------------------------
# S2


def _s2_case(slow_groups: int, severity: float, iterations: int) -> dict[str, Any]:
    par = {"tp": 1, "pp": 2, "dp": 4}
    ranks = [d + 4 * p for d in range(slow_groups) for p in range(2)]
    faults = [{"cause": "compute", "ranks": ranks, "start": 0, "severity": severity}] \
        if ranks else []
    res = _sim(par, faults, iterations, 8)
    ops = build_ops(res.tables, res.meta)
    plan = plan_from_ops(ops)
    before = float(ops.actual.mean())
    after = plan.predicted_after_s if plan.feasible and plan.predicted_after_s else before
    pb = plan.predicted_before_s or before
    return {"slow_groups": slow_groups, "m": plan.m, "before_s": before,
            "predicted_before_s": pb, "after_s": after, "speedup": before / after,
            "predicted_speedup": pb / after if plan.feasible else 1.0,
            "feasible": plan.feasible}


def eval_s2(scale: float) -> dict[str, Any]:
    iterations = max(4, round(10 * scale))
    healthy = _mean_time(_sim({"tp": 1, "pp": 2, "dp": 4}, [], iterations, 8))
    sweep = [_s2_case(k, 1.8, iterations) for k in range(5)]
    one = sweep[1]
    return {
        "paper": PAPER["s2_one_slow_dp_group"],
        "ours": {"setup": "4 DP x 2 PP x TP 1 on one 8-GPU node, 8 micro-batches per DP "
                          "group (32 per global batch), DP group 0 computes 1.8x slower; "
                          "before measured (training simulator), after predicted (what-if "
                          "replay with per-group counts)",
                 "healthy_s": healthy, "before_s": one["before_s"],
                 "predicted_before_s": one["predicted_before_s"], "after_s": one["after_s"],
                 "speedup": one["speedup"], "predicted_speedup": one["predicted_speedup"],
                 "m": one["m"],
                 "before_x_healthy": one["before_s"] / healthy,
                 "after_x_healthy": one["after_s"] / healthy},
        "sweep_slow_groups": [{"slow_groups": c["slow_groups"], "m": c["m"],
                               "before_x": round(c["before_s"] / healthy, 4),
                               "after_x": round(c["after_s"] / healthy, 4)} for c in sweep],
    }


# ---------------------------------------------------------------------------------------------
# S3 helpers


def node_map(layout: Layout, block_of: np.ndarray) -> dict[int, int] | None:
    """Physical node -> the node whose logical positions it now runs, when the placement
    moves whole nodes (else None)."""
    ident = layout.identity()
    bn = layout.block_node
    phys_to_logical: dict[int, int] = {}
    for (p, d), b in np.ndenumerate(block_of):
        logical, physical = int(bn[ident[p, d]]), int(bn[b])
        if phys_to_logical.setdefault(physical, logical) != logical:
            return None
    return phys_to_logical


def ground_truth_faults(layout: Layout, block_of: np.ndarray, faults: list[dict[str, Any]]
                        ) -> list[dict[str, Any]]:
    """The simulator faults that reproduce physical ``faults`` after the placement:
    compute faults follow their GPUs to their new ranks; a congested node pair is renamed
    to the nodes whose positions the two physical nodes now run (whole-node moves only)."""
    perm = rank_permutation(layout, block_of)
    new_of_old = np.empty_like(perm)
    new_of_old[perm] = np.arange(perm.size)
    out = []
    for f in faults:
        g = copy.deepcopy(f)
        if f.get("ranks"):
            g["ranks"] = sorted(int(new_of_old[r]) for r in f["ranks"])
        if f.get("nodes"):
            nm = node_map(layout, block_of)
            if nm is None:
                raise ValueError("the placement moves part of a node: the simulator cannot "
                                 "re-create the congested link")
            g["nodes"] = [nm.get(int(n), int(n)) for n in f["nodes"]]
        out.append(g)
    return out


def _truth_or_detected(res: Any, detect: bool) -> tuple[list[Anomaly], str]:
    if detect:
        from failslow.engine.offline import analyze_tables

        diag = analyze_tables(res.meta, res.tables)
        slow = [a for a in diag.anomalies if a.kind == "slow"]
        if slow:
            return slow, "detector"
    return [a for a in res.truth.anomalies if a.kind == "slow"], "truth"


def _s3_case(par: dict[str, int], gpus_per_node: int, faults: list[dict[str, Any]],
             iterations: int, start: int, detect: bool) -> dict[str, Any]:
    res = _sim(par, faults, iterations, gpus_per_node)
    ops = build_ops(res.tables, res.meta)
    healthy = float(ops.actual[ops.steps < start].mean())
    before = float(ops.actual[ops.steps >= start].mean())
    anomalies, source = _truth_or_detected(res, detect)
    plan = plan_for_anomalies(ops, res.meta, anomalies, step_start_times(res.tables, ops,
                                                                         res.meta))
    layout = plan.layout
    after_sim = None
    if plan.feasible:
        moved = ground_truth_faults(layout, plan.block_of, faults)
        after_sim = _sim_time(par, moved, iterations, gpus_per_node, start)
    else:
        after_sim = before
    pb, pa_ = plan.predicted_before_s, plan.predicted_after_s
    if not plan.feasible:
        pa_ = pb
    extra: dict[str, Any] = {}
    alt = plan.alternatives.get("role-swap-to-pp")
    if alt is not None and faults and all(f["cause"] == "communication" for f in faults):
        # Figure 11 exactly: the congested pair carries PP traffic after the swap
        alt_pred = plan.candidates.get("role-swap-to-pp")
        alt_sim = _sim_time(par, ground_truth_faults(layout, alt, faults), iterations,
                            gpus_per_node, start)
        extra = {"paper_style_after_x": alt_sim / healthy,
                 "paper_style_predicted_after_x": (None if alt_pred is None
                                                   else alt_pred / healthy)}
    return {**extra, "plan": plan.strategy, "stragglers": [layout.blocks[b].tolist()
                                                  for b in plan.stragglers],
            "stages_needed": plan.stages_needed, "target_stages": plan.target_stages,
            "node_swaps": [[layout.node_names[a], layout.node_names[b]]
                           for a, b in plan.node_swaps],
            "anomalies_from": source, "healthy_s": healthy, "before_s": before,
            "before_x": before / healthy, "after_x": after_sim / healthy,
            "predicted_before_x": None if pb is None else pb / healthy,
            "predicted_after_x": None if pa_ is None else pa_ / healthy,
            "prediction_error": (None if pa_ is None or not plan.feasible
                                 else abs(pa_ - after_sim) / after_sim)}


#: Straggler GPUs (rank = dp + 4 * stage in 4 DP x 4 PP) for 1, 2, 3 congested links, each
#: slowing its two end GPUs, scattered over stages and pipelines.
CONSOLIDATION_RANKS = {1: [0, 13], 2: [0, 5, 10, 15], 3: [0, 3, 4, 9, 13, 14]}


def eval_consolidation(scale: float) -> dict[str, Any]:
    iterations = max(8, round(16 * scale))
    start = iterations // 3
    detect = scale >= 0.5
    rows = []
    for links, ranks in CONSOLIDATION_RANKS.items():
        faults = [{"cause": "compute", "ranks": ranks, "start": start, "severity": 2.0}]
        case = _s3_case({"tp": 1, "pp": 4, "dp": 4}, 16, faults, iterations, start, detect)
        rows.append({"links": links, "straggler_gpus": len(ranks), **case})
    return {"paper": PAPER["s3_consolidation"],
            "setup": "4 DP x 4 PP x TP 1 on one node, 8 micro-batches; 2 straggler GPUs per "
                     "congested link computing 2x slower, scattered",
            "ours": rows}


def eval_links(scale: float) -> dict[str, Any]:
    """1-3 congested node pairs on DP rings (4 DP x 4 PP, 2 GPUs per node: stage s on nodes
    2s, 2s+1, its DP ring crossing them) and Figure 16's role swap at PP=4 and PP=8."""
    iterations = max(8, round(16 * scale))
    start = iterations // 3
    detect = scale >= 0.5
    rows = []
    pairs = [[0, 1], [2, 3], [4, 5]]
    for k in (1, 2, 3):
        faults = [{"cause": "communication", "nodes": pairs[i], "start": start,
                   "severity": LINK_MEDIUM} for i in range(k)]
        case = _s3_case({"tp": 1, "pp": 4, "dp": 4}, 2, faults, iterations, start, detect)
        rows.append({"congested_links": k, **case})
    swap = []
    for pp, dp, gpn in ((4, 4, 2), (8, 2, 1)):
        for level, sev in (("weak", 2.0), ("medium", LINK_MEDIUM), ("severe", 8.0)):
            faults = [{"cause": "communication", "nodes": [0, 1], "start": start,
                       "severity": sev}]
            case = _s3_case({"tp": 1, "pp": pp, "dp": dp}, gpn, faults, iterations, start,
                            detect)
            swap.append({"pp": pp, "dp": dp, "severity": level,
                         "speedup": case["before_x"] / case["after_x"], **case})
    return {"paper": PAPER["s3_role_swap"],
            "congested_links": {"setup": "4 DP x 4 PP x TP 1, 2 GPUs per node, node pairs "
                                         "(0,1), (2,3), (4,5) (DP rings of stages 0-2) 4x "
                                         "slower", "ours": rows},
            "role_swap": {"setup": "the DP ring of stage 0 crosses the congested node pair",
                          "ours": swap}}


# ---------------------------------------------------------------------------------------------
# end to end


@dataclass
class Event:
    cause: str              # compute | communication
    level: str
    start_s: float
    duration_s: float
    rank: int | None = None
    nodes: tuple[int, int] | None = None

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


def schedule_12(horizon_s: float = 3000.0) -> list[Event]:
    """Greyhound Table 6: 2 medium communication and 10 compute fail-slows (3 weak, 5
    medium, 2 severe), two of them compound (compute during congestion). Job: 2 PP x 16 DP
    on 4 nodes of 8 GPUs; node pairs (0, 1) / (2, 3) carry the DP rings of stage 0 / 1."""
    k = horizon_s / 3000.0
    rows = [("compute", "medium", 100, 300, 5, None),
            ("compute", "weak", 450, 200, 20, None),
            ("communication", "medium", 700, 450, None, (0, 1)),
            ("compute", "severe", 800, 250, 27, None),
            ("compute", "medium", 1300, 300, 9, None),
            ("compute", "weak", 1500, 150, 30, None),
            ("compute", "medium", 1750, 250, 14, None),
            ("communication", "medium", 2000, 350, None, (2, 3)),
            ("compute", "severe", 2050, 200, 3, None),
            ("compute", "medium", 2450, 300, 22, None),
            ("compute", "weak", 2700, 200, 11, None),
            ("compute", "medium", 2850, 120, 17, None)]
    return [Event(c, lv, s * k, d * k, r, n) for c, lv, s, d, r, n in rows]


class _Regimes:
    """Iteration time of (active faults, placement, micro-batch counts), cached."""

    def __init__(self, ops: OpTrace, layout: Layout, excess_scale: float = 1.0) -> None:
        self.ops = ops
        self.layout = layout
        self.excess_scale = excess_scale     # (factor - 1) scaled, see calibrate_to_paper_s1
        self.cache: dict[Any, float] = {}

    def factor(self, base: float) -> float:
        return 1.0 + (base - 1.0) * self.excess_scale

    def faults(self, events: list[Event]) -> PhysicalFaults:
        f = PhysicalFaults()
        for e in events:
            if e.cause == "compute" and e.rank is not None:
                b = self.layout.block_of_rank(e.rank)
                f.compute[b] = f.compute.get(b, 1.0) * self.factor(SEVERITY[e.level])
            elif e.nodes is not None:
                key = (min(e.nodes), max(e.nodes))
                f.links[key] = f.links.get(key, 1.0) * self.factor(LINK_MEDIUM)
        return f

    def dur(self, faults: PhysicalFaults, block_of: np.ndarray) -> dict[str, np.ndarray]:
        return retime(self.ops, self.layout, PhysicalFaults(), faults, block_of)

    def time(self, events: list[Event], which: list[int], block_of: np.ndarray,
             m: tuple[int, ...] | None) -> float:
        key = (tuple(sorted(which)), block_of.tobytes(), m)
        if key not in self.cache:
            d = self.dur(self.faults([events[i] for i in which]), block_of)
            if m is None:
                t = float(simulate_many(self.ops, [d]).mean())
            else:
                t = float(predict_microbatches(self.ops, list(m), d).mean())
            self.cache[key] = t
        return self.cache[key]


class _EvalPlans:
    """The planner's S2 / S3 plans in the end-to-end run, computed on the spot from the
    tensors of the current situation (what GREYHOUND-DETECT's profiles would show)."""

    def __init__(self, now: Any, events: list[Event], reg: _Regimes, active: Any) -> None:
        self.now, self.events, self.reg, self.active = now, events, reg, active

    def plan(self, strategy: str, anomaly: Anomaly) -> dict[str, Any] | None:
        reg = self.reg
        ident = reg.layout.identity()
        cur = self.active(self.now())
        if strategy == "S2":
            sub = dataclasses.replace(reg.ops, dur=reg.dur(
                reg.faults([self.events[i] for i in cur]), ident))
            return plan_from_ops(sub).to_dict()
        if strategy == "S3":
            own = reg.faults([self.events[int(anomaly.id)]])
            ops_now = dataclasses.replace(reg.ops, dur=reg.dur(own, ident))
            return plan_topology(reg.layout, own, ops_now).to_dict()
        return None


@dataclass
class _Run:
    iterations: int = 0
    pause_s: float = 0.0
    actions: dict[str, int] = field(default_factory=dict)


def _timeline(policy: str, events: list[Event], reg: _Regimes, horizon_s: float,
              delay_s: float, costs: dict[str, float], close_delay_s: float | None = None,
              rebalance: bool = True) -> _Run:
    """Play the schedule under a policy (see the module docstring).

    ``delay_s``: how long after a fault starts its anomaly reaches the planner;
    ``close_delay_s`` (default ``delay_s``): how long after it ends the end is reported.
    ``rebalance``: while S2 is applied the micro-batch counts follow the DP groups'
    measured micro-batch times (Greyhound §5.2: each DP group fetches its m_i before every
    iteration, t_i profiled by GREYHOUND-DETECT), re-solved one iteration after the
    situation changes (the iteration that measures it); else they are solved only when a
    strategy is applied or reverted."""
    layout = reg.layout
    ident = layout.identity()
    close_delay = delay_s if close_delay_s is None else close_delay_s
    run = _Run()
    t = 0.0
    eliminated: set[int] = set()
    s2: set[int] = set()                 # events with S2 applied
    s3: set[int] = set()
    m: tuple[int, ...] | None = None
    place = ident
    announced: set[int] = set()
    closed: set[int] = set()
    rows: list[tuple[int, int]] = []
    it = 0
    next_feed = 0.0
    planned_for: tuple[int, ...] | None = None   # the situation m was solved for
    seen: tuple[int, ...] | None = None          # the situation of the previous iteration

    def active(now: float) -> list[int]:
        return [i for i, e in enumerate(events)
                if e.start_s <= now < e.end_s and i not in eliminated]

    planner = None
    if policy == "ski-rental":
        planner = MitigationPlanner("e2e", PlannerConfig(cost_s=dict(costs)),
                                    plans=_EvalPlans(lambda: t, events, reg, active))

    def solve_m(situation: list[int]) -> None:
        nonlocal m, planned_for
        planned_for = tuple(situation)
        if s2:
            sub = dataclasses.replace(reg.ops, dur=reg.dur(
                reg.faults([events[i] for i in situation]), place))
            mp = plan_from_ops(sub, predict=False)
            m = tuple(mp.m) if mp.feasible else None
        else:
            m = None

    def replan() -> None:
        nonlocal place
        f3 = reg.faults([events[i] for i in s3 if i in active(t)])
        if s3 and (f3.compute or f3.links):
            ops_now = dataclasses.replace(reg.ops, dur=reg.dur(f3, ident))
            tp = plan_topology(layout, f3, ops_now)
            place = tp.block_of if tp.feasible else ident
        else:
            place = ident
        solve_m(active(t))

    def pause(strategy: str, action: str) -> None:
        nonlocal t
        cost = costs[strategy]
        t += cost
        run.pause_s += cost
        key = f"{strategy}-{action}"
        run.actions[key] = run.actions.get(key, 0) + 1

    def apply(i: int, strategy: str) -> None:
        if strategy == "S4":
            pause("S4", "apply")
            eliminated.add(i)
            s2.discard(i)
            s3.discard(i)
        elif strategy == "S2":
            pause("S2", "apply")
            s2.add(i)
        elif strategy == "S3":
            pause("S3", "apply")
            s3.add(i)
        replan()

    def revert(i: int, strategy: str, restarted: bool) -> None:
        if strategy == "S2" and i in s2:
            s2.discard(i)
        elif strategy == "S3" and i in s3:
            s3.discard(i)
            if not restarted:
                pause("S3", "revert")
        replan()

    while t < horizon_s:
        # anomaly reports reach the planner ``delay_s`` after the fault starts and
        # ``close_delay`` after it ends
        opened: list[Anomaly] = []
        ended: list[Anomaly] = []
        for i, e in enumerate(events):
            if i not in announced and e.start_s + delay_s <= t < e.end_s:
                announced.add(i)
                opened.append(_anomaly(i, e, layout, None))
            if i in announced and i not in closed and (
                    t >= e.end_s + close_delay or i in eliminated):
                closed.add(i)
                ended.append(_anomaly(i, e, layout, int(min(t, e.end_s) * 1e9)))
        if policy == "always-S4":
            for a in opened:
                apply(int(a.id), "S4")
        elif policy == "immediate":
            for a in opened:
                apply(int(a.id), "S2" if a.cause == "compute" else "S3")
        if policy in ("always-S4", "immediate"):
            for a in ended:
                i = int(a.id)
                for s in ("S3", "S2"):
                    revert(i, s, i in eliminated)
        if planner is not None and (opened or ended or t >= next_feed):
            table = _iter_table(rows)
            rows = []
            next_feed = t + 2.0
            for adv in planner.update(table, opened + ended):
                i = int(adv.anomaly_id)
                if adv.action == "apply":
                    apply(i, adv.strategy)
                elif adv.action == "revert":
                    revert(i, adv.strategy, i in eliminated)
        now = tuple(active(t))
        if rebalance and s2 and seen == now and planned_for != now:
            solve_m(list(now))           # the last iteration measured the new situation
        seen = now
        dt = reg.time(events, list(now), place, m)
        rows.append((int(t * 1e9), int((t + dt) * 1e9)))
        t += dt
        if t <= horizon_s:
            it += 1
    run.iterations = it
    return run


def _anomaly(i: int, e: Event, layout: Layout, end_ns: int | None) -> Anomaly:
    if e.cause == "compute" and e.rank is not None:
        return Anomaly(id=str(i), kind="slow", cause="compute", ranks=[e.rank],
                       start_ns=int(e.start_s * 1e9), end_ns=end_ns)
    assert e.nodes is not None
    a = int(np.flatnonzero(layout.node == e.nodes[0])[0])
    b = int(np.flatnonzero(layout.node == e.nodes[1])[0])
    return Anomaly(id=str(i), kind="slow", cause="communication", ranks=[a, b], link=[a, b],
                   start_ns=int(e.start_s * 1e9), end_ns=end_ns)


def _iter_table(rows: list[tuple[int, int]]) -> pa.Table:
    n = len(rows)
    starts = [r[0] for r in rows]
    ends = [r[1] for r in rows]
    return pa.table({"job": ["e2e"] * n, "rank": [-1] * n, "iteration": list(range(n)),
                     "t_start": starts, "t_end": ends,
                     "duration_ns": [b - a for a, b in rows]},
                    schema=results.SCHEMAS["iterations"])


def measure_s2_cost(reg: _Regimes, events: list[Event], repeats: int = 5) -> float:
    """S2's action time, measured: deriving the DP groups' micro-batch times from the
    OpDuration tensors and solving the allocation (Greyhound §5.2: the new counts take
    effect at the next iteration without a restart, so that is the whole overhead; Table 5:
    0.01 s at 16 DP groups with cvxpy). Median over ``repeats`` solves of the first
    compute fail-slow of the schedule."""
    first = next(e for e in events if e.cause == "compute")
    sub = dataclasses.replace(reg.ops, dur=reg.dur(reg.faults([first]),
                                                   reg.layout.identity()))
    took = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan_from_ops(sub, predict=False)
        took.append(time.perf_counter() - t0)
    return float(np.median(took))


def _rate(r: _Run, horizon: float) -> float:
    return r.iterations / horizon * 60.0


def breakdown(events: list[Event], reg: _Regimes, horizon: float, delay: float,
              costs: dict[str, float]) -> dict[str, Any]:
    """Where the throughput between healthy and the ski-rental planner goes, as a ladder of
    counterfactual runs of the same schedule, each adding one real-world effect (it/min):
    what S2 / S3 leave even when applied at the fault's start for free; the detection
    delay before the report (Greyhound Table 6: 10.56 s); the delay of the relief report
    (strategies reverted late); the action pauses (S2 solve, S3 apply and revert); and
    ski-rental's wait for the impact to reach the cost (the online price of not knowing
    the duration, §5.1). The steps add up to healthy minus ski-rental."""
    zero = {s: 0.0 for s in costs}
    healthy = 60.0 / reg.time(events, [], reg.layout.identity(), None)
    ladder = [
        ("oracle", _timeline("immediate", events, reg, horizon, 0.0, zero)),
        ("report_delay", _timeline("immediate", events, reg, horizon, delay, zero,
                                   close_delay_s=0.0)),
        ("relief_delay", _timeline("immediate", events, reg, horizon, delay, zero)),
        ("action_pauses", _timeline("immediate", events, reg, horizon, delay, costs)),
        ("ski_rental_wait", _timeline("ski-rental", events, reg, horizon, delay, costs)),
    ]
    labels = {"oracle": "left by S2/S3 applied at the fault's start, for free",
              "report_delay": "slow iterations before the anomaly is reported",
              "relief_delay": "strategies reverted only when the relief is reported",
              "action_pauses": "action pauses (S2 solve, S3 apply + revert)",
              "ski_rental_wait": "ski rental: waiting for the impact to reach the cost"}
    out: dict[str, Any] = {"healthy_it_per_min": healthy}
    prev = healthy
    steps = {}
    for name, run in ladder:
        rate = _rate(run, horizon)
        steps[name] = {"it_per_min": rate, "lost_it_per_min": prev - rate,
                       "what": labels[name]}
        prev = rate
    out["steps"] = steps
    out["total_lost_it_per_min"] = healthy - prev
    out["events"] = event_factors(events, reg)
    return out


def event_factors(events: list[Event], reg: _Regimes) -> list[dict[str, Any]]:
    """Each fail-slow alone: its iteration time over healthy without mitigation and with
    the strategy that addresses it (S2 for compute, S3 for communication) in place -- what
    the oracle step of :func:`breakdown` leaves, per event."""
    ident = reg.layout.identity()
    healthy = reg.time(events, [], ident, None)
    rows = []
    for i, e in enumerate(events):
        faults = reg.faults([e])
        sub = dataclasses.replace(reg.ops, dur=reg.dur(faults, ident))
        if e.cause == "compute":
            mp = plan_from_ops(sub, predict=False)
            after = reg.time(events, [i], ident, tuple(mp.m) if mp.feasible else None)
            how = "S2"
        else:
            tp = plan_topology(reg.layout, faults, sub)
            after = reg.time(events, [i], tp.block_of if tp.feasible else ident, None)
            how = "S3"
        rows.append({"event": i, "cause": e.cause, "level": e.level,
                     "duration_s": e.duration_s,
                     "s1_x_healthy": reg.time(events, [i], ident, None) / healthy,
                     "mitigated_x_healthy": after / healthy, "strategy": how})
    return rows


def calibrate_to_paper_s1(events: list[Event], reg: _Regimes, horizon: float,
                          target: float) -> float:
    """The factor ``a`` by which every fault's excess slowdown (severity - 1) is scaled so
    that the S1-only run keeps ``target`` of the healthy throughput (bisection): the
    paper's unmitigated run kept 18.9 / 37.4 = 0.505 of it, ours 0.70 with the §7.3
    severities, so the paper's faults were harsher in aggregate than Table 6's levels
    with our durations give. The fit (about 2.6) makes single faults cost 1.6-4.3x the
    healthy iteration time, more than §7.3's compute fail-slows (about 1.7x) and §7.5's
    worst compound case (throughput -55 %, 2.2x): the paper's S1 figure implies more
    damage than its per-event figures, so this run bounds the comparison from the other
    side rather than replacing the uncalibrated one."""
    healthy = 60.0 / reg.time(events, [], reg.layout.identity(), None)
    lo, hi = 1.0, 8.0
    for _ in range(14):
        mid = 0.5 * (lo + hi)
        sub = _Regimes(reg.ops, reg.layout, mid)
        kept = _rate(_timeline("S1-only", events, sub, horizon, 0.0, {}), horizon) / healthy
        lo, hi = (mid, hi) if kept > target else (lo, mid)
    return 0.5 * (lo + hi)


def _policies(events: list[Event], reg: _Regimes, horizon: float, delay: float,
              costs: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {"healthy": {"it_per_min": 60.0 / reg.time(
        events, [], reg.layout.identity(), None)}}
    for policy in ("S1-only", "always-S4", "immediate", "ski-rental"):
        r = _timeline(policy, events, reg, horizon, delay, costs)
        out[policy] = {"it_per_min": _rate(r, horizon), "iterations": r.iterations,
                       "pause_s": round(r.pause_s, 2), "actions": r.actions}
    ski, s1, hl = (out["ski-rental"]["it_per_min"], out["S1-only"]["it_per_min"],
                   out["healthy"]["it_per_min"])
    out.update({
        "ski_rental_vs_s1": ski / s1,
        "ski_rental_vs_always_s4": ski / out["always-S4"]["it_per_min"],
        "ski_rental_vs_immediate": ski / out["immediate"]["it_per_min"],
        "s1_x_healthy": s1 / hl,
        "ski_rental_x_healthy": ski / hl,
        "ceiling_vs_s1": hl / s1,                 # free, instant, perfect mitigation
        "s1_loss_recovered": (ski - s1) / (hl - s1) if hl > s1 else None,
    })
    return out


def eval_end_to_end(scale: float) -> dict[str, Any]:
    horizon = 3000.0 * min(1.0, scale)
    k = horizon / 3000.0
    delay = DETECTION_DELAY_S * k
    res = _sim({"tp": 1, "pp": 2, "dp": 16}, [], max(3, round(6 * min(1.0, scale))), 8)
    ops = build_ops(res.tables, res.meta)
    layout = Layout.from_meta(res.meta)
    reg = _Regimes(ops, layout)
    events = schedule_12(horizon)
    s2_cost = measure_s2_cost(reg, events)
    costs = {"S2": s2_cost, "S3": COSTS["S3"] * k, "S4": COSTS["S4"] * k}
    out = _policies(events, reg, horizon, delay, costs)
    paper = PAPER["end_to_end"]
    paper_s1 = paper["s1_it_per_min"] / paper["healthy_it_per_min"]
    a = calibrate_to_paper_s1(events, reg, horizon, paper_s1)
    harsh = _Regimes(ops, layout, a)
    calibrated = _policies(events, harsh, horizon, delay, costs)
    return {"paper": {**paper, "s1_x_healthy": paper_s1,
                      "ceiling_vs_s1": paper["healthy_it_per_min"] / paper["s1_it_per_min"],
                      "s1_loss_recovered": (paper["greyhound_it_per_min"]
                                            - paper["s1_it_per_min"])
                      / (paper["healthy_it_per_min"] - paper["s1_it_per_min"])},
            "setup": {"job": "2 PP x 16 DP x TP 1 (4 nodes x 8 GPUs), 8 micro-batches per DP "
                             "group", "horizon_s": horizon, "detection_delay_s": delay,
                      "costs_s": costs, "s2_cost": "measured: profile + solve, no pause",
                      "severity": SEVERITY, "link_factor": LINK_MEDIUM,
                      "regimes_replayed": len(reg.cache)},
            "ours": out,
            "breakdown": breakdown(events, reg, horizon, delay, costs),
            "calibrated_to_paper_s1": {
                "excess_slowdown_scale": a,
                "note": "every fault's (severity - 1) scaled so that S1-only keeps the "
                        "paper's 0.505 of healthy; the mitigated runs are not fitted; the "
                        "fit makes single faults harsher than the paper's §7.3 figures "
                        "(see breakdown.events)",
                "ours": calibrated,
                "breakdown": breakdown(events, harsh, horizon, delay, costs)}}


def _bench(args: argparse.Namespace) -> dict[str, Any]:
    scale = float(getattr(args, "scale", 1.0) or 1.0)
    t0 = time.perf_counter()
    figures: dict[str, Any] = {}
    figures["s2_one_slow_dp_group"] = eval_s2(scale)
    figures["s3_consolidation"] = eval_consolidation(scale)
    figures["s3_links"] = eval_links(scale)
    figures["end_to_end"] = eval_end_to_end(scale)
    figures["seconds"] = round(time.perf_counter() - t0, 2)
    return _rounded(figures)


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 4) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_rounded(v) for v in x]
    return x


BENCHMARKS = {"mitigation": _bench}

__all__ = ["BENCHMARKS", "PAPER", "breakdown", "calibrate_to_paper_s1", "eval_consolidation",
           "eval_end_to_end", "eval_links", "eval_s2", "event_factors", "ground_truth_faults",
           "measure_s2_cost", "node_map", "schedule_12"]
