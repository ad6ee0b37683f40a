"""The offline analyzer, a stream replayed (``failslow analyze TRACE_DIR``,
:mod:`failslow.cli.analyze`).

The trace directory is read with :class:`~failslow.tracedir.TraceDir`, replayed in time order
(:func:`failslow.replay.replay`) and fed batch by batch to the same
:class:`~failslow.engine.analyzer.JobAnalyzer` the stream processor runs (``update`` then
``on_tick(now)`` per batch), so offline and online diagnoses agree.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from failslow import events
from failslow.comms import infer_comms
from failslow.detectors.base import EventBatch
from failslow.diagnosis import Diagnosis
from failslow.engine.analyzer import JobAnalyzer, JobConfig
from failslow.engine.registry import KINDS
from failslow.engine.runner import Progress, Tally, run, steps
from failslow.events import JobMeta
from failslow.replay import DEFAULT_WINDOW_NS, TIME_COLUMN, replay
from failslow.tracedir import TraceDir
from failslow.whatif.analysis import (
    COLL_COLUMNS,
    SPAN_COLUMNS,
    WhatIfAnalyzer,
    WindowRows,
    whatif,
)

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
            config: JobConfig | None = None, post_mortem: bool | None = None,
            progress: Progress | None = None) -> Diagnosis:
    """Diagnose a trace directory (events.md) into a :class:`~failslow.diagnosis.Diagnosis`.

    Accepts every valid trace: Parquet or JSON Lines, rows in any order, only ``meta.json``
    and ``coll`` present; when ``meta.comms`` is empty the communicators are inferred from
    the ``coll`` rows.

    Parquet files are read row group by row group as the replay reaches their time range
    (:func:`replay_dir`), so a trace written in time order (the simulator, the collectors)
    is analysed in bounded memory; rows in any order are still replayed exactly in time
    order (a file whose row groups all span the whole trace is then read at once).

    ``post_mortem`` (default: what the trace's ``import.json`` says): the trace is a snapshot
    taken after the job stopped, so operations still in flight at its end never completed;
    the detectors get one last tick past the hang ceiling. A trace that was merely cut off
    must not be analysed this way: its in-flight operations would look stuck.

    ``progress``: told how far the replay is (trace time, ``coll`` rows, anomalies so far)
    and when the what-if analysis starts; a summary is logged at the end (info)."""
    started = time.monotonic()
    if post_mortem is None:
        post_mortem = is_post_mortem(trace_dir)
    td = TraceDir(trace_dir)
    meta = td.meta()
    if not meta.comms:
        meta = dataclasses.replace(meta, comms=infer_comms(_membership(td), meta))
    analyzer = JobAnalyzer(meta, config)
    whatif_input = WhatIfInput(meta, trace=td)
    told = Tally(progress)
    for step in steps(analyzer, replay_dir(td, window_ns, on_span=told.span), window_ns,
                      post_mortem=post_mortem):
        whatif_input.add(step.batch)
        told.step(step)
    diag = analyzer.diagnosis()
    del analyzer
    release_memory()  # the detectors' state, before the what-if analysis runs
    told.phase("what-if analysis")
    whatif_input.into(diag)
    log.info("job %s: %d coll rows of %d ranks, %.1f s of trace, analysed in %.1f s; "
             "anomalies: %d%s", meta.job, told.rows, meta.world_size,
             (told.last - told.first) / 1e9, time.monotonic() - started, len(diag.anomalies),
             f"; incomplete: {', '.join(x['part'] for x in diag.incomplete)}"
             if diag.incomplete else "")
    return diag


def release_memory() -> None:
    """Free what is no longer referenced (the detectors' state holds reference cycles) and
    give the freed heap back to the operating system (glibc's ``malloc_trim``; elsewhere
    only the collection): the peak memory of a large analysis is then the larger of the
    replay's and the what-if analysis', not their sum."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


#: What-if input kept whole by ``analyze`` (span and coll rows, the columns it reads).
WHATIF_MAX_ROWS = 8_000_000
#: Past it, the steps of the last window analysed (the stream's window is 10 steps; offline
#: keeps at most two windows of rows between cuts, so a smaller one bounds memory)
WHATIF_STEPS = 5


class WhatIfInput:
    """The ``span`` and ``coll`` rows the what-if analysis (ByteDance §3) reads, collected
    while a trace is replayed: offline it sees the whole trace at once, better than the
    stream's sliding window. Past ``max_rows`` rows (a large job) it keeps memory bounded
    by going on as the stream processor does, with the windowed
    :class:`~failslow.whatif.analysis.WhatIfAnalyzer` over the rest of the trace."""

    def __init__(self, meta: JobMeta, max_rows: int | None = None,
                 trace: TraceDir | None = None) -> None:
        self.meta = meta
        #: the trace on disk: the windowed analysis then keeps no rows, it reads its chosen
        #: window again at the end (:func:`read_window`)
        self.trace = trace
        self.max_rows = WHATIF_MAX_ROWS if max_rows is None else max_rows
        self.rows = 0
        self.parts: dict[str, list[pa.Table]] = {"span": [], "coll": []}
        self.windowed: WhatIfAnalyzer | None = None
        self.given_up = False
        #: why there is no what-if result (None while there may be one)
        self.reason: str | None = None

    def add(self, batch: EventBatch) -> None:
        if self.given_up:
            return
        if self.windowed is not None:
            try:
                self.windowed.update(batch)
            except Exception as e:  # noqa: BLE001 - what-if is optional; detection goes on
                self._failed(e)
            return
        for kind, columns in (("span", SPAN_COLUMNS), ("coll", COLL_COLUMNS)):
            table = batch.get(kind)
            if table is None or not table.num_rows:
                continue
            self.rows += table.num_rows
            self.parts[kind].append(table.select([c for c in table.column_names
                                                  if c in columns]))
        if self.rows > self.max_rows:
            log.info("what-if analysis over a sliding window: more than %d span and coll "
                     "rows", self.max_rows)
            self.parts = {"span": [], "coll": []}
            try:
                # only its last window matters here: analysed once, at the end
                trace = self.trace
                reader = None if trace is None else (lambda rows: read_window(trace, rows))
                self.windowed = WhatIfAnalyzer(self.meta, every_steps=WHATIF_STEPS, lazy=True,
                                               reader=reader)
            except Exception as e:  # noqa: BLE001 - what-if is optional; detection goes on
                log.warning("no what-if analysis for job %s: %s", self.meta.job, e)
                self.given_up = True
                self.reason = str(e)

    def _failed(self, e: Exception) -> None:
        """The analysis raised: logged with its traceback, given up, and the reason kept
        for ``diagnosis.incomplete``."""
        log.warning("what-if analysis of job %s failed: %s", self.meta.job, e, exc_info=True)
        self.given_up = True
        self.reason = f"failed: {type(e).__name__}: {e}"

    def result(self) -> dict[str, Any] | None:
        """The ``whatif`` object, or None with :attr:`reason` saying why."""
        if self.given_up:
            return None
        if self.windowed is not None:
            try:
                self.windowed.finish()  # offline, it reads its window again from the trace
            except Exception as e:  # noqa: BLE001 - what-if is optional; detection goes on
                self._failed(e)
                return None
            if self.windowed.result is None:
                self.reason = self.windowed.error or "no complete window of steps"
            return self.windowed.result
        tables = {k: pa.concat_tables(v, promote_options="permissive")
                  for k, v in self.parts.items() if v}
        if not tables:
            self.reason = "neither span nor coll rows"
            return None
        errors: list[str] = []
        try:
            out = whatif(tables, self.meta, errors=errors)
        except Exception as e:  # noqa: BLE001 - what-if is optional; detection goes on
            self._failed(e)
            return None
        if out is None:
            self.reason = errors[0] if errors else "what-if analysis failed"
        return out

    def into(self, diag: Diagnosis) -> None:
        """Set ``diag.whatif``, or say in ``diag.incomplete`` why there is none."""
        diag.whatif = self.result()
        if diag.whatif is None and self.reason:
            diag.incomplete.append({"part": "whatif", "reason": self.reason})


def read_window(td: TraceDir, rows: WindowRows) -> dict[str, pa.Table]:
    """The rows of a lazy what-if window (:class:`~failslow.whatif.analysis.WindowRows`)
    read again from the trace: only the row groups that overlap its time range, in replay
    order (by time; ties in file order), only the columns the analysis reads."""
    out: dict[str, pa.Table] = {}
    for kind, columns, lo, hi in (("span", SPAN_COLUMNS, rows.coll_from, rows.span_until),
                                  ("coll", COLL_COLUMNS, rows.coll_from, rows.coll_until)):
        if kind not in td.kinds or hi < 0:
            continue
        src = _Source(td, kind, piecewise=False)
        key = src.key
        parts = []
        for g_lo, g_hi, i in src.groups:
            if g_hi < (lo if lo is not None else g_hi) or g_lo > hi:
                continue
            table = src._load(i) if i >= 0 else src.whole
            assert table is not None
            t = table.column(key)
            keep = pc.less_equal(t, hi)
            if lo is not None:
                keep = pc.and_(keep, pc.greater_equal(t, lo))
            if kind == "span":
                step = table.column("step")
                keep = pc.and_(keep, pc.and_(pc.greater_equal(step, rows.first),
                                             pc.less_equal(step, rows.last)))
            parts.append(table.filter(keep).select([c for c in table.column_names
                                                    if c in columns]))
        if parts:
            table = pa.concat_tables(parts, promote_options="permissive")
            out[kind] = table.take(pc.sort_indices(table, sort_keys=[(key, "ascending")]))
    return out


def _membership(td: TraceDir) -> pa.Table:
    """The ``coll`` columns that tell communicator membership, deduplicated as read, with
    the number of rows each line stands for (``rows``: how often a group calls)."""
    cols = ["comm", "comm_rank", "rank", "op"]
    parts = []
    for table in td.iter_batches("coll"):
        part = table.select(cols).group_by(cols).aggregate([("comm", "count")])
        parts.append(pa.table({**{c: part.column(c) for c in cols},
                               "rows": part.column("comm_count")}))
    if not parts:
        empty = events.empty("coll").select(cols)
        return empty.append_column("rows", pa.array([], pa.int64()))
    merged = pa.concat_tables(parts).group_by(cols).aggregate([("rows", "sum")])
    return pa.table({**{c: merged.column(c) for c in cols}, "rows": merged.column("rows_sum")})


class _Source:
    """One record kind of a trace directory, read in time order: Parquet row groups are
    loaded when the replay reaches their smallest time (from the file's statistics), rows
    are emitted window by window and the rest is kept."""

    def __init__(self, td: TraceDir, kind: str, pool: ThreadPoolExecutor | None = None,
                 piecewise: bool = True) -> None:
        self.kind = kind
        #: reads the next row group while the engine works on this one (Parquet decoding
        #: and ``conform`` release the GIL)
        self.pool = pool
        self.ahead: tuple[int, Future[pa.Table]] | None = None
        self.key = TIME_COLUMN[kind]
        self.groups: list[tuple[int, int, int]] = []  # (min t, max t, row group)
        #: row groups read piece by piece (:class:`_Pieces`), and the one opened ahead
        self.piecewise = piecewise
        self.pieces: list[_Pieces] = []
        self.opening: tuple[int, Future[_Pieces]] | None = None
        self.pf: pq.ParquetFile | None = None
        self.whole: pa.Table | None = None
        self.path = td.path / f"{kind}.parquet"
        self.offsets: list[int] = []
        #: loaded rows not emitted yet: sorted runs (table, its time column)
        self.runs: list[tuple[pa.Table, np.ndarray]] = []
        if kind in td.kinds and self.path.exists() and self._stats():
            return
        table = td.read(kind) if kind in td.kinds else events.empty(kind)
        self.whole = table
        self.groups = []
        if table.num_rows:
            mm = pc.min_max(table.column(self.key)).as_py()
            self.groups = [(int(mm["min"]), int(mm["max"]), -1)]

    def _stats(self) -> bool:
        try:
            pf = pq.ParquetFile(self.path)
        except (pa.ArrowInvalid, OSError):
            return False  # TraceDir reports it
        names = pf.schema_arrow.names
        if self.key not in names:
            return False
        col = names.index(self.key)
        groups = []
        offset = 0
        for i in range(pf.metadata.num_row_groups):
            rg = pf.metadata.row_group(i)
            st = rg.column(col).statistics
            if rg.num_rows == 0:
                self.offsets.append(offset)
                continue
            if st is None or not st.has_min_max or st.null_count:
                return False
            groups.append((int(st.min), int(st.max), i))
            self.offsets.append(offset)
            offset += rg.num_rows
        self.pf = pf
        self.groups = sorted(groups)
        return True

    def bounds(self) -> tuple[int, int] | None:
        if not self.groups:
            return None
        return min(g[0] for g in self.groups), max(g[1] for g in self.groups)

    def take(self, until: int) -> pa.Table | None:
        """Rows with time <= ``until`` not emitted yet, in time order (ties: in file order).

        Loaded row groups are kept as sorted runs; a window is a zero-copy slice of the one
        run it falls in, and only windows where runs overlap are merged (sorted). A row
        group already in time order is loaded :data:`PIECE_ROWS` rows at a time, so only
        the rows near the replay's time are in memory."""
        while True:
            if self.groups and self.groups[0][0] <= until:
                _, _, i = self.groups.pop(0)
                if i < 0:
                    assert self.whole is not None
                    self._add_run(self.whole)
                    self.whole = None
                elif self.piecewise:
                    self.pieces.append(self._open(i).result())
                else:
                    self._add_run(self._read(i).result())
                continue
            ready = [p for p in self.pieces if p.next_t is not None and p.next_t <= until]
            if not ready:
                break
            for p in ready:
                self._add_run(p.take())
            self.pieces = [p for p in self.pieces if p.next_t is not None]
        if self.groups and self.groups[0][2] >= 0 and self.pool is not None:  # read ahead
            if self.piecewise:
                self._open(self.groups[0][2])
            else:
                self._read(self.groups[0][2])
        parts: list[pa.Table] = []
        ends: list[tuple[int, int]] = []  # each part's first and last time
        runs: list[tuple[pa.Table, np.ndarray]] = []
        for table, t in self.runs:
            cut = int(np.searchsorted(t, until, side="right"))
            if cut:
                parts.append(table.slice(0, cut))
                ends.append((int(t[0]), int(t[cut - 1])))
            if cut < len(t):
                runs.append((table.slice(cut), t[cut:]))
        self.runs = runs
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        table = pa.concat_tables(parts, promote_options="permissive")
        if all(ends[i][1] <= ends[i + 1][0] for i in range(len(ends) - 1)):
            # consecutive pieces of a row group in time order: already merged (a stable
            # sort would keep this order)
            return table
        return table.take(pc.sort_indices(table, sort_keys=[(self.key, "ascending")]))

    def _open(self, i: int) -> Future[_Pieces]:
        """Row group ``i`` for piecewise reading (by the read-ahead thread when there is
        one): its time column tells whether its rows are in time order."""
        if self.opening is not None and self.opening[0] == i:
            return self.opening[1]
        fut: Future[_Pieces]
        if self.pool is not None:
            fut = self.pool.submit(_Pieces, self, i)
        else:
            fut = Future()
            try:
                fut.set_result(_Pieces(self, i))
            except events.ContractError as e:
                fut.set_exception(e)
        self.opening = (i, fut)
        return fut

    def _read(self, i: int) -> Future[pa.Table]:
        """Row group ``i``, conformed: read by the read-ahead thread (in this thread
        without one)."""
        if self.ahead is not None and self.ahead[0] == i:
            fut = self.ahead[1]
        elif self.pool is not None:
            fut = self.pool.submit(self._load, i)
        else:
            fut = Future()
            try:
                fut.set_result(self._load(i))
            except events.ContractError as e:
                fut.set_exception(e)
        self.ahead = (i, fut)
        return fut

    def _load(self, i: int) -> pa.Table:
        assert self.pf is not None
        try:
            raw = self.pf.read_row_group(i)
        except (pa.ArrowInvalid, OSError) as e:
            raise events.ContractError(f"corrupt Parquet data in row group {i} ({e})",
                                       source=str(self.path)) from None
        return events.conform(raw, self.kind, str(self.path), self.offsets[i])

    def _add_run(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        t = table.column(self.key).to_numpy()
        if len(t) > 1 and (t[1:] < t[:-1]).any():
            order = np.argsort(t, kind="stable")
            table, t = table.take(pa.array(order)), t[order]
        self.runs.append((table, t))


#: rows read at a time from a row group whose rows are in time order
PIECE_ROWS = 65_536


class _Pieces:
    """A row group of a :class:`_Source` read :data:`PIECE_ROWS` rows at a time when its
    rows are in time order (its time column, read first, says so; otherwise it is read
    whole, as one run to sort). ``next_t``: the time of the next unread row (None: none
    left). The pieces are read ahead on the source's thread."""

    def __init__(self, source: _Source, i: int) -> None:
        assert source.pf is not None
        self.source = source
        self.offset = source.offsets[i]
        try:
            t = source.pf.read_row_group(i, columns=[source.key]).column(0)
        except (pa.ArrowInvalid, OSError) as e:
            raise events.ContractError(f"corrupt Parquet data in row group {i} ({e})",
                                       source=str(source.path)) from None
        self.t = t.to_numpy() if not t.null_count else np.zeros(0, dtype=np.int64)
        self.pos = 0
        self.whole: pa.Table | None = None
        if len(self.t) > 1 and (self.t[1:] < self.t[:-1]).any() or t.null_count:
            self.whole = source._load(i)
            self.t = np.sort(self.whole.column(source.key).to_numpy())
            self.batches = iter(())
        else:
            self.batches = iter(source.pf.iter_batches(batch_size=PIECE_ROWS, row_groups=[i],
                                                       use_threads=False))
        self.ahead: Future[pa.Table] | None = None
        self._read_ahead()

    @property
    def next_t(self) -> int | None:
        return int(self.t[self.pos]) if self.pos < len(self.t) else None

    def take(self) -> pa.Table:
        """The next piece (the whole row group when its rows are out of order)."""
        if self.whole is not None:
            out, self.whole = self.whole, None
            self.pos = len(self.t)
            return out
        assert self.ahead is not None
        piece = self.ahead.result()
        self.pos += piece.num_rows
        self._read_ahead()
        return piece

    def _read_ahead(self) -> None:
        if self.whole is not None or self.pos >= len(self.t):
            self.ahead = None
            return
        offset = self.offset + self.pos
        if self.source.pool is not None:
            self.ahead = self.source.pool.submit(self._next, offset)
        else:
            self.ahead = Future()
            try:
                self.ahead.set_result(self._next(offset))
            except events.ContractError as e:
                self.ahead.set_exception(e)

    def _next(self, offset: int) -> pa.Table:
        src = self.source
        try:
            batch: pa.RecordBatch = next(self.batches)
        except (pa.ArrowInvalid, OSError) as e:
            raise events.ContractError(f"corrupt Parquet data near row {offset} ({e})",
                                       source=str(src.path)) from None
        return events.conform(pa.Table.from_batches([batch]), src.kind, str(src.path), offset)


def replay_dir(td: TraceDir, window_ns: int = DEFAULT_WINDOW_NS, kinds: tuple[str, ...] = KINDS,
               on_span: Callable[[int, int], None] | None = None
               ) -> Iterator[tuple[int, EventBatch]]:
    """:func:`failslow.replay.replay` of a trace directory, reading Parquet row groups only
    when their time comes (the same windows and batches as a replay of the whole tables).
    ``on_span(first_ns, last_ns)``: the trace's time span, before the first window."""
    if window_ns <= 0:
        raise ValueError("window_ns must be positive")
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="failslow-read") as pool:
        yield from _replay_sources([_Source(td, k, pool) for k in kinds if k in td.kinds],
                                   window_ns, on_span)


def _replay_sources(sources: list[_Source], window_ns: int,
                    on_span: Callable[[int, int], None] | None = None
                    ) -> Iterator[tuple[int, EventBatch]]:
    bounds = [b for b in (s.bounds() for s in sources) if b is not None]
    if not bounds:
        return
    t0, t1 = min(b[0] for b in bounds), max(b[1] for b in bounds)
    if on_span is not None:
        on_span(t0, t1)
    # the windows of failslow.replay.replay: (now - window, now], from t0 - 1
    n = (t1 - (t0 - 1) + window_ns - 1) // window_ns
    for k in range(1, n + 1):
        edge = t0 - 1 + k * window_ns
        batch: EventBatch = {}
        for s in sources:
            part = s.take(min(edge, t1))
            if part is not None and part.num_rows:
                batch[s.kind] = part
        if batch:
            yield min(edge, t1), batch


def analyze_tables(meta: JobMeta, tables: Mapping[str, pa.Table],
                   window_ns: int = DEFAULT_WINDOW_NS, config: JobConfig | None = None,
                   post_mortem: bool = False) -> Diagnosis:
    """:func:`analyze` on tables already in memory (the same code path: replay in time
    order, ``update`` then ``on_tick(now)`` per batch). Kinds other than :data:`KINDS` are
    ignored."""
    diag = run_analyzer(meta, tables, window_ns, config, post_mortem).diagnosis()
    if not meta.comms and "coll" in tables:
        meta = dataclasses.replace(meta, comms=infer_comms(tables["coll"], meta))
    whatif_input = WhatIfInput(meta, max_rows=sys.maxsize)  # the tables are in memory
    whatif_input.add({k: t for k, t in tables.items() if k in ("span", "coll")})
    whatif_input.into(diag)
    return diag


def run_analyzer(meta: JobMeta, tables: Mapping[str, pa.Table],
                 window_ns: int = DEFAULT_WINDOW_NS, config: JobConfig | None = None,
                 post_mortem: bool = False) -> JobAnalyzer:
    """The :class:`JobAnalyzer` after the whole trace was replayed through it."""
    tables = {k: t for k, t in tables.items() if k in KINDS}
    if not meta.comms and "coll" in tables:
        meta = dataclasses.replace(meta, comms=infer_comms(tables["coll"], meta))
    return run(JobAnalyzer(meta, config), replay(tables, window_ns), window_ns, post_mortem)
