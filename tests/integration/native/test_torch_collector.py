"""PyTorch collector on gloo/CPU: every wrapped call yields enter/end rows with the same
(comm, seq) on all members; the agent turns the rings into a valid trace."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the example extra (torch) is not installed") \
    if not os.environ.get("CI") else __import__("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from failslow.collectors.agent import Agent, TraceDirSink  # noqa: E402
from failslow.collectors.torch_collector import TorchCollector, comm_id  # noqa: E402
from failslow.tracedir import TraceDir  # noqa: E402

WORLD = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, ring_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    col = TorchCollector.install(job="tc", ring_dir=ring_dir)
    pair = [col.new_group(r, kind="tp") for r in ([0, 1], [2, 3])][rank // 2]
    x = torch.ones(8)
    dist.all_reduce(x)
    dist.all_reduce(x, group=pair)
    out = [torch.zeros(8) for _ in range(WORLD)]
    dist.all_gather(out, x)
    dist.all_gather_into_tensor(torch.zeros(8 * WORLD), x)
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(8))
    dist.broadcast(x, src=1)
    dist.reduce(x, dst=2)
    dist.all_to_all_single(torch.zeros(8), torch.ones(8))
    w = dist.all_reduce(x, async_op=True)
    assert w is not None
    w.wait()
    peer = rank ^ 1
    if rank % 2 == 0:
        dist.send(torch.ones(4), dst=peer)
        dist.recv(x[:4], src=peer)
    else:
        dist.recv(x[:4], src=peer)
        dist.send(torch.ones(4), dst=peer)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), peer),
                                   dist.P2POp(dist.irecv, torch.zeros(2), peer)])
    for r in reqs:
        r.wait()
    # gloo completes point-to-point work only inside wait(): the collector must still stamp
    # the true completion (the receiver posts at once), not the time the caller waits
    if rank % 2 == 0:
        w = dist.isend(torch.ones(4), dst=peer)
        time.sleep(0.4)
        assert isinstance(w, dist.Work) and w.is_completed()
        w.wait()
    else:
        dist.recv(x[:4], src=peer)
    dist.barrier()
    col.close()
    dist.destroy_process_group()


def test_gloo_collectives_recorded(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    mp.start_processes(_worker, args=(_free_port(), str(rings)), nprocs=WORLD, join=True,
                       start_method="fork")
    agent = Agent(TraceDirSink(tmp_path / "out"), rings, collectors={"gpu": False, "rdma": False})
    agent.close()
    td = TraceDir(tmp_path / "out")
    coll = td.read("coll").to_pandas()
    meta = td.meta()
    world = comm_id(0, range(WORLD))
    kinds = {c.comm: (c.kind, c.ranks) for c in meta.comms}
    assert kinds[world] == ("world", (0, 1, 2, 3))
    assert kinds[comm_id(1, (0, 1))] == ("tp", (0, 1))
    assert kinds[comm_id(2, (2, 3))] == ("tp", (2, 3))
    # every operation has an enter and an end row, end after enter
    ph = coll.pivot_table(index=["rank", "comm", "seq"], columns="phase", values="t",
                          aggfunc="count")
    assert (ph["enter"] == 1).all() and (ph["end"] == 1).all()
    t = coll.pivot_table(index=["rank", "comm", "seq"], columns="phase", values="t")
    assert (t["end"] >= t["enter"]).all()
    w = coll[(coll.comm == world) & (coll.phase == "enter")]
    # the world group: same op sequence on every rank (CCL-D Trace ID)
    seqs = {r: list(g.sort_values("seq").op) for r, g in w.groupby("rank")}
    colls = {r: [o for o in s if o not in ("send", "recv")] for r, s in seqs.items()}
    assert all(s == colls[0] for s in colls.values()) and len(colls[0]) == 9
    assert seqs[0][:8] == ["allreduce", "allgather", "allgather", "reducescatter", "broadcast",
                           "reduce", "alltoall", "allreduce"]
    assert seqs[0].count("send") == 3 and seqs[0].count("recv") == 2
    bc = w[w.op == "broadcast"]
    assert (bc.peer == 1).all() and (bc.bytes == 32).all()
    sends = w[(w.op == "send") & (w["rank"] == 0)]
    assert (sends.peer == 1).all()
    last = int(sends.seq.max())
    ms = (t.loc[(0, world, last), "end"] - t.loc[(0, world, last), "enter"]) / 1e6
    assert ms < 300, f"isend end stamped at the caller's wait ({ms:.0f} ms), not at completion"
    assert len(coll[coll.comm == comm_id(1, (0, 1))]) == 2 * 2
