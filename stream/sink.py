"""Where the stream processor writes: the sink contract, the rows of its records, and an
in-memory sink for tests. The tables and their columns are those of the output contract
(:mod:`failslow.results`); the rows here are mapped onto them by column name.

The contract follows the shape of a streaming sink with checkpoints: the processor collects
the records of many messages, hands them to :meth:`Sink.write` in one :class:`SinkBatch` and
commits the input offsets only after the write returned (at-least-once delivery). A sink that
cannot take more right now raises :class:`SinkBackpressureError`; the processor then stops
consuming, waits ``retry_after`` seconds and offers the *same* batch again (same
``token``), so a sink may use the token to make a retried write idempotent.

The anomalies table holds one row per anomaly *report* (diagnosis.md: a stream processor
stores one anomaly per row); a detector reports an anomaly when it opens and again, same id,
when it ends, so rows carry a ``version`` and the latest version of a (job, id) wins.
Versions are derived from the job's event time (the largest event time seen when the report
was made, at least one more than the job's previous version), so a processor that replays
the same input after a restart gives a report the same version again.

Two more records complete diagnosis.md's shape in the store: ``whatif`` (one row per
what-if result of a job, diagnosis.md ``whatif``) and ``diagnoses`` (one row per job and
checkpoint with the ``iterations`` summary; the latest version wins).

Mitigation advice (Greyhound §5.1; :mod:`failslow.mitigation.planner`) is an event too: one
``advice`` row per decision (``Advice.to_row()``, keyed by its
deterministic ``advice_id`` = ``anomaly/strategy/action``), and one JSON message per decision
on ``failslow.advice`` (:func:`encode_advice`), published with the anomaly reports.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from failslow import results
from failslow.diagnosis import Anomaly
from failslow.mitigation.planner import ADVICE_VERSION, Advice

#: Topic of the mitigation advice (one JSON ``mitigation_advice`` object per message).
ADVICE_TOPIC = "failslow.advice"


def whatif_table(rows: Iterable[tuple[str, int, int, dict[str, Any], int]]) -> pa.Table:
    """``(job, step, computed_ns, result, reported_ns)`` tuples as a ``whatif`` table."""
    out: list[dict[str, Any]] = []
    for job, step, computed_ns, result, reported_ns in rows:
        slowdown = result.get("slowdown") if isinstance(result, dict) else None
        out.append({"job": job, "step": step, "computed_ns": computed_ns,
                    "slowdown": slowdown if isinstance(slowdown, int | float) else None,
                    "result": result, "reported_ns": reported_ns})
    return results.to_table("whatif", out)


def diagnoses_table(rows: Iterable[tuple[str, int, dict[str, Any] | None, int, int]]
                    ) -> pa.Table:
    """``(job, version, iterations summary, anomaly count, updated_ns)`` tuples as a
    ``diagnoses`` table."""
    return results.to_table("diagnoses", [
        {"job": job, "version": version, "iterations": summary or {}, "anomalies": count,
         "updated_ns": updated} for job, version, summary, count, updated in rows])


@dataclass(frozen=True)
class AnomalyReport:
    """One anomaly as reported for one job at one version."""

    job: str
    anomaly: Anomaly
    version: int
    reported_ns: int


def anomalies_table(reports: Iterable[AnomalyReport]) -> pa.Table:
    """Reports as an ``anomalies`` table: the anomaly's fields in the columns of the same
    name, with the report's job, version and wall time."""
    return results.to_table("anomalies", [
        {**results.record_row("anomalies", r.anomaly), "job": r.job, "version": r.version,
         "reported_ns": r.reported_ns} for r in reports])


def anomalies_from_table(table: pa.Table) -> list[tuple[str, Anomaly]]:
    """Inverse of :func:`anomalies_table`: ``(job, anomaly)`` per row, in row order."""
    return [(row["job"], results.to_record("anomalies", Anomaly, row))
            for row in results.from_table("anomalies", table)]


