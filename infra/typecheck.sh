#!/usr/bin/env bash
# mypy on the failslow package. The package is assembled from several top-level folders
# (pyproject's package-dir), which mypy cannot follow through the editable-install import
# hook, so this lays the same tree out with symlinks in a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
python3 - "$tree" <<'PY'
import os, sys, tomllib
from pathlib import Path
tree = Path(sys.argv[1])
dirs = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
(tree / "failslow").mkdir()
for entry in Path(dirs["failslow"]).iterdir():  # the root package: its files, one by one
    (tree / "failslow" / entry.name).symlink_to(entry.resolve())
for name, folder in sorted(dirs.items()):
    parts = name.split(".")
    if len(parts) == 2 and not (tree / "failslow" / parts[1]).exists():
        (tree / "failslow" / parts[1]).symlink_to(Path(folder).resolve())
PY
MYPYPATH="$tree" mypy --config-file pyproject.toml -p failslow "$@"
