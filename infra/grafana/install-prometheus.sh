#!/usr/bin/env bash
# Puts Debian's Prometheus server (package `prometheus`) under build/tools/prometheus for the
# tests that run the pipeline-health PromQL against a real Prometheus
# (tests/integration/clickhouse/test_grafana_prometheus.py). The package is downloaded and unpacked, not installed:
# nothing starts a service and nothing outside build/ changes. Cached: a second run that finds
# the binary does nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=build/tools/prometheus
bin="$dest/usr/bin/prometheus"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    exit 0
fi
if command -v prometheus >/dev/null 2>&1; then
    exit 0  # already on PATH (the tests look there too)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
    $sudo_cmd apt-get update -qq
    (cd "$tmp" && apt-get download prometheus >/dev/null)
fi
rm -rf "$dest"
mkdir -p "$dest"
dpkg-deb -x "$tmp"/prometheus_*.deb "$dest"
"$bin" --version | head -1
