"""``failslow report``: one self-contained HTML file about one job (and optionally a Chrome
trace of its slowest diagnosed iteration for Perfetto).

From a trace directory the job is diagnosed here (the same replay and detectors as ``failslow
analyze``); with ``--job`` everything is read from ClickHouse (embedded chDB under
``--data-dir`` or a server at ``--clickhouse``), as the stream processor stored it.
The page holds the iteration timeline with anomaly bands, the DP x PP heatmap, the anomaly
table, the critical path of a slow iteration (:mod:`failslow.dashboards.critical_path`), the
what-if breakdown (:mod:`failslow.whatif.analysis`, when available) and the mitigation
planner's advice (Greyhound §5.1, :mod:`failslow.mitigation.planner`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow import results
from failslow.cli.options import DeprecatedOption
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import JobMeta
from failslow.settings import get_settings

log = logging.getLogger(__name__)


@dataclass
class JobData:
    """Everything a report needs about one job."""

    meta: JobMeta
    diagnosis: Diagnosis
    iterations: pa.Table
    rounds: pa.Table
    truth: Diagnosis | None = None
    #: coll / span rows of a time window: fn(t_start, t_end) -> (coll, span or None)
    window: Any = None
    whatif_reason: str = ""
    notes: list[str] = field(default_factory=list)
    #: the mitigation planner's decisions (``Advice.to_dict()`` shape), in decision order
    advice: list[dict[str, Any]] = field(default_factory=list)
    advice_reason: str = ""
    #: the planner's action costs (s) by strategy; None: the planner's defaults
    planner_costs: dict[str, float] | None = None


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report", help="write a self-contained HTML report of one job (and a Perfetto trace)",
        description="Write one HTML file (no network needed to open it): iteration timeline "
                    "with anomaly bands, DP x PP heatmap, anomaly table, the critical path of "
                    "a slow iteration and the what-if breakdown. From a trace directory, or "
                    "with --job from ClickHouse.")
    p.add_argument("trace_dir", nargs="?", type=Path, help="a trace directory (events.md)")
    p.add_argument("--job", help="read this job from ClickHouse instead of a trace directory")
    settings = get_settings()
    p.add_argument("--data-dir", type=Path, default=settings.processor.data_dir,
                   help="embedded ClickHouse data directory (with --job; env "
                        "FAILSLOW_DATA_DIR)")
    p.add_argument("--clickhouse", default=settings.clickhouse.url, metavar="URL",
                   help="a ClickHouse server instead of embedded chDB (with --job; env "
                        "FAILSLOW_CLICKHOUSE)")
    p.add_argument("--clickhouse-url", dest="clickhouse", action=DeprecatedOption, metavar="URL",
                   help=argparse.SUPPRESS)
    p.add_argument("--database", default=None,
                   help="ClickHouse database (default failslow; the demo's is failslow_demo)")
    p.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    p.add_argument("--perfetto", type=Path, default=None, metavar="TRACE_JSON",
                   help="also write the slow iteration as a Chrome trace (open in Perfetto)")
    p.add_argument("--no-whatif", action="store_true", help="skip the what-if analysis")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------
# loading


def from_trace_dir(path: Path, whatif: bool = True) -> JobData:
    """Diagnose a trace directory the way ``failslow analyze`` does, keeping the derived
    rounds and iterations."""
    import pyarrow.compute as pc

    from failslow.cli.analyze import ReplayBar
    from failslow.comms import infer_comms
    from failslow.engine.analyzer import JobAnalyzer
    from failslow.engine.offline import KINDS, is_post_mortem
    from failslow.engine.runner import Tally, steps
    from failslow.replay import DEFAULT_WINDOW_NS, replay
    from failslow.tracedir import TraceDir

    td = TraceDir(path)
    meta = td.meta()
    tables: dict[str, pa.Table] = {k: td.read(k) for k in KINDS if k in td.kinds}
    if not meta.comms and "coll" in tables:
        meta = dataclasses.replace(meta, comms=infer_comms(tables["coll"], meta))
    analyzer = JobAnalyzer(meta)
    rounds, iterations = [], []
    advice: list[dict[str, Any]] = []
    with ReplayBar() as bar:
        told = Tally(bar)
        if "coll" in tables and tables["coll"].num_rows:
            span = pc.min_max(tables["coll"].column("t"))
            told.span(span["min"].as_py(), span["max"].as_py())
        for step in steps(analyzer, replay(tables, DEFAULT_WINDOW_NS),
                          post_mortem=is_post_mortem(path)):
            told.step(step)
            for out in step.outputs:
                rounds.append(out.rounds)
                iterations.append(out.iterations)
                advice.extend(a.to_dict() for a in out.advice)
    diagnosis = analyzer.diagnosis()
    data = JobData(meta, diagnosis, _concat(iterations, "iterations"), _concat(rounds, "rounds"))
    data.advice = advice
    planner = getattr(analyzer, "planner", None)
    if planner is not None:
        data.planner_costs = dict(planner.config.cost_s)
    elif not advice:
        data.advice_reason = "no mitigation planner"
    truth_file = Path(path) / "truth.json"
    if truth_file.exists():
        data.truth = Diagnosis.load(truth_file)
    coll = tables.get("coll")
    span = tables.get("span")

    def window(t0: int, t1: int) -> tuple[pa.Table | None, pa.Table | None]:
        return coll, span

    data.window = window
    if whatif:
        diagnosis.whatif, data.whatif_reason = _whatif(tables, meta)
    else:
        data.whatif_reason = "skipped (--no-whatif)"
    return data


def _whatif(tables: dict[str, pa.Table], meta: JobMeta) -> tuple[dict[str, Any] | None, str]:
    try:
        from failslow.whatif.analysis import whatif
    except ImportError as e:
        return None, f"the what-if analysis is not installed ({e})"
    errors: list[str] = []
    result = whatif(tables, meta, errors=errors)
    return result, "; ".join(errors)


def _concat(parts: list[pa.Table], kind: str) -> pa.Table:
    parts = [p for p in parts if p is not None and p.num_rows]
    if not parts:
        return results.empty(kind)
    return pa.concat_tables([p.select(results.SCHEMAS[kind].names).cast(results.SCHEMAS[kind])
                             for p in parts])


def _plain(table: pa.Table) -> pa.Table:
    cols = []
    for col in table.columns:
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if pa.types.is_large_string(col.type):
            col = col.cast(pa.string())
        cols.append(col)
    return pa.Table.from_arrays(cols, names=table.column_names)


def from_clickhouse(job: str, data_dir: Path | None, url: str | None,
                    database: str) -> tuple[JobData, Any]:
    """Read one job back from ClickHouse; returns the data and the client (close it)."""
    from failslow import events
    from failslow.stream.clickhouse import ClickHouseSink, connect

    client = connect(data_dir, url)
    try:
        sink = ClickHouseSink(client, database, create=False)
        meta_rows = sink.read("meta", job).to_pylist()
        if not meta_rows:
            raise LookupError(f"job {job!r} not found in ClickHouse database {database!r}")
        meta = events.parse_meta_row(meta_rows[-1], f"{database}.meta")
        anomalies = [a for _, a in sink.anomalies(job)]
        diagnosis = Diagnosis(job, anomalies=anomalies)
        data = JobData(meta, diagnosis, sink.read("iterations", job), sink.read("rounds", job))
        try:
            rows = client.query(
                f"SELECT result FROM `{database}`.whatif FINAL WHERE job = {{job:String}} "
                "ORDER BY computed_ns DESC LIMIT 1", parameters={"job": job}).result_rows
            diagnosis.whatif = json.loads(rows[0][0]) if rows else None
            data.whatif_reason = "" if rows else "the processor stored no what-if result"
        except Exception as e:  # noqa: BLE001 - an older schema without the table
            data.whatif_reason = f"no what-if table ({str(e).splitlines()[0][:120]})"

        data.advice, data.advice_reason = _stored_advice(client, database, job)

        def window(t0: int, t1: int) -> tuple[pa.Table | None, pa.Table | None]:
            params = {"job": job, "t0": t0, "t1": t1}
            coll = client.query_arrow(
                f"SELECT * EXCEPT (ingested_at) FROM `{database}`.coll FINAL WHERE job = "
                "{job:String} AND t BETWEEN {t0:Int64} AND {t1:Int64}", parameters=params)
            span = client.query_arrow(
                f"SELECT * EXCEPT (ingested_at) FROM `{database}`.span FINAL WHERE job = "
                "{job:String} AND t_end >= {t0:Int64} AND t_start <= {t1:Int64}",
                parameters=params)
            return (events.conform(_plain(coll), "coll"),
                    events.conform(_plain(span), "span") if span.num_rows else None)

        data.window = window
        return data, client
    except BaseException:
        client.close()
        raise


def _stored_advice(client: Any, database: str, job: str) -> tuple[list[dict[str, Any]], str]:
    """The job's rows of the ``advice`` table (plan JSON parsed), in decision order."""
    try:
        table = client.query_arrow(
            f"SELECT * EXCEPT (ingested_at) FROM `{database}`.advice FINAL "
            "WHERE job = {job:String} ORDER BY t_ns, advice_id", parameters={"job": job})
    except Exception as e:  # noqa: BLE001 - an older schema without the table
        return [], f"no advice table ({str(e).splitlines()[0][:120]})"
    rows = _plain(table).to_pylist()
    for r in rows:
        if isinstance(r.get("plan"), str):
            r["plan"] = json.loads(r["plan"])
    return rows, "" if rows else "the planner stored no advice for this job"


