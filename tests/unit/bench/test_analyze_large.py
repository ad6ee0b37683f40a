"""``failslow bench analyze-large`` (issue 13 item 6): its keys, measured on a small trace
(``--data``) in child processes, beside the read-only baseline of the same run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_keys_and_figures_of_a_small_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "failslow", "simulate", "--out", str(trace)],
                   check=True, capture_output=True, timeout=300)
    out = subprocess.run([sys.executable, "-m", "failslow", "bench", "analyze-large",
                          "--data", str(trace), "--json"],
                         check=True, capture_output=True, text=True, timeout=600)
    figures = json.loads(out.stdout)
    for key in ("trace_seconds", "seconds", "peak_rss_mb", "read_seconds", "read_peak_rss_mb"):
        assert figures[key] > 0, key
    assert figures["ranks"] == 64 and figures["rows"] > 100_000
    assert figures["found"] is True  # the default preset's straggler is named
    # analysing costs more than reading, and the figures say so
    assert figures["cpu_seconds"] > figures["read_cpu_seconds"]
    assert figures["trace_seconds"] > 10  # the default preset's 50 iterations of ~0.4 s
