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

from conftest import REPO

if not os.environ.get("CI"):
    pytest.importorskip("torch", reason="the example extra (torch) is not installed")

ROOT = REPO
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
    r = subprocess.run([sys.executable, "-m", "failslow", "analyze", str(out), "--json"],
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
    # ranks 1 (DP replica 0) and 5 (replica 1) on their own veth pair, 5 Mbit/s from iter 20:
    # the 1-5 DP all-reduce then takes about 0.4 s, iterations 8x the healthy ~50 ms (the
    # scheduling noise of 8 ranks on 2 shared cores reaches 2-4x for a few iterations)
    s = _job(out, "--iters", "40", "--slow-link", "1:5:5:20")
    assert not s["hung"]
    return out


def test_slow_link_visible_in_trace(slow_link_trace: Path) -> None:
    """The tbf-shaped veth pair is real: the 1-5 DP all-reduce (256 KiB each way at 5 Mbit/s,
    about 0.4 s) is slow from iteration 20 exactly (ranks 1 and 5 shape their ends at its
    start), the other DP pairs cross the healthy pair and stay fast."""
    from failslow.tracedir import TraceDir

    td = TraceDir(slow_link_trace)
    meta = td.meta()
    # the two network namespaces are the job's nodes: DP replica 0 and replica 1
    assert [meta.nodes[r] for r in range(8)] == [meta.nodes[0]] * 4 + [meta.nodes[4]] * 4
    assert meta.nodes[0] != meta.nodes[4]
    kinds = {c.comm: c.kind for c in meta.comms}
    c = td.read("coll").to_pandas()
    c = c[c.comm.map(kinds) == "dp"]
    t = c.pivot_table(index=["rank", "seq"], columns="phase", values="t").reset_index()
    t["ms"] = (t["end"] - t["enter"]) / 1e6
    assert sorted(set(t.seq)) == list(range(40))  # one DP all-reduce per iteration
    late = t[t.seq >= 20].groupby("rank").ms.median()
    early = t[t.seq < 20].groupby("rank").ms.median()
    assert late[1] > 300 and late[5] > 300 and late[1] > 10 * early[1], (late, early)
    assert t[(t["rank"] == 1) & (t.seq >= 20)].ms.min() > 200  # every shaped all-reduce
    # the other DP pairs cross the healthy veth pair
    assert all(late[r] < 30 for r in (0, 2, 3, 4, 6, 7)), late


def test_slow_link_named(slow_link_trace: Path) -> None:
    found = _analyze(slow_link_trace)
    assert found, "no anomaly"
    # 8 processes share 2 cores: scheduling noise may show as small slowdowns; the slow link
    # is the strong, ongoing one from iteration 20
    top = max(found, key=lambda a: a["slowdown"] or 0)
    assert (top["kind"], top["cause"], top["comm_kind"]) == ("slow", "communication", "dp"), top
    assert sorted(top["link"] or top["ranks"]) == [1, 5]
    # the 2-4x scheduling noise just before the onset can pull the change point up to two
    # iterations early
    assert top["end_ns"] is None and 18 <= top["onset_iteration"] <= 21, top
    assert top["slowdown"] > 2 * NOISE, top
    # nothing else: the ranks that wait on 1 and 5 (their TP and PP peers) are not named.
    # Scheduling noise under load (8 ranks on 2 shared cores beside the test suite) can slow
    # the 1-5 rounds 3x a few iterations before the fault and open a level of its own there,
    # on the same link (CI, 2026-11-29: onset 16, 3.1x, then the fault's level at 20, 9.3x)
    others = [a for a in found if a is not top and (a["slowdown"] or 0) > NOISE
              and sorted(a["link"] or a["ranks"]) != [1, 5]]
    assert not others, others


def test_s2_microbatch_rebalance_recovers(tmp_path: Path) -> None:
    """Greyhound S2 in a real loop: rank 5 (DP replica 1) turns slow at iteration 8; once the
    job reaches iteration 16 an S2 advice (the exact min-max allocation) moves micro-batches
    to replica 0, and the iteration time recovers."""
    import time

    from failslow.mitigation.microbatches import allocate_microbatches

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


#: Recorded slow-link traces of this job (20 Mbit/s on the 1-5 pair from iteration 20, on this
#: loaded machine), kept where the diagnosis went wrong: ``tests/data/slow_link/<name>``.
SLOW_LINK_TRACES = {
    # healthy iterations 45-260 ms (scheduling noise in the first 8 and at 14-17), then
    # ~150 ms from iteration 20: once missed (at times found only after a noise anomaly);
    # named since a few fast iterations no longer reset the baseline (change tracker)
    "noisy_warmup": "",
    # made with a ~270 ms pause of every rank before iteration 20 (the driver's tc, since
    # replaced): the pp 0-2 transfers (1 ms -> 2-15 ms, noise) were once named over dp 1-5
    # (48x); windows without a round of the slow group now count as no evidence
    "wrong_link_after_pause": "",
    # a noise step (146 -> 167-198 ms) inside the slow link once opened a second anomaly,
    # tp 0-1 with P 0.96, whose slowdown (3.5) was against the healthy 48 ms (now right)
    "nested_noise_level": "",
}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=r) if r else ())
    for n, r in SLOW_LINK_TRACES.items()])
