"""A finished simulation (:class:`SimResult`) and its trace directory (:func:`write_sim`).

The tables come from :mod:`.trace_tables` (:class:`TraceBuilder`), the ground truth from
:mod:`.ground_truth` (:func:`build_truth`); their public names are re-exported here.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from failslow import events
from failslow.diagnosis import Diagnosis
from failslow.events import JobMeta
from failslow.simulator.ground_truth import (
    STAGE_OF_KIND,
    build_truth,
    iteration_durations,
    job_meta,
    median_iteration_ns,
    period_ops,
)
from failslow.simulator.scenario import Scenario
from failslow.simulator.trace_tables import (
    CHUNK_ROWS,
    GPU_MEM_MHZ,
    GPU_SM_MHZ,
    STALL_POST_CAP,
    STALL_POST_RATE,
    THROTTLE_HW,
    WR_WINDOW,
    TraceBuilder,
)

__all__ = ["CHUNK_ROWS", "GPU_MEM_MHZ", "GPU_SM_MHZ", "STAGE_OF_KIND", "STALL_POST_CAP",
           "STALL_POST_RATE", "THROTTLE_HW", "WR_WINDOW", "SimResult", "TraceBuilder",
           "build_truth", "iteration_durations", "job_meta", "median_iteration_ns",
           "period_ops", "write_sim"]

log = logging.getLogger(__name__)


@dataclass
class SimResult:
    """A finished simulation: ``meta``, ``truth``, tables (built on demand) and figures."""

    scenario: Scenario
    seed: int
    meta: JobMeta
    truth: Diagnosis
    stats: dict[str, Any]
    builder: TraceBuilder
    _tables: dict[str, pa.Table] | None = field(default=None, repr=False)

    def iter_tables(self, kind: str) -> Iterator[pa.Table]:
        """The rows of ``kind`` in chunks with the contract schema."""
        return self.builder.iter_tables(kind)

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.builder.kinds()

    @property
    def tables(self) -> dict[str, pa.Table]:
        """Every kind as one table (builds all rows in memory: for small jobs and tests)."""
        if self._tables is None:
            out = {}
            for kind in self.kinds:
                parts = list(self.iter_tables(kind))
                out[kind] = pa.concat_tables(parts) if parts else events.empty(kind)
            self._tables = out
        return self._tables


# ---------------------------------------------------------------------------------------------
# writing


def write_sim(result: SimResult, out_dir: str | Path, fmt: str = "parquet") -> Path:
    """Write a trace directory: meta.json, one file per kind, truth.json, scenario.yaml."""
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"unknown trace format {fmt!r} (parquet or jsonl)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps(result.meta.to_row(), indent=1))
    for kind in ("coll", "progress", "link", "gpu", "span"):
        for stale in (out / f"{kind}.parquet", out / f"{kind}.jsonl"):
            stale.unlink(missing_ok=True)
    counts: dict[str, int] = {}
    for kind in result.kinds:
        path = out / f"{kind}.{fmt}"
        tables = result.iter_tables(kind)
        first = next(tables, None)
        if first is None:
            counts[kind] = 0
            if kind == "coll":           # required even when empty
                if fmt == "parquet":
                    pq.write_table(events.empty(kind), path, compression="zstd")
                else:
                    path.write_text("")
            continue
        chained = itertools.chain([first], tables)
        counts[kind] = (_write_parquet(chained, path, kind) if fmt == "parquet"
                        else _write_jsonl(chained, path))
    result.stats["rows_by_kind"] = counts
    result.stats["rows"] = sum(counts.values())
    (out / "truth.json").write_text(result.truth.to_json() + "\n")
    scen = result.scenario.to_dict()
    scen["seed"] = result.seed
    (out / "scenario.yaml").write_text(yaml.safe_dump(scen, sort_keys=False))
    return out


def _write_parquet(tables: Iterator[pa.Table], path: Path, kind: str) -> int:
    n = 0
    with pq.ParquetWriter(path, events.SCHEMAS[kind], compression="zstd") as writer:
        for table in tables:
            writer.write_table(table)
            n += table.num_rows
    return n


def _write_jsonl(tables: Iterator[pa.Table], path: Path) -> int:
    """One JSON object per line; null columns are left out (events.md allows both)."""
    n = 0
    with path.open("w") as fh:
        for table in tables:
            for batch in table.to_batches(max_chunksize=65536):
                for row in batch.to_pylist():
                    fh.write(json.dumps({k: v for k, v in row.items() if v is not None}))
                    fh.write("\n")
            n += table.num_rows
    return n
