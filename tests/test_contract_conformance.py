"""`failslow analyze` on traces from an independent generator that follows events.md."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from contract_gen import generate, write

from failslow import cli, diagnosis

VARIANTS: dict[str, dict[str, Any]] = {
    "plain-jsonl": {},
    "parquet": {"fmt": "parquet"},
    "shuffled": {"shuffle": True},
    "shuffled-parquet": {"fmt": "parquet", "shuffle": True},
    "no-comms": {"empty_comms": True},
    "text-fields-meta-list": {"text_fields": True, "meta_list": True},
    "extra-column-no-nullables": {"extra_column": True, "drop_nullables": True},
}


def run_analyze(trace: Path) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["analyze", str(trace), "--json"])
    assert code == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    diagnosis.validate(doc)
    return doc


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_valid_trace_is_accepted(tmp_path: Path, variant: str) -> None:
    meta, rows = generate(iterations=30)
    doc = run_analyze(write(tmp_path, meta, rows, **VARIANTS[variant]))
    assert doc["job"] == "indep-1"
    assert doc["anomalies"] == [], "a healthy job has no anomaly"


def test_compute_straggler_in_independent_trace_is_found(tmp_path: Path) -> None:
    meta, rows = generate(iterations=40, slow_rank=3, slow_from=20)
    doc = run_analyze(write(tmp_path, meta, rows, shuffle=True))
    slow = [a for a in doc["anomalies"] if a["kind"] == "slow"]
    assert slow, "the straggler was not detected"
    assert slow[0]["ranks"] == [3]
    assert slow[0]["cause"] == "compute"
