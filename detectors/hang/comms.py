"""Communicators of a job as the hang detector knows them: ids, sizes, members in comm-rank
order (from ``meta`` or learned from ``coll`` rows) and their kind (events.md, meta), from
which MEGATRACE's training stage of a halt point follows (§III-C step 3)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from failslow.detectors.hang.config import RECV, SEND
from failslow.detectors.hang.tables import _RANK_BITS, _cr_key, _first_positions, _Sorted
from failslow.events import JobMeta


class CommTable:
    """Registered communicators (index ``ci`` in order of registration) and their members:
    (communicator index, comm rank) -> global rank."""

    def __init__(self, meta: JobMeta) -> None:
        self.meta = meta
        self.ids: dict[int, int] = {}
        self.u64: list[int] = []
        self.kind: list[str | None] = []
        self.size: list[int] = []
        self.p2p: list[bool] = []        # seen carrying send/recv
        self._sorted: tuple[np.ndarray, np.ndarray] | None = None  # ids sorted, index
        self.meta_members: dict[int, np.ndarray] = {}
        self._mcache: dict[int, np.ndarray] = {}
        self.crk = _Sorted({"rank": (np.int64, -1)})
        keys, ranks = [], []
        for c in meta.comms:
            ci = self.register(c.comm, len(c.ranks))
            self.kind[ci] = c.kind
            members = np.asarray(c.ranks, dtype=np.int64)
            self.meta_members[ci] = members
            keys.append(_cr_key(ci, np.arange(len(members))))
            ranks.append(members)
        if keys:
            idx = self.crk.ensure(np.concatenate(keys))
            self.crk.cols["rank"][idx] = np.concatenate(ranks)

    def __len__(self) -> int:
        return len(self.u64)

    def register(self, comm: int, size: int) -> int:
        ci = self.ids.get(comm)
        if ci is None:
            ci = len(self.u64)
            self.ids[comm] = ci
            self.u64.append(comm)
            self.kind.append(None)
            self.size.append(size)
            self.p2p.append(False)
        return ci

    def index(self, comm: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
        """Index of each row's communicator (-1: unknown); with ``sizes``, communicators not
        seen before are registered, in the order of their ids, with the size of their first
        row."""
        codes, uniq = pd.factorize(comm)
        uniq = np.asarray(uniq)
        ids = self._known(uniq)
        if sizes is not None and (ids < 0).any():
            first = _first_positions(codes)
            new = np.flatnonzero(ids < 0)
            for j in new[np.argsort(uniq[new], kind="stable")].tolist():
                ids[j] = self.register(int(uniq[j]), int(sizes[first[j]]))
        return ids[codes]

    def _known(self, uniq: np.ndarray) -> np.ndarray:
        """Index of each communicator id of ``uniq`` (-1: not registered): a binary search
        in the registered ids kept sorted (rebuilt when one is registered)."""
        get = self.ids.get
        if uniq.dtype != np.uint64 or not len(self.u64):
            return np.array([get(c, -1) for c in uniq.tolist()], dtype=np.int64)
        if self._sorted is None or len(self._sorted[0]) != len(self.u64):
            ids = np.asarray(self.u64, dtype=np.uint64)
            by_id = np.argsort(ids, kind="stable")
            self._sorted = (ids[by_id], by_id.astype(np.int64))
        keys, where = self._sorted
        pos = np.minimum(np.searchsorted(keys, uniq), len(keys) - 1)
        return np.where(keys[pos] == uniq, where[pos], -1)

    def add_members(self, ci: np.ndarray, crank: np.ndarray, rank: np.ndarray) -> None:
        """(communicator, comm rank) -> global rank of entered operations."""
        self._mcache.clear()
        k = self.crk.ensure(_cr_key(ci, crank))
        self.crk.cols["rank"][k] = rank

    def mark_p2p(self, ci: np.ndarray) -> None:
        """Communicators carrying send/recv (a pipeline communicator when sized like one)."""
        flags = np.asarray(self.p2p, dtype=bool)
        if not flags[ci].all():
            comms = pd.unique(ci)
            for c in comms[~flags[comms]].tolist():
                self.p2p[c] = True

    def global_ranks(self, ci: np.ndarray, crank: np.ndarray) -> np.ndarray:
        """Global rank of each (communicator, comm rank) (-1 where unknown)."""
        row = self.crk.find(_cr_key(ci, crank))
        return np.where(row >= 0, self.crk.cols["rank"][np.maximum(row, 0)], -1)

    def members(self, ci: int) -> np.ndarray:
        """Global ranks of the communicator in comm-rank order (-1 where unknown)."""
        if ci in self.meta_members:
            return self.meta_members[ci]
        cached = self._mcache.get(ci)
        if cached is not None:
            return cached
        sl = self.crk.range(ci << _RANK_BITS, (ci + 1) << _RANK_BITS)
        cranks = self.crk.keys[sl] & ((1 << _RANK_BITS) - 1)
        out = np.full(max(self.size[ci], int(cranks.max()) + 1 if len(cranks) else 0), -1,
                      dtype=np.int64)
        out[cranks] = self.crk.cols["rank"][sl]
        self._mcache[ci] = out
        return out

    def comm_kind(self, ci: int) -> str:
        """meta.comms kind, else inferred from size, stride and use (events.md, meta)."""
        kind = self.kind[ci]
        if kind is not None:
            return kind
        m = self.meta
        size = self.size[ci]
        members = self.members(ci)
        members = np.sort(members[members >= 0])
        stride = np.unique(np.diff(members)) if len(members) > 1 else np.zeros(0, np.int64)
        if size == m.world_size and size > 1:
            return "world"
        if self.p2p[ci] and (size == m.pp or (size == 2 and m.pp > 1)):
            return "pp"
        if size == m.tp and m.tp > 1 and (len(stride) == 0 or stride.tolist() == [1]):
            return "tp"
        for name, degree in (("dp", m.dp), ("cp", m.cp), ("pp", m.pp), ("tp", m.tp)):
            if size == degree and degree > 1:
                return name
        return "other"

    def stage(self, ci: int, op: int) -> str:
        """MEGATRACE's "which stage" (§III-C step 3) from the communicator kind and the
        operation."""
        kind = self.comm_kind(ci)
        if op in (SEND, RECV) or kind == "pp":
            return "pp_p2p"
        if kind == "dp":
            return "dp_sync"
        if kind in ("tp", "cp"):    # collectives inside forward/backward compute
            return "tp_collective"
        return "other"

    def to_state(self) -> dict[str, Any]:
        return {"u64": self.u64, "kind": self.kind, "size": self.size, "p2p": self.p2p}

    def load(self, comms: dict[str, Any], crk: dict[str, Any]) -> None:
        self.u64 = [int(c) for c in comms["u64"]]
        self.ids = {c: i for i, c in enumerate(self.u64)}
        self._sorted = None
        self.kind = list(comms["kind"])
        self.size = [int(s) for s in comms["size"]]
        self.p2p = [bool(p) for p in comms["p2p"]]
        self.crk.load(crk)
        self._mcache.clear()
