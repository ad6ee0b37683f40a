"""Benchmark of the native collectors: ``failslow bench collector``.

Figures (the floors come from the collectors' design goals, MegaTrace §III-B: near-zero
overhead API interception and WR measurement; CCL-D §5.2: host-driven measurement):

- ``added_ns_per_call``: what the LD_PRELOAD interposer adds to one ``ncclAllReduce`` call,
  measured by the C driver ``drv_nccl bench`` (a tight loop of calls to the stub libnccl) run
  with and without ``LD_PRELOAD`` -- best of a few runs each, ring on tmpfs and large enough not
  to fill (a full ring only counts a drop, which is cheaper). Floor: under 100 ns. Also with
  completion tracking (``..._with_completion``: host function per call, stub libcudart running
  it inline) and the ratio to the bare call.
- ``syscalls_per_call``: the marginal number of system calls per intercepted call, counted with
  ``strace -f -c`` at two call counts N and 2N (so one-time setup cancels out); ``fixed_syscalls``
  is the one-time cost (ring creation, library lookups). Without strace: reported unavailable.
- ``drain_records_per_s``: records per second drained by the Python :class:`RingReader` from a
  full ring (vectorized commit check + bulk copy + release). Floor: 10 million/s.
  ``convert_records_per_s``: records per second through :func:`to_tables` to contract tables.
- ``agent_cpu_percent`` (issue 7 item 5): CPU use of the node agent (its process's CPU seconds
  per wall second, in % of one core) while it drains 8 ranks calling ``ncclAllReduce`` 10,000
  times a second each through the real interposer on the stub libnccl (``drv_nccl paced``; a
  call writes an ``enter`` and an ``end`` record: 160,000 records/s), converts them to contract
  tables and publishes them on the embedded transport (Arrow IPC messages) -- the agent of
  MegaTrace §III-B / CCL-D §5 at a busy node's call rate. With ``agent_records_per_s`` (drained
  during the window), ``agent_expected_records_per_s`` and ``agent_drops`` (records the rings
  dropped because the agent fell behind).

The native libraries, stubs and drivers are built by :mod:`failslow.collectors.native_build`
(which the tests use too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from failslow.collectors import ring
from failslow.collectors.native_build import NativeBuildError, build_native, driver_env
from failslow.settings import environment

__all__ = ["BENCHMARKS", "bench_collector", "count_syscalls", "measure_agent_cpu",
           "measure_drain"]

#: Call counts of the C benchmark (per run) and of the strace runs.
CALLS = 200_000
STRACE_CALLS = 20_000
#: The agent CPU benchmark: ranks, intercepted calls per second per rank, measured seconds.
AGENT_RANKS = 8
AGENT_RATE = 10_000
AGENT_SECONDS = 4.0


def _shm_dir() -> Path:
    """A scratch directory on tmpfs (the ring must live on tmpfs, see failslow_ring.h)."""
    base = Path("/dev/shm")
    if base.is_dir() and os.access(base, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="failslow-bench-", dir=base))
    return Path(tempfile.mkdtemp(prefix="failslow-bench-"))


def _run_json(cmd: list[str], env: Mapping[str, str]) -> dict[str, Any]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(env), check=False,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _ns_per_call(build: Path, *, preload: bool, completion: bool, ring_dir: Path, calls: int,
                 repeats: int) -> float:
    driver = build / ("drv_nccl" if completion else "drv_nccl_nocuda")
    env = dict(environment(), FAILSLOW_RING_DIR=str(ring_dir), FAILSLOW_JOB="bench",
               FAILSLOW_RING_CAPACITY=str(4 * calls), STUB_CUDA_INLINE="1")
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = str(build / "libfailslow_nccl.so")
    best = float("inf")
    for _ in range(repeats):
        best = min(best, float(_run_json([str(driver), "bench", str(calls)], env)["ns_per_call"]))
        for f in ring_dir.glob("failslow-*.ring"):
            f.unlink()
    return best


_STRACE_TOTAL = re.compile(r"^\s*100\.00\s+\S+\s+\S+\s+(\d+)\s+(?:\d+\s+)?total\s*$", re.M)


def _strace_total(build: Path, ring_dir: Path, calls: int, preload: bool) -> int:
    out = ring_dir / "strace.txt"
    env = dict(environment(), FAILSLOW_RING_DIR=str(ring_dir), FAILSLOW_JOB="bench",
               FAILSLOW_RING_CAPACITY=str(4 * calls))
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = str(build / "libfailslow_nccl.so")
    cmd = ["strace", "-f", "-c", "-o", str(out), str(build / "drv_nccl_nocuda"), "bench",
           str(calls)]
    subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=120)
    m = _STRACE_TOTAL.search(out.read_text())
    for f in ring_dir.glob("failslow-*.ring"):
        f.unlink()
    if not m:
        raise RuntimeError(f"cannot parse strace summary in {out}")
    return int(m.group(1))


def count_syscalls(build: Path, ring_dir: Path, calls: int = STRACE_CALLS) -> dict[str, Any]:
    """Marginal system calls per intercepted call (strace at N and 2N calls)."""
    if shutil.which("strace") is None:
        return {"syscalls_per_call": None, "syscall_method": "unavailable (no strace)"}
    try:
        n1 = _strace_total(build, ring_dir, calls, True)
        n2 = _strace_total(build, ring_dir, 2 * calls, True)
        base = _strace_total(build, ring_dir, calls, False)
    except (subprocess.CalledProcessError, RuntimeError, OSError) as e:
        return {"syscalls_per_call": None, "syscall_method": f"unavailable ({e})"}
    return {
        "syscalls_per_call": (n2 - n1) / calls,
        "fixed_syscalls": n1 - base - (n2 - n1),
        "syscall_method": f"strace -f -c, marginal between {calls} and {2 * calls} calls",
    }


def _synthetic_records(n: int) -> np.ndarray:
    rng = np.random.default_rng(7)
    recs = ring.empty_records(n)
    recs["kind"] = ring.KIND_COLL
    recs["op"] = rng.integers(0, 8, n)
    recs["phase"] = np.arange(n) % 2
    recs["rank"] = 3
    recs["comm_rank"], recs["comm_size"], recs["peer"] = 1, 8, -1
    recs["comm"] = rng.integers(0, 2**63, n, dtype=np.uint64)
    recs["seq"] = np.arange(n) // 2
    recs["bytes"] = 1 << 20
    recs["t_ns"] = 1_700_000_000_000_000_000 + np.arange(n) * 1000
    recs["t_start_ns"] = ring.events.NULL_TIME
    recs["send_count"] = ring.events.NULL_COUNT
    recs["recv_count"] = ring.events.NULL_COUNT
    return recs


def measure_drain(ring_dir: Path, capacity: int = 1 << 18, rounds: int = 8,
                  order: ring.MemoryOrder | None = None) -> dict[str, float]:
    """Python reader drain rate on a full ring, and the conversion rate to contract tables.
    ``order``: the reader's and writer's fences (default: this machine's)."""
    path = ring_dir / "failslow-bench-0-py.ring"
    writer = ring.RingWriter(path, capacity, job="bench", rank=3, order=order)
    recs = _synthetic_records(writer.capacity)
    total, elapsed = 0, 0.0
    try:
        with ring.RingReader(path, order=order) as reader:
            for _ in range(rounds):
                writer.write(recs)
                t0 = time.perf_counter()
                got = reader.drain()
                elapsed += time.perf_counter() - t0
                total += len(got)
            reader.tables(got[:1000], node="n0")  # warm-up (pyarrow's lazy imports)
            t0 = time.perf_counter()
            tables = reader.tables(got, node="n0")
            convert = time.perf_counter() - t0
    finally:
        writer.close()
        path.unlink(missing_ok=True)
    return {"drain_records_per_s": total / elapsed if elapsed else float("inf"),
            "convert_records_per_s": len(got) / convert if convert else float("inf"),
            "converted_rows": float(tables["coll"].num_rows)}


def _agent_process(ring_dir: str, seconds: float, interval_s: float, conn: Any) -> None:
    """The agent's process (forked, imports done): drain for ``seconds`` and report its own
    CPU and wall time."""
    from failslow.collectors.agent import Agent, TransportSink, run_agent
    from failslow.stream.transport import InProcessTransport

    try:
        agent = Agent(TransportSink(InProcessTransport(subscribe=())), ring_dir,
                      collectors={"gpu": False, "rdma": False}, remove_dead=False)
        c0, w0 = time.process_time(), time.perf_counter()
        run_agent(agent, interval_s=interval_s, duration_s=seconds)
        conn.send({"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0,
                   "records": agent.stats["records"]})
    except Exception as e:  # reported by the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def measure_agent_cpu(build: Path, ring_dir: Path, *, ranks: int = AGENT_RANKS,
                      rate: int = AGENT_RATE, seconds: float = AGENT_SECONDS,
                      interval_s: float = 0.1) -> dict[str, Any]:
    """CPU use of the node agent draining ``ranks`` processes that each make ``rate``
    intercepted NCCL calls a second (``drv_nccl paced`` through ``libfailslow_nccl.so`` and
    the stub libnccl/libcudart: two records per call). The agent runs in its own process for
    ``seconds`` (started once every rank's ring exists; the ranks keep calling past its end);
    its CPU seconds over wall seconds is ``agent_cpu_percent`` (100 = one core)."""
    import multiprocessing as mp

    ring_dir.mkdir(parents=True, exist_ok=True)
    producers = []
    try:
        for rank in range(ranks):
            env = driver_env(build, ring_dir, preload="libfailslow_nccl.so", job="agentbench",
                             RANK=str(rank), WORLD_SIZE=str(ranks), STUB_CUDA_INLINE="1",
                             FAILSLOW_RING_CAPACITY=str(1 << 16))
            producers.append(subprocess.Popen(
                [str(build / "drv_nccl"), "paced", str(rate), str(seconds + 2.0)], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 10
        while len(ring.find_rings(ring_dir)) < ranks and time.monotonic() < deadline:
            time.sleep(0.01)
        found = len(ring.find_rings(ring_dir))
        if found < ranks:
            raise RuntimeError(f"only {found} of {ranks} rings appeared")
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        agent = ctx.Process(target=_agent_process, args=(str(ring_dir), seconds, interval_s,
                                                         child))
        agent.start()
        child.close()
        got: dict[str, Any] = parent.recv() if parent.poll(seconds + 60) else {"error": "timeout"}
        dropped = 0  # read at once: the ranks go on writing after the agent's window
        for path in ring.find_rings(ring_dir):
            with ring.RingReader(path) as r:
                dropped += r.dropped
        agent.join(timeout=10)
        if "error" in got:
            raise RuntimeError(f"agent: {got['error']}")
        for p in producers:
            p.wait(timeout=60)
    finally:
        for p in producers:
            if p.poll() is None:
                p.kill()
                p.wait()
    return {
        "agent_cpu_percent": round(100.0 * got["cpu_s"] / got["wall_s"], 2),
        "agent_cpu_s": round(got["cpu_s"], 3),
        "agent_wall_s": round(got["wall_s"], 3),
        "agent_records_per_s": round(got["records"] / got["wall_s"]),
        "agent_expected_records_per_s": 2 * ranks * rate,
        "agent_drops": int(dropped),
        "agent_method": f"{ranks} x drv_nccl paced {rate}/s through libfailslow_nccl.so "
                        f"(enter + end per call), agent process {seconds:g} s, poll every "
                        f"{interval_s:g} s, embedded transport",
    }


def bench_collector(args: argparse.Namespace) -> dict[str, Any]:
    """``failslow bench collector``: overhead of the native interposer and the reader's speed."""
    calls = int(getattr(args, "calls", None) or CALLS)
    repeats = int(getattr(args, "repeats", None) or 3)
    ring_dir = _shm_dir()
    figures: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="failslow-native-") as tmp:
            try:
                build = build_native(Path(tmp) / "build")
            except NativeBuildError as e:
                figures["native_error"] = str(e).splitlines()[0]
            else:
                direct = _ns_per_call(build, preload=False, completion=False, ring_dir=ring_dir,
                                      calls=calls, repeats=repeats)
                shim = _ns_per_call(build, preload=True, completion=False, ring_dir=ring_dir,
                                    calls=calls, repeats=repeats)
                shim_c = _ns_per_call(build, preload=True, completion=True, ring_dir=ring_dir,
                                      calls=calls, repeats=repeats)
                figures.update({
                    "added_ns_per_call": round(shim - direct, 1),
                    "added_ns_per_call_with_completion": round(shim_c - direct, 1),
                    "direct_ns_per_call": round(direct, 1),
                    "shim_ns_per_call": round(shim, 1),
                    "shim_to_direct_ratio": round(shim / direct, 2) if direct else None,
                    "ring_dir_tmpfs": str(ring_dir).startswith("/dev/shm"),
                    "call_method": f"drv_nccl bench {calls} calls, best of {repeats}, "
                                   "with vs without LD_PRELOAD",
                })
                figures.update(count_syscalls(build, ring_dir))
                try:
                    figures.update(measure_agent_cpu(build, ring_dir / "agent"))
                except (RuntimeError, OSError, subprocess.SubprocessError) as e:
                    figures["agent_error"] = str(e).splitlines()[0]
                # the reader as on machines without TSO: fences from libfailslow_ring.so
                fenced = ring.memory_order("aarch64", str(build / "libfailslow_ring.so"))
                figures["drain_records_per_s_fenced"] = round(
                    measure_drain(ring_dir, order=fenced)["drain_records_per_s"])
        figures.update({k: round(v) for k, v in measure_drain(ring_dir).items()})
    finally:
        shutil.rmtree(ring_dir, ignore_errors=True)
    return figures


BENCHMARKS = {"collector": bench_collector}
