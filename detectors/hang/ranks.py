"""Per-rank clocks of the hang detector: last record, longest gap between a rank's own
records (MEGATRACE's heartbeat timeout: a rank silent while a peer waits on it), delivery lag
(the rank's *horizon*: records that come late are not taken for a rank that stopped), and the
ring of its recent operations that places a halt point in the pipeline schedule (MEGATRACE
§III-C step 3)."""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.detectors.hang.config import NO_TIME, HangConfig
from failslow.detectors.hang.state import _pack_z, _unpack, _unpack_z
from failslow.detectors.hang.tables import _rank_time_order

#: Columns of the per-rank ring of recent operations (halt-point placement in the schedule).
_RING = ("comm", "seq", "op", "t", "pidx", "peer", "bytes")


class RankClock:
    """Arrays indexed by global rank, grown as ranks appear."""

    def __init__(self, config: HangConfig) -> None:
        self.config = config
        self.last = np.full(0, NO_TIME, dtype=np.int64)
        self.gap = np.zeros(0, dtype=np.int64)
        self.ngap = np.zeros(0, dtype=np.int64)
        self.lag = np.zeros(0, dtype=np.int64)
        self.new = np.full(0, NO_TIME, dtype=np.int64)   # newest record of this batch
        self.ring = np.zeros((0, config.recent_ops, len(_RING)), dtype=np.int64)
        self.ring_n = np.zeros(0, dtype=np.int64)
        self.first_t = NO_TIME

    def grow(self, max_rank: int) -> None:
        n = max_rank + 1 - len(self.last)
        if n > 0:
            self.last = np.concatenate([self.last, np.full(n, NO_TIME, np.int64)])
            self.gap = np.concatenate([self.gap, np.zeros(n, np.int64)])
            self.ngap = np.concatenate([self.ngap, np.zeros(n, np.int64)])
            self.lag = np.concatenate([self.lag, np.zeros(n, np.int64)])
            self.new = np.concatenate([self.new, np.full(n, NO_TIME, np.int64)])
            self.ring = np.concatenate([self.ring, np.zeros(
                (n, self.config.recent_ops, len(_RING)), np.int64)])
            self.ring_n = np.concatenate([self.ring_n, np.zeros(n, np.int64)])

    def observe(self, rank: np.ndarray, t: np.ndarray) -> None:
        """Last record time and longest gap between a rank's own records (silence baseline)."""
        self.grow(int(rank.max()))
        order = _rank_time_order(rank, t)
        r, ts = rank[order], t[order]
        prev = np.empty_like(ts)
        prev[1:] = ts[:-1]
        first = np.ones(len(r), dtype=bool)
        first[1:] = r[1:] != r[:-1]
        prev[first] = self.last[r[first]]
        ok = prev != NO_TIME
        # per rank (contiguous groups): the longest gap and the number of gaps
        heads = np.flatnonzero(first)
        uniq = r[heads]
        gap = np.maximum.reduceat(np.where(ok, ts - prev, NO_TIME), heads)
        self.gap[uniq] = np.maximum(self.gap[uniq], gap)
        self.ngap[uniq] += np.add.reduceat(ok.astype(np.int64), heads)
        last = np.ones(len(r), dtype=bool)
        last[:-1] = r[1:] != r[:-1]
        self.last[r[last]] = np.maximum(self.last[r[last]], ts[last])
        self.new[r[last]] = np.maximum(self.new[r[last]], ts[last])
        t_min = int(ts.min())
        self.first_t = t_min if self.first_t == NO_TIME else min(self.first_t, t_min)

    def delivered(self, rank: np.ndarray, t: np.ndarray) -> None:
        """Delivery evidence (lag) of records that are not operations (``progress``)."""
        self.grow(int(rank.max()))
        np.maximum.at(self.new, rank, t)

    def note_lag(self, front: int) -> None:
        """Delivery lag samples of the ranks whose records came in this batch: how far their
        newest record trails ``front``, the newest record of the job (or the last tick)."""
        new = self.new
        got = np.flatnonzero(new != NO_TIME)
        if not len(got):
            return
        sample = np.maximum(front - new[got], 0)
        decayed = (self.lag[got] * self.config.lag_decay).astype(np.int64)
        self.lag[got] = np.maximum(sample, decayed)
        new[got] = NO_TIME

    def horizon(self, now_ns: int) -> np.ndarray:
        """Per rank: the time up to which its records are taken as complete at ``now_ns``
        (``now`` less its delivery lag)."""
        lag = self.lag
        return int(now_ns) - np.where(lag >= self.config.lag_min_ns, lag, 0)

    def silence_thresholds(self) -> np.ndarray:
        """Per rank: how long it may emit nothing while a peer waits on it (``silence_n``
        times its longest usual gap, once learned)."""
        cfg = self.config
        floor = max(cfg.silence_floor_ns, cfg.idle_floor_ns)
        thr = np.clip(cfg.silence_n * self.gap.astype(np.float64), floor,
                      cfg.ceiling_ns).astype(np.int64)
        return np.where(self.ngap >= cfg.silence_min_gaps, thr, cfg.ceiling_ns)

    def remember(self, new: dict[str, np.ndarray]) -> None:
        """Append entered operations to their rank's ring of recent operations (in order of
        time; the last ``recent_ops`` of a rank are kept)."""
        rank = new["rank"]
        width = self.config.recent_ops
        if not len(rank) or width <= 0:
            return
        order = _rank_time_order(rank, new["t"], new["seq"])
        r = rank[order]
        start = np.ones(len(r), dtype=bool)
        start[1:] = r[1:] != r[:-1]
        heads = np.flatnonzero(start)
        counts = np.diff(np.append(heads, len(r)))
        uniq = r[heads]
        pos = np.arange(len(r)) - np.repeat(heads, counts)
        keep = pos >= np.repeat(counts, counts) - width
        if not keep.all():
            order, r, pos = order[keep], r[keep], pos[keep]
        slot = (self.ring_n[r] + pos) % width
        vals = np.empty((len(_RING), len(order)), dtype=np.int64)
        for j, c in enumerate(_RING):
            np.take(new[c], order, out=vals[j])     # contiguous rows, written as columns
        self.ring[r, slot] = vals.T
        self.ring_n[uniq] += counts

    def recent_ops(self, rank: int) -> dict[str, np.ndarray]:
        """The rank's last entered operations (at most ``recent_ops``), in time order:
        communicator index, seq, op code, enter time, point-to-point index, peer, bytes."""
        if rank >= len(self.ring_n):
            return {c: np.zeros(0, np.int64) for c in _RING}
        width = self.config.recent_ops
        n = int(min(self.ring_n[rank], width))
        idx = (int(self.ring_n[rank]) - n + np.arange(n)) % width
        block = self.ring[rank, idx]
        block = block[np.lexsort((block[:, 1], block[:, 3]))]
        return {c: block[:, j] for j, c in enumerate(_RING)}

    def to_state(self) -> dict[str, Any]:
        return {"last": self.last.copy(), "gap": self.gap.copy(),
                "ngap": self.ngap.copy(), "lag": self.lag.copy(),
                "ring_z": _pack_z(self.ring), "ring_n": self.ring_n.copy()}

    def load(self, rk: dict[str, Any]) -> None:
        self.last = np.asarray(rk["last"], dtype=np.int64)
        self.gap = np.asarray(rk["gap"], dtype=np.int64)
        self.ngap = np.asarray(rk["ngap"], dtype=np.int64)
        self.lag = np.asarray(rk["lag"], dtype=np.int64)
        self.new = np.full(len(self.last), NO_TIME, dtype=np.int64)
        shape = (len(self.last), self.config.recent_ops, len(_RING))
        ring = (_unpack_z(rk["ring_z"], int(np.prod(shape))) if "ring_z" in rk
                else _unpack(rk["ring"]))  # snapshots before compression
        self.ring = ring.reshape(shape)
        self.ring_n = np.asarray(rk["ring_n"], dtype=np.int64)
