"""``failslow demo``: the whole online path on one machine in under a minute.

Simulates the ``demo`` preset (64 ranks, tp2 pp4 dp8, a compute straggler and later a slow
link), publishes its events in time order through the in-process transport (``meta``
first, then 100 ms windows of trace time), runs the stream processor on event time, stores
events, rounds, iterations, anomalies and the mitigation planner's advice (Greyhound §5.1)
in embedded ClickHouse (chDB) under ``DATA_DIR/clickhouse``, reads the anomalies and the
advice back from there, compares the anomalies with the simulator's ground truth and writes
``DATA_DIR/report.html``.

The planner's action costs are Greyhound's seconds and minutes of lost training time (S2
5 s, S3 60 s, S4 30 min) for jobs that run for days; the demo job lasts 25 s with 0.4 s
iterations, so its costs are scaled to it (:data:`DEMO_COSTS`: S2 after half an
iteration's worth of lost time, S3 after one), so that the ladder shows.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from failslow.cli.options import DeprecatedOption
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.replay import DEFAULT_WINDOW_NS, replay
from failslow.stream.clickhouse import ClickHouseSink, connect, default_data_dir

DEMO_DATABASE = "failslow_demo"
#: The planner's action costs (s of lost training time) scaled to the demo's 25 s job.
DEMO_COSTS = {"S2": 0.2, "S3": 0.4, "S4": 30.0}
#: About this many processor runs (checkpoints) over the whole replay.
CHECKPOINTS = 60


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="simulate a 64-rank job with two faults and diagnose it while streaming",
        description="Simulate a 64-rank job (tp2 pp4 dp8) with a compute straggler and a slow "
                    "link, stream its events through the processor into embedded ClickHouse, "
                    "print the diagnosis next to the injected faults and write an HTML report.")
    p.add_argument("--data-dir", type=Path, default=None,
                   help=f"where the ClickHouse data and report.html go "
                        f"(default: {default_data_dir()})")
    p.add_argument("--seed", type=int, default=0, help="simulation seed (default 0)")
    p.add_argument("--scenario", default="demo", help="simulator preset (default: demo)")
    p.add_argument("--clickhouse", default=None, metavar="URL",
                   help="store in this ClickHouse server instead of embedded chDB")
    p.add_argument("--clickhouse-url", dest="clickhouse", action=DeprecatedOption, metavar="URL",
                   help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from failslow.simulator import load_scenario, simulate
    from failslow.stream import processor as processor_module
    from failslow.stream.processor import ProcessorConfig, StreamProcessor, default_whatif
    from failslow.stream.transport import InProcessTransport

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    data_dir = Path(args.data_dir) if args.data_dir is not None else default_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    with console.status(f"simulating preset {args.scenario!r} (seed {args.seed})"):
        sim = simulate(load_scenario(args.scenario), args.seed)
    meta, truth = sim.meta, sim.truth
    n_events = sum(t.num_rows for k, t in sim.tables.items() if k != "meta")
    console.print(f"simulated job [bold]{meta.job}[/]: {meta.world_size} ranks "
                  f"(tp{meta.tp} pp{meta.pp} dp{meta.dp}), {n_events:,} events "
                  f"in {time.perf_counter() - started:.1f} s")

    from failslow.stream.clickhouse import describe_error
    from failslow.stream.kafka_security import quiet_client_logs

    quiet_client_logs()
    try:
        client = connect(data_dir, args.clickhouse)
        client.command("SELECT 1")
    except Exception as e:
        if args.clickhouse and not isinstance(e, ValueError):
            print(f"failslow demo: {describe_error(e, args.clickhouse)}", file=sys.stderr)
            return 1
        raise
    try:
        sink = ClickHouseSink(client, DEMO_DATABASE, create=False)
        sink.drop()  # a fresh database per run: re-running the demo starts clean
        sink.create_schema()
        transport = InProcessTransport(keep_committed=False)
        config = ProcessorConfig(clock="event", checkpoint_messages=1 << 30,
                                 checkpoint_interval_s=math.inf)
        processor = StreamProcessor(transport, sink, config,
                                    analyzer_factory=_demo_analyzer(processor_module),
                                    whatif_factory=default_whatif)
        windows = list(replay(sim.tables, DEFAULT_WINDOW_NS))
        chunk = max(1, math.ceil(len(windows) / CHECKPOINTS))
        t_first = windows[0][0] if windows else 0
        transport.publish_meta(meta)
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                            console=console, transient=False)
        with progress:
            task = progress.add_task("streaming 100 ms windows", total=len(windows), info="")
            for i, (now, batch) in enumerate(windows):
                transport.publish_batch(meta.job, batch)
                if (i + 1) % chunk == 0 or i + 1 == len(windows):
                    processor.run(until_idle=True)
                    progress.update(task, completed=i + 1, info=(
                        f"trace {(now - t_first) / 1e9:6.1f} s, "
                        f"{processor.stats.anomaly_reports} anomaly reports"))
        stats = processor.stats
        diagnosis = processor.diagnosis(meta.job)
        stored = [a for _, a in sink.anomalies(meta.job)]
        iterations = sink.read("iterations", meta.job)
        rounds = sink.read("rounds", meta.job)
        stored_events = sink.count("coll", meta.job)
        advice = sink.read("advice", meta.job)
    finally:
        client.close()

    from failslow.dashboards.report import match_truth, write_report

    t0 = _origin(iterations, rounds, meta.t)
    console.print(_anomaly_table(stored, t0, f"Diagnosis (read back from ClickHouse "
                                             f"{DEMO_DATABASE}.anomalies)"))
    matches, extra = match_truth(stored, truth.anomalies)
    console.print(_truth_table(matches, extra, t0))
    console.print(_advice_table(advice, t0, f"Mitigation advice (read back from ClickHouse "
                                            f"{DEMO_DATABASE}.advice)"))
    found = sum(m.found is not None for m in matches)

    report_diag = Diagnosis(job=meta.job, iterations=diagnosis.iterations, anomalies=stored,
                            whatif=diagnosis.whatif)
    report = write_report(data_dir / "report.html", meta, report_diag, iterations, rounds,
                          truth=truth, title=f"failslow demo: {meta.job}")
    elapsed = time.perf_counter() - started
    console.print(
        f"found {found} of {len(matches)} injected faults, {len(extra)} extra; "
        f"{stats.messages:,} messages, {sum(stats.rows.values()):,} rows "
        f"({stored_events:,} coll rows stored), {stats.dead_letters} dead letters, "
        f"{stats.errors} errors, {stats.checkpoints} checkpoints, {advice.num_rows} advice "
        f"rows; {elapsed:.1f} s")
    console.print(f"ClickHouse data: {data_dir / 'clickhouse'} (database {DEMO_DATABASE})")
    console.print(f"report: {report}")
    if stats.errors:
        console.print(f"[red]the analyzer failed on {stats.errors} batch(es); see the log[/]")
        return 1
    return 0


def _demo_analyzer(processor_module: Any) -> Any:
    """The processor's default analyzer with the planner's costs scaled to the demo job."""
    from failslow.mitigation.planner import PlannerConfig

    def make(meta: Any) -> Any:
        analyzer = processor_module.default_analyzer(meta)
        if getattr(analyzer, "planner", None) is not None:
            analyzer.planner.config = PlannerConfig(cost_s=dict(DEMO_COSTS))
        return analyzer
    return make


def _advice_table(advice: Any, t0: int, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("at (UTC)", "anomaly", "strategy", "action", "impact s", "cost s", "reason"):
        table.add_column(col, justify="right" if col.endswith(" s") else "left")
    rows = sorted(advice.to_pylist(), key=lambda r: (r["t_ns"], r["advice_id"]))
    for r in rows:
        table.add_row(_s(r["t_ns"], t0), r["anomaly_id"], r["strategy"], r["action"],
                      f"{r['impact_s']:.3g}", f"{r['cost_s']:.3g}", r["reason"])
    if not rows:
        table.add_row("-", "no advice", "", "", "", "", "")
    return table


def _origin(iterations: Any, rounds: Any, default: int) -> int:
    import pyarrow.compute as pc

    starts = []
    if iterations.num_rows:
        starts.append(int(pc.min(iterations.column("t_start")).as_py()))
    if rounds.num_rows:
        starts.append(int(pc.min(rounds.column("t_first_enter")).as_py()))
    return min(starts) if starts else default


def _s(ns: int | None, t0: int) -> str:
    """Wall-clock time (UTC) of ``ns``; ``t0`` kept for the callers."""
    from failslow.dashboards.report_story import wall

    return "-" if ns is None else wall(ns)


def _who(a: Anomaly) -> str:
    if a.link:
        return "link " + "-".join(str(r) for r in a.link)
    return ",".join(str(r) for r in a.ranks)


def _anomaly_table(anomalies: list[Anomaly], t0: int, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "kind", "cause", "ranks / link", "stage", "start (UTC)", "detected (UTC)",
                "end (UTC)", "slowdown"):
        table.add_column(col, justify="right" if col.endswith(("UTC)", "slowdown")) else "left")
    for a in anomalies:
        table.add_row(a.id, a.kind, a.cause, _who(a), a.stage or "-", _s(a.start_ns, t0),
                      _s(a.detected_ns, t0), _s(a.end_ns, t0),
                      "-" if a.slowdown is None else f"{a.slowdown:.2f}x")
    if not anomalies:
        table.add_row("-", "no anomalies", "", "", "", "", "", "", "")
    return table


def _truth_table(matches: Any, extra: list[Anomaly], t0: int) -> Table:
    table = Table(title="Against the simulator's ground truth", title_justify="left")
    for col in ("injected", "ranks / link", "start (UTC)", "end (UTC)", "result",
                "diagnosed as"):
        table.add_column(col)
    for m in matches:
        t = m.truth
        table.add_row(f"{t.kind}/{t.cause}", _who(t), _s(t.start_ns, t0), _s(t.end_ns, t0),
                      "[green]found[/]" if m.found is not None else "[red]missed[/]",
                      f"{m.found.id}: {m.found.cause} {_who(m.found)}" if m.found else "")
    for a in extra:
        table.add_row("(not injected)", _who(a), _s(a.start_ns, t0), _s(a.end_ns, t0),
                      "[yellow]extra[/]", a.id)
    return table
