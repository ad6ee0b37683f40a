"""The native build the native tests share: built once per test session (cached by source
hash), with a sanitizer when ``san`` names one; skipped when that runtime is missing."""

from __future__ import annotations

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
