"""Adaptive multi-level mitigation planner (Greyhound §5.1, Algorithm 1): ski rental.

Per open slow anomaly, the accumulated impact (sum over slow iterations of t_slow minus
t_healthy) is compared with the action cost of the next applicable strategy; when the impact
reaches that cost the strategy is advised ("buy the skis when the rent paid equals the
price"). Strategies apply only to causes they address (Table 2): S2 (re-balance
micro-batches) for compute, S3 (adjust topology) for compute and communication, S4
(checkpoint and restart) last. When the anomaly resolves, applied reversible strategies are
reverted. Advice is an event the stream publishes, stores and pages with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from failslow.diagnosis import Anomaly

STRATEGIES = ("S2", "S3", "S4")
DESCRIPTIONS = {
    "S2": "re-balance micro-batches across DP groups",
    "S3": "adjust the parallel topology (consolidate stragglers, move congested links to PP)",
    "S4": "checkpoint and restart on healthy nodes",
}
#: Which causes each strategy addresses (Greyhound Table 2).
ADDRESSES = {"S2": {"compute", "mixed"}, "S3": {"compute", "communication", "mixed"},
             "S4": {"compute", "communication", "mixed"}}
REVERSIBLE = {"S2", "S3"}


@dataclass
class PlannerConfig:
    """Action costs in seconds of lost training time (defaults from Greyhound §5.2 and
    §7.4: S2 takes effect at the next iteration within seconds, S3 about a minute, S4 a
    checkpoint dump and restore of a large model, tens of minutes)."""

    cost_s: dict[str, float] = field(
        default_factory=lambda: {"S2": 5.0, "S3": 60.0, "S4": 1800.0})
    healthy_window: int = 50        # iterations in the healthy baseline (median)


@dataclass
class Advice:
    """One planner decision about one anomaly."""

    job: str
    anomaly_id: str
    strategy: str           # S2 | S3 | S4
    action: str             # apply | revert
    t_ns: int
    impact_s: float         # accumulated impact when decided
    cost_s: float
    description: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Open:
    anomaly: Anomaly
    impact_s: float = 0.0
    next_index: int = 0
    applied: list[str] = field(default_factory=list)


class MitigationPlanner:
    """Incremental planner: feed job-level iteration rows and anomaly reports."""

    def __init__(self, job: str, config: PlannerConfig | None = None) -> None:
        self.job = job
        self.config = config or PlannerConfig()
        self._healthy: list[float] = []
        self._open: dict[str, _Open] = {}

    def candidates(self, cause: str) -> list[str]:
        applicable = [s for s in STRATEGIES if cause in ADDRESSES[s]]
        return sorted(applicable, key=lambda s: self.config.cost_s[s])

    def update(self, iterations: pa.Table, anomalies: list[Anomaly]) -> list[Advice]:
        """``iterations``: rows of failslow.results "iterations" (rank -1 rows are used);
        ``anomalies``: slow-anomaly reports (opened, updated or ended)."""
        advice: list[Advice] = []
        for a in anomalies:
            if a.kind != "slow":
                continue
            state = self._open.get(a.id)
            if a.end_ns is None:
                if state is None:
                    self._open[a.id] = _Open(a)
                else:
                    state.anomaly = a
            elif state is not None:
                advice += self._close(state, a.end_ns)
        if iterations.num_rows:
            job_rows = iterations.filter(pa.compute.equal(iterations.column("rank"), -1))
            ends = job_rows.column("t_end").to_numpy()
            durations = job_rows.column("duration_ns").to_numpy() / 1e9
            advice += self._accumulate(ends, durations)
        return advice

    def _accumulate(self, ends: np.ndarray, durations: np.ndarray) -> list[Advice]:
        advice: list[Advice] = []
        in_anomaly = np.zeros(len(ends), dtype=bool)
        healthy = float(np.median(self._healthy)) if self._healthy else None
        for state in self._open.values():
            start = state.anomaly.start_ns or 0
            mask = ends >= start
            in_anomaly |= mask
            if healthy is not None and mask.any():
                state.impact_s += float(np.clip(durations[mask] - healthy, 0, None).sum())
            advice += self._escalate(state, int(ends.max()))
        self._healthy = (self._healthy + durations[~in_anomaly].tolist())[
            -self.config.healthy_window:]
        return advice

    def _escalate(self, state: _Open, now_ns: int) -> list[Advice]:
        out: list[Advice] = []
        ladder = self.candidates(state.anomaly.cause)
        while state.next_index < len(ladder):
            strategy = ladder[state.next_index]
            cost = self.config.cost_s[strategy]
            if state.impact_s < cost:
                break
            state.applied.append(strategy)
            state.next_index += 1
            out.append(Advice(self.job, state.anomaly.id, strategy, "apply", now_ns,
                              state.impact_s, cost, DESCRIPTIONS[strategy]))
        return out

    def _close(self, state: _Open, end_ns: int) -> list[Advice]:
        del self._open[state.anomaly.id]
        return [Advice(self.job, state.anomaly.id, s, "revert", end_ns, state.impact_s,
                       self.config.cost_s[s], DESCRIPTIONS[s])
                for s in reversed(state.applied) if s in REVERSIBLE]

    def snapshot(self) -> dict[str, Any]:
        return {"healthy": self._healthy,
                "open": {k: {"anomaly": v.anomaly.to_dict(), "impact_s": v.impact_s,
                             "next_index": v.next_index, "applied": v.applied}
                         for k, v in self._open.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self._healthy = list(state["healthy"])
        self._open = {k: _Open(Anomaly.from_dict(v["anomaly"]), v["impact_s"], v["next_index"],
                               list(v["applied"])) for k, v in state["open"].items()}
