"""The scoring of the held-out suite (:mod:`failslow.bench.heldout_suite`): a job's
diagnosis against the generator's truth (:func:`score_job`), the suite's figures
(:func:`figures`) and the issue's floors (:func:`floors`).

* per fault: found when a diagnosed anomaly of the same kind (slow / hang) overlaps its time
  (one to one; among candidates the same cause and shared ranks first). A second anomaly of
  the same fault (overlapping it, naming only its ranks or link) is a split report: not a
  false positive, its ranks join the found set. A report another one took over
  (``superseded_by``) is scored as that one (:func:`without_superseded`), detected when the
  first report of its cause was (an absorbed link reported, then named by the slow-down
  detector once it cost time, was detected at the first report). Two simultaneous
  stragglers are one fault naming both ranks (the simulator's convention); a mixed fault is
  one fault, cause ``mixed``, ranks the slow rank, link the slow link. Compute faults that
  cost the job under :data:`~failslow.bench.heldout_suite.MARGINAL` are neither misses nor
  false positives; link faults always count (one costing under 1% is found only if reported);
* slow: precision over every reported slow anomaly (clean runs and hang jobs included),
  recall, F1; on found faults: cause, exact rank set, link (faults with a link), stage
  (``forward``/``backward``/null for compute, the link's ``pp_p2p``/``dp_sync``), latency
  in iterations of the job elapsed from the onset to ``detected_ns`` (median, p95, max;
  the floors' unit), and the same in baseline iteration times (``*_baseline_iterations``:
  a 2x slow iteration counts 2); anomalies in clean runs;
* hangs: precision, recall, F1, class and root-rank accuracy, latency in seconds;
* every figure also per family;
* with probes (issue 17): each job is diagnosed again with probes enabled for it, the
  generated cluster answering them (:mod:`failslow.bench.heldout_probes`), and scored the
  same way: ``figures_with_probes`` / ``floors_with_probes`` beside the figures without
  probes, which keep issue 14's floors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The issue's floors: figure -> (comparison, floor).
FLOORS: dict[str, tuple[str, float]] = {
    "slow_f1": (">=", 0.97),
    "cause_accuracy": (">=", 0.95),
    "exact_rank_accuracy": (">=", 0.95),
    "link_accuracy": (">=", 0.9),
    "stage_accuracy": (">=", 0.8),
    "latency_median_iterations": ("<=", 3.0),
    "latency_max_iterations": ("<=", 5.0),
    # deliverable 6: compute confined to one pipeline stage, and DP links at 256+ ranks
    "latency_max_stage_compute_iterations": ("<=", 3.0),
    "latency_max_dp_link_256_iterations": ("<=", 3.0),
    "clean_run_anomalies": ("<=", 0.0),
    "hang_f1": (">=", 1.0),
}
#: floors over a subset of the faults that a suite may not hold (no figure: nothing failed)
WHERE_ANY = frozenset({"latency_max_stage_compute_iterations",
                       "latency_max_dp_link_256_iterations"})


def _overlap(t: dict[str, Any], a: dict[str, Any]) -> float | None:
    lo = max(t["start_ns"] or 0, a.get("start_ns") or 0)
    hi = min(t["end_ns"] or 1 << 63, a.get("end_ns") or 1 << 63)
    return None if hi < lo else float(hi - lo)


def _named(t: dict[str, Any], a: dict[str, Any]) -> set[int]:
    return set(t["ranks"]) | set(t["link"] or [])


def score_job(units: list[dict[str, Any]], anomalies: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """Match one job's diagnosed anomalies to its true faults (module docstring). Returns
    per-fault rows and the anomalies left over (false positives)."""
    anomalies = without_superseded(anomalies)
    live = [u for u in units if u["kind"] == "slow" or u["triggered"]]
    cands: list[tuple[tuple[Any, ...], int, int]] = []
    for i, t in enumerate(live):
        for j, a in enumerate(anomalies):
            if a.get("kind") != t["kind"]:
                continue
            if t["kind"] == "slow":
                ov = _overlap(t, a)
                if ov is None:
                    continue
            else:
                ov = 0.0
            shared = bool(set(a.get("ranks") or []) & _named(t, a))
            cands.append(((a.get("cause") == t["cause"], shared, ov), i, j))
    cands.sort(key=lambda x: x[0], reverse=True)
    used_t: dict[int, int] = {}
    used_a: set[int] = set()
    for _, i, j in cands:
        if i in used_t or j in used_a:
            continue
        used_t[i] = j
        used_a.add(j)
    # split reports: another anomaly of a found fault, naming only its ranks or link
    extra: dict[int, list[int]] = {}
    for j, a in enumerate(anomalies):
        if j in used_a:
            continue
        for i, t in enumerate(live):
            if i not in used_t or a.get("kind") != t["kind"]:
                continue
            names = set(a.get("ranks") or []) | set(a.get("link") or [])
            if names and names <= _named(t, a) and (t["kind"] == "hang"
                                                   or _overlap(t, a) is not None):
                extra.setdefault(i, []).append(j)
                used_a.add(j)
                break
    # reports of a marginal fault are neither right nor wrong
    for j, a in enumerate(anomalies):
        if j in used_a:
            continue
        if any(t["marginal"] and a.get("kind") == "slow" and _overlap(t, a) is not None
               for t in live):
            used_a.add(j)
    rows = []
    for i, t in enumerate(live):
        row: dict[str, Any] = {"id": t["id"], "family": t["family"], "kind": t["kind"],
                               "marginal": t["marginal"], "cost": t["slowdown"],
                               "found": i in used_t, "pinnable": t.get("pinnable", True)}
        if i in used_t:
            a = anomalies[used_t[i]]
            group = [a] + [anomalies[j] for j in extra.get(i, [])]
            ranks = sorted({int(r) for g in group for r in g.get("ranks") or []})
            links = [sorted(g["link"]) for g in group if g.get("link")]
            row.update(
                cause=a.get("cause") == t["cause"],
                ranks=ranks == t["ranks"],
                link=(t["link"] in links) if t["link"] else None,
                stage=a.get("stage") == t["stage"]
                or any(g.get("stage") == t["stage"] for g in group[1:]),
                split=len(group) - 1,
                got={k: a.get(k) for k in ("cause", "ranks", "link", "stage")},
            )
            # the fault was detected by its first report: a split report of the same cause
            # made before the one matched (a degraded link reported again later) counts
            dets = [g["detected_ns"] for g in group
                    if g.get("detected_ns") is not None and g.get("cause") == a.get("cause")]
            det = min(dets) if dets else None
            if t["kind"] == "slow":
                if det is not None and t["start_ns"] is not None and t["baseline_s"]:
                    row["latency_it"] = elapsed_iterations(det, t)
                    row["latency_base_it"] = (det - t["start_ns"]) / (t["baseline_s"] * 1e9)
            elif det is not None and t["start_ns"] is not None:
                row["latency_s"] = (det - t["start_ns"]) / 1e9
        row["true"] = {k: t[k] for k in ("cause", "ranks", "link", "stage")}
        rows.append(row)
    false = [{k: a.get(k) for k in ("kind", "cause", "ranks", "link", "stage", "start_ns")}
             for j, a in enumerate(anomalies) if j not in used_a]
    return {"faults": rows, "false_positives": false, "anomalies": len(anomalies)}


def without_superseded(anomalies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reports without those another report took over (``superseded_by`` names it: a
    degraded link reported while the job absorbed it, then named by the slow-down
    detector once it cost time). They are one report of one fault, scored as the successor
    (its cause and names), never a false positive of their own; the fault was detected
    when the first of them of the successor's cause was (:func:`first_detected`)."""
    ids = {a["id"] for a in anomalies if a.get("id")}
    first = first_detected(anomalies)
    return [{**a, "detected_ns": first.get(str(a.get("id")), a.get("detected_ns"))}
            for a in anomalies if a.get("superseded_by") not in ids]