# ---------------------------------------------------------------------------------------------


def _story(data: JobData, whatif: bool) -> tuple[Any, Any, tuple[int, int] | None]:
    """The report's story (:mod:`failslow.dashboards.report_story`): the diagnosed anomaly,
    and the critical path, heatmap, what-if and advice reason of its window. Returns the
    story parts, the critical-path story and the shown iteration's bounds."""
    from failslow.dashboards import report_story as rs

    meta = data.meta
    focus = rs.primary(data.diagnosis.anomalies, meta.world_size)
    if focus is not None:
        focus = rs.with_all_hung(focus, data.diagnosis.anomalies)
    story = rs.StoryParts(anomaly=focus)
    w = rs.window_of(data.iterations, focus) if focus is not None else None
    path = None
    bounds = None
    if focus is not None and focus.kind == "hang" and data.window is not None:
        start = focus.start_ns or focus.detected_ns or 0
        end = max(a.detected_ns or a.start_ns or 0 for a in data.diagnosis.anomalies)
        story.hang_coll = data.window(start - 600 * 10**9, end + 600 * 10**9)[0]
    if w is not None and focus is not None:
        path = rs.path_story(data.window, w, focus)
        story.critical_note, story.critical_by_rank = path.note, path.by_rank
        story.critical_iterations = path.window_iterations
        bounds = next(((t0, t1) for n, t0, t1, _ in w.iterations if n == path.iteration), None)
        first, last = w.iterations[0][0], w.iterations[-1][0]
        story.heat_rounds = rs.filter_rounds(data.rounds, w.t0, w.t1)
        story.heat_iterations = len(w.iterations)
        story.heat_scope = (f"in the anomaly's iterations {first}-{last} "
                            f"({rs.wall(w.t0)}-{rs.wall(w.t1)} UTC)")
        if whatif and focus.kind == "slow":
            result, why = rs.whatif_window(data.window, meta, w)
            scope = "the whole trace"
            if result is not None:
                data.diagnosis.whatif = result
                scope = f"computed on the anomaly's iterations {first}-{last}"
            elif why:
                data.whatif_reason = "; ".join(x for x in (
                    data.whatif_reason, f"on the anomaly's iterations: {why}") if x)
            story.whatif_note = rs.whatif_note(data.diagnosis.whatif, focus, scope)
    mine = [a for a in data.advice if focus is not None and a.get("anomaly_id") == focus.id]
    if not mine and (focus is not None or not data.advice_reason):
        reason = rs.no_advice_reason(focus, w, meta, data.planner_costs)
        if data.advice:
            reason = f"none for {focus.id if focus else 'the diagnosed anomaly'}: {reason}"
        data.advice_reason = reason
    return story, path, bounds


