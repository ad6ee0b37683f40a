"""``failslow bench accuracy`` and ``failslow bench detectors-throughput``.

Accuracy (issue 3, item 9): a suite of simulated jobs (16 to 1024 ranks, every slow cause,
severities from 1.15x compute and 1.3x link up to 5x, compound faults and clean runs with GC
pauses, sequence-length variation and a heavy last stage) is generated with
:mod:`failslow.simulator`, diagnosed with the same code path as ``failslow analyze``
(:func:`failslow.engine.offline.analyze_tables`) and scored against the simulator's ``truth.json``:

* a diagnosed slow anomaly *matches* a true one when their time intervals overlap (one to
  one, largest overlap first); unmatched diagnosed anomalies are false positives, unmatched
  true ones are misses: precision, recall and F1;
* on matched pairs: cause, exact root ranks, link (the same two ranks; also the same two
  nodes), stage; detection latency ``(detected_ns - true start) / baseline iteration``;
* the three change-point methods of :mod:`failslow.detectors.changepoints` (``bocd+v``,
  ``bocd``, ``window``) on each job's iteration-time series, side by side as in Greyhound
  Tables 3 and 4 (job-level accuracy, false-positive and false-negative rates, and onset
  F1 with a margin of two iterations).

The held-out suite (:mod:`failslow.bench.heldout_suite`, key ``heldout``) follows: jobs
drawn at random (``seed``) from the independent generator :mod:`failslow.bench.heldout`,
scored per fault family, each of the issue's floors printed beside its figure. The
scenarios are in :mod:`failslow.bench.accuracy_cases`.

Throughput (item 10): the detectors over the ``coll`` rows of a simulated job, in batches,
as rows per second and as a ratio to a plain read of the same rows from Parquet.
"""

from __future__ import annotations

import argparse
import io
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from failslow.bench.accuracy_cases import (  # noqa: F401 - the suite's names, as before
    GPN,
    Case,
    _comp,
    _dp_nodes,
    _job,
    _link,
    _mixed,
    _pp_nodes,
    suite,
)
from failslow.bench.heldout_score import first_detected
from failslow.detectors.changepoints import METHODS, detect_changepoints
from failslow.detectors.slowdown import SlowdownConfig
from failslow.detectors.slowdown.kernel import gap_kernel
from failslow.detectors.slowdown.reducer import EvidenceReducer
from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import JobAnalyzer
from failslow.engine.offline import KINDS, run_analyzer
from failslow.events import JobMeta
from failslow.replay import replay

CP_MARGIN = 2  # change-point scoring: a detection within this many iterations of the truth
#: A true slow-down that costs the job less than this (truth ``slowdown``) is *marginal*: not
#: a miss when undetected, not a false positive when reported.
MIN_SLOWDOWN = 1.05


# ---------------------------------------------------------------------------------------------
# scoring


@dataclass
class CaseResult:
    """The outcome of one scenario."""

    name: str
    world: int
    truth: list[dict[str, Any]]
    found: list[dict[str, Any]]
    matches: list[dict[str, Any]] = field(default_factory=list)
    false_positives: int = 0
    misses: int = 0
    seconds: float = 0.0
    rows: int = 0
    changepoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    iteration_error: float | None = None


def _interval(a: Anomaly, horizon: int) -> tuple[int, int]:
    lo = a.start_ns if a.start_ns is not None else 0
    hi = a.end_ns if a.end_ns is not None else horizon
    return lo, max(hi, lo)


def _nodes(pair: list[int] | None, meta_nodes: dict[int, str]) -> list[str] | None:
    if not pair:
        return None
    return sorted(meta_nodes.get(int(r), f"node{int(r) // GPN:03d}") for r in pair)


