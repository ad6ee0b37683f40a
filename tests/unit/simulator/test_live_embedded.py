"""``failslow simulate --live --embedded``: the live job without Kafka, through a processor
in the same process into embedded ClickHouse (chDB); and its bad input."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from failslow.stream import clickhouse as ch


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "failslow", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_embedded_live_run_reports_its_fault_and_stores_current_rows(tmp_path: Path) -> None:
    started = time.time_ns()
    out = _cli("simulate", "--live", "--embedded", "--data-dir", str(tmp_path), "--job",
               "emb-job", "--duration", "15", "--first-fault", "2", "--fault-every", "60",
               "--fault-for", "30", "--causes", "compute", "--seed", "2", timeout=180)
    ended = time.time_ns()
    assert out.returncode == 0, out.stderr[-3000:]
    injected = re.search(r"fault 0 injected in emb-job: compute slow-down of rank (\d+)",
                         out.stdout)
    assert injected, out.stdout
    rank = injected.group(1)
    assert re.search(rf"detected in emb-job: \S+ slow/compute ranks \[{rank}\]", out.stdout), \
        out.stdout
    sink = ch.ClickHouseSink(ch.connect(tmp_path))
    try:
        n, lo, hi = sink.client.query(
            "SELECT count(), min(t), max(t) FROM failslow.coll WHERE job = 'emb-job'"
        ).result_rows[0]
        assert n > 0 and started <= lo <= hi <= ended
        assert sink.count("iterations", "emb-job", final=True) > 10
    finally:
        sink.close()


@pytest.mark.parametrize(("args", "says"), [
    (["--out", "x"], "--live takes no --out"),
    (["--preset", "demo"], "--live takes no --out, --preset"),
    (["--ranks", "96"], "--ranks 96: a multiple of 64"),
    (["--fault-for", "5m", "--fault-every", "1m"], "--fault-for must not be longer"),
])
def test_bad_live_options_end_with_one_line(args: list[str], says: str) -> None:
    out = _cli("simulate", "--live", "--embedded", *args)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("failslow simulate: ") and says in out.stderr
