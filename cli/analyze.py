"""``failslow analyze TRACE_DIR``: diagnose a trace directory
(:func:`failslow.engine.offline.analyze`) and print the diagnosis as a table or JSON; on a
terminal, a progress bar on standard error follows the replay.

What an importer held out (``import.json``: the ranks whose records NCCL Inspector dropped)
is printed as one line, and in the JSON as ``data_quality`` (an added field, diagnosis.md:
"Unknown fields may be added")."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from failslow.replay import DEFAULT_WINDOW_NS

if TYPE_CHECKING:
    from rich.console import Console

    from failslow.diagnosis import Diagnosis

log = logging.getLogger(__name__)


def data_quality(trace_dir: Path) -> dict[str, Any] | None:
    """The ranks an import held out because their records were dropped (``import.json``
    ``lossy_held_out``, NCCL Inspector), or None."""
    from failslow.collectors.importers import INFO_FILE

    path = trace_dir / INFO_FILE
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        log.warning("%s: unreadable (%s); ignored", path, e)
        return None
    if not isinstance(info, dict):
        return None
    held = info.get("lossy_held_out")
    held = held if isinstance(held, dict) else {}
    ranks = held.get("ranks") or sorted(int(r) for r in info.get("lossy_ranks") or {})
    if not ranks:
        return None
    out: dict[str, Any] = {"held_out_ranks": [int(r) for r in ranks],
                           "source": info.get("source"),
                           "reason": "the import dropped records of these ranks (Inspector "
                                     "ring buffer overwritten): held out, never a root cause"}
    if held.get("operations") is not None:
        out["held_out_operations"] = int(held["operations"])
    return out


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
    from datetime import UTC, datetime

    t0 = min((a.start_ns for a in diag.anomalies if a.start_ns is not None), default=0)
    day = datetime.fromtimestamp(t0 / 1e9, UTC).strftime("%Y-%m-%d")
    table = Table(title=f"anomalies (wall-clock times, UTC, {day})", show_header=True)
    for col in ("id", "kind", "cause", "ranks", "link", "comm kind", "stage", "start",
                "detected", "end", "slowdown", "R", "P"):
        table.add_column(col)
    for a in diag.anomalies:
        def rel(v: int | None) -> str:
            if v is None:
                return "-"
            t = datetime.fromtimestamp(v / 1e9, UTC)
            return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"

        table.add_row(
            a.id, a.kind, a.cause, ",".join(map(str, a.ranks)) or "-",
            "-" if a.link is None else "-".join(map(str, a.link)), a.comm_kind or "-",
            a.stage or "-", rel(a.start_ns), rel(a.detected_ns), rel(a.end_ns),
            "-" if a.slowdown is None else f"{a.slowdown:.3f}",
            "-" if a.R is None else f"{a.R:.2f}", "-" if a.P is None else f"{a.P:.2f}")
    console.print(table)


class ReplayBar:
    """The progress bar of the commands that replay a trace (``failslow analyze``,
    ``report TRACE_DIR``, and ``plan`` given a trace) on standard error, only on a
    terminal: trace seconds replayed of the trace's span, ``coll`` rows and anomalies so
    far, then the phase after the replay (:class:`failslow.engine.runner.Progress`)."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                            console=self.console, transient=True,
                            disable=not self.console.is_terminal)
        self.task = self.bar.add_task("replaying the trace", total=None, info="")
        self.first = 0

    def __enter__(self) -> ReplayBar:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def span(self, first_ns: int, last_ns: int) -> None:
        self.first = first_ns
        self.bar.update(self.task, total=max(last_ns - first_ns, 1))

    def advance(self, now_ns: int, rows: int, anomalies: int) -> None:
        done = max(now_ns - self.first, 0)
        total = self.bar.tasks[0].total or 1
        self.bar.update(self.task, completed=min(done, total), info=(
            f"{done / 1e9:.1f} / {total / 1e9:.1f} s of trace, {rows:,} coll rows, "
            f"anomalies: {anomalies}"))

    def phase(self, name: str) -> None:
        self.bar.update(self.task, description=name)


def _cmd_analyze(args: argparse.Namespace) -> int:
    from failslow.engine import offline as analyzer

    with ReplayBar() as bar:
        diag = analyzer.analyze(Path(args.trace_dir), window_ns=int(args.window_ms * 1e6),
                                post_mortem=args.post_mortem, progress=bar)
    quality = data_quality(Path(args.trace_dir))
    if args.json:
        doc = diag.to_dict()
        if quality is not None:
            doc["data_quality"] = quality
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        _print_table(diag)
        if quality is not None:
            print("held out (Inspector dropped records): ranks "
                  + ", ".join(map(str, quality["held_out_ranks"])))
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
