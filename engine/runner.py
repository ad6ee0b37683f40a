"""The engine's loop over one job's windows, shared by every offline caller.

``failslow analyze``, the report, the planner's trace advice, the accuracy benchmarks and the
demo run a job as :func:`steps` runs it: the trace's windows (:func:`failslow.replay.replay`
or :func:`failslow.engine.offline.replay_dir`, 100 ms of trace time on the job's grid),
sparse ones merged (:class:`failslow.replay.Coalescer`), ``update`` then ``on_tick(now)`` per
merged batch, and for a post-mortem trace one last tick past the hang ceiling. The stream
processor (:mod:`failslow.stream.jobs`) runs the same windows, merger and ticks online; the
parity test holds the two to the same diagnosis.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from failslow.detectors.base import EventBatch
from failslow.engine.analyzer import JobAnalyzer, Output
from failslow.replay import DEFAULT_WINDOW_NS, MIN_BATCH_ROWS, Coalescer


@dataclass
class Step:
    """One analysed batch: its time, its records, and what ``update`` and ``on_tick``
    produced."""

    now: int
    batch: EventBatch
    update: Output
    tick: Output

    @property
    def outputs(self) -> tuple[Output, Output]:
        return self.update, self.tick


def steps(analyzer: JobAnalyzer, windows: Iterable[tuple[int, EventBatch]],
          window_ns: int = DEFAULT_WINDOW_NS, min_rows: int = MIN_BATCH_ROWS,
          post_mortem: bool = False) -> Iterator[Step]:
    """Drive ``analyzer`` over ``windows`` (module docstring); yields each analysed batch.
    ``post_mortem``: the trace is a snapshot taken after the job stopped (the last step is
    :meth:`JobAnalyzer.end_post_mortem`, with an empty batch)."""
    merger = Coalescer(window_ns, min_rows)
    now: int | None = None

    def analysed(merged: tuple[int, EventBatch]) -> Step:
        t, batch = merged
        return Step(t, batch, analyzer.update(batch), analyzer.on_tick(t))

    for t, window in windows:
        now = t
        merged = merger.push(t, window)
        if merged is not None:
            yield analysed(merged)
    last = merger.flush()
    if last is not None:
        yield analysed(last)
    if post_mortem and now is not None:
        yield Step(now, {}, Output(), analyzer.end_post_mortem(now))


def run(analyzer: JobAnalyzer, windows: Iterable[tuple[int, EventBatch]],
        window_ns: int = DEFAULT_WINDOW_NS, post_mortem: bool = False) -> JobAnalyzer:
    """:func:`steps` to the end; returns ``analyzer``."""
    for _ in steps(analyzer, windows, window_ns, post_mortem=post_mortem):
        pass
    return analyzer


class Progress(Protocol):
    """What a long analysis tells the one who waits (``failslow analyze``'s progress bar):
    the trace's time span, then each analysed batch, then the phase after the replay."""

    def span(self, first_ns: int, last_ns: int) -> None: ...

    def advance(self, now_ns: int, rows: int, anomalies: int) -> None: ...

    def phase(self, name: str) -> None: ...


class Tally:
    """What a run counts as it goes (``coll`` rows, distinct anomalies, the trace's span),
    passed on to the caller's :class:`Progress`."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.first = self.last = 0
        self.rows = 0
        self.ids: set[str] = set()

    def span(self, first_ns: int, last_ns: int) -> None:
        self.first, self.last = first_ns, last_ns
        if self.progress is not None:
            self.progress.span(first_ns, last_ns)

    def step(self, step: Step) -> None:
        coll = step.batch.get("coll")
        self.rows += 0 if coll is None else coll.num_rows
        self.ids.update(a.id for out in step.outputs for a in out.anomalies)
        if self.progress is not None:
            self.progress.advance(step.now, self.rows, len(self.ids))

    def phase(self, name: str) -> None:
        if self.progress is not None:
            self.progress.phase(name)
