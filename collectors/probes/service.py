"""``failslow agent --probes``: the probe endpoint, the runner and the Kafka requests of one
node agent, built from its flags and the ``probes`` settings."""

from __future__ import annotations

import argparse
import socket
from typing import Any

from failslow.collectors.probes.endpoint import ProbeEndpoint, parse_address
from failslow.collectors.probes.gemm import GemmProbe
from failslow.collectors.probes.p2p import P2PProbe, resolver
from failslow.collectors.probes.requests import KafkaRequests
from failslow.collectors.probes.rtt import RttProbe
from failslow.collectors.probes.runner import ProbeRunner, ProbeService, RequestSource
from failslow.settings import get_settings

__all__ = ["add_arguments", "from_args", "build"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--probes", nargs="?", const="", default=None, metavar="JOBS",
                   help="run active validation probes for these jobs (comma-separated, '*': "
                        "all; default $FAILSLOW_PROBE_JOBS), requested on Kafka")
    p.add_argument("--probe-bind", default=None, metavar="HOST:PORT",
                   help="the probe endpoint's address (default $FAILSLOW_PROBE_BIND)")


def build(node: str, source: RequestSource | None, *, jobs: str | None = None,
          bind: str | None = None) -> ProbeService:
    """The service of node ``node``: an endpoint on ``bind`` and a runner with every probe
    kind, for ``jobs`` (None: the settings')."""
    st = get_settings().probes
    host, port = parse_address(bind or st.bind)
    endpoint = ProbeEndpoint(host, port)
    resolve = resolver()
    enabled = st.enabled_jobs() if jobs is None or not jobs.strip() else frozenset(
        j.strip() for j in jobs.split(",") if j.strip())
    runner = ProbeRunner(node, {"gemm": GemmProbe(), "p2p": P2PProbe(node, resolve),
                                "rtt": RttProbe(node, resolve)},
                         jobs=enabled, node_per_minute=st.node_per_minute,
                         job_per_minute=st.job_per_minute)
    return ProbeService(node, source, runner, closers=[endpoint])


def from_args(args: argparse.Namespace, node: str | None) -> ProbeService | None:
    """The service of ``failslow agent --probes`` (None without the flag)."""
    if getattr(args, "probes", None) is None:
        return None
    name = node or socket.gethostname()
    parse_address(args.probe_bind or get_settings().probes.bind)  # bad input before Kafka
    prefix: Any = getattr(args, "topic_prefix", None)
    if prefix is None:
        prefix = get_settings().kafka.topic_prefix
    source = KafkaRequests(getattr(args, "kafka", None) or None, name, topic_prefix=prefix)
    try:
        return build(name, source, jobs=args.probes, bind=args.probe_bind)
    except OSError as e:
        source.close()
        raise ValueError(f"--probe-bind: cannot listen: {e.strerror or e}") from None
