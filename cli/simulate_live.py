"""``failslow simulate --live``: stream a simulated job in real time, with current times.

The records come from :class:`failslow.simulator.live.LiveSimulator` one chunk (a few
iterations) at a time and are published as ``failslow replay`` publishes a trace: the job's
meta first, then 100 ms windows of event time with their watermark, each window when the
wall clock reaches its end. To Kafka (the same transport as ``failslow replay``), or with
``--embedded`` to a stream processor in this process that stores into ClickHouse (``--clickhouse
URL``) or embedded chDB (``--data-dir``), for a run without Kafka.
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from failslow.replay import replay
from failslow.simulator.live import LiveChunk, LiveConfig, LiveSimulator
from failslow.simulator.scenario import CAUSE_ALIASES, CAUSES

log = logging.getLogger(__name__)

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def seconds(text: str) -> float:
    """``90``, ``90s``, ``1.5m``, ``2h`` -> seconds (argparse type)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 90, 90s, 3m or 1h")
    return float(m.group(1)) * _UNITS[m.group(2) or ""]


def causes(text: str) -> tuple[str, ...]:
    """``compute,link,h1`` -> the cause names (argparse type)."""
    out = []
    for part in text.split(","):
        name = part.strip().lower()
        name = CAUSE_ALIASES.get(name, name)
        if name not in CAUSES:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not one of "
                                             f"{', '.join(CAUSES)}")
        out.append(name)
    return tuple(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The live mode's options (and the shared connection options)."""
    from failslow.cli.stream import _common

    g = p.add_argument_group("live mode (--live)")
    g.add_argument("--live", action="store_true",
                   help="stream a job in real time with current timestamps, a new fault "
                        "every --fault-every, cycling through --causes, until stopped (or "
                        "--duration); to Kafka (--kafka) or, with --embedded, to a processor "
                        "in this process")
    g.add_argument("--ranks", type=int, default=64,
                   help="job size: tp2 pp4 dp RANKS/8, a multiple of 64 (default %(default)s)")
    g.add_argument("--job", default="live-job",
                   help="job id (default %(default)s; after a hang the job restarts as "
                        "JOB-r1, JOB-r2...)")
    g.add_argument("--fault-every", type=seconds, default=180.0, metavar="DURATION",
                   help="a new fault this often, e.g. 3m (default 180 s)")
    g.add_argument("--fault-for", type=seconds, default=60.0, metavar="DURATION",
                   help="how long a slow-down lasts (default 60 s)")
    g.add_argument("--first-fault", type=seconds, default=20.0, metavar="DURATION",
                   help="the first fault starts this long after the start (default 20 s)")
    g.add_argument("--causes", type=causes, default=CAUSES, metavar="LIST",
                   help=f"the causes in turn (default {','.join(CAUSES)})")
    g.add_argument("--hang-tail", type=seconds, default=30.0, metavar="DURATION",
                   help="how long a hung job stays silent before it restarts (default 30 s)")
    g.add_argument("--duration", type=seconds, default=None, metavar="DURATION",
                   help="stop after this long (default: run until stopped)")
    g.add_argument("--window-ms", type=float, default=100.0,
                   help="event time per published batch (default %(default)s)")
    g.add_argument("--embedded", action="store_true",
                   help="no Kafka: run the stream processor in this process, storing into "
                        "--clickhouse or embedded chDB in --data-dir")
    _common(p)


def run_live(args: argparse.Namespace) -> int:
    if args.out or args.preset or args.scenario or args.iterations is not None:
        raise ValueError("--live takes no --out, --preset, --scenario or --iterations "
                         "(see --ranks, --fault-every, --causes)")
    config = LiveConfig(ranks=args.ranks, job=args.job, fault_every_s=args.fault_every,
                        fault_for_s=args.fault_for, first_fault_s=args.first_fault,
                        causes=tuple(args.causes), hang_tail_s=args.hang_tail,
                        seed=args.seed or 0)
    config.check()
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,60}", args.job):
        raise ValueError("--job: 1-60 characters of A-Z a-z 0-9 . _ -")
    stopping = {"now": False}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping["now"] = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if args.embedded:
            return _run_embedded(args, config, stopping)
        return _run_kafka(args, config, stopping)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _say(text: str) -> None:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"{stamp} {text}", flush=True)


