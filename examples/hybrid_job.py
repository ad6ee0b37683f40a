"""A small hybrid-parallel training job on CPU (torch.distributed + gloo), instrumented by the
failslow PyTorch collector, with injectable faults.

8 processes on 127.0.0.1: tensor parallel 2 x pipeline parallel 2 x data parallel 2
(rank = dp * 4 + pp * 2 + tp, Megatron's order). Each pipeline stage is one transformer-style
MLP block split Megatron-style over the TP pair (column-parallel then row-parallel linear, one
all-reduce forward and one backward); activations and gradients cross the stage boundary with
send/recv in a 1F1B schedule; gradients are all-reduced over the DP group at the end of each
iteration. Greyhound's S2 is applied through :mod:`failslow.collectors.mitigation_client`: each
DP group runs its own micro-batch count and weights its gradients by m_i / M. The driver reads
the advice and hands the counts to the ranks with the iteration they take effect at: every
pipeline stage (and TP peer) of a replica must switch at the same iteration, or a stage waits
for a micro-batch its neighbour will never send.

Faults (greyhound.md §2, MEGATRACE §II): ``--straggler RANK:MS[:FROM_ITER]`` sleeps in every
forward of that rank; ``--hang RANK:ITER`` makes that rank SIGSTOP itself; the driver sees the
job stall, kills it, and marks the trace post-mortem (``import.json``). ``--slow-link A:B:MBIT
[:FROM_ITER]`` puts the two DP replicas in network namespaces joined by veth pairs and limits
the A-B pair with ``tc tbf`` from that iteration on (:class:`SlowLink`; root only).

    python -m examples.hybrid_job --out DIR [--iters 12] [--straggler 5:30]

The driver runs the node agent over the ranks' rings after the job and writes the trace
directory ``DIR`` (meta.json with comms, coll.parquet), ready for ``failslow analyze DIR``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from examples.netns_mesh import add_namespaces, limit, release, setns, sh

TP, PP, DP = 2, 2, 2
WORLD = TP * PP * DP


def coords(rank: int) -> tuple[int, int, int]:
    """(tp, pp, dp) index of ``rank``."""
    return rank % TP, (rank // TP) % PP, rank // (TP * PP)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, cfg: dict[str, Any], progress: Any, plan: Any) -> None:
    import torch
    import torch.distributed as dist

    from failslow.collectors.torch_collector import TorchCollector

    link: SlowLink | None = cfg.get("link")
    netns = cfg.get("netns")
    if netns:  # enter this rank's "node" (network namespace) before any thread exists
        ns, ifname = netns["ranks"][rank]
        setns(ns)
        # gloo's interface has no argument: torch reads it from this process's environment
        # (written, not read: failslow.settings is the only reader)
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
    torch.set_num_threads(1)
    master = netns["master"] if netns else "127.0.0.1"
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{cfg['port']}", rank=rank,
                            world_size=WORLD)
    col = TorchCollector.install(job=cfg["job"], ring_dir=cfg["ring_dir"])
    tp_i, pp_i, dp_i = coords(rank)
    groups: dict[str, Any] = {}
    # every rank creates every group, in the same order (torch requires it)
    for d in range(DP):
        for p in range(PP):
            g = col.new_group([d * 4 + p * 2 + t for t in range(TP)], kind="tp")
            if (d, p) == (dp_i, pp_i):
                groups["tp"] = g
    for d in range(DP):
        for t in range(TP):
            g = col.new_group([d * 4 + p * 2 + t for p in range(PP)], kind="pp")
            if (d, t) == (dp_i, tp_i):
                groups["pp"] = g
    for p in range(PP):
        for t in range(TP):
            g = col.new_group([d * 4 + p * 2 + t for d in range(DP)], kind="dp")
            if (p, t) == (pp_i, tp_i):
                groups["dp"] = g
    prev = rank - TP if pp_i > 0 else None
    nxt = rank + TP if pp_i < PP - 1 else None

    class _TPReduce(torch.autograd.Function):  # row-parallel output: all-reduce forward
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            x = x.clone()
            dist.all_reduce(x, group=groups["tp"])
            return x

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            return g

    class _TPCopy(torch.autograd.Function):  # column-parallel input: all-reduce backward
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
            g = g.clone()
            dist.all_reduce(g, group=groups["tp"])
            return g

    H, F, B = cfg["hidden"], cfg["ffn"], cfg["batch"]
    torch.manual_seed(1000 + pp_i * 10 + tp_i)  # the same weights in every DP replica
    w1 = (torch.randn(H, F // TP) / H ** 0.5).requires_grad_()
    w2 = (torch.randn(F // TP, H) / F ** 0.5).requires_grad_()
    params = [w1, w2]
    opt = torch.optim.SGD(params, lr=0.01)
    m_now = cfg["microbatches"]
    straggler = cfg.get("straggler")  # (rank, ms, from_iter)
    hang = cfg.get("hang")  # (rank, iter)

    def forward(x: torch.Tensor, it: int) -> torch.Tensor:
        if straggler and straggler[0] == rank and it >= straggler[2]:
            time.sleep(straggler[1] / 1000)
        h = torch.relu(_TPCopy.apply(x) @ w1)
        return x + _TPReduce.apply(h @ w2)

    world_buf = torch.ones(cfg["world_bytes"] // 4) if cfg.get("world_bytes") else None
    times, starts = [], []
    for it in range(cfg["iters"]):
        if link is not None and it == cfg["link_from"] and rank in (link.a, link.b):
            # the link's ends slow it down themselves: from exactly this iteration on,
            # however late a driver would notice the progress on this loaded machine
            link.trigger(link.side_of(rank))
        t0 = time.perf_counter()
        starts.append(time.time_ns())
        if hang and hang[0] == rank and it == hang[1]:
            os.kill(os.getpid(), signal.SIGSTOP)
        with plan.get_lock():  # S2: (effective iteration, m_0 .. m_DP-1), set by the driver
            if plan[0] >= 0 and it >= plan[0]:
                m_now = int(plan[1 + dp_i])
        m, total = m_now, cfg["microbatches"] * DP
        opt.zero_grad()
        gen = torch.Generator().manual_seed(it * 100 + dp_i)
        inputs = [torch.randn(B, H, generator=gen) for _ in range(m)]
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        sends: list[Any] = []
        warmup = min(PP - pp_i - 1, m)

        def fwd(i: int, inputs: list[torch.Tensor] = inputs, it: int = it,
                sends: list[Any] = sends,
                saved: list[tuple[torch.Tensor, torch.Tensor]] = saved) -> None:
            if prev is None:
                x = inputs[i]
            else:
                x = torch.empty(B, H)
                dist.recv(x, src=prev, group=groups["pp"])
            x.requires_grad_()
            y = forward(x, it)
            if nxt is not None:
                w = dist.isend(y.detach(), dst=nxt, group=groups["pp"])
                sends.append(w)
            saved.append((x, y))

        def bwd(i: int, sends: list[Any] = sends,
                saved: list[tuple[torch.Tensor, torch.Tensor]] = saved) -> None:
            x, y = saved[i]
            if nxt is None:
                loss = (y ** 2).mean()
                loss.backward()
            else:
                g = torch.empty(B, H)
                dist.recv(g, src=nxt, group=groups["pp"])
                y.backward(g)
            if prev is not None:
                assert x.grad is not None
                sends.append(dist.isend(x.grad, dst=prev, group=groups["pp"]))

        for i in range(warmup):
            fwd(i)
        for i in range(m - warmup):
            fwd(i + warmup)
            bwd(i)
        for i in range(m - warmup, m):
            bwd(i)
        for w in sends:
            w.wait()
        # DP gradient all-reduce, S2-weighted: every replica's sum over its own m_i
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        flat /= total
        dist.all_reduce(flat, group=groups["dp"])
        if world_buf is not None:  # statistics over every rank: one gloo ring, 0 -> 1 ... -> 7
            dist.all_reduce(world_buf)
        off = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[off:off + n].view_as(p))
            off += n
        opt.step()
        times.append(time.perf_counter() - t0)
        progress[rank] = it + 1
    col.close()
    with open(os.path.join(cfg["ring_dir"], f"times-{rank}.json"), "w") as fh:
        json.dump(times, fh)
    with open(os.path.join(cfg["ring_dir"], f"starts-{rank}.json"), "w") as fh:
        json.dump(starts, fh)
    dist.destroy_process_group()


class SlowLink:
    """Two "nodes" as network namespaces (ranks of DP replica 0 / 1), joined by two veth pairs.

    Ranks ``a`` and ``b`` (one in each node) talk over the second pair only; every other
    cross-node flow uses the first. The second pair carries a ``tc`` token-bucket filter
    (``tbf``) on both ends from the start, at 10 Gbit/s (no limit at these rates); making
    the link slow is one ``tc qdisc change`` to ``rate_mbit`` on each end (Greyhound §2's
    congested link: exactly one link, a <-> b, becomes slow). ``netem`` delay would be the
    other choice, but this kernel has no ``sch_netem`` (and no loadable modules).

    The change goes through a ``tc -batch -`` process per namespace, started here and kept
    waiting on its stdin: :meth:`trigger` (called by rank ``a`` or ``b`` itself at the start
    of the fault's iteration) costs a pipe round trip of well under a millisecond, so the
    link is slow from exactly that iteration on without pausing the job -- a driver polling
    the ranks' progress and spawning ``tc`` reacted several iterations late on this loaded
    machine. Needs root (``ip netns``)."""

    FAST = "rate 10gbit burst 1mb latency 2s"

    def __init__(self, a: int, b: int, rate_mbit: float) -> None:
        self.a, self.b, self.rate_mbit = a, b, rate_mbit
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"fsA{tag}", f"fsB{tag}")
        self.created: list[str] = []
        self.ifs = {(0, 1): f"fa1{tag}", (0, 2): f"fa2{tag}", (1, 1): f"fb1{tag}",
                    (1, 2): f"fb2{tag}"}
        self.shapers: list[subprocess.Popen[str]] = []

    def __enter__(self) -> SlowLink:
        try:
            add_namespaces(self.ns, self.created)
            for pair in (1, 2):
                a_if, b_if = self.ifs[(0, pair)], self.ifs[(1, pair)]
                sh("ip", "link", "add", a_if, "netns", self.ns[0], "type", "veth", "peer",
                    "name", b_if, "netns", self.ns[1])
                for side, ifn in ((0, a_if), (1, b_if)):
                    sh("ip", "-n", self.ns[side], "addr", "add",
                        f"10.77.{pair}.{side + 1}/24", "dev", ifn)
                    sh("ip", "-n", self.ns[side], "link", "set", ifn, "up")
            for side in (0, 1):
                sh("tc", "-n", self.ns[side], "qdisc", "add", "dev", self.ifs[(side, 2)],
                    "root", "tbf", *self.FAST.split())
                self.shapers.append(subprocess.Popen(
                    ["tc", "-n", self.ns[side], "-force", "-batch", "-"], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1))
        except BaseException:
            self.__exit__()
            raise
        return self

    def side_of(self, rank: int) -> int:
        """The namespace (0: DP replica 0, 1: replica 1) of ``rank``."""
        return coords(rank)[2]

    def spec(self) -> dict[str, Any]:
        ranks = {}
        for r in range(WORLD):
            side = self.side_of(r)
            pair = 2 if r in (self.a, self.b) else 1
            ranks[r] = (self.ns[side], self.ifs[(side, pair)])
        return {"ranks": ranks, "master": "10.77.1.1"}

    def trigger(self, side: int) -> None:
        """Limit the slow pair's end in namespace ``side`` to ``rate_mbit`` and check that
        the kernel took it (``tc qdisc show`` prints the new rate)."""
        limit(self.shapers[side], self.ifs[(side, 2)], self.rate_mbit)

    def slow_down(self) -> None:
        for side in (0, 1):
            self.trigger(side)

    def __exit__(self, *exc: object) -> None:
        release(self.shapers, self.created)


def _publish_plan(plan: Any, m: list[int], progress: Any) -> None:
    """Hand a new S2 allocation ``m`` to the ranks, effective two iterations after the most
    advanced rank's current one: no rank has started that iteration yet (it would have to
    finish a whole iteration, collectives included, while this runs), so every rank of a
    replica switches at the same iteration."""
    with plan.get_lock():
        if list(plan[1:]) == list(m):
            return
        if plan[0] >= 0 and min(progress[:]) <= plan[0]:
            return  # the previous allocation is not in force on every rank yet: next time
        plan[0] = max(progress[:]) + 2
        for i, v in enumerate(m):
            plan[1 + i] = int(v)


def _parse_fault(text: str | None, n: int) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = [int(v) for v in text.split(":")]
    return tuple(parts + [0] * (n - len(parts)))


#: bytes of the per-iteration all-reduce over every rank in a mesh job (``--mesh``)
WORLD_BYTES = 256 << 10
#: communicators of the job: 4 tp, 4 pp, 4 dp and the world
COMMS = 13


def mesh_nodes(rank: int) -> int:
    """The emulated node of ``rank`` in a mesh job: one per TP pair (as TP stays in a node)."""
    return rank // TP


def run(out: str | Path, *, iters: int = 12, microbatches: int = 4, hidden: int = 128,
        ffn: int = 512, batch: int = 32, straggler: str | None = None, hang: str | None = None,
        advice: str | None = None, stall_s: float = 6.0, timeout_s: float = 120.0,
        job: str = "example", slow_link: str | None = None,
        probes: float | str | None = None, mesh: bool = False,
        slow_hop: str | None = None, force_every: float | None = None,
        engine: bool = False) -> dict[str, Any]:
    """Run the job, then the agent over its rings; returns a summary (``hung``, times).
    ``probes``: the agent runs a validation probe every that many seconds, or (``"engine"``)
    those the live engine asks for (:mod:`examples.probing`). ``mesh``: four emulated nodes
    (:mod:`examples.netns_mesh`) and an all-reduce over every rank each iteration;
    ``slow_hop`` ``A:B:MBIT[:FROM_ITER]`` (implies ``mesh``): that ring hop is slow.
    ``force_every``: with the engine, also a probe every that many seconds. ``engine``: the
    live engine runs without probes (the job's probes off)."""
    import torch.optim  # noqa: F401 -- imported once here, shared by the forked ranks

    with contextlib.suppress(ImportError):
        import torch._dynamo  # noqa: F401 -- slow to import (seconds) in each rank otherwise

    link: Any = None
    link_from = 0
    if slow_link and slow_hop:
        raise ValueError("--slow-link and --slow-hop are two topologies: give one")
    if slow_link:  # A:B:MBIT[:FROM_ITER]
        a, b, ms, *rest = (int(v) for v in slow_link.split(":"))
        link = SlowLink(a, b, ms)
        link_from = rest[0] if rest else 0
    elif mesh or slow_hop:
        from examples.netns_mesh import Mesh

        hop = None
        if slow_hop:
            a, b, rate, *rest = (int(v) for v in slow_hop.split(":"))
            hop = (a, b, float(rate))
            link_from = rest[0] if rest else 0
        link = Mesh(WORLD // TP, [mesh_nodes(r) for r in range(WORLD)], hop)
    if link is not None:
        link.__enter__()
        if link_from == 0 and (slow_link or slow_hop):
            link.slow_down()
    try:
        return _run(out, iters=iters, microbatches=microbatches, hidden=hidden, ffn=ffn,
                    batch=batch, straggler=straggler, hang=hang, advice=advice,
                    stall_s=stall_s, timeout_s=timeout_s, job=job, link=link,
                    link_from=link_from, probes=probes,
                    world_bytes=WORLD_BYTES if mesh or slow_hop else 0,
                    force_every=force_every, engine=engine)
    finally:
        if link:
            link.__exit__()


def _run(out: str | Path, *, iters: int, microbatches: int, hidden: int, ffn: int, batch: int,
         straggler: str | None, hang: str | None, advice: str | None, stall_s: float,
         timeout_s: float, job: str, link: Any, link_from: int,
         probes: float | str | None = None, world_bytes: int = 0,
         force_every: float | None = None, engine: bool = False) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from failslow.collectors.agent import Agent, TraceDirSink
    from failslow.collectors.mitigation_client import MicrobatchClient

    out = Path(out)
    base = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None
    ring_dir = Path(tempfile.mkdtemp(prefix="failslow-example-", dir=base))
    spec = link.spec() if link else None
    port = _free_port()
    cfg = {"port": port, "job": job, "ring_dir": str(ring_dir), "iters": iters,
           "microbatches": microbatches, "hidden": hidden, "ffn": ffn, "batch": batch,
           "straggler": _parse_fault(straggler, 3), "hang": _parse_fault(hang, 2),
           "advice": advice, "netns": spec, "link_from": link_from,
           "link": link if link and link_from else None,  # fork: passed as is, not pickled
           "world_bytes": world_bytes}
    ctx = mp.get_context("fork")
    progress = ctx.Array("i", WORLD)
    plan = ctx.Array("i", [-1] + [microbatches] * DP)
    client = MicrobatchClient(advice, dp_rank=0, dp_size=DP,
                              total=microbatches * DP) if advice else None
    procs = [ctx.Process(target=_worker, args=(r, cfg, progress, plan), daemon=True)
             for r in range(WORLD)]
    # the node agent runs beside the job, as in production: it drains the rings while the
    # ranks write them (the trace directory is written when it closes)
    # with network namespaces, they are the job's "nodes"
    rank_nodes = {r: spec["ranks"][r][0] for r in range(WORLD)} if spec else None
    agent = Agent(TraceDirSink(out), ring_dir, job=job, collectors={"gpu": False, "rdma": False},
                  degrees={"tp": TP, "pp": PP, "dp": DP}, microbatches=microbatches,
                  schedule="1f1b", rank_nodes=rank_nodes)
    live = None
    if probes == "engine" or engine:
        from examples.engine_loop import LiveEngine

        live = LiveEngine(job, COMMS, WORLD, probes=probes == "engine")
    if probes is not None:  # as ``failslow agent --probes``; requests: examples.probing
        from examples import probing

        if live is not None:
            agent.probes = probing.engine_service(job, live.requests, link,
                                                  port + 1, force_every, WORLD,
                                                  TP * PP)
        else:
            agent.probes = probing.service(job, WORLD, TP * PP, float(probes), link,
                                           port + 1)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    children_cpu0 = usage.ru_utime + usage.ru_stime
    cpu0 = time.process_time()  # the driver: agent, probe service, live engine
    for p in procs:
        p.start()
    hung, last, last_change = False, -1, time.monotonic()
    t0 = time.monotonic()
    progress_file = out.parent / (out.name + ".progress")
    try:
        while any(p.is_alive() for p in procs):
            s = sum(progress[:])
            now = time.monotonic()
            if s != last:
                last, last_change = s, now
                tmp = progress_file.with_name(progress_file.name + ".tmp")
                tmp.write_text(str(min(progress[:])))
                tmp.replace(progress_file)  # atomic: a reader never sees it empty
            elif (last > 0 and now - last_change > stall_s) or now - t0 > timeout_s:
                hung = True
                break
            if any(p.exitcode not in (None, 0) for p in procs):
                break
            if client is not None:
                _publish_plan(plan, client.refresh(), progress)
            _poll_once(agent, live, job)
            time.sleep(0.1)
    except BaseException:
        shutil.rmtree(ring_dir, ignore_errors=True)
        raise
    finally:  # never leave ranks behind (e.g. a tc error)
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)  # type: ignore[arg-type]
            p.join()
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    ranks_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    ranks_cpu_s = ranks_cpu.ru_utime + ranks_cpu.ru_stime - children_cpu0
    diagnosis = None
    # the rows still in the rings, the probes still running (each has a row in the trace
    # and in the counts)
    deadline = time.monotonic() + 5.0
    _poll_once(agent, live, job)
    if agent.probes is not None:
        agent.probes.stop_requests()
    while agent.probes is not None and not agent.probes.idle() \
            and time.monotonic() < deadline:
        time.sleep(0.05)
        _poll_once(agent, live, job)
    _poll_once(agent, live, job)
    if live is not None:
        d = live.diagnosis()
        diagnosis = None if d is None else d.to_dict()
        live.close()
    agent.close()  # drains what is left; rings of the (dead) ranks are removed
    driver_cpu_s = time.process_time() - cpu0
    probe_counts = None if agent.probes is None else dict(agent.probes.runner.counts)
    if hung:  # a snapshot of a job that stopped making progress (failslow analyze semantics)
        (out / "import.json").write_text(json.dumps({"post_mortem": True,
                                                     "source": "examples.hybrid_job"}))
    times, starts = {}, {}
    for r in range(WORLD):
        f = ring_dir / f"times-{r}.json"
        if f.exists():
            times[r] = json.loads(f.read_text())
            starts[r] = json.loads((ring_dir / f"starts-{r}.json").read_text())
    shutil.rmtree(ring_dir, ignore_errors=True)
    progress_file.unlink(missing_ok=True)
    (out / "iteration_times.json").write_text(json.dumps(times))
    return {"hung": hung, "failed": [] if hung else failed, "times": times, "starts": starts,
            "records": agent.stats["records"], "wall_s": time.monotonic() - t0,
            "probes": probe_counts, "diagnosis": diagnosis,
            "driver_cpu_s": round(driver_cpu_s, 4), "ranks_cpu_s": round(ranks_cpu_s, 4)}


def _poll_once(agent: Any, engine: Any, job: str) -> None:
    """One pass of the driver's agent: drain the rings; the probe service sees the new
    ``coll`` rows (busy ranks), takes new requests and returns finished ``probe`` rows; the
    live engine (if any) gets both."""
    batches = agent.drain()
    if agent.probes is not None:
        made = agent.probes.poll(batches)
        for j, b in made:
            agent.add(j, b)
        batches += made
    if engine is not None:
        engine.feed(lambda: agent.meta(job), batches)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--straggler", help="RANK:MS[:FROM_ITER] sleep in every forward")
    ap.add_argument("--hang", help="RANK:ITER: that rank stops (SIGSTOP) at that iteration")
    ap.add_argument("--advice", help="S2 advice file or http://127.0.0.1:PORT/ URL "
                    "(progress: the lowest finished iteration is kept in OUT.progress)")
    ap.add_argument("--slow-link", help="A:B:MBIT[:FROM_ITER]: netns + tc rate limit on link A-B "
                    "(root; A in DP replica 0, B in replica 1)")
    ap.add_argument("--mesh", action="store_true",
                    help="four emulated nodes (netns, one per TP pair) in a veth mesh, and an "
                    "all-reduce over every rank each iteration (root)")
    ap.add_argument("--slow-hop", help="A:B:MBIT[:FROM_ITER]: --mesh, and tc limits the node "
                    "pair of ring hop A -> B of the world all-reduce (e.g. 3:4, 7:0)")
    ap.add_argument("--engine", action="store_true",
                    help="run the live engine beside the job (its diagnosis in the summary)")
    ap.add_argument("--force-every", type=float, metavar="SECONDS",
                    help="with --probes engine: also force a probe every SECONDS")
    ap.add_argument("--stall-s", type=float, default=6.0)
    ap.add_argument("--probes", metavar="SECONDS|engine",
                    help="the node agent runs a validation probe every SECONDS (gemm, p2p; "
                    "rate-limited as failslow agent --probes), or those the live engine "
                    "asks for ('engine'); examples/probing.py")
    a = ap.parse_args(argv)
    probes: float | str | None = a.probes
    if a.probes is not None and a.probes != "engine":
        try:
            probes = float(a.probes)
        except ValueError:
            ap.error("--probes: SECONDS or 'engine'")
    summary = run(a.out, iters=a.iters, microbatches=a.microbatches, straggler=a.straggler,
                  hang=a.hang, advice=a.advice, stall_s=a.stall_s, slow_link=a.slow_link,
                  probes=probes, mesh=a.mesh, slow_hop=a.slow_hop, force_every=a.force_every,
                  engine=a.engine)
    summary.pop("times")
    summary.pop("starts")
    print(json.dumps(summary))
    return 0 if not summary["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
