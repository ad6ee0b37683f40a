"""A tiny event-driven training-job generator for the detector tests (not the project's
simulator): TP collectives inside forward/backward compute, 1F1B pipeline send/recv, a DP
all-reduce per iteration; compute stragglers and slow links injected per iteration range.
Sends are non-blocking, receives and collectives block; a collective ends when its last
member has entered plus its transfer time. Python loops are fine here: it is test data."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from failslow import events
from failslow.events import Comm, JobMeta

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


@dataclass
class Fault:
    kind: str  # "compute" or "link"
    start_iter: int
    end_iter: int | None = None
    factor: float = 1.5
    rank: int = 0
    link: tuple[int, int] = (0, 0)
    phase: str = "both"  # compute: "forward", "backward" or "both"


@dataclass
class Job:
    meta: JobMeta
    tables: dict[str, pa.Table]
    iter_start: dict[int, list[int]] = field(default_factory=dict)  # rank -> start times
    true_iter_ns: list[int] = field(default_factory=list)
    fault_start_ns: list[int] = field(default_factory=list)
    fault_end_ns: list[int | None] = field(default_factory=list)


def rank_of(tp_i: int, dp_i: int, pp_i: int, tp: int, dp: int) -> int:
    return tp_i + tp * (dp_i + dp * pp_i)


def generate(tp: int = 2, pp: int = 2, dp: int = 2, microbatches: int = 4, layers: int = 2,
             iterations: int = 30, faults: list[Fault] | None = None, jitter: float = 0.02,
             seed: int = 0, skew_ns: int = 0, ranks_per_node: int = 4,
             fwd_ms: float = 4.0, bwd_ms: float = 8.0, opt_ms: float = 6.0,
             tp_ms: float = 0.3, pp_ms: float = 0.4, dp_ms: float = 5.0,
             job: str = "synth", shuffle: bool = False) -> Job:
    rng = random.Random(seed)
    faults = faults or []
    world = tp * pp * dp
    comm_ids: dict[tuple[str, int, int], int] = {}

    def cid(kind: str, a: int, b: int) -> int:
        key = (kind, a, b)
        if key not in comm_ids:
            comm_ids[key] = rng.getrandbits(64) | (1 << 63)  # exercise the top bit
        return comm_ids[key]

    comms: list[Comm] = []
    member: dict[int, dict[str, tuple[int, int]]] = {r: {} for r in range(world)}
    for p in range(pp):
        for d in range(dp):
            ranks = tuple(rank_of(i, d, p, tp, dp) for i in range(tp))
            if tp > 1:
                comms.append(Comm(cid("tp", p, d), "tp", ranks))
            for i, r in enumerate(ranks):
                member[r]["tp"] = (cid("tp", p, d), i)
        for i in range(tp):
            ranks = tuple(rank_of(i, d, p, tp, dp) for d in range(dp))
            if dp > 1:
                comms.append(Comm(cid("dp", p, i), "dp", ranks))
            for d, r in enumerate(ranks):
                member[r]["dp"] = (cid("dp", p, i), d)
    for d in range(dp):
        for i in range(tp):
            ranks = tuple(rank_of(i, d, p, tp, dp) for p in range(pp))
            if pp > 1:
                comms.append(Comm(cid("pp", d, i), "pp", ranks))
            for p, r in enumerate(ranks):
                member[r]["pp"] = (cid("pp", d, i), p)
    comm_ranks = {c.comm: c.ranks for c in comms}
    nodes = {r: f"node{r // ranks_per_node}" for r in range(world)}
    meta = JobMeta(job=job, t=T0, world_size=world, tp=tp, pp=pp, dp=dp, cp=1,
                   microbatches=microbatches, schedule="1f1b", nodes=nodes, comms=tuple(comms))

    # programs: ("c", ms, phase) compute, ("coll", kind, op, bytes), ("send"/"recv", mb, dir)
    def program(r: int) -> list[tuple[Any, ...]]:
        s = r // (tp * dp)
        prog: list[tuple[Any, ...]] = []

        def fwd() -> None:
            if s > 0:
                prog.append(("recv", -1, 1 << 20))
            for _ in range(layers):
                prog.append(("c", fwd_ms / (2 * layers), "forward"))
                if tp > 1:
                    prog.append(("coll", "tp", "allreduce", 1 << 22, tp_ms))
                prog.append(("c", fwd_ms / (2 * layers), "forward"))
                if tp > 1:
                    prog.append(("coll", "tp", "allreduce", 1 << 22, tp_ms))
            if s < pp - 1:
                prog.append(("send", +1, 1 << 20))

        def bwd() -> None:
            if s < pp - 1:
                prog.append(("recv", +1, 1 << 20))
            for _ in range(layers):
                prog.append(("c", bwd_ms / (2 * layers), "backward"))
                if tp > 1:
                    prog.append(("coll", "tp", "allreduce", 1 << 22, tp_ms))
                prog.append(("c", bwd_ms / (2 * layers), "backward"))
                if tp > 1:
                    prog.append(("coll", "tp", "allreduce", 1 << 22, tp_ms))
            if s > 0:
                prog.append(("send", -1, 1 << 20))

        for _ in range(iterations):
            prog.append(("iter",))
            warm = min(pp - s - 1, microbatches)
            for _ in range(warm):
                fwd()
            for _ in range(microbatches - warm):
                fwd()
                bwd()
            for _ in range(warm):
                bwd()
            if dp > 1:
                prog.append(("coll", "dp", "allreduce", 1 << 26, dp_ms))
            prog.append(("c", opt_ms, "other"))
        prog.append(("iter",))
        return prog

    progs = {r: program(r) for r in range(world)}
    pc = dict.fromkeys(range(world), 0)
    clock = {r: T0 + rng.randrange(0, 200_000) for r in range(world)}
    it = dict.fromkeys(range(world), -1)
    seqs: dict[tuple[int, int], int] = {}
    iter_start: dict[int, list[int]] = {r: [] for r in range(world)}
    rows: list[dict[str, Any]] = []
    coll_enter: dict[tuple[int, int], dict[int, int]] = {}
    coll_done: dict[tuple[int, int], int] = {}
    entered: dict[int, tuple[int, int] | None] = dict.fromkeys(range(world))
    sends: dict[tuple[int, int, int], list[tuple[int, int, int, int]]] = {}
    recvs: dict[tuple[int, int, int], int] = {}  # matched count per (comm, src, dst)

    def link_factor(ranks: tuple[int, ...], i: int) -> float:
        f = 1.0
        for fl in faults:
            if (fl.kind == "link" and fl.start_iter <= i < (fl.end_iter or 1 << 30)
                    and fl.link[0] in ranks and fl.link[1] in ranks):
                f *= fl.factor
        return f

    def next_seq(comm: int, r: int) -> int:
        s = seqs.get((comm, r), 0)
        seqs[(comm, r)] = s + 1
        return s

    def emit(r: int, comm: int, cr: int, size: int, seq: int, op: str, nbytes: int,
             peer: int, t_enter: int, t_start: int, t_end: int) -> None:
        base = {"job": job, "rank": r, "comm": comm, "comm_rank": cr, "comm_size": size,
                "seq": seq, "op": op, "bytes": nbytes, "peer": peer}
        rows.append({**base, "phase": "enter", "t": t_enter})
        rows.append({**base, "phase": "end", "t": t_end, "t_start": t_start,
                     "send_count": 8, "recv_count": 8})

    done = 0
    while done < world:
        progressed = False
        done = 0
        for r in range(world):
            prog = progs[r]
            while pc[r] < len(prog):
                ins = prog[pc[r]]
                if ins[0] == "iter":
                    it[r] += 1
                    iter_start[r].append(clock[r])
                    pc[r] += 1
                elif ins[0] == "c":
                    f = 1.0
                    for fl in faults:
                        if (fl.kind == "compute" and fl.rank == r and fl.start_iter <= it[r]
                                < (fl.end_iter or 1 << 30) and fl.phase in ("both", ins[2])):
                            f *= fl.factor
                    noise = 1 + rng.uniform(-jitter, jitter)
                    clock[r] += int(ins[1] * MS * f * noise)
                    pc[r] += 1
                elif ins[0] == "coll":
                    comm, cr = member[r][ins[1]]
                    if entered[r] is None:
                        seq = next_seq(comm, r)
                        clock[r] += 20_000
                        coll_enter.setdefault((comm, seq), {})[r] = clock[r]
                        entered[r] = (comm, seq)
                    key = entered[r]
                    assert key is not None
                    ranks = comm_ranks[comm]
                    ent = coll_enter[key]
                    if key not in coll_done and len(ent) == len(ranks):
                        lf = link_factor(ranks, it[r])
                        coll_done[key] = max(ent.values()) + int(
                            ins[4] * MS * lf * (1 + rng.uniform(-jitter, jitter)))
                    if key in coll_done:
                        t_start = max(ent.values())
                        t_end = coll_done[key] + rng.randrange(0, 20_000)
                        emit(r, comm, cr, len(ranks), key[1], ins[2], ins[3], -1, ent[r],
                             t_start, t_end)
                        clock[r] = t_end
                        entered[r] = None
                        pc[r] += 1
                    else:
                        break
                elif ins[0] == "send":
                    comm, cr = member[r]["pp"]
                    dst = cr + ins[1]
                    seq = next_seq(comm, r)
                    clock[r] += 20_000
                    sends.setdefault((comm, cr, dst), []).append((r, seq, clock[r], ins[2]))
                    pc[r] += 1
                elif ins[0] == "recv":
                    comm, cr = member[r]["pp"]
                    src = cr + ins[1]
                    if entered[r] is None:
                        seq = next_seq(comm, r)
                        clock[r] += 20_000
                        entered[r] = (seq, clock[r])
                    seq, t_in = entered[r]
                    k = recvs.get((comm, src, cr), 0)
                    queue = sends.get((comm, src, cr), [])
                    if len(queue) > k:
                        s_rank, s_seq, s_t, nbytes = queue[k]
                        lf = link_factor((s_rank, r), it[r])
                        t_start = max(s_t, t_in)
                        t_end = t_start + int(ins[2] / (1 << 20) * pp_ms * MS * lf)
                        size = len(comm_ranks[comm])
                        emit(s_rank, comm, src, size, s_seq, "send", nbytes, cr, s_t, t_start,
                             t_end + rng.randrange(0, 10_000))
                        emit(r, comm, cr, size, seq, "recv", nbytes, src, t_in, t_start, t_end)
                        recvs[(comm, src, cr)] = k + 1
                        clock[r] = t_end
                        entered[r] = None
                        pc[r] += 1
                    else:
                        break
                progressed = True
            if pc[r] >= len(prog):
                done += 1
        if not progressed and done < world:
            raise RuntimeError("synthetic schedule deadlocked")

    offsets = {r: (hash(nodes[r]) % 1000) * skew_ns // 1000 if skew_ns else 0
               for r in range(world)}
    for row in rows:
        off = offsets[row["rank"]]
        row["t"] += off
        if row.get("t_start") is not None:
            row["t_start"] += off
    if shuffle:
        rng.shuffle(rows)
    coll = events.from_rows("coll", rows)
    # true iteration time: rank 0's iteration starts
    starts = iter_start[0]
    true_iter = [b - a for a, b in zip(starts[:-1], starts[1:], strict=False)]
    fstart: list[int] = []
    fend: list[int | None] = []
    for fl in faults:
        r = fl.rank if fl.kind == "compute" else fl.link[0]
        fstart.append(iter_start[r][fl.start_iter])
        fend.append(iter_start[r][fl.end_iter] if fl.end_iter is not None else None)
    return Job(meta, {"coll": coll}, iter_start, true_iter, fstart, fend)


#: Three jobs for the tests of evidence reducers sharing a job (tp, pp, dp, fault): a
#: pipeline job with a compute straggler, one with a slow link across stages, and a pure
#: data-parallel job (its DP rings cross every shard).
SHARD_JOBS = {
    "pipeline-compute": (2, 4, 2, Fault("compute", 12, factor=1.6, rank=5)),
    "pipeline-link": (2, 2, 4, Fault("link", 12, factor=3.0, link=(3, 11))),
    "pure-dp": (1, 1, 8, Fault("compute", 12, factor=1.8, rank=6)),
}


def shard_job(name: str, seed: int) -> Job:
    """The job ``name`` of :data:`SHARD_JOBS`, 28 iterations."""
    tp, pp, dp, fault = SHARD_JOBS[name]
    return generate(tp=tp, pp=pp, dp=dp, iterations=28, faults=[fault], seed=seed)