def _stream(config: LiveConfig, args: argparse.Namespace, stopping: dict[str, bool],
            publish_meta: Callable[[LiveChunk], None],
            publish: Callable[[str, dict[str, Any], int, list[str]], int],
            idle: Callable[[float], None]) -> dict[str, int]:
    """Generate chunks and publish their windows in real time; returns counters."""
    sim = LiveSimulator(config)
    ends = None if args.duration is None else time.monotonic() + args.duration
    window_ns = int(args.window_ms * 1e6)
    counts = {"rows": 0, "messages": 0, "chunks": 0, "faults": 0, "restarts": 0}
    _say(f"live job {config.job}: {config.ranks} ranks (tp2 pp4 dp{config.ranks // 8}), a "
         f"fault every {config.fault_every_s:g} s from {config.first_fault_s:g} s on "
         f"({', '.join(config.causes)})")

    def over() -> bool:
        return stopping["now"] or (ends is not None and time.monotonic() >= ends)

    while not over():
        chunk = sim.next_chunk()
        counts["chunks"] += 1
        if chunk.new_job:
            publish_meta(chunk)
        if chunk.fault is not None and chunk.fault_started:
            counts["faults"] += 1
            _say(f"fault {chunk.fault.index} injected in {chunk.job}: "
                 f"{chunk.fault.describe()}")
        kinds = [k for k, t in chunk.tables.items() if t.num_rows]
        for now, batch in replay(chunk.tables, window_ns):
            while not over():
                wait = (now - time.time_ns()) / 1e9
                if wait <= 0:
                    break
                idle(min(wait, 0.5))
            if over():
                break
            counts["messages"] += publish(chunk.job, batch, now, kinds)
            counts["rows"] += sum(t.num_rows for t in batch.values())
        if chunk.hung and not over():
            counts["restarts"] += 1
            _say(f"{chunk.job} stayed hung for {config.hang_tail_s:g} s: restarted as "
                 f"{sim.state.job}")
    return counts


def _run_kafka(args: argparse.Namespace, config: LiveConfig, stopping: dict[str, bool]) -> int:
    from failslow.cli.stream import _kafka_or_exit
    from failslow.stream.kafka import KafkaTransport

    bootstrap = _kafka_or_exit(args, "simulate")  # as replay: the configured security
    transport = KafkaTransport(bootstrap, subscribe=(),
                               topic_prefix=args.topic_prefix, partitions=args.partitions,
                               on_full="block", max_block_ms=60_000, linger_ms=20)
    try:
        if not transport.wait_connected(60):
            print(f"failslow simulate: Kafka at {transport.bootstrap_servers} is not "
                  "reachable", file=sys.stderr)
            return 1
        _say(f"publishing to Kafka at {transport.bootstrap_servers}")

        def meta(chunk: LiveChunk) -> None:
            transport.publish_meta(chunk.meta)
            transport.flush(60)

        def publish(job: str, batch: dict[str, Any], now: int, kinds: list[str]) -> int:
            return transport.publish_batch(job, batch, watermark=now, kinds=kinds)

        counts = _stream(config, args, stopping, meta, publish, time.sleep)
        flushed = transport.flush(120)
        stats = transport.stats()
    finally:
        transport.close()
    _say(f"stopped: {counts['rows']:,} rows in {counts['messages']} messages, "
         f"{counts['faults']} faults, {counts['restarts']} restarts; dropped "
         f"{stats['dropped']}, failed {stats['errors']}")
    return 0 if flushed and not stats["dropped"] and not stats["errors"] else 1


def _run_embedded(args: argparse.Namespace, config: LiveConfig,
                  stopping: dict[str, bool]) -> int:
    from pathlib import Path

    from failslow.stream.clickhouse import ClickHouseSink, connect, default_data_dir
    from failslow.stream.processor import ProcessorConfig, StreamProcessor
    from failslow.stream.transport import InProcessTransport

    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    url = args.clickhouse or None
    sink = ClickHouseSink(connect(data_dir, url), args.database)
    transport = InProcessTransport(keep_committed=False)
    processor = StreamProcessor(transport, sink, ProcessorConfig(
        clock="wall", tick_interval_ns=100_000_000, checkpoint_interval_s=2.0))
    seen: set[tuple[str, str]] = set()
    where = str(data_dir / "clickhouse")
    if url:                                   # the host only: the URL may hold a password
        parts = urlsplit(url)
        where = f"ClickHouse at {parts.hostname}:{parts.port or ''}"
    _say(f"processing in this process, storing into {where}")

    def report() -> None:
        for job in processor.jobs():
            for a in processor.anomalies(job):
                if (job, a.id) not in seen:
                    seen.add((job, a.id))
                    _say(f"detected in {job}: {a.id} {a.kind}/{a.cause} ranks {a.ranks}"
                         + (f" link {a.link}" if a.link else ""))

    def meta(chunk: LiveChunk) -> None:
        transport.publish_meta(chunk.meta)

    def publish(job: str, batch: dict[str, Any], now: int, kinds: list[str]) -> int:
        return transport.publish_batch(job, batch, watermark=now, kinds=kinds)

    def idle(wait: float) -> None:
        started = time.monotonic()
        while processor.step(0.0):
            pass
        report()
        time.sleep(max(0.0, wait - (time.monotonic() - started)))

    try:
        counts = _stream(config, args, stopping, meta, publish, idle)
        processor.run(until_idle=True)
        report()
        processor.close()
    finally:
        sink.close()
    _say(f"stopped: {counts['rows']:,} rows, {counts['faults']} faults, "
         f"{len(seen)} anomalies detected")
    return 0
