"""Active validation probes on the held-out generator's cluster (issue 17 on issue 14's suite).

:class:`GeneratedCluster` answers the engine's probe requests (:mod:`failslow.engine.probes`)
the way the node agents of the generated job would (:mod:`failslow.collectors.probes`), by
measuring the generated hardware, never by reading the truth or the fault list:

* ``p2p``: ``bytes`` sent from the probed rank to its peer over the generator's model of that
  path (:meth:`~failslow.bench.heldout.Executor.path`: base bandwidth and latency over the
  slow-down the generator applies to the path in the iteration under way, the one model the
  trace's transfers are timed by), each transfer times the generator's transfer noise;
  ``repeats`` transfers on one connection, the fastest kept, as :class:`~failslow.collectors.
  probes.p2p.P2PProbe`;
* ``gemm``: a GEMM on the rank's GPU under the generator's compute model
  (:meth:`~failslow.bench.heldout.Executor.gpu_factor`: node bursts, slow GPUs; a pass-only
  slow-down does not slow a GEMM of no pass) times its compute noise; warm-up plus
  ``repeats`` runs, the median kept, as :class:`~failslow.collectors.probes.gemm.GemmProbe`;
* ``rtt``: the path's round trip (twice its latency), or a timeout once a hang stalled it.

As the agent's runner does: one probe at a time per node (a request waits for its node), the
probed ranks must be outside a collective (the executor's operations; waiting counts against the
deadline, a rank busy until the deadline is ``skipped``), a measurement past the deadline is a
``timeout``, the baseline is the median of the same probe's earlier runs (a ``gemm`` without
any: its node's other GPUs'), optional token-bucket rate limits per node and job (off by
default: the held-out traces last seconds, a real job hours). Rows have the contract's columns
(docs/events-v2.md), their ``t`` on the probing node's clock.

:func:`analyze_with_probes` replays a generated trace through the engine with probes enabled
for its job: requests returned at a window are answered here and their rows join a later
window (the first whose time reaches the probe's end; rows answered after the trace's last
window are applied after it, without advancing time).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.bench import heldout as hg
from failslow.bench.heldout_score import figures, score_job
from failslow.bench.heldout_score import floors as score_floors
from failslow.comms import infer_comms
from failslow.detectors.base import EventBatch
from failslow.diagnosis import Diagnosis
from failslow.engine.analyzer import JobAnalyzer, JobConfig
from failslow.engine.offline import is_post_mortem
from failslow.engine.probes import ProbeRequest
from failslow.engine.registry import KINDS
from failslow.engine.runner import steps
from failslow.replay import DEFAULT_WINDOW_NS, replay
from failslow.settings import get_settings
from failslow.tracedir import TraceDir

__all__ = ["GeneratedCluster", "ProbeRun", "analyze_with_probes", "probe_table"]

#: a healthy GPU's time for the probe's GEMM, ns
GEMM_NS = 200_000
#: the transfer-noise scale of a p2p transfer (the generator's point-to-point messages')
P2P_NOISE = 0.05
#: the detail of a probe refused because its rank stayed inside a collective (the runner's)
BUSY_DETAIL = "rank inside a collective until the deadline"


@dataclass
class _Bucket:
    """A token bucket on simulated time (seconds)."""

    rate: float
    capacity: float
    tokens: float
    at: float = 0.0

    def take(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class ProbeRun:
    """What the cluster did: requests answered, rows by status, the probes' own seconds."""

    requests: int = 0
    status: dict[str, int] = field(default_factory=lambda: {
        "ok": 0, "timeout": 0, "failed": 0, "skipped": 0})
    probe_s: float = 0.0


