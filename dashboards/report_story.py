"""One story per report (:mod:`failslow.dashboards.report`): the diagnosed anomaly the report
is about, its window of iterations, and the critical path, what-if ranking, heatmap and
advice computed for that window, with a note wherever a section points elsewhere than the
diagnosis, or has nothing to say, and why. Times are wall-clock (UTC)."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.dashboards import critical_path as cp
from failslow.dashboards.severity import cost_gpu_hours
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

#: Iterations of the window (and before it) whose critical paths are walked.
MAX_PATH_ITERATIONS = 24
BASELINE_ITERATIONS = 8

Window = Callable[[int, int], tuple[pa.Table | None, pa.Table | None]]


def wall(ns: int | None, date: bool = False) -> str:
    """``15:06:40.123`` (UTC; with ``date``: ``2025-06-15 15:06:40.123 UTC``)."""
    if ns is None:
        return ""
    t = datetime.fromtimestamp(ns / 1e9, UTC)
    text = t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"
    return f"{t:%Y-%m-%d} {text} UTC" if date else text


def culprits(a: Anomaly) -> list[int]:
    return list(a.ranks) or list(a.link or [])


def who(a: Anomaly, meta: JobMeta) -> str:
    """``rank 37 (node4)``, ``link 22-24 (node2 ↔ node3)``, ``ranks 12, 14 (node1)``."""
    if a.link and len(a.link) == 2 and not (set(a.ranks) - set(a.link)):
        x, y = a.link
        return f"link {x}-{y} ({meta.nodes.get(x, '?')} ↔ {meta.nodes.get(y, '?')})"
    ranks = culprits(a)
    hosts = sorted({meta.nodes[r] for r in ranks if r in meta.nodes})
    on = f" ({', '.join(hosts)})" if hosts else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)) + on


def anomaly_cost(a: Anomaly, world: int, now_ns: int | None = None) -> float:
    start = a.start_ns or a.detected_ns or 0
    end = a.end_ns or a.detected_ns or now_ns or start
    return cost_gpu_hours(a.kind, a.slowdown, world, (end - start) / 1e9)


def primary(anomalies: Sequence[Anomaly], world: int) -> Anomaly | None:
    """The anomaly the report is about: the earliest hang (a hung job has one story), else
    the slow-down that cost the most GPU-hours."""
    hangs = sorted((a for a in anomalies if a.kind == "hang"),
                   key=lambda a: (a.start_ns or 0, a.id))
    if hangs:
        return hangs[0]
    slow = [a for a in anomalies if a.start_ns is not None]
    return max(slow, key=lambda a: (anomaly_cost(a, world), a.id), default=None)


def with_all_hung(focus: Anomaly, anomalies: Sequence[Anomaly]) -> Anomaly:
    """A hang ``focus`` naming the ranks of every hang of the job (each hung rank is its own
    anomaly; the story is one halt)."""
    if focus.kind != "hang":
        return focus
    ranks = sorted({r for a in anomalies if a.kind == "hang" for r in culprits(a)})
    d = focus.to_dict()
    d["ranks"] = ranks
    if d.get("link") and set(ranks) - set(d["link"]):
        d["link"] = None
    return Anomaly.from_dict(d)


def job_rows(iterations: pa.Table) -> pa.Table:
    if iterations.num_rows and (iterations.column("rank").to_numpy() == -1).any():
        return iterations.filter(pc.equal(iterations.column("rank"), -1))
    return iterations


@dataclass
class StoryWindow:
    """The anomaly's iterations: ``[t0, t1]`` and, in time order, their numbers, bounds and
    durations; ``before``: the same for the iterations before the anomaly."""

    t0: int
    t1: int
    iterations: list[tuple[int, int, int, int]]  # (iteration, t_start, t_end, duration)
    before: list[tuple[int, int, int, int]] = field(default_factory=list)


def window_of(iterations: pa.Table, a: Anomaly) -> StoryWindow | None:
    """The iterations that overlap ``a`` (None when none does)."""
    rows = job_rows(iterations)
    if rows.num_rows == 0 or a.start_ns is None:
        return None
    it = rows.column("iteration").to_numpy()
    t0 = rows.column("t_start").to_numpy()
    t1 = rows.column("t_end").to_numpy()
    dur = rows.column("duration_ns").to_numpy()
    end = a.end_ns if a.end_ns is not None else np.iinfo(np.int64).max
    inside = (t1 >= a.start_ns) & (t0 <= end)
    if not inside.any():
        return None
    order = np.argsort(t0, kind="stable")
    pick = [(int(it[i]), int(t0[i]), int(t1[i]), int(dur[i])) for i in order if inside[i]]
    before = [(int(it[i]), int(t0[i]), int(t1[i]), int(dur[i])) for i in order
              if t1[i] < a.start_ns]
    return StoryWindow(min(p[1] for p in pick), max(p[2] for p in pick), pick,
                       before[-BASELINE_ITERATIONS:])


def filter_time(table: pa.Table | None, t0: int, t1: int) -> pa.Table | None:
    """Rows of ``table`` inside ``[t0, t1]`` (coll: ``t``; span: overlapping)."""
    if table is None:
        return None
    if "t" in table.column_names:
        t = table.column("t")
        return table.filter(pc.and_(pc.greater_equal(t, t0), pc.less_equal(t, t1)))
    return table.filter(pc.and_(pc.less_equal(table.column("t_start"), t1),
                                pc.greater_equal(table.column("t_end"), t0)))


def filter_rounds(rounds: pa.Table, t0: int, t1: int) -> pa.Table:
    if rounds.num_rows == 0:
        return rounds
    t = rounds.column("t_first_enter")
    return rounds.filter(pc.and_(pc.greater_equal(t, t0), pc.less_equal(t, t1)))


# ---------------------------------------------------------------------------------------------
# critical path over the window


@dataclass
class PathStory:
    path: list[cp.Segment] | None
    iteration: int | None
    reason: str = ""
    #: rank -> (on-path compute ms per iteration in the window, before it)
    by_rank: dict[int, tuple[float, float]] = field(default_factory=dict)
    note: str = ""
    window_iterations: int = 0


def _on_path(coll: pa.Table, its: Sequence[tuple[int, int, int, int]]
             ) -> tuple[dict[int, float], dict[int, list[cp.Segment]]]:
    total: dict[int, float] = {}
    paths: dict[int, list[cp.Segment]] = {}
    for number, t0, t1, _ in its:
        path = cp.critical_path(coll, t0, t1)
        paths[number] = path
        for r, ns in cp.summarize(path)["compute_by_rank_ns"].items():
            total[r] = total.get(r, 0.0) + ns / 1e6 / max(len(its), 1)
    return total, paths


def path_story(window: Window | None, w: StoryWindow, a: Anomaly) -> PathStory:
    """Critical paths of the window's iterations (at most :data:`MAX_PATH_ITERATIONS`) and of
    the iterations before it; the iteration shown is the one where the culprit holds the
    path longest (else the slowest)."""
    its = w.iterations
    if len(its) > MAX_PATH_ITERATIONS:  # the slowest ones
        its = sorted(sorted(its, key=lambda x: -x[3])[:MAX_PATH_ITERATIONS])
    lo = min([x[1] for x in its] + [x[1] for x in w.before])
    coll = window(lo, w.t1)[0] if window else None
    if coll is None or coll.num_rows == 0:
        return PathStory(None, None, "no coll rows in the anomaly's iterations")
    during, paths = _on_path(coll, its)
    before, _ = _on_path(coll, w.before) if w.before else ({}, {})
    mine = set(culprits(a))
    best = max(its, key=lambda x: (sum(s.duration_ns for s in paths[x[0]]
                                       if s.kind == "compute" and s.rank in mine), x[3]))
    story = PathStory(paths[best[0]] or None, best[0], window_iterations=len(its))
    if not story.path:
        story.reason = f"no completed operation in iteration {best[0]}"
    story.by_rank = {r: (during.get(r, 0.0), before.get(r, 0.0))
                     for r in sorted(set(during) | set(before),
                                     key=lambda r: -(during.get(r, 0.0) - before.get(r, 0.0)))}
    story.note = _path_note(story, a)
    return story


def _path_note(story: PathStory, a: Anomaly) -> str:
    mine = culprits(a)
    grown = [r for r, (d, b) in story.by_rank.items() if d - b > 0]
    names = ", ".join(map(str, mine))
    if not grown:
        if a.cause == "communication":
            return (f"Agrees with the diagnosis: no rank's compute grew on the path; the "
                    f"slow-down is in the transfers (blue) at rank(s) {names}, as a "
                    "communication cause shows.")
        return ("No rank's on-path compute grew in the anomaly's iterations: the slow-down "
                "sits in communication time (blue segments).")
    top = grown[0]
    if top in mine:
        d, b = story.by_rank[top]
        return (f"Agrees with the diagnosis: rank {top} adds the most compute to the critical "
                f"path in the anomaly's iterations ({d:.1f} ms per iteration, {b:.1f} ms "
                "before it).")
    where = [i for i, r in enumerate(grown) if r in mine]
    d, b = story.by_rank[top]
    why = ("the diagnosis blames a transfer (communication), which shows on the path as "
           "communication time, not as a rank's compute" if a.cause == "communication" else
           "the path follows, in every round, the member that entered last: a rank that "
           "waits for the culprit's pipeline stage (point-to-point) or sits in a later stage "
           "enters late too, and clock offsets between nodes of a few ms move the gate")
    pos = (f"rank(s) {names} come {where[0] + 1}th by growth" if where
           else f"rank(s) {names} are not on it")
    return (f"Differs from the diagnosis: rank {top}'s on-path compute grew most ({b:.1f} → "
            f"{d:.1f} ms per iteration) and {pos}, because {why}.")


# ---------------------------------------------------------------------------------------------
# what-if over the window


def whatif_window(window: Window | None, meta: JobMeta, w: StoryWindow
                  ) -> tuple[dict[str, Any] | None, str]:
    """The what-if analysis of the window's operations (coll and span rows)."""
    if window is None:
        return None, "no rows of the window to analyse"
    try:
        from failslow.whatif.analysis import whatif
    except ImportError as e:
        return None, f"the what-if analysis is not installed ({e})"
    coll, span = window(w.t0, w.t1)
    tables = {k: filter_time(t, w.t0, w.t1) for k, t in (("coll", coll), ("span", span))
              if t is not None and t.num_rows}
    errors: list[str] = []
    tables_ok = {k: t for k, t in tables.items() if t is not None}
    result = whatif(tables_ok, meta, errors=errors) if tables_ok else None
    return result, "; ".join(errors) or ("" if result else "no operations in the window")