def test_recorded_slow_link_named(name: str) -> None:
    found = _analyze(ROOT / "tests" / "data" / "slow_link" / name)
    assert found, "no anomaly"
    top = max(found, key=lambda a: a["slowdown"] or 0)
    assert (top["cause"], top["comm_kind"], sorted(top["link"] or [])) == \
        ("communication", "dp", [1, 5]), top
    assert 19 <= top["onset_iteration"] <= 21, top
    others = [a for a in found if a is not top and (a["slowdown"] or 0) > NOISE]
    assert not others, others


#: Example jobs with ``--straggler 5:80:20`` recorded beside two busy loops of outside load
#: (CI's conditions); each was once reported ``mixed`` with a link no fault slowed (5-7, the
#: last one 1-5).
STRAGGLER_TRACES = (
    # rank 5's receives of rank 7's gradients found their data already there (gloo sent it
    # eagerly while 5 slept): 7 -> 5 took 2.4-3.4x its reference bin after bin, the time of a
    # loaded host, while 5 -> 7 stayed as it was
    "late_receives_under_load",
    # a few single late transfers (up to 26 ms among 0.2 ms ones) made the mean of 5 -> 7
    # 7x its reference in a few windows; its median per bin did not move
    "one_late_transfer",
    # 7 -> 5 took 4-18x its reference bin after bin, 5 -> 7 2-3x and rank 5's TP
    # all-reduce up to 2.3x: rank 5's loaded host, not a link, was slow
    "both_ways_under_load",
    # the DP all-reduce of ranks 1 and 5, timed from rank 5's late entry on its loaded
    # host, took 4.6-18x its reference: once reported mixed with link 1-5
    "dp_pair_under_load",
)


@pytest.mark.parametrize("name", STRAGGLER_TRACES)
def test_recorded_straggler_is_compute(name: str) -> None:
    """A compute straggler's own link is named (``mixed``) only when it joins two nodes and
    is slow bin after bin and in both directions: not from late receives, a few late
    transfers, or transfers inside a loaded host (every rank of these jobs is on one)."""
    found = _analyze(ROOT / "tests" / "data" / "straggler" / name)
    top = max(found, key=lambda a: a["slowdown"] or 0)
    assert (top["cause"], top["ranks"], top["link"]) == ("compute", [5], None), top
    assert top["slowdown"] > NOISE and 19 <= top["onset_iteration"] <= 21, top
    assert all(a["cause"] != "mixed" for a in found), found


@pytest.mark.parametrize("name", ["late_receives_under_load", "one_late_transfer"])
def test_recorded_straggler_on_two_nodes_is_compute(name: str, tmp_path: Path) -> None:
    """The same traces with each pipeline stage on a node of its own (ranks 0, 1, 4, 5 and
    2, 3, 6, 7), so that the pair 5-7 joins two nodes: late receives whose data was there
    and a few late transfers are still no slow link."""
    src = ROOT / "tests" / "data" / "straggler" / name
    shutil.copytree(src, tmp_path / name)
    meta_path = tmp_path / name / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["nodes"] = json.dumps({str(r): f"node{(r // 2) % 2}" for r in range(8)})
    meta_path.write_text(json.dumps(meta))
    found = _analyze(tmp_path / name)
    top = max(found, key=lambda a: a["slowdown"] or 0)
    assert (top["cause"], top["ranks"], top["link"]) == ("compute", [5], None), top
    assert all(a["cause"] != "mixed" for a in found), found
