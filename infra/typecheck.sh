#!/usr/bin/env bash
# mypy on the failslow package. The package is assembled from several top-level folders
# (pyproject's package-dir), which mypy cannot follow through the editable-install import
# hook, so this lays the same tree out with symlinks in a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/failslow"
for entry in core/*; do ln -s "$PWD/$entry" "$tree/failslow/"; done
for pkg in collectors stream detectors dashboards; do ln -s "$PWD/$pkg" "$tree/failslow/$pkg"; done
MYPYPATH="$tree" mypy --config-file pyproject.toml -p failslow "$@"
