"""``failslow bench accuracy-hang``: the hang detector's accuracy suite (issue 4, item 6).

Scenarios (simulated with :mod:`failslow.simulator`, 16 to 1024 ranks, 1F1B and GPipe, with
and without context parallelism):

* hangs of every class of CCL-D's taxonomy (§2.2: H1 ``not_entered``, H2 ``inconsistent``,
  H3 ``hardware``) at every training stage MEGATRACE locates (§III-C step 3): the forward of
  the 1F1B warm-up, the steady state, the backward of the cool-down, the pipeline send/recv,
  the data-parallel params-sync and grads-sync, the tensor- and context-parallel collectives
  inside forward and backward compute; plus hangs where some rank's records reach the
  detector seconds late (a slow collector or a lagging stream partition);
* clean runs: healthy jobs; Python GC pauses of several seconds on random ranks (their peers
  wait in tensor-parallel collectives and pipeline receives meanwhile); checkpoint pauses with
  nothing in flight; checkpoint pauses while the other ranks wait in a small non-barrier
  collective for the ranks that write (on a world communicator used only then, and on the
  data-parallel communicator, whose usual traffic is large parameter all-gathers), three
  times in a run; a rank whose records arrive seconds late.

The simulator has no checkpoint and no delivery-lag model, so those are made by
post-processing its tables (:func:`inject_checkpoint`, the ``lag`` of :func:`stream`).

Every case is streamed through :class:`~failslow.detectors.hang.HangDetector` in 100 ms
ticks of arrival time (records arrive at their event time plus their rank's lag), as the
stream processor would run it, and scored against the simulator's ``truth.json``:

* detection: precision, recall, F1 over hang reports (a hang case with a report is a true
  positive; every further report in it, and every report in a clean run, a false positive);
* on the detected hangs: class (``cause``), exact root ranks, link, stage (the truth's
  ``stage`` and ``comm``, plus the halt point: the data-parallel operation, or for pipeline,
  tensor- and context-parallel halts the pass, the micro-batch and the 1F1B phase);
* detection latency after the hang's true start, in seconds and in iterations (the
  simulator's median iteration time).

The cases are built in :mod:`failslow.bench.accuracy_hang_cases`; this module streams them
through the detector and scores them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.bench.accuracy_hang_cases import (  # all re-exported
    CP_SPECS,  # noqa: F401
    HANG_SPECS,  # noqa: F401
    LARGE_SPECS,  # noqa: F401
    SHAPES,  # noqa: F401
    WORLD_COMM,  # noqa: F401
    Case,
    HangSpec,  # noqa: F401
    S,
    Shape,  # noqa: F401
    _scenario,  # noqa: F401
    inject_checkpoint,
    schedule_phase,
    suite,
)
from failslow.detectors.base import Reporting
from failslow.detectors.hang import HangConfig
from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import Reports, only

TICK_NS = 100_000_000
KINDS = ("coll", "progress", "link")


# ---------------------------------------------------------------------------------------------
# streaming a case through the detector


def _arrival(table: pa.Table, lag_ns: np.ndarray | None) -> np.ndarray:
    t = table.column("t").to_numpy().astype(np.int64)
    if lag_ns is None:
        return t
    rank = pc.fill_null(table.column("rank"), -1).to_numpy().astype(np.int64)
    ok = (rank >= 0) & (rank < len(lag_ns))
    return t + np.where(ok, lag_ns[np.clip(rank, 0, len(lag_ns) - 1)], 0)


def stream(det: Reporting, tables: dict[str, pa.Table], lag_ns: np.ndarray | None = None,
           tick_ns: int = TICK_NS, tail_ns: int = 0) -> Iterator[tuple[int, list[Anomaly]]]:
    """Deliver the records as a stream would: each at its event time plus its rank's lag,
    in ``tick_ns`` windows of arrival time; ``update`` with each window's records, then
    ``on_tick(window end)``; windows with no records tick too, and ``tail_ns`` after the
    last arrival. Yields ``(now, reports)``."""
    parts: dict[str, tuple[pa.Table, np.ndarray]] = {}
    lo, hi = None, None
    for kind, table in tables.items():
        if table.num_rows == 0:
            continue
        arr = _arrival(table, lag_ns)
        order = np.argsort(arr, kind="stable")
        parts[kind] = (table.take(pa.array(order)), arr[order])
        lo = int(arr.min()) if lo is None else min(lo, int(arr.min()))
        hi = int(arr.max()) if hi is None else max(hi, int(arr.max()))
    if lo is None or hi is None:
        return
    edges = np.arange(lo - 1 + tick_ns, hi + tail_ns + tick_ns, tick_ns, dtype=np.int64)
    cuts = {k: np.searchsorted(a, edges, side="right") for k, (_, a) in parts.items()}
    prev = {k: 0 for k in parts}
    for j, now in enumerate(edges.tolist()):
        batch = {}
        for k, (table, _) in parts.items():
            c = int(cuts[k][j])
            if c > prev[k]:
                batch[k] = table.slice(prev[k], c - prev[k])
                prev[k] = c
        found = det.update(batch) if batch else []
        found += det.on_tick(now)
        yield now, found


# ---------------------------------------------------------------------------------------------
# running and scoring


@dataclass
class Result:
    case: Case
    ranks: int
    rows: int
    seconds: float
    reports: list[Anomaly]          # first report of each anomaly id
    truth: Anomaly | None
    iteration_s: float | None
    checks: dict[str, bool] = field(default_factory=dict)
    latency_s: float | None = None
    note: str = ""


def run_case(case: Case, config: HangConfig | None = None) -> Result:
    from failslow.simulator import scenario_from_dict, simulate

    sc = scenario_from_dict(case.scenario, case.name)
    sim = simulate(sc, seed=case.seed)
    tables = {k: sim.tables[k] for k in KINDS if k in sim.kinds}
    meta = sim.meta
    note = ""
    if case.gc:
        span = sim.tables["span"]
        gcs = span.filter(pc.equal(span.column("op"), "gc"))
        dur = (gcs.column("t_end").to_numpy() - gcs.column("t_start").to_numpy()) / 1e9
        note = f"{len(dur)} GC pauses, longest {dur.max():.2f} s" if len(dur) else "no GC"
    for it, pause in sorted(case.checkpoints, reverse=True):
        tables, meta = inject_checkpoint(tables, sim.tables["span"], meta, it, pause,
                                         case.checkpoint_comm)
    lag = None
    if case.lag:
        lag = np.zeros(meta.world_size, dtype=np.int64)
        for r, s in case.lag.items():
            lag[r] = int(s * S)
    det = Reports(only(meta, {"hang"}, hang=config))
    t0 = time.perf_counter()
    seen: dict[str, Anomaly] = {}
    tail = 5 * S if case.group == "hang" else 30 * S
    for _, found in stream(det, tables, lag, tail_ns=tail):
        for a in found:
            seen.setdefault(a.id, a)
    seconds = time.perf_counter() - t0
    hangs = [a for a in sim.truth.anomalies if a.kind == "hang"]
    truth = hangs[0] if hangs else None
    if case.group == "hang" and truth is None:
        raise RuntimeError(f"{case.name}: the simulated hang never took effect")
    med = (sim.truth.iterations or {}).get("median_s")
    res = Result(case, meta.world_size, sum(t.num_rows for t in tables.values()), seconds,
                 list(seen.values()), truth, float(med) if med else None, note=note)
    if truth is not None and res.reports:
        _score(res, res.reports[0], truth)
    return res


def _score(res: Result, got: Anomaly, want: Anomaly) -> None:
    exp = res.case.expect
    hp = got.extra.get("halt_point") or {}
    stage = (got.stage == want.stage and got.comm == want.comm
             and got.comm_kind == want.comm_kind)
    if "op" in exp:
        stage = stage and hp.get("op") == exp["op"]
    if "pass" in exp:
        stage = stage and (got.extra.get("pass"), got.extra.get("microbatch")) == (
            exp["pass"], exp["microbatch"])
        if exp.get("schedule_phase") is not None:
            stage = stage and got.extra.get("schedule_phase") == exp["schedule_phase"]
    res.checks = {
        "cause": got.cause == want.cause,
        "ranks": got.ranks == want.ranks,
        "link": sorted(got.link or []) == sorted(want.link or []),
        "stage": bool(stage),
    }
    if got.detected_ns is not None and want.start_ns is not None:
        res.latency_s = (got.detected_ns - want.start_ns) / 1e9


def _stats(values: list[float], digits: int = 3) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p95": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {"mean": round(float(a.mean()), digits), "median": round(float(np.median(a)), digits),
            "p95": round(float(np.percentile(a, 95)), digits),
            "max": round(float(a.max()), digits)}


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def summarize(results: list[Result]) -> dict[str, Any]:
    """The suite's figures (module docstring)."""
    hang = [r for r in results if r.case.group == "hang"]
    clean = [r for r in results if r.case.group == "clean"]
    tp = sum(1 for r in hang if r.reports)
    fn = len(hang) - tp
    fp = sum(max(0, len(r.reports) - 1) for r in hang) + sum(len(r.reports) for r in clean)
    prec = tp / (tp + fp) if tp + fp else 1.0
    rec = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    found = [r for r in hang if r.reports]
    lat = [r.latency_s for r in found if r.latency_s is not None]
    lat_it = [r.latency_s / r.iteration_s for r in found
              if r.latency_s is not None and r.iteration_s]

    def acc(key: str) -> float | None:
        return _ratio(sum(r.checks.get(key, False) for r in found), len(found))

    def group_by(key: Callable[[Result], str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in hang:
            g = out.setdefault(key(r), {"cases": 0, "correct": 0, "latency_s": []})
            g["cases"] += 1
            g["correct"] += int(bool(r.reports) and len(r.reports) == 1
                                and all(r.checks.values()))
            if r.latency_s is not None:
                g["latency_s"].append(r.latency_s)
        for g in out.values():
            g["latency_s_max"] = round(max(g.pop("latency_s")), 3) if g.get("latency_s") \
                else None
        return out

    wrong = []
    for r in hang:
        bad = [k for k, ok in r.checks.items() if not ok]
        if not r.reports or len(r.reports) > 1 or bad:
            wrong.append({"case": r.case.name, "reports": len(r.reports), "wrong": bad,
                          "got": [_brief(a) for a in r.reports[:3]],
                          "want": _brief(r.truth) if r.truth else None})
    for r in clean:
        if r.reports:
            wrong.append({"case": r.case.name, "reports": len(r.reports),
                          "got": [_brief(a) for a in r.reports[:3]]})
    return {
        "cases": len(results), "hang_cases": len(hang), "clean_cases": len(clean),
        "ranks": sorted({r.ranks for r in results}),
        "true_positives": tp, "false_positives": fp, "false_negatives": fn,
        "precision": round(prec, 4), "recall": round(rec, 4), "f1": round(f1, 4),
        "class_accuracy": acc("cause"), "root_rank_exact": acc("ranks"),
        "link_accuracy": acc("link"), "stage_accuracy": acc("stage"),
        "clean_false_alarms": sum(len(r.reports) for r in clean),
        "latency_s": _stats(lat), "latency_iterations": _stats(lat_it, 2),
        "by_class": group_by(lambda r: r.case.cause or "-"),
        "by_stage": group_by(lambda r: r.case.label),
        "by_ranks": {str(k): v for k, v in group_by(lambda r: str(r.ranks)).items()},
        "clean": {r.case.name: {"reports": len(r.reports), "note": r.note or None}
                  for r in clean},
        "failures": wrong,
        "detector_rows_per_s": round(sum(r.rows for r in results)
                                     / max(sum(r.seconds for r in results), 1e-9)),
    }


def _brief(a: Anomaly) -> dict[str, Any]:
    return {"cause": a.cause, "ranks": a.ranks, "link": a.link, "comm_kind": a.comm_kind,
            "stage": a.stage, "pass": a.extra.get("pass"),
            "microbatch": a.extra.get("microbatch"),
            "schedule_phase": a.extra.get("schedule_phase"),
            "op": (a.extra.get("halt_point") or {}).get("op"),
            "start_ns": a.start_ns, "detected_ns": a.detected_ns, "end_ns": a.end_ns}


def hang_suite(scale: float = 1.0, config: HangConfig | None = None,
               progress: Callable[[Result], None] | None = None) -> dict[str, Any]:
    """Run the suite (``scale`` shrinks it) and return its figures; ``progress`` is called
    with each case's result."""
    t0 = time.perf_counter()
    results = []
    for case in suite(scale):
        res = run_case(case, config)
        results.append(res)
        if progress is not None:
            progress(res)
    out = summarize(results)
    out["scale"] = scale
    out["seconds"] = round(time.perf_counter() - t0, 1)
    cfg = config or HangConfig()
    out["config"] = {"n_expected": cfg.n_expected, "floor_s": cfg.floor_ns / 1e9,
                     "idle_floor_s": getattr(cfg, "idle_floor_ns", cfg.floor_ns) / 1e9,
                     "ceiling_s": cfg.ceiling_ns / 1e9, "tick_s": TICK_NS / 1e9}
    return out


def _line(r: Result) -> str:
    got = "; ".join(f"{a.cause}{a.ranks}{'' if a.link is None else ' link ' + str(a.link)} "
                    f"{a.stage}/{a.extra.get('pass')}/{a.extra.get('microbatch')}/"
                    f"{a.extra.get('schedule_phase')}" for a in r.reports[:3]) or "-"
    bad = [k for k, ok in r.checks.items() if not ok]
    lat = "" if r.latency_s is None else f" {r.latency_s:6.2f}s"
    return (f"{r.case.name:48s} {r.ranks:5d} {r.seconds:5.1f}s{lat} {got}"
            + (f"  WRONG {','.join(bad)}" if bad else "") + (f"  ({r.note})" if r.note else ""))


def bench_accuracy_hang(args: argparse.Namespace) -> dict[str, Any]:
    """``failslow bench accuracy-hang [--json] [--scale S]``."""
    scale = float(getattr(args, "scale", 1.0) or 1.0)
    quiet = bool(getattr(args, "json", False))
    return hang_suite(scale, progress=None if quiet else (lambda r: print(_line(r),
                                                                          flush=True)))


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "accuracy-hang": bench_accuracy_hang,
}

__all__ = ["BENCHMARKS", "Case", "hang_suite", "inject_checkpoint", "schedule_phase",
           "stream", "suite"]

