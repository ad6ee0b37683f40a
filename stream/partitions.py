"""The processor's bookkeeping of one input partition (:class:`Partition`): the offsets it
has read, the output buffered since its last cut, the logged cuts still to re-cut after a
restart, and the messages of jobs whose meta has not arrived (:class:`PendingMessage`)."""

from __future__ import annotations

import base64
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from failslow.engine.probes import ProbeRequest
from failslow.mitigation.planner import Advice
from failslow.stream.sink import AnomalyReport
from failslow.stream.state import Cut
from failslow.stream.transport import Message

#: A what-if result waiting to be written: job, step, event time, result, wall time (ns).
WhatIfRow = tuple[str, int, int, dict[str, Any], int]


@dataclass
class PendingMessage:
    """A message of a job whose meta has not arrived yet."""

    message: Message
    kind: str
    table: pa.Table

    def to_state(self) -> dict[str, Any]:
        """JSON-friendly, for the partition's snapshot."""
        m = self.message
        return {"topic": m.topic, "key": m.key, "offset": m.offset, "headers": m.headers,
                "value": base64.b64encode(m.value).decode()}


def pending_message(d: Mapping[str, Any], partition: int) -> Message:
    """The message of :meth:`PendingMessage.to_state`."""
    return Message(d["topic"], d["key"], base64.b64decode(d["value"]), dict(d["headers"]),
                   int(d["offset"]), 0, partition)


@dataclass
class Partition:
    """Everything the processor keeps for one partition number."""

    number: int
    seq: int = 0  # the last logged cut
    snapshot_seq: int = 0  # the cut the last snapshot includes
    positions: dict[str, int] = field(default_factory=dict)  # topic -> next offset
    ranges: dict[str, list[int]] = field(default_factory=dict)  # since the last cut
    messages: int = 0  # since the last cut
    rows: int = 0  # buffered output rows
    out: dict[str, list[pa.Table]] = field(default_factory=lambda: defaultdict(list))
    reports: list[AnomalyReport] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    whatif: list[WhatIfRow] = field(default_factory=list)
    probe_requests: list[ProbeRequest] = field(default_factory=list)
    #: rows of derived tables to export (job, table name, rows with t_emit), and the
    #: messages of the next checkpoint (job, table name, rows, watermark)
    exported: list[tuple[str, str, pa.Table]] = field(default_factory=list)
    exports: list[tuple[str, str, pa.Table, int]] = field(default_factory=list)
    cuts: deque[Cut] = field(default_factory=deque)  # logged cuts to re-cut (recovery)
    done: set[int] = field(default_factory=set)  # seqs of logged cuts that were committed
    deferred: list[Message] = field(default_factory=list)  # after the next logged cut
    recovering_since: float = 0.0
    pending: dict[str, list[PendingMessage]] = field(default_factory=dict)
    pending_bytes: int = 0

    def has_output(self) -> bool:
        return bool(self.reports or self.advice or self.whatif or self.exported
                    or any(self.out.values()))

    def note(self, message: Message) -> None:
        """``message`` was read: extend the offset range of the next cut."""
        rng = self.ranges.get(message.topic)
        if rng is None:
            self.ranges[message.topic] = [message.offset, message.offset]
        else:
            rng[1] = max(rng[1], message.offset)
        self.positions[message.topic] = max(self.positions.get(message.topic, 0),
                                            message.offset + 1)
        self.messages += 1

    def next_cut(self, created_ns: int) -> Cut | None:
        """The cut of the input read since the last one (None: no input)."""
        if not self.ranges:
            return None
        self.seq += 1
        return Cut(self.number, self.seq, {t: (r[0], r[1]) for t, r in self.ranges.items()},
                   created_ns)

    def cut_complete(self, cut: Cut) -> bool:
        """Every message of logged ``cut`` was read again."""
        return all(self.positions.get(t, -1) > last for t, (_, last) in cut.ranges.items())

    def clear_output(self) -> None:
        """Forget what was written and the input range it covered."""
        self.out = defaultdict(list)
        self.reports = []
        self.advice = []
        self.whatif = []
        self.probe_requests = []
        self.exported = []
        self.exports = []
        self.ranges = {}
        self.messages = 0
        self.rows = 0

    def pending_count(self) -> int:
        return sum(len(v) for v in self.pending.values())
