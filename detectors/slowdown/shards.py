"""Which :class:`~.reducer.EvidenceReducer` reads which ``coll`` rows when several share
one job (issue 13 item 3; docs/scaling.md, "The shape that meets the floors").

A job's ranks are cut into contiguous blocks, one per shard (in Megatron's rank order a
block of whole pipeline stages when the shard count divides the pipeline depth: then only
the pipeline's sends and receives cross shards). A reducer measures the gaps of its own
ranks, which needs all of their rows, and joins the rounds it owns, which needs every
member's rows of them:

- a collective round is owned by the shard of its communicator's lowest rank;
- a point-to-point round by the shard of the receiving rank (the sender's row is
  forwarded there, as a repartition topic would carry it between processes).

Every round is thus joined by exactly one reducer, and every bin key has one producer.
The routing needs the communicators' members, so it takes them from the job meta
(``meta.comms``): a job that does not declare them runs one reducer, and rounds of a
communicator the meta does not list are joined by shard 0."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from failslow.detectors.iterations import coll_columns
from failslow.detectors.slowdown.config import RECV, SEND
from failslow.events import JobMeta

log = logging.getLogger(__name__)


class ShardRouter:
    """The rows of each of ``shards`` reducers (module docstring)."""

    def __init__(self, meta: JobMeta, shards: int = 1) -> None:
        if shards > 1 and not meta.comms:
            log.info("job %s: the meta lists no communicators; one evidence reducer",
                     meta.job)
            shards = 1
        self.shards = max(1, int(shards))
        top = max([meta.world_size, *(max(c.ranks, default=0) + 1 for c in meta.comms)])
        self.world = max(top, 1)
        comms = sorted(meta.comms, key=lambda c: c.comm)
        self.comm_ids = np.array([c.comm for c in comms], dtype=np.uint64)
        self.owner = np.array([self.shard_of(np.array([min(c.ranks, default=0)]))[0]
                               for c in comms], dtype=np.int64)
        # (comm position, comm rank) -> global rank, for the receivers of sends
        width = max([len(c.ranks) for c in comms] or [1])
        self.members = np.full((max(len(comms), 1), width), -1, dtype=np.int64)
        for i, c in enumerate(comms):
            self.members[i, :len(c.ranks)] = c.ranks

    def shard_of(self, rank: np.ndarray) -> np.ndarray:
        """The shard of each rank (contiguous blocks of the ranks)."""
        r = np.clip(np.asarray(rank, dtype=np.int64), 0, self.world - 1)
        return r * self.shards // self.world

    def join_shard(self, coll: pa.Table) -> np.ndarray:
        """Per row, the shard that joins its round."""
        c = coll_columns(coll)
        n = len(c["rank"])
        out = np.zeros(n, dtype=np.int64)
        if not len(self.comm_ids):
            return out
        pos = np.minimum(np.searchsorted(self.comm_ids, c["comm"]), len(self.comm_ids) - 1)
        known = self.comm_ids[pos] == c["comm"]
        out[known] = self.owner[pos[known]]
        op = c["op"]
        send, recv = known & (op == SEND), known & (op == RECV)
        out[recv] = self.shard_of(c["rank"][recv])
        if send.any():
            peer = c["peer"][send]
            ok = (peer >= 0) & (peer < self.members.shape[1])
            dst = np.where(ok, self.members[pos[send], np.clip(peer, 0,
                                                                 self.members.shape[1] - 1)],
                           -1)
            out[send] = np.where(dst >= 0, self.shard_of(dst), 0)
        return out

    def split(self, coll: pa.Table) -> list[tuple[pa.Table, pa.Table | None]]:
        """Per shard, the rows whose rounds it joins and the rows of its own ranks (None:
        the same rows)."""
        if self.shards == 1:
            return [(coll, None)]
        join = self.join_shard(coll)
        own = self.shard_of(coll_columns(coll)["rank"])
        return [(coll.filter(pa.array(join == s)), coll.filter(pa.array(own == s)))
                for s in range(self.shards)]

    def rows_of(self, coll: pa.Table, shard: int) -> tuple[pa.Table, pa.Table | None]:
        """:meth:`split`'s item for one shard."""
        if self.shards == 1:
            return coll, None
        join = self.join_shard(coll) == shard
        own = self.shard_of(coll_columns(coll)["rank"]) == shard
        return coll.filter(pa.array(join)), coll.filter(pa.array(own))
