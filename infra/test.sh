#!/usr/bin/env bash
# Installs what the test suite needs and runs all of it. README.md and .ci/run call this.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install --quiet --disable-pip-version-check -e '.[all]'

echo "== lint and types"
ruff check .
bash infra/typecheck.sh

echo "== tests"
python3 -m pytest "$@"
