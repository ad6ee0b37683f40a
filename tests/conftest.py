"""Shared test fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from failslow import events

SHARED = Path(__file__).resolve().parents[2] / "shared"


def coll_row(**overrides: Any) -> dict[str, Any]:
    """One valid ``coll`` row; keyword arguments replace columns."""
    row: dict[str, Any] = {
        "job": "j1", "rank": 0, "comm": 2**64 - 1, "comm_rank": 0, "comm_size": 2, "seq": 0,
        "op": "allreduce", "bytes": 1024, "peer": -1, "phase": "enter", "t": 1_000,
    }
    row.update(overrides)
    return row


def meta_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "job": "j1", "t": 1, "world_size": 2, "tp": 1, "pp": 1, "dp": 2, "cp": 1,
        "microbatches": 1, "schedule": "1f1b", "nodes": {"0": "n0", "1": "n0"},
        "comms": [{"comm": 2**64 - 1, "kind": "dp", "ranks": [0, 1]}],
    }
    row.update(overrides)
    return row


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    """A valid two-rank trace directory in JSON Lines with one allreduce round."""
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    rows = [
        coll_row(rank=0, comm_rank=0, phase="enter", t=1_000),
        coll_row(rank=1, comm_rank=1, phase="enter", t=1_500),
        coll_row(rank=0, comm_rank=0, phase="end", t=3_000, t_start=1_600),
        coll_row(rank=1, comm_rank=1, phase="end", t=3_000, t_start=None),
    ]
    (tmp_path / "coll.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


__all__ = ["SHARED", "coll_row", "meta_row", "events"]
