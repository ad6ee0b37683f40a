"""Portable memory ordering of the ring (issue 16): the Python reader and writer with explicit
fences, the C side cross-compiled for aarch64 and run under qemu-user.

On x86-64 the Python side needs no fence (TSO); elsewhere it takes fs_fence_acquire /
fs_fence_release from libfailslow_ring.so (ring.memory_order). These tests force the fenced
mode on this machine with the real library, and run the ring driver built for aarch64 -- the
C consumer, and a C consumer that follows the Python reader's fenced protocol -- under
qemu-aarch64. qemu's TCG runs aarch64 code on this host's stronger memory model, so the qemu
runs check that the code is correct aarch64 code and the protocol works end to end; they
cannot provoke every reordering a real Arm core may do.
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

from failslow.collectors import ring
from failslow.collectors.native_build import (
    NativeBuildError,
    build_native,
    driver_env,
)

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None,
                                reason="gcc (C compiler) not installed: native collectors "
                                       "cannot be built")

CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
SYSROOT = Path("/usr/aarch64-linux-gnu")
needs_qemu = pytest.mark.skipif(
    shutil.which(CROSS_CC) is None or shutil.which(QEMU) is None or not SYSROOT.is_dir(),
    reason="qemu-user and gcc-aarch64-linux-gnu not installed (Debian: apt-get install "
           "qemu-user gcc-aarch64-linux-gnu; infra/test.sh installs them)")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory, "")


@pytest.fixture(scope="module")
def fenced(build: Path) -> ring.MemoryOrder:
    """The aarch64 ordering, with this machine's real fence library."""
    return ring.memory_order("aarch64", str(build / "libfailslow_ring.so"))


@pytest.fixture(scope="module")
def arm_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("native-aarch64")
    try:
        build_native(out, target=str(out / "drv_ring"), cc=CROSS_CC)
    except NativeBuildError as e:
        pytest.fail(str(e))
    return out


def _run(cmd: list[str], env: dict[str, str], timeout: float = 120) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _qemu(arm_build: Path, *args: str) -> list[str]:
    return [QEMU, "-L", str(SYSROOT), str(arm_build / "drv_ring"), *args]


def _drain_all(path: Path, order: ring.MemoryOrder | None = None) -> np.ndarray:
    with ring.RingReader(path, order=order) as r:
        return r.drain()


# -- ordering selection ----------------------------------------------------------------------

def test_tso_machines_need_no_fences() -> None:
    for machine in ("x86_64", "AMD64"):
        order = ring.memory_order(machine)
        assert order.source == "tso" and order.acquire is None and order.release is None


def test_other_machines_refuse_without_the_fence_library(tmp_path: Path) -> None:
    with pytest.raises(ring.RingError) as e:
        ring.memory_order("aarch64", str(tmp_path / "missing" / "libfailslow_ring.so"))
    msg = str(e.value)
    assert "\n" not in msg and "aarch64" in msg and "make -C native" in msg


def test_other_machines_take_the_fences_from_libfailslow_ring(fenced: ring.MemoryOrder,
                                                              build: Path) -> None:
    assert fenced.machine == "aarch64" and fenced.source == str(build / "libfailslow_ring.so")
    assert fenced.acquire is not None and fenced.release is not None
    assert fenced.acquire() is None and fenced.release() is None


# -- the fenced Python side on this machine -----------------------------------------------------

def test_fenced_reader_drains_c_records_like_the_tso_reader(build: Path, tmp_path: Path,
                                                            fenced: ring.MemoryOrder) -> None:
    a, b = tmp_path / "a.ring", tmp_path / "b.ring"
    for p in (a, b):
        _run([str(build / "drv_ring"), "fill", str(p), "300", "128"], driver_env(build, tmp_path))
    plain, with_fences = _drain_all(a), _drain_all(b, fenced)
    assert len(with_fences) == 128  # 300 into 128 slots: the rest was dropped and counted
    assert with_fences.tobytes() == plain.tobytes()


