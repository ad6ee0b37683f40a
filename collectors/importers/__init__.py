"""Trace importers: turn traces written by other tools into the failslow event contract.

Each importer reads a foreign format and produces what every failslow producer produces
(shared/spec/events.md): one ``meta`` row and tables of record kinds (``coll``, ``span``),
written as a trace directory that ``failslow.tracedir.TraceDir`` reads and every detector
accepts.

- :mod:`failslow.collectors.importers.flight_recorder`: PyTorch NCCL Flight Recorder dumps
  (one pickle per rank), the per-process-group operation log that PyTorch keeps for hang
  debugging; it gives the CCL-D "Trace ID" view (communicator, sequence number, state) of the
  operations still in flight when a job hangs.
- :mod:`failslow.collectors.importers.straggler_analysis`: the operation traces published with
  ByteDance's what-if straggler analysis (papers/whatif-stragglers.md), framework-level spans
  of a Megatron-LM job, from which communication operations are derived.

Besides the contract files, an importer writes ``import.json`` into the trace directory: where
the data came from, the choices the conversion made, and the warnings it counted. Readers of
the contract ignore it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow.events import JobMeta
from failslow.tracedir import write_trace

__all__ = ["ImportResult", "sanitize_job", "stable_id", "INFO_FILE"]

#: Provenance and conversion notes written next to the contract files.
INFO_FILE = "import.json"

_JOB_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def sanitize_job(name: str, default: str) -> str:
    """A valid job id (1-64 of ``[A-Za-z0-9._-]``) derived from ``name``, else ``default``."""
    job = _JOB_BAD.sub("-", name).strip("-")[:64].strip("-")
    return job or default


def stable_id(*parts: str) -> int:
    """A stable uint64 identifier (over the full range) of the joined ``parts``."""
    digest = hashlib.blake2b("/".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass
class ImportResult:
    """One imported job: its meta, its record tables by kind, and what the import noted."""

    meta: JobMeta
    tables: dict[str, pa.Table]
    warnings: Counter[str] = field(default_factory=Counter)
    info: dict[str, Any] = field(default_factory=dict)

    def warn(self, message: str, count: int = 1) -> None:
        """Count ``count`` occurrences of a warning (logged once per message at the end)."""
        if count > 0:
            self.warnings[message] += count

    def log_warnings(self, logger: logging.Logger) -> None:
        for message, count in sorted(self.warnings.items()):
            logger.warning("%s (%d time%s)", message, count, "" if count == 1 else "s")

    def write(self, out: str | Path, fmt: str = "parquet") -> Path:
        """Write the trace directory (``meta.json``, ``<kind>.<fmt>``) and ``import.json``."""
        path = write_trace(out, [self.meta], self.tables, fmt)
        info = dict(self.info)
        info["warnings"] = dict(sorted(self.warnings.items()))
        (path / INFO_FILE).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        return path

    def summary(self) -> str:
        counts = ", ".join(f"{t.num_rows} {kind} rows" for kind, t in self.tables.items())
        warned = sum(self.warnings.values())
        return (f"job {self.meta.job}: {self.meta.world_size} ranks, {counts}"
                + (f"; {warned} warning{'s' if warned != 1 else ''}" if warned else ""))
