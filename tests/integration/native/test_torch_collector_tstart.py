"""The PyTorch collector does not know when the device began a transfer: its ``t_start`` is
null (events.md), not -1, which the what-if analysis took for a time (a 6e12 % "simulation
discrepancy" on the example job, issue 18)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the example extra (torch) is not installed") \
    if not os.environ.get("CI") else __import__("torch")

import torch.multiprocessing as mp  # noqa: E402
from test_torch_collector import WORLD, _free_port, _worker  # noqa: E402

from failslow.collectors.agent import Agent, TraceDirSink  # noqa: E402
from failslow.tracedir import TraceDir  # noqa: E402


def test_unknown_transfer_start_is_null(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    mp.start_processes(_worker, args=(_free_port(), str(rings)), nprocs=WORLD, join=True,
                       start_method="fork")
    Agent(TraceDirSink(tmp_path / "out"), rings,
          collectors={"gpu": False, "rdma": False}).close()
    coll = TraceDir(tmp_path / "out").read("coll")
    t_start = coll.column("t_start")
    assert coll.num_rows > 0 and t_start.null_count == coll.num_rows, \
        t_start.drop_null().to_pylist()[:5]
