"""The native shared-memory ring (native/include/failslow_ring.h) and its Python reader.

The C side is compiled by the test (make into a temporary directory, ASan and TSan variants
too); a C program prints the structure layout, which must equal the numpy dtypes.
"""

from __future__ import annotations

import ctypes
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


@pytest.fixture(scope="module", params=["", "asan", "tsan"], ids=["O2", "asan", "tsan"])
def any_build(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return _build(tmp_path_factory, request.param), request.param


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, "")


def _run(cmd: list[str], env: dict[str, str], timeout: float = 60) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_record_layout_equals_c_header(build: Path, tmp_path: Path) -> None:
    layout = _run([str(build / "drv_ring"), "layout"], driver_env(build, tmp_path))
    fields = {k: v for k, v in layout.items() if isinstance(v, list)}
    seen = {"fs_record": set(), "fs_ring_header": set()}
    for key, (offset, size) in fields.items():
        struct, name = key.split(".")
        dtype = ring.RECORD_DTYPE if struct == "fs_record" else ring.HEADER_DTYPE
        assert name in dtype.fields, f"{key} missing from the numpy dtype"
        ftype, foff = dtype.fields[name][:2]
        assert (foff, ftype.itemsize) == (offset, size), key
        seen[struct].add(name)
    assert seen["fs_record"] == set(ring.RECORD_DTYPE.names)
    assert seen["fs_ring_header"] == set(ring.HEADER_DTYPE.names)
    assert layout["sizeof.fs_record"] == ring.RECORD_DTYPE.itemsize == ring.RECORD_SIZE
    assert layout["sizeof.fs_ring_header"] == ring.HEADER_DTYPE.itemsize == ring.HEADER_SIZE
    assert layout["magic"] == ring.MAGIC and layout["version"] == ring.VERSION
    assert layout["null_time"] == events.NULL_TIME
    assert layout["null_count"] == events.NULL_COUNT


def test_many_producers_one_consumer_lose_nothing_uncounted(any_build: tuple[Path, str],
                                                             tmp_path: Path) -> None:
    build, san = any_build
    per_thread = 5000 if san == "tsan" else 20000
    out = _run([str(build / "drv_ring"), "stress", str(tmp_path / "s.ring"), "4",
                str(per_thread), "256"], driver_env(build, tmp_path, san=san), timeout=120)
    assert out["total"] == 4 * per_thread
    assert out["got"] + out["dropped"] == out["total"]
    assert out["got"] > 0 and out["disorder"] == 0 and out["bad"] == 0


def test_full_ring_drops_and_counts_without_blocking(build: Path, tmp_path: Path) -> None:
    out = _run([str(build / "drv_ring"), "full", str(tmp_path / "f.ring"), "100000", "64"],
               driver_env(build, tmp_path))
    assert out["capacity"] == 64
    assert out["written"] == 64
    assert out["dropped"] == 100000 - 64
    assert out["ns"] < 1e9  # 100k attempts, no waiting anywhere
    with ring.RingReader(tmp_path / "f.ring") as r:
        assert r.dropped == 100000 - 64
        recs = r.drain()
        assert recs["seq"].tolist() == list(range(64))


@pytest.mark.parametrize("san", ["", "asan"], ids=["O2", "asan"])
def test_fork_child_writes_its_own_ring(tmp_path_factory: pytest.TempPathFactory,
                                        tmp_path: Path, san: str) -> None:
    build = _build(tmp_path_factory, san)
    out = _run([str(build / "drv_ring"), "fork"], driver_env(build, tmp_path, san=san, job="fk"))
    assert out["child_status"] == 0
    parent = tmp_path / f"failslow-fk-{out['parent']}-test.ring"
    child = tmp_path / f"failslow-fk-{out['child']}-test.ring"
    assert sorted(ring.find_rings(tmp_path)) == sorted([parent, child])
    with ring.RingReader(parent) as r:
        recs = r.drain()
        assert r.info.pid == out["parent"]
        assert recs["rank"].tolist() == [1, 1, 1] and recs["seq"].tolist() == [0, 1, 2]
    with ring.RingReader(child) as r:
        recs = r.drain()
        assert r.info.pid == out["child"]
        assert recs["rank"].tolist() == [2, 2, 2] and recs["seq"].tolist() == [0, 1, 2]


