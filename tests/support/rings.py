"""Shared-memory rings with known records, for the node agent's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from failslow import events
from failslow.collectors import ring as R


def coll_records(rank: int, comm: int, n: int, t0: int = 1_000_000_000) -> np.ndarray:
    """``n`` allreduce operations (enter + end rows) of ``rank`` on ``comm``."""
    recs = R.empty_records(2 * n)
    recs["kind"] = R.KIND_COLL
    recs["op"] = events.OP["allreduce"]
    recs["rank"] = rank
    recs["comm"] = comm
    recs["comm_rank"] = rank
    recs["comm_size"] = 2
    recs["peer"] = -1
    recs["bytes"] = 4096
    recs["seq"] = np.repeat(np.arange(n, dtype=np.uint64), 2)
    recs["phase"] = np.tile(np.array([events.ENTER, events.END], np.uint8), n)
    recs["t_ns"] = t0 + np.arange(2 * n, dtype=np.int64) * 1000
    recs["t_start_ns"] = -1
    return recs


def comm_init_record(rank: int, comm: int, kind: str) -> np.ndarray:
    r = R.empty_records(1)
    r["kind"], r["rank"], r["comm"], r["comm_rank"], r["comm_size"] = R.KIND_COMM, rank, comm, \
        rank, 2
    r["name"] = kind.encode()
    return r


def ring_with_records(d: Path, rank: int, pid_name: int, n: int,
                      comm: int = 2**63 + 5) -> R.RingWriter:
    """A ring file of job1 holding a dp communicator record and ``n`` allreduces."""
    w = R.RingWriter(d / f"failslow-job1-{pid_name}-torch.ring", 1024, job="job1", rank=rank)
    w.write(comm_init_record(rank, comm, "dp"))
    w.write(coll_records(rank, comm, n))
    return w
