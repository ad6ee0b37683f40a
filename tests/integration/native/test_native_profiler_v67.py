"""Profiler plugin API v6 and v7 (native/nccl_profiler/plugin_v67.c), driven like NCCL 2.29+.

``drv_prof67`` dlopens the plugin, takes ncclProfiler_v6 or ncclProfiler_v7 and replays
copy-engine collectives (v6: CeColl with CeSync/CeBatch children, no device events) and the
KernelPhase events of symmetric kernels (v7).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.native import build_or_skip as _build

from failslow import events
from failslow.collectors import ring
from failslow.collectors.native_build import (
    driver_env,
)

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None,
                                reason="gcc (C compiler) not installed: native collectors "
                                       "cannot be built")

PLUGIN = "libnccl-profiler-failslow.so"
COLL_API, CE_COLL, CE_SYNC, CE_BATCH, KERNEL_PHASE = 1 << 9, 1 << 12, 1 << 13, 1 << 14, 1 << 15
KERNEL_CH = 1 << 6


def _run(build: Path, version: int, scenario: str, ring_dir: Path,
         san: str = "") -> tuple[dict, np.ndarray]:
    cmd = [str(build / "drv_prof67"), str(build / PLUGIN), str(version), scenario]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                          env=driver_env(build, ring_dir, san=san, RANK="0"))
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    (path,) = ring.find_rings(ring_dir, collector="prof")
    with ring.RingReader(path) as reader:
        recs = reader.drain()
        assert reader.dropped == 0 and reader.pool_dropped == 0
    return json.loads(proc.stdout.strip().splitlines()[-1]), recs


def _coll(recs: np.ndarray, phase: int) -> dict[int, np.void]:
    c = recs[(recs["kind"] == ring.KIND_COLL) & (recs["phase"] == phase)]
    return {int(r["seq"]): r for r in c}


@pytest.mark.parametrize("version", [6, 7])
@pytest.mark.parametrize("san", ["", "asan"], ids=["O2", "asan"])
def test_copy_engine_collectives_are_operations_with_inferred_ends(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, version: int, san: str) -> None:
    build = _build(tmp_path_factory, san)
    out, recs = _run(build, version, "ce", tmp_path, san)
    mask = out["mask"]
    assert mask & CE_COLL and mask & COLL_API
    assert not mask & (CE_SYNC | CE_BATCH)  # host-side only: not asked for
    assert bool(mask & KERNEL_PHASE) == (version == 7)

    enter, end = _coll(recs, 0), _coll(recs, 1)
    ops = [events.COLL_OPS[int(enter[s]["op"])] for s in sorted(enter)]
    assert ops == ["allgather", "allreduce", "broadcast", "allreduce"]
    assert [int(enter[s]["bytes"]) for s in sorted(enter)] == [512, 400, 64, 400]
    assert int(enter[2]["peer"]) == 1  # broadcast root from the CeColl descriptor
    # under CollApi: enter at the API call; without an API parent: at launch (flagged)
    assert not enter[0]["flags"] & ring.FLAG_ENTER_AT_LAUNCH
    assert enter[2]["flags"] & ring.FLAG_ENTER_AT_LAUNCH
    assert sorted(end) == [0, 1, 2, 3]
    for ce, kernel in ((0, 1), (2, 3)):
        # no device event for copies: closed by the next completed kernel operation
        assert end[ce]["flags"] & ring.FLAG_INFERRED_END
        assert not end[kernel]["flags"] & ring.FLAG_INFERRED_END
        assert end[ce]["t_ns"] == end[kernel]["t_ns"]
        assert end[ce]["t_start_ns"] == events.NULL_TIME  # transfer start unknown
        assert end[ce]["send_count"] == events.NULL_COUNT
    tables = ring.to_tables(recs, job="j", node="n", rank=0)
    assert events.conform(tables["coll"], "coll").num_rows == 8


@pytest.mark.parametrize("san", ["", "asan"], ids=["O2", "asan"])
def test_v7_kernel_phases_give_the_transfer_start(tmp_path_factory: pytest.TempPathFactory,
                                                  tmp_path: Path, san: str) -> None:
    build = _build(tmp_path_factory, san)
    out, recs = _run(build, 7, "phase", tmp_path, san)
    assert out["mask"] & KERNEL_PHASE and out["mask"] & KERNEL_CH
    enter, end = _coll(recs, 0), _coll(recs, 1)
    assert sorted(end) == [0, 1]
    # symmetric kernel: the transfer starts with the compute phase, after the initial sync
    # (not when the kernel channel started, before it)
    assert end[0]["t_start_ns"] >= out["compute_after_ns"] > enter[0]["t_ns"]
    assert end[0]["t_start_ns"] <= end[0]["t_ns"]
    # a kernel without phases keeps the first child's start
    assert enter[1]["t_ns"] <= end[1]["t_start_ns"] <= end[1]["t_ns"]
    assert not (end[0]["flags"] | end[1]["flags"]) & ring.FLAG_INFERRED_END
