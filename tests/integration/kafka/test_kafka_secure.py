"""Every Kafka command over a real SASL_SSL listener (issue 15, 1-2 and the floors):
``failslow infra up --secure`` (SCRAM credentials made at format time, a CA and a server
certificate made on the spot) prints the client settings; replay -> process -> query,
notify and doctor work over it; a wrong password or an untrusted certificate fails within
30 s with one line; the password never shows in a log."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_notify_once import Inbox, publish_reports, routes

from failslow.infra import kafka_broker as infra
from failslow.infra.tls import make_server_cert


def _prerequisites_or_skip() -> None:
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing and not (infra.lib_dir() / ".complete").exists():
        reason = f"Kafka tests need {' and '.join(missing)} to run a broker"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI must run them)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A secure broker started by ``failslow infra up --secure``; its KEY=value lines."""
    _prerequisites_or_skip()
    state = tmp_path_factory.mktemp("kafka-secure")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_KAFKA")}
    try:
        out = subprocess.run(
            [sys.executable, "-m", "failslow", "infra", "up", "--secure", "--port", "0",
             "--state-dir", str(state), "--max-lifetime", "3600", "--timeout", "150"],
            env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines and all(line.count("=") >= 1 and " " not in line for line in lines)
        settings = dict(line.split("=", 1) for line in lines)
        yield settings
    finally:
        infra.kafka_down(state)


def _env(settings: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAILSLOW_KAFKA")}
    return {**env, **settings, "PYTHONUNBUFFERED": "1", **extra}


def _cli(env: dict[str, str], *args: str, timeout: float = 180
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "failslow", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_infra_up_secure_prints_exportable_client_settings(secure: dict[str, str]) -> None:
    assert secure["FAILSLOW_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert secure["FAILSLOW_KAFKA_SASL_MECHANISM"].startswith("SCRAM-SHA-")
    assert Path(secure["FAILSLOW_KAFKA_SSL_CAFILE"]).read_text().startswith("-----BEGIN")
    password = Path(secure["FAILSLOW_KAFKA_SASL_PASSWORD_FILE"])
    assert oct(password.stat().st_mode & 0o777) == "0o600"
    assert "FAILSLOW_KAFKA_SASL_PASSWORD" not in secure  # only the file
    # the listener refuses a client without TLS and SASL
    env = _env({"FAILSLOW_KAFKA": secure["FAILSLOW_KAFKA"]})
    out = _cli(env, "doctor", "--no-clickhouse", "--timeout", "5", timeout=60)
    assert out.returncode == 1 and "FAIL  kafka" in out.stdout


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace")
    out = subprocess.run([sys.executable, "-m", "failslow", "simulate", "--out", str(path),
                          "--iterations", "30"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return path


def test_replay_process_query_over_sasl_ssl(secure: dict[str, str], trace: Path,
                                           tmp_path: Path) -> None:
    prefix = f"sec-{uuid.uuid4().hex[:6]}."
    env = _env(secure, FAILSLOW_TOPIC_PREFIX=prefix, FAILSLOW_DATA_DIR=str(tmp_path))
    password = Path(secure["FAILSLOW_KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()
    out = _cli(env, "replay", str(trace), "--asap", "--json", "-vv")
    assert out.returncode == 0, out.stderr[-2000:]
    assert password not in out.stdout + out.stderr  # not even in kafka-python's debug logs
    assert '"dropped": 0' in out.stdout
    out = _cli(env, "process", "--exit-when-idle", "6", "--metrics-port", "-1",
               "--group", "g-" + prefix)
    assert out.returncode == 0, out.stderr[-2000:]
    assert password not in out.stdout + out.stderr
    out = _cli(env, "query", "anomalies", "--job", "sim-64", "--json")
    assert out.returncode == 0, out.stderr
    import json

    diagnosis = json.loads(out.stdout)
    assert diagnosis["job"] == "sim-64" and diagnosis["anomalies"]
    out = _cli(env, "doctor", "--group", "g-" + prefix, "--timeout", "8")
    assert "ok    kafka " in out.stdout and "SASL_SSL" in out.stdout, out.stdout
    assert f"ok    group g-{prefix}" in out.stdout and "lag 0 messages" in out.stdout
    assert password not in out.stdout + out.stderr


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_every_sasl_mechanism_over_tls(secure: dict[str, str], mechanism: str) -> None:
    env = _env(secure, FAILSLOW_KAFKA_SASL_MECHANISM=mechanism)
    out = _cli(env, "doctor", "--no-clickhouse", "--timeout", "8", timeout=60)
    assert "ok    kafka " in out.stdout and mechanism in out.stdout, out.stdout + out.stderr


def test_client_certificate_mutual_tls(secure: dict[str, str], tmp_path: Path) -> None:
    """The broker checks a client certificate when one is given: signed by its CA it is
    accepted, signed by another CA the TLS handshake fails."""
    from failslow.infra.tls import make_client_cert

    ca = Path(secure["FAILSLOW_KAFKA_SSL_CAFILE"])
    good = make_client_cert(tmp_path / "good", ca, ca.with_name("ca.key"))
    other = make_server_cert(tmp_path / "other")
    bad = make_client_cert(tmp_path / "bad", other.ca_cert, other.ca_key)
    for (cert, key), verdict in ((good, "ok    kafka "), (bad, "TLS failed")):
        env = _env(secure, FAILSLOW_KAFKA_SSL_CERTFILE=str(cert),
                   FAILSLOW_KAFKA_SSL_KEYFILE=str(key))
        out = _cli(env, "doctor", "--no-clickhouse", "--timeout", "8", timeout=60)
        assert verdict in out.stdout, out.stdout + out.stderr


def _security(secure: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    from failslow.stream.kafka_security import client_security

    for key in [k for k in os.environ if k.startswith("FAILSLOW_KAFKA")]:
        monkeypatch.delenv(key)
    for key, value in secure.items():
        monkeypatch.setenv(key, value)
    return client_security()


def test_notify_over_sasl_ssl(secure: dict[str, str], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"secn-{uuid.uuid4().hex[:6]}."
    publish_reports(secure["FAILSLOW_KAFKA"], prefix, 2, _security(secure, monkeypatch))
    inbox = Inbox()
    try:
        env = _env(secure, HOOK_URL=inbox.url, FAILSLOW_DATA_DIR=str(tmp_path))
        # --once returns as soon as it has read its partitions to the end; the longer
        # timeout only covers a TLS group join on a loaded CI machine
        # -v: the group's joins and assignments are in the failure message
        out = _cli(env, "-v", "notify", "--config", str(routes(tmp_path)), "--once",
                   "--once-timeout", "120", "--topic-prefix", prefix, "--group", "n-" + prefix)
        assert out.returncode == 0, out.stderr[-4000:]
        assert "delivered=2" in out.stdout and len(inbox.bodies) == 2
    finally:
        inbox.server.shutdown()
        inbox.server.server_close()


def test_agent_over_sasl_ssl(secure: dict[str, str], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    from support.rings import ring_with_records

    from failslow.stream.kafka import KafkaTransport
    from failslow.stream.transport import decode

    rings = tmp_path / "rings"
    rings.mkdir()
    for r in range(2):
        ring_with_records(rings, r, 910000 + r, 30).close()
    out = _cli(_env(secure), "agent", "--kafka", "--ring-dir", str(rings), "--node", "n1",
               "--disable", "gpu", "--disable", "rdma", "--once", "--json")
    assert out.returncode == 0, out.stderr
    consumer = KafkaTransport(secure["FAILSLOW_KAFKA"], group_id=f"g-{uuid.uuid4().hex[:8]}",
                              subscribe=["failslow.coll"], produce=False,
                              security=_security(secure, monkeypatch))
    rows = 0
    deadline = time.monotonic() + 60
    try:
        while rows < 120 and time.monotonic() < deadline:
            for m in consumer.poll(500, timeout=1.0):
                rows += decode(m)[1].num_rows
    finally:
        consumer.close()
    assert rows == 2 * 2 * 30


@pytest.mark.parametrize("command", ["replay", "process", "notify", "doctor"])
@pytest.mark.parametrize("fault", ["password", "certificate"])
def test_wrong_password_or_untrusted_certificate_fails_fast_in_one_line(
        secure: dict[str, str], trace: Path, tmp_path: Path, command: str,
        fault: str) -> None:
    wrong = "Wr0ng-pa55word-shown-nowhere"
    settings = dict(secure)
    if fault == "password":
        (tmp_path / "pw").write_text(wrong + "\n")
        settings["FAILSLOW_KAFKA_SASL_PASSWORD_FILE"] = str(tmp_path / "pw")
    else:  # a CA that did not sign the broker's certificate
        settings["FAILSLOW_KAFKA_SSL_CAFILE"] = str(make_server_cert(tmp_path / "other").ca_cert)
    env = _env(settings, FAILSLOW_DATA_DIR=str(tmp_path))
    args = {"replay": ["replay", str(trace), "--asap"],
            "process": ["process", "--metrics-port", "-1"],
            "notify": ["notify", "--config", str(routes(tmp_path)), "--once"],
            "doctor": ["doctor", "--no-clickhouse"]}[command]
    if command == "notify":
        env["HOOK_URL"] = "http://127.0.0.1:9/"
    started = time.monotonic()
    out = _cli(env, *args, timeout=120)
    seconds = time.monotonic() - started
    assert seconds < 30  # the bound: fails within 30 s, never retries forever
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout + out.stderr
    expected = "authentication failed" if fault == "password" else "TLS failed"
    assert expected in text, text
    assert wrong not in text and "Traceback" not in text
    if command != "doctor":
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, out.stderr
        assert secure["FAILSLOW_KAFKA"] in lines[0]


def test_live_simulation_over_sasl_ssl(secure: dict[str, str], tmp_path: Path) -> None:
    """``failslow simulate --live`` publishes through the same secured clients: its rows
    reach the SASL_SSL listener (read back by ``failslow process``)."""
    import json

    prefix = f"live-{uuid.uuid4().hex[:6]}."
    env = _env(secure, FAILSLOW_TOPIC_PREFIX=prefix, FAILSLOW_DATA_DIR=str(tmp_path))
    password = Path(secure["FAILSLOW_KAFKA_SASL_PASSWORD_FILE"]).read_text().strip()
    out = _cli(env, "simulate", "--live", "--job", "live-sec", "--duration", "6s",
               "--first-fault", "1h", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert password not in out.stdout + out.stderr
    stats = tmp_path / "stats.json"
    out = _cli(env, "process", "--exit-when-idle", "6", "--metrics-port", "-1",
               "--group", "g-" + prefix, "--stats-json", str(stats))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(stats.read_text())["rows"].get("coll", 0) > 1000
    out = _cli(env, "query", "jobs", "--json")
    assert out.returncode == 0 and "live-sec" in out.stdout, out.stdout + out.stderr
