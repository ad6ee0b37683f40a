"""``failslow analyze TRACE_DIR``: the offline analyzer, a stream replayed.

The trace directory is read with :class:`~failslow.tracedir.TraceDir`, replayed in time order
(:func:`failslow.replay.replay`) and fed batch by batch to the same
:class:`~failslow.detectors.job.JobAnalyzer` the stream processor runs (``update`` then
``on_tick(now)`` per batch), so offline and online diagnoses agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from failslow.detectors.hang import HangConfig
from failslow.detectors.job import JobAnalyzer, JobConfig
from failslow.detectors.slowdown import infer_comms
from failslow.detectors.whatif import whatif
from failslow.diagnosis import Diagnosis
from failslow.events import JobMeta
from failslow.replay import DEFAULT_WINDOW_NS, replay
from failslow.tracedir import TraceDir

#: Record kinds the detectors read.
KINDS = ("coll", "progress", "link", "gpu", "span")

log = logging.getLogger(__name__)


def is_post_mortem(trace_dir: str | Path) -> bool:
    """True when the trace's importer says it is a snapshot taken after the job stopped
    making progress (``import.json``: ``"post_mortem": true``, e.g. Flight Recorder dumps
    written by the watchdog)."""
    info = Path(trace_dir) / "import.json"
    if not info.exists():
        return False
    try:
        return bool(json.loads(info.read_text()).get("post_mortem", False))
    except (json.JSONDecodeError, AttributeError):
        log.warning("%s: not a JSON object; ignored", info)
        return False


def analyze(trace_dir: str | Path, window_ns: int = DEFAULT_WINDOW_NS,
            config: JobConfig | None = None, post_mortem: bool | None = None) -> Diagnosis:
    """Diagnose a trace directory (events.md) into a :class:`~failslow.diagnosis.Diagnosis`.

    Accepts every valid trace: Parquet or JSON Lines, rows in any order, only ``meta.json``
    and ``coll`` present; when ``meta.comms`` is empty the communicators are inferred from
    the ``coll`` rows.

    ``post_mortem`` (default: what the trace's ``import.json`` says): the trace is a snapshot
    taken after the job stopped, so operations still in flight at its end never completed;
    the detectors get one last tick past the hang ceiling. A trace that was merely cut off
    must not be analysed this way: its in-flight operations would look stuck."""
    if post_mortem is None:
        post_mortem = is_post_mortem(trace_dir)
    td = TraceDir(trace_dir)
    meta = td.meta()
    tables: dict[str, pa.Table] = {k: td.read(k) for k in KINDS if k in td.kinds}
    diag = analyze_tables(meta, tables, window_ns, config, post_mortem)
    # What-if (ByteDance §3): offline it sees the whole trace at once, better than the
    # stream's sliding window.
    if not meta.comms and "coll" in tables:
        meta = dataclasses.replace(meta, comms=infer_comms(tables["coll"], meta))
    diag.whatif = whatif({k: tables[k] for k in ("span", "coll") if k in tables}, meta)
    return diag


def analyze_tables(meta: JobMeta, tables: Mapping[str, pa.Table],
                   window_ns: int = DEFAULT_WINDOW_NS, config: JobConfig | None = None,
                   post_mortem: bool = False) -> Diagnosis:
    """:func:`analyze` on tables already in memory (the same code path: replay in time
    order, ``update`` then ``on_tick(now)`` per batch). Kinds other than :data:`KINDS` are
    ignored."""
    return run_analyzer(meta, tables, window_ns, config, post_mortem).diagnosis()


def run_analyzer(meta: JobMeta, tables: Mapping[str, pa.Table],
                 window_ns: int = DEFAULT_WINDOW_NS, config: JobConfig | None = None,
                 post_mortem: bool = False) -> JobAnalyzer:
    """The :class:`JobAnalyzer` after the whole trace was replayed through it."""
    tables = {k: t for k, t in tables.items() if k in KINDS}
    if not meta.comms and "coll" in tables:
        meta = dataclasses.replace(meta, comms=infer_comms(tables["coll"], meta))
    analyzer = JobAnalyzer(meta, config)
    now = None
    for now, batch in replay(tables, window_ns):
        analyzer.update(batch)
        analyzer.on_tick(now)
    if post_mortem and now is not None:
        hang = (config.hang if config else None) or HangConfig()
        analyzer.on_tick(now + hang.ceiling_ns + 1_000_000_000)
    return analyzer


def _ns(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1e9:.3f}"


def _print_table(diag: Diagnosis) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)
    it = diag.iterations or {}
    summary = Table(title=f"job {diag.job}: iterations", show_header=True)
    for col in ("period (ops)", "median (s)", "count"):
        summary.add_column(col, justify="right")
    median = it.get("median_s")
    summary.add_row(str(it.get("period_ops", "-")),
                    "-" if median is None else f"{median:.4f}", str(it.get("count", 0)))
    console.print(summary)
    if not diag.anomalies:
        console.print("no anomaly found")
        return
    t0 = min((a.start_ns for a in diag.anomalies if a.start_ns is not None), default=0)
    table = Table(title="anomalies (times in s after the first onset)", show_header=True)
    for col in ("id", "kind", "cause", "ranks", "link", "comm kind", "stage", "start",
                "detected", "end", "slowdown", "R", "P"):
        table.add_column(col)
    for a in diag.anomalies:
        def rel(v: int | None) -> str:
            return "-" if v is None else f"{(v - t0) / 1e9:.3f}"

        table.add_row(
            a.id, a.kind, a.cause, ",".join(map(str, a.ranks)) or "-",
            "-" if a.link is None else "-".join(map(str, a.link)), a.comm_kind or "-",
            a.stage or "-", rel(a.start_ns), rel(a.detected_ns), rel(a.end_ns),
            "-" if a.slowdown is None else f"{a.slowdown:.3f}",
            "-" if a.R is None else f"{a.R:.2f}", "-" if a.P is None else f"{a.P:.2f}")
    console.print(table)


def _cmd_analyze(args: argparse.Namespace) -> int:
    diag = analyze(Path(args.trace_dir), window_ns=int(args.window_ms * 1e6),
                   post_mortem=args.post_mortem)
    if args.json:
        sys.stdout.write(diag.to_json() + "\n")
    else:
        _print_table(diag)
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``failslow analyze TRACE_DIR [--json]``."""
    p = subparsers.add_parser(
        "analyze", help="diagnose a trace directory (slow-downs, hangs, root causes)",
        description="Replay a trace directory through the stream detectors and print the "
                    "diagnosis: iteration summary and anomalies with root cause.")
    p.add_argument("trace_dir", metavar="TRACE_DIR", help="trace directory (meta.json, coll.*)")
    p.add_argument("--json", action="store_true",
                   help="print the diagnosis JSON (diagnosis.md) and nothing else")
    p.add_argument("--window-ms", type=float, default=DEFAULT_WINDOW_NS / 1e6,
                   help="replay batch width in trace milliseconds (default: %(default)s)")
    p.add_argument("--post-mortem", action=argparse.BooleanOptionalAction, default=None,
                   help="the trace is a snapshot taken after the job stopped (operations in "
                        "flight at its end never completed); default: what the trace's "
                        "import.json says (Flight Recorder dumps: yes)")
    p.set_defaults(func=_cmd_analyze)
