"""Adaptive multi-level mitigation planner (Greyhound §5.1, Algorithm 1): ski rental.

Per open slow anomaly, the accumulated impact (sum over its slow iterations of t_slow minus
t_healthy) is compared with the action cost of the next applicable strategy; when the impact
reaches that cost the strategy is advised ("buy the skis when the rent paid equals the
price"). Strategies apply only to causes they address (Table 2): S2 (re-balance
micro-batches) for compute, S3 (adjust topology) for compute and communication, S4
(checkpoint and restart) last; ``mixed`` counts as both. A strategy whose concrete plan (from
a :class:`PlanSource`) is infeasible or predicted not to help is skipped, and the ladder
moves on when the impact reaches the next cost. When the anomaly resolves, the applied
reversible strategies are reverted, the last applied first.

Active validation counts as rent paid (issue 17): the training time an anomaly's probes may
have cost (``extra["probe_cost"]["training_lost_s"]``, :mod:`failslow.engine.probes`) is
added to its accumulated impact once, when a report carries it. §5.1's impact is what the
fail-slow has cost the job so far, and validation is part of that (§4.3: it exists only to
locate the fail-slow; §7.5 counts detection and validation overhead in the end-to-end
throughput). The figure is an upper bound that may overlap the slow iterations' excess
(probes share the GPU or link with a running job), so it can escalate a strategy at most
that many seconds of impact early; a probe that did not run costs nothing.

Advice is an event. ``Advice.to_dict()`` is the payload for the advice topic, webhooks and
dashboards; :data:`ADVICE_SCHEMA` the Arrow schema of its rows (``Advice.to_row()``, the
plan as JSON text) for ClickHouse. Shape (version 1)::

    {
      "version": 1,
      "kind": "mitigation_advice",
      "advice_id": "<anomaly_id>/<strategy>/<action>",
      "job": "job-id",
      "anomaly_id": "slow-0",
      "cause": "compute | communication | mixed",
      "ranks": [21],                    # the anomaly's root-cause ranks
      "link": [6, 8] | null,            # the anomaly's slow link (two global ranks)
      "strategy": "S2 | S3 | S4",
      "action": "apply | revert | skip",
      "t_ns": 1750000012000000000,      # trace time of the decision
      "impact_s": 5.3,                  # accumulated impact when decided
      "cost_s": 5.0,                    # the strategy's action cost
      "slow_iterations": 14,
      "t_slow_s": 0.61,                 # mean iteration time during the anomaly
      "t_healthy_s": 0.40,              # healthy baseline (median)
      "description": "re-balance micro-batches across DP groups",
      "reason": "impact 5.3 s >= cost 5 s",
      "plan": {...} | null              # S2: microbatches.MicrobatchPlan.to_dict()
    }                                   # S3: topology_plan.TopologyPlan.to_dict()

An S2 plan carries ``m`` (micro-batches per DP group, index = DP rank) and the predicted
step time before and after; an S3 plan ``placement`` (``placement[new_rank] = old_slot``:
the GPU that held global rank old_slot runs new_rank), ``node_of_rank``, ``moves``,
``node_swaps`` and the predicted times.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import results
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

ADVICE_VERSION = 1
STRATEGIES = ("S2", "S3", "S4")
ACTIONS = ("apply", "revert", "skip")
DESCRIPTIONS = {
    "S2": "re-balance micro-batches across DP groups",
    "S3": "adjust the parallel topology (consolidate stragglers, move congested links to PP)",
    "S4": "checkpoint and restart on healthy nodes",
}
#: Which causes each strategy addresses (Greyhound Table 2).
ADDRESSES = {"S2": {"compute", "mixed"}, "S3": {"compute", "communication", "mixed"},
             "S4": {"compute", "communication", "mixed"}}
REVERSIBLE = {"S2", "S3"}
#: Arrow schema of advice rows (``Advice.to_row()``; the output contract's ``advice``
#: table, :mod:`failslow.results`); ``plan`` is JSON text.
ADVICE_SCHEMA = results.SCHEMAS["advice"]


@dataclass
class PlannerConfig:
    """Action costs in seconds of lost training time (defaults from Greyhound §5.2 and
    §7.4: S2 takes effect at the next iteration within seconds, S3 pauses the job for
    about a minute, S4 dumps and restores a checkpoint of a large model, tens of
    minutes)."""

    cost_s: dict[str, float] = field(
        default_factory=lambda: {"S2": 5.0, "S3": 60.0, "S4": 1800.0})
    healthy_window: int = 50        # iterations in the healthy baseline (median)
    #: recent job iterations kept so that an anomaly reported after its start (the
    #: detection delay, Greyhound Table 6: ~10 s) is charged the slow iterations it already
    #: caused, and they leave the healthy baseline
    history: int = 256

    @classmethod
    def parse_costs(cls, text: str) -> dict[str, float]:
        """``"S2=5,S3=60"`` -> ``{"S2": 5.0, "S3": 60.0}`` (ValueError when malformed)."""
        out: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            name, sep, value = part.partition("=")
            name = name.strip().upper()
            try:
                cost = float(value)
            except ValueError:
                cost = -1.0
            if not sep or name not in STRATEGIES or not cost >= 0:
                raise ValueError(f"{part!r}: expected STRATEGY=SECONDS with a strategy in "
                                 f"{', '.join(STRATEGIES)} and a cost >= 0")
            out[name] = cost
        return out

    @classmethod
    def from_costs(cls, text: str) -> PlannerConfig:
        """The defaults with the costs of ``text`` (``S2=5,S3=60,...``; empty: none)
        applied; ValueError when malformed. The stream processor's costs come from its
        configuration (``failslow process --planner-costs``, the settings'
        ``processor.planner_costs``)."""
        config = cls()
        if text.strip():
            config.cost_s.update(cls.parse_costs(text))
        return config


@dataclass
class Advice:
    """One planner decision about one anomaly (see the module docstring)."""

    job: str
    anomaly_id: str
    strategy: str           # S2 | S3 | S4
    action: str             # apply | revert | skip
    t_ns: int
    impact_s: float         # accumulated impact when decided
    cost_s: float
    description: str
    cause: str = ""
    ranks: list[int] = field(default_factory=list)
    link: list[int] | None = None
    slow_iterations: int = 0
    t_slow_s: float | None = None
    t_healthy_s: float | None = None
    reason: str = ""
    plan: dict[str, Any] | None = None

    @property
    def advice_id(self) -> str:
        return f"{self.anomaly_id}/{self.strategy}/{self.action}"

    def to_dict(self) -> dict[str, Any]:
        return {"version": ADVICE_VERSION, "kind": "mitigation_advice",
                "advice_id": self.advice_id, "job": self.job, "anomaly_id": self.anomaly_id,
                "cause": self.cause, "ranks": list(self.ranks),
                "link": None if self.link is None else list(self.link),
                "strategy": self.strategy, "action": self.action, "t_ns": int(self.t_ns),
                "impact_s": float(self.impact_s), "cost_s": float(self.cost_s),
                "slow_iterations": int(self.slow_iterations), "t_slow_s": self.t_slow_s,
                "t_healthy_s": self.t_healthy_s, "description": self.description,
                "reason": self.reason, "plan": self.plan}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=_json_default)

    def to_row(self) -> dict[str, Any]:
        """One row of :data:`ADVICE_SCHEMA` (the plan as JSON text)."""
        row = self.to_dict()
        del row["kind"]
        row["plan"] = None if self.plan is None else json.dumps(self.plan,
                                                                 default=_json_default)
        return row

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Advice:
        plan = d.get("plan")
        if isinstance(plan, str):
            plan = json.loads(plan)
        return cls(job=d["job"], anomaly_id=d["anomaly_id"], strategy=d["strategy"],
                   action=d["action"], t_ns=int(d["t_ns"]), impact_s=float(d["impact_s"]),
                   cost_s=float(d["cost_s"]), description=d.get("description", ""),
                   cause=d.get("cause", ""), ranks=list(d.get("ranks") or []),
                   link=list(d["link"]) if d.get("link") else None,  # stored: [] = none
                   slow_iterations=int(d.get("slow_iterations", 0)),
                   t_slow_s=d.get("t_slow_s"), t_healthy_s=d.get("t_healthy_s"),
                   reason=d.get("reason", ""), plan=plan)


def _json_default(x: Any) -> Any:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def advice_table(advice: list[Advice]) -> pa.Table:
    """Advice as an Arrow table of :data:`ADVICE_SCHEMA` (for ClickHouse / Parquet)."""
    return results.to_table("advice", [a.to_row() for a in advice])


class PlanSource(Protocol):
    """Computes the concrete plan of a strategy for an anomaly (a dict with at least
    ``feasible``), or None when it cannot tell."""

    def plan(self, strategy: str, anomaly: Anomaly) -> dict[str, Any] | None: ...


@dataclass
class _Open:
    anomaly: Anomaly
    impact_s: float = 0.0
    next_index: int = 0
    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    slow_iterations: int = 0
    slow_total_s: float = 0.0
    plans: dict[str, Any] = field(default_factory=dict)
    #: training seconds lost to the anomaly's probes, charged to ``impact_s`` so far
    probe_s: float = 0.0


class MitigationPlanner:
    """Incremental planner: feed job-level iteration rows and anomaly reports.

    ``plans``: where concrete S2 / S3 plans come from (:class:`TracePlans` from a trace's
    OpDuration tensors, :class:`AnomalyPlans` from the anomaly alone); without it, advice
    carries no plan and no strategy is skipped."""

    def __init__(self, job: str, config: PlannerConfig | None = None,
                 plans: PlanSource | None = None) -> None:
        self.job = job
        self.config = config or PlannerConfig()
        self.plans = plans
        self._healthy: list[float] = []
        self._open: dict[str, _Open] = {}
        # the last ``config.history`` job iterations: end time, duration (s), whether an
        # anomaly has claimed it (claimed rows are not healthy)
        self._ends = np.zeros(0, dtype=np.int64)
        self._durs = np.zeros(0, dtype=np.float64)
        self._claimed = np.zeros(0, dtype=bool)

    def candidates(self, cause: str) -> list[str]:
        """FINDSTRATEGIES(root_cause) sorted by overhead (Algorithm 1, lines 3-5)."""
        applicable = [s for s in STRATEGIES if cause in ADDRESSES[s]]
        return sorted(applicable, key=lambda s: self.config.cost_s[s])

    @property
    def healthy_s(self) -> float | None:
        return float(np.median(self._healthy)) if self._healthy else None

    def open_anomalies(self) -> list[str]:
        return list(self._open)

    def applied(self, anomaly_id: str) -> list[str]:
        state = self._open.get(anomaly_id)
        return [] if state is None else list(state.applied)

    def update(self, iterations: pa.Table, anomalies: list[Anomaly]) -> list[Advice]:
        """``iterations``: new rows of failslow.results "iterations" (rank -1 rows are
        used); ``anomalies``: slow-anomaly reports (opened, updated or ended).

        Both are taken in time order: an iteration at its end, a report when it was made
        (an end report at the anomaly's end), an iteration before a report of the same
        time. The advice therefore does not depend on how the input was cut into batches:
        online and offline decide the same at the same times."""
        ends = np.zeros(0, dtype=np.int64)
        durations = np.zeros(0, dtype=np.float64)
        if iterations.num_rows:
            job_rows = iterations.filter(pc.equal(iterations.column("rank"), -1))
            if job_rows.num_rows:
                ends = np.asarray(job_rows.column("t_end").to_numpy(), dtype=np.int64)
                durations = np.asarray(job_rows.column("duration_ns").to_numpy(),
                                       dtype=np.float64) / 1e9
                order = np.argsort(ends, kind="stable")
                ends, durations = ends[order], durations[order]
        reports = sorted((a for a in anomalies if a.kind == "slow"), key=_report_time)
        advice: list[Advice] = []
        done = 0
        for a in reports:
            upto = int(np.searchsorted(ends, _report_time(a), side="right"))
            advice += self._accumulate(ends[done:upto], durations[done:upto])
            done = max(done, upto)
            state = self._open.get(a.id)
            if a.end_ns is None:
                if state is None:
                    state = self._open[a.id] = _Open(a)
                    advice += self._backfill(state)
                else:
                    state.anomaly = a
                if self._charge_probes(state):
                    advice += self._escalate(state, _report_time(a))
            elif state is not None:
                state.anomaly = a
                advice += self._close(state, a.end_ns)
        advice += self._accumulate(ends[done:], durations[done:])
        return advice

    def _charge(self, state: _Open, durations: np.ndarray, healthy: float | None) -> None:
        """Add slow iterations to an anomaly's accumulated impact (Algorithm 1, lines 9-11:
        slow_iters x (t_slow - t_healthy), per iteration)."""
        if durations.size:
            state.slow_iterations += int(durations.size)
            state.slow_total_s += float(durations.sum())
            if healthy is not None:
                state.impact_s += float(np.clip(durations - healthy, 0, None).sum())

    def _charge_probes(self, state: _Open) -> bool:
        """Add the training time lost to the anomaly's probes not charged yet (module
        docstring); whether the impact grew."""
        cost = state.anomaly.extra.get("probe_cost") or {}
        try:
            lost = float(cost.get("training_lost_s") or 0.0)
        except (TypeError, ValueError):
            return False
        if not lost > state.probe_s:
            return False
        state.impact_s += lost - state.probe_s
        state.probe_s = lost
        return True

    def _backfill(self, state: _Open) -> list[Advice]:
        """A newly reported anomaly is charged the iterations since its ``start_ns`` that
        were seen before the report (Greyhound §7.5: reported ~10 s after the fail-slow
        began; those iterations were slow too), and they leave the healthy baseline, which
        they would otherwise drag towards the slow time. Escalates at once when that
        impact already reaches a cost."""
        start = state.anomaly.start_ns
        if start is None or not self._ends.size:
            return []
        mask = self._ends > start
        if not mask.any():
            return []
        self._claimed |= mask
        healthy = self._rebuild_healthy()
        self._charge(state, self._durs[mask], healthy)
        return self._escalate(state, int(self._ends.max()))

    def _rebuild_healthy(self) -> float | None:
        free = self._durs[~self._claimed]
        if free.size:
            self._healthy = free[-self.config.healthy_window:].tolist()
        return self.healthy_s

    def _accumulate(self, ends: np.ndarray, durations: np.ndarray) -> list[Advice]:
        """Job iterations in time order, one at a time: an escalation happens at the end of
        the iteration whose impact reaches the cost (a handful of job iterations per batch)."""
        advice: list[Advice] = []
        for i in range(len(ends)):
            advice += self._accumulate_one(ends[i:i + 1], durations[i:i + 1])
        return advice

    def _accumulate_one(self, ends: np.ndarray, durations: np.ndarray) -> list[Advice]:
        advice: list[Advice] = []
        in_anomaly = np.zeros(len(ends), dtype=bool)
        healthy = self.healthy_s
        for state in list(self._open.values()):
            start = state.anomaly.start_ns or 0
            mask = ends > start
            in_anomaly |= mask
            self._charge(state, durations[mask], healthy)
            advice += self._escalate(state, int(ends.max()))
        self._healthy = (self._healthy + durations[~in_anomaly].tolist())[
            -self.config.healthy_window:]
        keep = max(self.config.history, self.config.healthy_window)
        self._ends = np.concatenate([self._ends, ends])[-keep:]
        self._durs = np.concatenate([self._durs, durations.astype(np.float64)])[-keep:]
        self._claimed = np.concatenate([self._claimed, in_anomaly])[-keep:]
        return advice

    def _advice(self, state: _Open, strategy: str, action: str, t_ns: int, reason: str,
                plan: dict[str, Any] | None) -> Advice:
        a = state.anomaly
        return Advice(self.job, a.id, strategy, action, t_ns, state.impact_s,
                      self.config.cost_s[strategy], DESCRIPTIONS[strategy], cause=a.cause,
                      ranks=list(a.ranks), link=None if a.link is None else list(a.link),
                      slow_iterations=state.slow_iterations,
                      t_slow_s=(state.slow_total_s / state.slow_iterations
                                if state.slow_iterations else None),
                      t_healthy_s=self.healthy_s, reason=reason, plan=plan)

    def _escalate(self, state: _Open, now_ns: int) -> list[Advice]:
        """Algorithm 1, lines 7-16: apply the next strategy while the impact reaches its
        cost; a strategy whose plan says it cannot help is skipped instead."""
        out: list[Advice] = []
        for strategy in self.candidates(state.anomaly.cause):
            if strategy in state.applied or strategy in state.skipped:
                continue
            cost = self.config.cost_s[strategy]
            if state.impact_s < cost:
                break
            plan = self._plan(strategy, state.anomaly)
            probes = f" (probes {state.probe_s:.3g} s)" if state.probe_s else ""
            reason = f"impact {state.impact_s:.3g} s{probes} >= cost {cost:.3g} s"
            if plan is not None and not plan.get("feasible", True):
                state.skipped.append(strategy)
                why = plan.get("reason") or plan.get("note") or "predicted not to help"
                out.append(self._advice(state, strategy, "skip", now_ns,
                                        f"{reason}, but {why}", plan))
                continue
            state.applied.append(strategy)
            state.next_index += 1
            if plan is not None:
                state.plans[strategy] = plan
            out.append(self._advice(state, strategy, "apply", now_ns, reason, plan))
        return out

    def _plan(self, strategy: str, anomaly: Anomaly) -> dict[str, Any] | None:
        if self.plans is None or strategy == "S4":
            return None
        return self.plans.plan(strategy, anomaly)

    def _close(self, state: _Open, end_ns: int) -> list[Advice]:
        del self._open[state.anomaly.id]
        return [self._advice(state, s, "revert", end_ns, "the anomaly ended",
                             state.plans.get(s))
                for s in reversed(state.applied) if s in REVERSIBLE]

    def snapshot(self) -> dict[str, Any]:
        return {"healthy": self._healthy,
                "history": {"end_ns": self._ends.tolist(), "duration_s": self._durs.tolist(),
                            "claimed": self._claimed.tolist()},
                "open": {k: {"anomaly": v.anomaly.to_dict(), "impact_s": v.impact_s,
                             "next_index": v.next_index, "applied": v.applied,
                             "skipped": v.skipped, "slow_iterations": v.slow_iterations,
                             "slow_total_s": v.slow_total_s, "plans": v.plans,
                             "probe_s": v.probe_s}
                         for k, v in self._open.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self._healthy = list(state["healthy"])
        hist = state.get("history") or {}
        self._ends = np.asarray(hist.get("end_ns", []), dtype=np.int64)
        self._durs = np.asarray(hist.get("duration_s", []), dtype=np.float64)
        self._claimed = np.asarray(hist.get("claimed", []), dtype=bool)
        self._open = {k: _Open(Anomaly.from_dict(v["anomaly"]), v["impact_s"], v["next_index"],
                               list(v["applied"]), list(v.get("skipped", [])),
                               int(v.get("slow_iterations", 0)),
                               float(v.get("slow_total_s", 0.0)), dict(v.get("plans", {})),
                               float(v.get("probe_s", 0.0)))
                      for k, v in state["open"].items()}


# ---------------------------------------------------------------------------------------------
# plan sources


class TracePlans:
    """S2 and S3 plans from a trace's OpDuration tensors (what-if §3.2): for an anomaly,
    the steps inside its window are used; S2 measures each DP group's micro-batch time and
    re-balances, S3 consolidates / swaps roles; both predict the step time before and
    after with the what-if dependency simulator."""

    def __init__(self, ops: Any, meta: JobMeta, step_starts: np.ndarray | None = None,
                 multiple_of: int = 1) -> None:
        self.ops = ops
        self.meta = meta
        self.step_starts = step_starts
        self.multiple_of = multiple_of

    @classmethod
    def from_tables(cls, tables: dict[str, pa.Table], meta: JobMeta,
                    multiple_of: int = 1) -> TracePlans:
        from failslow.mitigation.topology import step_start_times
        from failslow.whatif.analysis import build_ops

        ops = build_ops(tables, meta)
        return cls(ops, meta, step_start_times(tables, ops, meta), multiple_of)

    def steps_of(self, anomaly: Anomaly) -> np.ndarray:
        """Which steps of the trace belong to the anomaly (all when step times are unknown)."""
        from failslow.mitigation.topology import steps_in_window

        mask = steps_in_window(self.ops, self.step_starts, [anomaly])
        return mask if mask.any() else np.ones(self.ops.steps.size, dtype=bool)

    def plan(self, strategy: str, anomaly: Anomaly) -> dict[str, Any] | None:
        from failslow.mitigation.microbatches import plan_from_ops
        from failslow.mitigation.topology import plan_for_anomalies, subset_steps
        from failslow.whatif.ops import WhatIfInputError

        try:
            if strategy == "S2":
                sub = subset_steps(self.ops, self.steps_of(anomaly))
                return plan_from_ops(sub, multiple_of=self.multiple_of).to_dict()
            if strategy == "S3":
                return plan_for_anomalies(self.ops, self.meta, [anomaly],
                                          self.step_starts).to_dict()
        except (WhatIfInputError, ValueError) as e:
            return {"strategy": strategy, "feasible": False, "reason": str(e)}
        return None


class AnomalyPlans:
    """S2 and S3 plans from the anomaly alone (no trace at hand): DP groups holding a
    root-cause rank get a micro-batch time of ``severity`` (the anomaly's ``severity`` or
    ``slowdown``), the others 1; S3 consolidates the root-cause ranks and swaps roles for
    its link, without a prediction."""

    def __init__(self, meta: JobMeta, multiple_of: int = 1) -> None:
        self.meta = meta
        self.multiple_of = multiple_of

    def plan(self, strategy: str, anomaly: Anomaly) -> dict[str, Any] | None:
        """The plan, or an infeasible one saying why when the job's description does not
        allow one (no micro-batch count, a layout the planners do not know)."""
        try:
            return self._plan(strategy, anomaly)
        except (ValueError, KeyError, IndexError) as e:
            return {"strategy": strategy, "feasible": False, "reason": str(e)}

    def _plan(self, strategy: str, anomaly: Anomaly) -> dict[str, Any] | None:
        from failslow.mitigation.microbatches import allocate_microbatches
        from failslow.mitigation.topology import Layout, PhysicalFaults, plan_topology

        if strategy == "S2" and self.meta.microbatches <= 0:
            return {"strategy": "S2", "feasible": False,
                    "reason": "the job's micro-batch count is unknown"}
        layout = Layout.from_meta(self.meta)
        factor = float(anomaly.extra.get("severity") or anomaly.slowdown or 1.5)
        blocks = sorted({layout.block_of_rank(r) for r in anomaly.ranks})
        if strategy == "S2":
            t = np.ones(self.meta.dp)
            for b in blocks:
                t[b % self.meta.dp] = max(t[b % self.meta.dp], factor)
            total = self.meta.microbatches * self.meta.dp
            if (t == t[0]).all():
                return {"strategy": "S2", "feasible": False,
                        "reason": "every DP group is equally slow: no room to re-balance"}
            alloc = allocate_microbatches(t, total, self.multiple_of)
            return {"strategy": "S2", "feasible": True, "m": alloc.m,
                    "times_s": t.tolist(), "total": total, "max_time_s": alloc.max_time,
                    "even_max_time_s": float(t.max() * self.meta.microbatches),
                    "predicted_before_s": None, "predicted_after_s": None}
        if strategy == "S3":
            faults = PhysicalFaults()
            if anomaly.cause in ("compute", "mixed"):
                faults.compute = {b: factor for b in blocks}
            if anomaly.cause in ("communication", "mixed") and anomaly.link:
                a, b = (int(layout.node[r]) for r in anomaly.link[:2])
                if a != b:
                    faults.links[(min(a, b), max(a, b))] = factor
            return plan_topology(layout, faults).to_dict()
        return None


def _report_time(a: Anomaly) -> int:
    """When a report was made: an end report at the anomaly's end, others at detection."""
    t = a.end_ns if a.end_ns is not None else (a.detected_ns or a.start_ns or 0)
    return int(t)
