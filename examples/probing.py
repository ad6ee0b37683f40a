"""Active validation probes beside the example job (issue 17), and what they cost it.

``python -m examples.hybrid_job --out DIR --probes SECONDS`` gives the driver's node agent a
probe service (:class:`failslow.collectors.probes.ProbeService`, what ``failslow agent
--probes`` runs): a probe endpoint on 127.0.0.1 and a runner with the CPU ``gemm`` and the
TCP ``p2p`` probe under the settings' rate limits (``FAILSLOW_PROBE_NODE_PER_MINUTE``,
``FAILSLOW_PROBE_JOB_PER_MINUTE``) and busy-rank refusal (it sees the ranks' ``coll`` rows
as the agent drains them). The requests do not come from Kafka here: every SECONDS the
source asks one, a ``gemm`` on a rank or a ``p2p`` from a rank to its peer in the other DP
replica, in turn over the ranks, as the job-level stage would ask about suspects. The rows
land in the trace directory (``probe.parquet``) for ``failslow analyze``.

``python -m examples.probing --pairs 3 --iters 30`` measures the floor of issue 17 on a
healthy run: the example job with probes off, on and off again, in turn, and the ratio of
their median iteration times (the slowest rank per iteration, the first iterations left out
as warm-up); the off / off ratio is the run-to-run noise the on / off ratio is read against.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from failslow.collectors.probes import GemmProbe, P2PProbe, ProbeEndpoint, ProbeRunner
from failslow.collectors.probes.p2p import resolver
from failslow.collectors.probes.runner import ProbeService
from failslow.engine.probes import ProbeRequest, request_id
from failslow.settings import get_settings

#: iterations left out of the medians (process start-up, first all-reduces)
WARMUP = 5
#: the one node of the example (every rank on 127.0.0.1)
NODE = "local"


class ScheduledRequests:
    """A request source asking one probe every ``every_s`` seconds (module docstring):
    ``gemm`` and ``p2p`` in turn, over the ranks; the peer of a ``p2p`` is the same position
    in the other DP replica (``world // dp`` ranks away)."""

    def __init__(self, job: str, world: int, replica: int, every_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not every_s > 0:
            raise ValueError("--probes: seconds between probes must be positive")
        self.job, self.world, self.replica = job, world, replica
        self.every_s, self.clock = every_s, clock
        self.next = clock() + every_s
        self.asked = 0

    def poll(self) -> list[ProbeRequest]:
        now = self.clock()
        if now < self.next:
            return []
        self.next = now + self.every_s
        i, self.asked = self.asked, self.asked + 1
        rank = (i // 2) % self.world
        probe, peer = ("gemm", None) if i % 2 == 0 else (
            "p2p", (rank + self.replica) % self.world)
        rid = request_id(f"example-{i}", probe, rank, peer, "suspect")
        return [ProbeRequest(rid, self.job, probe, rank, NODE, peer,
                             None if peer is None else NODE,
                             get_settings().probes.deadline_s, "suspect", time.time_ns())]

    def close(self) -> None:
        pass


def service(job: str, world: int, replica: int, every_s: float) -> ProbeService:
    """The node agent's probe service for the example job (one node: 127.0.0.1)."""
    st = get_settings().probes
    endpoint = ProbeEndpoint("127.0.0.1", 0)
    resolve = resolver({NODE: endpoint.address})
    runner = ProbeRunner(NODE, {"gemm": GemmProbe(device="cpu"),
                                "p2p": P2PProbe(NODE, resolve)},
                         jobs={job}, node_per_minute=st.node_per_minute,
                         job_per_minute=st.job_per_minute)
    return ProbeService(NODE, ScheduledRequests(job, world, replica, every_s), runner,
                        closers=[endpoint])


def median_iteration_s(times: dict[Any, list[float]]) -> float:
    """Median over iterations (after :data:`WARMUP`) of the slowest rank's time."""
    per_rank = [t for t in times.values() if t]
    n = min(len(t) for t in per_rank)
    slowest = [max(t[i] for t in per_rank) for i in range(WARMUP, n)]
    return statistics.median(slowest)


def measure(pairs: int, iters: int, every_s: float) -> dict[str, Any]:
    """The example job without, with and again without probes, ``pairs`` times in turn."""
    from examples import hybrid_job

    off: list[float] = []
    on: list[float] = []
    again: list[float] = []
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="failslow-probing-") as tmp:
        for i in range(pairs):
            for j, (probes, into) in enumerate(((None, off), (every_s, on), (None, again))):
                out = Path(tmp) / f"run-{i}-{j}"
                s = hybrid_job.run(out, iters=iters, probes=probes)
                if s["hung"] or s["failed"]:
                    raise RuntimeError(f"the example job did not finish: {s}")
                into.append(median_iteration_s(s["times"]))
                for k, v in (s.get("probes") or {}).items():
                    counts[k] = counts.get(k, 0) + int(v)
    return {"pairs": pairs, "iters": iters, "probe_every_s": every_s,
            "median_iteration_ms_off": [round(x * 1e3, 2) for x in off],
            "median_iteration_ms_on": [round(x * 1e3, 2) for x in on],
            "median_iteration_ms_off_again": [round(x * 1e3, 2) for x in again],
            "iteration_time_ratio": round(statistics.median(on) / statistics.median(off), 4),
            "control_ratio": round(statistics.median(again) / statistics.median(off), 4),
            "pair_ratios": [round(b / a, 4) for a, b in zip(off, on, strict=True)],
            "control_pair_ratios": [round(b / a, 4) for a, b in zip(off, again, strict=True)],
            "probes": counts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--every", type=float, default=1.0,
                    help="seconds between probe requests (the rate limits still apply)")
    a = ap.parse_args(argv)
    print(json.dumps(measure(a.pairs, a.iters, a.every)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
