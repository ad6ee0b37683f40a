#!/usr/bin/env bash
# Installs what the test suite needs and runs all of it. README.md and .ci/run call this.
# The Kafka broker (infra/kafka, fetched from Maven Central) is started by the test session
# itself and stopped at its end; headless Chromium comes from Debian's packages.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests use: chromium (headless page tests), strace (the collector's
# no-syscall check), docker-compose (validates docker-compose.yml; no engine is needed),
# qemu-user and gcc-aarch64-linux-gnu (the ring built for aarch64 and run under qemu-aarch64;
# about 12 s to install with the apt-get update).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v strace >/dev/null 2>&1 || missing+=(strace)
command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
command -v docker-compose >/dev/null 2>&1 || docker compose version >/dev/null 2>&1 \
    || missing+=(docker-compose)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "== installing Debian packages: ${missing[*]}"
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Prometheus for the pipeline-health PromQL tests: Debian's package unpacked under build/tools
# (cached; starts no service).
bash infra/grafana/install-prometheus.sh

python3 -m pip install --quiet --disable-pip-version-check -e '.[all,example]'

echo "== lint, types and import rules"
ruff check .
bash infra/typecheck.sh
bash infra/importlint.sh

echo "== tests"
python3 -m pytest "$@"
