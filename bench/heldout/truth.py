"""The ground truth of a generated job in diagnosis.md's shape, and the scoring of a
diagnosis against it."""

from __future__ import annotations

from typing import Any

import numpy as np

from .executor import Executor
from .model import Layout, Spec

STAGE = {"tp": "tp_collective", "pp": "pp_p2p", "dp": "dp_sync"}


def ground_truth(spec: Spec, lay: Layout, ex: Executor, obs: Any) -> dict[str, Any]:
    """Ground truth in diagnosis.md's shape; times on the root rank's clock."""
    ends = np.where(np.isnan(ex.iter_end), -np.inf, ex.iter_end).max(axis=1)
    starts = np.where(np.isnan(ex.iter_start), np.inf, ex.iter_start).min(axis=1)
    ends[~np.isfinite(ends)] = np.nan  # iterations a hang kept from ending
    starts[~np.isfinite(starts)] = np.nan
    dur = np.diff(np.concatenate([[starts[0]], ends]))
    touched: np.ndarray = np.zeros(spec.iterations, dtype=bool)
    for f in spec.faults:
        hi = (
            f.end
            if f.end is not None and f.cause in ("compute", "communication")
            else spec.iterations
        )
        touched[max(0, f.start) : min(spec.iterations, hi + 1)] = True
    ok = np.isfinite(dur) & ~touched
    ok[0] = False
    base = float(np.median(dur[ok])) if ok.sum() >= 3 else float("nan")
    quiet = _quiet(spec, ex) & np.isfinite(dur)
    quiet_base = (float(np.median(dur[ok & quiet])) if (ok & quiet).sum() >= 3 else base)
    anomalies: list[dict[str, Any]] = []
    for i, f in enumerate(spec.faults):
        a: dict[str, Any] = {
            "id": f"fault-{i}",
            "cause": f.cause,
            "ranks": [f.rank],
            "link": None,
            "comm_kind": None,
            "stage": None,
            "iteration_start": f.start,
            "iteration_end": f.end,
            "baseline_s": base / 1e9,
        }
        if f.cause in ("compute", "communication"):
            hi = min(spec.iterations, f.end if f.end is not None else spec.iterations)
            sl = slice(f.start, hi)
            a["kind"] = "slow"
            a["start_ns"] = int(obs(np.array([f.rank]), np.array([starts[f.start]]))[0])
            a["end_ns"] = (
                int(obs(np.array([f.rank]), np.array([ends[hi - 1]]))[0])
                if f.end is not None and f.end < spec.iterations
                else None
            )
            a["slowdown"] = _cost(dur[sl], quiet[sl], base, quiet_base)
            # the job's iteration ends from the onset on: latency counted in iterations
            # that elapsed (a slow iteration is one iteration, however long)
            fin = ends[f.start:]
            fin = fin[np.isfinite(fin)]
            a["iteration_ends_ns"] = [int(x) for x in obs(np.full(len(fin), f.rank), fin)]
            if f.cause == "compute" and f.phase is not None:
                a["stage"] = {"f": "forward", "b": "backward"}[f.phase]
            if f.cause == "communication":
                assert f.peer is not None
                a["ranks"] = sorted([f.rank, f.peer])
                a["link"] = sorted([f.rank, f.peer])
        else:
            hit = [h for h in ex.hung if h[0] is f]
            a["kind"] = "hang"
            a["comm_kind"] = f.comm
            a["stage"] = STAGE[f.comm]
            a["start_ns"] = int(obs(np.array([f.rank]), np.array([hit[0][2]]))[0]) if hit else None
            a["end_ns"] = None
            a["triggered"] = bool(hit)
            if f.cause == "hardware" and hit and hit[0][1] is not None:
                op = hit[0][1]
                members = lay.comms[op.comm][2]
                nxt = (
                    members[(members.index(f.rank) + 1) % len(members)]
                    if op.kind == "coll"
                    else members[op.peer]
                )
                if lay.node[nxt] != lay.node[f.rank]:
                    a["link"] = [f.rank, nxt]
        anomalies.append(a)
    return {
        "version": 1,
        "job": spec.job,
        "iterations": {
            "median_s": float(np.nanmedian(dur[1:])) / 1e9,
            "count": int(np.isfinite(dur).sum()),
        },
        "anomalies": anomalies,
    }


