"""``p2p``: bandwidth between the probed rank's node and its peer's node.

Here (no GPU, no job process to borrow a communicator from) the path is TCP from this agent
to the peer node's probe endpoint (:mod:`.endpoint`): ``nbytes`` are sent and timed until the
endpoint acknowledges them all. Latency is the ``rtt`` probe's (:mod:`.rtt`).

On a real cluster the job's own path is NCCL (or gloo on CPU): the measurement that matters
is a ``torch.distributed`` send/recv between the two ranks over a two-rank group created for
the probe (``dist.new_group([rank, peer], backend="nccl")``), timed with CUDA events around
``dist.send`` / ``dist.recv`` of ``nbytes`` on the GPU. That runs inside the training
processes (the agent cannot join their process group), so it belongs to the in-process
collector: :class:`TorchP2P` is that measurement behind this same interface, for a caller
that owns an initialised process group; verify it on a GPU node by running two ranks with
``NCCL_P2P_DISABLE=1`` vs. unset and checking that the probed time follows the path.
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
    """The job's own path: ``torch.distributed`` send/recv of ``nbytes`` between ``rank`` and
    ``peer`` in ``group`` (NCCL with CUDA events on a GPU, gloo on the CPU), timed on the
    sending rank. Needs an initialised process group and both ranks calling it (the receiver
    with the same request), so it runs in the training processes; not used by the agent."""

    kind = "p2p"

    def __init__(self, group: Any, my_rank: int, nbytes: int) -> None:
        self.group = group
        self.my_rank = my_rank
        self.nbytes = nbytes

    def measure(self, request: ProbeRequest, deadline: Deadline) -> tuple[int, int | None]:
        import torch
        import torch.distributed as dist

        cuda = torch.cuda.is_available() and dist.get_backend(self.group) == "nccl"
        buf = torch.empty(self.nbytes, dtype=torch.uint8, device="cuda" if cuda else "cpu")
        sender = self.my_rank == request.rank
        other = request.peer if sender else request.rank
        if other is None:
            raise ProbeFailed("p2p needs a peer")
        deadline.check("send/recv")
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            (dist.send if sender else dist.recv)(buf, other, group=self.group)
            end.record()
            end.synchronize()
            return int(start.elapsed_time(end) * 1e6), self.nbytes
        t0 = time.perf_counter_ns()
        (dist.send if sender else dist.recv)(buf, other, group=self.group)
        return time.perf_counter_ns() - t0, self.nbytes
