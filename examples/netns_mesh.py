"""Emulated nodes for the example job: network namespaces joined by a full mesh of veth pairs,
one pair per node pair, so that each node pair's traffic has a path of its own that ``tc`` can
slow down (issue 17: a slow hop that timing alone leaves ambiguous).

Node ``i`` (namespace ``fsm<tag><i>``) has the address ``10.78.0.<i+1>/32`` on its first veth
and a ``/32`` route to every other node over their own pair, so gloo (``GLOO_SOCKET_IFNAME``
names the first veth, whose only address is the node's) sends node i -> node j traffic over
the i-j pair only. The slow pair carries a ``tbf`` qdisc on both ends, unlimited (10 Gbit/s)
at set-up; its two ends switch to ``rate_mbit`` through a ``tc -batch`` process per end kept
waiting on a pipe (:meth:`Mesh.trigger`, called by the job's ranks at the fault's iteration,
as :class:`examples.hybrid_job.SlowLink` does). Needs root (``ip netns``); this kernel has no
``dummy`` links and no ``netem``, hence the address on a veth and a rate limit."""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any

from failslow.collectors.probes.gloo import setns

__all__ = ["Mesh", "add_namespaces", "limit", "release", "setns", "sh"]

FAST = "rate 10gbit burst 1mb latency 2s"


def sh(*cmd: str) -> None:
    """Run one ``ip``/``tc`` command; CalledProcessError if it fails."""
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def add_namespaces(names: list[str], created: list[str]) -> None:
    """Create the network namespaces ``names`` (each an emulated node, loopback up),
    appending each to ``created`` as soon as it exists (for :func:`release`)."""
    for ns in names:
        sh("ip", "netns", "add", ns)
        created.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")


class Mesh:
    """``nodes`` namespaces in a full veth mesh (module docstring); ``rank_node[r]``: the node
    of job rank ``r``. ``slow``: the job ranks ``(a, b)`` at the ends of the hop to slow
    down (on different nodes) and its rate, or None for a healthy mesh."""

    def __init__(self, nodes: int, rank_node: list[int],
                 slow: tuple[int, int, float] | None = None) -> None:
        if nodes < 2:
            raise ValueError("a mesh needs two nodes at least")
        self.nodes, self.rank_node = nodes, list(rank_node)
        tag = f"{os.getpid() % 100000}"
        self.ns = [f"fsm{tag}{i}" for i in range(nodes)]
        self.created: list[str] = []
        self.a, self.b, self.rate_mbit = slow if slow else (-1, -1, 0.0)
        if slow and rank_node[self.a] == rank_node[self.b]:
            raise ValueError(f"ranks {self.a} and {self.b} are on the same node")
        self._if = {(i, j): f"v{tag}_{i}_{j}" for i in range(nodes) for j in range(nodes)
                    if i != j}
        self.shapers: list[subprocess.Popen[str]] = []

    def address(self, node: int) -> str:
        return f"10.78.0.{node + 1}"

    def primary(self, node: int) -> str:
        """The veth holding node ``node``'s address (gloo's interface)."""
        return self._if[(node, 1 if node == 0 else 0)]

    def node_name(self, rank: int) -> str:
        return self.ns[self.rank_node[rank]]

    @property
    def slow_pair(self) -> tuple[int, int] | None:
        """The nodes at the ends of the slow hop."""
        if self.a < 0:
            return None
        return self.rank_node[self.a], self.rank_node[self.b]

    def __enter__(self) -> Mesh:
        try:
            add_namespaces(self.ns, self.created)
            for i in range(self.nodes):
                for j in range(i + 1, self.nodes):
                    sh("ip", "link", "add", self._if[(i, j)], "netns", self.ns[i], "type",
                        "veth", "peer", "name", self._if[(j, i)], "netns", self.ns[j])
            for (i, _j), ifn in self._if.items():
                sh("ip", "-n", self.ns[i], "link", "set", ifn, "up")
            for i in range(self.nodes):
                sh("ip", "-n", self.ns[i], "addr", "add", f"{self.address(i)}/32", "dev",
                    self.primary(i))
                for j in range(self.nodes):
                    if j != i:
                        sh("ip", "-n", self.ns[i], "route", "add", f"{self.address(j)}/32",
                            "dev", self._if[(i, j)], "src", self.address(i))
            pair = self.slow_pair
            if pair is not None:
                for i, j in (pair, pair[::-1]):
                    sh("tc", "-n", self.ns[i], "qdisc", "add", "dev", self._if[(i, j)],
                        "root", "tbf", *FAST.split())
                    self.shapers.append(subprocess.Popen(
                        ["tc", "-n", self.ns[i], "-force", "-batch", "-"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, bufsize=1))
        except BaseException:
            self.__exit__()
            raise
        return self

    def spec(self) -> dict[str, Any]:
        """What the ranks need (examples.hybrid_job): namespace and interface per rank, the
        rendezvous address (rank 0's node)."""
        ranks = {r: (self.ns[n], self.primary(n)) for r, n in enumerate(self.rank_node)}
        return {"ranks": ranks, "master": self.address(self.rank_node[0])}

    def side_of(self, rank: int) -> int:
        """Which end of the slow hop rank ``rank`` shapes (0: ``a``'s, 1: ``b``'s)."""
        return 0 if rank == self.a else 1

    def trigger(self, side: int) -> None:
        """Limit end ``side`` of the slow hop to ``rate_mbit``; RuntimeError if tc did not."""
        pair = self.slow_pair
        if pair is None:
            return
        i, j = pair if side == 0 else pair[::-1]
        limit(self.shapers[side], self._if[(i, j)], self.rate_mbit)

    def slow_down(self) -> None:
        for side in (0, 1):
            self.trigger(side)

    def __exit__(self, *exc: object) -> None:
        release(self.shapers, self.created)


def limit(shaper: subprocess.Popen[str], dev: str, rate_mbit: float) -> None:
    """Switch ``dev``'s ``tbf`` qdisc to ``rate_mbit`` through its waiting ``tc -batch``
    process and check that the kernel took it; RuntimeError if not."""
    assert shaper.stdin is not None and shaper.stdout is not None
    shaper.stdin.write(f"qdisc change dev {dev} root tbf rate {rate_mbit:g}mbit "
                       f"burst 16kb latency 2s\nqdisc show dev {dev}\n")
    shaper.stdin.flush()
    line = shaper.stdout.readline()
    if "tbf" not in line or "rate 10Gbit" in line:
        raise RuntimeError(f"tc did not limit {dev}: {line.strip()!r}")


def release(shapers: list[subprocess.Popen[str]], namespaces: list[str]) -> None:
    """Stop the ``tc`` processes and delete the namespaces (their veth pairs go with them)."""
    for sh in shapers:
        with contextlib.suppress(OSError):
            if sh.stdin:
                sh.stdin.close()
        try:
            sh.wait(timeout=5)
        except subprocess.TimeoutExpired:
            sh.kill()
            sh.wait()
        if sh.stdout:
            sh.stdout.close()
    shapers.clear()
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
    namespaces.clear()