class GeneratedCluster:
    """The generated job's nodes, GPUs and paths as node agents meet them (module docstring).
    ``keep``: what :func:`failslow.bench.heldout.generate` kept of the job; ``limits``:
    ``(node_per_minute, job_per_minute, burst)`` or None (no rate limit)."""

    def __init__(self, spec: hg.Spec, keep: dict[str, Any], *, p2p_bytes: int | None = None,
                 repeats: int = 3, gemm_repeats: int = 5,
                 limits: tuple[float, float, float] | None = None, seed: int = 0) -> None:
        self.spec = spec
        self.lay: hg.Layout = keep["layout"]
        self.ex: hg.Executor = keep["executor"]
        self.obs = keep["obs"]
        self.p2p_bytes = int(get_settings().probes.p2p_bytes if p2p_bytes is None
                             else p2p_bytes)
        self.repeats, self.gemm_repeats = repeats, gemm_repeats
        # the generator's noise model with draws of its own (the trace's are untouched)
        self.noise = hg.Noise(spec, spec.seed + 1009 + seed)
        self.limits = limits
        self.buckets: dict[str, _Bucket] = {}
        self.free: dict[str, float] = {}  # node -> true time its agent is free again
        self.history: dict[tuple[str, str, int, int | None], list[int]] = {}
        self.stats = ProbeRun()
        self._busy: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._ops: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        starts = np.where(np.isnan(self.ex.iter_start), np.inf, self.ex.iter_start)
        self._it_start = starts.min(axis=1)  # true time each iteration began (first rank)

    # -- the generated job's time ------------------------------------------------------------

    def true_ns(self, rank: int, t_obs: int) -> float:
        """The true time at which ``rank``'s node clock reads ``t_obs``."""
        t = float(t_obs)
        for _ in range(3):  # the clock's offset and drift are small: a fixed point
            t -= float(self.obs(np.array([rank]), np.array([t]))[0]) - t_obs
        return t

    def observed(self, rank: int, t_true: float) -> int:
        return int(self.obs(np.array([rank]), np.array([t_true]))[0])

    def iteration(self, t_true: float) -> int:
        """The iteration under way at ``t_true`` (the last one after the job's end)."""
        k = int(np.searchsorted(self._it_start, t_true, side="right")) - 1
        return min(max(k, 0), self.spec.iterations - 1)

    def _busy_of(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``rank``'s time inside collectives: merged (enter, end) intervals, true ns (an
        operation that never ended lasts forever)."""
        if rank not in self._busy:
            if self._ops is None:
                ops = self.ex.ops
                self._ops = (np.array([o.rank for o in ops], np.int64),
                             np.array([o.enter for o in ops]),
                             np.array([np.inf if o.end is None else o.end for o in ops]))
            ranks, enter, end = self._ops
            sel = ranks == rank
            order = np.argsort(enter[sel], kind="stable")
            lo, hi = enter[sel][order], end[sel][order]
            if len(lo):
                reach = np.maximum.accumulate(hi)
                new = np.concatenate([[True], lo[1:] > reach[:-1]])
                starts = lo[new]
                idx = np.flatnonzero(new)
                ends = np.append(reach[idx[1:] - 1], reach[-1]) if len(idx) > 1 else reach[-1:]
            else:
                starts = ends = np.zeros(0)
            self._busy[rank] = (starts, ends)
        return self._busy[rank]

    def _idle_from(self, rank: int, t: float) -> float:
        starts, ends = self._busy_of(rank)
        k = int(np.searchsorted(starts, t, side="right")) - 1
        return float(ends[k]) if k >= 0 and t < ends[k] else t

    def idle_at(self, ranks: Iterable[int], t: float, until: float) -> float | None:
        """The first time from ``t`` at which none of ``ranks`` is inside a collective, None
        if not before ``until``."""
        ranks = list(ranks)
        for _ in range(10_000):
            nxt = max(self._idle_from(r, t) for r in ranks)
            if nxt > until:
                return None
            if nxt == t:
                return t
            t = nxt
        return None

    # -- probes -----------------------------------------------------------------------------

    def _limited(self, request: ProbeRequest, now_s: float) -> str | None:
        if self.limits is None:
            return None
        node_rate, job_rate, burst = self.limits
        for key, rate, what in ((f"node:{request.node}", node_rate, f"node {request.node}"),
                                (f"job:{request.job}", job_rate, f"job {request.job}")):
            b = self.buckets.setdefault(key, _Bucket(rate / 60, burst, burst, now_s))
            if not b.take(now_s):
                return f"rate limit of {what}"
        return None

    def _baseline(self, node: str, request: ProbeRequest) -> int | None:
        own = self.history.get((node, request.probe, request.rank, request.peer))
        if own:
            return int(statistics.median(own))
        if request.probe == "gemm":
            peers = [h[-1] for (n, kind, rank, _), h in self.history.items()
                     if n == node and kind == "gemm" and rank != request.rank and h]
            if peers:
                return int(statistics.median(peers))
        return None

    def _measure(self, request: ProbeRequest, t: float) -> tuple[float, float | None,
                                                                  int | None, str | None]:
        """(own time, measured time or None, bytes, why not) of one probe started at true
        time ``t``; the measurement follows the generator's models at that time."""
        s = self.spec
        it = self.iteration(t)
        if request.probe == "gemm":
            slow = self.ex.gpu_factor(request.rank, it, None)
            times = [GEMM_NS * slow * float(self.noise.factor(s.jitter, s.jitter_scale))
                     for _ in range(self.gemm_repeats + 1)]
            return sum(times), float(statistics.median(times[1:])), None, None
        assert request.peer is not None
        bw, lat = self.ex.path(request.rank, request.peer, it)
        if request.probe == "rtt":
            stalled = any(o.end is None and o.start is not None and o.rank == request.rank
                          and o.start <= t for o in self.ex.ops if o.h3)
            if stalled:
                return float("inf"), None, None, "no answer from the peer"
            one = 2 * lat * float(self.noise.factor(s.comm_jitter, P2P_NOISE))
            return 2 * lat + one, one, None, None
        times = [(lat + self.p2p_bytes / bw) * float(self.noise.factor(s.comm_jitter, P2P_NOISE))
                 for _ in range(self.repeats)]
        return 2 * lat + sum(times), min(times), self.p2p_bytes, None

    def answer(self, request: ProbeRequest, now_obs: int) -> dict[str, Any]:
        """The ``probe`` row of ``request``, asked at ``now_obs`` (the engine's window time)."""
        self.stats.requests += 1
        node = request.node or self.lay.node_names[self.lay.node[request.rank]]
        asked = self.true_ns(request.rank, now_obs)
        begin = max(asked, self.free.get(node, asked))
        deadline = begin + request.deadline_s * 1e9

        def row(status: str, end: float, elapsed: float | None = None,
                nbytes: int | None = None, baseline: int | None = None,
                detail: str | None = None) -> dict[str, Any]:
            self.free[node] = end
            self.stats.status[status] += 1
            self.stats.probe_s += (end - begin) / 1e9
            return {"job": request.job, "t": self.observed(request.rank, end), "node": node,
                    "request": request.id, "probe": request.probe, "rank": request.rank,
                    "peer": request.peer, "status": status, "duration_ns": int(end - begin),
                    "elapsed_ns": None if elapsed is None else int(elapsed),
                    "bytes": nbytes, "baseline_ns": baseline, "detail": detail}

        ranks = [request.rank] + ([] if request.peer is None else [request.peer])
        start = self.idle_at(ranks, begin, deadline)
        if start is None:
            return row("skipped", deadline, detail=BUSY_DETAIL)
        limited = self._limited(request, start / 1e9)
        if limited is not None:
            return row("skipped", start, detail=limited)
        baseline = self._baseline(node, request)
        own, elapsed, nbytes, why = self._measure(request, start)
        if elapsed is None or start + own > deadline:
            return row("timeout", deadline,
                       detail=why or f"deadline reached during {request.probe}")
        runs = self.history.setdefault((node, request.probe, request.rank, request.peer), [])
        runs.append(int(elapsed))
        return row("ok", start + own, elapsed, nbytes, baseline)

    def answer_all(self, requests: Iterable[ProbeRequest], now_obs: int
                   ) -> list[dict[str, Any]]:
        return [self.answer(r, now_obs) for r in requests]


