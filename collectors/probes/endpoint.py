"""The probe endpoint every agent runs: peers' ``p2p`` payloads are sunk, ``rtt`` pings
answered.

Protocol (TCP, one connection per probe, any number of requests on it): the client sends one
JSON line ``{"op": "ping" | "sink", "bytes": N, "from": NODE}``; for ``sink`` it then sends
``N`` bytes. The endpoint answers ``pong\\n`` / ``done\\n`` once it has everything. A
:class:`LinkShape` per sending node (or a default one) adds a delay before the answer and a
rate limit on the payload: a slow link for tests, shaped in the endpoint rather than with
tc/netem or an environment variable.
"""

from __future__ import annotations

import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LinkShape", "ProbeEndpoint", "parse_address"]

log = logging.getLogger(__name__)

#: largest header line accepted
MAX_HEADER = 4096
CHUNK = 256 * 1024


@dataclass(frozen=True)
class LinkShape:
    """Shaping of the traffic from one peer: ``delay_s`` before each answer, payload read at
    most ``rate_bps`` bytes per second (None: as fast as it comes)."""

    delay_s: float = 0.0
    rate_bps: float | None = None


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``; ValueError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"probe endpoint address {text!r}: expected HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        self.connection.settimeout(self.server.io_timeout_s)
        try:
            while True:
                line = self.rfile.readline(MAX_HEADER)
                if not line:
                    return
                head = json.loads(line)
                shape = self.server.shape_of(str(head.get("from", "")))
                if head.get("op") == "sink":
                    self._sink(int(head.get("bytes", 0)), shape)
                    answer = b"done\n"
                elif head.get("op") == "ping":
                    answer = b"pong\n"
                else:
                    return
                if shape.delay_s > 0:
                    time.sleep(shape.delay_s)
                self.server.served += 1  # counted before the peer can see the answer
                self.wfile.write(answer)
                self.wfile.flush()
        except (OSError, ValueError) as e:
            log.debug("probe endpoint: connection ended: %s", e)

    def _sink(self, n: int, shape: LinkShape) -> None:
        got, t0 = 0, time.monotonic()
        while got < n:
            chunk = self.rfile.read1(min(CHUNK, n - got))
            if not chunk:
                raise OSError("peer closed mid-payload")
            got += len(chunk)
            if shape.rate_bps:
                ahead = got / shape.rate_bps - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(ahead)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], shapes: Mapping[str, LinkShape],
                 default: LinkShape, io_timeout_s: float) -> None:
        self.shapes = dict(shapes)
        self.default = default
        self.io_timeout_s = io_timeout_s
        self.served = 0
        super().__init__(address, _Handler)

    def shape_of(self, node: str) -> LinkShape:
        return self.shapes.get(node, self.default)


class ProbeEndpoint:
    """The endpoint on ``host:port`` (port 0: any free port; :attr:`address` tells which),
    served by daemon threads until :meth:`close` (or ``lifetime_s``, when given).

    ``shapes``: per sending node, the :class:`LinkShape` of its traffic; ``default``: of
    everyone else."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 shapes: Mapping[str, LinkShape] | None = None,
                 default: LinkShape | None = None, io_timeout_s: float = 10.0,
                 lifetime_s: float | None = None) -> None:
        self._server = _Server((host, port), shapes or {}, default or LinkShape(),
                               io_timeout_s)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.1},
                                        name="failslow-probe-endpoint")
        self._thread.start()
        self._timer: threading.Timer | None = None
        if lifetime_s is not None:
            self._timer = threading.Timer(lifetime_s, self.close)
            self._timer.daemon = True
            self._timer.start()
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def served(self) -> int:
        """Requests answered so far."""
        return self._server.served

    def shape(self, node: str, shape: LinkShape | None) -> None:
        """Set (None: remove) the shaping of ``node``'s traffic."""
        if shape is None:
            self._server.shapes.pop(node, None)
        else:
            self._server.shapes[node] = shape

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ProbeEndpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
    """A TCP connection to an endpoint (Nagle off: pings are tiny)."""
    sock = socket.create_connection(address, timeout=max(timeout_s, 0.001))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_answer(sock: socket.socket, expected: bytes) -> None:
    """Read one answer line; OSError when it is not ``expected``."""
    buf = b""
    while not buf.endswith(b"\n"):
        part = sock.recv(64)
        if not part:
            raise OSError("endpoint closed the connection")
        buf += part
        if len(buf) > 64:
            break
    if buf != expected:
        raise OSError(f"unexpected answer {buf[:32]!r}")
