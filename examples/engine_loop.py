"""The job-level stage beside the example job, live (issue 17: the engine asks for probes).

:class:`LiveEngine` is the stream processor's embedded path: a
:class:`~failslow.stream.processor.StreamProcessor` on an in-process transport, fed the rows
the node agent drains (``Agent.drain``) and the probe rows the probe service returns, as
``failslow process`` is fed them over Kafka. Its job analyzer has probes enabled for the job;
the probe requests it publishes (``failslow.probe-requests``) are read by the probe service
through :class:`~failslow.collectors.probes.requests.EmbeddedRequests`, so the suspects the
engine names are probed and the ``probe`` rows come back to it as evidence. A healthy job has
no open anomaly and therefore asks nothing.

The analyzer is built once from the job's ``meta``: the engine holds the rows back until the
agent knows every communicator and rank (``comms``, ``world``), then publishes the meta and
everything held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import pyarrow as pa

from failslow.collectors.probes.requests import EmbeddedRequests
from failslow.diagnosis import Diagnosis
from failslow.engine.analyzer import JobAnalyzer, JobConfig
from failslow.events import JobMeta
from failslow.stream.config import Analyzer, ProcessorConfig
from failslow.stream.processor import StreamProcessor
from failslow.stream.transport import InProcessTransport

__all__ = ["LiveEngine"]

Batches = Iterable[tuple[str, Mapping[str, pa.Table]]]


class LiveEngine:
    """The engine over one job's live rows (module docstring). ``comms`` / ``world``: the
    communicators and ranks the job's meta must list before analysis starts; ``probes``
    False: the engine asks for none (the job's probes are off)."""

    def __init__(self, job: str, comms: int, world: int, probes: bool = True) -> None:
        self.job, self.comms, self.world = job, comms, world
        self.probes = probes
        self.transport = InProcessTransport(keep_committed=False)
        self.processor = StreamProcessor(
            self.transport, None,
            ProcessorConfig(clock="wall", tick_interval_ns=100_000_000,
                            checkpoint_interval_s=0.2, store_events=False),
            analyzer_factory=self._analyzer)
        #: the probe service's request source
        self.requests = EmbeddedRequests(self.transport)
        self._held: list[tuple[str, Mapping[str, pa.Table]]] = []
        self.started = False

    def _analyzer(self, meta: JobMeta) -> Analyzer:
        jobs = frozenset({self.job}) if self.probes else frozenset()
        analyzer: Analyzer = JobAnalyzer(meta, JobConfig(probe_jobs=jobs))
        return analyzer

    def ready(self, meta: JobMeta) -> bool:
        return len(meta.comms) >= self.comms and len(meta.nodes) >= self.world

    def feed(self, meta: Callable[[], JobMeta], batches: Batches) -> None:
        """Publish ``batches`` (once ``meta()`` is complete) and let the processor analyse
        them; it publishes its probe requests at its checkpoints."""
        batches = list(batches)
        if not self.started:
            self._held += batches
            m = meta()
            if not self.ready(m):
                return
            self.transport.publish_meta(m)
            batches, self._held, self.started = self._held, [], True
        for job, batch in batches:
            if job == self.job and any(t.num_rows for t in batch.values()):
                self.transport.publish_batch(job, batch)
        while self.processor.step(0.0):
            pass
        self.processor.step(0.0)  # ticks and a due checkpoint even without new input

    def diagnosis(self) -> Diagnosis | None:
        """Everything analysed to the end; the job's diagnosis (None: never started)."""
        if not self.started:
            return None
        self.processor.run(until_idle=True)
        return self.processor.diagnosis(self.job)

    def close(self) -> None:
        self.processor.close()
        self.transport.close()
