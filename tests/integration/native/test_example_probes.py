"""The example job (examples/hybrid_job.py, 8 gloo ranks) with the node agent running
validation probes beside it (issue 17, ``--probes``): every request answered by one
``probe`` row in the trace, none failed, and the healthy job stays quiet. The iteration time
with probing on vs off is measured by ``python -m examples.probing``, not asserted here (2
shared cores: the run-to-run noise is larger than the 1% floor)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import REPO

if not os.environ.get("CI"):
    pytest.importorskip("torch", reason="the example extra (torch) is not installed")

#: scheduling noise on 2 shared cores (tests/integration/native/test_example_job.py)
NOISE = 2.5


def test_example_job_with_probes(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "examples.hybrid_job", "--out", str(tmp_path),
                        "--iters", "40", "--probes", "0.5"],
                       cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert not summary["hung"] and summary["failed"] == []
    counts = summary["probes"]
    rows = pq.read_table(tmp_path / "probe.parquet").to_pylist()
    # one row per request, numbered in the order asked; gemm and p2p in turn
    assert len(rows) == sum(counts.values()) >= 2
    assert sorted(int(x["request"].split("/")[0].split("-")[1]) for x in rows) == \
        list(range(len(rows)))
    assert {x["probe"] for x in rows} == {"gemm", "p2p"}
    # nothing broke: a probe ran, was refused (rate limit, rank inside a collective until
    # the deadline) or ran out of its deadline after waiting (2 shared cores), saying why
    assert counts["failed"] == 0
    assert all(x["status"] == "ok" or x["detail"] for x in rows)
    assert all(x["elapsed_ns"] > 0 for x in rows if x["status"] == "ok")
    a = subprocess.run([sys.executable, "-m", "failslow", "analyze", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=180, check=False)
    assert a.returncode in (0, 1), a.stderr[-3000:]
    found = json.loads(a.stdout)["anomalies"]
    assert all(x["kind"] == "slow" and x["slowdown"] < NOISE for x in found), found