def match(truth: list[Anomaly], found: list[Anomaly], horizon: int,
          nodes: dict[int, str] | None = None) -> tuple[list[dict[str, Any]], int, int]:
    """One-to-one matching of slow anomalies by time overlap (largest overlap first).
    Returns the matched pairs' scores, the false positives and the misses."""
    nodes = nodes or {}
    t_all = [a for a in truth if a.kind == "slow"]
    # a report another one took over is scored as that one (heldout_score.without_superseded)
    ids = {a.id for a in found}
    f_slow = [a for a in found if a.kind == "slow" and a.superseded_by not in ids]
    first = first_detected([{"id": a.id, "cause": a.cause, "detected_ns": a.detected_ns,
                             "superseded_by": a.superseded_by} for a in found])
    marginal = [a for a in t_all if a.slowdown is not None and a.slowdown < MIN_SLOWDOWN]
    t_slow = [a for a in t_all if a not in marginal]
    for m in marginal:  # a report of a marginal slow-down is neither right nor wrong
        mlo, mhi = _interval(m, horizon)
        f_slow = [f for f in f_slow if not (min(mhi, _interval(f, horizon)[1])
                                            >= max(mlo, _interval(f, horizon)[0]))]
    pairs: list[tuple[int, int, int]] = []
    for i, t in enumerate(t_slow):
        tlo, thi = _interval(t, horizon)
        for j, f in enumerate(f_slow):
            flo, fhi = _interval(f, horizon)
            ov = min(thi, fhi) - max(tlo, flo)
            if ov >= 0:
                pairs.append((ov, i, j))
    pairs.sort(key=lambda x: -x[0])
    used_t: set[int] = set()
    used_f: set[int] = set()
    out = []
    for _, i, j in pairs:
        if i in used_t or j in used_f:
            continue
        used_t.add(i)
        used_f.add(j)
        t, f = t_slow[i], f_slow[j]
        base = t.extra.get("baseline_s")
        latency = None
        detected = first.get(f.id, f.detected_ns)
        if base and t.start_ns is not None and detected is not None:
            latency = (detected - t.start_ns) / (float(base) * 1e9)
        t_link = sorted(t.link) if t.link else None
        f_link = sorted(f.link) if f.link else None
        out.append({
            "truth": t.id, "found": f.id, "cause": f.cause == t.cause,
            "ranks": sorted(f.ranks) == sorted(t.ranks),
            "link": f_link == t_link if t_link is not None else None,
            "link_nodes": (_nodes(f_link, nodes) == sorted(t.extra.get("nodes", [])))
            if t_link is not None else None,
            "stage": f.stage == t.stage, "latency": latency,
            "true": {"cause": t.cause, "ranks": t.ranks, "link": t.link, "stage": t.stage},
            "got": {"cause": f.cause, "ranks": f.ranks, "link": f.link, "stage": f.stage,
                    "R": f.R, "P": f.P},
        })
    return out, len(f_slow) - len(used_f), len(t_slow) - len(used_t)


def _iteration_index(starts: np.ndarray, ends: np.ndarray, t_ns: int) -> int:
    """Index of the job iteration running at ``t_ns`` (the next one when between two)."""
    return int(np.searchsorted(ends, t_ns, side="right")) if len(ends) else 0


def score_changepoints(durations: np.ndarray, starts: np.ndarray, truth: list[Anomaly]
                       ) -> dict[str, dict[str, Any]]:
    """Greyhound Tables 3-4 per method: did it flag the job (any change point), and which
    true onsets / reliefs it found within :data:`CP_MARGIN` iterations."""
    ends = starts + durations
    onsets, reliefs = [], []
    for a in truth:
        if a.kind != "slow" or a.start_ns is None:
            continue
        onsets.append(_iteration_index(starts, ends, a.start_ns))
        if a.end_ns is not None and a.end_ns < (ends[-1] if len(ends) else 0):
            reliefs.append(_iteration_index(starts, ends, a.end_ns) + 1)
    true_cps = sorted(onsets + reliefs)
    out: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        cps = detect_changepoints(durations, method) if len(durations) else []
        hit_onsets = sum(any(abs(c - o) <= CP_MARGIN for c in cps) for o in onsets)
        tp = sum(any(abs(c - x) <= CP_MARGIN for c in cps) for x in true_cps)
        fp = sum(not any(abs(c - x) <= CP_MARGIN for x in true_cps) for c in cps)
        delays = []
        for o in onsets:
            after = [c for c in cps if c >= o - CP_MARGIN]
            if after and min(after) - o <= 10:
                delays.append(min(after) - o)
        out[method] = {"changepoints": [int(c) for c in cps], "flagged": bool(cps),
                       "onsets": len(onsets), "onsets_found": hit_onsets,
                       "true_cps": len(true_cps), "tp": tp, "fp": fp,
                       "exact_job": (bool(cps) == bool(onsets)) and fp == 0
                       and hit_onsets == len(onsets)}
    return out


