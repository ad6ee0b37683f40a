"""The native build the native tests share: built once per test session (cached by source
hash), with a sanitizer when ``san`` names one; skipped when that runtime is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from failslow.collectors.native_build import (
    NativeBuildError,
    build_native_cached,
    sanitizer_runtime,
)


def build_or_skip(tmp_path_factory: pytest.TempPathFactory, san: str) -> Path:
    """The build directory of ``native/`` (``san``: "" or a sanitizer such as "address")."""
    if san and sanitizer_runtime(san) is None:
        pytest.skip(f"{san} runtime library not installed")
    try:
        return build_native_cached(tmp_path_factory.getbasetemp() / "native", san)
    except NativeBuildError as e:
        pytest.fail(str(e))


def run_under_asan(script: str, timeout: float = 240) -> None:
    """Run ``python -c script`` with the AddressSanitizer runtime preloaded (for a
    sanitized library the script loads with ctypes) and require it to print ``ok``."""
    runtime = sanitizer_runtime("asan")
    assert runtime is not None
    env = {**os.environ, "LD_PRELOAD": runtime,
           "ASAN_OPTIONS": "detect_leaks=0:exitcode=66",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
