"""One story per report (issue 18): the anomaly a report is about, its window, and the notes
that say where the critical path, the what-if ranking and the heatmap agree with the
diagnosis or why not, and why there is no advice."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from failslow import results
from failslow.dashboards import report_story as rs
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

T0 = 1_750_000_000_000_000_000
S = 10**9
META = JobMeta(job="j", t=1, world_size=8, tp=1, pp=2, dp=4, cp=1, microbatches=4,
               schedule="1f1b", nodes={r: f"host{r // 4}" for r in range(8)}, comms=())


def _slow(id_: str, rank: int, start_s: float, end_s: float, slowdown: float) -> Anomaly:
    return Anomaly(id=id_, kind="slow", cause="compute", ranks=[rank],
                   start_ns=T0 + int(start_s * S), end_ns=T0 + int(end_s * S),
                   slowdown=slowdown)


def _iterations(durations_ms: list[float]) -> pa.Table:
    rows, t = [], T0
    for i, d in enumerate(durations_ms):
        rows.append({"job": "j", "rank": -1, "iteration": i, "t_start": t,
                     "t_end": t + int(d * 1e6), "duration_ns": int(d * 1e6)})
        t += int(d * 1e6)
    schema = results.SCHEMAS["iterations"]
    full = [{f.name: r.get(f.name) for f in schema} for r in rows]
    return pa.Table.from_pylist(full, schema=schema)


def test_the_report_is_about_the_hang_else_the_costliest_slow_down() -> None:
    short = _slow("a", 3, 0, 10, 3.0)
    long = _slow("b", 5, 0, 600, 1.2)  # 600 s x 1/6 > 10 s x 2/3
    assert rs.primary([short, long], 8) is long
    hang = Anomaly(id="h", kind="hang", cause="hardware", ranks=[6], start_ns=T0 + 5 * S)
    other = Anomaly(id="h2", kind="hang", cause="hardware", ranks=[7], start_ns=T0 + 6 * S)
    assert rs.primary([short, long, other, hang], 8) is hang
    merged = rs.with_all_hung(hang, [hang, other, long])
    assert merged.ranks == [6, 7] and rs.who(merged, META) == "ranks 6, 7 (host1)"
    assert rs.primary([], 8) is None


def test_window_and_why_no_advice() -> None:
    durs = [100.0] * 10 + [130.0] * 10 + [100.0] * 5
    it = _iterations(durs)
    a = _slow("s", 5, 1.05, 2.29, 1.3)
    w = rs.window_of(it, a)
    assert w is not None and [x[0] for x in w.iterations] == list(range(10, 20))
    assert len(w.before) == rs.BASELINE_ITERATIONS
    why = rs.no_advice_reason(a, w, META, {"S2": 5.0, "S3": 60.0, "S4": 1800.0})
    # 10 iterations x 30 ms over the healthy 100 ms: 0.3 s < S2's 5 s
    assert why.startswith("the impact so far, 0.30 s of training time over 10 slow "
                          "iteration(s), is below the cheapest action's cost: S2"), why
    why = rs.no_advice_reason(a, w, META, {"S2": 0.1, "S3": 60.0, "S4": 1800.0})
    assert "reached S2's cost" in why
    comm = Anomaly.from_dict({**a.to_dict(), "cause": "communication"})
    assert "S3" in rs.no_advice_reason(comm, w, META, {"S2": 0.01, "S3": 60.0, "S4": 99.0})
    hang = Anomaly(id="h", kind="hang", cause="hardware", ranks=[6], start_ns=T0)
    assert "restart from the last checkpoint without rank 6 (host1)" in rs.no_advice_reason(
        hang, None, META)


def test_notes_say_where_a_section_agrees_or_why_not() -> None:
    a = _slow("s", 5, 0, 10, 1.3)
    first = {"workers": [{"rank": 4, "ranks": [4, 5], "slowdown": 1.2},
                         {"rank": 6, "slowdown": 1.1}]}
    assert rs.whatif_note(first, a, "window").startswith("Agrees with the diagnosis (window)")
    later = {"workers": [{"rank": 6, "ranks": [6, 7], "slowdown": 1.2},
                         {"rank": 5, "slowdown": 1.1}]}
    note = rs.whatif_note(later, a, "the whole trace")
    assert note.startswith("Differs from the diagnosis (the whole trace): rank(s) 5 come 2th")
    assert "1.200x against 1.100x" in note
    absent = rs.whatif_note({"workers": [{"rank": 1, "slowdown": 1.0}]}, a, "w")
    assert "not among the 1 workers" in absent

    story = rs.PathStory(None, 3, by_rank={5: (40.0, 1.0), 2: (10.0, 9.0)})
    assert rs._path_note(story, a).startswith("Agrees with the diagnosis: rank 5 adds the most")
    story = rs.PathStory(None, 3, by_rank={2: (50.0, 1.0), 5: (20.0, 1.0)})
    note = rs._path_note(story, a)
    assert note.startswith("Differs from the diagnosis: rank 2's on-path compute grew most "
                           "(1.0 → 50.0 ms per iteration) and rank(s) 5 come 2th"), note

    grid = np.array([[0.0, 9.0], [1.0, 2.0]])
    who = np.array([[0, 5], [2, 3]])
    assert "rank 5 (dp0, pp1)" in rs.heat_caption(grid, who, [5], "in the window")
    assert "Agrees" in rs.heat_caption(grid, who, [5], "w")
    assert "The diagnosis names rank 3" in rs.heat_caption(grid, who, [3], "w")


def test_wall_clock() -> None:
    assert rs.wall(T0 + 123_456_789) == "15:06:40.123"
    assert rs.wall(T0, date=True) == "2025-06-15 15:06:40.000 UTC"
    assert rs.wall(None) == ""


def test_anomaly_table_names_the_report_that_took_one_over() -> None:
    from failslow.dashboards.report import anomaly_rows
    link = Anomaly(id="linkrate-0", kind="slow", cause="communication", ranks=[1, 5],
                   link=[1, 5], start_ns=T0, end_ns=T0 + 3 * S, slowdown=1.0,
                   extra={"superseded_by": "slow-1"})
    html = anomaly_rows([link, _slow("slow-1", 5, 2, 9, 1.4)], T0)
    assert html.count("superseded by slow-1") == 1


def test_anomaly_table_names_what_a_revised_report_blamed_first() -> None:
    from failslow.dashboards.report import anomaly_rows
    link = Anomaly(id="slow-0", kind="slow", cause="communication", ranks=[28, 36],
                   link=[28, 36], start_ns=T0, detected_ns=T0 + 5 * S, slowdown=1.15,
                   extra={"revised": {"cause": "compute", "ranks": [18], "link": None,
                                      "detected_ns": T0 + 3 * S}})
    html = anomaly_rows([link, _slow("slow-1", 5, 2, 9, 1.4)], T0)
    assert html.count(f"(revised: compute on rank 18 at {rs.wall(T0 + 3 * S)})") == 1


def test_whatif_section_says_when_its_slowdown_is_understated() -> None:
    from failslow.dashboards.report import _whatif_html
    caveat = {"steps_faster_than_ideal": [2, 3], "text": "the straggler-free simulation is "
              "slower than the job: 2 of 9 steps ran faster than it"}
    html = _whatif_html({"slowdown": 0.87, "caveat": caveat}, [], "")
    assert 'id="whatif-caveat"' in html and "2 of 9 steps ran faster" in html
    assert "whatif-caveat" not in _whatif_html({"slowdown": 1.2}, [], "")
