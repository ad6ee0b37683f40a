"""Active validation probes run by the node agent (issue 17; docs/events-v2.md ``probe``).

One module per probe kind, one interface (:class:`~failslow.collectors.probes.base.Probe`):
a probe takes a :class:`~failslow.engine.probes.ProbeRequest` and a deadline and returns one
``probe`` row, whatever happens.

- :mod:`.gemm`: a fixed-size matrix multiply timed a few times (median): numpy on the CPU, or
  ``torch.cuda`` with CUDA events on the rank's GPU when CUDA is present;
- :mod:`.p2p`: a bandwidth probe, ``bytes`` sent to the peer node's probe endpoint over TCP,
  or ``torch.distributed`` round trips (:class:`~.p2p.TorchP2P`);
- :mod:`.gloo`: those round trips over gloo between helper processes of the two nodes, in a
  gloo group of their own (the job's library and network path, not its process groups);
- :mod:`.rtt`: a zero-payload round trip to the peer node's endpoint (MEGATRACE's probes);
- :mod:`.endpoint`: the endpoint every agent runs (sinks payloads, answers pings; a per-peer
  delay or rate limit shapes a slow link in tests);
- :mod:`.runner`: :class:`~.runner.ProbeRunner` (per-job enable set, rate limits per node and
  per job, never inside a collective) and :class:`~.runner.ProbeService` (the agent's side:
  requests in, ``probe`` rows out);
- :mod:`.requests`: requests over Kafka (:data:`~failslow.engine.probes.PROBE_REQUESTS_TOPIC`),
  or from an embedded stream processor's transport.
"""

from failslow.collectors.probes.base import Probe, make_row
from failslow.collectors.probes.endpoint import LinkShape, ProbeEndpoint
from failslow.collectors.probes.gemm import GemmProbe
from failslow.collectors.probes.p2p import P2PProbe
from failslow.collectors.probes.rtt import RttProbe
from failslow.collectors.probes.runner import BusyTracker, ProbeRunner, ProbeService, TokenBucket

__all__ = ["Probe", "make_row", "LinkShape", "ProbeEndpoint", "GemmProbe", "P2PProbe",
           "RttProbe", "BusyTracker", "ProbeRunner", "ProbeService", "TokenBucket"]
