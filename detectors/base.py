"""The detector contract: small incremental classes over record batches.

A detector follows the stream-processing shape of bytewax's stateful operators:
``update(batch)`` on new records (``on_item``), ``on_tick(now_ns)`` on time passing with or
without new records (``on_notify``; hangs are found this way), and ``snapshot()`` /
``restore(state)`` so a restarted processor resumes without relearning baselines or
re-reporting anomalies. It declares what it reads (``kinds``: record kinds of events.md and
tables derived by detectors that run before it, such as ``iterations``) and what it derives
(``produces``, returned by ``outputs()`` after each ``update``). A detector that reads the
others' reports (``reads_reports``) may split off a ``prepare(batch)`` step that reads only
the batch's records; the engine runs it beside the detectors before it. The engine's registry
(:mod:`failslow.engine.registry`) lists every detector once, in the order their derived
tables flow; one runner drives them online and offline.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import pyarrow as pa

from failslow.diagnosis import Anomaly
from failslow.events import EventBatch

__all__ = ["DERIVED_KINDS", "Detector", "EventBatch", "Reporting"]

#: Tables a detector derives for the ones after it (not record kinds of events.md).
DERIVED_KINDS = ("iterations", "rounds", "evidence")


class Reporting(Protocol):
    """Anything fed batches and ticks that returns anomaly reports: a detector, or a job's
    whole engine (:class:`failslow.engine.analyzer.Reports`)."""

    def update(self, batch: EventBatch) -> list[Anomaly]: ...

    def on_tick(self, now_ns: int) -> list[Anomaly]: ...


class Detector(Protocol):
    """What every detector implements. Returned anomalies are *reports*: an anomaly is
    returned once when opened, again when refined, and once more, with ``end_ns`` set,
    when it ends (same id)."""

    #: the registry's name of the detector (the diagnosis' ``incomplete`` list uses it)
    name: ClassVar[str]
    #: what ``update`` reads: record kinds and derived tables (:data:`DERIVED_KINDS`)
    kinds: ClassVar[frozenset[str]]
    #: the derived tables ``outputs()`` returns (results.SCHEMAS names)
    produces: ClassVar[tuple[str, ...]]

    def update(self, batch: EventBatch) -> list[Anomaly]: ...

    def on_tick(self, now_ns: int) -> list[Anomaly]: ...

    def outputs(self) -> dict[str, pa.Table]:
        """The derived tables of the latest ``update`` (``produces``; empty tables allowed)."""
        ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...
