"""``failslow changepoints SERIES.csv``: change points of any series (Greyhound §4.2's
detector exposed on its own; :func:`failslow.detectors.changepoints.segment`).

The CSV has a header row. Every numeric column is one dimension of the series (several
columns: a multivariate series); a first column that is not numeric (dates, labels),
whose header names a time or index (``t``, ``time``, ``date``, ``year``, ``index``, ...), or
that counts evenly upwards in front of other columns, is the index and is echoed next to
each change point. Empty cells and ``NA``/``NaN``/``null`` are
missing values. The output is the 0-based row index of the first value of every new
segment (``--json``: ``{"method", "changepoints", "n", "columns", "labels"}``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from failslow.detectors.changepoints import SERIES_METHODS, segment

MISSING = {"", "na", "nan", "null", "none", "n/a", "-", "?"}
INDEX_NAMES = {"t", "time", "timestamp", "date", "datetime", "index", "idx", "i", "step",
               "iteration", "ts", "year", "month", "week", "day", "hour", "minute", "second",
               "epoch", "x"}


class SeriesError(ValueError):
    """A file that holds no numeric series; says why."""


def _number(cell: str) -> float | None:
    """The cell as a float, NaN when missing, None when not a number."""
    s = cell.strip()
    if s.lower() in MISSING:
        return math.nan
    try:
        return float(s)
    except ValueError:
        return None


def _is_clock(col: list[float | None]) -> bool:
    """An evenly spaced, strictly increasing column: a time axis, not a measurement."""
    v = np.array([math.nan if c is None else c for c in col], dtype=np.float64)
    if len(v) < 3 or not np.isfinite(v).all():
        return False
    d = np.diff(v)
    return bool(np.all(d > 0) and np.allclose(d, d[0], rtol=1e-6, atol=0.0))


def _classify(cells: list[str]) -> str:
    """``numeric`` (every present cell a finite number), ``text`` (no cell a number) or
    ``mixed`` (numbers with some text or infinities: bad input)."""
    kinds = set()
    for c in cells:
        v = _number(c)
        if v is None:
            kinds.add("text")
        elif math.isinf(v):
            kinds.add("bad")
        elif not math.isnan(v):
            kinds.add("num")
    if kinds <= {"num"}:
        return "numeric" if kinds else "empty"
    return "text" if kinds == {"text"} else "mixed"


def read_series(text: str, source: str = "series") -> tuple[list[str], np.ndarray,
                                                             list[str] | None]:
    """Parse CSV text: (numeric column names, ``(n, d)`` values with NaN for missing,
    index labels or None). Bad input raises :class:`SeriesError` naming the line (1-based,
    the header is line 1) and the column: a cell that is neither a number nor a missing
    value in a numeric column, an infinite value, a row with more cells than the header."""
    sample = text[:4096]
    try:
        dialect: Any = csv.Sniffer().sniff(sample, delimiters=",;\t ")
    except csv.Error:
        dialect = csv.excel
    reader = csv.reader(io.StringIO(text), dialect)
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        for r in reader:
            if any(c.strip() for c in r):
                rows.append(r)
                lines.append(reader.line_num)
    except csv.Error as e:
        raise SeriesError(f"{source}: line {reader.line_num}: {e}") from None
    if len(rows) < 2:
        raise SeriesError(f"{source}: expected a header row and at least one row of values")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    width = len(header)
    for r, line in zip(body, lines[1:], strict=True):
        extra = [c for c in r[width:] if c.strip()]
        if extra:
            raise SeriesError(f"{source}: line {line} has {len(r)} cells but the header has "
                              f"{width} ({', '.join(header)})")
    cols = [[(r[j] if j < len(r) else "") for r in body] for j in range(width)]
    kinds = [_classify(col) for col in cols]
    first_text = kinds[0] == "text" or (kinds[0] == "mixed" and width > 1)
    for j in range(1 if first_text else 0, width):
        if kinds[j] != "mixed":
            continue
        for i, cell in enumerate(cols[j]):
            v = _number(cell)
            if v is None or math.isinf(v):
                raise SeriesError(
                    f"{source}: line {lines[i + 1]}, column {j + 1} ({header[j] or '?'}): "
                    f"{cell.strip()!r} is not a number (missing values: empty, NA, NaN)")
    parsed = [[_number(c) for c in col] for col in cols]
    numeric = [j for j in range(width) if kinds[j] == "numeric"]
    index: list[str] | None = None
    first_is_index = (first_text or header[0].lower() in INDEX_NAMES
                      or (len(numeric) > 1 and _is_clock(parsed[0])))
    if first_is_index and width > 1:
        index = [c.strip() for c in cols[0]]
        numeric = [j for j in numeric if j != 0]
    if not numeric:
        raise SeriesError(f"{source}: no numeric column (columns: {', '.join(header)})")
    values = np.array([[math.nan if v is None else v for v in parsed[j]] for j in numeric],
                      dtype=np.float64).T
    return [header[j] for j in numeric], values, index


def _cmd(args: argparse.Namespace) -> int:
    path = args.series
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        print(f"failslow changepoints: {path}: {e}", file=sys.stderr)
        return 2
    if not args.hazard > 1:
        print(f"failslow changepoints: --hazard must be an expected run length > 1, not "
              f"{args.hazard}", file=sys.stderr)
        return 2
    try:
        names, values, index = read_series(text, path)
    except SeriesError as e:
        print(f"failslow changepoints: {e}", file=sys.stderr)
        return 2
    cps = segment(values, args.method, hazard=1.0 / args.hazard)
    labels = [index[c] for c in cps] if index is not None else None
    if args.json:
        print(json.dumps({"method": args.method, "changepoints": cps, "n": len(values),
                          "columns": names, "labels": labels}))
        return 0
    print(f"# {len(cps)} change point(s) in {len(values)} rows of "
          f"{', '.join(names)} ({args.method})")
    for j, c in enumerate(cps):
        print(f"{c}\t{labels[j]}" if labels is not None else str(c))
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``failslow changepoints SERIES.csv [--method ...] [--json]``."""
    p = subparsers.add_parser(
        "changepoints", help="change points of a series in a CSV file (BOCPD + verification)",
        description="Print the change points of a series: the 0-based row of the first value "
                    "of every new segment. One numeric column per series; several columns are "
                    "one multivariate series; a non-numeric first column is the index.")
    p.add_argument("series", metavar="SERIES.csv", help="CSV file with a header row ('-': stdin)")
    p.add_argument("--method", choices=SERIES_METHODS, default="bocd+v",
                   help="bocd+v: BOCPD with verification (default); bocd: plain BOCPD; "
                        "window: sliding-window baseline")
    p.add_argument("--hazard", type=float, default=100.0, metavar="LAMBDA",
                   help="expected run length 1/H of the constant hazard (default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help='print {"method", "changepoints", "n", "columns", "labels"}')
    p.set_defaults(func=_cmd)
