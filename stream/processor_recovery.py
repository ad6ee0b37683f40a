"""The stream processor's partitions coming and going (:class:`PartitionRecovery`, a part of
:class:`~failslow.stream.processor.StreamProcessor`): a partition assigned to this consumer
gets its state loaded from the state store (the snapshot of its jobs, the messages of jobs
still waiting for their meta, the logged cuts to re-cut) and the transport is moved to where
that state ends; a revoked one is dropped without writing or committing anything; the
logged cuts of a restarted partition are re-cut, written again with their tokens and
committed, and given up on after ``cut_timeout_s``."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import pyarrow as pa

from failslow.stream.config import ProcessorConfig
from failslow.stream.jobs import Jobs
from failslow.stream.output import Writer
from failslow.stream.partitions import Partition, pending_message
from failslow.stream.state import Cut, StateStore
from failslow.stream.stats import ProcessorStats
from failslow.stream.transport import DecodeError, Message, Transport, decode

log = logging.getLogger(__name__)


class PartitionRecovery:
    """The assignment listener and the recovery of :class:`~failslow.stream.processor
    .StreamProcessor` (a mixin: the processor's ``__init__`` sets the attributes declared
    here, its message handling and output have the methods declared under
    ``TYPE_CHECKING``)."""

    config: ProcessorConfig
    transport: Transport
    state: StateStore | None
    stats: ProcessorStats
    last_message: float
    _parts: dict[int, Partition]
    _idle_since: dict[int, int]
    _jobs: Jobs
    _writer: Writer
    _to_load: set[int]
    _uncommitted: int

    if TYPE_CHECKING:  # StreamProcessor's
        def _part(self, number: int) -> Partition: ...
        def _admit(self, message: Message) -> None: ...
        def _hold_pending(self, part: Partition, job: str, message: Message, kind: str,
                          table: pa.Table) -> None: ...
        def _flush(self, part: Partition, cut: Cut | None, publish: bool) -> None: ...
        def _count_cuts_since_snapshot(self) -> None: ...

    # ------------------------------------------------------------------ assignment (listener)

    def on_assigned(self, partitions: set[int]) -> None:
        """Partitions given to this consumer: their state is loaded before their messages
        are processed (in :meth:`step`). The idle time of ``run(idle_timeout=...)`` starts
        again (a restarted consumer may wait for the group to drop its predecessor)."""
        self.last_message = time.monotonic()
        for p in partitions:
            if p not in self._parts:
                self._to_load.add(p)

    def on_revoked(self, partitions: set[int]) -> None:
        """Partitions taken away (a rebalance, or the group dropped this consumer): their
        next owner, perhaps this processor again, may have started already, so nothing is
        written or committed for them here (it could overwrite the next owner's work). It
        continues from their last snapshot and logged cuts, and reads the rest again."""
        self._to_load -= set(partitions)
        mine = [p for p in partitions if p in self._parts]
        if mine:
            log.info("partitions %s revoked: dropping their state since the last checkpoint "
                     "(their next owner reads that input again)", mine)
        for p in mine:
            self._drop_partition(p)

    def _drop_partition(self, number: int) -> None:
        part = self._parts.pop(number, None)
        self._idle_since.pop(number, None)
        # polled while waiting for the sink: the partition's next owner reads them (in
        # place: a step may be concatenating this list)
        self._writer.held[:] = [m for m in self._writer.held if m.partition != number]
        if part is None:
            return
        self._uncommitted = max(0, self._uncommitted - part.messages)
        self._jobs.drop_partition(number)
        self._count_cuts_since_snapshot()
        self.stats.pending_messages = sum(p.pending_count() for p in self._parts.values())

    # ----------------------------------------------------------------------------- recovery

    def _load_assigned(self, messages: list[Message]) -> list[Message]:
        """Load the state of newly assigned partitions, seek to where it ends, and drop the
        messages of those partitions polled before the seek (they are fetched again)."""
        loading = set(self._to_load)
        self._to_load.clear()
        if self.state is None:  # positions are the transport's own: keep what was polled
            for number in loading:
                self._part(number)
            return messages
        first: dict[tuple[str, int], int] = {}
        kept: list[Message] = []
        for m in messages:
            if m.partition in loading:
                first.setdefault((m.topic, m.partition), m.offset)
            else:
                kept.append(m)
        for number in sorted(loading):
            targets = self._load_partition(number)
            for (topic, p), offset in first.items():
                if p == number and topic not in targets:
                    targets[topic] = offset
            for topic, offset in targets.items():
                try:
                    self.transport.seek(topic, number, offset)
                except NotImplementedError:
                    pass
                except Exception as e:  # noqa: BLE001 - e.g. the partition moved again
                    log.warning("cannot seek %s[%d] to %d: %s", topic, number, offset, e)
        return kept

    def _load_partition(self, number: int) -> dict[str, int]:
        """Create the partition's bookkeeping from its snapshot and logged cuts; returns the
        offsets to seek to, per topic."""
        part = Partition(number)
        self._parts[number] = part
        if self.state is None:
            return {}
        state = self.state
        t0 = time.perf_counter()
        snap, cuts = self._writer.retrying("state",
                                           lambda: state.load(self.transport.group, number))
        targets: dict[str, int] = {}
        if snap is not None:
            part.seq = part.snapshot_seq = snap.seq
            part.positions = {t: int(o) for t, o in snap.offsets.items()}
            targets.update(part.positions)
            for job, d in snap.state.get("jobs", {}).items():
                self._jobs.restore(job, d, number)
                self.stats.restored_jobs += 1
            for job, items in snap.state.get("pending", {}).items():
                for item in items:
                    message = pending_message(item, number)
                    try:
                        kind, table = decode(message)
                    except DecodeError:
                        continue
                    self._hold_pending(part, job, message, kind, table)
        if cuts:
            for cut in cuts:
                for topic, (lo, _) in cut.ranges.items():
                    targets.setdefault(topic, lo)
            committed: dict[str, int | None] = {}
            for topic in {t for c in cuts for t in c.ranges}:
                try:
                    committed[topic] = self.transport.committed_offset(topic, number)
                except Exception:  # noqa: BLE001 - unknown: publish again (at-least-once)
                    committed[topic] = None
            for cut in cuts:
                if all((committed.get(t) or 0) >= end for t, end in cut.ends().items()):
                    part.done.add(cut.seq)
            part.cuts = deque(cuts)
            part.recovering_since = time.monotonic()
            log.info("partition %d: re-cutting %d logged cut(s) after seq %d", number,
                     len(cuts), part.seq)
        self.stats.seconds["state"] += time.perf_counter() - t0
        return targets

    def _complete_cut(self, part: Partition) -> None:
        """The input of the next logged cut is processed: write it again with its token
        (the store drops what it has), publish unless it was committed, commit."""
        self._jobs.run_batches()
        cut = part.cuts.popleft()
        self._jobs.diagnosis_rows([part])
        self._flush(part, cut, publish=cut.seq not in part.done)
        self._writer.commit({(t, part.number): end for t, end in cut.ends().items()})
        part.seq = max(part.seq, cut.seq)
        self._count_cuts_since_snapshot()
        self.stats.replayed_cuts += 1
        part.recovering_since = time.monotonic()
        self._readmit_deferred(part)

    def _check_cut_timeouts(self) -> None:
        for part in self._parts.values():
            if part.cuts and time.monotonic() - part.recovering_since \
                    > self.config.cut_timeout_s:
                log.warning("partition %d: logged cut %d never completed (input gone?); "
                            "continuing without re-cutting", part.number, part.cuts[0].seq)
                part.seq = max(part.seq, max(c.seq for c in part.cuts))
                part.cuts.clear()
                self._readmit_deferred(part)

    def _readmit_deferred(self, part: Partition) -> None:
        deferred, part.deferred = part.deferred, []
        for message in deferred:
            self._admit(message)
