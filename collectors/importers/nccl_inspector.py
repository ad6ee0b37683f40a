"""Import the output of NVIDIA's NCCL Inspector profiler plugin into the failslow event contract.

The Inspector (NCCL repository, ``plugins/profiler/inspector``) is an NCCL profiler plugin that
writes, per process, a JSON Lines file ``<hostname>-pid<pid>.log`` (the plugin's exporter also
reads ``.jsonl`` and gzip-compressed files) with one object per completed operation of every
communicator the process belongs to. Two layouts exist:

- per-record (format versions up to v4.2): every line carries ``header`` (``id``: the
  communicator hash as hex text, ``comm_name`` from v4.2, ``rank``: the process's rank *in that
  communicator*, ``n_ranks``: the communicator size, ``nnodes``), ``metadata``
  (``inspector_output_format_version``, ``dump_timestamp_us``, ``hostname``, ``pid``) and one
  payload, ``coll_perf`` or ``p2p_perf``;
- v4.3 (NVIDIA/nccl pull requests #2359 and #2304, newer than the released source): a
  ``dump_stats`` marker line carries ``header`` / ``metadata`` once per communicator and dump,
  followed by that communicator's payload lines (``coll_perf``, ``p2p_perf``, and proxy
  records, which are ignored). Its drop counters (any integer key containing ``dropped``) say
  how many completed records the plugin's ring buffer overwrote before they were written
  (data loss, not an error).

``coll_perf``: ``coll`` (``AllReduce``, ``AllGather``, ``ReduceScatter``, ``Broadcast``,
``Reduce``, ``All2All``, ``AllGatherV``), ``coll_sn`` (NCCL's per-communicator, per-function
sequence number: the same on every member for one round), ``coll_msg_size_bytes`` (count x
datatype size), ``coll_exec_time_us``, ``coll_timing_source``, ``coll_algobw_gbs``,
``coll_busbw_gbs``. ``p2p_perf`` likewise with ``p2p`` (``Send`` / ``Recv``), ``p2p_sn`` (the
plugin's per-communicator point-to-point counter, from 1) and ``p2p_peer`` (communicator rank).
With ``NCCL_INSPECTOR_DUMP_VERBOSE=1`` a payload also has ``event_trace_ts``: host
``gettimeofday`` microseconds of the operation's start (``coll_start_ts`` / ``p2p_start_ts``)
and per channel ``kernel_start_ts`` / ``kernel_stop_ts`` / ``kernel_record_ts``.

Mapping (events.md):

- Processes are told apart by ``(hostname, pid)``. Global rank: a process's rank in a
  communicator whose size is the largest seen and spans every process (the world
  communicator); without one, ranks are given in ``(hostname, pid)`` order (a warning says so).
  ``world_size`` = that largest ``n_ranks`` (or the process count); ranks of the world
  communicator without a file are ``unobserved_ranks``. ``nodes`` = hostnames.
- ``comm`` = the header id read as a uint64 (it is NCCL's 64-bit communicator hash; other text
  is hashed). Point-to-point operations go on a companion communicator (a hash of the id and
  ``p2p``) with the same members, because their counter differs from the collectives'.
  ``comm_rank`` / ``comm_size`` = ``header.rank`` / ``header.n_ranks``.
- ``seq`` for collectives: the rounds (function, ``coll_sn``) of a communicator seen on any
  member, in call order, numbered from 0. Call order comes from the start times, each member's
  clock aligned to one reference member by the median offset over the rounds they share, so a
  round one member lost keeps its number on the others. Operations below the plugin's size
  threshold are never recorded and are not counted. ``seq`` for point-to-point operations:
  ``p2p_sn - 1``.
- ``op``: lower-case names; ``All2All`` -> ``alltoall``, ``AllGatherV`` -> ``allgather``
  (counted). ``bytes`` = the message size. ``peer`` = ``p2p_peer`` for send/recv; the root of
  broadcast/reduce is not recorded (-1).
- Times (verbose records only): ``enter`` ``t`` = the start timestamp, ``end`` ``t`` = the
  last channel's stop (or record) timestamp, ``t_start`` = the first channel's start, all
  microseconds x 1000. Extra columns: ``inspector_sn``, ``exec_us``, ``busbw_gbs``,
  ``timing_source``.
- A record without timestamps (not verbose, or no kernel events) cannot be placed in time and
  gets no ``coll`` rows: it is counted, and ``import.json`` says what is missing, which
  detectors cannot run, and keeps per-rank execution-time and bandwidth statistics.
- meta: degrees from the communicator names (tp/pp/dp/cp) when they multiply to the world
  size, else tp = pp = cp = 1, dp = world; schedule ``unknown``; micro-batches 0; ``comms``:
  every communicator whose members all have files.

The files are read by :mod:`failslow.collectors.importers.nccl_inspector_reader`; this module
converts what it read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from failslow import events
from failslow.collectors.importers import ImportResult, sanitize_job, stable_id
from failslow.collectors.importers.nccl_inspector_reader import (  # all re-exported
    SUFFIXES,  # noqa: F401
    _Context,  # noqa: F401
    _Reader,
    find_files,
)
from failslow.events import Comm, ContractError, JobMeta

log = logging.getLogger(__name__)

SOURCE = "nccl-inspector"
#: Inspector function name -> contract op.
OP_BY_FUNC: dict[str, str] = {
    "AllReduce": "allreduce", "AllGather": "allgather", "AllGatherV": "allgather",
    "ReduceScatter": "reducescatter", "Broadcast": "broadcast", "Reduce": "reduce",
    "All2All": "alltoall", "AlltoAll": "alltoall", "Send": "send", "Recv": "recv",
}
APPROXIMATED = frozenset({"AllGatherV"})
#: Communicator name words -> kind (``comm_name``, format v4.2 and later).
_KIND_WORDS = (("tp", ("tp", "tensor")), ("pp", ("pp", "pipeline")), ("cp", ("cp", "context")),
               ("ep", ("ep", "expert")), ("dp", ("dp", "data")))
_HEX_ID = re.compile(r"^(0x)?[0-9a-fA-F]{1,16}$")

UNTIMED_MISSING = (
    "no timestamps (event_trace_ts needs NCCL_INSPECTOR_DUMP_VERBOSE=1, and kernel events): "
    "these operations cannot be placed in time, so they have no coll rows")
HELD_OUT = "held out: its process dropped records"
UNTIMED_DETECTORS = (
    "hang and slow-down detection need enter/end times; iteration and change-point tracking "
    "need operation times; only per-rank exec-time and bandwidth statistics (rank_stats) are "
    "available for them")


# ---------------------------------------------------------------------------------------------
# conversion


def _comm_u64(comm_id: str) -> int:
    return int(comm_id, 16) if _HEX_ID.match(comm_id) else stable_id(SOURCE, comm_id)


def _kind_of(name: str) -> str | None:
    words = set(re.split(r"[^a-z]+", name.lower()))
    for kind, keys in _KIND_WORDS:
        if words & set(keys):
            return kind
    return None


def _global_ranks(rd: _Reader, result: ImportResult) -> tuple[dict[int, int], int, str]:
    """proc -> global rank, world size, and how the ranks were found."""
    n_procs = len(rd.procs)
    biggest = max(rd.sizes.values(), default=0)
    names = {v: k for k, v in rd.comm_ids.items()}
    candidates = sorted((c for c, s in rd.sizes.items() if s == biggest and s >= n_procs),
                        key=lambda c: (-len(rd.members[c]), names[c]))
    if candidates:
        world_comm = candidates[0]
        rank_of = {p: r for r, p in rd.members[world_comm].items()}
        for other in candidates[1:]:
            if len(rd.members[other]) == biggest and any(
                    rank_of.get(p) != r for r, p in rd.members[other].items()):
                result.warn("communicators spanning all ranks number the processes "
                            f"differently; ranks taken from {names[world_comm]}")
        extra = sorted((hp for hp, p in rd.procs.items() if p not in rank_of))
        for i, hp in enumerate(extra):
            rank_of[rd.procs[hp]] = biggest + i
        if extra:
            result.warn(f"{len(extra)} processes are not members of the world communicator "
                        f"{names[world_comm]}: given ranks from {biggest}", len(extra))
        how = (f"global rank = the process's rank in communicator {names[world_comm]}, which "
               f"spans all {biggest} ranks")
        return rank_of, biggest + len(extra), how
    ordered = sorted(rd.procs)
    result.warn("no communicator spans every process: global ranks given in (hostname, pid) "
                "order; comm_rank stays exact")
    return ({rd.procs[hp]: i for i, hp in enumerate(ordered)}, n_procs,
            "no communicator spans every process: global ranks in (hostname, pid) order")


def _degrees(kinds: Mapping[int, str | None], sizes: Mapping[int, int], world: int,
             ) -> tuple[tuple[int, int, int, int], str]:
    found: dict[str, set[int]] = {}
    for c, kind in kinds.items():
        if kind in ("tp", "pp", "cp", "dp"):
            found.setdefault(kind, set()).add(sizes[c])
    if found and all(len(v) == 1 for v in found.values()):
        tp, pp, cp = (next(iter(found.get(k, {1}))) for k in ("tp", "pp", "cp"))
        if world % (tp * pp * cp) == 0:
            dp = world // (tp * pp * cp)
            if found.get("dp", {dp}) == {dp}:
                return (tp, pp, dp, cp), "from the communicator names (comm_name)"
    return (1, 1, world, 1), "unknown: tp = pp = cp = 1, dp = world size"


def _collective_seq(df: pd.DataFrame, result: ImportResult) -> np.ndarray:
    """Per communicator, 0.. over its rounds (func, sn) in call order on clock-aligned starts."""
    if df.empty:
        return np.zeros(0, dtype=np.uint64)
    d = df[["comm", "proc", "func", "sn"]].copy()
    d["t"] = (df["t_enter"] - df["t_enter"].min()).astype(np.float64)
    d["i"] = np.arange(len(d))
    count = d.groupby(["comm", "proc"]).size().rename("n").reset_index()
    ref = (count.sort_values(["comm", "n", "proc"], ascending=[True, False, True])
           .drop_duplicates("comm")[["comm", "proc"]].rename(columns={"proc": "ref"}))
    ref_rows = (d.merge(ref, left_on=["comm", "proc"], right_on=["comm", "ref"])
                [["comm", "func", "sn", "t"]].rename(columns={"t": "t_ref"}))
    shared = d.merge(ref_rows, on=["comm", "func", "sn"])
    offset = ((shared["t"] - shared["t_ref"]).groupby([shared["comm"], shared["proc"]])
              .median().rename("offset").reset_index())
    d = d.merge(offset, on=["comm", "proc"], how="left").sort_values("i")
    d["adj"] = d["t"] - d["offset"].fillna(0.0)
    rounds = d.groupby(["comm", "func", "sn"], sort=False)["adj"].median().rename("rt")
    rounds = rounds.reset_index().sort_values(["comm", "rt", "func", "sn"])
    rounds["seq"] = rounds.groupby("comm").cumcount()
    d = d.merge(rounds[["comm", "func", "sn", "seq"]], on=["comm", "func", "sn"]).sort_values("i")
    seq = d["seq"].to_numpy(dtype=np.int64)
    own = d.sort_values(["comm", "proc", "t", "seq"])
    same = (own["comm"].to_numpy()[1:] == own["comm"].to_numpy()[:-1]) & \
           (own["proc"].to_numpy()[1:] == own["proc"].to_numpy()[:-1])
    back = int((same & (np.diff(own["seq"].to_numpy()) < 0)).sum())
    result.warn("collectives whose call order on a member disagrees with the merged round "
                "order (start times closer than the clock alignment)", back)
    return seq.astype(np.uint64)


def _hold_out_lossy(rd: _Reader, df: pd.DataFrame, result: ImportResult) -> pd.DataFrame:
    """Operations of processes whose records the plugin dropped get no ``coll`` rows: their
    gaps would read as rounds they never entered (a false straggler or hang) and stall the
    job's iteration boundaries. They count as ranks without data (the engine's
    ``unknown_ranks``: never named a root cause) and keep their ``rank_stats``."""
    lossy = {p for p, _, _ in (*rd.marker_drops, *rd.header_drops)}
    if not lossy:
        return df
    held = df["proc"].isin(lossy)
    df = df.copy()
    df.loc[held & (df["reason"] == ""), "reason"] = HELD_OUT
    return df


def convert(rd: _Reader, job: str, result: ImportResult) -> ImportResult:
    """Turn parsed records into the contract tables, meta and ``import.json`` info."""
    if not rd.cols["proc"]:
        raise ContractError("no operation records (coll_perf / p2p_perf) in the input",
                            source=str(result.info.get("input", "")))
    df = pd.DataFrame(rd.cols)
    dup = df.duplicated(subset=["proc", "comm", "p2p", "func", "sn"])
    result.warn("duplicate records (same process, communicator, function and sequence "
                "number) skipped", int(dup.sum()))
    df = df[~dup].reset_index(drop=True)
    df = _hold_out_lossy(rd, df, result)
    rank_of, world, how = _global_ranks(rd, result)
    df["rank"] = df["proc"].map(rank_of).astype(np.int32)
    df["op"] = df["func"].map(OP_BY_FUNC)
    for func, n in df.loc[df["op"].isna(), "func"].value_counts().items():
        result.warn(f"unknown Inspector function {func!r}: no coll rows", int(n))
    for func in APPROXIMATED:
        result.warn(f"{func} imported as allgather (per-rank counts may differ)",
                    int((df["func"] == func).sum()))
    known = df["op"].notna()
    timed = known & (df["reason"] == "")
    for reason, n in df.loc[known & ~timed, "reason"].value_counts().items():
        if reason != HELD_OUT:
            result.warn(f"operations without timestamps, no coll rows: {reason}", int(n))

    names = {v: k for k, v in rd.comm_ids.items()}
    u64 = np.array([_comm_u64(names[c]) for c in range(len(names))], dtype=np.uint64)
    p2p_u64 = np.array([stable_id(SOURCE, names[c], "p2p") for c in range(len(names))],
                       dtype=np.uint64)
    t = df[timed].reset_index(drop=True)
    coll_part = t[~t["p2p"]].reset_index(drop=True)
    p2p_part = t[t["p2p"]].reset_index(drop=True)
    coll_part["seq"] = _collective_seq(coll_part, result)
    zero_based = bool((p2p_part["sn"] == 0).any())
    result.warn("p2p_sn of 0 seen: p2p sequence numbers used as they are", int(zero_based))
    p2p_part["seq"] = (p2p_part["sn"] - (0 if zero_based else 1)).astype(np.uint64)
    t = pd.concat([coll_part, p2p_part], ignore_index=True)
    idx = t["comm"].to_numpy(np.int64)
    comm = np.where(t["p2p"].to_numpy(bool), p2p_u64[idx], u64[idx])
    backwards = int((t["t_end"] < t["t_enter"]).sum())
    result.warn("operations whose completion time precedes their start time", backwards)

    def both(values: Any) -> np.ndarray:
        arr = np.asarray(values)
        return np.concatenate([arr, arr])

    m = len(t)
    op_codes = t["op"].map(events.OP).to_numpy(np.int8)
    coll = events.from_columns({
        "job": job, "rank": both(t["rank"]).astype(np.int32), "comm": both(comm),
        "comm_rank": both(t["comm_rank"]).astype(np.int32),
        "comm_size": both(t["comm_size"]).astype(np.int32),
        "seq": both(t["seq"]).astype(np.uint64), "op": both(op_codes),
        "bytes": both(t["bytes"]).astype(np.uint64), "peer": both(t["peer"]).astype(np.int32),
        "phase": np.repeat(np.array([events.ENTER, events.END], dtype=np.int8), m),
        "t": np.concatenate([t["t_enter"].to_numpy(np.int64), t["t_end"].to_numpy(np.int64)]),
        "t_start": np.concatenate([np.full(m, events.NULL_TIME, dtype=np.int64),
                                   np.where(t["t_start"] >= 0, t["t_start"],
                                            events.NULL_TIME).astype(np.int64)]),
    }, "coll")
    busbw = both(t["busbw"]).astype(np.float64)
    coll = (coll.append_column("inspector_sn", pa.array(both(t["sn"]).astype(np.uint64)))
            .append_column("exec_us", pa.array(both(t["exec_us"]).astype(np.float64)))
            .append_column("busbw_gbs", pa.array(busbw, mask=np.isnan(busbw)))
            .append_column("timing_source", pa.array(both(t["timing"]).astype(str).tolist(),
                                                     type=pa.string())))

    # meta
    nodes = {rank_of[p]: host for (host, _), p in rd.procs.items()}
    kinds = {c: _kind_of(rd.comm_names.get(c, "")) or (
        "world" if rd.sizes[c] == world and len(rd.members[c]) == world else None)
        for c in rd.comm_ids.values()}
    (tp, pp, dp, cp), degrees_how = _degrees(kinds, rd.sizes, world)
    comms: list[Comm] = []
    incomplete = []
    used_p2p = set(p2p_part["comm"].tolist())
    for c in sorted(rd.comm_ids.values(), key=lambda c: names[c]):
        members = rd.members[c]
        if len(members) < rd.sizes[c]:
            incomplete.append(names[c])
            continue
        ranks = tuple(rank_of[members[r]] for r in range(rd.sizes[c]))
        kind = kinds[c] or "other"
        comms.append(Comm(int(u64[c]), kind, ranks))
        if c in used_p2p:
            comms.append(Comm(int(p2p_u64[c]), kind, ranks))
    t_meta = rd.latest_dump_us * 1000
    if not t_meta and m:
        t_meta = int(t["t_end"].max())
    result.meta = JobMeta(job=job, t=t_meta, world_size=world, tp=tp, pp=pp, dp=dp, cp=cp,
                          microbatches=0, schedule="unknown", nodes=nodes, comms=tuple(comms))
    result.tables = {"coll": coll}

    # data quality
    hosts = set(nodes.values())
    for c, n in rd.nnodes.items():
        if rd.sizes[c] == world and len(rd.members[c]) == world and n != len(hosts):
            result.warn(f"header nnodes {n} of the world communicator differs from the "
                        f"{len(hosts)} host names in the files")
            break
    lossy: dict[int, int] = {}
    for drops in (rd.marker_drops, rd.header_drops):
        for (proc, _, _), v in drops.items():
            lossy[rank_of[proc]] = lossy.get(rank_of[proc], 0) + v
    if lossy:
        listed = ", ".join(f"{r} ({n})" for r, n in sorted(lossy.items())[:20])
        result.warn(f"Inspector dropped records (ring buffer overwritten before a dump) on "
                    f"{len(lossy)} rank(s): {listed}; their operations are held out (no coll "
                    "rows; unknown to the detectors, never a root cause)", sum(lossy.values()))
    unobserved = sorted(set(range(world)) - set(rank_of.values()))
    if unobserved:
        result.warn(f"no Inspector output for {len(unobserved)} of {world} ranks: reported as "
                    "unknown", len(unobserved))
    result.info.update(_info(rd, df, timed, how, degrees_how, incomplete, lossy, unobserved,
                             rank_of))
    untimed = df[known & ~timed & (df["reason"] != HELD_OUT)]
    if len(untimed):
        from failslow.collectors.importers.nccl_inspector_stats import stragglers

        rings = {c: [rank_of[m[r]] for r in range(rd.sizes[c])]
                 for c, m in rd.members.items() if len(m) == rd.sizes[c]}
        peer = pd.Series([rank_of.get(rd.members[c].get(p, -1), -1) if p2p else -1
                          for c, p, p2p in zip(untimed["comm"], untimed["peer"],
                                               untimed["p2p"], strict=True)],
                         index=untimed.index)
        result.info["exec_time_stragglers"] = stragglers(untimed, rd.sizes, rings, nodes, peer)
    return result


def _info(rd: _Reader, df: pd.DataFrame, timed: pd.Series, how: str, degrees_how: str,
          incomplete: list[str], lossy: dict[int, int], unobserved: list[int],
          rank_of: dict[int, int]) -> dict[str, Any]:
    stats: dict[str, dict[str, Any]] = {}
    for rank, g in df.assign(timed=timed).groupby("rank"):
        busbw = g["busbw"].dropna()
        stats[str(rank)] = {
            "records": len(g), "placed_in_time": int(g["timed"].sum()),
            "exec_us_p50": round(float(g["exec_us"].median()), 3),
            "exec_us_max": round(float(g["exec_us"].max()), 3),
            "busbw_gbs_p50": round(float(busbw.median()), 3) if len(busbw) else None,
        }
    held = df["reason"] == HELD_OUT
    untimed = int((~timed & ~held).sum())
    info: dict[str, Any] = {
        "source": SOURCE,
        "format_versions": sorted(rd.versions),
        "layouts": sorted(rd.layouts),
        "files": {Path(f).name: n for f, n in sorted(rd.files.items())},
        "processes": {str(rank_of[p]): f"{h}/pid {pid}" for (h, pid), p in sorted(
            rd.procs.items(), key=lambda kv: rank_of[kv[1]])},
        "rank_assignment": how,
        "degrees": degrees_how,
        "comms_incomplete": incomplete,
        "operations": {"records": len(df), "placed_in_time": int(timed.sum()),
                       "held_out": int(held.sum()),
                       "not_placed": untimed},
        "lossy_ranks": {str(r): n for r, n in sorted(lossy.items())},
        "lossy_held_out": {
            "operations": int(held.sum()),
            "ranks": sorted({int(r) for r in df.loc[held, "rank"]}),
            "why": "a rank with dropped records gets no coll rows: its gaps would read as "
                   "rounds it never entered; the engine reports it among unknown_ranks, never "
                   "as a root cause (rank_stats keep its exec times)"},
        "unobserved_ranks": unobserved,
        "seq_mapping": "collectives: rounds (function, coll_sn) of a communicator in call order "
                       "over clock-aligned start times, from 0; p2p: p2p_sn - 1 on a companion "
                       "communicator hash(id, 'p2p'); operations below the plugin's size "
                       "threshold are never recorded and not counted",
        "time_mapping": "enter = coll/p2p start timestamp (host, when NCCL started the "
                        "operation); end = last kernel channel stop; t_start = first kernel "
                        "channel start; microseconds x 1000",
        "lossy_counts": "dump_stats counters summed over markers (drops since the previous "
                        "dump); counters repeated in per-record headers taken at their maximum",
        "rank_stats": stats,
    }
    if untimed:
        info["untimed"] = {"operations": untimed, "missing": UNTIMED_MISSING,
                           "detectors_unavailable": UNTIMED_DETECTORS}
    return info


def _placeholder(job: str) -> JobMeta:
    return JobMeta(job=job, t=0, world_size=1, tp=1, pp=1, dp=1, cp=1, microbatches=0,
                   schedule="unknown", nodes={}, comms=())


def import_dir(path: str | Path, job: str | None = None) -> ImportResult:
    """Read every Inspector output file under ``path`` and convert them (module docstring).

    ``job`` defaults to the folder name (the plugin's default is ``nccl-inspector-<jobid>``).
    Malformed input raises :class:`ContractError` naming the file and line.
    """
    root = Path(path)
    name = root.name if root.is_dir() else root.parent.name
    job = job or sanitize_job(name, "nccl-inspector")
    result = ImportResult(meta=_placeholder(job), tables={}, info={"input": str(root)})
    reader = _Reader(result)
    for file in find_files(root):
        reader.read(file)
    convert(reader, job, result)
    result.log_warnings(log)
    return result
