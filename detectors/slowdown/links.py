"""RDMA work-request telemetry (``link`` rows, MEGATRACE §III-B): per queue pair the work
requests completed, the bytes and the time they spent in flight between samples (VCCL's
rule: bandwidth alone misfires on idle queues)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.detectors.iterations import _group_starts
from failslow.events import NULL_TIME, JobMeta


class LinkTracker:
    """RDMA work-request telemetry (``link`` rows, MEGATRACE §III-B): per queue pair the
    work requests completed, the bytes and the in-flight count (``posted - completed``)
    between consecutive samples. A link is judged by the mean time a work request spends in
    flight, ``W = sum(in_flight x dt) / completed`` (Little's law over the sampled window):
    it grows when bandwidth falls *while* work is queued, and stays flat on an idle queue
    (VCCL's rule: bandwidth alone misfires on idle queues)."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.index: dict[str, int] = {}
        self.node_names: list[str] = []
        self.node_ids: dict[str, int] = {}
        self.qp_node = np.zeros(0, dtype=np.int64)
        self.qp_peer = np.zeros(0, dtype=np.int64)
        self.qp_rank = np.zeros(0, dtype=np.int64)
        self.last = np.zeros((0, 4), dtype=np.int64)  # t, posted, completed, bytes

    def _node(self, name: str) -> int:
        i = self.node_ids.get(name)
        if i is None:
            i = self.node_ids[name] = len(self.node_names)
            self.node_names.append(name)
        return i

    def update(self, link: pa.Table) -> dict[str, np.ndarray] | None:
        """Rows of one batch -> bin columns (``bin`` left to the caller: the sample time)."""
        if link.num_rows == 0:
            return None
        rank_col = pc.fill_null(link.column("rank"), -1)
        peer = pc.fill_null(link.column("peer_node"), "")
        key = pc.binary_join_element_wise(link.column("node"), link.column("device"), peer,
                                          pc.cast(rank_col, pa.string()), "\x1f")
        enc = pc.dictionary_encode(key).combine_chunks()
        words = enc.dictionary.to_pylist()
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        ids = np.empty(len(words), dtype=np.int64)
        fresh = []
        for j, w in enumerate(words):
            q = self.index.get(w)
            if q is None:
                q = self.index[w] = len(self.index)
                node, _, peer_node, rnk = w.split("\x1f")
                fresh.append((self._node(node), self._node(peer_node) if peer_node else -1,
                              int(rnk)))
            ids[j] = q
        if fresh:
            arr = np.array(fresh, dtype=np.int64).reshape(-1, 3)
            self.qp_node = np.concatenate([self.qp_node, arr[:, 0]])
            self.qp_peer = np.concatenate([self.qp_peer, arr[:, 1]])
            self.qp_rank = np.concatenate([self.qp_rank, arr[:, 2]])
            self.last = np.concatenate([self.last, np.full((len(arr), 4), NULL_TIME,
                                                           dtype=np.int64)])
        qp = ids[codes]
        t = link.column("t").to_numpy()
        vals = np.stack([t, link.column("posted").to_numpy().astype(np.int64),
                         link.column("completed").to_numpy().astype(np.int64),
                         link.column("bytes").to_numpy().astype(np.int64)], axis=1)
        order = np.lexsort((t, qp))
        qp, vals = qp[order], vals[order]
        starts = _group_starts(qp)
        prev = np.empty_like(vals)
        prev[1:] = vals[:-1]
        prev[starts] = self.last[qp[starts]]
        ends = np.append(starts[1:] - 1, len(qp) - 1)
        self.last[qp[ends]] = vals[ends]
        ok = (prev[:, 0] != NULL_TIME) & (vals[:, 0] > prev[:, 0])
        if not ok.any():
            return None
        dt = (vals[ok, 0] - prev[ok, 0]).astype(np.float64)
        inflight = 0.5 * ((vals[ok, 1] - vals[ok, 2]) + (prev[ok, 1] - prev[ok, 2]))
        return {"t": vals[ok, 0], "qp": qp[ok], "dc": (vals[ok, 2] - prev[ok, 2]).astype(
            np.float64), "lt": np.maximum(inflight, 0.0) * dt,
            "db": (vals[ok, 3] - prev[ok, 3]).astype(np.float64), "dt": dt}

    def snapshot(self) -> dict[str, Any]:
        return {"index": [[k, v] for k, v in self.index.items()],
                "node_names": list(self.node_names), "qp_node": self.qp_node.copy(),
                "qp_peer": self.qp_peer.copy(), "qp_rank": self.qp_rank.copy(),
                "last": self.last.copy()}

    def restore(self, state: dict[str, Any]) -> None:
        self.index = {str(k): int(v) for k, v in state["index"]}
        self.node_names = [str(x) for x in state["node_names"]]
        self.node_ids = {n: i for i, n in enumerate(self.node_names)}
        self.qp_node = np.array(state["qp_node"], dtype=np.int64)
        self.qp_peer = np.array(state["qp_peer"], dtype=np.int64)
        self.qp_rank = np.array(state["qp_rank"], dtype=np.int64)
        self.last = np.array(state["last"], dtype=np.int64).reshape(-1, 4)
