"""The NCCL profiler plugin (native/nccl_profiler), driven the way NCCL drives it.

``drv_prof`` dlopens the plugin, takes ncclProfiler_v5 or ncclProfiler_v4, and replays NCCL's
event sequences: API events (v5), Coll/P2p task events, then ProxyOp/ProxyStep/NetPlugin/
KernelCh children on a separate proxy thread, in device order.
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
# NCCL profiler event-type bits (profiler_abi.h)
COLL, P2P, PROXY_OP, PROXY_STEP, KERNEL_CH, NET = 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 6, 1 << 7
COLL_API, P2P_API = 1 << 9, 1 << 10


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, "")


def _prof(build: Path, args: list[str], env: dict[str, str]) -> dict:
    cmd = [str(build / "drv_prof"), str(build / PLUGIN), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _records(directory: Path) -> tuple[np.ndarray, ring.RingReader]:
    (path,) = ring.find_rings(directory, collector="prof")
    reader = ring.RingReader(path)
    return reader.drain(), reader


# drv_prof basic: (op, bytes, peer for rank 0, send steps, recv steps); None = no proxy children
BASIC = [("allreduce", 4000, -1, 8, 8), ("broadcast", 10, 1, None, None),
         ("send", 128, 1, 3, 0), ("recv", 128, 1, 0, 3), ("allgather", 512, -1, None, None),
         ("reducescatter", 1024, -1, 2, 2), ("alltoall", 32, -1, 1, 1)]


@pytest.mark.parametrize("version", [5, 4])
@pytest.mark.parametrize("san", ["", "tsan", "asan"], ids=["O2", "tsan", "asan"])
def test_operations_rounds_and_completion(tmp_path_factory: pytest.TempPathFactory,
                                          tmp_path: Path, version: int, san: str) -> None:
    build = _build(tmp_path_factory, san)
    comm = 0xF00DFACE12345678
    seen = {}
    for rank in (0, 1):
        d = tmp_path / f"r{rank}"
        d.mkdir()
        out = _prof(build, [str(version), "basic", hex(comm), str(rank)],
                    driver_env(build, d, san=san, RANK=str(rank)))
        mask = out["mask"]
        assert mask & COLL and mask & P2P and mask & PROXY_OP and mask & KERNEL_CH
        assert not mask & (PROXY_STEP | NET)  # detail off
        assert bool(mask & COLL_API) == (version == 5)
        recs, reader = _records(d)
        assert reader.pool_dropped == 0 and reader.dropped == 0
        assert reader.caps & ring.CAP_END_ROWS
        reader.close()
        comm_rows = recs[recs["kind"] == ring.KIND_COMM]
        assert comm_rows["phase"].tolist() == [0, 1]
        assert comm_rows["comm"].tolist() == [comm, comm]  # NCCL's commHash, as given
        assert comm_rows["comm_rank"].tolist() == [rank, rank]
        assert comm_rows["comm_size"].tolist() == [2, 2]
        assert comm_rows["name"].tolist() == [b"tp0", b"tp0"]

        coll = recs[recs["kind"] == ring.KIND_COLL]
        enter = coll[coll["phase"] == 0]
        end = coll[coll["phase"] == 1]
        assert set(enter["rank"].tolist()) == {rank} and set(enter["comm"].tolist()) == {comm}
        assert enter["seq"].tolist() == list(range(len(BASIC)))
        assert [events.COLL_OPS[k] for k in enter["op"]] == [b[0] for b in BASIC]
        assert enter["bytes"].tolist() == [b[1] for b in BASIC]
        peers = [(1 - rank if b[0] in ("send", "recv") else b[2]) for b in BASIC]
        assert enter["peer"].tolist() == peers
        launch = (enter["flags"] & ring.FLAG_ENTER_AT_LAUNCH) != 0
        assert launch.all() == (version == 4) and launch.any() == (version == 4)

        by_seq = {int(r["seq"]): r for r in end}
        assert sorted(by_seq) == list(range(len(BASIC)))
        enter_t = dict(zip(enter["seq"].tolist(), enter["t_ns"].tolist(), strict=True))
        for seq, (op, _, _, send, recv) in enumerate(BASIC):
            row = by_seq[seq]
            assert row["t_ns"] >= enter_t[seq]
            inferred = bool(row["flags"] & ring.FLAG_INFERRED_END)
            # the allgather never reports device activity: closed when a later op completes
            assert inferred == (op == "allgather"), op
            if send is None:
                assert row["send_count"] == events.NULL_COUNT == row["recv_count"]
            else:
                assert (row["send_count"], row["recv_count"]) == (send, recv), op
            if not inferred:
                assert enter_t[seq] <= row["t_start_ns"] <= row["t_ns"]
        # an inferred end is not earlier than the completion of the operation that implied it
        assert by_seq[4]["t_ns"] == by_seq[5]["t_ns"]
        seen[rank] = [(int(s), int(o)) for s, o in zip(enter["seq"], enter["op"], strict=True)]
        tables = ring.to_tables(recs, job="jp", node="n", rank=rank)
        assert events.conform(tables["coll"], "coll").num_rows == 2 * len(BASIC)
    assert seen[0] == seen[1]  # (comm, seq) names the same round on both ranks


def test_exhausted_pool_drops_and_counts(build: Path, tmp_path: Path) -> None:
    _prof(build, ["5", "pool", "40"], driver_env(build, tmp_path, FAILSLOW_PROFILER_OPS="16"))
    recs, reader = _records(tmp_path)
    enter = recs[(recs["kind"] == ring.KIND_COLL) & (recs["phase"] == 0)]
    assert enter["seq"].tolist() == list(range(16))
    assert reader.pool_dropped == 40 - 16
    reader.close()


def test_detail_and_pause_through_the_control_word(build: Path, tmp_path: Path) -> None:
    out = _prof(build, ["5", "toggle"],
                driver_env(build, tmp_path, job="jt", FAILSLOW_PROGRESS_US="0",
                           FAILSLOW_LINK_PERIOD_MS="0"))
    # NCCL's activation mask follows the control word at the next operation
    assert not out["before"] & PROXY_STEP
    assert out["after"] & PROXY_STEP and out["after"] & NET
    assert out["paused"] == COLL_API | P2P_API  # paused: only what keeps seq counting
    assert out["final"] == out["before"]
    recs, reader = _records(tmp_path)
    reader.close()
    enter = recs[(recs["kind"] == ring.KIND_COLL) & (recs["phase"] == 0)]
    assert enter["seq"].tolist() == [0, 2]  # seq 1 ran while paused: counted, not recorded
    progress = recs[recs["kind"] == ring.KIND_PROGRESS]
    assert progress["seq"].tolist() == [0, 0, 0]
    assert progress["send_count"].tolist() == [1, 2, 3]  # one row per proxy step
    link = recs[recs["kind"] == ring.KIND_LINK]
    assert link["name"].tolist() == [b"ncclnet1"] * 3
    assert link["posted"].tolist() == [1, 2, 3] and link["completed"].tolist() == [1, 2, 3]
    assert link["bytes"].tolist() == [4096, 8192, 12288]
    tables = ring.to_tables(recs, job="jt", node="n0", rank=0)
    assert events.conform(tables["progress"], "progress").num_rows == 3
    assert events.conform(tables["link"], "link").column("device").to_pylist() == ["ncclnet1"] * 3


def _exported(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_libraries_export_only_their_interfaces(build: Path) -> None:
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")
    assert _exported(build / PLUGIN) == {"ncclProfiler_v7", "ncclProfiler_v6", "ncclProfiler_v5",
                                          "ncclProfiler_v4"}
    nccl = _exported(build / "libfailslow_nccl.so")
    assert nccl and all(name.startswith("nccl") for name in nccl)
    assert {"ncclAllReduce", "ncclSend", "ncclGroupEnd", "ncclCommSplit"} <= nccl
    verbs = _exported(build / "libfailslow_verbs.so")
    assert verbs == {"dlvsym", "ibv_open_device", "ibv_close_device", "ibv_create_qp",
                     "ibv_destroy_qp", "failslow_verbs_sample"}
