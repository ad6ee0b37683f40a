"""Small synthetic inputs for the stream, storage and report tests (no simulator needed).

An 8-rank job, tp2 pp2 dp2 in Megatron order (rank = tp + 2 * (dp + 2 * pp)); every
iteration each DP group all-reduces once; from iteration ``slow_from`` rank ``slow_rank``
enters ``late_ms`` late. :class:`FakeAnalyzer` follows the JobAnalyzer interface: it derives
rounds from coll rows, one job-level iteration per DP round of comm ``DP_COMMS[0]``, and
reports an anomaly (opened, then ended) on the slow rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from failslow import events, results
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import Comm, JobMeta
from failslow.stream.sink import MemorySink, SinkBatch
from failslow.stream.transport import InProcessTransport

MS = 1_000_000
T0 = 1_750_000_000_000_000_000
ITER_NS = 100 * MS
TP_COMMS = [(11, (0, 1)), (12, (2, 3)), (13, (4, 5)), (14, (6, 7))]
DP_COMMS = [(2**64 - 1, (0, 2)), (22, (1, 3)), (23, (4, 6)), (24, (5, 7))]
PP_COMMS = [(31, (0, 4)), (32, (1, 5)), (33, (2, 6)), (34, (3, 7))]


def meta(job: str = "synth-1") -> JobMeta:
    comms = tuple(Comm(c, "tp", r) for c, r in TP_COMMS) \
        + tuple(Comm(c, "dp", r) for c, r in DP_COMMS) \
        + tuple(Comm(c, "pp", r) for c, r in PP_COMMS)
    return JobMeta(job=job, t=T0, world_size=8, tp=2, pp=2, dp=2, cp=1, microbatches=4,
                   schedule="1f1b", nodes={r: f"n{r // 4}" for r in range(8)}, comms=comms)


def coll(job: str = "synth-1", iterations: int = 20, slow_rank: int = 6, slow_from: int = 10,
         late_ms: float = 30.0, seed: int = 0) -> pa.Table:
    """Two rows (enter, end) per member per DP all-reduce round, one round per iteration."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "comm", "comm_rank", "seq", "phase",
                                                  "t", "t_start")}
    for it in range(iterations):
        base = T0 + it * ITER_NS
        for comm, ranks in DP_COMMS:
            enters = [base + int(rng.uniform(0, 2) * MS) for _ in ranks]
            for i, r in enumerate(ranks):
                if r == slow_rank and it >= slow_from:
                    enters[i] += int(late_ms * MS)
            end = max(enters) + 5 * MS
            for i, r in enumerate(ranks):
                for phase, t in (("enter", enters[i]), ("end", end)):
                    cols["rank"].append(r)
                    cols["comm"].append(comm)
                    cols["comm_rank"].append(i)
                    cols["seq"].append(it)
                    cols["phase"].append(phase)
                    cols["t"].append(t)
                    cols["t_start"].append(max(enters) if phase == "end" else None)
    n = len(cols["rank"])
    table = pa.table({
        "job": [job] * n, "rank": pa.array(cols["rank"], pa.int32()),
        "comm": pa.array(cols["comm"], pa.uint64()),
        "comm_rank": pa.array(cols["comm_rank"], pa.int32()),
        "comm_size": pa.array([2] * n, pa.int32()), "seq": pa.array(cols["seq"], pa.uint64()),
        "op": ["allreduce"] * n, "bytes": pa.array([1 << 20] * n, pa.uint64()),
        "peer": pa.array([-1] * n, pa.int32()), "phase": cols["phase"],
        "t": pa.array(cols["t"], pa.int64()), "t_start": pa.array(cols["t_start"], pa.int64()),
    })
    return events.conform(table, "coll")


