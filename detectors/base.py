"""The detector contract: small incremental classes over record batches.

A detector follows the stream-processing shape of bytewax's stateful operators:
``update(batch)`` on new records (``on_item``), ``on_tick(now_ns)`` on time passing with or
without new records (``on_notify``; hangs are found this way), and ``snapshot()`` /
``restore(state)`` so a restarted processor resumes without relearning baselines or
re-reporting anomalies. The offline analyzer runs the same classes over a replayed trace.
"""

from __future__ import annotations

from typing import Any, Protocol

from failslow.diagnosis import Anomaly
from failslow.events import EventBatch

__all__ = ["Detector", "EventBatch"]



class Detector(Protocol):
    """What every detector implements. Returned anomalies are *reports*: an anomaly is
    returned once when opened and once more, with ``end_ns`` set, when it ends (same id)."""

    def update(self, batch: EventBatch) -> list[Anomaly]: ...

    def on_tick(self, now_ns: int) -> list[Anomaly]: ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...
