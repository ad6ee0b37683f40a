"""Kafka security settings without a broker (issue 15, 1 and the floors; issue 18, 4): the
settings reach every kafka-python client, passwords come from a secret file and never show
in ``config show``, ``--help`` or a log; an unreachable address is one line within seconds;
client-library logs are quiet unless ``-v``."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from failslow.settings import get_settings, redact_url
from failslow.stream.kafka import KafkaTransport
from failslow.stream.kafka_security import (
    KafkaConnectError,
    check_connection,
    client_security,
    hide_secrets,
    quiet_client_logs,
)

SECRET = "Kf-s3cret-0xC0FFEE-never-shown"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def secure_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """SASL_SSL settings with the password in a secret file and a CA file."""
    from failslow.infra.tls import make_ca

    ca, _ = make_ca(tmp_path / "ca")
    secret = tmp_path / "kafka.password"
    secret.write_text(SECRET + "\n")
    monkeypatch.setenv("FAILSLOW_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_USERNAME", "svc-failslow")
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("FAILSLOW_KAFKA_SSL_CAFILE", str(ca))
    monkeypatch.delenv("FAILSLOW_KAFKA_SASL_PASSWORD", raising=False)
    return tmp_path


def test_settings_become_the_kafka_python_arguments_of_every_client(secure_env: Path) -> None:
    config = client_security()
    assert config == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "svc-failslow", "sasl_plain_password": SECRET,
        "ssl_check_hostname": True, "ssl_cafile": str(secure_env / "ca" / "ca.pem")}
    t = KafkaTransport(f"127.0.0.1:{_closed_port()}", subscribe=(), produce=False)
    try:  # producer, consumer and admin take the same arguments
        assert {k: t._producer_config[k] for k in config} == config
        assert t._security == config
    finally:
        t.close(timeout=1)


def test_client_certificate_and_plain_mechanism(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    from failslow.infra.tls import make_server_cert

    files = make_server_cert(tmp_path)
    monkeypatch.setenv("FAILSLOW_KAFKA_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("FAILSLOW_KAFKA_SSL_CAFILE", str(files.ca_cert))
    monkeypatch.setenv("FAILSLOW_KAFKA_SSL_CERTFILE", str(files.server_cert))
    monkeypatch.setenv("FAILSLOW_KAFKA_SSL_KEYFILE", str(files.server_key))
    monkeypatch.setenv("FAILSLOW_KAFKA_SSL_CHECK_HOSTNAME", "false")
    config = client_security()
    assert config["ssl_certfile"] == str(files.server_cert)
    assert config["ssl_keyfile"] == str(files.server_key)
    assert config["ssl_check_hostname"] is False and "sasl_mechanism" not in config
    monkeypatch.setenv("FAILSLOW_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_PASSWORD", SECRET)
    config = client_security()
    assert config["sasl_mechanism"] == "PLAIN" and "ssl_cafile" not in config


def test_incomplete_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("FAILSLOW_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    with pytest.raises(ValueError, match="FAILSLOW_KAFKA_SASL_USERNAME"):
        client_security()
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="FAILSLOW_KAFKA_SASL_PASSWORD_FILE"):
        get_settings()
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_PASSWORD", SECRET)
    monkeypatch.setenv("FAILSLOW_KAFKA_SSL_CAFILE", str(tmp_path / "no-ca.pem"))
    with pytest.raises(ValueError, match="FAILSLOW_KAFKA_SSL_CAFILE") as e:
        client_security()
    assert SECRET not in str(e.value)


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 60
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "failslow", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_no_secret_in_config_show_help_or_messages(secure_env: Path, tiny_trace: Path) -> None:
    env = {"FAILSLOW_CLICKHOUSE": f"https://reader:{SECRET}@ch.example:8443",
           "FAILSLOW_CLICKHOUSE_PASSWORD": SECRET}
    for args in (("config", "show"), ("config", "show", "--json")):
        out = _run(*args, env=env)
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
        assert "FAILSLOW_KAFKA_SASL_PASSWORD" in out.stdout or "sasl_password" in out.stdout
        assert "reader:********@ch.example" in out.stdout
    for command in (("replay",), ("process",), ("notify",), ("doctor",), ("infra", "up"),
                    ("query", "jobs"), ("config", "show")):
        out = _run(*command, "--help", env=env)
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
    # a failing command says what failed, never the secret (even with -vv)
    port = _closed_port()
    out = _run("replay", str(tiny_trace), "--asap", "--kafka", f"127.0.0.1:{port}", "-vv",
               env=env)
    assert out.returncode != 0 and SECRET not in out.stdout + out.stderr


def test_secret_hidden_from_every_log_record(secure_env: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    hide_secrets()
    with caplog.at_level(logging.DEBUG, logger="kafka.test"):
        logging.getLogger("kafka.test").debug("config %s", {"sasl_plain_password": SECRET})
    assert SECRET not in caplog.text and "********" in caplog.text


def test_redact_url() -> None:
    assert redact_url("http://u:pw@h:8123/db") == "http://u:********@h:8123/db"
    assert redact_url("http://u@h:8123") == "http://u@h:8123"
    assert redact_url("127.0.0.1:9092") == "127.0.0.1:9092"


def test_unreachable_kafka_is_one_line_within_seconds(tiny_trace: Path) -> None:
    port = _closed_port()
    with pytest.raises(KafkaConnectError, match=f"127.0.0.1:{port}"):
        check_connection(f"127.0.0.1:{port}", {"security_protocol": "PLAINTEXT"}, timeout=5)
    for command in ("replay", "process"):
        args = [str(tiny_trace), "--asap"] if command == "replay" else ["--metrics-port", "-1"]
        started = time.monotonic()
        out = _run(command, *args, "--kafka", f"127.0.0.1:{port}",
                   "--data-dir", str(tiny_trace / "data"))
        seconds = time.monotonic() - started
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 1, out.stderr
        assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], out.stderr
        assert "not reachable" in lines[0]
        assert seconds < 10  # issue 18: reported in under 10 s


def test_client_library_logs_are_quiet_unless_verbose() -> None:
    root = logging.getLogger()
    level = root.level
    try:
        root.setLevel(logging.WARNING)
        quiet_client_logs()
        for name in ("kafka", "kafka.net.manager", "urllib3", "clickhouse_connect"):
            assert not logging.getLogger(name).isEnabledFor(logging.ERROR), name
        root.setLevel(logging.INFO)  # -v
        quiet_client_logs()
        assert logging.getLogger("kafka.net.manager").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(level)
        quiet_client_logs(verbose=True)


def test_settings_from_a_config_file_and_the_password_from_a_secret_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from failslow.infra.tls import make_ca
    from failslow.settings import reload_settings, set_config_file

    ca, _ = make_ca(tmp_path)
    (tmp_path / "pw").write_text(SECRET + "\n")
    config = tmp_path / "failslow.toml"
    config.write_text('[kafka]\nbootstrap = "kafka.prod:9093"\nsecurity_protocol = "SASL_SSL"\n'
                      'sasl_mechanism = "SCRAM-SHA-512"\nsasl_username = "svc"\n'
                      f'ssl_cafile = "{ca}"\n')
    for key in [k for k in os.environ if k.startswith("FAILSLOW_KAFKA")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("FAILSLOW_KAFKA_SASL_PASSWORD_FILE", str(tmp_path / "pw"))
    import failslow.settings as settings_module

    monkeypatch.setattr(settings_module, "_config_file", None)
    try:
        s = set_config_file(config)
        assert s.kafka.bootstrap == "kafka.prod:9093"
        assert client_security(s) == {
            "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "svc", "sasl_plain_password": SECRET,
            "ssl_check_hostname": True, "ssl_cafile": str(ca)}
        assert SECRET not in s.show()
    finally:
        settings_module._config_file = None
        reload_settings()
