"""``rtt``: zero-payload round trips to the peer node's probe endpoint (MEGATRACE's probes of
a link suspected in a hang: a healthy path answers in microseconds, a broken one not at all).
The median of ``count`` pings on one connection; on an RDMA fabric the same question is a
zero-byte RDMA write on the job's queue pair (native/), not built here."""

from __future__ import annotations

import json
import statistics
import time

from failslow.collectors.probes.base import Deadline, ProbeFailed, ProbeTimeout
from failslow.collectors.probes.endpoint import connect, read_answer
from failslow.collectors.probes.p2p import Resolver, _peer
from failslow.engine.probes import ProbeRequest

__all__ = ["RttProbe"]


class RttProbe:
    """``count`` pings, median round trip (module docstring)."""

    kind = "rtt"

    def __init__(self, node: str, resolve: Resolver, count: int = 5) -> None:
        self.node = node
        self.resolve = resolve
        self.count = count

    def measure(self, request: ProbeRequest, deadline: Deadline) -> tuple[int, int | None]:
        address = _peer(request, self.resolve)
        ping = json.dumps({"op": "ping", "bytes": 0, "from": self.node}).encode() + b"\n"
        times = []
        try:
            with connect(address, deadline.check("connect")) as sock:
                for _ in range(self.count):
                    sock.settimeout(deadline.check("ping"))
                    t0 = time.perf_counter_ns()
                    sock.sendall(ping)
                    read_answer(sock, b"pong\n")
                    times.append(time.perf_counter_ns() - t0)
        except TimeoutError as e:
            raise ProbeTimeout(f"rtt to {address[0]}:{address[1]}: no answer") from e
        except OSError as e:
            raise ProbeFailed(f"rtt to {address[0]}:{address[1]}: {e.strerror or e}") from e
        return int(statistics.median(times)), 0
