"""Build the native collectors (``native/``: the LD_PRELOAD interposer, the ring, the stub
libraries and the C test drivers) with ``make``, and the environment to run a driver with.

Used by the tests and by ``failslow bench collector``; needs a source checkout (an installed
wheel has no ``native/`` folder), ``make`` and a C compiler (``$CC``, default gcc).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from failslow.settings import environment

__all__ = ["NativeBuildError", "native_dir", "build_native", "build_native_cached",
           "sanitizer_runtime", "driver_env"]


class NativeBuildError(RuntimeError):
    """``make`` failed (the message carries its output)."""


def native_dir() -> Path | None:
    """The ``native/`` source folder of a source checkout (absent from installed wheels)."""
    here = Path(__file__).resolve().parents[1] / "native"
    return here if (here / "Makefile").is_file() else None


def build_native(out: Path, san: str = "", target: str = "tests", jobs: int = 2,
                 cc: str | None = None) -> Path:
    """``make -C native O=out SAN=san [CC=cc] target``; returns ``out``. ``cc``: another
    compiler, e.g. ``aarch64-linux-gnu-gcc`` for a cross build (``target`` then names the
    outputs to build, e.g. ``out/drv_ring``)."""
    src = native_dir()
    if src is None:
        raise NativeBuildError("native sources not found (needs a source checkout)")
    compiler = cc or environment().get("CC", "gcc")
    if shutil.which("make") is None or shutil.which(compiler) is None:
        raise NativeBuildError(f"make or the C compiler {compiler} is missing")
    out = Path(out)
    cmd = ["make", "-C", str(src), f"O={out}", f"SAN={san}", f"-j{jobs}",
           *([f"CC={cc}"] if cc else []), target]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise NativeBuildError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n"
                               f"{proc.stderr[-4000:]}")
    return out


def _sources_digest() -> str:
    src = native_dir()
    h = hashlib.blake2b(digest_size=12)
    if src is not None:
        for f in sorted(p for p in src.rglob("*") if p.is_file() and "build" not in p.parts):
            h.update(str(f.relative_to(src)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def build_native_cached(root: Path, san: str = "") -> Path:
    """:func:`build_native` into ``root/<san or default>``, reused while sources are unchanged."""
    out = Path(root) / (san or "default")
    stamp = out / ".sources"
    digest = _sources_digest()
    if stamp.is_file() and stamp.read_text() == digest:
        return out
    build_native(out, san)
    stamp.write_text(digest)
    return out


def driver_env(build: Path, ring_dir: Path, *, san: str = "", preload: str | None = None,
               job: str = "test", **extra: str) -> dict[str, str]:
    """Environment for a C test driver of ``build``: ring directory, job, the preloaded collector
    library (after the sanitizer runtime, which must come first), sanitizer options, and the
    stub directory on the library path (sanitizers intercept dlopen, so RUNPATH alone is not
    enough)."""
    env = {k: v for k, v in environment().items()
           if not k.startswith(("FAILSLOW_", "LD_PRELOAD", "ASAN_", "TSAN_", "UBSAN_", "STUB_"))}
    env.update(FAILSLOW_RING_DIR=str(ring_dir), FAILSLOW_JOB=job,
               LD_LIBRARY_PATH=str(Path(build) / "stubs"),
               ASAN_OPTIONS="detect_leaks=1:exitcode=66:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
               TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1")
    libs = []
    runtime = sanitizer_runtime(san)
    if preload:
        if runtime:
            libs.append(runtime)
        libs.append(str(Path(build) / preload))
    if libs:
        env["LD_PRELOAD"] = " ".join(libs)
    env.update(extra)
    return env


def sanitizer_runtime(san: str) -> str | None:
    """Path of libasan / libtsan (to be first in LD_PRELOAD when preloading an instrumented lib)."""
    name = {"asan": "libasan.so", "tsan": "libtsan.so"}.get(san)
    if not name:
        return None
    cc = environment().get("CC", "gcc")
    try:
        path = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return path if os.path.isabs(path) and os.path.exists(path) else None