def first_detected(anomalies: list[dict[str, Any]]) -> dict[str, int]:
    """For each report that took others over, the earliest ``detected_ns`` of itself and
    of those it took over of its own cause (the link it now carries was reported then; a
    ring reported as a link, taken over by a compute straggler in it, was not that)."""
    by_id = {a["id"]: a for a in anomalies if a.get("id")}
    out: dict[str, int] = {}
    for a in anomalies:
        succ = by_id.get(a.get("superseded_by") or "")
        if succ is None or a.get("detected_ns") is None or a.get("cause") != succ.get("cause"):
            continue
        sid = str(succ["id"])
        earliest = out.get(sid, succ.get("detected_ns"))
        out[sid] = int(a["detected_ns"]) if earliest is None \
            else min(int(earliest), int(a["detected_ns"]))
    return out


def elapsed_iterations(detected_ns: int, t: dict[str, Any]) -> float:
    """Iterations of the job from the fault's onset to ``detected_ns``: whole iterations
    that ended before it plus the elapsed share of the one under way (past the last known
    end, in baseline iterations). A slow iteration counts as one, however long."""
    prev, n = int(t["start_ns"]), 0
    for end in t.get("iteration_ends_ns") or []:
        if end <= prev:
            continue
        if detected_ns < end:
            return n + max(0.0, (detected_ns - prev) / (end - prev))
        prev, n = end, n + 1
    return n + max(0.0, (detected_ns - prev) / (t["baseline_s"] * 1e9))


