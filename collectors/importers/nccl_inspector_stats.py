"""Stragglers from NCCL Inspector records without timestamps (not verbose).

A record without ``event_trace_ts`` cannot be placed in time, but its execution time still
speaks (NCCL launches a collective's kernel at the call and the kernel waits inside for its
peers):

- **compute**: in a collective round (communicator, function, ``coll_sn``) every member
  present, the member that arrived last has the shortest execution time, and the others
  waited ``exec - min(exec)`` for it. Per rank, the wait it caused per round, in
  ``BLOCKS`` blocks of the run (a round's place in its communicator's sequence); its worst
  block less its median block (a rank always a little late is an imbalance, not a
  fail-slow); a rank whose excess stands out from its peers (above the median by ``K_MAD``
  robust deviations and at least ``MIN_SHARE`` of the largest) is named;
- **link**: the shortest execution time of a round (the last arrival's, about the transfer
  alone) over a sliding window of rounds, against the same figure of the sibling
  communicators (same size, function and message size): a communicator whose window stays
  ``link_ratio`` times slower crosses a slow link. The link is named by the node pair that
  every such communicator's ring crosses (ring edges between consecutive communicator
  ranks on different hosts), as two ranks: the first crossing edge of the flagged
  communicator with the smallest rank. Point-to-point: the k-th send from a to b is matched
  with the k-th receive on b from a, the shorter of the two is the transfer; the pairs
  whose window stays ``link_ratio`` times slower than the other pairs of the same size
  cross the slow link, named by the node pair most of them cross and its lowest-rank pair.

Sequence order (``coll_sn`` / ``p2p_sn``) stands in for time: the windows are in rounds.
The result is evidence in ``import.json`` (``exec_time_stragglers``), not a diagnosis with
times.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

K_MAD = 6.0
MIN_SHARE = 0.3
LINK_RATIO = 1.5
WINDOW = 8
BLOCKS = 20
SUSTAIN = 3
#: a named rank delays its rounds by at least this many typical transfer times
FLOOR = 0.5


def _robust_outliers(score: pd.Series) -> list[int]:
    if score.empty or float(score.max()) <= 0:
        return []
    med = float(score.median())
    mad = float((score - med).abs().median()) or 1e-9
    top = float(score.max())
    hit = score[(score > med + K_MAD * 1.4826 * mad) & (score >= MIN_SHARE * top)]
    return sorted(int(r) for r in hit.index)


def compute_suspects(ops: pd.DataFrame, sizes: Mapping[int, int]) -> dict[str, Any]:
    """``ops``: collective records (rank, comm, func, sn, exec_us)."""
    size = ops["comm"].map(sizes)
    n = ops.groupby(["comm", "func", "sn"])["rank"].transform("size")
    full = ops[(n == size) & (size > 1)].copy()
    # each rank against its closest peers: the rounds of its smallest communicators (TP before
    # DP), where a whole replica being late (longer sequences) does not single a rank out
    full["size"] = full["comm"].map(sizes)
    smallest = full.groupby("comm")["rank"].unique().explode().reset_index()
    smallest["size"] = smallest["comm"].map(sizes)
    per_rank_min = smallest.groupby("rank")["size"].min()
    comm_ok = smallest.assign(ok=smallest["size"] == smallest["rank"].map(per_rank_min))
    comm_ok = comm_ok.groupby("comm")["ok"].all()
    full = full[full["comm"].map(comm_ok).fillna(False).astype(bool)]
    if full.empty:
        return {"ranks": [], "rounds": 0}
    g = full.groupby(["comm", "func", "sn"])["exec_us"]
    full["low"] = g.transform("min")
    full["waited"] = full["exec_us"] - full["low"]
    caused = full.groupby(["comm", "func", "sn"])["waited"].transform("median")
    last = full["exec_us"] == full["low"]  # the last arrival(s) of each round
    keys = [full["comm"], full["func"], full["sn"]]
    n_last = last.groupby(keys).transform("sum").clip(lower=1)
    contrib = caused.where(last, 0.0) / n_last
    # in time blocks (a round's place in its communicator's sequence): the excess of a
    # rank's worst block over its usual level, so that a rank that is always a little late
    # (a structural imbalance) is not a fail-slow
    pos = full.groupby(["comm", "func"])["sn"].rank(method="dense", pct=True)
    block = np.minimum((pos * BLOCKS).astype(int), BLOCKS - 1)
    per_block = contrib.groupby([full["rank"], block]).mean()
    level = per_block.groupby(level=0)
    # the SUSTAIN-th worst block: a fail-slow lasts, a GC pause spoils one block
    per_rank = level.apply(lambda v: float(np.sort(v.to_numpy())[-min(SUSTAIN, len(v))])) \
        - level.median()
    ranks = [r for r in _robust_outliers(per_rank)
             if per_rank[r] >= FLOOR * float(full["low"].median())]
    # a rank late only because it waited for a worse one in another small communicator
    # (a cascade) is not a root: drop it when a flagged peer caused more than twice its wait
    peers = full.groupby("rank")["comm"].unique()
    ranks = [r for r in ranks if not any(
        per_rank[o] > 2 * per_rank[r] and set(peers[o]) & set(full.loc[full["comm"].isin(
            peers[r]), "comm"]) for o in ranks if o != r)]
    return {"ranks": ranks, "rounds": int(full.groupby(["comm", "func", "sn"]).ngroups),
            "caused_wait_us_per_round": {str(r): round(float(per_rank[r]), 3) for r in ranks}}


def _window_peak(series: pd.Series) -> float:
    return float(series.rolling(WINDOW, min_periods=WINDOW).median().max()) \
        if len(series) >= WINDOW else float("nan")


def link_suspects(ops: pd.DataFrame, sizes: Mapping[int, int],
                  members: Mapping[int, list[int]], nodes: Mapping[int, str],
                  p2p: pd.DataFrame) -> dict[str, Any]:
    """``members``: comm -> global ranks in communicator-rank order."""
    flagged: list[int] = []
    size = ops["comm"].map(sizes)
    n = ops.groupby(["comm", "func", "sn"])["rank"].transform("size")
    full = ops[(n == size) & (size > 1)]
    if not full.empty:
        rounds = (full.groupby(["comm", "func", "sn", "bytes"])["exec_us"].min()
                  .reset_index().sort_values(["comm", "func", "sn"]))
        rounds["size"] = rounds["comm"].map(sizes)
        for _, sib in rounds.groupby(["size", "func", "bytes"]):
            if sib["comm"].nunique() < 2:
                continue
            base = float(sib["exec_us"].median())
            peaks = sib.groupby("comm")["exec_us"].apply(_window_peak)
            flagged += [int(c) for c, v in peaks.items() if v >= LINK_RATIO * base]
    out: dict[str, Any] = {"comms": sorted(set(flagged)), "link": None, "nodes": None}
    crossing: list[tuple[int, int]] = []
    for c in sorted(set(flagged), key=lambda c: min(members.get(c, [1 << 30]))):
        ring = members.get(c, [])
        crossing += [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))
                     if len(ring) > 1 and nodes.get(ring[i]) != nodes.get(ring[(i + 1) %
                                                                              len(ring)])]
    if crossing:
        pairs = [frozenset((nodes.get(a), nodes.get(b))) for a, b in crossing]
        common = max(set(pairs), key=pairs.count)
        a, b = next(e for e, p in zip(crossing, pairs, strict=True) if p == common)
        out["link"] = sorted((a, b))
        out["nodes"] = sorted(str(x) for x in common)
    pair = _p2p_pairs(p2p, nodes)
    if pair is not None:
        out["p2p_link"] = pair
        if out["link"] is None:
            out["link"] = pair
            out["nodes"] = sorted({nodes.get(pair[0], ""), nodes.get(pair[1], "")})
    return out


def _p2p_pairs(p2p: pd.DataFrame, nodes: Mapping[int, str]) -> list[int] | None:
    """``p2p``: rank, peer (global), func, sn, bytes, exec_us."""
    if p2p.empty:
        return None
    send = p2p[p2p["func"] == "Send"].sort_values(["rank", "peer", "sn"]).copy()
    recv = p2p[p2p["func"] == "Recv"].sort_values(["peer", "rank", "sn"]).copy()
    send["k"] = send.groupby(["rank", "peer"]).cumcount()
    recv["k"] = recv.groupby(["rank", "peer"]).cumcount()
    m = send.merge(recv, left_on=["rank", "peer", "k"], right_on=["peer", "rank", "k"],
                   suffixes=("", "_r"))
    if m.empty:
        return None
    m["xfer"] = np.minimum(m["exec_us"], m["exec_us_r"])
    slow: list[tuple[int, int]] = []
    for _, sib in m.groupby("bytes"):
        if sib.groupby(["rank", "peer"]).ngroups < 2:
            continue
        base = float(sib["xfer"].median())
        for (a, b), g in sib.groupby(["rank", "peer"]):
            if _window_peak(g["xfer"].reset_index(drop=True)) >= LINK_RATIO * base:
                slow.append((min(int(a), int(b)), max(int(a), int(b))))
    if not slow:
        return None
    # every pair across the slow link is slow: name the node pair most of them cross, by its
    # first pair (the lowest ranks)
    pairs = [frozenset((nodes.get(a), nodes.get(b))) for a, b in slow]
    common = max(set(pairs), key=pairs.count)
    return list(min(e for e, p in zip(slow, pairs, strict=True) if p == common))


def stragglers(df: pd.DataFrame, sizes: Mapping[int, int], members: Mapping[int, list[int]],
               nodes: Mapping[int, str], peer_rank: pd.Series) -> dict[str, Any]:
    """Both analyses over the untimed records of ``df`` (the importer's columns with
    ``rank``); ``peer_rank``: the global rank of each point-to-point record's peer."""
    coll = df[~df["p2p"]]
    p2p = df[df["p2p"]].assign(peer=peer_rank[df["p2p"]])
    link = link_suspects(coll, sizes, members, nodes, p2p)
    compute = compute_suspects(coll, sizes)
    # members of a communicator with a slow link arrive late at their next rounds because of
    # the link (a cascade): not compute stragglers
    behind_link = {r for c in link["comms"] for r in members.get(c, [])}
    compute["behind_slow_link"] = sorted(set(compute["ranks"]) & behind_link)
    compute["ranks"] = [r for r in compute["ranks"] if r not in behind_link]
    return {"method": "execution times of untimed records, sequence order for time "
                      "(nccl_inspector_stats)", "compute": compute, "link": link}
