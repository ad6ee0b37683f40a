"""The secure local broker's configuration without starting it (issue 15, 2): a SASL_SSL
listener with SCRAM and a PEM key store, a CA and a server certificate for 127.0.0.1,
and client settings that name the password file, never the password."""

from __future__ import annotations

import ssl
from pathlib import Path

from failslow.infra import kafka_broker as infra
from failslow.infra.tls import make_server_cert


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_server_properties_with_a_sasl_ssl_listener(tmp_path: Path) -> None:
    plain = _props(infra.server_properties(9092, 9093, tmp_path))
    assert "SASL_SSL" not in plain["listeners"]
    props = _props(infra.server_properties(9100, 9093, tmp_path, secure_port=9092,
                                           keystore=tmp_path / "ks.pem"))
    assert props["listeners"].startswith("PLAINTEXT://127.0.0.1:9100,SASL_SSL://127.0.0.1:9092")
    assert props["advertised.listeners"] == ("PLAINTEXT://127.0.0.1:9100,"
                                             "SASL_SSL://127.0.0.1:9092")
    assert "SASL_SSL:SASL_SSL" in props["listener.security.protocol.map"]
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-256,SCRAM-SHA-512"
    with_plain = _props(infra.server_properties(9100, 9093, tmp_path, secure_port=9092,
                                                keystore=tmp_path / "ks.pem",
                                                plain_password="pw"))
    assert with_plain["sasl.enabled.mechanisms"] == "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN"
    assert props["listener.name.sasl_ssl.ssl.keystore.type"] == "PEM"
    assert "ScramLoginModule" in props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert props["inter.broker.listener.name"] == "PLAINTEXT"


def test_certificates_verify_for_127_0_0_1(tmp_path: Path) -> None:
    files = make_server_cert(tmp_path)
    for path in (files.ca_key, files.server_key, files.server_keystore):
        assert path.stat().st_mode & 0o077 == 0  # the owner's only
    ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.server_cert, files.server_key)
    # the chain verifies against the CA and names 127.0.0.1 and localhost
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with server.wrap_socket(conn, server_side=True):
            pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            ctx.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        assert tls.version() is not None
    t.join(5)
    listener.close()


def test_client_settings_name_the_password_file(tmp_path: Path) -> None:
    status = infra.BrokerStatus(True, str(tmp_path), str(tmp_path / "log"), pid=1, port=9092,
                                secure=True, internal_port=9100)
    settings = status.client_settings()
    assert settings["FAILSLOW_KAFKA"] == "127.0.0.1:9092"
    assert settings["FAILSLOW_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert settings["FAILSLOW_KAFKA_SASL_PASSWORD_FILE"].endswith("client.password")
    assert "FAILSLOW_KAFKA_SASL_PASSWORD" not in settings
    plain = infra.BrokerStatus(True, str(tmp_path), str(tmp_path / "log"), pid=1, port=9092)
    assert plain.client_settings() == {"FAILSLOW_KAFKA": "127.0.0.1:9092"}
