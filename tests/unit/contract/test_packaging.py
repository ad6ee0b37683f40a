"""One distribution, `failslow`, whose folders import as failslow.*: editable and wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import failslow
import failslow.detectors
from conftest import REPO

REPO = REPO
SUBPACKAGES = ("collectors", "stream", "detectors", "dashboards", "simulator")


def test_editable_install_maps_top_level_folders() -> None:
    assert Path(failslow.__file__).parent == REPO / "core"
    assert Path(failslow.detectors.__file__).parent == REPO / "detectors"


@pytest.mark.timeout(600)
def test_wheel_installs_only_the_failslow_package(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(REPO)], check=True)
    (wheel,) = (tmp_path / "dist").glob("failslow-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    assert all(t == "failslow" or t.endswith(".dist-info") for t in tops), tops
    # every module of every folder pyproject maps (README's plain `pip install '.[all]'`
    # installs the wheel, not the editable tree): a subpackage missing from `packages`
    # would be left out
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    missing = [f"{pkg.replace('.', '/')}/{f.name}" for pkg, folder in dirs.items()
               for f in (REPO / folder).glob("*.py")
               if f"{pkg.replace('.', '/')}/{f.name}" not in names]
    assert not missing, missing
    # the evidence reducer's compiled kernel (setup.py; this machine has a C compiler)
    assert any(n.startswith("failslow/detectors/slowdown/_evidence") and n.endswith(".so")
               for n in names), "the wheel has no compiled evidence kernel"

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    code = ("import failslow, failslow.cli\n"
            + "".join(f"import failslow.{p}\n" for p in SUBPACKAGES)
            + "print(failslow.__file__)\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip().startswith(str(target / "failslow"))
    for bare in ("detectors", "stream", "collectors", "dashboards", "core"):
        assert not (target / bare).exists(), f"bare package {bare} landed in site-packages"


def test_console_command_help_reads_well() -> None:
    out = subprocess.run(["failslow", "--help"], capture_output=True, text=True, check=True)
    assert "usage: failslow" in out.stdout
    for command in ("bench",):
        assert command in out.stdout
