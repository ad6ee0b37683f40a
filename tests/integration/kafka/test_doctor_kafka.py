"""``failslow doctor`` (issue 15, 5) on the real broker and the embedded store, and the
first replay on a fresh broker (issue 18, 4: no NotLeaderForPartitionError)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import Broker
from failslow.infra import kafka_broker as infra


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "failslow", "doctor", *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=120)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_doctor_on_a_working_setup(broker: Broker, tmp_path: Path, tiny_trace: Path) -> None:
    prefix = f"doc-{uuid.uuid4().hex[:6]}."
    routes = tmp_path / "routes.yaml"
    routes.write_text("receivers:\n  - {name: hook, type: generic, url_env: DOC_HOOK}\n"
                      "routes:\n  - {match: {job: '*'}, receivers: [hook]}\n")
    env = {"DOC_HOOK": "http://127.0.0.1:9/hook", "FAILSLOW_DATA_DIR": str(tmp_path)}
    out = _doctor("--kafka", broker.bootstrap, "--topic-prefix", prefix, "--routes",
                  str(routes), "--ring-dir", str(tmp_path), "--json", env=env)
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert out.returncode == 0, out.stdout + out.stderr
    assert checks["kafka"]["status"] == "ok" and broker.bootstrap in checks["kafka"]["detail"]
    assert checks["kafka topics"]["status"] == "warn"  # nothing created them yet
    assert checks["clickhouse"]["status"] == "ok"
    assert checks["webhook routes"]["status"] == "ok" and checks["ring dir"]["status"] == "ok"
    # after a replay the topics are there
    rp = subprocess.run([sys.executable, "-m", "failslow", "replay", str(tiny_trace), "--asap",
                         "--kafka", broker.bootstrap, "--topic-prefix", prefix],
                        capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0, rp.stderr
    out = _doctor("--kafka", broker.bootstrap, "--topic-prefix", prefix, "--no-clickhouse",
                  "--ring-dir", str(tmp_path), env=env)
    assert "ok    kafka topics" in out.stdout, out.stdout


def test_doctor_says_what_is_broken_and_exits_non_zero(tmp_path: Path) -> None:
    routes = tmp_path / "routes.yaml"
    routes.write_text("receivers:\n  - {name: hook, type: generic, url_env: DOC_UNSET_HOOK}\n"
                      "routes:\n  - {match: {job: '*'}, receivers: [hook]}\n")
    port = _closed_port()
    env = {k: v for k, v in os.environ.items() if k != "DOC_UNSET_HOOK"}
    out = subprocess.run([sys.executable, "-m", "failslow", "doctor", "--kafka",
                          f"127.0.0.1:{port}", "--clickhouse", f"http://127.0.0.1:{port}",
                          "--routes", str(routes), "--ring-dir", str(tmp_path / "none")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    lines = {line.split()[1]: line for line in out.stdout.splitlines()}
    assert lines["kafka"].startswith("FAIL") and f"127.0.0.1:{port}" in lines["kafka"]
    assert lines["clickhouse"].startswith("FAIL") and "not reachable" in lines["clickhouse"]
    assert "DOC_UNSET_HOOK" in out.stdout and "is not a directory" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_first_replay_on_a_fresh_broker_has_no_not_leader_errors(
        tmp_path: Path, tiny_trace: Path) -> None:
    if os.environ.get(infra.ENV_BOOTSTRAP):
        pytest.skip("needs a broker of its own (FAILSLOW_KAFKA names an external one)")
    status = infra.kafka_up(0, state_dir=tmp_path / "kafka", max_lifetime=900, timeout=150)
    try:
        from failslow.simulator import load_scenario, simulate
        from failslow.simulator.output import write_sim

        write_sim(simulate(load_scenario("demo"), 0), tmp_path / "trace", "parquet")
        out = subprocess.run([sys.executable, "-m", "failslow", "-v", "replay",
                              str(tmp_path / "trace"), "--asap", "--kafka", status.bootstrap],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stderr.count("NotLeaderForPartition") == 0, out.stderr[-3000:]
    finally:
        infra.kafka_down(tmp_path / "kafka")