def whatif_note(whatif: Mapping[str, Any] | None, a: Anomaly, scope: str) -> str:
    if not whatif:
        return ""
    workers = list(whatif.get("workers") or [])
    mine = set(culprits(a))

    def covers(w: Mapping[str, Any]) -> bool:
        return bool(mine & ({int(w.get("rank", -1))} | set(w.get("ranks") or [])))

    place = next((i for i, w in enumerate(workers) if covers(w)), None)
    names = ", ".join(map(str, culprits(a)))
    if place == 0:
        return f"Agrees with the diagnosis ({scope}): rank(s) {names} rank first."
    if place is None:
        return (f"Differs from the diagnosis ({scope}): rank(s) {names} are not among the "
                f"{len(workers)} workers listed. The what-if charges a worker the step time "
                "its own operations add; a slow-down that sits in transfers between ranks "
                f"({a.cause}) is charged to communication types, not to a worker.")
    first = workers[0]
    return (f"Differs from the diagnosis ({scope}): rank(s) {names} come {place + 1}th; "
            f"rank {first.get('rank')} (worker of ranks {first.get('ranks', [])}) saves "
            f"{float(first.get('slowdown', 1)):.3f}x against "
            f"{float(workers[place].get('slowdown', 1)):.3f}x. The what-if removes one "
            "worker's excess at a time; a worker slow throughout the trace (imbalance) "
            "outranks a fault that lasted part of it.")


