"""An independent, deliberately plain trace generator that follows events.md to the letter.

It shares no code with failslow's simulator: it exists to check that `failslow analyze`
accepts every valid trace (any row order, JSON Lines or Parquet, optional kinds absent,
``meta.comms`` empty, communicator ids above 2^63, extra columns, nullable columns absent).

The job: pp=2 x dp=2 (tp=1), 4 ranks on 2 nodes, GPipe-like: stage 0 runs M forwards and
sends activations to stage 1; stage 1 receives, computes, then backward runs in reverse;
finally each stage's DP pair all-reduces gradients.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MS = 1_000_000
T0 = 1_750_000_000_000_000_000
PP_COMMS = {0: 2**63 + 11, 1: 2**63 + 12}          # per dp index: ranks (dp, dp + 2)
DP_COMMS = {0: 18_446_744_073_709_551_557, 1: 7}   # per stage: ranks (2s, 2s + 1)


def rank_of(stage: int, dp: int) -> int:
    return stage * 2 + dp


def generate(iterations: int = 30, microbatches: int = 4, slow_rank: int | None = None,
             slow_from: int = 15, slow_factor: float = 1.6, seed: int = 0,
             jitter: str = "uniform", skew_ms: float = 0.0, pauses: float = 0.0,
             slow_link: int | None = None, link_factor: float = 4.0, slow_until: int | None = None
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Rows of the job. ``jitter``: the shape of compute noise (``uniform`` +-2%, ``pareto``:
    heavy right tail, ``bimodal``: every other micro-batch 8% longer at random); ``skew_ms``:
    hostB's clock runs this far ahead of hostA's; ``pauses``: chance per rank and iteration
    of a 40-120 ms pause (garbage collection); ``slow_link``: the dp index whose pipeline
    messages (hostA <-> hostB) are ``link_factor`` slower from ``slow_from`` on (until
    ``slow_until``); a slow rank is slow from ``slow_from`` until ``slow_until``."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seq: dict[tuple[int, int], int] = {}
    clock = [T0] * 4
    end = slow_until if slow_until is not None else iterations
    skew = [0, 0, int(skew_ms * MS), int(skew_ms * MS)]  # ranks 2, 3 sit on hostB

    def op(rank: int, comm: int, comm_rank: int, size: int, name: str, nbytes: int,
           peer: int, enter: int, end_t: int, start: int) -> None:
        key = (comm, rank)
        s = seq.get(key, 0)
        seq[key] = s + 1
        base = {"job": "indep-1", "rank": rank, "comm": comm, "comm_rank": comm_rank,
                "comm_size": size, "seq": s, "op": name, "bytes": nbytes, "peer": peer}
        off = skew[rank]
        rows.append({**base, "phase": "enter", "t": enter + off})
        rows.append({**base, "phase": "end", "t": end_t + off, "t_start": start + off,
                     "send_count": nbytes // 4096, "recv_count": nbytes // 4096})

    def noise() -> float:
        if jitter == "pareto":
            return 0.98 + 0.02 * rng.paretovariate(3.0)
        if jitter == "bimodal":
            return rng.choice((1.0, 1.08)) * rng.uniform(0.99, 1.01)
        return rng.uniform(0.98, 1.02)

    def compute(rank: int, it: int, ms: float) -> None:
        factor = slow_factor if (rank == slow_rank and slow_from <= it < end) else 1.0
        clock[rank] += int(ms * MS * factor * noise())

    def transfer(dp: int, it: int) -> int:
        slow = slow_link == dp and slow_from <= it < end
        return int(2 * MS * (link_factor if slow else 1.0) * rng.uniform(0.97, 1.03))

    for it in range(iterations):
        for r in range(4):
            if pauses and rng.random() < pauses:
                clock[r] += int(rng.uniform(40, 120) * MS)
        for dp in range(2):
            r0, r1 = rank_of(0, dp), rank_of(1, dp)
            for _ in range(microbatches):            # forward
                compute(r0, it, 10)
                enter_s, enter_r = clock[r0], clock[r1]
                start = max(enter_s, enter_r)
                end_t = start + transfer(dp, it)
                op(r0, PP_COMMS[dp], 0, 2, "send", 1 << 20, 1, enter_s, end_t, start)
                op(r1, PP_COMMS[dp], 1, 2, "recv", 1 << 20, 0, enter_r, end_t, start)
                clock[r0] = clock[r1] = end_t
                compute(r1, it, 10)
            for _ in range(microbatches):            # backward
                compute(r1, it, 20)
                enter_s, enter_r = clock[r1], clock[r0]
                start = max(enter_s, enter_r)
                end_t = start + transfer(dp, it)
                op(r1, PP_COMMS[dp], 1, 2, "send", 1 << 20, 0, enter_s, end_t, start)
                op(r0, PP_COMMS[dp], 0, 2, "recv", 1 << 20, 1, enter_r, end_t, start)
                clock[r0] = clock[r1] = end_t
                compute(r0, it, 20)
        for stage in range(2):                       # gradient all-reduce per stage
            ranks = [rank_of(stage, 0), rank_of(stage, 1)]
            start = max(clock[r] for r in ranks)
            end_t = start + 15 * MS
            for i, r in enumerate(ranks):
                op(r, DP_COMMS[stage], i, 2, "allreduce", 64 << 20, -1, clock[r], end_t, start)
                clock[r] = end_t
        barrier = max(clock)                         # optimizer step, then next iteration
        for r in range(4):
            clock[r] = barrier + 5 * MS
    meta = {
        "job": "indep-1", "t": T0, "world_size": 4, "tp": 1, "pp": 2, "dp": 2, "cp": 1,
        "microbatches": microbatches, "schedule": "gpipe",
        "nodes": {"0": "hostA", "1": "hostA", "2": "hostB", "3": "hostB"},
        "comms": [{"comm": c, "kind": "pp", "ranks": [rank_of(0, d), rank_of(1, d)]}
                  for d, c in PP_COMMS.items()]
        + [{"comm": c, "kind": "dp", "ranks": [rank_of(s, 0), rank_of(s, 1)]}
           for s, c in DP_COMMS.items()],
    }
    return meta, rows


def write(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]], *, fmt: str = "jsonl",
          shuffle: bool = False, empty_comms: bool = False, text_fields: bool = False,
          meta_list: bool = False, extra_column: bool = False, drop_nullables: bool = False,
          drop_t_start: bool = False, seed: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    meta = dict(meta)
    if empty_comms:
        meta["comms"] = []
    if text_fields:
        meta["nodes"] = json.dumps(meta["nodes"])
        meta["comms"] = json.dumps(meta["comms"])
    doc: Any = meta
    if meta_list:
        stale = dict(meta, t=meta["t"] - 1, microbatches=99)
        doc = [meta, stale]
    (path / "meta.json").write_text(json.dumps(doc))
    rows = [dict(r) for r in rows]
    if shuffle:
        random.Random(seed).shuffle(rows)
    for r in rows:
        if extra_column:
            r["host_pid"] = 4242
        if drop_nullables:
            for key in ("t_start", "send_count", "recv_count"):
                r.pop(key, None)
        elif drop_t_start and "t_start" in r:
            r["t_start"] = None
    if fmt == "jsonl":
        with (path / "coll.jsonl").open("w") as fh:
            for r in rows:
                fh.write(json.dumps(r) + "\n")
    else:
        columns = {key: [r.get(key) for r in rows] for key in rows[0] | rows[1]}
        types = {"comm": pa.uint64(), "seq": pa.uint64(), "bytes": pa.uint64(),
                 "send_count": pa.uint64(), "recv_count": pa.uint64()}
        table = pa.table({k: pa.array(v, types.get(k)) for k, v in columns.items()})
        pq.write_table(table, path / "coll.parquet")
    return path
