"""What an anomaly costs, and how loud it should page: one definition for the notifier
(``failslow notify``), the dashboards' SQL and the report.

A fail-slow stretches every iteration of the whole job (a straggler holds up all ranks at the
next collective; Falcon §2, MEGATRACE §II), so while it lasts every rank of the job loses the
fraction ``1 - 1/slowdown`` of its time (``slowdown`` = iteration time during the anomaly over
the baseline, diagnosis.md). Over ``duration`` seconds that is

    cost = world_size x duration x (1 - 1/slowdown)       [GPU-seconds]

and a hang costs ``world_size x duration``: nothing progresses. The severity follows the cost
in GPU-hours, a hang is always critical.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SEVERITIES = ("info", "warning", "error", "critical")


@dataclass(frozen=True)
class Thresholds:
    """Lower bounds, in GPU-hours lost, of each severity above ``info``."""

    warning: float = 0.1
    error: float = 1.0
    critical: float = 10.0

    @classmethod
    def from_dict(cls, d: Mapping[str, float]) -> Thresholds:
        unknown = set(d) - {"warning", "error", "critical"}
        if unknown:
            raise ValueError(f"severity thresholds: unknown key(s) {sorted(unknown)}")
        t = cls(**{k: float(v) for k, v in d.items()})
        if not 0 <= t.warning <= t.error <= t.critical:
            raise ValueError("severity thresholds must satisfy 0 <= warning <= error <= critical")
        return t


DEFAULT_THRESHOLDS = Thresholds()


def lost_fraction(kind: str, slowdown: float | None) -> float:
    """Share of the job's time lost while the anomaly lasts."""
    if kind == "hang":
        return 1.0
    s = 1.0 if slowdown is None else max(float(slowdown), 1.0)
    return 1.0 - 1.0 / s


def cost_gpu_hours(kind: str, slowdown: float | None, world_size: int,
                   duration_s: float) -> float:
    """GPU-hours lost (see the module docstring)."""
    return max(world_size, 1) * max(duration_s, 0.0) * lost_fraction(kind, slowdown) / 3600.0


def severity(kind: str, cost_gpu_h: float, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> str:
    """``info``, ``warning``, ``error`` or ``critical``; a hang is critical."""
    if kind == "hang" or cost_gpu_h >= thresholds.critical:
        return "critical"
    if cost_gpu_h >= thresholds.error:
        return "error"
    if cost_gpu_h >= thresholds.warning:
        return "warning"
    return "info"


def rank_of(name: str) -> int:
    """Order of a severity name (``info`` = 0)."""
    return SEVERITIES.index(name)


# SQL forms of the same, for the dashboards (columns of the ``anomalies`` table)


def sql_lost_fraction(kind: str = "kind", slowdown: str = "slowdown") -> str:
    return f"if({kind} = 'hang', 1.0, 1.0 - 1.0 / greatest(coalesce({slowdown}, 1.0), 1.0))"


def sql_severity(kind: str, cost_gpu_h: str,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> str:
    return (f"multiIf({kind} = 'hang' OR {cost_gpu_h} >= {thresholds.critical!r}, 'critical', "
            f"{cost_gpu_h} >= {thresholds.error!r}, 'error', "
            f"{cost_gpu_h} >= {thresholds.warning!r}, 'warning', 'info')")