# ---------------------------------------------------------------------------------------------
# advice


def no_advice_reason(a: Anomaly | None, w: StoryWindow | None, meta: JobMeta,
                     costs: Mapping[str, float] | None = None) -> str:
    """Why the planner advised nothing, from the anomaly's impact and the strategies' costs
    (Greyhound §5: a strategy is advised once the accumulated impact reaches its cost)."""
    from failslow.mitigation.planner import ADDRESSES, DESCRIPTIONS, PlannerConfig

    if a is None:
        return "no anomaly was diagnosed"
    if a.kind == "hang":
        hosts = sorted({meta.nodes[r] for r in culprits(a) if r in meta.nodes})
        return ("the planner does not advise on hangs (nothing progresses, so there is no "
                "slow-down to re-balance): restart from the last checkpoint without "
                f"{who(a, meta)}" + (f"; check the GPUs of {', '.join(hosts)}" if hosts else ""))
    costs = dict(costs or PlannerConfig().cost_s)
    usable = sorted((s for s in costs if a.cause in ADDRESSES.get(s, ())), key=costs.__getitem__)
    if not usable:
        return f"no strategy addresses a {a.cause} slow-down"
    cheapest = usable[0]
    impact = None
    if w is not None and w.iterations:
        healthy = (float(np.median([x[3] for x in w.before])) if w.before
                   else float(min(x[3] for x in w.iterations)))
        impact = sum(max(x[3] - healthy, 0) for x in w.iterations) / 1e9
    elif a.slowdown and a.start_ns is not None and a.end_ns is not None:
        impact = (a.end_ns - a.start_ns) / 1e9 * (1 - 1 / max(a.slowdown, 1.0))
    if impact is None:
        return "the anomaly's impact could not be measured (no iterations in its window)"
    if impact < costs[cheapest]:
        return (f"the impact so far, {impact:.2f} s of training time over "
                f"{len(w.iterations) if w else 0} slow iteration(s), is below the cheapest "
                f"action's cost: {cheapest} ({DESCRIPTIONS.get(cheapest, '')}) costs "
                f"{costs[cheapest]:.3g} s")
    return (f"the impact ({impact:.2f} s) reached {cheapest}'s cost ({costs[cheapest]:.3g} s) "
            "but no planner decision was recorded for this anomaly")