def encode_advice(advice: Advice) -> tuple[bytes, dict[str, str]]:
    """One advice as a JSON message value (``Advice.to_dict()``) and its headers (the same
    header names as the anomaly reports: schema version, kind ``advice``, content type)."""
    headers = {"failslow-schema-version": str(ADVICE_VERSION), "failslow-kind": "advice",
               "content-type": "application/json"}
    return advice.to_json().encode(), headers


def decode_advice(value: bytes) -> Advice:
    """Inverse of :func:`encode_advice`."""
    body = json.loads(value)
    if not isinstance(body, dict) or body.get("kind") != "mitigation_advice":
        raise ValueError("not a mitigation_advice message")
    return Advice.from_dict(body)


def advice_from_table(table: pa.Table) -> list[Advice]:
    """Rows of an ``advice`` table as objects."""
    return [Advice.from_dict(row) for row in table.to_pylist()]


@dataclass
class SinkBatch:
    """What one checkpoint writes: tables by destination name (an event kind, ``rounds``,
    ``iterations``, ``anomalies``, ``advice``, ``whatif`` or ``diagnoses``), each with that
    destination's schema, and a token that is the same when the same batch is offered
    again: the same input (consumer group, partition, offset ranges) gives the same token,
    also in a processor restarted after a crash, so a sink can drop a batch it already
    stored."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    token: str = ""

    @property
    def rows(self) -> int:
        return sum(t.num_rows for t in self.tables.values())


class SinkBackpressureError(Exception):
    """Raised by :meth:`Sink.write` when the destination cannot take the batch now; the
    processor pauses consumption for ``retry_after`` seconds and offers the same batch again."""

    def __init__(self, retry_after: float, reason: str = "") -> None:
        self.retry_after = float(retry_after)
        super().__init__(reason or f"sink is busy; retry after {retry_after:g} s")


class Sink(ABC):
    """Destination of the processor's records."""

    @abstractmethod
    def write(self, batch: SinkBatch) -> None:
        """Store every table of ``batch``; raise :class:`SinkBackpressureError` to be retried.
        Returning means the rows are durable enough for the input offsets to be committed."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class MemorySink(Sink):
    """Keeps every written table in memory (for tests and examples)."""

    def __init__(self) -> None:
        self.batches: list[SinkBatch] = []

    def write(self, batch: SinkBatch) -> None:
        self.batches.append(batch)

    def table(self, name: str) -> pa.Table | None:
        """All rows written to ``name``, or None when nothing was."""
        parts = [b.tables[name] for b in self.batches if name in b.tables]
        return pa.concat_tables(parts) if parts else None

    def anomalies(self) -> dict[tuple[str, str], Anomaly]:
        """The latest reported version of each (job, id)."""
        table = self.table("anomalies")
        if table is None:
            return {}
        versions = table.column("version").to_pylist()
        latest: dict[tuple[str, str], tuple[int, Anomaly]] = {}
        for v, (job, a) in zip(versions, anomalies_from_table(table), strict=True):
            key = (job, a.id)
            if key not in latest or v >= latest[key][0]:
                latest[key] = (v, a)
        return {k: a for k, (_, a) in latest.items()}

    def advice(self) -> list[Advice]:
        """Every advice row written, once per ``(job, advice_id)`` (first write wins)."""
        table = self.table("advice")
        if table is None:
            return []
        seen: set[tuple[str, str]] = set()
        out: list[Advice] = []
        for a in advice_from_table(table):
            if (a.job, a.advice_id) not in seen:
                seen.add((a.job, a.advice_id))
                out.append(a)
        return out


def select_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` restricted to ``schema``'s columns, cast to its types (extra columns that a
    producer may add are not stored)."""
    if table.schema.equals(schema):
        return table
    arrays = []
    names = set(table.column_names)
    for f in schema:
        if f.name in names:
            col = table.column(f.name)
            arrays.append(col if col.type == f.type else col.cast(f.type))
        else:
            arrays.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def concat(tables: Mapping[str, list[pa.Table]]) -> dict[str, pa.Table]:
    """Concatenate per destination, dropping destinations without rows."""
    out: dict[str, pa.Table] = {}
    for name, parts in tables.items():
        parts = [p for p in parts if p.num_rows]
        if parts:
            out[name] = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    return out
