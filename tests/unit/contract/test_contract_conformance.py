"""`failslow analyze` on traces from an independent generator that follows events.md."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from support.contract_gen import generate, write

from failslow import cli, diagnosis
from failslow.diagnosis import Anomaly
from failslow.stream.sink import AnomalyReport, anomalies_from_table, anomalies_table

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
    # stored one per row (the output contract's anomalies table), read back unchanged
    stored = anomalies_table([AnomalyReport(doc["job"], Anomaly.from_dict(a), 1, 0)
                              for a in doc["anomalies"]])
    assert [a.to_dict() for _, a in anomalies_from_table(stored)] == doc["anomalies"]


# variations the detectors were not designed on: jitter shapes, clock skew between hosts,
# garbage-collection pauses, no t_start, no meta.comms
ROBUSTNESS = {
    "pareto-skew": ({"jitter": "pareto", "skew_ms": 3.0}, {}),
    "bimodal-pauses": ({"jitter": "bimodal", "pauses": 0.05}, {}),
    "pauses-no-tstart-no-comms": ({"pauses": 0.05, "skew_ms": 2.0},
                                  {"empty_comms": True, "drop_t_start": True}),
}


@pytest.mark.parametrize("variant", sorted(ROBUSTNESS))
def test_robust_to_variations(tmp_path: Path, variant: str) -> None:
    gen, wr = ROBUSTNESS[variant]
    healthy = run_analyze(write(tmp_path / "h", *generate(iterations=40, seed=1, **gen),
                                **wr))
    assert healthy["anomalies"] == []
    slow = run_analyze(write(tmp_path / "c", *generate(iterations=40, slow_rank=3,
                                                       slow_from=20, slow_factor=1.3,
                                                       seed=2, **gen), **wr))
    (a,) = slow["anomalies"]
    assert a["kind"] == "slow" and a["cause"] == "compute" and a["ranks"] == [3]
    link = run_analyze(write(tmp_path / "l", *generate(iterations=40, slow_link=1,
                                                       slow_from=20, link_factor=4, seed=3,
                                                       **gen), **wr))
    (b,) = link["anomalies"]
    assert b["cause"] == "communication" and b["link"] == [1, 3] and b["stage"] == "pp_p2p"
    assert b["P"] is not None and b["P"] < 0.4  # CCL-D: communication
