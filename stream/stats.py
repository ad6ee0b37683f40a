"""The counters of a stream processor (:class:`ProcessorStats`), exported as Prometheus
metrics by :mod:`failslow.stream.metrics` and printed by ``failslow process``."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessorStats:
    """Counters of one processor (exported as Prometheus metrics by
    :mod:`failslow.stream.metrics`)."""

    polls: int = 0
    messages: int = 0  # decoded event messages
    rows: Counter[str] = field(default_factory=Counter)  # decoded rows per kind
    dead_letters: int = 0
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)
    errors: int = 0  # analyzer failures (the batch is skipped for detection, still stored)
    anomaly_reports: int = 0
    anomalies_published: int = 0
    exports_published: int = 0  # messages of derived tables for other consumer groups
    advice: int = 0  # mitigation advice made (planner decisions)
    advice_published: int = 0
    #: probe requests sent to the node agents (issue 17)
    probe_requests_published: int = 0
    whatif_results: int = 0
    checkpoints: int = 0
    sink_writes: int = 0
    rows_written: Counter[str] = field(default_factory=Counter)
    backpressure: int = 0
    sink_failures: int = 0
    paused: int = 0  # 1 while consumption is paused for the sink
    paused_seconds: float = 0.0
    jobs: int = 0
    jobs_retired: int = 0  # silent jobs whose detector state was let go
    pending_messages: int = 0  # waiting for their job's meta
    snapshots: int = 0
    snapshot_bytes: int = 0
    restored_jobs: int = 0
    #: logged cuts after the partitions' last snapshots: what a restart re-cuts
    cuts_since_snapshot: int = 0
    replayed_cuts: int = 0  # logged cuts re-cut after a restart
    deferred_messages: int = 0
    lag: int | None = None  # messages behind the end of the assigned partitions
    rows_per_s: float = 0.0  # decoded rows per second over the last metrics interval
    first_message_ns: int = 0  # wall time of the first message
    last_checkpoint_ns: int = 0  # wall time of the last checkpoint that did work (wrote
    # rows, published exports, or followed analysis)
    cpu_first_message_s: float = 0.0  # CPU time of the process (all threads) at those two
    cpu_last_checkpoint_s: float = 0.0
    # (CPU time, rows decoded) at each checkpoint that wrote rows (the last 1000)
    cpu_samples: list[tuple[float, int]] = field(default_factory=list)
    seconds: defaultdict[str, float] = field(  # time per phase
        default_factory=lambda: defaultdict(float))

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        for key in ("rows", "dead_letter_reasons", "rows_written", "seconds"):
            d[key] = dict(d[key])
        d["seconds"] = {k: round(v, 4) for k, v in d["seconds"].items()}
        return d
