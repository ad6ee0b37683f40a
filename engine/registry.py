"""Every detector, registered once: the engine builds a job's detectors from this table,
in this order (a detector reads the tables the ones before it derive: the slow-down and
link-rate detectors read the iteration tracker's ``iterations``).

In the manner of node_exporter's collector registry: each entry has a name, the class, and
an enable flag in :class:`JobConfig` (``detectors``); the record kinds the engine feeds a job
(:func:`input_kinds`), online and offline, are derived from the enabled classes' ``kinds``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from failslow import events
from failslow.detectors.base import Detector
from failslow.detectors.hang import HangConfig, HangDetector
from failslow.detectors.iterations import IterationConfig, IterationTracker
from failslow.detectors.linkrate import LinkRateConfig, LinkRateDetector
from failslow.detectors.slowdown import SlowdownConfig, SlowdownDetector
from failslow.detectors.slowdown.stage import EvidenceStage
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta
from failslow.mitigation.planner import PlannerConfig
from failslow.replay import DEFAULT_WINDOW_NS
from failslow.settings import get_settings

#: Known anomalies so far, for detectors that must not repeat another's (link-rate).
Known = Callable[[], list[Anomaly]]


@dataclass
class JobConfig:
    """Settings of the detectors of one job, and which of them run."""

    iterations: IterationConfig = field(default_factory=IterationConfig)
    slowdown: SlowdownConfig = field(default_factory=lambda: SlowdownConfig(
        shards=get_settings().processor.evidence_shards))
    hang: HangConfig | None = None
    #: degraded links even when the job absorbs them (None: not run)
    linkrate: LinkRateConfig | None = field(default_factory=LinkRateConfig)
    #: action costs of the mitigation planner (None: no planner, no advice)
    planner: PlannerConfig | None = field(default_factory=lambda: PlannerConfig.from_costs(
        get_settings().processor.planner_costs))
    #: every S2 micro-batch count a multiple of this (the pipeline depth for 1F1B, §5.2)
    planner_multiple_of: int = 1
    #: the detectors that run, by registry name (None: all; ``linkrate`` also needs its
    #: config); a detector whose input another one derives brings that one along
    detectors: frozenset[str] | None = None
    #: active validation (issue 17): the jobs whose suspects may be probed (``*``: all) and
    #: the time a probe may take
    probe_jobs: frozenset[str] = field(
        default_factory=lambda: get_settings().probes.enabled_jobs())
    probe_deadline_s: float = field(default_factory=lambda: get_settings().probes.deadline_s)
    #: derived tables this engine reads from another stage (a consumer group that derives
    #: them and exports them over Kafka: ``failslow process --import``) instead of deriving
    #: them: the detectors that derive only those do not run here
    imported: frozenset[str] = frozenset()
    #: this engine reduces shard (i, n) of the job's evidence for another stage
    #: (``failslow process --shard i/n``; None: the ``evidence`` stage does not run)
    evidence_shard: tuple[int, int] | None = None
    #: the event time of the engine's windows (a stage sizes what it hands over by it)
    window_ns: int = DEFAULT_WINDOW_NS

    def enabled(self, name: str) -> bool:
        if name == "linkrate" and self.linkrate is None:
            return False
        if name == "evidence" and self.evidence_shard is None:
            return False
        if self.detectors is None:
            return not _derives_only(name, self.imported)
        return name in self.detectors or any(
            name in _needs(other) and not _derives_only(name, self.imported)
            for other in self.detectors)


@dataclass(frozen=True)
class Entry:
    """One registered detector: its class and how to build it for a job."""

    cls: type
    make: Callable[[JobMeta, JobConfig, Known], Detector]

    @property
    def name(self) -> str:
        return str(self.cls.name)  # type: ignore[attr-defined]


def _slowdown(meta: JobMeta, config: JobConfig, known: Known) -> Detector:
    # the tracker is the registered one, upstream: iterations arrive in the batch
    return SlowdownDetector(meta, config.slowdown, own_tracker=False,
                            evidence_imported="evidence" in config.imported)


def _evidence(meta: JobMeta, config: JobConfig, known: Known) -> Detector:
    shard, shards = config.evidence_shard or (0, 1)
    return EvidenceStage(meta, config.slowdown, shard, shards, config.window_ns)


def _linkrate(meta: JobMeta, config: JobConfig, known: Known) -> Detector:
    return LinkRateDetector(meta, config.linkrate, known=known)


#: The detectors, in the order their derived tables flow.
REGISTRY: tuple[Entry, ...] = (
    Entry(IterationTracker, lambda meta, config, known: IterationTracker(meta, config.iterations)),
    Entry(EvidenceStage, _evidence),
    Entry(SlowdownDetector, _slowdown),
    Entry(HangDetector, lambda meta, config, known: HangDetector(meta, config.hang)),
    Entry(LinkRateDetector, _linkrate),
)

NAMES: tuple[str, ...] = tuple(e.name for e in REGISTRY)


def parse_names(text: str) -> frozenset[str] | None:
    """The detectors of a comma-separated list of registry names (``failslow process
    --detectors``); None (all of them) for an empty list. ValueError names an unknown one."""
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(NAMES))
    if unknown:
        raise ValueError(f"no detector {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(NAMES)}")
    return names or None


def _needs(name: str) -> set[str]:
    """Registered detectors whose derived tables ``name`` reads."""
    entry = next((e for e in REGISTRY if e.name == name), None)
    if entry is None:
        raise ValueError(f"no detector {name!r}; known: {', '.join(NAMES)}")
    kinds: frozenset[str] = entry.cls.kinds  # type: ignore[attr-defined]
    return {e.name for e in REGISTRY
            if set(e.cls.produces) & kinds}  # type: ignore[attr-defined]


def _derives_only(name: str, tables: frozenset[str]) -> bool:
    """Registered detector ``name`` derives tables and all of them are in ``tables``."""
    entry = next((e for e in REGISTRY if e.name == name), None)
    produces = set(entry.cls.produces) if entry is not None else set()  # type: ignore[attr-defined]
    return bool(produces) and produces <= tables


def build(meta: JobMeta, config: JobConfig, known: Known) -> dict[str, Detector]:
    """The enabled detectors of a job, by name, in registry order. The link-rate detector
    also sees the job slow-downs the slow-down detector is still localizing, and the
    communicator kinds it learned (for a job whose meta lists none)."""
    built = {e.name: e.make(meta, config, known) for e in REGISTRY if config.enabled(e.name)}
    linkrate, slowdown = built.get("linkrate"), built.get("slowdown")
    if isinstance(linkrate, LinkRateDetector) and isinstance(slowdown, SlowdownDetector):
        linkrate.localizing = slowdown.pending_onsets
        linkrate.samples.comms.learned = slowdown.registry
    return built


#: Record kinds the what-if analysis reads besides the detectors' (ByteDance §3).
WHATIF_KINDS = frozenset({"coll", "span"})
#: Record kinds the engine itself reads: probe outcomes, evidence on open anomalies
#: (:mod:`failslow.engine.probes`).
ENGINE_KINDS = frozenset({"probe"})


def input_kinds(config: JobConfig | None = None) -> tuple[str, ...]:
    """The record kinds (events.md) the engine reads for a job: those of its enabled
    detectors (all without ``config``), of the what-if analysis and the probe outcomes, in
    contract order.
    Online and offline read exactly these."""
    wanted: set[str] = set(WHATIF_KINDS | ENGINE_KINDS)
    for e in REGISTRY:
        if config is None or config.enabled(e.name):
            wanted |= e.cls.kinds  # type: ignore[attr-defined]
    return tuple(k for k in events.KINDS if k in wanted)


#: The record kinds of a default job (``failslow analyze`` and ``failslow process``).
KINDS: tuple[str, ...] = input_kinds()