def run_case(case: Case) -> CaseResult:
    """Simulate one scenario, diagnose it like ``failslow analyze`` and score it."""
    from failslow.simulator import scenario_from_dict, simulate

    sc = scenario_from_dict(case.spec, case.name)
    sim = simulate(sc, case.seed)
    tables = {k: pa.concat_tables(list(sim.iter_tables(k))) for k in sim.kinds if k in KINDS}
    rows = tables["coll"].num_rows
    t0 = time.perf_counter()
    analyzer = run_analyzer(sim.meta, tables)
    diag = analyzer.diagnosis()
    seconds = time.perf_counter() - t0
    horizon = int(max(int(np.max(tables["coll"].column("t").to_numpy())), 0))
    nodes = {int(r): n for r, n in sim.meta.nodes.items()}
    matches, fp, miss = match(sim.truth.anomalies, diag.anomalies, horizon, nodes)
    res = CaseResult(case.name, case.world, [_brief(a) for a in sim.truth.anomalies],
                     [_brief(a) for a in diag.anomalies], matches, fp, miss, seconds, rows)
    job = np.array(analyzer.tracker.job, dtype=np.int64).reshape(-1, 3)
    res.changepoints = score_changepoints(job[:, 2].astype(np.float64), job[:, 1],
                                          sim.truth.anomalies)
    true_it = (sim.truth.iterations or {}).get("median_s")
    got_it = (diag.iterations or {}).get("median_s")
    if true_it and got_it:
        res.iteration_error = abs(got_it - true_it) / true_it
    return res


def _brief(a: Anomaly) -> dict[str, Any]:
    return {"id": a.id, "cause": a.cause, "ranks": a.ranks, "link": a.link, "stage": a.stage,
            "start_ns": a.start_ns, "detected_ns": a.detected_ns, "end_ns": a.end_ns,
            "slowdown": a.slowdown, "R": a.R, "P": a.P}


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def totals(results: list[CaseResult], clean: set[str]) -> dict[str, Any]:
    """The suite's figures (module docstring)."""
    tp = sum(len(r.matches) for r in results)
    fp = sum(r.false_positives for r in results)
    fn = sum(r.misses for r in results)
    prec = tp / (tp + fp) if tp + fp else 1.0
    rec = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    ms = [m for r in results for m in r.matches]
    lat = [m["latency"] for m in ms if m["latency"] is not None]
    links = [m for m in ms if m["link"] is not None]
    clean_fp = sum(len(r.found) for r in results if r.name in clean)
    out: dict[str, Any] = {
        "scenarios": len(results), "clean_scenarios": len(clean),
        "true_slow": tp + fn, "found_slow": tp + fp,
        "precision": round(prec, 4), "recall": round(rec, 4), "f1": round(f1, 4),
        "cause_accuracy": _ratio(sum(m["cause"] for m in ms), len(ms)),
        "root_rank_accuracy": _ratio(sum(m["ranks"] for m in ms), len(ms)),
        "link_accuracy": _ratio(sum(bool(m["link"]) for m in links), len(links)),
        "link_node_accuracy": _ratio(sum(bool(m["link_nodes"]) for m in links), len(links)),
        "stage_accuracy": _ratio(sum(m["stage"] for m in ms), len(ms)),
        "clean_false_positives": clean_fp,
        "latency_median_iterations": round(float(np.median(lat)), 3) if lat else None,
        "latency_p95_iterations": round(float(np.percentile(lat, 95)), 3) if lat else None,
        "latency_max_iterations": round(float(np.max(lat)), 3) if lat else None,
    }
    errs = [r.iteration_error for r in results if r.iteration_error is not None]
    if errs:
        out["iteration_error_median"] = round(float(np.median(errs)), 5)
        out["iteration_error_max"] = round(float(np.max(errs)), 5)
    cps: dict[str, Any] = {}
    for method in METHODS:
        per = [r.changepoints[method] for r in results if method in r.changepoints]
        pos = [p for p in per if p["onsets"]]
        neg = [p for p in per if not p["onsets"]]
        ctp = sum(p["tp"] for p in per)
        cfp = sum(p["fp"] for p in per)
        cfn = sum(p["true_cps"] - p["tp"] for p in per)
        cprec = ctp / (ctp + cfp) if ctp + cfp else 1.0
        crec = ctp / (ctp + cfn) if ctp + cfn else 1.0
        cps[method] = {
            "job_accuracy": _ratio(sum(p["exact_job"] for p in per), len(per)),
            "fpr": _ratio(sum(p["flagged"] for p in neg), len(neg)),
            "fnr": _ratio(sum(p["onsets_found"] < p["onsets"] for p in pos), len(pos)),
            "cp_precision": round(cprec, 4), "cp_recall": round(crec, 4),
            "cp_f1": round(2 * cprec * crec / (cprec + crec), 4) if cprec + crec else 0.0,
        }
    out["changepoints"] = cps
    out["analyze_rows_per_s"] = round(sum(r.rows for r in results)
                                      / max(sum(r.seconds for r in results), 1e-9))
    return out