# ---------------------------------------------------------------------------------------------
# what the report draws


@dataclass
class StoryParts:
    """What ``failslow report`` computed for the diagnosed anomaly (``anomaly``) in its
    window (:mod:`failslow.dashboards.report_story`): the heatmap's rounds and iteration
    count, the critical path's per-rank table and the notes that say where a section agrees
    or differs with the diagnosis, and the ``coll`` rows up to a hang's halt."""

    anomaly: Anomaly | None = None
    heat_rounds: pa.Table | None = None
    heat_iterations: int = 0
    heat_scope: str = ""
    critical_note: str = ""
    critical_by_rank: dict[int, tuple[float, float]] | None = None
    critical_iterations: int = 0
    whatif_note: str = ""
    hang_coll: pa.Table | None = None


def heat_caption(grid: np.ndarray, who_: np.ndarray, mine: Sequence[int], scope: str) -> str:
    if grid.size == 0 or float(grid.max()) <= 0:
        return (f'<p id="heatmap-caption" class="muted">No collective waits '
                f"{html.escape(scope)}.</p>")
    i, j = np.unravel_index(int(np.argmax(grid)), grid.shape)
    top = int(who_[i, j])
    text = f"Hottest cell {scope}: rank {top} (dp{i}, pp{j}), {grid[i, j]:.1f} ms/iteration."
    if mine:
        if top in mine:
            text += " Agrees with the diagnosis."
        else:
            cells = [f"rank {r}" for r in mine]
            text += (f" The diagnosis names {', '.join(cells)}: a rank that waits on a slow "
                     "pipeline peer enters its next collective late and is charged here too; "
                     "the heatmap shows who arrived last, not why.")
    return f'<p id="heatmap-caption" class="story">{html.escape(text)}</p>'
