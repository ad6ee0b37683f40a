"""``failslow bench validation``: active validation probes (issue 17) on 127.0.0.1.

The held-out generator's 16-rank DP ring over four nodes without queue telemetry
(:mod:`failslow.bench.heldout`), one trace per cross-node hop made 4x slower from iteration
12 on, and one healthy trace, each diagnosed by the engine: every hop of the ring waits alike,
so timing leaves the link unknown (``link: null``, four candidate hops). Every node's probe
endpoint and runner run in this process; the endpoints shape the slow hop (healthy: 200 MB/s;
slow: 20 MB/s and 20 ms more per transfer). The open anomalies' probe requests run on the
nodes of their senders and their rows go back into the engine.

Figures: ``link_named_without_probe`` / ``link_named_with_probe`` (slow-hop traces whose
diagnosis names the right link before and after the probes), ``healthy_anomalies`` (anomalies
in the healthy trace with probes on), the probes' cost as the diagnosis reports it, and the
CPU overhead: a training-like loop's iteration time while probe rounds run back to back beside
it (the worst case; the rate limits allow a few per minute), against the same loop without
probes in the same run (``iteration_time_ratio``), and the process CPU seconds of the rounds.

``example_job``: the same floors in the example job (examples/probing.py ``--case``: 8 gloo
ranks on four emulated nodes, a slow ring hop shaped with netns + tc, probes asked by the live
engine and run over gloo between helpers in the two nodes), when this is a checkout with the
example extra (torch) and root, at ``--scale`` 0.5 or more; otherwise the reason it did not
run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from failslow.bench import heldout as hg
from failslow.collectors.probes import LinkShape, P2PProbe, ProbeEndpoint, ProbeRunner
from failslow.collectors.probes.p2p import resolver
from failslow.collectors.probes.runner import rows_table
from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import JobAnalyzer
from failslow.engine.offline import run_analyzer
from failslow.engine.probes import ProbeRequester, apply_probe_evidence
from failslow.events import JobMeta
from failslow.tracedir import TraceDir

HEALTHY = LinkShape(rate_bps=200e6)
SLOW = LinkShape(delay_s=0.02, rate_bps=20e6)
NBYTES = 1 << 20
#: the cross-node hops of the 16-rank DP ring (four nodes of four ranks)
HOPS = ((3, 4), (7, 8), (11, 12), (15, 0))


def _spec(hop: tuple[int, int] | None, seed: int) -> hg.Spec:
    faults = [] if hop is None else [hg.Fault("communication", hop[0], peer=hop[1], start=12,
                                               factor=4.0)]
    return hg.Spec(tp=1, pp=1, dp=16, microbatches=1, gpus_per_node=4, iterations=30,
                   dp_bytes=512 << 20, link_rows=False, seed=seed, faults=faults)


def _diagnose(hop: tuple[int, int] | None, seed: int, root: Path) -> tuple[JobMeta,
                                                                           JobAnalyzer]:
    """The engine's diagnosis of the held-out ring trace with ``hop`` slow (None: healthy)."""
    path = root / (f"hop-{hop[0]}-{hop[1]}" if hop else "healthy")
    hg.write(_spec(hop, seed), path)
    td = TraceDir(path)
    meta = td.meta()
    return meta, run_analyzer(meta, {k: td.read(k) for k in td.kinds})


class Fabric:
    """One endpoint and one runner per node of ``meta``; :meth:`slow` shapes one hop."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.endpoints = {n: ProbeEndpoint(default=HEALTHY, lifetime_s=600)
                          for n in sorted(set(meta.nodes.values()))}
        resolve = resolver({n: e.address for n, e in self.endpoints.items()})
        self.runners = {n: ProbeRunner(n, {"p2p": P2PProbe(n, resolve, NBYTES)},
                                       jobs={"*"}, node_per_minute=6000.0,
                                       job_per_minute=6000.0) for n in self.endpoints}

    def slow(self, hop: tuple[int, int] | None) -> None:
        for e in self.endpoints.values():
            for n in self.endpoints:
                e.shape(n, None)
        if hop is not None:
            self.endpoints[self.meta.nodes[hop[1]]].shape(self.meta.nodes[hop[0]], SLOW)

    def probe(self, meta: JobMeta, anomalies: list[Anomaly]) -> list[dict[str, Any]]:
        """One probe round: the requests for ``anomalies``, each on its node's runner."""
        requests = ProbeRequester(meta, frozenset({"*"})).requests(anomalies)
        return [self.runners[r.node].run(r) for r in requests]

    def close(self) -> None:
        for e in self.endpoints.values():
            e.close()


#: a training-like loop on one core, in a process of its own (as the job is to the agent):
#: prints its iteration times in seconds
LOOP = """
import json, sys, time
import numpy as np
x = np.random.default_rng(0).random((160, 160), dtype=np.float32)
out = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    for _ in range(4):
        np.einsum("ij,jk->ik", x, x, optimize=False)
    out.append(time.perf_counter() - t0)
print(json.dumps(out))
"""


