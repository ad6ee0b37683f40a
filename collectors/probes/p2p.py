"""``p2p``: bandwidth between the probed rank's node and its peer's node.

:class:`P2PProbe` is TCP from this agent to the peer node's probe endpoint (:mod:`.endpoint`):
``nbytes`` are sent and timed until the endpoint acknowledges them all; the path is the
hosts' TCP/IP path, which is the job's only where the job runs over TCP sockets on the same
interfaces. Latency is the ``rtt`` probe's (:mod:`.rtt`).

:class:`TorchP2P` is the job's own library: ``torch.distributed`` round trips of ``nbytes``
(gloo on the CPU, NCCL with CUDA events on a GPU) between two ranks of a process group that
both call it. The agent cannot join the training processes' groups, so on the CPU it runs in
probe helpers with a gloo group of their own, one helper per node, placed on the node's
interface and network namespace (:mod:`.gloo`, :class:`~.gloo.GlooP2P`; the example job's
mesh). On a GPU node the same measurement runs in the training processes' collector over a
two-rank group made for the probe (``dist.new_group([rank, peer], backend="nccl")``); verify
it by running two ranks with ``NCCL_P2P_DISABLE=1`` vs. unset and checking that the probed
time follows the path (NVLink vs. PCIe / network).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from failslow.collectors.probes.base import Deadline, ProbeFailed, ProbeTimeout
from failslow.collectors.probes.endpoint import connect, read_answer
from failslow.engine.probes import ProbeRequest
from failslow.settings import get_settings

__all__ = ["P2PProbe", "TorchP2P", "Resolver", "resolver"]

#: the endpoint address of a node
Resolver = Callable[[str], tuple[str, int]]


def resolver(addresses: Mapping[str, tuple[str, int]] | None = None,
             port: int | None = None) -> Resolver:
    """Endpoint of a node: from ``addresses`` (tests, emulated nodes), else the node name at
    the probe port of the settings."""
    table = dict(addresses or {})
    default_port = get_settings().probes.port if port is None else port

    def resolve(node: str) -> tuple[str, int]:
        return table.get(node, (node, default_port))

    return resolve


def _peer(request: ProbeRequest, resolve: Resolver) -> tuple[str, int]:
    if not request.peer_node:
        raise ProbeFailed(f"no node known for peer rank {request.peer}")
    return resolve(request.peer_node)


class P2PProbe:
    """Send ``nbytes`` to the peer node's endpoint ``repeats`` times on one connection; the
    fastest transfer is the link's (module docstring)."""

    kind = "p2p"

    def __init__(self, node: str, resolve: Resolver, nbytes: int | None = None,
                 repeats: int = 3) -> None:
        self.node = node
        self.repeats = repeats
        self.resolve = resolve
        self.nbytes = int(get_settings().probes.p2p_bytes if nbytes is None else nbytes)
        self._payload = bytes(min(self.nbytes, 1 << 20))

    def measure(self, request: ProbeRequest, deadline: Deadline) -> tuple[int, int | None]:
        address = _peer(request, self.resolve)
        head = json.dumps({"op": "sink", "bytes": self.nbytes, "from": self.node}).encode()
        times = []
        try:
            with connect(address, deadline.check("connect")) as sock:
                for _ in range(self.repeats):
                    t0 = time.perf_counter_ns()
                    sock.settimeout(deadline.check("send"))
                    sock.sendall(head + b"\n")
                    view, left = memoryview(self._payload), self.nbytes
                    while left > 0:
                        sock.settimeout(deadline.check("send"))
                        n = min(left, len(view))
                        sock.sendall(view[:n])
                        left -= n
                    sock.settimeout(deadline.check("acknowledgement"))
                    read_answer(sock, b"done\n")
                    times.append(time.perf_counter_ns() - t0)
        except TimeoutError as e:
            raise ProbeTimeout(f"p2p to {address[0]}:{address[1]}: timed out") from e
        except OSError as e:
            raise ProbeFailed(f"p2p to {address[0]}:{address[1]}: {e.strerror or e}") from e
        return min(times), self.nbytes


class TorchP2P:
    """The job's own path: ``torch.distributed`` round trips between ``rank`` and ``peer``
    in ``group`` (NCCL with CUDA events on a GPU, gloo on the CPU): ``nbytes`` sent, one byte
    acknowledged, ``repeats`` times, the fastest kept (timed on the sender). Both ends call
    :meth:`measure` with the same request; ``ranks`` maps the request's job ranks to ranks of
    ``group``'s world (identity by default) and ``tag`` keeps one probe's messages apart from
    another's. On the CPU it runs in the probe helpers of :mod:`.gloo` (their own gloo group,
    not the job's); on a GPU node, in the training processes' collector."""

    kind = "p2p"

    def __init__(self, group: Any, my_rank: int, nbytes: int, repeats: int = 3,
                 ranks: Mapping[int, int] | None = None, tag: int = 0) -> None:
        self.group = group
        self.my_rank = my_rank
        self.nbytes = nbytes
        self.repeats = repeats
        self.ranks = dict(ranks or {})
        self.tag = tag

    def measure(self, request: ProbeRequest, deadline: Deadline) -> tuple[int, int | None]:
        import torch
        import torch.distributed as dist

        if request.peer is None:
            raise ProbeFailed("p2p needs a peer")
        src = self.ranks.get(request.rank, request.rank)
        dst = self.ranks.get(request.peer, request.peer)
        cuda = torch.cuda.is_available() and dist.get_backend(self.group) == "nccl"
        device = "cuda" if cuda else "cpu"
        buf = torch.empty(self.nbytes, dtype=torch.uint8, device=device)
        ack = torch.zeros(1, dtype=torch.uint8, device=device)
        sender = self.my_rank == src
        other = dst if sender else src
        times = []
        for i in range(self.repeats):
            deadline.check(f"round trip {i + 1} of {self.repeats}")
            tag = self.tag * 64 + i
            t0 = time.perf_counter_ns()
            if cuda:
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
            if sender:
                dist.send(buf, other, group=self.group, tag=tag)
                dist.recv(ack, other, group=self.group, tag=tag)
            else:
                dist.recv(buf, other, group=self.group, tag=tag)
                dist.send(ack, other, group=self.group, tag=tag)
            if cuda:
                end.record()
                end.synchronize()
                times.append(int(start.elapsed_time(end) * 1e6))
            else:
                times.append(time.perf_counter_ns() - t0)
        return min(times), self.nbytes