def test_fenced_writer_and_reader_wrap_and_stop_at_unpublished(tmp_path: Path,
                                                               fenced: ring.MemoryOrder) -> None:
    path = tmp_path / "w.ring"
    w = ring.RingWriter(path, 64, job="j", rank=0, order=fenced)
    recs = ring.empty_records(50)
    recs["kind"] = ring.KIND_COLL
    recs["seq"] = np.arange(50)
    recs["bytes"] = np.arange(50) * 3
    assert w.write(recs) == 50
    with ring.RingReader(path, order=fenced) as r:
        commit = r._records["commit"]
        saved = int(commit[7])
        commit[7] = 0  # reserved, not yet published
        assert r.drain()["seq"].tolist() == list(range(7))
        commit[7] = saved
        assert r.drain()["bytes"].tolist() == [k * 3 for k in range(7, 50)]
        recs["seq"] = np.arange(50, 100)
        assert w.write(recs) == 50  # wraps
        assert r.drain()["seq"].tolist() == list(range(50, 100))
    w.close()


@pytest.mark.parametrize("san", ["", "asan"], ids=["O2", "asan"])
def test_c_consumer_with_the_python_protocol_under_concurrent_producers(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, san: str) -> None:
    build = _build(tmp_path_factory, san)
    out = _run([str(build / "drv_ring"), "stress", str(tmp_path / "s.ring"), "4", "20000", "256",
                "fenced"], driver_env(build, tmp_path, san=san))
    assert out["got"] + out["dropped"] == out["total"] == 80000
    assert out["got"] > 0 and out["disorder"] == 0 and out["bad"] == 0


# -- aarch64 under qemu-user ------------------------------------------------------------------

@needs_qemu
def test_aarch64_layout_equals_the_numpy_dtypes(arm_build: Path, tmp_path: Path) -> None:
    layout = _run(_qemu(arm_build, "layout"), driver_env(arm_build, tmp_path))
    for key, value in layout.items():
        if not isinstance(value, list):
            continue
        struct, name = key.split(".")
        dtype = ring.RECORD_DTYPE if struct == "fs_record" else ring.HEADER_DTYPE
        ftype, foff = dtype.fields[name][:2]
        assert (foff, ftype.itemsize) == tuple(value), key
    assert layout["sizeof.fs_record"] == ring.RECORD_SIZE
    assert layout["sizeof.fs_ring_header"] == ring.HEADER_SIZE


@needs_qemu
@pytest.mark.parametrize("consumer", ["c", "fenced"])
def test_aarch64_producers_and_consumer_lose_nothing_uncounted(arm_build: Path, tmp_path: Path,
                                                               consumer: str) -> None:
    args = ["stress", str(tmp_path / "s.ring"), "4", "20000", "256"]
    out = _run(_qemu(arm_build, *args, *(["fenced"] if consumer == "fenced" else [])),
               driver_env(arm_build, tmp_path), timeout=300)
    assert out["got"] + out["dropped"] == out["total"] == 80000
    assert out["got"] > 0 and out["disorder"] == 0 and out["bad"] == 0


@needs_qemu
def test_aarch64_ring_file_reads_like_the_native_one(arm_build: Path, build: Path,
                                                     tmp_path: Path) -> None:
    arm, native = tmp_path / "arm.ring", tmp_path / "x86.ring"
    _run(_qemu(arm_build, "fill", str(arm), "40", "64"), driver_env(arm_build, tmp_path))
    _run([str(build / "drv_ring"), "fill", str(native), "40", "64"], driver_env(build, tmp_path))
    a, b = _drain_all(arm), _drain_all(native)
    assert len(a) == 40 and a.tobytes() == b.tobytes()


@needs_qemu
def test_aarch64_fences_are_barrier_instructions(arm_build: Path) -> None:
    objdump = shutil.which("aarch64-linux-gnu-objdump")
    if objdump is None:
        pytest.skip("aarch64-linux-gnu-objdump (binutils-aarch64-linux-gnu) not installed")
    for fn in ("fs_fence_acquire", "fs_fence_release"):
        asm = subprocess.run([objdump, "-d", f"--disassemble={fn}", str(arm_build / "drv_ring")],
                             capture_output=True, text=True, check=True).stdout
        assert "dmb" in asm, fn
    drain = subprocess.run([objdump, "-d", "--disassemble=fs_ring_drain",
                            str(arm_build / "drv_ring")],
                           capture_output=True, text=True, check=True).stdout
    assert "ldar" in drain and "stlr" in drain  # acquire loads of commit, release of read_idx