def _dims(job: dict[str, Any]) -> tuple[int, int, int] | None:
    """(tp, pp, dp) of a held-out job's ``shape`` (``tpXppYdpZ``), or None."""
    try:
        tp, pp, dp = (int(x) for x in
                      job["shape"].removeprefix("tp").replace("pp", " ").replace("dp", " ")
                      .split())
    except (KeyError, ValueError):
        return None
    return tp, pp, dp


def _stage_of(job: dict[str, Any], rank: int) -> int | None:
    """The pipeline stage of ``rank`` in a held-out job (``shape`` and ``order``,
    fastest-varying dimension first), or None when the job has no shape."""
    dims = _dims(job)
    if dims is None:
        return None
    tp, pp, dp = dims
    stride = 1
    for d in job.get("order") or "tdp":
        if d == "p":
            return (rank // stride) % pp
        stride *= {"t": tp, "d": dp}.get(d, 1)
    return None


def _latency_max_where(results: list[dict[str, Any]], family: str | None, kind: str
                       ) -> float | None:
    """Deliverable 6's latencies (the worst one): ``stage_compute``, found compute faults
    whose ranks lie in one pipeline stage of a job with a pipeline; ``dp_link_256``, found
    slow DP links (cause ``communication``) in jobs of 256 ranks or more."""
    lat = []
    for r in results:
        for f in r["faults"]:
            t = f.get("true") or {}
            if f["kind"] != "slow" or not f["found"] or f.get("latency_it") is None or (
                    family is not None and f["family"] != family):
                continue
            if kind == "stage_compute":
                stages = {_stage_of(r, int(x)) for x in t.get("ranks") or []}
                keep = (t.get("cause") == "compute" and len(stages) == 1
                        and None not in stages and (_dims(r) or (1, 1, 1))[1] > 1)
            else:
                keep = (t.get("cause") == "communication" and t.get("stage") == "dp_sync"
                        and int(r.get("ranks") or 0) >= 256)
            if keep:
                lat.append(float(f["latency_it"]))
    return round(max(lat), 3) if lat else None


def _ratio(num: float, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _f1(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    prec = tp / (tp + fp) if tp + fp else 1.0
    rec = tp / (tp + fn) if tp + fn else 1.0
    return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)


def figures(results: list[dict[str, Any]], family: str | None = None) -> dict[str, Any]:
    rows = [f for r in results for f in r["faults"]
            if family is None or f["family"] == family]
    jobs = [r for r in results if family is None
            or any(f["family"] == family for f in r["faults"])
            or (not r["faults"] and r["family"] == family)]
    slow = [f for f in rows if f["kind"] == "slow" and not f["marginal"]]
    hang = [f for f in rows if f["kind"] == "hang"]
    fps = [a for r in jobs for a in r["false_positives"]]
    slow_fp = sum(a["kind"] == "slow" for a in fps)
    hang_fp = sum(a["kind"] == "hang" for a in fps)
    found = [f for f in slow if f["found"]]
    tp_, fn_ = len(found), len(slow) - len(found)
    prec, rec, f1 = _f1(tp_, slow_fp, fn_)
    lat = [f["latency_it"] for f in found if f.get("latency_it") is not None]
    base_lat = [f["latency_base_it"] for f in found if f.get("latency_base_it") is not None]
    links = [f for f in found if f["link"] is not None]
    pinnable = [f for f in found if f.get("pinnable", True)]
    pinnable_links = [f for f in links if f.get("pinnable", True)]
    hfound = [f for f in hang if f["found"]]
    hp, hr, hf1 = _f1(len(hfound), hang_fp, len(hang) - len(hfound))
    hlat = [f["latency_s"] for f in hfound if f.get("latency_s") is not None]
    clean = [r for r in jobs if r["family"] == "clean"]
    out: dict[str, Any] = {
        "jobs": len(jobs), "slow_faults": len(slow),
        "marginal_faults": sum(f["marginal"] for f in rows),
        "slow_found": tp_, "slow_false_positives": slow_fp,
        "slow_precision": round(prec, 4), "slow_recall": round(rec, 4),
        "slow_f1": round(f1, 4),
        "cause_accuracy": _ratio(sum(f["cause"] for f in found), len(found)),
        "exact_rank_accuracy": _ratio(sum(f["ranks"] for f in found), len(found)),
        "link_faults_found": len(links),
        "link_accuracy": _ratio(sum(bool(f["link"]) for f in links), len(links)),
        # the same where the trace holds what pins the link (see truth_units: a pipeline
        # path, or a hop between nodes with link rows); the others need a probe
        "link_faults_pinnable": len(pinnable_links),
        "link_accuracy_where_pinnable": _ratio(sum(bool(f["link"]) for f in pinnable_links),
                                               len(pinnable_links)),
        "exact_rank_accuracy_where_pinnable": _ratio(sum(f["ranks"] for f in pinnable),
                                                     len(pinnable)),
        "stage_accuracy": _ratio(sum(f["stage"] for f in found), len(found)),
        "latency_median_iterations": round(float(np.median(lat)), 3) if lat else None,
        "latency_p95_iterations": round(float(np.percentile(lat, 95)), 3) if lat else None,
        "latency_max_iterations": round(float(np.max(lat)), 3) if lat else None,
        "latency_over_5": sum(x > 5 for x in lat),
        "latency_max_stage_compute_iterations": _latency_max_where(results, family,
                                                                   "stage_compute"),
        "latency_max_dp_link_256_iterations": _latency_max_where(results, family,
                                                                 "dp_link_256"),
        # the same latencies in baseline iteration times (a 2x slow iteration counts 2)
        "latency_median_baseline_iterations": round(float(np.median(base_lat)), 3)
        if base_lat else None,
        "latency_max_baseline_iterations": round(float(np.max(base_lat)), 3)
        if base_lat else None,
        "clean_runs": len(clean),
        "clean_run_anomalies": sum(r["anomalies"] for r in clean),
        "hang_faults": len(hang), "hang_found": len(hfound), "hang_false_positives": hang_fp,
        "hang_precision": round(hp, 4), "hang_recall": round(hr, 4), "hang_f1": round(hf1, 4),
        "hang_class_accuracy": _ratio(sum(f["cause"] for f in hfound), len(hfound)),
        "hang_root_accuracy": _ratio(sum(f["ranks"] for f in hfound), len(hfound)),
        "hang_latency_median_s": round(float(np.median(hlat)), 3) if hlat else None,
        "hang_latency_max_s": round(float(np.max(hlat)), 3) if hlat else None,
    }
    if family is not None:  # figures with nothing to measure in this family
        if not slow and not slow_fp:
            out["slow_precision"] = out["slow_recall"] = out["slow_f1"] = None
        if not hang and not hang_fp:
            out["hang_precision"] = out["hang_recall"] = out["hang_f1"] = None
    costs = [f["cost"] for f in slow if f["cost"] is not None]
    if costs:
        out["cost_median"] = round(float(np.median(costs)) - 1, 4)
    return out


def floors(fig: dict[str, Any], table: dict[str, tuple[str, float]] | None = None
           ) -> dict[str, dict[str, Any]]:
    """Every floor of ``table`` (default: the issue's) beside its figure: value, floor,
    pass."""
    out = {}
    for key, (op, floor) in (FLOORS if table is None else table).items():
        v = fig.get(key)
        ok = v is not None and (v >= floor if op == ">=" else v <= floor) or (
            v is None and key in WHERE_ANY)
        if key == "hang_f1" and not fig.get("hang_faults"):
            ok = v == 1.0
        out[key] = {"value": v, "op": op, "floor": floor, "pass": bool(ok)}
    return out