def score(truth: dict[str, Any], diag: dict[str, Any]) -> dict[str, Any]:
    """Match found anomalies to the truth (same kind; slow ones by time overlap, a hang to
    any hang) and score cause, exact root ranks and link; unmatched finds are false alarms.
    ``latency_it``: detection delay after the true onset in baseline iterations."""
    found = list(diag.get("anomalies") or [])
    used: set[int] = set()
    rows = []
    # stragglers slowed over the same iterations are one fault (as the simulator's
    # multi-rank compute faults): their truths merge
    merged: list[dict[str, Any]] = []
    for t in truth["anomalies"]:
        same = next(
            (
                m
                for m in merged
                if t["kind"] == m["kind"] == "slow"
                and t["cause"] == m["cause"] == "compute"
                and (t["iteration_start"], t.get("iteration_end"))
                == (m["iteration_start"], m.get("iteration_end"))
            ),
            None,
        )
        if same is not None:
            same["ranks"] = sorted(same["ranks"] + t["ranks"])
        else:
            merged.append(dict(t))
    for t in merged:
        if t["kind"] == "hang" and not t.get("triggered", True):
            continue
        best: int | None = None
        best_ov: Any = None
        for j, f in enumerate(found):
            if j in used or f["kind"] != t["kind"]:
                continue
            if t["kind"] == "slow":
                lo = max(t["start_ns"], f["start_ns"] or 0)
                hi = min(t["end_ns"] or 1 << 63, f["end_ns"] or 1 << 63)
                ov = hi - lo
                if ov < 0:
                    continue
            else:
                ov = 0
            # among overlapping finds, one of the same cause first (two faults at once
            # are two anomalies over the same time)
            ov = (f.get("cause") == t["cause"], ov)
            if best is None or ov > best_ov:
                best, best_ov = j, ov
        row: dict[str, Any] = {"truth": t["id"], "kind": t["kind"], "found": best is not None}
        if best is not None:
            used.add(best)
            f = found[best]
            row.update(
                cause=f["cause"] == t["cause"],
                ranks=sorted(f["ranks"]) == sorted(t["ranks"]),
                link=(sorted(f["link"] or []) == sorted(t["link"])) if t["link"] else None,
                got={k: f.get(k) for k in ("cause", "ranks", "link", "comm_kind", "stage")},
            )
            if f.get("detected_ns") and t.get("start_ns") and t.get("baseline_s"):
                row["latency_it"] = (f["detected_ns"] - t["start_ns"]) / (t["baseline_s"] * 1e9)
        rows.append(row)
    false = [
        {k: f.get(k) for k in ("kind", "cause", "ranks", "link", "start_ns")}
        for j, f in enumerate(found)
        if j not in used
    ]
    return {"matches": rows, "false_alarms": false}


def _quiet(spec: Spec, ex: Executor) -> np.ndarray:
    """Iterations that no GC pause, node burst or host pause touched, nor the one before
    (a pause near the end of an iteration delays the next one's operations)."""
    noisy = (ex.noise.gc > 0).any(axis=1) | (ex.noise.burst != 1.0).any(axis=1)
    for it, _, _ in spec.pauses:
        if 0 <= it < len(noisy):
            noisy[it] = True
    return ~(noisy | np.concatenate([[False], noisy[:-1]]))


def _cost(dur: np.ndarray, quiet: np.ndarray, base: float, quiet_base: float) -> float:
    """What a fault costs the job: the median of its iterations that no pause or burst
    touched over the healthy iterations' (at least 3 of each); otherwise the mean of all
    its iterations over the healthy median. The pauses a fault window happens to hold are
    no part of its cost: a 1% slow-down with two GC pauses in it is not a 20% one."""
    if quiet.sum() >= 3 and quiet_base > 0:
        return round(float(np.median(dur[quiet])) / quiet_base, 4)
    return round(float(np.nanmean(dur)) / base, 4)
