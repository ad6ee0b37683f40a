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
             slow_from: int = 15, slow_factor: float = 1.6, seed: int = 0
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    seq: dict[tuple[int, int], int] = {}
    clock = [T0] * 4

    def op(rank: int, comm: int, comm_rank: int, size: int, name: str, nbytes: int,
           peer: int, enter: int, end: int, start: int) -> None:
        key = (comm, rank)
        s = seq.get(key, 0)
        seq[key] = s + 1
        base = {"job": "indep-1", "rank": rank, "comm": comm, "comm_rank": comm_rank,
                "comm_size": size, "seq": s, "op": name, "bytes": nbytes, "peer": peer}
        rows.append({**base, "phase": "enter", "t": enter})
        rows.append({**base, "phase": "end", "t": end, "t_start": start,
                     "send_count": nbytes // 4096, "recv_count": nbytes // 4096})

    def compute(rank: int, it: int, ms: float) -> None:
        factor = slow_factor if (rank == slow_rank and it >= slow_from) else 1.0
        clock[rank] += int(ms * MS * factor * rng.uniform(0.98, 1.02))

    for it in range(iterations):
        for dp in range(2):
            r0, r1 = rank_of(0, dp), rank_of(1, dp)
            for _ in range(microbatches):            # forward
                compute(r0, it, 10)
                enter_s, enter_r = clock[r0], clock[r1]
                start = max(enter_s, enter_r)
                end = start + 2 * MS
                op(r0, PP_COMMS[dp], 0, 2, "send", 1 << 20, 1, enter_s, end, start)
                op(r1, PP_COMMS[dp], 1, 2, "recv", 1 << 20, 0, enter_r, end, start)
                clock[r0] = clock[r1] = end
                compute(r1, it, 10)
            for _ in range(microbatches):            # backward
                compute(r1, it, 20)
                enter_s, enter_r = clock[r1], clock[r0]
                start = max(enter_s, enter_r)
                end = start + 2 * MS
                op(r1, PP_COMMS[dp], 1, 2, "send", 1 << 20, 0, enter_s, end, start)
                op(r0, PP_COMMS[dp], 0, 2, "recv", 1 << 20, 1, enter_r, end, start)
                clock[r0] = clock[r1] = end
                compute(r0, it, 20)
        for stage in range(2):                       # gradient all-reduce per stage
            ranks = [rank_of(stage, 0), rank_of(stage, 1)]
            start = max(clock[r] for r in ranks)
            end = start + 15 * MS
            for i, r in enumerate(ranks):
                op(r, DP_COMMS[stage], i, 2, "allreduce", 64 << 20, -1, clock[r], end, start)
                clock[r] = end
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
          seed: int = 0) -> Path:
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
