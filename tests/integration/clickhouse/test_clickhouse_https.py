"""ClickHouse over HTTPS with a user and a password from a secret file (issue 15, 3): the
settings reach clickhouse-connect as intended. A real local HTTPS server (a certificate
signed by a CA made for the test) records what the client sends; it answers as a
ClickHouse server that refuses the login would, so the test also sees the one-line error."""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from failslow.infra.tls import TlsFiles, make_server_cert
from failslow.stream import clickhouse as ch

SECRET = "Ch-pa55-known-value-42"


class HttpsServer:
    def __init__(self, files: TlsFiles) -> None:
        self.requests: list[dict[str, str]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                size = int(self.headers.get("Content-Length", 0) or 0)
                if size:
                    self.rfile.read(size)
                seen.append(dict(self.headers.items()))
                body = (b"Code: 516. DB::Exception: reader: Authentication failed: password "
                        b"is incorrect. (AUTHENTICATION_FAILED)")
                self.send_response(401)
                self.send_header("X-ClickHouse-Exception-Code", "516")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(files.server_cert, files.server_key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def https(tmp_path: Path) -> Iterator[tuple[HttpsServer, TlsFiles]]:
    files = make_server_cert(tmp_path / "tls")
    server = HttpsServer(files)
    try:
        yield server, files
    finally:
        server.server.shutdown()
        server.server.server_close()


def _secret_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ca: Path | None) -> None:
    (tmp_path / "ch.password").write_text(SECRET + "\n")
    monkeypatch.setenv("FAILSLOW_CLICKHOUSE_USER", "reader")
    monkeypatch.setenv("FAILSLOW_CLICKHOUSE_PASSWORD_FILE", str(tmp_path / "ch.password"))
    monkeypatch.delenv("FAILSLOW_CLICKHOUSE_PASSWORD", raising=False)
    if ca is not None:
        monkeypatch.setenv("FAILSLOW_CLICKHOUSE_CA", str(ca))


def test_options_carry_user_password_file_and_ca(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    ca = make_server_cert(tmp_path / "tls").ca_cert
    _secret_env(monkeypatch, tmp_path, ca)
    opts = ch.server_options("https://ch.example:8443/")
    assert opts["username"] == "reader" and opts["password"] == SECRET
    assert opts["secure"] is True and opts["verify"] is True and opts["ca_cert"] == str(ca)
    assert opts["connect_timeout"] <= 10
    # a URL that names its own user and password keeps them; plain HTTP has no TLS options
    opts = ch.server_options("http://other:pw@ch.example:8123")
    assert "username" not in opts and "password" not in opts and "ca_cert" not in opts
    monkeypatch.setenv("FAILSLOW_CLICKHOUSE_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="FAILSLOW_CLICKHOUSE_CA"):
        ch.server_options("https://ch.example:8443")


def test_https_with_the_ca_sends_the_credentials(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path,
                                                 https: tuple[HttpsServer, TlsFiles]) -> None:
    server, files = https
    _secret_env(monkeypatch, tmp_path, files.ca_cert)
    with pytest.raises(Exception) as caught:  # the server refuses the login
        ch.connect(tmp_path, server.url)
    assert server.requests, "the TLS handshake with the test CA failed"
    auth = server.requests[0].get("Authorization", "")
    assert base64.b64decode(auth.removeprefix("Basic ")).decode() == f"reader:{SECRET}"
    line = ch.describe_error(caught.value, server.url)
    assert "authentication failed" in line and SECRET not in line and "\n" not in line


def test_https_without_the_ca_fails_tls_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path,
                                                    https: tuple[HttpsServer, TlsFiles]) -> None:
    server, _ = https
    _secret_env(monkeypatch, tmp_path, None)  # the system's CAs do not know the test CA
    env = {**os.environ, "FAILSLOW_CLICKHOUSE_USER": "reader",
           "FAILSLOW_CLICKHOUSE_PASSWORD_FILE": str(tmp_path / "ch.password")}
    env.pop("FAILSLOW_CLICKHOUSE_CA", None)
    out = subprocess.run([sys.executable, "-m", "failslow", "query", "jobs", "--clickhouse",
                          server.url], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "TLS failed" in lines[0] and server.url in lines[0], out.stderr
    assert not server.requests and SECRET not in out.stderr


def test_unreachable_server_is_one_line_within_seconds(tmp_path: Path) -> None:
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://reader:{SECRET}@127.0.0.1:{port}"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "failslow", "query", "jobs", "--clickhouse",
                          url], capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - started
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "not reachable" in lines[0]
    assert SECRET not in out.stderr
    assert seconds < 10  # issue 18: reported in under 10 s