def test_reader_drains_c_records_and_converts_to_contract(build: Path, tmp_path: Path) -> None:
    path = tmp_path / "fill.ring"
    _run([str(build / "drv_ring"), "fill", str(path), "20", "64"], driver_env(build, tmp_path))
    with ring.RingReader(path) as r:
        assert (r.info.job, r.info.rank, r.info.collector) == ("jobA", 3, ring.SRC_TEST)
        assert r.pending == 20
        recs = r.drain()
        assert len(recs) == 20 and r.read_index == 20 and r.pending == 0
        assert len(r.drain()) == 0
        tables = r.tables(recs, node="node7")
    i = np.arange(20)
    assert recs["op"].tolist() == (i % 8).tolist()
    assert recs["bytes"].tolist() == (i * 16).tolist()
    coll = events.conform(tables["coll"], "coll")
    assert coll.num_rows == 20
    assert set(coll.column("rank").to_pylist()) == {3}  # -1 filled from the header
    assert coll.column("op").to_pylist() == [events.COLL_OPS[k % 8] for k in range(20)]
    assert coll.column("phase").to_pylist() == ["enter", "end"] * 10
    t_start = coll.column("t_start").to_pylist()
    assert t_start[0::2] == [None] * 10  # enter rows: null
    assert t_start[1::2] == [1_700_000_000_000_000_000 + k * 1000 - 500 for k in range(1, 20, 2)]
    assert coll.column("recv_count").null_count == 20
    assert coll.column("comm").to_pylist()[:5] == [0xF000000000000000 + k for k in range(5)]
    assert tables["link"].num_rows == 0 and tables["progress"].num_rows == 0


def test_reader_stops_at_unpublished_slot_and_wraps(tmp_path: Path) -> None:
    path = tmp_path / "w.ring"
    w = ring.RingWriter(path, 64, job="j", rank=0)
    recs = ring.empty_records(50)
    recs["kind"] = ring.KIND_COLL
    recs["seq"] = np.arange(50)
    assert w.write(recs) == 50
    with ring.RingReader(path) as r:
        commit = r._records["commit"]
        saved = int(commit[5])
        commit[5] = 0  # slot 5 reserved but not yet published
        assert r.drain()["seq"].tolist() == [0, 1, 2, 3, 4]
        assert len(r.drain()) == 0
        commit[5] = saved
        assert r.drain()["seq"].tolist() == list(range(5, 50))
        recs["seq"] = np.arange(50, 100)
        assert w.write(recs) == 50  # wraps around the end of the 64 slots
        got = r.drain(max_records=30)
        assert got["seq"].tolist() == list(range(50, 80))
        assert r.drain()["seq"].tolist() == list(range(80, 100))
        assert r.dropped == 0
        assert w.write(ring.empty_records(100)) == 64 and r.dropped == 36
    w.close()


def test_python_writer_c_consumer(build: Path, tmp_path: Path) -> None:
    """The other direction: records written by Python, drained by fs_ring_drain (ctypes)."""
    path = tmp_path / "py.ring"
    w = ring.RingWriter(path, 64, job="jobP", rank=5)
    recs = ring.empty_records(100)
    recs["kind"] = ring.KIND_COLL
    recs["seq"] = np.arange(100)
    recs["t_ns"] = np.arange(100) * 7
    assert w.write(recs) == 64
    lib = ctypes.CDLL(str(build / "libfailslow_ring.so"))

    class Ring(ctypes.Structure):
        _fields_ = [("hdr", ctypes.c_void_p), ("rec", ctypes.c_void_p),
                    ("capacity", ctypes.c_uint64), ("mask", ctypes.c_uint64),
                    ("map_size", ctypes.c_size_t)]

    handle = Ring()
    assert lib.fs_ring_attach(ctypes.byref(handle), str(path).encode()) == 0
    assert handle.capacity == 64
    out = ring.empty_records(128)
    lib.fs_ring_drain.restype = ctypes.c_size_t
    n = lib.fs_ring_drain(ctypes.byref(handle), out.ctypes.data_as(ctypes.c_void_p),
                          ctypes.c_size_t(128))
    assert n == 64
    assert out["seq"][:64].tolist() == list(range(64))
    assert out["t_ns"][:64].tolist() == [k * 7 for k in range(64)]
    lib.fs_ring_detach(ctypes.byref(handle))
    with ring.RingReader(path) as r:
        assert r.read_index == 64 and r.dropped == 36 and r.info.job == "jobP"
    w.close()


def test_reader_rejects_files_that_are_not_rings(tmp_path: Path) -> None:
    bad = tmp_path / "failslow-x-1-nccl.ring"
    bad.write_bytes(b"\0" * (ring.HEADER_SIZE + 64 * ring.RECORD_SIZE))
    with pytest.raises(ring.RingError, match="not a failslow ring"):
        ring.RingReader(bad)
    short = tmp_path / "short.ring"
    short.write_bytes(b"x" * 10)
    with pytest.raises(ring.RingError, match="shorter"):
        ring.RingReader(short)
