"""The agent over rings written by the native LD_PRELOAD NCCL interposer (stub libnccl)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from failslow.collectors.agent import Agent, TraceDirSink
from failslow.collectors.native_build import NativeBuildError, build_native_cached, driver_env
from failslow.tracedir import TraceDir

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None,
                                reason="gcc (C compiler) not installed: native collectors "
                                       "cannot be built")


def test_agent_drains_interposer_rings(tmp_path_factory: pytest.TempPathFactory,
                                       tmp_path: Path) -> None:
    try:
        build = build_native_cached(tmp_path_factory.getbasetemp() / "native")
    except NativeBuildError as e:
        pytest.fail(str(e))
    rings = tmp_path / "rings"
    rings.mkdir()
    for rank in (0, 1):  # two "processes" of one job, both finished: rings drained, removed
        env = driver_env(build, rings, preload="libfailslow_nccl.so", job="nj", RANK=str(rank),
                         WORLD_SIZE="2")
        r = subprocess.run([str(build / "drv_nccl"), "basic", "5", str(rank)], env=env,
                           capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 0, r.stderr
    assert len(list(rings.iterdir())) == 2
    agent = Agent(TraceDirSink(tmp_path / "out"), rings, node="nodeA",
                  collectors={"gpu": False, "rdma": False})
    agent.poll()
    agent.close()
    assert not list(rings.iterdir())
    td = TraceDir(tmp_path / "out")
    meta = td.meta()
    assert meta.job == "nj" and meta.world_size == 2 and meta.nodes == {0: "nodeA", 1: "nodeA"}
    # the parent communicator and its split, each with both members in rank order
    assert len(meta.comms) == 2 and all(c.ranks == (0, 1) for c in meta.comms)
    coll = td.read("coll").to_pandas()
    parent = coll[coll.comm == meta.comms[0].comm]
    assert set(parent["rank"]) | set(coll["rank"]) == {0, 1}
    enter = coll[coll.phase == "enter"]
    per = {r: sorted(zip(g.comm, g.seq, g.op, strict=True)) for r, g in enter.groupby("rank")}
    assert per[0] == per[1] and len(per[0]) >= 10  # the same rounds (CCL-D Trace IDs)
    assert (coll.phase == "end").sum() == (coll.phase == "enter").sum()


def test_agent_cpu_benchmark_drains_paced_ranks(tmp_path_factory: pytest.TempPathFactory,
                                                tmp_path: Path) -> None:
    """``failslow bench collector``'s agent figure, small: 2 ranks x 2,000 intercepted calls/s
    through the real interposer; the agent process keeps up (two records per call, nothing
    dropped) and reports its own CPU seconds per wall second."""
    from failslow.bench.collector import measure_agent_cpu

    try:
        build = build_native_cached(tmp_path_factory.getbasetemp() / "native")
    except NativeBuildError as e:
        pytest.fail(str(e))
    got = measure_agent_cpu(build, tmp_path / "rings", ranks=2, rate=2000, seconds=1.5)
    assert got["agent_expected_records_per_s"] == 8000
    # the window also drains what the ranks wrote before the agent started
    assert 0.8 * 8000 <= got["agent_records_per_s"] <= 2.0 * 8000, got
    assert got["agent_drops"] == 0
    assert 1.4 <= got["agent_wall_s"] <= 5.0 and 0 < got["agent_cpu_percent"] < 100, got