def build(data: JobData, out: Path, perfetto: Path | None = None,
          whatif: bool = True) -> dict[str, Any]:
    """Write the report (and the Chrome trace); returns what was done."""
    from failslow.dashboards import critical_path as cp
    from failslow.dashboards import report_story as rs
    from failslow.dashboards.report import write_report

    anomalies: list[Anomaly] = data.diagnosis.anomalies
    story, told, window = _story(data, whatif)
    path: list[cp.Segment] | None = None
    iteration = None
    reason = ""
    coll = span = None
    if told is not None:
        path, iteration, reason = told.path, told.iteration, told.reason
        if window is not None and data.window:
            coll, span = data.window(*window)
    elif story.anomaly is not None and story.anomaly.kind == "hang" and \
            data.iterations.num_rows == 0:
        reason = ("the job hung before any iteration completed; it halted at "
                  f"{rs.who(story.anomaly, data.meta)} (see the timeline to the halt)")
    else:
        try:
            iteration, t0, t1 = cp.slow_iteration(data.iterations, anomalies)
            window = (t0, t1)
            coll, span = data.window(t0, t1) if data.window else (None, None)
            if coll is None or coll.num_rows == 0:
                reason = "no coll rows in the slow iteration"
            else:
                path = cp.critical_path(coll, t0, t1)
                if not path:
                    reason = f"no completed operation in iteration {iteration}"
        except ValueError as e:
            reason = f"no iterations were detected ({e})"
    images: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        if data.diagnosis.whatif and "worker_grid" in data.diagnosis.whatif:
            try:
                from failslow.whatif.analysis import heatmaps

                images = heatmaps(data.diagnosis.whatif, tmp)
            except (ImportError, KeyError, ValueError) as e:
                log.warning("what-if heatmaps not drawn: %s", e)
        write_report(out, data.meta, data.diagnosis, data.iterations, data.rounds,
                     truth=data.truth, critical_path=path, critical_iteration=iteration,
                     critical_reason=reason, whatif_images=images,
                     whatif_reason=data.whatif_reason, advice=data.advice,
                     advice_reason=data.advice_reason, sections=True, story=story)
    done: dict[str, Any] = {"report": str(out), "anomalies": len(anomalies),
                            "critical_iteration": iteration,
                            "critical_segments": len(path or []),
                            "whatif": data.diagnosis.whatif is not None,
                            "advice": len(data.advice)}
    if perfetto is not None:
        if window is None or coll is None:
            raise ValueError(f"cannot export a Perfetto trace: {reason}")
        trace = cp.chrome_trace(data.meta, coll, window[0], window[1], span, path or (),
                                anomalies)
        perfetto.parent.mkdir(parents=True, exist_ok=True)
        perfetto.write_text(json.dumps(trace))
        done["perfetto"] = str(perfetto)
        done["trace_events"] = len(trace["traceEvents"])
    return done


def run(args: argparse.Namespace) -> int:
    from failslow.stream.clickhouse import DEFAULT_DATABASE

    if (args.trace_dir is None) == (args.job is None):
        print("failslow report: give a TRACE_DIR or --job ID (one of them)", file=sys.stderr)
        return 2
    client = None
    try:
        if args.job is not None:
            data, client = from_clickhouse(args.job, args.data_dir, args.clickhouse,
                                           args.database or DEFAULT_DATABASE)
        else:
            data = from_trace_dir(args.trace_dir, whatif=not args.no_whatif)
        done = build(data, args.out, args.perfetto, whatif=not args.no_whatif)
    except (LookupError, ValueError, FileNotFoundError) as e:
        print(f"failslow report: {e}", file=sys.stderr)
        return 1
    finally:
        if client is not None:
            client.close()
    print(f"report: {done['report']} ({done['anomalies']} anomalies, critical path of "
          f"iteration {done['critical_iteration']}: {done['critical_segments']} segments, "
          f"what-if {'yes' if done['whatif'] else 'no'})")
    if "perfetto" in done:
        print(f"perfetto trace: {done['perfetto']} ({done['trace_events']} events; open it at "
              "ui.perfetto.dev or chrome://tracing)")
    return 0
