"""Queue pairs (links) of the job as the hang detector sees them: posted and completed work
requests per queue pair over time (MEGATRACE §III-B2). A queue pair whose posted work grows
while its completions stand still is a broken link (§III-C step 2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.detectors.hang.config import NO_TIME
from failslow.detectors.hang.tables import _u64_to_i64


class QueuePairs:
    """Per queue pair (node, device, peer node, owner rank): the last sample's time, posted
    and completed counters, and when completions last changed (with the posted count then);
    ``period`` is the median sampling period."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.info: list[tuple[str, str, str | None, int]] = []
        self.qp = {n: np.zeros(0, np.int64) for n in
                   ("last_t", "posted", "completed", "t_change", "posted_change")}
        self.period = 0

    def ingest(self, table: pa.Table) -> int:
        """Queue-pair counters (MEGATRACE §III-B2): when did completions last advance.
        Returns the newest record time."""
        sep = "\x1f"
        rank_s = pc.cast(table.column("rank"), pa.string())
        key = pc.binary_join_element_wise(
            table.column("node"), table.column("device"), table.column("peer_node"), rank_s,
            sep, null_handling="replace", null_replacement="")
        enc = pc.dictionary_encode(key).combine_chunks()
        codes = enc.indices.to_numpy().astype(np.int64)
        ids = np.empty(len(enc.dictionary), dtype=np.int64)
        before = len(self.info)
        for j, k in enumerate(enc.dictionary.to_pylist()):
            qid = self.ids.get(k)
            if qid is None:
                node, dev, peer, r = k.split(sep)
                qid = len(self.info)
                self.ids[k] = qid
                self.info.append((node, dev, peer or None, int(r) if r else -1))
            ids[j] = qid
        added = len(self.info) - before
        if added:
            for name, arr in self.qp.items():
                fill = NO_TIME if name in ("last_t", "t_change") else -1
                self.qp[name] = np.concatenate([arr, np.full(added, fill, np.int64)])
        q = ids[codes]
        t = table.column("t").to_numpy().astype(np.int64)
        posted = _u64_to_i64(table.column("posted").to_numpy())
        completed = _u64_to_i64(table.column("completed").to_numpy())
        newest = int(t.max())
        order = np.lexsort((t, q))
        q, t, posted, completed = q[order], t[order], posted[order], completed[order]
        first = np.ones(len(q), dtype=bool)
        first[1:] = q[1:] != q[:-1]
        prev = np.empty_like(completed)
        prev[1:] = completed[:-1]
        prev[first] = self.qp["completed"][q[first]]
        changed = completed != prev
        prev_t = np.empty_like(t)
        prev_t[1:] = t[:-1]
        prev_t[first] = self.qp["last_t"][q[first]]
        gaps = (t - prev_t)[(prev_t != NO_TIME) & (t > prev_t)]
        if len(gaps):
            self.period = int(np.median(gaps))
        st = self.qp
        ch = np.flatnonzero(changed)
        if len(ch):
            # the last change per queue pair (rows are sorted by queue pair, then time)
            last_ch = np.ones(len(ch), dtype=bool)
            last_ch[:-1] = q[ch][1:] != q[ch][:-1]
            sel = ch[last_ch]
            st["t_change"][q[sel]] = t[sel]
            st["posted_change"][q[sel]] = posted[sel]
        last = np.ones(len(q), dtype=bool)
        last[:-1] = q[1:] != q[:-1]
        st["last_t"][q[last]] = t[last]
        st["posted"][q[last]] = posted[last]
        st["completed"][q[last]] = completed[last]
        return newest

    def to_state(self) -> dict[str, Any]:
        return {"keys": list(self.ids), "info": [list(i) for i in self.info],
                **{n: a.copy() for n, a in self.qp.items()}}

    def load(self, qp: dict[str, Any]) -> None:
        self.ids = {k: i for i, k in enumerate(qp["keys"])}
        self.info = [(str(a), str(b), c, int(d)) for a, b, c, d in qp["info"]]
        self.qp = {n: np.asarray(qp[n], dtype=np.int64) for n in self.qp}
