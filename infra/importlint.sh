#!/usr/bin/env bash
# The import rules of ARCHITECTURE.md (import-linter contracts in pyproject.toml), on the
# package laid out by infra/package_tree.py.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
python3 infra/package_tree.py "$tree"
config="$PWD/pyproject.toml"
cd "$tree" && PYTHONPATH="$tree" lint-imports "$config" --no-cache "$@"
