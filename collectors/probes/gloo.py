"""``p2p`` over gloo on the job's network path, without touching the job's process groups.

The agent cannot join the training processes' groups, and a probe must not disturb them. So
the probe service starts one helper process per node it serves, placed where that node's
ranks are (its network namespace and gloo interface, when the nodes are emulated), and the
helpers form a small gloo group of their own (their own rendezvous, their own ranks: one per
node). A ``p2p`` request from rank ``r`` to ``peer`` becomes a :class:`~.p2p.TorchP2P` round
trip between the helpers of their two nodes: the same library, interface, routes and ``tc``
qdiscs as the job's traffic between those nodes. The driver side, :class:`GlooP2P`, has the
:class:`~.base.Probe` interface; it talks to the helpers over pipes, so the runner's thread
never blocks on gloo beyond the request's deadline (a helper still busy with a timed-out
probe makes the next one fail, saying so, until it answers).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from failslow.collectors.probes.base import Deadline, ProbeFailed, ProbeTimeout
from failslow.engine.probes import ProbeRequest

__all__ = ["GlooP2P", "Place", "setns"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Place:
    """Where a node's helper runs: its network namespace (None: this one), the interface
    gloo binds (None: gloo's default) and the node's address (the rendezvous of the first
    node is there)."""

    netns: str | None
    ifname: str | None
    address: str


def setns(name: str) -> None:
    """Move this process into the network namespace ``/run/netns/NAME`` (a node emulated on
    this host)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise OSError(ctypes.get_errno(), f"setns({name})")
    finally:
        os.close(fd)


def _helper(index: int, world: int, place: Place, master: str, port: int, timeout_s: float,
            nbytes: int, repeats: int, conn: Any) -> None:
    """A node's helper: joins the helpers' gloo group, then runs round trips on command
    (``(request, ranks, tag)``; None: stop), answering ``("ok", ns)`` or ``("error", why)``."""
    try:
        if place.netns:
            setns(place.netns)
        if place.ifname:  # gloo reads its interface from the environment (written here)
            os.environ["GLOO_SOCKET_IFNAME"] = place.ifname
        import torch
        import torch.distributed as dist

        from failslow.collectors.probes.p2p import TorchP2P

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=index,
                                world_size=world, timeout=timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - told to the driver, which fails the probes
        conn.send(("error", f"helper of node {index} did not start: {type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            cmd = conn.recv()
        except EOFError:
            break
        if cmd is None:
            break
        request, ranks, tag = cmd
        try:
            probe = TorchP2P(None, index, nbytes, repeats, ranks, tag)
            elapsed, _ = probe.measure(request, Deadline(timeout_s))
            conn.send(("ok", elapsed))
        except Exception as e:  # noqa: BLE001 - one failed probe, the helper goes on
            conn.send(("error", f"{type(e).__name__}: {e}"))
    dist.destroy_process_group()


class _Helper:
    def __init__(self, proc: Any, conn: Any) -> None:
        self.proc, self.conn = proc, conn
        self.ready = False
        self.error: str | None = None
        self.owed = 0  # answers of commands still to come

    def collect(self, timeout: float = 0.0) -> Any:
        """One answer if one comes within ``timeout`` (None otherwise)."""
        if not self.conn.poll(max(timeout, 0.0)):
            return None
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.error = self.error or "helper exited"
            return None
        if status == "ready":
            self.ready = True
            return None
        if status == "error" and not self.ready:
            self.error = str(value)
            return None
        self.owed -= 1
        return status, value


class GlooP2P:
    """The ``p2p`` probe between the helpers of the request's two nodes (module docstring).
    ``places``: node name -> :class:`Place`; ``port``: the helpers' rendezvous port on the
    first node's address; ``nbytes`` per transfer, ``repeats`` round trips (the fastest
    kept); ``timeout_s``: gloo's own timeout in the helpers."""

    kind = "p2p"

    def __init__(self, places: Mapping[str, Place], port: int, nbytes: int = 256 << 10,
                 repeats: int = 3, timeout_s: float = 10.0) -> None:
        import multiprocessing as mp

        if len(places) < 2:
            raise ValueError("gloo p2p probes need two nodes at least")
        self.nodes = list(places)
        self.index = {n: i for i, n in enumerate(self.nodes)}
        self.nbytes = nbytes
        self._tags = itertools.count(1)
        # fork: started before the probe service's threads exist, imports shared
        ctx = mp.get_context("fork")
        master = places[self.nodes[0]].address
        self.helpers: list[_Helper] = []
        for i, node in enumerate(self.nodes):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_helper, daemon=True, name=f"failslow-probe-{node}",
                               args=(i, len(self.nodes), places[node], master, port,
                                     timeout_s, nbytes, repeats, child))
            proc.start()
            child.close()
            self.helpers.append(_Helper(proc, parent))

    def _ready(self, helpers: list[_Helper], deadline: Deadline) -> None:
        for h in helpers:
            while not h.ready and h.error is None:
                h.collect(deadline.check("helper start"))
            if h.error is not None:
                raise ProbeFailed(h.error)

    def measure(self, request: ProbeRequest, deadline: Deadline) -> tuple[int, int | None]:
        src = self.index.get(request.node)
        dst = self.index.get(request.peer_node or "")
        if src is None or dst is None:
            raise ProbeFailed(f"no probe helper on node {request.node!r} or "
                              f"{request.peer_node!r}")
        if src == dst:
            raise ProbeFailed(f"ranks {request.rank} and {request.peer} share node "
                              f"{request.node}: no network path between them")
        pair = [self.helpers[src], self.helpers[dst]]
        self._ready(pair, deadline)
        for h in pair:  # answers of timed-out probes
            while h.owed and h.collect() is not None:
                pass
            if h.owed:
                raise ProbeFailed(f"the helper of node {self.nodes[self.helpers.index(h)]} "
                                  "is still in an earlier probe")
        tag = next(self._tags)
        ranks = {request.rank: src, int(request.peer or 0): dst}
        for h in (pair[1], pair[0]):  # receiver first: it waits in recv
            h.owed += 1
            h.conn.send((request, ranks, tag))
        answers = []
        for h in pair:
            got = None
            while got is None:
                left = deadline.left()
                if left <= 0:
                    raise ProbeTimeout(f"gloo p2p {request.node} -> {request.peer_node}: "
                                       "no answer within the deadline")
                got = h.collect(left)
                if got is None and h.error is not None:
                    raise ProbeFailed(h.error)
            answers.append(got)
        for status, value in answers:
            if status != "ok":
                raise ProbeFailed(f"gloo p2p {request.node} -> {request.peer_node}: {value}")
        return int(answers[0][1]), self.nbytes

    def close(self) -> None:
        for h in self.helpers:
            with contextlib.suppress(OSError, ValueError):
                h.conn.send(None)
        for h in self.helpers:
            h.proc.join(5)
            if h.proc.is_alive():
                h.proc.kill()
                h.proc.join()
            h.conn.close()
