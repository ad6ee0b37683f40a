"""What the stream processor is told: :class:`ProcessorConfig` (every tunable of
:class:`~failslow.stream.processor.StreamProcessor`, one typed object) and the per-job
analyzers it runs (the :class:`Analyzer` and :class:`WhatIf` shapes and their default
factories, the same :class:`~failslow.engine.analyzer.JobAnalyzer` as ``failslow analyze``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from failslow.detectors.base import EventBatch
from failslow.diagnosis import Diagnosis
from failslow.events import JobMeta
from failslow.mitigation.planner import PlannerConfig
from failslow.replay import DEFAULT_WINDOW_NS, MIN_BATCH_ROWS
from failslow.settings import get_settings

log = logging.getLogger(__name__)

#: ``"wall"``, ``"event"`` or ``"system"`` (module docstring of
#: :mod:`failslow.stream.processor`), or a callable returning nanoseconds.
ClockName = Literal["wall", "event", "system"]
Clock = Callable[[], int]
CLOCKS = ("wall", "event", "system")


def _analyzed_kinds() -> tuple[str, ...]:
    """The record kinds the engine's registered detectors read, those ``failslow analyze``
    feeds them (imported when a config is made: the detectors are heavy to import)."""
    from failslow.engine.registry import KINDS

    return tuple(KINDS)


def _planner_costs() -> str:
    return get_settings().processor.planner_costs


@dataclass(frozen=True)
class ProcessorConfig:
    """How a :class:`~failslow.stream.processor.StreamProcessor` runs (``failslow process``
    sets some fields from its flags, :mod:`failslow.cli.stream`)."""

    # ------------------------------------------------------------------ time
    #: ``"wall"``, ``"event"``, ``"system"`` or a callable returning ns
    clock: ClockName | Clock = "wall"
    #: least clock advance between two ``on_tick`` calls of a job
    tick_interval_ns: int = 0
    #: the ``"wall"`` clock counts a job's silence only after this grace period
    silence_grace_s: float = 5.0

    # ------------------------------------------------------------------ polling
    max_messages: int = 256
    poll_timeout: float = 0.5

    # ------------------------------------------------------------------ detection
    #: False: run no detector (a processor that only stores events, in its own group)
    detect: bool = True
    #: the registered detectors the jobs' analyzers run (None: all, as ``failslow analyze``);
    #: several processors, each in its own consumer group, may split one job's detectors
    #: between them (engine/registry.py; a detector brings the ones whose tables it reads)
    detectors: frozenset[str] | None = None
    #: record kinds given to the detectors: those of ``failslow analyze`` (with
    #: ``detectors``: those the chosen detectors read)
    analyzer_kinds: tuple[str, ...] = field(default_factory=_analyzed_kinds)
    #: derived tables this processor publishes for other consumer groups, on
    #: ``failslow.derived.<name>`` (:mod:`failslow.stream.exports`)
    exports: frozenset[str] = frozenset()
    #: derived tables read from those topics instead of derived here: the detectors that
    #: derive only those do not run (``JobConfig.imported``)
    imports: frozenset[str] = frozenset()
    #: reduce shard ``(i, n)`` of each job's evidence (the ``evidence`` detector, exported
    #: as ``evidence``; :mod:`failslow.detectors.slowdown.stage`); None: not a reducer
    evidence_shard: tuple[int, int] | None = None
    #: a job's records are analysed in windows of this much event time, in time order
    window_ns: int = DEFAULT_WINDOW_NS
    #: windows of fewer rows are merged with the next ones before analysis, as ``failslow
    #: analyze`` merges them (:class:`failslow.replay.Coalescer`; 0: never merged)
    min_batch_rows: int = MIN_BATCH_ROWS
    #: analyse the held records at the latest once this many rows were collected
    max_batch_rows: int = 1_000_000
    #: hold a job's records until every kind has arrived up to a time (None: when the
    #: transport delivers topics out of publication order)
    align: bool | None = None
    #: a kind silent this long (partition read to its end) does not hold the others back
    align_idle_s: float = 5.0
    #: a job holds at most this many rows for alignment
    max_held_rows: int = 8_000_000
    #: messages (and bytes) that may wait for their job's meta, per partition
    max_pending_messages: int = 10_000
    max_pending_bytes: int = 256 << 20
    #: a job without a message this long is retired: its held windows are analysed, its
    #: detector state is let go and its meta kept, so that new records start it afresh
    #: (None: never; a processor that runs for weeks sees many jobs end)
    retire_after_s: float | None = 6 * 3600.0
    #: re-raise analyzer failures instead of counting them
    strict: bool = False
    #: action costs of the job analyzer's mitigation planner, ``S2=5,S3=60,S4=1800``
    #: (default: the settings' ``processor.planner_costs``)
    planner_costs: str = field(default_factory=_planner_costs)

    # ------------------------------------------------------------------ output
    #: also write the raw event tables (``meta`` is always written)
    store_events: bool = True
    #: a checkpoint after this many messages, buffered rows or seconds
    checkpoint_messages: int = 1000
    checkpoint_rows: int = 4_000_000
    checkpoint_interval_s: float = 5.0
    #: save the detector state at least this often
    snapshot_interval_s: float = 60.0
    #: give up re-cutting a logged cut whose input does not come back after this long
    cut_timeout_s: float = 120.0
    #: a failing sink is tried this often; a busy one this often (None: no limit), with
    #: delays up to ``max_backoff_s``
    max_sink_attempts: int = 5
    max_backpressure_retries: int | None = 1000
    max_backoff_s: float = 10.0
    #: the lag and rows-per-second statistics are updated this often
    metrics_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.clock, str) and self.clock not in CLOCKS:
            raise ValueError("clock must be 'wall', 'event', 'system' or a callable")
        object.__setattr__(self, "analyzer_kinds", tuple(self.analyzer_kinds))
        from failslow.engine.imports import IMPORTABLE

        for what, names in (("export", self.exports), ("import", self.imports)):
            object.__setattr__(self, what + "s", frozenset(names))
            unknown = sorted(set(names) - IMPORTABLE)
            if unknown:
                raise ValueError(f"cannot {what} {', '.join(map(repr, unknown))} (known: "
                                 f"{', '.join(sorted(IMPORTABLE))})")
        if self.evidence_shard is not None:
            i, n = self.evidence_shard
            if not 0 <= i < n:
                raise ValueError(f"evidence shard {i}/{n}: want 0 <= i < n")
        if "evidence" in self.exports and self.evidence_shard is None:
            raise ValueError("exporting evidence needs the shard this processor reduces "
                             "(--shard I/N)")
        if self.detectors is not None or self.imports:
            from failslow.engine.registry import JobConfig, input_kinds, parse_names

            if self.detectors is not None:
                object.__setattr__(self, "detectors", parse_names(",".join(self.detectors)))
            object.__setattr__(self, "analyzer_kinds", (*input_kinds(JobConfig(
                detectors=self.detectors, planner=None, imported=self.imports,
                evidence_shard=self.evidence_shard)),
                *sorted(self.imports)))
        self.planner()  # ValueError when the costs are malformed

    def planner(self) -> PlannerConfig:
        """The planner configuration of :attr:`planner_costs`."""
        return PlannerConfig.from_costs(self.planner_costs)


class Analyzer(Protocol):
    """What the processor needs of a per-job analyzer (failslow.engine.analyzer.JobAnalyzer).
    ``update``/``on_tick`` return an object with ``anomalies`` and optionally ``rounds`` and
    ``iterations`` tables, or a plain list of anomalies (the Detector protocol)."""

    def update(self, batch: EventBatch) -> Any: ...

    def on_tick(self, now_ns: int) -> Any: ...

    def diagnosis(self) -> Diagnosis: ...


class WhatIf(Protocol):
    """What the processor needs of a what-if analyzer (failslow.whatif.analysis
    .WhatIfAnalyzer): ``update`` returns the new diagnosis ``whatif`` object when it was
    recomputed, else None."""

    def update(self, batch: EventBatch) -> dict[str, Any] | None: ...


AnalyzerFactory = Callable[[JobMeta], Analyzer]
WhatIfFactory = Callable[[JobMeta], WhatIf | None]


def default_analyzer(meta: JobMeta, planner_costs: str = "",
                     detectors: frozenset[str] | None = None,
                     imported: frozenset[str] = frozenset(),
                     evidence_shard: tuple[int, int] | None = None,
                     window_ns: int = DEFAULT_WINDOW_NS) -> Analyzer:
    """A :class:`failslow.engine.analyzer.JobAnalyzer` for ``meta``, as ``failslow analyze``
    makes it, its mitigation planner's action costs ``planner_costs`` (``S2=5,S3=60,...``;
    empty: the defaults) applied, running the registered ``detectors`` (None: all) on the
    ``imported`` derived tables of another stage (``evidence_shard``: reducing that shard
    of the job's evidence)."""
    from failslow.engine.analyzer import JobAnalyzer, JobConfig

    analyzer: Analyzer = JobAnalyzer(
        meta, JobConfig(planner=PlannerConfig.from_costs(planner_costs), detectors=detectors,
                        imported=imported, evidence_shard=evidence_shard,
                        window_ns=window_ns))
    return analyzer


def default_whatif(meta: JobMeta) -> WhatIf | None:
    """A :class:`failslow.whatif.analysis.WhatIfAnalyzer` for ``meta``, or None when that
    module is not installed or refuses the job."""
    try:
        from failslow.whatif.analysis import WhatIfAnalyzer
    except ImportError:
        return None
    try:
        analyzer: WhatIf = WhatIfAnalyzer(meta)
    except Exception as e:  # noqa: BLE001 - what-if is optional; detection goes on
        log.warning("no what-if analysis for job %s: %s", meta.job, e)
        return None
    return analyzer