def rounds_from_coll(table: pa.Table) -> pa.Table:
    """One ``rounds`` row per (comm, seq) with both members' enter and end rows."""
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for r in table.to_pylist():
        key = (r["comm"], r["seq"])
        d = rows.setdefault(key, {"enter": {}, "end": {}, "job": r["job"], "op": r["op"],
                                  "bytes": r["bytes"], "size": r["comm_size"]})
        d[r["phase"]][r["rank"]] = r["t"]
    out = []
    for (comm, seq), d in sorted(rows.items()):
        if len(d["end"]) < d["size"] or len(d["enter"]) < d["size"]:
            continue
        enters, ends = d["enter"], d["end"]
        last = max(enters, key=lambda k: (enters[k], k))
        durations = [ends[k] - enters[k] for k in enters]
        out.append({"job": d["job"], "comm": comm, "seq": seq, "op": d["op"],
                    "bytes": d["bytes"], "members": d["size"],
                    "t_first_enter": min(enters.values()), "t_last_enter": enters[last],
                    "t_end": max(ends.values()), "last_rank": last,
                    "duration_max_ns": max(durations), "duration_min_ns": min(durations)})
    return pa.Table.from_pylist(out, schema=results.SCHEMAS["rounds"])


def iterations_from_rounds(rounds: pa.Table, comm: int = DP_COMMS[0][0]) -> pa.Table:
    """A job-level iteration per round of ``comm`` (rank -1)."""
    rows = [r for r in rounds.to_pylist() if r["comm"] == comm]
    out = [{"job": r["job"], "rank": -1, "iteration": int(r["seq"]),
            "t_start": r["t_end"] - ITER_NS, "t_end": r["t_end"], "duration_ns": ITER_NS
            + (r["t_last_enter"] - r["t_first_enter"])} for r in rows]
    return pa.Table.from_pylist(out, schema=results.SCHEMAS["iterations"])


@dataclass
class Output:
    anomalies: list[Anomaly] = field(default_factory=list)
    rounds: pa.Table = field(default_factory=lambda: results.empty("rounds"))
    iterations: pa.Table = field(default_factory=lambda: results.empty("iterations"))


class FakeAnalyzer:
    """JobAnalyzer-shaped: rounds per update, an anomaly on a rank that enters last by more
    than 10 ms, ended when a later round has no such lateness."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.batches: list[dict[str, pa.Table]] = []
        self.ticks: list[int] = []
        self.open: Anomaly | None = None
        self.closed: list[Anomaly] = []
        self.fail_on_rank: int | None = None

    def update(self, batch: dict[str, pa.Table]) -> Output:
        self.batches.append(batch)
        table = batch.get("coll")
        if table is None:
            return Output()
        if self.fail_on_rank is not None and self.fail_on_rank in table.column("rank"
                                                                              ).to_pylist():
            raise RuntimeError("injected analyzer failure")
        rounds = rounds_from_coll(table)
        out = Output(rounds=rounds, iterations=iterations_from_rounds(rounds))
        for r in rounds.to_pylist():
            late = r["t_last_enter"] - r["t_first_enter"] > 10 * MS
            if late and self.open is None:
                self.open = Anomaly(id=f"slow-{r['last_rank']}", kind="slow", cause="compute",
                                    ranks=[r["last_rank"]], comm=r["comm"], comm_kind="dp",
                                    stage="dp_sync", start_ns=r["t_first_enter"],
                                    detected_ns=r["t_end"], slowdown=1.3)
                out.anomalies.append(self.open)
        return out

    def on_tick(self, now_ns: int) -> Output:
        self.ticks.append(now_ns)
        return Output()

    def snapshot(self) -> dict[str, Any]:
        return {"open": self.open.to_dict() if self.open else None, "ticks": len(self.ticks)}

    def restore(self, state: dict[str, Any]) -> None:
        self.open = Anomaly.from_dict(state["open"]) if state["open"] else None
        self.restored = state

    def diagnosis(self) -> Diagnosis:
        found = ([self.open] if self.open else []) + self.closed
        return Diagnosis(job=self.meta.job, anomalies=found)


class Crash(Exception):
    """Stands for kill -9."""


class CrashingBus(InProcessTransport):
    """Crashes at the ``crash_at``-th commit (after the sink write, before the commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_at: int | None = None
        self.commits = 0

    def commit(self, offsets: Mapping[tuple[str, int], int] | None = None) -> None:
        self.commits += 1
        if self.crash_at is not None and self.commits >= self.crash_at:
            self.crash_at = None
            raise Crash()
        super().commit(offsets)


class DedupSink(MemorySink):
    """Drops a batch whose token it has stored, as ClickHouse's insert deduplication does;
    counts the batches offered."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.offered = 0

    def write(self, batch: SinkBatch) -> None:
        self.offered += 1
        if batch.token and batch.token in self.seen:
            return
        self.seen.add(batch.token)
        super().write(batch)