def iter_results(cases: list[Case]) -> Iterator[CaseResult]:
    for case in cases:
        yield run_case(case)


def bench_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    """``failslow bench accuracy [--json] [--scale S]``: the simulator suite (``totals``,
    ``per_scenario``), the hang suite (``hang``) and the held-out suite (``heldout``: figures,
    floors with pass/fail, per-family table, per-job results; ``args.seed`` if given)."""
    scale = float(getattr(args, "scale", 1.0) or 1.0)
    quiet = bool(getattr(args, "json", False))
    cases = suite(scale)
    clean = {c.name for c in cases if c.name.startswith("h")}
    results: list[CaseResult] = []
    t0 = time.perf_counter()
    for res in iter_results(cases):
        results.append(res)
        if not quiet:
            print(_line(res), flush=True)
    out: dict[str, Any] = {"totals": totals(results, clean)}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["per_scenario"] = [_summary(r) for r in results]
    # the hang scenarios (CCL-D H1-H3), from their own suite
    out["hang"] = hang_suite(scale)
    # the held-out suite: jobs nobody tuned for, drawn from an independent generator, with
    # the floors beside its figures
    seed = int(getattr(args, "seed", 0) or 0)
    out["heldout"] = heldout_suite(scale, seed, progress=None if quiet else (
        lambda r: print(heldout_line(r), flush=True)))
    if not quiet:
        print(heldout_table(out["heldout"]), flush=True)
    out["inspector"] = inspector_accuracy(scale, quiet)
    return out


def inspector_accuracy(scale: float, quiet: bool) -> dict[str, Any]:
    """Every preset as NCCL Inspector output, verbose and not (issue 16); below scale 1 a
    compute, a link and a hang preset."""
    from failslow.bench.accuracy_inspector import SMALL_PRESETS, inspector_suite, line

    presets = SMALL_PRESETS if scale >= 1 else ("default", "link", "hang-not-entered")
    out = inspector_suite(presets, None if quiet else lambda r: print(line(r), flush=True))
    if not quiet:
        print(f"inspector: verbose import = written-from diagnosis "
              f"{out['verbose_same_as_written']}, = truth (slow) {out['verbose_truth_slow']}; "
              f"non-verbose names the ranks (slow) {out['nonverbose_ranks_slow']}", flush=True)
    return out


def _summary(r: CaseResult) -> dict[str, Any]:
    return {"name": r.name, "ranks": r.world, "truth": len(r.truth), "found": len(r.found),
            "matched": len(r.matches), "false_positives": r.false_positives,
            "misses": r.misses,
            "cause_ok": all(m["cause"] for m in r.matches),
            "ranks_ok": all(m["ranks"] for m in r.matches),
            "link_ok": all(m["link"] is not False for m in r.matches),
            "stage_ok": all(m["stage"] for m in r.matches),
            "latency": [None if m["latency"] is None else round(m["latency"], 2)
                        for m in r.matches],
            "R": [m["got"]["R"] for m in r.matches], "P": [m["got"]["P"] for m in r.matches],
            "changepoints": {k: v["changepoints"] for k, v in r.changepoints.items()},
            "seconds": round(r.seconds, 2)}


def _line(r: CaseResult) -> str:
    flags = []
    for m in r.matches:
        bad = [k for k in ("cause", "ranks", "link", "stage") if m[k] is False]
        lat = "-" if m["latency"] is None else f"{m['latency']:.2f}"
        flags.append(f"{m['got']['cause']}{m['got']['ranks']} lat {lat}"
                     + (f" WRONG {','.join(bad)} (true {m['true']})" if bad else ""))
    return (f"{r.name:28s} ranks {r.world:5d} truth {len(r.truth)} found {len(r.found)} "
            f"fp {r.false_positives} miss {r.misses} {r.seconds:5.1f}s  " + "; ".join(flags))


# ---------------------------------------------------------------------------------------------
# throughput


