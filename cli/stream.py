"""The live pipeline's commands (README, Architecture; issue 6):

    failslow replay TRACE_DIR [--speed X | --asap]    publish a trace to Kafka in time order
    failslow process [--exit-when-idle SECONDS]       run the stream processor
    failslow query anomalies --job ID [--json]        what the store holds for a job
    failslow query jobs                               the jobs in the store

Every command takes ``--kafka``, ``--clickhouse`` and ``--data-dir`` (with the environment
twins ``FAILSLOW_KAFKA``, ``FAILSLOW_CLICKHOUSE``, ``FAILSLOW_DATA_DIR``), so one environment
configures them all; a command ignores what it does not use. Without ``--clickhouse`` the
store is embedded chDB in ``DATA_DIR/clickhouse`` (one process at a time: stop
``failslow process`` before ``failslow query`` on the same directory, or use a server).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from failslow.settings import get_settings

log = logging.getLogger(__name__)


def _common(p: argparse.ArgumentParser) -> None:
    settings = get_settings()  # the flags' defaults (environment, config file)
    g = p.add_argument_group("connections (shared by replay, process and query)")
    g.add_argument("--kafka", default=settings.kafka.bootstrap, metavar="HOST:PORT[,...]",
                   help="Kafka bootstrap servers (env FAILSLOW_KAFKA; default: the broker "
                        "of 'failslow infra up', else 127.0.0.1:9092)")
    g.add_argument("--clickhouse", default=settings.clickhouse.url, metavar="URL",
                   help="ClickHouse server URL, e.g. http://default:@127.0.0.1:8123 (env "
                        "FAILSLOW_CLICKHOUSE; default: embedded chDB in DATA_DIR/clickhouse)")
    g.add_argument("--data-dir", type=Path, default=settings.processor.data_dir,
                   metavar="DIR",
                   help="where the embedded store lives (env FAILSLOW_DATA_DIR; default "
                        "$XDG_DATA_HOME/failslow or ~/.local/share/failslow)")
    g.add_argument("--database", default=settings.clickhouse.database,
                   help="ClickHouse database (env FAILSLOW_DATABASE; default %(default)s)")
    g.add_argument("--topic-prefix", default=settings.kafka.topic_prefix, metavar="PREFIX",
                   help="put before every Kafka topic name, to share a cluster (env "
                        "FAILSLOW_TOPIC_PREFIX; default none)")
    g.add_argument("--partitions", type=int, default=settings.kafka.partitions,
                   help="partitions of the topics created (env FAILSLOW_PARTITIONS; "
                        "default %(default)s)")


def add_parser(subparsers: Any) -> None:
    """Register ``failslow replay``, ``failslow process`` and ``failslow query``."""
    settings = get_settings()
    rp = subparsers.add_parser(
        "replay", help="publish a trace directory to Kafka in time order",
        description="Publish a trace directory (events.md) to the Kafka topics of the stream "
                    "processor: the job's meta first, then 100 ms windows of trace time in "
                    "time order, one message per record kind (with a watermark header: the "
                    "kind is complete up to the window's end), paced at --speed times real "
                    "time (or as fast as possible with --asap).")
    rp.add_argument("trace_dir", metavar="TRACE_DIR", type=Path)
    pace = rp.add_mutually_exclusive_group()
    pace.add_argument("--speed", type=float, default=1.0, metavar="X",
                      help="X times real time (1 = real time, the default)")
    pace.add_argument("--asap", action="store_true", help="as fast as possible")
    rp.add_argument("--window-ms", type=float, default=100.0,
                    help="trace time per published batch (default %(default)s)")
    rp.add_argument("--job", default=None,
                    help="publish under this job id instead of the trace's (one-job traces)")
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    _common(rp)
    rp.set_defaults(func=cmd_replay)

    pr = subparsers.add_parser(
        "process", help="run the stream processor (Kafka -> detectors -> ClickHouse)",
        description="Consume the event topics, run the detectors per job (the same code as "
                    "'failslow analyze'), tick the hang detector on wall time, write events, "
                    "rounds, iterations, anomalies and what-if results to ClickHouse and "
                    "publish anomalies on failslow.anomalies. At-least-once with checkpoints: "
                    "a restart resumes the detectors where they were and stores nothing "
                    "twice. Stops on SIGTERM/SIGINT after a last checkpoint.")
    pr.add_argument("--exit-when-idle", type=float, metavar="SECONDS",
                    default=settings.processor.exit_when_idle,
                    help="stop after SECONDS without a new message (env "
                         "FAILSLOW_EXIT_WHEN_IDLE; default: run until stopped)")
    pr.add_argument("--group", default=settings.kafka.group,
                    help="Kafka consumer group (env FAILSLOW_GROUP; default %(default)s)")
    metrics_port = settings.processor.metrics_port
    pr.add_argument("--metrics-port", type=int,
                    default=-1 if metrics_port is None else metrics_port,
                    help="Prometheus metrics on http://127.0.0.1:PORT/metrics (env "
                         "FAILSLOW_METRICS_PORT; default %(default)s; 0: any free port; "
                         "-1: off)")
    pr.add_argument("--checkpoint-interval", type=float, default=2.0, metavar="SECONDS",
                    help="write and commit at least this often (default %(default)s)")
    pr.add_argument("--snapshot-interval", type=float, default=60.0, metavar="SECONDS",
                    help="save the detector state at least this often (default %(default)s)")
    pr.add_argument("--store-events", action=argparse.BooleanOptionalAction, default=True,
                    help="also store the raw event tables (default: yes)")
    pr.add_argument("--detect", action=argparse.BooleanOptionalAction, default=True,
                    help="run the detectors (default: yes; --no-detect with --store-events "
                         "and its own --group only stores events, so that storing and "
                         "detecting can run on a core each)")
    pr.add_argument("--detectors", default=settings.processor.detectors, metavar="NAMES",
                    help="run only these registered detectors, comma-separated (iterations, "
                         "evidence, slowdown, hang, linkrate; a detector brings the ones "
                         "whose output "
                         "it reads). One job's detection then spreads over several "
                         "processors, each with its own --group and set, e.g. 'hang' beside "
                         "'slowdown,linkrate' (env FAILSLOW_DETECTORS; default: all)")
    pr.add_argument("--export", default=settings.processor.exports, metavar="TABLES",
                    help="publish these derived tables for other consumer groups, on "
                         "failslow.derived.<table> (iterations, evidence): a stage of one "
                         "job's detection, e.g. '--detectors iterations --export iterations' "
                         "or '--detectors evidence --shard 0/4 --export evidence' (env "
                         "FAILSLOW_EXPORT)")
    pr.add_argument("--shard", default=settings.processor.shard, metavar="I/N",
                    help="reduce shard I of N of each job's evidence (the 'evidence' "
                         "detector: rounds and compute gaps of a block of the job's ranks); "
                         "N such processors, each with its own --group, share one big job "
                         "(env FAILSLOW_SHARD)")
    pr.add_argument("--import", dest="import_", default=settings.processor.imports,
                    metavar="TABLES",
                    help="read these derived tables from the group that exports them "
                         "instead of deriving them here, e.g. '--detectors slowdown,linkrate "
                         "--import iterations,evidence': the iteration tracker and the "
                         "evidence reducers then run only there (env FAILSLOW_IMPORT)")
    pr.add_argument("--whatif", action=argparse.BooleanOptionalAction, default=False,
                    help="run the what-if analysis per job and store its results "
                         "(default: no)")
    pr.add_argument("--window-ms", type=float, default=100.0,
                    help="the detectors get a job's events in windows of this much event "
                         "time, as 'failslow analyze --window-ms' (default %(default)s; "
                         "larger windows cost less CPU per event)")
    pr.add_argument("--clock", choices=("wall", "event", "system"), default="wall",
                    help="time of the hang detector: 'wall' (event time advanced by wall "
                         "time once caught up, the default), 'event' or 'system'")
    pr.add_argument("--silence-grace", type=float, default=5.0, metavar="SECONDS",
                    help="with the wall clock: how long a job may be silent (its partition "
                         "read to the end) before the silence counts as time passing "
                         "(default %(default)s)")
    pr.add_argument("--retire-after", type=float, default=6 * 3600.0, metavar="SECONDS",
                    help="let go of the detector state of a job without a message for this "
                         "long; records that come later start it afresh (default "
                         "%(default)s: 6 h)")
    pr.add_argument("--max-backoff", type=float, default=10.0, metavar="SECONDS",
                    help="longest pause between retries of a failing store (default "
                         "%(default)s)")
    pr.add_argument("--stats-json", type=Path, default=None, metavar="FILE",
                    help="write the processor's counters to FILE at exit")
    pr.add_argument("--planner-costs", default=settings.processor.planner_costs,
                    metavar="S2=SECONDS,S3=...,S4=...",
                    help="mitigation planner action costs in seconds of lost training time "
                         "(Greyhound ski-rental; env FAILSLOW_PLANNER_COSTS; default: the "
                         "planner's defaults)")
    _common(pr)
    pr.set_defaults(func=cmd_process)

    q = subparsers.add_parser(
        "query", help="read what the store holds (anomalies of a job, jobs)",
        description="Read the stream processor's results from ClickHouse.")
    qs = q.add_subparsers(dest="what", metavar="WHAT", required=True)
    qa = qs.add_parser("anomalies", help="a job's diagnosis as stored (diagnosis.md shape)",
                       description="Print the latest report of every anomaly of a job, its "
                                   "iterations summary and what-if result, as stored by "
                                   "'failslow process'.")
    qa.add_argument("--job", required=True, help="the job id")
    qa.add_argument("--json", action="store_true",
                    help="print the diagnosis JSON (diagnosis.md) and nothing else")
    _common(qa)
    qa.set_defaults(func=cmd_query_anomalies)
    qj = qs.add_parser("jobs", help="list the jobs in the store")
    qj.add_argument("--json", action="store_true", help="print a JSON array")
    _common(qj)
    qj.set_defaults(func=cmd_query_jobs)
    qv = qs.add_parser("advice", help="a job's mitigation advice as stored",
                       description="Print the mitigation advice (apply, revert, skip of S2 "
                                   "micro-batch re-balancing, S3 topology change, S4 "
                                   "checkpoint-and-restart) the planner gave for a job.")
    qv.add_argument("--job", required=True, help="the job id")
    qv.add_argument("--json", action="store_true",
                    help="print one advice object per line (the failslow.advice topic's shape)")
    _common(qv)
    qv.set_defaults(func=cmd_query_advice)


def _bootstrap(args: argparse.Namespace) -> str:
    if args.kafka:
        return str(args.kafka)
    from failslow.infra.kafka_broker import bootstrap_servers

    return bootstrap_servers()


def _kafka_or_exit(args: argparse.Namespace, command: str) -> str:
    """The bootstrap servers, after checking within seconds that they answer with the
    configured security (TLS, SASL); exits 1 with one line naming the address if not."""
    from failslow.stream.kafka_security import (
        KafkaConnectError,
        check_connection,
        quiet_client_logs,
    )

    quiet_client_logs()
    bootstrap = _bootstrap(args)
    try:
        check_connection(bootstrap)
    except KafkaConnectError as e:
        print(f"failslow {command}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    return bootstrap


def _data_dir(args: argparse.Namespace) -> Path:
    from failslow.stream.clickhouse import default_data_dir

    return Path(args.data_dir) if args.data_dir else default_data_dir()


# ---------------------------------------------------------------------------------------------
# replay


def _windows(trace_dir: Path, window_ns: int, job: str | None
             ) -> tuple[list[Any], Iterator[tuple[int, dict[str, pa.Table]]], int, list[str]]:
    from failslow.comms import infer_comms
    from failslow.replay import replay
    from failslow.tracedir import DATA_KINDS, TraceDir

    td = TraceDir(trace_dir)
    metas = list(td.metas().values())
    tables = {k: td.read(k) for k in DATA_KINDS if k in td.kinds}
    if job is not None:
        if len(metas) != 1:
            raise SystemExit(f"failslow replay: --job needs a one-job trace, not {len(metas)}")
        old = metas[0].job
        metas = [dataclasses.replace(metas[0], job=job)]
        tables = {k: _rename(t, old, job) for k, t in tables.items()}
    filled = []
    for meta in metas:
        if not meta.comms and "coll" in tables:  # as failslow analyze does
            coll = tables["coll"].filter(pc.equal(tables["coll"].column("job"), meta.job))
            meta = dataclasses.replace(meta, comms=infer_comms(coll, meta))
        filled.append(meta)
    rows = sum(t.num_rows for t in tables.values())
    kinds = [k for k, t in tables.items() if t.num_rows]
    return filled, replay(tables, window_ns), rows, kinds


def _rename(table: pa.Table, old: str, new: str) -> pa.Table:
    import re

    i = table.schema.get_field_index("job")
    col = pc.replace_substring_regex(table.column("job"), f"^{re.escape(old)}$", new)
    return table.set_column(i, table.schema.field(i), col)


def _by_job(batch: dict[str, pa.Table], jobs: list[str]
            ) -> Iterator[tuple[str, dict[str, pa.Table]]]:
    if len(jobs) == 1:
        yield jobs[0], batch
        return
    for job in jobs:
        part = {k: t.filter(pc.equal(t.column("job"), job)) for k, t in batch.items()}
        part = {k: t for k, t in part.items() if t.num_rows}
        if part:
            yield job, part


def cmd_replay(args: argparse.Namespace) -> int:
    from failslow.engine.offline import is_post_mortem
    from failslow.stream.kafka import KafkaTransport

    if args.speed <= 0:
        print("failslow replay: --speed must be positive", file=sys.stderr)
        return 2
    metas, windows, rows, kinds = _windows(args.trace_dir, int(args.window_ms * 1e6),
                                           args.job)
    bootstrap = _kafka_or_exit(args, "replay")
    transport = KafkaTransport(bootstrap, subscribe=(),
                               topic_prefix=args.topic_prefix, partitions=args.partitions,
                               on_full="block", max_block_ms=60_000, linger_ms=20)
    started = time.monotonic()
    messages = 0
    try:
        if not transport.wait_connected(30):
            print(f"failslow replay: Kafka at {transport.bootstrap_servers} is not reachable",
                  file=sys.stderr)
            return 1
        for meta in metas:  # meta first, acknowledged before any data
            transport.publish_meta(meta)
            messages += 1
        transport.flush(60)
        jobs = [m.job for m in metas]
        t0: int | None = None
        for now, batch in windows:
            if t0 is None:
                t0 = now
            if not args.asap:
                due = started + (now - t0) / 1e9 / args.speed
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            for job, part in _by_job(batch, jobs):  # each kind says: complete up to now
                messages += transport.publish_batch(job, part, watermark=now, kinds=kinds)
        if t0 is not None and is_post_mortem(args.trace_dir):
            # a snapshot taken after the job stopped: what is in flight never completes
            for job in jobs:
                messages += transport.publish_batch(job, {}, watermark=now, kinds=kinds,
                                                    end="post-mortem")
        flushed = transport.flush(120)
        stats = transport.stats()
    finally:
        transport.close()
    seconds = time.monotonic() - started
    summary = {"jobs": [m.job for m in metas], "messages": messages, "rows": rows,
               "sent": stats["sent"], "dropped": stats["dropped"], "errors": stats["errors"],
               "seconds": round(seconds, 3), "rows_per_s": round(rows / max(seconds, 1e-9)),
               "bootstrap": transport.bootstrap_servers}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"published {messages} messages ({rows:,} rows) of {', '.join(summary['jobs'])} "
              f"in {seconds:.1f} s to {transport.bootstrap_servers}; dropped "
              f"{stats['dropped']}, failed {stats['errors']}")
    return 0 if flushed and not stats["dropped"] and not stats["errors"] else 1


# ---------------------------------------------------------------------------------------------
# process


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def cmd_process(args: argparse.Namespace) -> int:
    from failslow.engine.registry import parse_names
    from failslow.stream.clickhouse import ClickHouseSink, ClickHouseStateStore, Store, connect
    from failslow.stream.exports import export_topic, parse_shard
    from failslow.stream.kafka import KafkaTransport
    from failslow.stream.metrics import MetricsServer, processor_registry
    from failslow.stream.processor import (
        ProcessorConfig,
        SinkError,
        StreamProcessor,
        default_whatif,
    )
    from failslow.stream.sink import SinkBackpressureError
    from failslow.stream.transport import EVENT_TOPICS

    try:
        detectors = parse_names(args.detectors or "")
    except ValueError as e:
        print(f"failslow process: --detectors: {e}", file=sys.stderr)
        return 2
    logging.getLogger("failslow").setLevel(min(logging.INFO,
                                               logging.getLogger().getEffectiveLevel()))
    try:
        shard = parse_shard(args.shard) if args.shard else None
        config = ProcessorConfig(
            clock=args.clock, tick_interval_ns=100_000_000,
            checkpoint_interval_s=args.checkpoint_interval,
            snapshot_interval_s=args.snapshot_interval, store_events=args.store_events,
            detect=args.detect, window_ns=int(args.window_ms * 1e6),
            max_backpressure_retries=None, max_backoff_s=args.max_backoff,
            silence_grace_s=args.silence_grace, planner_costs=args.planner_costs or "",
            retire_after_s=args.retire_after, detectors=detectors,
            exports=_names(args.export), imports=_names(args.import_),
            evidence_shard=shard)
    except ValueError as e:
        print(f"failslow process: {e}", file=sys.stderr)
        return 2
    from failslow.settings import redact_url

    bootstrap = _kafka_or_exit(args, "process")
    data_dir = _data_dir(args)
    url = args.clickhouse or None
    where = redact_url(url) if url else str(data_dir / "clickhouse")
    store = Store(database=args.database, connect=lambda: connect(data_dir, url),
                  retry_after=1.0)
    stopping = {"now": False}
    processor: StreamProcessor | None = None

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping after a last checkpoint", signum)
        stopping["now"] = True
        if processor is not None:
            processor.stop()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1: stack traces
    started = time.time()
    metrics: MetricsServer | None = None
    transport: KafkaTransport | None = None
    code = 0
    try:
        delay = 0.5
        said = ""
        while not stopping["now"]:  # the store first: without it nothing can be committed
            try:
                _ = store.client
                break
            except SinkBackpressureError as e:
                from failslow.stream.clickhouse import describe_error

                cause = e.__cause__ if e.__cause__ is not None else e
                text = describe_error(cause, url)
                # say it once; the retries that fail the same way only at debug level
                log.log(logging.DEBUG if text == said else logging.WARNING,
                        "waiting for the store: %s; retrying", text)
                said = text
                time.sleep(delay)
                delay = min(delay * 2, args.max_backoff)
        if stopping["now"]:
            return 0
        transport = KafkaTransport(bootstrap, group_id=args.group,
                                   topic_prefix=args.topic_prefix, partitions=args.partitions,
                                   on_full="block", max_block_ms=30_000,
                                   subscribe=(*EVENT_TOPICS, *map(export_topic,
                                                                   sorted(config.imports))))
        processor = StreamProcessor(
            transport, ClickHouseSink(store=store), config,
            state=ClickHouseStateStore(store),
            whatif_factory=default_whatif if args.whatif else None)
        proc = processor
        if args.metrics_port >= 0:
            try:
                registry = processor_registry(lambda: proc.stats, transport.stats, started)
                metrics = MetricsServer(registry, port=args.metrics_port)
                log.info("metrics on %s", metrics.url)
            except OSError as e:
                log.warning("no metrics endpoint on port %d: %s", args.metrics_port, e)
        log.info("processing %s (group %s) into %s", transport.bootstrap_servers, args.group,
                 where)
        print(f"failslow process: Kafka {transport.bootstrap_servers}, group {args.group}, "
              f"store {where}" + (f", metrics {metrics.url}" if metrics else ""),
              file=sys.stderr, flush=True)
        try:
            processor.run(until_idle=False, idle_timeout=args.exit_when_idle)
            processor.close()
        except SinkError as e:
            log.error("the store keeps failing: %s; exiting without committing", e)
            code = 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if transport is not None:
            transport.close()
        if metrics is not None:
            metrics.close()
        if processor is not None:
            stats = processor.stats.to_dict()
            if args.stats_json:
                args.stats_json.write_text(json.dumps(
                    {**stats, "transport": transport.stats() if transport else {}},
                    default=str))
            print(f"failslow process: {stats['messages']} messages, "
                  f"{sum(stats['rows'].values()):,} rows, {stats['anomaly_reports']} anomaly "
                  f"reports, {stats['dead_letters']} dead letters, {stats['errors']} errors, "
                  f"{stats['checkpoints']} checkpoints", file=sys.stderr)
        store.close()
    return code


# ---------------------------------------------------------------------------------------------
# query


def _sink(args: argparse.Namespace) -> Any:
    from failslow.stream.clickhouse import ClickHouseSink, connect, describe_error, is_transient
    from failslow.stream.kafka_security import quiet_client_logs

    quiet_client_logs()
    try:
        client = connect(_data_dir(args), args.clickhouse or None)
    except Exception as e:
        if args.clickhouse and not isinstance(e, ValueError):
            print(f"failslow query: {describe_error(e, args.clickhouse)}", file=sys.stderr)
            raise SystemExit(1) from None
        if is_transient(e):
            where = _data_dir(args) / "clickhouse"
            raise SystemExit(f"failslow query: the store at {where} is not available ({e}); "
                             "an embedded store is locked while 'failslow process' runs on "
                             "it: stop it, or use a ClickHouse server (--clickhouse)") from e
        raise
    return ClickHouseSink(client, args.database)


def cmd_query_anomalies(args: argparse.Namespace) -> int:
    sink = _sink(args)
    try:
        known = args.job in sink.jobs()
        diag = sink.diagnosis(args.job)
    finally:
        sink.close()
    if not known:
        print(f"failslow query: no job {args.job!r} in the store", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(diag.to_json() + "\n")
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)
    it = diag.iterations or {}
    console.print(f"job [bold]{diag.job}[/]: {it.get('count', 0)} iterations, median "
                  f"{it.get('median_s', '-')} s")
    if not diag.anomalies:
        console.print("no anomaly stored")
        return 0
    t0 = min((a.start_ns for a in diag.anomalies if a.start_ns is not None), default=0)
    table = Table(title="anomalies (times in s after the first onset)")
    for col in ("id", "kind", "cause", "ranks", "link", "stage", "start", "detected", "end",
                "slowdown"):
        table.add_column(col)

    def rel(v: int | None) -> str:
        return "-" if v is None else f"{(v - t0) / 1e9:.3f}"

    for a in diag.anomalies:
        table.add_row(a.id, a.kind, a.cause, ",".join(map(str, a.ranks)) or "-",
                      "-" if a.link is None else "-".join(map(str, a.link)), a.stage or "-",
                      rel(a.start_ns), rel(a.detected_ns), rel(a.end_ns),
                      "-" if a.slowdown is None else f"{a.slowdown:.3f}")
    console.print(table)
    return 0


def cmd_query_advice(args: argparse.Namespace) -> int:
    from failslow.mitigation.planner import Advice

    sink = _sink(args)
    try:
        known = args.job in sink.jobs()
        rows = sink.read("advice", args.job, final=True).to_pylist()
    finally:
        sink.close()
    if not known:
        print(f"failslow query: no job {args.job!r} in the store", file=sys.stderr)
        return 1
    advice = sorted((Advice.from_dict(r) for r in rows), key=lambda a: (a.t_ns, a.advice_id))
    if args.json:
        for a in advice:
            sys.stdout.write(a.to_json() + "\n")
        return 0
    if not advice:
        print("no advice stored")
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)
    t0 = advice[0].t_ns
    table = Table(title=f"job {args.job}: mitigation advice (times in s after the first)")
    for col in ("time", "anomaly", "strategy", "action", "impact (s)", "cost (s)",
                "description"):
        table.add_column(col)
    for a in advice:
        table.add_row(f"{(a.t_ns - t0) / 1e9:.3f}", a.anomaly_id, a.strategy, a.action,
                      f"{a.impact_s:.2f}", f"{a.cost_s:.2f}", a.description)
    console.print(table)
    return 0


def cmd_query_jobs(args: argparse.Namespace) -> int:
    sink = _sink(args)
    try:
        jobs = sink.jobs()
    finally:
        sink.close()
    print(json.dumps(jobs) if args.json else "\n".join(jobs))
    return 0
