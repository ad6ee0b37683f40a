"""End to end: the 8-rank tp2 pp2 dp2 gloo job (examples/hybrid_job.py), instrumented by the
PyTorch collector and drained by the node agent, diagnosed by ``failslow analyze``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("torch", reason="the example extra (torch) is not installed")

ROOT = Path(__file__).resolve().parents[1]
#: Slowdowns below this are CPU scheduling noise: 8 ranks share 2 cores with other work. The
#: injected straggler (80 ms per forward) slows iterations 4-6x; noise measured under outside
#: load reached 1.9x.
NOISE = 2.5


def _job(out: Path, *args: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "examples.hybrid_job", "--out", str(out), *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


def _analyze(out: Path) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "failslow.cli", "analyze", str(out), "--json"],
                       capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    return list(json.loads(r.stdout)["anomalies"])


def test_compute_straggler_named(tmp_path: Path) -> None:
    s = _job(tmp_path, "--iters", "40", "--straggler", "5:80:20")
    assert not s["hung"] and s["records"] > 8000
    found = _analyze(tmp_path)
    assert found, "no anomaly"
    # 8 processes share 2 cores here: scheduling noise may show as small slowdowns; the
    # injected straggler is the strong, ongoing one starting at iteration 20
    top = max(found, key=lambda a: a["slowdown"] or 0)
    assert (top["kind"], top["cause"]) == ("slow", "compute")
    # rank 5 named; under heavy outside load a second, noisy rank is occasionally added
    assert 5 in top["ranks"] and len(top["ranks"]) <= 2, top["ranks"]
    assert top["end_ns"] is None and top["slowdown"] > NOISE and 17 <= top["onset_iteration"] <= 21
    assert all(a["slowdown"] < NOISE for a in found if a is not top)


def test_healthy_job_is_quiet(tmp_path: Path) -> None:
    s = _job(tmp_path, "--iters", "30")
    assert not s["hung"]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert (meta["tp"], meta["pp"], meta["dp"], meta["world_size"]) == (2, 2, 2, 8)
    comms = meta["comms"] if isinstance(meta["comms"], list) else json.loads(meta["comms"])
    assert sorted(c["kind"] for c in comms).count("tp") == 4 and len(comms) == 13
    found = _analyze(tmp_path)  # at most scheduling noise (2 shared cores, 8 processes)
    assert all(a["kind"] == "slow" and a["slowdown"] < NOISE for a in found), found


def test_hang_sigstop_named(tmp_path: Path) -> None:
    s = _job(tmp_path, "--iters", "30", "--hang", "6:12", "--stall-s", "3")
    assert s["hung"]
    assert json.loads((tmp_path / "import.json").read_text())["post_mortem"] is True
    found = _analyze(tmp_path)
    hangs = [a for a in found if a["kind"] == "hang"]
    assert hangs and (hangs[0]["cause"], hangs[0]["ranks"]) == ("not_entered", [6])


def _netns_permitted() -> bool:
    name = f"fsprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    return r.returncode == 0


@pytest.fixture(scope="module")
def slow_link_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("ip") or not _netns_permitted():
        pytest.skip("network namespaces not permitted here (needs root and iproute2)")
    out = tmp_path_factory.mktemp("slowlink")
    # ranks 1 (DP replica 0) and 5 (replica 1) on their own veth pair, 20 Mbit/s from iter 20
    s = _job(out, "--iters", "40", "--slow-link", "1:5:20:20")
    assert not s["hung"]
    return out


@pytest.mark.xfail(strict=False, reason="tc tbf shaping of the veth pair did not take effect "
                   "in every run on this loaded 2-core machine (seen once: 3.7 ms vs > 40 ms)")
def test_slow_link_visible_in_trace(slow_link_trace: Path) -> None:
    from failslow.tracedir import TraceDir

    td = TraceDir(slow_link_trace)
    kinds = {c.comm: c.kind for c in td.meta().comms}
    c = td.read("coll").to_pandas()
    c = c[c.comm.map(kinds) == "dp"]
    t = c.pivot_table(index=["rank", "seq"], columns="phase", values="t").reset_index()
    t["ms"] = (t["end"] - t["enter"]) / 1e6
    late = t[t.seq >= 25].groupby("rank").ms.median()
    early = t[t.seq < 18].groupby("rank").ms.median()
    assert late[1] > 40 and late[5] > 40 and late[1] > 4 * early[1]
    assert late[0] < 30 and late[4] < 30  # the other DP pairs cross the healthy veth pair


def test_slow_link_named(slow_link_trace: Path) -> None:
    found = _analyze(slow_link_trace)
    assert found and found[0]["cause"] == "communication"
    assert sorted(found[0]["link"] or found[0]["ranks"]) == [1, 5]


def test_s2_microbatch_rebalance_recovers(tmp_path: Path) -> None:
    """Greyhound S2 in a real loop: rank 5 (DP replica 1) turns slow at iteration 8; once the
    job reaches iteration 16 an S2 advice (the exact min-max allocation) moves micro-batches
    to replica 0, and the iteration time recovers."""
    import time

    from failslow.detectors.microbatches import allocate_microbatches

    out, advice = tmp_path / "trace", tmp_path / "advice.json"
    progress = tmp_path / "trace.progress"
    proc = subprocess.Popen([sys.executable, "-m", "examples.hybrid_job", "--out", str(out),
                             "--iters", "32", "--straggler", "5:30:8", "--advice", str(advice)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.exists() and progress.read_text() and int(progress.read_text()) >= 16:
            break
        time.sleep(0.05)
    # per-micro-batch time of each replica: ~healthy vs healthy + the 30 ms sleep
    alloc = allocate_microbatches([0.02, 0.05], total=8)
    assert alloc.m == [6, 2] or alloc.m == [5, 3]
    tmp = advice.with_suffix(".tmp")
    tmp.write_text(json.dumps({"kind": "mitigation_advice", "strategy": "S2", "action": "apply",
                               "job": "example", "advice_id": "a/S2/apply",
                               "plan": {"m": alloc.m}}))
    tmp.rename(advice)
    stdout, stderr = proc.communicate(timeout=150)
    assert proc.returncode == 0, stderr[-3000:]
    times = json.loads((out / "iteration_times.json").read_text())
    it = [max(times[str(r)][i] for r in range(8)) for i in range(32)]
    before = sorted(it[2:8])[3]
    slow = sorted(it[10:16])[3]
    after = sorted(it[24:32])[4]
    assert slow > 1.5 * before, (before, slow, after)
    assert after < 0.8 * slow, (before, slow, after)
