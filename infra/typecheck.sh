#!/usr/bin/env bash
# mypy on the failslow package, laid out by infra/package_tree.py.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
python3 infra/package_tree.py "$tree"
MYPYPATH="$tree" mypy --config-file pyproject.toml -p failslow "$@"
