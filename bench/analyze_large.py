"""``failslow bench analyze-large``: offline analysis of the 4096-rank ``large`` preset
(tp8 pp8 dp64, about 29 s of trace): wall and CPU seconds and peak memory of ``failslow
analyze DIR --json`` in a child process, beside the same run's baseline, a child process
that only reads every record of the trace (issue 13's floors: faster than 2x real time,
under 2 GB).

Keys: ``trace_seconds`` (the trace's event-time span), ``seconds`` (analyze wall time),
``cpu_seconds``, ``peak_rss_mb``, ``realtime_factor`` (trace seconds per analyze second),
``read_seconds`` / ``read_peak_rss_mb`` (the baseline), ``rows``, ``ranks``, ``found`` (the
diagnosis names the injected straggler).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_READ = """
import sys
import pyarrow.compute as pc
from failslow.tracedir import DATA_KINDS, TraceDir
td = TraceDir(sys.argv[1])
rows, lo, hi = 0, None, None
for kind in (k for k in DATA_KINDS if k in td.kinds):
    for batch in td.iter_batches(kind):
        rows += batch.num_rows
        if kind == "coll" and batch.num_rows:
            mm = pc.min_max(batch.column("t")).as_py()
            lo = mm["min"] if lo is None else min(lo, mm["min"])
            hi = mm["max"] if hi is None else max(hi, mm["max"])
print(rows, (hi - lo) / 1e9 if lo is not None else 0.0)
"""


def _child(argv: list[str]) -> tuple[str, float, float, float]:
    """stdout, wall seconds, CPU seconds and peak RSS (MB) of one child process (its own
    resource usage, from ``wait4``)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:4])} ... exited {proc.returncode}")
        out.seek(0)
        text = out.read().decode()
    return text, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def bench_analyze_large(args: argparse.Namespace) -> dict[str, Any]:
    """The figures of the module docstring; ``--data DIR`` analyses that trace directory
    instead of a fresh ``large`` simulation."""
    with tempfile.TemporaryDirectory(prefix="failslow-large-") as tmp:
        simulate_s = 0.0
        if getattr(args, "data", None):
            trace = Path(args.data)
        else:
            trace = Path(tmp) / "trace"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "failslow", "simulate", "--preset", "large",
                            "--out", str(trace)], capture_output=True, check=True)
            simulate_s = time.perf_counter() - t0
        meta = json.loads((trace / "meta.json").read_text())
        truth_file = trace / "truth.json"
        truth = json.loads(truth_file.read_text()) if truth_file.exists() else None
        rows_out, read_s, read_cpu, read_rss = _child([sys.executable, "-c", _READ, str(trace)])
        out, wall, cpu, rss = _child([sys.executable, "-m", "failslow", "analyze", str(trace),
                                      "--json"])
    diag = json.loads(out)
    rows, span = rows_out.split()
    got = {r for a in diag["anomalies"] for r in a["ranks"]}
    want = None if truth is None else {r for a in truth["anomalies"] for r in a["ranks"]}
    one = meta[0] if isinstance(meta, list) else meta
    return {
        "trace": str(getattr(args, "data", None) or "large preset"),
        "ranks": one.get("world_size"), "rows": int(rows),
        "trace_seconds": round(float(span), 3), "seconds": round(wall, 3),
        "cpu_seconds": round(cpu, 3), "peak_rss_mb": round(rss, 1),
        "realtime_factor": round(float(span) / max(wall, 1e-9), 3),
        "read_seconds": round(read_s, 3), "read_cpu_seconds": round(read_cpu, 3),
        "read_peak_rss_mb": round(read_rss, 1), "simulate_seconds": round(simulate_s, 1),
        "found": None if want is None else bool(want) and want <= got,
        "floors": {"under_15_s": wall < 15.0, "under_2_gb": rss < 2048},
    }


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "analyze-large": bench_analyze_large,
}
