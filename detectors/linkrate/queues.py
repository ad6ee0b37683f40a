"""VCCL's queue condition from ``link`` rows (events.md; MEGATRACE §III-B): per queue pair
(owner rank -> remote node) the time-averaged in-flight work requests (``posted -
completed``) per window. A slow link drains slower while its sender keeps posting, so the
queue of the hop over it grows; bandwidth alone misfires on idle queues."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.events import NULL_TIME


class QueueTracker:
    """Queue pairs keyed by (rank, peer node name); per sample pair the in-flight x time
    and completed work requests, accumulated into windows by the detector."""

    def __init__(self) -> None:
        self.index: dict[tuple[int, str], int] = {}
        self.last = np.zeros((0, 3), dtype=np.int64)  # t, posted, completed
        self.seen = False

    def update(self, link: pa.Table) -> dict[str, np.ndarray] | None:
        """Rows -> per consecutive sample pair: qp id, time, in-flight x dt, dt, completed."""
        if link.num_rows == 0:
            return None
        self.seen = True
        rank = pc.fill_null(link.column("rank"), -1).to_numpy().astype(np.int64)
        peer = pc.fill_null(link.column("peer_node"), "")
        ok = (rank >= 0) & pc.not_equal(peer, "").to_numpy(zero_copy_only=False)
        if not ok.any():
            return None
        enc = pc.dictionary_encode(peer).combine_chunks()
        words = enc.dictionary.to_pylist()
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        pairs = np.unique(np.stack([rank[ok], codes[ok]], axis=1), axis=0)
        lut: dict[tuple[int, int], int] = {}
        for r, c in pairs.tolist():  # one per queue pair
            k = (int(r), str(words[c]))
            q = self.index.get(k)
            if q is None:
                q = self.index[k] = len(self.index)
            lut[(int(r), int(c))] = q
        if len(self.index) > len(self.last):
            grow = np.full((len(self.index) - len(self.last), 3), NULL_TIME, dtype=np.int64)
            self.last = np.concatenate([self.last, grow])
        pk = rank[ok] * (len(words) + 1) + codes[ok]
        ukeys = np.array([r * (len(words) + 1) + c for r, c in lut], dtype=np.int64)
        uvals = np.array(list(lut.values()), dtype=np.int64)
        o = np.argsort(ukeys)
        qp = uvals[o][np.searchsorted(ukeys[o], pk)]
        t = link.column("t").to_numpy().astype(np.int64)[ok]
        posted = link.column("posted").to_numpy().astype(np.int64)[ok]
        done = link.column("completed").to_numpy().astype(np.int64)[ok]
        order = np.lexsort((t, qp))
        qp, vals = qp[order], np.stack([t, posted, done], axis=1)[order]
        first = np.ones(len(qp), dtype=bool)
        first[1:] = qp[1:] != qp[:-1]
        prev = np.empty_like(vals)
        prev[1:] = vals[:-1]
        prev[first] = self.last[qp[first]]
        lastrow = np.append(first[1:], True)
        self.last[qp[lastrow]] = vals[lastrow]
        good = (prev[:, 0] != NULL_TIME) & (vals[:, 0] > prev[:, 0])
        if not good.any():
            return None
        dt = (vals[good, 0] - prev[good, 0]).astype(np.float64)
        inflight = 0.5 * ((vals[good, 1] - vals[good, 2]) + (prev[good, 1] - prev[good, 2]))
        return {"qp": qp[good], "t": vals[good, 0], "lt": np.maximum(inflight, 0.0) * dt,
                "dt": dt, "dc": (vals[good, 2] - prev[good, 2]).astype(np.float64)}

    def qp_of(self, rank: int, node: str) -> int:
        return self.index.get((rank, node), -1)

    def snapshot(self) -> dict[str, Any]:
        return {"index": [[r, n, q] for (r, n), q in self.index.items()],
                "last": self.last.copy(), "seen": self.seen}

    def restore(self, state: dict[str, Any]) -> None:
        self.index = {(int(r), str(n)): int(q) for r, n, q in state["index"]}
        self.last = np.array(state["last"], dtype=np.int64).reshape(-1, 3)
        self.seen = bool(state["seen"])


class QueueWindows:
    """Per queue pair, what the link-rate windows saw (VCCL's queue condition): the
    baseline in-flight x time and time over its first ``baseline_windows`` sampled windows,
    and its last ``persist_windows`` windows (in a ring by window number)."""

    def __init__(self, baseline_windows: int, persist_windows: int) -> None:
        self.baseline_windows = baseline_windows
        self.persist_windows = persist_windows
        self.q: dict[str, np.ndarray] = {}
        self.grow(0)

    def __len__(self) -> int:
        return len(self.q["bn"])

    def grow(self, n: int) -> None:
        """Room for ``n`` queue pairs."""
        have = len(self.q.get("bn", ()))
        if n <= have and self.q:
            return
        m, k = n - have, self.persist_windows
        fresh = {"blt": np.zeros(m), "bdt": np.zeros(m), "bn": np.zeros(m, np.int64),
                 "rlt": np.zeros((m, k)), "rdt": np.zeros((m, k)),
                 "rw": np.full((m, k), -(1 << 40), np.int64)}
        self.q = fresh if not self.q else {key: np.concatenate([self.q[key], v])
                                           for key, v in fresh.items()}

    def account(self, w: int, pending: dict[str, np.ndarray], lo: int, hi: int) -> None:
        """The samples of ``pending`` in ``(lo, hi]`` as window ``w``."""
        sel = (pending["t"] > lo) & (pending["t"] <= hi)
        if not sel.any():
            return
        q, n = self.q, len(self)
        lt = np.bincount(pending["qp"][sel], pending["lt"][sel], n)
        dt = np.bincount(pending["qp"][sel], pending["dt"][sel], n)
        has = np.flatnonzero(dt > 0)
        slot = w % self.persist_windows
        q["rlt"][has, slot] = lt[has]
        q["rdt"][has, slot] = dt[has]
        q["rw"][has, slot] = w
        learn = has[q["bn"][has] < self.baseline_windows]
        q["blt"][learn] += lt[learn]
        q["bdt"][learn] += dt[learn]
        q["bn"][learn] += 1

    def growth(self, qps: list[int], w: int, onset: int, factor: float, floor: float
               ) -> tuple[float, bool] | None:
        """Over the windows of the last ``persist_windows`` from ``onset`` on, the
        time-averaged in-flight work requests of the queue pairs ``qps`` against their
        baseline: (largest growth, whether one grew by ``factor`` and ``floor``); None when
        none of them was sampled enough."""
        q = self.q
        best: tuple[float, bool] | None = None
        for k in qps:
            if k < 0 or k >= len(self) or q["bn"][k] < min(self.baseline_windows, 3):
                continue
            recent = (q["rw"][k] > w - self.persist_windows) & (q["rw"][k] >= onset)
            dt = float(q["rdt"][k][recent].sum())
            if dt <= 0:
                continue
            occ, base = float(q["rlt"][k][recent].sum()) / dt, float(q["blt"][k] / q["bdt"][k])
            g = (occ + 0.05) / (base + 0.05)
            grown = occ >= factor * base + floor
            if best is None or (grown, g) > (best[1], best[0]):
                best = (g, grown)
        return best

    def snapshot(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.q.items()}

    def restore(self, state: dict[str, Any]) -> None:
        k = self.persist_windows
        self.q = {key: (np.array(v, dtype=np.int64 if key in ("bn", "rw") else np.float64)
                        .reshape((-1, k) if key.startswith("r") else (-1,)))
                  for key, v in state.items()}
