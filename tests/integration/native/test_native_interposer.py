"""The LD_PRELOAD NCCL interposer (native/nccl_interposer) against a stub libnccl.

Each test runs a C driver linked against the stub libnccl.so.2 (and, unless stated, a stub
libcudart whose cudaLaunchHostFunc runs host functions on a worker thread), with the
interposer preloaded, then reads the ring back with failslow.collectors.ring.
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
from failslow.bench.collector import count_syscalls
from failslow.collectors import ring
from failslow.collectors.native_build import (
    driver_env,
)

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None,
                                reason="gcc (C compiler) not installed: native collectors "
                                       "cannot be built")

LIB = "libfailslow_nccl.so"
OP = events.OP


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, "")


def _run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _drain_one(directory: Path, tag: str = "nccl") -> tuple[ring.RingInfo, np.ndarray, int]:
    paths = ring.find_rings(directory, collector=tag)
    assert len(paths) == 1, paths
    with ring.RingReader(paths[0]) as r:
        return r.info, r.drain(), r.caps


def _colls(recs: np.ndarray, phase: int) -> np.ndarray:
    return recs[(recs["kind"] == ring.KIND_COLL) & (recs["phase"] == phase)]


# expected rows of `drv_nccl basic` on the parent communicator: (op, bytes, peer for rank 0)
BASIC = [("allreduce", 4000, -1), ("allgather", 512, -1), ("reducescatter", 1024, -1),
         ("broadcast", 10, 1), ("reduce", 28, 0), ("alltoall", 32, -1), ("send", 128, 1),
         ("recv", 128, 1), ("allreduce", 0xBAD, -1), ("allreduce", 5, -1)]


@pytest.mark.parametrize("san", ["", "asan"], ids=["O2", "asan"])
def test_two_ranks_record_the_same_rounds(tmp_path_factory: pytest.TempPathFactory,
                                          tmp_path: Path, san: str) -> None:
    build = _build(tmp_path_factory, san)
    per_rank = {}
    for rank in (0, 1):
        d = tmp_path / f"r{rank}"
        d.mkdir()
        _run([str(build / "drv_nccl"), "basic", "5", str(rank)],
             driver_env(build, d, san=san, preload=LIB, job="jb", RANK=str(rank)))
        per_rank[rank] = _drain_one(d)
    comms = {}
    for rank, (info, recs, caps) in per_rank.items():
        assert info.rank == rank and caps & ring.CAP_END_ROWS
        assert set(recs["rank"].tolist()) == {rank}
        comm_rows = recs[recs["kind"] == ring.KIND_COMM]
        inits = comm_rows[comm_rows["phase"] == 0]
        assert len(inits) == 2 and len(comm_rows) == 4  # parent + split, init and destroy
        parent, sub = int(inits["comm"][0]), int(inits["comm"][1])
        assert int(inits["seq"][1]) == parent  # the split records its parent
        assert inits["comm_rank"].tolist() == [rank, rank]
        assert inits["comm_size"].tolist() == [2, 2]
        assert inits["device"].tolist() == [rank, rank]  # ncclCommCuDevice of the stub
        comms[rank] = (parent, sub)

        enter, end = _colls(recs, 0), _colls(recs, 1)
        on_parent = enter[enter["comm"] == parent]
        assert on_parent["seq"].tolist() == list(range(len(BASIC)))
        assert [events.COLL_OPS[k] for k in on_parent["op"]] == [b[0] for b in BASIC]
        assert on_parent["bytes"].tolist() == [b[1] for b in BASIC]
        expected_peer = [(1 - rank if b[0] in ("send", "recv") else b[2]) for b in BASIC]
        assert on_parent["peer"].tolist() == expected_peer
        assert set(on_parent["comm_rank"].tolist()) == {rank}
        on_sub = enter[enter["comm"] == sub]
        assert on_sub["seq"].tolist() == [0] and on_sub["bytes"].tolist() == [3]
        # every operation got its end row after its enter row
        key = {(int(c), int(s)): int(t) for c, s, t in zip(enter["comm"], enter["seq"],
                                                          enter["t_ns"], strict=True)}
        ends = {(int(c), int(s)): (int(t), int(f)) for c, s, t, f in
                zip(end["comm"], end["seq"], end["t_ns"], end["flags"], strict=True)}
        assert set(ends) == set(key)
        assert all(ends[k][0] >= key[k] for k in key)
        assert ends[(parent, 8)][1] & ring.FLAG_ERROR  # the call NCCL rejected
        assert ends[(parent, 9)][1] & ring.FLAG_GRAPH  # captured into a CUDA graph
        assert not any(f & ring.FLAG_UNTRACKED for _, f in ends.values())
    assert comms[0] == comms[1]  # comm ids identical on both members, split included
    assert comms[0][0] != comms[0][1]


def test_contract_tables_from_interposer_rows(build: Path, tmp_path: Path) -> None:
    _run([str(build / "drv_nccl"), "basic", "9", "0"],
         driver_env(build, tmp_path, preload=LIB, job="jc", RANK="0"))
    path = ring.find_rings(tmp_path)[0]
    with ring.RingReader(path) as r:
        recs = r.drain()
        tables = r.tables(recs, node="n0")
        comms = ring.comm_table(recs, rank=r.info.rank)
    coll = events.conform(tables["coll"], "coll")
    # 11 operations, the graph-captured one left out -> 10 enter + 10 end rows
    assert coll.num_rows == 20
    phases = coll.column("phase").to_pylist()
    assert phases.count("enter") == phases.count("end") == 10
    cols = events.to_columns(coll, "coll")
    sends = cols["op"] == OP["send"]
    assert (cols["peer"][sends] == 1).all()
    assert comms.column("event").to_pylist() == ["init", "init", "destroy", "destroy"]
    assert comms.column("local_id").to_pylist() == [False] * 4
    with_graph = ring.to_tables(recs, job="jc", node="n0", rank=0, keep_graph=True)["coll"]
    assert with_graph.num_rows == 22


def test_without_cuda_runtime_only_enter_rows(build: Path, tmp_path: Path) -> None:
    _run([str(build / "drv_nccl_nocuda"), "basic", "5", "0"],
         driver_env(build, tmp_path, preload=LIB, RANK="0"))
    _, recs, caps = _drain_one(tmp_path)
    assert caps & ring.CAP_END_ROWS == 0  # consumers must not read a missing end as a hang
    assert len(_colls(recs, 0)) == 11
    end = _colls(recs, 1)
    assert all(f & ring.FLAG_ERROR for f in end["flags"])  # only the rejected call ends


def test_completion_tracking_can_be_switched_off(build: Path, tmp_path: Path) -> None:
    _run([str(build / "drv_nccl"), "loop", "10"],
         driver_env(build, tmp_path, preload=LIB, FAILSLOW_COMPLETION="off"))
    _, recs, caps = _drain_one(tmp_path)
    assert caps == 0 and len(_colls(recs, 0)) == 10 and len(_colls(recs, 1)) == 0


def test_control_word_pauses_and_switches_detail(build: Path, tmp_path: Path) -> None:
    env = driver_env(build, tmp_path, preload=LIB, job="jp")
    proc = subprocess.Popen([str(build / "drv_nccl"), "phases", "10"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        path = tmp_path / f"failslow-jp-{proc.pid}-nccl.ring"
        assert proc.stdout.readline().strip() == "phase 0"
        reader = ring.RingReader(path)
        first = reader.drain()
        reader.set_paused(True)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "phase 1"
        paused = reader.drain()
        reader.set_paused(False)
        reader.set_detail(True)
        assert reader.control == ring.CTL_DETAIL
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "phase 2"
        assert proc.wait(timeout=30) == 0
        detail = reader.drain()
        reader.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _colls(first, 0)["seq"].tolist() == list(range(10))
    assert len(_colls(first, 1)) == 10
    assert not (first["kind"] == ring.KIND_GROUP).any()  # no detail yet
    assert len(paused) == 0  # nothing recorded while paused...
    # ...but the operations were still counted: seq stays aligned with the other ranks
    assert _colls(detail, 0)["seq"].tolist() == list(range(20, 30))
    assert len(_colls(detail, 1)) == 10
    groups = detail[detail["kind"] == ring.KIND_GROUP]
    assert groups["phase"].tolist() == [0, 1] * 10  # ncclGroupStart / ncclGroupEnd markers


def test_full_ring_drops_and_the_program_never_waits(build: Path, tmp_path: Path) -> None:
    calls = 5000
    _run([str(build / "drv_nccl"), "loop", str(calls)],
         driver_env(build, tmp_path, preload=LIB, FAILSLOW_RING_CAPACITY="64"))
    path = ring.find_rings(tmp_path)[0]
    with ring.RingReader(path) as r:
        assert r.capacity == 64
        recs = r.drain()
        attempted = 1 + 2 * calls + 1  # comm init, enter + end per call, comm destroy
        assert len(recs) == 64 and r.dropped == attempted - 64


def test_threads_each_with_a_communicator_under_tsan(tmp_path_factory: pytest.TempPathFactory,
                                                      tmp_path: Path) -> None:
    build = _build(tmp_path_factory, "tsan")
    per_thread = 100
    _run([str(build / "drv_nccl"), "threads", "4", str(per_thread)],
         driver_env(build, tmp_path, san="tsan", preload=LIB), timeout=120)
    _, recs, _ = _drain_one(tmp_path)
    enter, end = _colls(recs, 0), _colls(recs, 1)
    comms = np.unique(enter["comm"])
    assert len(comms) == 4
    ops = per_thread + per_thread // 4  # every 4th iteration is a send + recv group
    for c in comms:
        assert np.sort(enter["seq"][enter["comm"] == c]).tolist() == list(range(ops))
        assert np.sort(end["seq"][end["comm"] == c]).tolist() == list(range(ops))
    sends = enter[enter["op"] == OP["send"]]
    assert len(sends) == 4 * (per_thread // 4)


@pytest.mark.parametrize("san", ["", "asan"], ids=["O2", "asan"])
def test_fork_child_records_into_its_own_ring(tmp_path_factory: pytest.TempPathFactory,
                                              tmp_path: Path, san: str) -> None:
    build = _build(tmp_path_factory, san)
    proc = _run([str(build / "drv_nccl"), "fork"],
                driver_env(build, tmp_path, san=san, preload=LIB, job="jf"))
    pids = json.loads(proc.stdout.strip().splitlines()[-1])
    rings = {p.name: p for p in ring.find_rings(tmp_path)}
    parent = rings[f"failslow-jf-{pids['parent']}-nccl.ring"]
    child = rings[f"failslow-jf-{pids['child']}-nccl.ring"]
    assert len(rings) == 2
    with ring.RingReader(parent) as r:
        recs = r.drain()
    enter = _colls(recs, 0)
    assert enter["seq"].tolist() == [0, 1] and set(enter["op"].tolist()) == {OP["allreduce"]}
    assert len(_colls(recs, 1)) == 2
    with ring.RingReader(child) as r:
        assert r.info.pid == pids["child"]
        recs = r.drain()
    enter = _colls(recs, 0)
    assert enter["seq"].tolist() == [0, 1, 2]
    assert set(enter["op"].tolist()) == {OP["allgather"]}


def test_no_system_call_per_intercepted_call(build: Path) -> None:
    if shutil.which("strace") is None:
        assert not os.environ.get("CI"), "strace missing in CI (infra/test.sh installs it)"
        pytest.skip("strace not installed (infra/test.sh installs it)")
    shm = Path("/dev/shm")
    ring_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    if shm.is_dir() and os.access(shm, os.W_OK):
        ring_dir = shm
    d = ring_dir / f"failslow-test-{os.getpid()}"
    d.mkdir()
    try:
        out = count_syscalls(build, d, calls=5000)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if out["syscalls_per_call"] is None:  # e.g. ptrace not permitted in this container
        pytest.skip(f"strace cannot trace here: {out['syscall_method']}")
    assert out["syscalls_per_call"] == 0, out
