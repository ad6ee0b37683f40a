"""The :class:`CommRegistry` that learns a job's communicators from ``coll`` rows when the job
meta does not list them (events.md); the inference itself is :mod:`failslow.comms`."""

from __future__ import annotations

from typing import Any

import numpy as np

from failslow.comms import infer_comm_kind, infer_comms, rank_order
from failslow.detectors.slowdown.config import SEND
from failslow.events import JobMeta

__all__ = ["CommRegistry", "infer_comm_kind", "infer_comms"]

class CommRegistry:
    """Communicator index, kind and members: from ``meta.comms``, else learned from rows."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.ids: list[int] = []
        self.kinds: list[str] = []
        self.members: list[dict[int, int]] = []  # comm index -> {comm_rank: rank}
        self.sizes: list[int] = []
        self.p2p_only: list[bool] = []
        #: collective rows seen per communicator while kinds are learned (rank_order's
        #: tie-break between TP and DP groups of one size)
        self.calls: list[float] = []
        self._index: dict[int, int] = {}
        self._sorted: np.ndarray | None = None  # ids sorted, and their indices
        self._sorted_idx = np.zeros(0, dtype=np.int64)
        self._learning = True  # some communicator's members are still being learned
        self._order: tuple[str, ...] | None = None  # the rank order of the learned kinds
        #: bumped whenever a learned kind is set or changed (readers re-derive theirs)
        self.kinds_version = 0
        for c in meta.comms:
            i = self._add(c.comm, len(c.ranks))
            self.members[i] = dict(enumerate(c.ranks))
            self.kinds[i] = c.kind
            # a communicator the job meta declares is a collective group (a ring) unless
            # it is a pipeline's
            self.p2p_only[i] = c.kind == "pp"

    def _add(self, comm: int, size: int) -> int:
        i = len(self.ids)
        self._index[comm] = i
        self.ids.append(comm)
        self.kinds.append("")
        self.members.append({})
        self.sizes.append(size)
        self.p2p_only.append(True)
        self.calls.append(0.0)
        self._sorted = None
        self._learning = True
        return i

    def index(self, comm: int) -> int:
        return self._index[comm]

    def kind(self, i: int) -> str:
        return self.kinds[i] or "other"

    def ranks(self, i: int) -> list[int]:
        m = self.members[i]
        return [m[k] for k in sorted(m)]

    def observe(self, codes: tuple[np.ndarray, np.ndarray, np.ndarray], cr: np.ndarray,
                size: np.ndarray, rank: np.ndarray, op: np.ndarray) -> np.ndarray:
        """Register new communicators and members; return the comm index of every row.
        ``codes``: the rows' communicators as :func:`~failslow.detectors.iterations.columns.
        comm_codes` gives them (distinct ids, first rows, each row's id)."""
        uniq, first, inv = codes
        pos, hit = self._find(uniq)
        if not hit.all():
            sizes = size[first[~hit]]
            for c, sz in zip(uniq[~hit].tolist(), sizes.tolist(), strict=True):
                self._add(c, int(sz))
            pos, hit = self._find(uniq)
        rows_idx = self._sorted_idx[pos][inv]
        if self._learning:
            idx = np.unique(rows_idx)
            learning = np.array([not self.kinds[i] for i in idx.tolist()], dtype=bool)
            self._learning = bool(learning.any())
        else:
            learning = np.zeros(0, dtype=bool)
        if learning.any():
            sel = np.isin(rows_idx, idx[learning])
            key = np.unique(np.stack([rows_idx[sel], cr[sel], rank[sel],
                                      (op[sel] < SEND).astype(np.int64)], axis=1), axis=0)
            for i, c, r, coll in key.tolist():
                self.members[i][c] = r
                if coll:
                    self.p2p_only[i] = False
            calls = np.bincount(rows_idx[op < SEND], minlength=len(self.ids))
            self.calls = (np.asarray(self.calls) + calls[:len(self.ids)]).tolist()
            done = [i for i in idx[learning].tolist() if len(self.members[i]) >= self.sizes[i]]
            if done:
                self._resolve_kinds()
            self._learning = True
        return rows_idx

    def _resolve_kinds(self) -> None:
        """Kinds of every learned communicator whose members are all known, under the rank
        order that explains them best (:func:`~failslow.comms.rank_order`, as
        :func:`~failslow.comms.infer_comms` decides it for a whole trace): a group is
        labelled alike online and offline, and a kind learned early (before the job's
        other groups showed its rank order) is corrected once they have."""
        meta_ids = {c.comm for c in self.meta.comms}
        done = [i for i in range(len(self.ids))
                if self.ids[i] not in meta_ids and len(self.members[i]) >= self.sizes[i]]
        order = rank_order([(self.ranks(i), self.p2p_only[i]) for i in done], self.meta,
                           [self.calls[i] / max(self.sizes[i], 1) for i in done])
        todo = done if order != self._order else [i for i in done if not self.kinds[i]]
        self._order = order
        for i in todo:
            kind = infer_comm_kind(self.ranks(i), self.meta, self.p2p_only[i], order)
            if kind != self.kinds[i]:
                self.kinds[i] = kind
                self.kinds_version += 1

    def kind_of(self, comm: int) -> str | None:
        """The kind of communicator id ``comm`` (None: not seen, or its members not all
        known yet)."""
        i = self._index.get(comm)
        return self.kinds[i] or None if i is not None else None

    def tp_rows(self, comm: np.ndarray) -> np.ndarray:
        """Per row, whether its communicator is a known tensor-parallel one."""
        pos, hit = self._find(np.asarray(comm, dtype=np.uint64))
        tp = np.array([k == "tp" for k in self.kinds] or [False], dtype=bool)
        return hit & tp[self._sorted_idx[pos]] if len(self.kinds) else hit

    def indices(self, comm: np.ndarray) -> np.ndarray:
        """The index of every communicator id of ``comm``; one not known yet is added
        (members unknown: evidence of another stage, :mod:`.evidence_rows`)."""
        comm = np.asarray(comm, dtype=np.uint64)
        pos, hit = self._find(comm)
        if not hit.all():
            for c in np.unique(comm[~hit]).tolist():
                self._add(int(c), 0)
            pos, hit = self._find(comm)
        return self._sorted_idx[pos] if len(comm) else np.zeros(0, dtype=np.int64)

    def _find(self, comm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions of ``comm`` values in the sorted communicator ids, and which are known."""
        if self._sorted is None:
            ids = np.array(self.ids, dtype=np.uint64)
            o = np.argsort(ids, kind="stable")
            self._sorted, self._sorted_idx = ids[o], o.astype(np.int64)
        if len(self._sorted) == 0:
            return np.zeros(len(comm), dtype=np.int64), np.zeros(len(comm), dtype=bool)
        pos = np.minimum(np.searchsorted(self._sorted, comm), len(self._sorted) - 1)
        return pos, self._sorted[pos] == comm

    def snapshot(self) -> dict[str, Any]:
        return {"ids": list(self.ids), "kinds": list(self.kinds),
                "members": [[[c, r] for c, r in sorted(m.items())] for m in self.members],
                "sizes": list(self.sizes), "p2p_only": list(self.p2p_only),
                "calls": list(self.calls)}

    def restore(self, state: dict[str, Any]) -> None:
        self.ids = [int(x) for x in state["ids"]]
        self.kinds = [str(x) for x in state["kinds"]]
        self.members = [{int(c): int(r) for c, r in m} for m in state["members"]]
        self.sizes = [int(x) for x in state["sizes"]]
        self.p2p_only = [bool(x) for x in state["p2p_only"]]
        self.calls = [float(x) for x in state.get("calls") or [0.0] * len(self.ids)]
        self._index = {c: i for i, c in enumerate(self.ids)}
        self._sorted = None
        self._learning = True
