"""Write ``coll`` rows as NCCL Inspector output (for accuracy tests and benchmarks).

The inverse of :mod:`failslow.collectors.importers.nccl_inspector` as far as the Inspector
can say it: one ``<host>-pid<pid>.log`` JSON Lines file per rank, ``dump_stats`` markers
(format v4.3) or a header on every record (v4.0), one record per *completed* operation (the
plugin writes an operation when it completes: an operation in flight or hung has no record),
``coll_sn`` per (communicator, function) from 0 and ``p2p_sn`` per communicator from 1.

``verbose``: records carry ``event_trace_ts`` (start = the ``enter`` time, one kernel
channel from ``t_start`` to the ``end`` time, microseconds); without it they carry only
execution time (from the call to the end: a kernel waits for its peers inside) and bus
bandwidth, as the plugin writes by default. ``drop``: per rank, the
fraction of its records removed, as one run of consecutive records per communicator (the
plugin's ring buffer overwritten before a dump), counted in the markers'
``coll_dropped_records``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from failslow.events import JobMeta

FUNC = {"allreduce": "AllReduce", "allgather": "AllGather", "reducescatter": "ReduceScatter",
        "broadcast": "Broadcast", "reduce": "Reduce", "alltoall": "All2All", "send": "Send",
        "recv": "Recv"}
#: Inspector busbw factor per function (NCCL tests' convention), n = communicator size.
_BUS = {"AllReduce": lambda n: 2 * (n - 1) / n, "AllGather": lambda n: (n - 1) / n,
        "ReduceScatter": lambda n: (n - 1) / n}


def completed_ops(coll: pa.Table) -> pd.DataFrame:
    """One row per completed operation (enter joined with end): rank, comm, comm_rank,
    comm_size, seq, op, bytes, peer, t (enter), t_end, t_start (-1 if unknown)."""
    coll = coll.set_column(coll.schema.get_field_index("t_start"), "t_start",
                           pc.fill_null(coll.column("t_start"), -1))
    df = coll.select(["rank", "comm", "comm_rank", "comm_size", "seq", "op", "bytes", "peer",
                      "phase", "t", "t_start"]).to_pandas()
    enter = df[df["phase"] == "enter"].drop(columns=["phase", "t_start"])
    end = df[df["phase"] == "end"][["rank", "comm", "seq", "t", "t_start"]]
    ops = enter.merge(end, on=["rank", "comm", "seq"], suffixes=("", "_end"))
    return ops.sort_values(["rank", "comm", "seq"]).reset_index(drop=True)


def write(meta: JobMeta, coll: pa.Table, out: str | Path, *, verbose: bool = True,
          layout: str = "markers", drop: Mapping[int, float] | None = None,
          seed: int = 0, world_barrier: bool = False) -> Path:
    """Write the completed operations of ``coll`` under ``out``; returns ``out``.
    ``world_barrier``: each rank's file starts with one 4-byte AllReduce on a communicator
    of every rank (as a job's default process group would do), which names global ranks."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    ops = completed_ops(coll)
    p2p = ops["op"].isin(["send", "recv"]).to_numpy()
    ops["func"] = ops["op"].map(FUNC)
    ops["sn"] = 0
    ops.loc[~p2p, "sn"] = ops[~p2p].groupby(["rank", "comm", "op"]).cumcount()
    ops.loc[p2p, "sn"] = ops[p2p].groupby(["rank", "comm"]).cumcount() + 1
    rng = np.random.default_rng(seed)
    dropped = np.zeros(len(ops), dtype=bool)
    for rank, frac in (drop or {}).items():  # one burst per communicator of the rank
        for idx in ops.index[ops["rank"] == rank].to_series().groupby(ops["comm"]):
            rows = idx[1].to_numpy()
            n = int(round(len(rows) * frac))
            if n:
                first = int(rng.integers(0, len(rows) - n + 1))
                dropped[rows[first:first + n]] = True
    ops["dropped"] = dropped
    hosts_of = {c.comm: len({meta.nodes.get(r, "") for r in c.ranks}) for c in meta.comms}
    dump_us = int(ops["t_end"].max()) // 1000 if len(ops) else 0
    for rank, mine in ops.groupby("rank"):
        host, pid = meta.nodes.get(int(rank), "node"), 10_000 + int(rank)
        metadata = {"inspector_output_format_version": "v4.3" if layout == "markers" else "v4.0",
                    "dump_timestamp_us": dump_us, "hostname": host, "pid": pid}
        lines: list[str] = []
        if world_barrier:
            lines += _barrier(int(rank), meta, metadata, int(mine["t"].min()), verbose, layout)
        for comm, group in mine.groupby("comm"):
            header = {"id": f"0x{int(comm):016x}", "rank": int(group["comm_rank"].iloc[0]),
                      "n_ranks": int(group["comm_size"].iloc[0]),
                      "nnodes": hosts_of.get(int(comm), 1)}
            kept = group[~group["dropped"]]
            if layout == "markers":
                lines.append(json.dumps({"header": header, "metadata": metadata, "dump_stats": {
                    "coll_records": len(kept),
                    "coll_dropped_records": int(group["dropped"].sum())}}))
            for op in kept.itertuples():
                lines.append(json.dumps(_record(op, header, metadata, verbose, layout),
                                        separators=(",", ":")))
        (root / f"{host}-pid{pid}.log").write_text("".join(x + "\n" for x in lines))
    return root


def _barrier(rank: int, meta: JobMeta, metadata: Mapping[str, Any], t_ns: int, verbose: bool,
             layout: str) -> list[str]:
    header = {"id": "0x00000000000000ff", "rank": rank, "n_ranks": meta.world_size,
              "nnodes": len(set(meta.nodes.values()))}
    op = pd.Series({"func": "AllReduce", "t": t_ns - 2000, "t_end": t_ns - 1000,
                    "t_start": t_ns - 1500, "bytes": 4, "sn": 0, "peer": -1})
    out = [] if layout != "markers" else [json.dumps({
        "header": header, "metadata": metadata,
        "dump_stats": {"coll_records": 1, "coll_dropped_records": 0}})]
    return out + [json.dumps(_record(op, header, metadata, verbose, layout))]


def _record(op: Any, header: Mapping[str, Any], metadata: Mapping[str, Any], verbose: bool,
            layout: str) -> dict[str, object]:
    func: str = op.func
    pre = "p2p" if func in ("Send", "Recv") else "coll"
    enter_us = int(op.t) // 1000
    end_us = int(op.t_end) // 1000
    t_start = int(op.t_start)
    start_us = t_start // 1000 if t_start >= 0 else enter_us
    size = int(op.bytes)
    # the kernel is launched at the call and waits for its peers inside: exec time runs
    # from the call (kernel_start_ts keeps the transfer start, so t_start round-trips)
    exec_us = max(end_us - enter_us, 1)
    algbw = size / exec_us / 1e3
    payload: dict[str, object] = {pre: func, f"{pre}_sn": int(op.sn)}
    if pre == "p2p":
        payload["p2p_peer"] = int(op.peer)
    n = int(header["n_ranks"])
    payload.update({f"{pre}_msg_size_bytes": size, f"{pre}_exec_time_us": exec_us,
                    f"{pre}_timing_source": "kernel_gpu",
                    f"{pre}_algobw_gbs": round(algbw, 6),
                    f"{pre}_busbw_gbs": round(algbw * _BUS.get(func, lambda n: 1.0)(n), 6)})
    if verbose:
        payload["event_trace_ts"] = {
            f"{pre}_start_ts": enter_us,
            "kernel_events": [{"channel_id": 0, "kernel_start_ts": start_us,
                               "kernel_stop_ts": end_us, "kernel_record_ts": end_us}]}
    record: dict[str, object] = {f"{pre}_perf": payload}
    if layout != "markers":
        record = {"header": header, "metadata": metadata, **record}
    return record