def probe_table(rows: list[dict[str, Any]]) -> pa.Table:
    """``probe`` rows as the contract's table."""
    return events.conform(pa.Table.from_pylist(rows, schema=events.SCHEMAS["probe"]), "probe")


def analyze_with_probes(trace_dir: str | Path, cluster: GeneratedCluster,
                        window_ns: int = DEFAULT_WINDOW_NS) -> Diagnosis:
    """Diagnose a generated trace with probes enabled for its job, ``cluster`` answering
    them (module docstring); no what-if analysis."""
    td = TraceDir(trace_dir)
    meta = td.meta()
    tables = {k: td.read(k) for k in td.kinds if k in KINDS}
    if not meta.comms and "coll" in tables:
        meta = dataclasses.replace(meta, comms=infer_comms(tables["coll"], meta))
    analyzer = JobAnalyzer(meta, JobConfig(probe_jobs=frozenset({meta.job})))
    pending: list[dict[str, Any]] = []
    last = [0]

    def windows() -> Iterator[tuple[int, EventBatch]]:
        for t, batch in replay(tables, window_ns):
            last[0] = t
            due = [r for r in pending if r["t"] <= t]
            if due:
                pending[:] = [r for r in pending if r["t"] > t]
                batch = {**batch, "probe": probe_table(due)}
            yield t, batch

    for step in steps(analyzer, windows(), window_ns, post_mortem=is_post_mortem(trace_dir)):
        asked = step.update.probe_requests + step.tick.probe_requests
        if asked:
            pending += cluster.answer_all(asked, step.now)
    for _ in range(3):  # answered after the trace's last window: applied at its time
        if not pending:
            break
        rows, pending[:] = list(pending), []
        for out in (analyzer.update({"probe": probe_table(rows)}), analyzer.on_tick(last[0])):
            pending += cluster.answer_all(out.probe_requests, last[0])
    return analyzer.diagnosis()


# ---------------------------------------------------------------------------------------------
# the held-out suite with probes (failslow.bench.heldout_suite)

