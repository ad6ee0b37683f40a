"""Derived tables an engine imports from another stage (issue 13 item 3): a consumer group
that derives them (the iteration tracker's ``iterations``, an evidence reducer's
``evidence``) exports them over Kafka (:mod:`failslow.stream.exports`), and the engines of
other groups read them as input instead of deriving them again (``JobConfig.imported``).

Delivery is at least once: a stage that restarts publishes again what it published after
its last committed cut. An importer keeps what was already taken, so a repeated row never
reaches the detectors twice:

- :class:`IterationImport`: the last iteration number of every rank (the job's as rank
  -1); iteration numbers only grow, per rank, in the order they are derived;
- :class:`EvidenceImport`: per reducer shard, the last (``t_emit``, ``seq``) taken; a
  shard derives its rows in that order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from failslow import results
from failslow.detectors.slowdown import evidence_rows

#: Derived tables a stage may export and others import, and their schemas.
SCHEMAS: dict[str, pa.Schema] = {"iterations": results.SCHEMAS["iterations"],
                                 "evidence": evidence_rows.SCHEMA}
IMPORTABLE: frozenset[str] = frozenset(SCHEMAS)


class IterationImport:
    """Imported ``iterations`` rows less those already taken (module docstring). State: the
    last iteration number per rank, rank -1 (the job) at index 0."""

    def __init__(self) -> None:
        self.last = np.zeros(0, dtype=np.int64)  # by rank + 1; -1: none yet

    def take(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` newer than every row taken before, for their rank."""
        if not table.num_rows:
            return table
        rank = table.column("rank").to_numpy(zero_copy_only=False).astype(np.int64) + 1
        it = table.column("iteration").to_numpy(zero_copy_only=False).astype(np.int64)
        ok = rank >= 0
        top = int(rank.max()) + 1 if len(rank) else 0
        if top > len(self.last):
            grown = np.full(top, -1, dtype=np.int64)
            grown[:len(self.last)] = self.last
            self.last = grown
        # rows of one rank come in iteration order: a row is new when it exceeds what
        # was taken before this table (repeats within the table: the first is kept)
        before = np.where(ok, self.last[np.where(ok, rank, 0)], np.iinfo(np.int64).max)
        keep = ok & (it > before)
        if keep.any():
            order = np.lexsort((it[keep], rank[keep]))
            r, i = rank[keep][order], it[keep][order]
            first = np.concatenate(([True], (r[1:] != r[:-1]) | (i[1:] != i[:-1])))
            dup = np.zeros(int(keep.sum()), dtype=bool)
            dup[order[~first]] = True
            idx = np.flatnonzero(keep)
            keep[idx[dup]] = False
            np.maximum.at(self.last, rank[keep], it[keep])
        return table if keep.all() else table.filter(pa.array(keep))

    def snapshot(self) -> dict[str, Any]:
        return {"last": self.last.copy()}

    def restore(self, state: dict[str, Any]) -> None:
        self.last = np.asarray(state["last"], dtype=np.int64).copy()


class EvidenceImport:
    """Imported ``evidence`` rows less those already taken (module docstring), in shard
    order, then in the order each shard derived them (``t_emit``, ``seq``). State: the last
    (``t_emit``, ``seq``) per shard."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, int]] = {}

    def take(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` no earlier than every row taken before, for their shard."""
        if not table.num_rows:
            return table
        shard = table.column("shard").to_numpy().astype(np.int64)
        t = table.column("t_emit").to_numpy()
        seq = table.column("seq").to_numpy()
        order = np.lexsort((seq, t, shard))
        s, tt, q = shard[order], t[order], seq[order]
        keep = np.concatenate(([True], (s[1:] != s[:-1]) | (tt[1:] != tt[:-1])
                               | (q[1:] != q[:-1])))
        for sh in np.unique(s).tolist():
            at = s == sh
            if sh in self.last:
                lt, lq = self.last[sh]
                keep &= ~at | (tt > lt) | ((tt == lt) & (q > lq))
            kept = np.flatnonzero(at & keep)
            if len(kept):
                self.last[sh] = (int(tt[kept[-1]]), int(q[kept[-1]]))
        return table.take(pa.array(order[keep]))

    def snapshot(self) -> dict[str, Any]:
        return {"last": [[s, t, q] for s, (t, q) in sorted(self.last.items())]}

    def restore(self, state: dict[str, Any]) -> None:
        self.last = {int(s): (int(t), int(q)) for s, t, q in state["last"]}


#: What takes each importable table once.
IMPORTERS: dict[str, type[IterationImport] | type[EvidenceImport]] = {
    "iterations": IterationImport, "evidence": EvidenceImport}
