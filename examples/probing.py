"""Active validation probes beside the example job (issue 17), and what they cost it.

``python -m examples.hybrid_job --out DIR --probes SECONDS`` gives the driver's node agent a
probe service (:class:`failslow.collectors.probes.ProbeService`, what ``failslow agent
--probes`` runs): the CPU ``gemm`` and a ``p2p`` probe (TCP to a local endpoint; with
``--mesh``, gloo round trips between helpers in the emulated nodes, :mod:`failslow.collectors.
probes.gloo`) under the settings' rate limits and busy-rank refusal (it sees the ranks'
``coll`` rows as the agent drains them), asked on a timer (:class:`ScheduledRequests`).
``--probes engine``: the requests come from the live engine (:mod:`examples.engine_loop`),
about the suspects of open anomalies only. The rows land in the trace directory
(``probe.parquet``).

``python -m examples.probing --pairs 3 --iters 30`` measures the 1 % floor on a healthy run:
the example job with probes off, on and off again (each kind of run in each place of the
triple in turn), the ratio of their median iteration times (the slowest rank per iteration,
the first iterations left out) beside the off / off control ratio, and the driver's extra
CPU. ``--case``: the slow-hop and healthy-pair floors (:func:`validation_case`); ``--cost``:
the training time lost to forced probes against the reported cost (:func:`probe_cost_check`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from failslow.collectors.probes import GemmProbe, P2PProbe, Probe, ProbeEndpoint, ProbeRunner
from failslow.collectors.probes.gloo import GlooP2P, Place
from failslow.collectors.probes.p2p import resolver
from failslow.collectors.probes.runner import ProbeService, RequestSource
from failslow.engine.probes import ProbeRequest, request_id
from failslow.settings import get_settings

#: iterations left out of the medians (process start-up, first all-reduces)
WARMUP = 5
#: the one node of the example (every rank on 127.0.0.1)
NODE = "local"


#: payload of one gloo p2p round trip between two emulated nodes (a 20 Mbit/s hop: ~0.1 s)
P2P_BYTES = 256 << 10


class ScheduledRequests:
    """A request source asking one probe every ``every_s`` seconds (module docstring):
    ``gemm`` and ``p2p`` in turn, over the ranks; the peer of a ``p2p`` is the same position
    in the other DP replica (``world // dp`` ranks away). ``node_of(rank)``: its node;
    ``first_s``: seconds to the first request (default ``every_s``); ``deadline_s``: of each
    request (default: the settings')."""

    def __init__(self, job: str, world: int, replica: int, every_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 node_of: Callable[[int], str] | None = None,
                 first_s: float | None = None, deadline_s: float | None = None) -> None:
        if not every_s > 0:
            raise ValueError("--probes: seconds between probes must be positive")
        self.job, self.world, self.replica = job, world, replica
        self.every_s, self.clock = every_s, clock
        self.node_of = node_of or (lambda rank: NODE)
        self.next = clock() + (every_s if first_s is None else first_s)
        self.deadline_s = get_settings().probes.deadline_s if deadline_s is None else deadline_s
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
        return [ProbeRequest(rid, self.job, probe, rank, self.node_of(rank), peer,
                             None if peer is None else self.node_of(peer),
                             self.deadline_s, "suspect", time.time_ns())]

    def close(self) -> None:
        pass


def _probes(link: Any, port: int) -> tuple[dict[str, Probe], list[Any], str, frozenset[str]]:
    """The probes of the example's node agent: CPU ``gemm``; ``p2p`` over gloo between
    helpers in the emulated nodes of a mesh job (:mod:`failslow.collectors.probes.gloo`,
    the job's own path), else over TCP to a probe endpoint on 127.0.0.1. Returns the probes,
    what to close, the agent's node and every node it serves."""
    from examples.netns_mesh import Mesh

    gemm = GemmProbe(device="cpu")
    if isinstance(link, Mesh):
        places = {link.ns[i]: Place(link.ns[i], link.primary(i), link.address(i))
                  for i in range(link.nodes)}
        p2p = GlooP2P(places, port, nbytes=P2P_BYTES)
        return {"gemm": gemm, "p2p": p2p}, [p2p], link.ns[0], frozenset(places)
    endpoint = ProbeEndpoint("127.0.0.1", 0)
    nodes = frozenset({NODE, *(link.ns if link is not None else ())})
    resolve = resolver({n: endpoint.address for n in nodes})
    return {"gemm": gemm, "p2p": P2PProbe(NODE, resolve)}, [endpoint], NODE, nodes


#: forcing probes (:func:`forcing`): the rate limits of the example's runner, per minute
#: (None: the settings'), and whether the busy-rank rule is waived
FORCING: dict[str, Any] = {"per_minute": None, "ignore_busy": False}


@contextlib.contextmanager
def forcing(per_minute: float, ignore_busy: bool) -> Iterator[None]:
    """Within: the example's runners take ``per_minute`` probes a minute and, with
    ``ignore_busy``, run them whether or not their ranks are inside a collective (the ranks
    of this job seldom are outside one, a pending pipeline ``isend`` included)."""
    from examples import probing  # this module, also when it runs as ``__main__``

    probing.FORCING.update(per_minute=per_minute, ignore_busy=ignore_busy)
    try:
        yield
    finally:
        probing.FORCING.update(per_minute=None, ignore_busy=False)


def _runner(node: str, probes: dict[str, Probe], job: str, nodes: frozenset[str]
            ) -> ProbeRunner:
    st = get_settings().probes
    node_rate, job_rate, burst = st.node_per_minute, st.job_per_minute, max(3.0, len(nodes))
    if FORCING["per_minute"] is not None:
        node_rate = job_rate = float(FORCING["per_minute"])
        burst = max(burst, node_rate / 10)
    # one request round of the engine may name a hop per node of a ring: a burst that
    # small would refuse its last ones (and the engine asks each suspect once)
    return ProbeRunner(node, probes, jobs={job}, node_per_minute=node_rate,
                       job_per_minute=job_rate, burst=burst,
                       busy=(lambda rank: False) if FORCING["ignore_busy"] else None)


def service(job: str, world: int, replica: int, every_s: float, link: Any = None,
            port: int = 0) -> ProbeService:
    """The node agent's probe service for the example job, asked on a timer
    (:class:`ScheduledRequests`)."""
    probes, closers, node, nodes = _probes(link, port)
    node_of = None
    if link is not None and hasattr(link, "node_name"):
        node_of = link.node_name
    source = ScheduledRequests(job, world, replica, every_s, node_of=node_of)
    return ProbeService(node, source, _runner(node, probes, job, nodes), closers=closers,
                        nodes=nodes)


#: forced probes start this long after the probe service (the ranks' start-up is over);
#: each may wait this long for its ranks to leave their collectives (they seldom are out of
#: one: a pending pipeline isend counts), so that a refused one holds the next back briefly
FORCE_AFTER_S = 2.5
FORCED_DEADLINE_S = 0.5


class Sources:
    """Several request sources as one (the engine's, and forced probes beside it)."""

    def __init__(self, *sources: RequestSource) -> None:
        self.sources = sources

    def poll(self) -> list[ProbeRequest]:
        return [r for s in self.sources for r in s.poll()]

    def close(self) -> None:
        for s in self.sources:
            s.close()


def engine_service(job: str, source: RequestSource, link: Any = None, port: int = 0,
                   force_every_s: float | None = None, world: int = 8,
                   replica: int = 4) -> ProbeService:
    """The node agent's probe service for the example job, asked by the live engine
    (:class:`examples.engine_loop.LiveEngine`): only suspects of open anomalies; with
    ``force_every_s``, also probes forced on a timer (:class:`ScheduledRequests`), which
    answer no anomaly (their cost is measured, their result must raise nothing)."""
    probes, closers, node, nodes = _probes(link, port)
    if force_every_s is not None:
        node_of = link.node_name if link is not None and hasattr(link, "node_name") else None
        source = Sources(source, ScheduledRequests(job, world, replica, force_every_s,
                                                   node_of=node_of, first_s=FORCE_AFTER_S,
                                                   deadline_s=FORCED_DEADLINE_S))
    return ProbeService(node, source, _runner(node, probes, job, nodes), closers=closers,
                        nodes=nodes)


def median_iteration_s(times: dict[Any, list[float]]) -> float:
    """Median over iterations (after :data:`WARMUP`) of the slowest rank's time."""
    per_rank = [t for t in times.values() if t]
    n = min(len(t) for t in per_rank)
    slowest = [max(t[i] for t in per_rank) for i in range(WARMUP, n)]
    return statistics.median(slowest)


def measure(pairs: int, iters: int, every_s: float | None, mesh: bool = False,
            engine_off: bool = False) -> dict[str, Any]:
    """The example job without, with and again without probes, ``pairs`` times in turn.
    ``every_s`` None: the probes the live engine asks for; the "off" runs then run the live
    engine too, with the job's probes off (the engine's own CPU is no probe cost), unless
    ``engine_off`` (then it runs in the "on" runs only and its CPU counts)."""
    from examples import hybrid_job

    off: list[float] = []
    on: list[float] = []
    again: list[float] = []
    cpu: dict[str, list[float]] = {"off": [], "on": [], "ranks": []}
    counts: dict[str, int] = {}
    anomalies = 0
    mode: float | str = "engine" if every_s is None else every_s
    base = every_s is None and not engine_off
    runs: list[tuple[float | str | None, list[float], str]] = [
        (None, off, "off"), (mode, on, "on"), (None, again, "again")]
    with tempfile.TemporaryDirectory(prefix="failslow-probing-") as tmp:
        for i in range(pairs):
            # each kind of run takes each place of the triple in turn (drifts cancel)
            for j, (probes, into, name) in enumerate(runs[i % 3:] + runs[:i % 3]):
                out = Path(tmp) / f"run-{i}-{j}"
                s = hybrid_job.run(out, iters=iters, probes=probes, mesh=mesh,
                                   engine=base and probes is None)
                if s["hung"] or s["failed"]:
                    raise RuntimeError(f"the example job did not finish: {s}")
                into.append(median_iteration_s(s["times"]))
                if name in cpu:
                    cpu[name].append(s["driver_cpu_s"])
                if name == "off":
                    cpu["ranks"].append(s["ranks_cpu_s"])
                for k, v in (s.get("probes") or {}).items():
                    counts[k] = counts.get(k, 0) + int(v)
                if s.get("diagnosis"):
                    anomalies += len(s["diagnosis"]["anomalies"])
    # the driver's extra CPU (the engine, the probe service) against the ranks' CPU
    extra_cpu = [(b - a) / r for a, b, r in zip(cpu["off"], cpu["on"], cpu["ranks"],
                                                 strict=True)]
    return {"pairs": pairs, "iters": iters, "mode": "engine" if every_s is None else "timer",
            "probe_every_s": every_s, "mesh": mesh, "engine_in_off_runs": base,
            "median_iteration_ms_off": [round(x * 1e3, 2) for x in off],
            "median_iteration_ms_on": [round(x * 1e3, 2) for x in on],
            "median_iteration_ms_off_again": [round(x * 1e3, 2) for x in again],
            "iteration_time_ratio": round(statistics.median(on) / statistics.median(off), 4),
            "control_ratio": round(statistics.median(again) / statistics.median(off), 4),
            "pair_ratios": [round(b / a, 4) for a, b in zip(off, on, strict=True)],
            "control_pair_ratios": [round(b / a, 4) for a, b in zip(off, again, strict=True)],
            "probes": counts, "engine_anomalies": anomalies,
            "driver_cpu_s_off": cpu["off"], "driver_cpu_s_on": cpu["on"],
            "ranks_cpu_s": cpu["ranks"],
            "extra_cpu_share": round(statistics.median(extra_cpu), 4)}


def iterations(summary: Mapping[str, Any]) -> list[tuple[int, int, float]]:
    """Per iteration of a run: (first rank's start, last rank's end) in wall ns and the
    slowest rank's time in seconds."""
    times, starts = summary["times"], summary["starts"]
    n = min(len(v) for v in times.values())
    return [(min(starts[r][i] for r in starts),
             max(starts[r][i] + int(times[r][i] * 1e9) for r in starts),
             max(times[r][i] for r in times)) for i in range(n)]


#: measurements a probe of the example makes per row: GEMM warm-up + 5 (its median is
#: ``elapsed_ns``), gloo p2p 3 round trips (the fastest is ``elapsed_ns``)
MEASUREMENTS = {"gemm": 6, "p2p": 3}


def measuring_s(rows: list[Mapping[str, Any]]) -> float:
    """The time the probes that ran kept the CPU or link busy: ``elapsed_ns`` times the
    measurements each makes (:data:`MEASUREMENTS`)."""
    return sum(int(r["elapsed_ns"] or 0) * MEASUREMENTS.get(r["probe"], 1)
               for r in rows if r["status"] != "skipped") / 1e9


def probed_iterations(summary: Mapping[str, Any], rows: list[Mapping[str, Any]]) -> list[int]:
    """Iterations (after :data:`WARMUP`) during which a probe was measuring: the end of its
    row (``t``), back by its measurements (:data:`MEASUREMENTS`) and 10 ms; the wait for an
    idle rank before it costs nothing."""
    spans = [(int(r["t"]) - int(r["elapsed_ns"] or 0) * MEASUREMENTS.get(r["probe"], 1)
              - 10_000_000, int(r["t"])) for r in rows if r["status"] != "skipped"]
    its = iterations(summary)
    return [i for i in range(WARMUP, len(its))
            if any(a < its[i][1] and b > its[i][0] for a, b in spans)]


def iteration_loss_s(summary: Mapping[str, Any], chosen: list[int]) -> float:
    """Training time lost in the ``chosen`` iterations: their times above the median of the
    others (after :data:`WARMUP`)."""
    its = iterations(summary)
    others = [its[i][2] for i in range(WARMUP, len(its)) if i not in chosen]
    base = statistics.median(others)
    return sum(its[i][2] - base for i in chosen)


def noise_bound_s(control: Mapping[str, Any], n: int, draws: int = 400, seed: int = 0) -> float:
    """What ``n`` iterations of the control run (no probe) lose by noise alone: the largest
    :func:`iteration_loss_s` of ``draws`` random sets of ``n`` iterations."""
    import random

    rng = random.Random(seed)
    its = list(range(WARMUP, len(iterations(control))))
    if n <= 0 or n >= len(its):
        return 0.0
    return max(iteration_loss_s(control, rng.sample(its, n)) for _ in range(draws))


def probe_cost_check(root: Path, iters: int = 120, every_s: float = 0.25) -> dict[str, Any]:
    """Issue 17's cost test in the example job (the four-node mesh, the live engine): a run
    with a probe forced every ``every_s`` (gemm and gloo p2p in turn; rate limits raised to
    120 a minute and the busy-rank rule waived, so that they run during training: the worst
    case) and a control run
    without; the training time lost in the iterations a probe overlapped, against the cost
    the diagnosis reports for those probes (``probe_cost``: ``training_lost_s``) and the
    noise bound of as many iterations of the control run."""
    import pyarrow.parquet as pq

    from examples import hybrid_job
    from failslow.engine.probes import probe_cost

    with forcing(120.0, ignore_busy=True):
        probed = hybrid_job.run(root / "probed", iters=iters, mesh=True, probes="engine",
                                force_every=every_s)
    control = hybrid_job.run(root / "control", iters=iters, mesh=True, probes="engine")
    path = root / "probed" / "probe.parquet"
    rows = pq.read_table(path).to_pylist() if path.exists() else []
    chosen = probed_iterations(probed, rows)
    cost = probe_cost(rows)
    return {"iters": iters, "probe_every_s": every_s, "probes": probed["probes"],
            "probed_iterations": len(chosen),
            "loss_s": round(iteration_loss_s(probed, chosen), 4) if chosen else 0.0,
            "training_lost_s": cost["training_lost_s"], "probe_s": cost["probe_s"],
            "measuring_s": round(measuring_s(rows), 4),
            "noise_bound_s": round(noise_bound_s(control, len(chosen)), 4),
            "control_probes": control["probes"]}


#: slowdowns below this are scheduling noise of 8 ranks on 2 shared cores
#: (tests/integration/native/test_example_job.py)
NOISE = 2.5
#: the slow-hop case: ring hop 3 -> 4 of the world all-reduce (nodes 1 and 2, a node pair
#: nothing else crosses) limited to 20 Mbit/s from iteration 12 of 30
SLOW_HOP = "3:4:20:12"
CASE_ITERS = 30


def timing_only(out: Path) -> list[dict[str, Any]]:
    """``failslow analyze`` of a trace without its ``probe`` rows: what timing alone says."""
    from failslow.engine.offline import run_analyzer
    from failslow.tracedir import TraceDir

    td = TraceDir(out)
    tables = {k: td.read(k) for k in td.kinds if k != "probe"}
    return [a.to_dict() for a in run_analyzer(td.meta(), tables).diagnosis().anomalies]


def validation_case(root: Path, slow_hop: str = SLOW_HOP, iters: int = CASE_ITERS
                    ) -> dict[str, Any]:
    """Issue 17's floors in the example job (the four-node mesh, probes asked by the live
    engine): a slow ring hop that timing alone leaves unpinned (``link: null``), named after
    one probe round; a healthy mesh run (twice as long) with a probe forced every 0.25 s
    (rate limits raised, the busy-rank rule kept) raises nothing."""
    import pyarrow.parquet as pq

    from examples import hybrid_job

    a, b = (int(v) for v in slow_hop.split(":")[:2])
    hop = sorted((a, b))
    slow = hybrid_job.run(root / "slow-hop", iters=iters, slow_hop=slow_hop, probes="engine")
    before = timing_only(root / "slow-hop")
    found = (slow["diagnosis"] or {}).get("anomalies", [])
    named = [x for x in found if x["link"] == hop]
    unpinned = [x for x in before if x["cause"] in ("communication", "mixed")
                and x["link"] is None and x.get("link_candidates")]
    with forcing(120.0, ignore_busy=False):
        healthy = hybrid_job.run(root / "healthy", iters=2 * iters, mesh=True,
                                 probes="engine", force_every=0.25)
    path = root / "healthy" / "probe.parquet"
    forced = pq.read_table(path).to_pylist() if path.exists() else []
    h_found = (healthy["diagnosis"] or {}).get("anomalies", [])
    cost = [x["probe_cost"] for x in named if x.get("probe_cost")]
    return {
        "slow_link_cases": 1,
        "link_named_without_probe": int(any(x["link"] == hop for x in before)),
        "link_unpinned_without_probe": int(bool(unpinned)),
        "link_candidates": max((len(x["link_candidates"]) for x in unpinned), default=0),
        "link_named_with_probe": int(bool(named)),
        "named_by": sorted({(x.get("probe") or {}).get("link_named_by") or "" for x in named}),
        "probes": slow["probes"],
        "probe_cost": cost[0] if cost else None,
        "healthy_anomalies": sum((x["slowdown"] or 0) >= NOISE for x in h_found),
        "healthy_noise_anomalies": sum((x["slowdown"] or 0) < NOISE for x in h_found),
        "healthy_probes": healthy["probes"],
        "healthy_pairs_probed": sum(r["probe"] == "p2p" and r["status"] == "ok"
                                    for r in forced),
        # a probe that named a link on the healthy mesh would be a false alarm (the engine
        # may ask about a noise anomaly; its answer must not name anything)
        "healthy_links_named_by_probe": sum(
            (x.get("probe") or {}).get("link_named_by") is not None for x in h_found),
        "wall_s": round(slow["wall_s"] + healthy["wall_s"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--every", type=float, default=None,
                    help="seconds between probe requests, asked on a timer (the rate limits "
                    "still apply); default: those the live engine asks for")
    ap.add_argument("--mesh", action="store_true",
                    help="the four-node mesh job (examples/netns_mesh.py; root)")
    ap.add_argument("--cost", action="store_true",
                    help="instead: training time lost to forced probes against the cost the "
                    "diagnosis reports (root)")
    ap.add_argument("--case", action="store_true",
                    help="instead: the slow-hop and healthy validation case "
                    "(failslow bench validation's example_job figures; root)")
    ap.add_argument("--engine-off", action="store_true",
                    help="the off runs without the live engine (its CPU then counts)")
    a = ap.parse_args(argv)
    if a.case or a.cost:
        with tempfile.TemporaryDirectory(prefix="failslow-case-") as tmp:
            fn = validation_case if a.case else probe_cost_check
            print(json.dumps(fn(Path(tmp))))
        return 0
    print(json.dumps(measure(a.pairs, a.iters, a.every, a.mesh, a.engine_off)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