def bench_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """``failslow bench detectors-throughput``: ``coll`` rows per second through the
    detectors (iteration tracker, slow-down detector, hang detector, and the whole
    JobAnalyzer) on one core, batches of ``batch_ms`` of trace time, against a plain read of
    the same rows from Parquet into Arrow (one thread).

    Rates are rows over the process's CPU time (``time.process_time``; the detectors run on
    one thread), so they measure one core's work and do not depend on how busy the machine
    is; ``*_wall_rows_per_s`` gives the wall-clock rate too. Each subject is the engine with
    only that detector enabled (and those it reads); ``slowdown_alone`` is the slow-down
    detector's own share: the slow-down engine's time less the tracker's. ``reducer`` is the
    slow-down detector's row-level half (rounds and gaps, :mod:`~failslow.detectors.
    slowdown.reducer`) with its C kernels, ``reducer_numpy`` the same with the numpy forms
    (``evidence_kernel`` names the library, None when none loads)."""
    from failslow.engine.analyzer import only
    from failslow.simulator import scenario_from_dict, simulate

    scale = float(getattr(args, "scale", 1.0) or 1.0)
    tp, pp, dp = (4, 4, 16) if scale >= 1.0 else (2, 2, 4)
    iterations = max(8, int(round(30 * min(scale, 1.0))))
    sc = scenario_from_dict(_job(tp, pp, dp, iterations=iterations, mb=8, faults=[
        {"cause": "compute", "ranks": [tp * dp + 3], "start": iterations // 2,
         "duration": iterations // 4, "severity": 1.5}]), "throughput")
    sim = simulate(sc, 0)
    coll = pa.concat_tables(list(sim.iter_tables("coll")))
    n = coll.num_rows
    buf = io.BytesIO()
    pq.write_table(coll, buf)
    data = buf.getvalue()

    def read() -> pa.Table:
        return pq.read_table(pa.BufferReader(data), use_threads=False)

    read_s, read_wall = _best(lambda: read(), 3)
    kernels = gap_kernel()
    out: dict[str, Any] = {"rows": n, "ranks": sim.meta.world_size,
                           "read_rows_per_s": round(n / read_s),
                           "read_wall_rows_per_s": round(n / read_wall),
                           "evidence_kernel": str(kernels.path) if kernels else None}
    for batch_ms in (100.0, 1000.0):
        batches = [b for _, b in replay({"coll": coll}, int(batch_ms * 1e6))]
        subjects: dict[str, Callable[[], Any]] = {
            "tracker": lambda: only(sim.meta, {"iterations"}),
            "slowdown": lambda: only(sim.meta, {"slowdown"}),
            "hang": lambda: only(sim.meta, {"hang"}),
            "job": lambda: JobAnalyzer(sim.meta),
            "reducer": lambda: _Reducer(sim.meta, native=True),
            "reducer_numpy": lambda: _Reducer(sim.meta, native=False),
        }
        took: dict[str, tuple[float, float]] = {}
        for name, make in subjects.items():
            def run(make: Callable[[], Any] = make, batches: list[Any] = batches) -> None:
                det = make()
                for b in batches:
                    det.update(b)
            took[name] = _best(run, 2)
            _record(out, f"{name}_{int(batch_ms)}ms", n, read_s, took[name])
        alone = tuple(max(s - t, 1e-9) for s, t in zip(took["slowdown"], took["tracker"],
                                                        strict=True))
        _record(out, f"slowdown_alone_{int(batch_ms)}ms", n, read_s,
                (alone[0], alone[1]))
    return out


class _Reducer:
    """The evidence reducer as a benchmark subject (``update(batch)``)."""

    def __init__(self, meta: JobMeta, native: bool) -> None:
        self.reducer = EvidenceReducer(meta, SlowdownConfig())
        if not native:
            self.reducer.joiner.kernel = self.reducer.gaps.kernel = None

    def update(self, batch: dict[str, pa.Table]) -> None:
        coll = batch.get("coll")
        if coll is not None:
            self.reducer.update(coll, SlowdownConfig.bin_shift)


def _record(out: dict[str, Any], key: str, n: int, read_s: float,
            sec: tuple[float, float]) -> None:
    out[f"{key}_rows_per_s"] = round(n / sec[0])
    out[f"{key}_vs_read"] = round(read_s / sec[0], 4)
    out[f"{key}_wall_rows_per_s"] = round(n / sec[1])


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """The least CPU time and the least wall time of ``repeat`` runs."""
    cpu = wall = math.inf
    for _ in range(repeat):
        t, w = time.process_time(), time.perf_counter()
        fn()
        cpu = min(cpu, time.process_time() - t)
        wall = min(wall, time.perf_counter() - w)
    return max(cpu, 1e-9), max(wall, 1e-9)


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "accuracy": bench_accuracy,
    "detectors-throughput": bench_throughput,
}


# the hang suite and the held-out suite live next to this one; imported last (its peers)
from failslow.bench.accuracy_hang import hang_suite  # noqa: E402
from failslow.bench.heldout_suite import heldout_suite  # noqa: E402
from failslow.bench.heldout_suite import line as heldout_line  # noqa: E402
from failslow.bench.heldout_suite import table as heldout_table  # noqa: E402