#: The floors of the figures with probes: figure -> (comparison, floor).
PROBE_FLOORS: dict[str, tuple[str, float]] = {
    "link_accuracy_with_probes": (">=", 0.9),
    "exact_rank_accuracy_with_probes": (">=", 0.95),
    "healthy_probe_anomalies": ("<=", 0.0),
}
#: the suite's figures also reported with probes, under ``<name>_with_probes``
ALSO = ("slow_f1", "slow_false_positives", "cause_accuracy", "exact_rank_accuracy",
        "link_faults_found", "link_accuracy", "stage_accuracy", "latency_median_iterations",
        "latency_max_iterations", "latency_max_stage_compute_iterations",
        "latency_max_dp_link_256_iterations", "hang_f1")

def run_probed(spec: hg.Spec, keep: dict[str, Any], path: Path, units: list[dict[str, Any]]
               ) -> dict[str, Any]:
    """One generated job diagnosed with probes on and scored (:func:`score_job`): its
    scored faults, false positives and anomaly count, plus the probes run, skipped and their
    own seconds, and the links they named."""
    t0 = time.perf_counter()
    cluster = GeneratedCluster(spec, keep)
    diag = analyze_with_probes(path, cluster).to_dict()
    anomalies = list(diag.get("anomalies") or [])
    st = cluster.stats
    return {**score_job(units, anomalies),
            "probes_run": st.status["ok"] + st.status["timeout"] + st.status["failed"],
            "probes_skipped": st.status["skipped"], "probe_status": dict(st.status),
            "probe_cost_s": round(st.probe_s, 6),
            "named_by_probe": [a.get("link") for a in anomalies
                               if (a.get("probe") or {}).get("link_named_by")],
            "seconds": round(time.perf_counter() - t0, 2)}


def summary(results: list[dict[str, Any]], families: list[str]) -> dict[str, Any]:
    """The suite's figures with probes, their floors, and per family the ones probes
    change."""
    probed = [{**r, **r["with_probes"]} for r in results if "with_probes" in r]
    base = figures(probed)
    fig: dict[str, Any] = {f"{k}_with_probes": base.get(k) for k in ALSO}
    fig["healthy_probe_anomalies"] = base["clean_run_anomalies"]
    fig["probes_run"] = sum(r["with_probes"]["probes_run"] for r in probed)
    fig["probes_skipped"] = sum(r["with_probes"]["probes_skipped"] for r in probed)
    fig["probe_cost_s"] = round(sum(r["with_probes"]["probe_cost_s"] for r in probed), 6)
    fig["jobs_probed"] = sum(bool(r["with_probes"]["probes_run"]) for r in probed)
    floors = score_floors(fig, PROBE_FLOORS)
    per = {}
    for fam in families:
        f = figures(probed, fam)
        per[fam] = {k: f.get(k) for k in ("link_accuracy", "exact_rank_accuracy",
                                          "cause_accuracy", "slow_f1", "clean_run_anomalies")}
    return {"figures_with_probes": fig, "floors_with_probes": floors,
            "all_probe_floors_pass": all(v["pass"] for v in floors.values()),
            "families_with_probes": per}


def line(p: dict[str, Any]) -> str:
    """A job's outcome with probes, appended to its line: what changed."""
    parts = [f"probes {p['probes_run']}" + (f"+{p['probes_skipped']} skipped"
                                           if p["probes_skipped"] else "")]
    for f in p["faults"]:
        if f["found"] and f.get("link") is not None:
            parts.append(f"link {f['got']['link']}" + ("" if f["link"] else " WRONG"))
        if f["found"] and f.get("ranks") is False:
            parts.append(f"ranks {f['got']['ranks']} WRONG")
    parts += [f"FP {a['kind']}/{a['cause']}{a['ranks']}" for a in p["false_positives"]]
    return "  | with probes: " + ", ".join(parts) if p["probes_run"] or p["probes_skipped"] \
        or p["false_positives"] else ""


def table(out: dict[str, Any]) -> list[str]:
    """The figures with probes and their floors, as text lines."""
    fig = out["figures_with_probes"]
    lines = ["  with probes (issue 17: active validation on the generated cluster; the figures "
             "above are without probes):",
             f"  {'figure':34s} {'value':>8s}  floor    result"]
    for key, f in out["floors_with_probes"].items():
        v = f["value"]
        lines.append(f"  {key:34s} {'-' if v is None else f'{v:.3f}':>8s}  {f['op']} "
                     f"{f['floor']:<5g} {'pass' if f['pass'] else 'FAIL'}")
    lines.append(f"  also with probes: slow F1 {fig['slow_f1_with_probes']} cause "
                 f"{fig['cause_accuracy_with_probes']} stage {fig['stage_accuracy_with_probes']}"
                 f" probes run {fig['probes_run']} (skipped {fig['probes_skipped']}, "
                 f"{fig['jobs_probed']} jobs) probe cost {fig['probe_cost_s']:.3f} s")
    return lines