def _loop(iterations: int) -> list[float]:
    done = subprocess.run([sys.executable, "-c", LOOP, str(iterations)], capture_output=True,
                          text=True, check=True, timeout=600)
    return [float(x) for x in json.loads(done.stdout)]


def _bench_validation(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="failslow-validation-") as tmp:
        root = Path(tmp)
        cases = [(hop, *_diagnose(hop, args.seed + 7, root)) for hop in HOPS]
        healthy_meta, healthy = _diagnose(None, args.seed + 7, root)
        fabric = Fabric(cases[0][1])
        try:
            return _figures(args, fabric, cases, healthy_meta, healthy)
        finally:
            fabric.close()


def _figures(args: argparse.Namespace, fabric: Fabric,
             cases: list[tuple[tuple[int, int], JobMeta, JobAnalyzer]],
             healthy_meta: JobMeta, healthy: JobAnalyzer) -> dict[str, Any]:
    def right(analyzer: JobAnalyzer, hop: tuple[int, int]) -> bool:
        return any(a.link == sorted(hop) for a in analyzer.diagnosis().anomalies)

    without = sum(right(an, hop) for hop, _, an in cases)
    unpinned = [(meta, an.diagnosis().anomalies) for _, meta, an in cases]
    named, cost_s, lost_s, probes = 0, 0.0, 0.0, 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for hop, meta, an in cases:
        fabric.slow(hop)
        rows = fabric.probe(meta, an.diagnosis().anomalies)
        probes += len(rows)
        an.update({"probe": rows_table(rows)} if rows else {})
        named += right(an, hop)
        for a in an.diagnosis().anomalies:
            cost = a.extra.get("probe_cost") or {}
            cost_s += cost.get("probe_s", 0.0)
            lost_s += cost.get("training_lost_s", 0.0)
    probe_cpu = time.process_time() - cpu0
    probe_wall = time.perf_counter() - wall0
    fabric.slow(None)
    rows = fabric.probe(healthy_meta, healthy.diagnosis().anomalies)
    if rows:
        healthy.update({"probe": rows_table(rows)})
    healthy_anomalies = len(healthy.diagnosis().anomalies)
    # the unpinned anomalies again, probed on a healthy fabric (false alarms): nothing named
    false_named = 0
    for meta, anomalies in unpinned:
        copies = [Anomaly.from_dict(a.to_dict()) for a in anomalies]
        rows_again = fabric.probe(meta, copies)
        for a in copies:
            apply_probe_evidence(a, rows_again)
            false_named += a.link is not None
    iterations = max(50, int(300 * args.scale))
    off = _loop(iterations)
    stop = threading.Event()

    def rounds() -> None:  # probe rounds back to back while the loop runs: the worst case
        while not stop.is_set():
            for meta, anomalies in unpinned:
                fabric.probe(meta, anomalies)

    prober = threading.Thread(target=rounds, daemon=True)
    ran = sum(sum(r.counts.values()) for r in fabric.runners.values())
    prober.start()
    on = _loop(iterations)
    stop.set()
    prober.join()
    ran = sum(sum(r.counts.values()) for r in fabric.runners.values()) - ran
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    return {
        "slow_link_cases": len(cases),
        "link_named_without_probe": int(without),
        "link_named_with_probe": int(named),
        "probes": probes,
        "healthy_anomalies": healthy_anomalies,
        "healthy_probes": len(rows),
        "links_named_on_healthy_fabric": false_named,
        "probe_s_reported": round(cost_s, 4),
        "training_lost_s_reported": round(lost_s, 4),
        "probe_rounds_cpu_s": round(probe_cpu, 4),
        "probe_rounds_wall_s": round(probe_wall, 4),
        "iteration_ms_probes_off": round(off_ms, 3),
        "iteration_ms_probes_on": round(on_ms, 3),
        "iteration_time_ratio": round(on_ms / off_ms, 4),
        "probes_during_loop": ran,
    }


def _example_job() -> dict[str, Any]:
    """``python -m examples.probing --case`` in this checkout, or why it cannot run."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "examples" / "probing.py").exists():
        return {"skipped": "no examples/ next to the package (not a checkout)"}
    if importlib.util.find_spec("torch") is None:
        return {"skipped": "the example extra (torch) is not installed"}
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return {"skipped": "network namespaces and tc need root and iproute2"}
    done = subprocess.run([sys.executable, "-m", "examples.probing", "--case"], cwd=root,
                          capture_output=True, text=True, timeout=600, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


#: below this ``--scale`` the example job (8 processes, about 40 s) is left out
EXAMPLE_MIN_SCALE = 0.5


def _bench_validation_all(args: argparse.Namespace) -> dict[str, Any]:
    out = _bench_validation(args)
    scale = float(getattr(args, "scale", 1.0) or 1.0)
    out["example_job"] = _example_job() if scale >= EXAMPLE_MIN_SCALE else {
        "skipped": f"--scale {scale:g} < {EXAMPLE_MIN_SCALE:g}: the example job is left out "
                   "(tests/integration/native/test_example_engine_probes.py runs it)"}
    return out


BENCHMARKS = {"validation": _bench_validation_all}
