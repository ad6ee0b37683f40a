"""Lay the failslow package out as one folder of symlinks (pyproject's package-dir maps
several top-level folders onto it, which mypy and import-linter cannot follow through the
editable install). Usage: python3 infra/package_tree.py DIR -> DIR/failslow."""

import sys
import tomllib
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
