"""Event-contract tables of one generated job (``meta``, ``coll``, ``progress``, ``link``)
written as JSON Lines or Parquet, with per-node clocks."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .executor import Executor, Op
from .model import MS, T0, Layout, Spec
from .programs import rank_programs
from .truth import ground_truth


def _clock(spec: Spec, lay: Layout, rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    n = len(lay.node_names)
    off = np.array([rng.uniform(-spec.skew_ms, spec.skew_ms) * MS for _ in range(n)])
    drift = np.array([rng.uniform(-spec.drift_ppm, spec.drift_ppm) * 1e-6 for _ in range(n)])
    return off, drift


def generate(
    spec: Spec, keep: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, pa.Table], dict[str, Any]]:
    """(meta, tables by kind, truth) of one held-out job; ``keep`` (when given) receives the
    job's ``layout``, ``executor`` and observed clock ``obs(rank, true_ns)`` (probes of the
    generated cluster, :mod:`failslow.bench.heldout_probes`)."""
    rng = random.Random(spec.seed)
    lay = Layout(spec, rng)
    progs = rank_programs(spec, lay)
    ex = Executor(spec, lay, progs)
    ex.run()
    off, drift = _clock(spec, lay, rng)
    node = np.array(lay.node)

    def obs(rank: np.ndarray, t: np.ndarray) -> np.ndarray:
        n = node[rank]
        step = np.where(
            (n == 1) & (t >= T0 + spec.clock_step_s * 1e9), spec.clock_step_ms * MS, 0.0
        )
        return (t + off[n] + drift[n] * (t - T0) + step).astype(np.int64)

    if keep is not None:
        keep.update(layout=lay, executor=ex, obs=obs)
    ops = ex.ops
    rank = np.array([o.rank for o in ops], dtype=np.int32)
    enter = np.array([o.enter for o in ops])
    done = np.array([o.end is not None for o in ops])
    end = np.array([o.end if o.end is not None else 0.0 for o in ops])
    tstart = np.array([o.start if o.start is not None else 0.0 for o in ops])
    cids = np.array([lay.comms[o.comm][0] for o in ops], dtype=np.uint64)
    crank = np.array([ex.comm_rank(o) for o in ops], dtype=np.int32)
    csize = np.array([len(lay.comms[o.comm][2]) for o in ops], dtype=np.int32)
    seq = np.array([o.seq for o in ops], dtype=np.uint64)
    opn = np.array([o.op for o in ops], dtype=object)
    nbytes = np.array([o.nbytes for o in ops], dtype=np.uint64)
    peer = np.array([o.peer for o in ops], dtype=np.int32)
    chunk = 512 << 10
    p2p_steps = np.maximum(1, nbytes // chunk)
    steps = np.array([o.steps for o in ops], dtype=np.uint64)
    sendc = np.where(opn == "send", p2p_steps, np.where(opn == "recv", 0, steps))
    recvc = np.where(opn == "recv", p2p_steps, np.where(opn == "send", 0, steps))
    e_idx = np.flatnonzero(done)
    n_in, n_end = len(ops), len(e_idx)
    t_col = np.concatenate([obs(rank, enter), obs(rank[e_idx], end[e_idx])])
    ts = obs(rank[e_idx], tstart[e_idx])
    missing = np.array([rng.random() < spec.missing_t_start for _ in range(n_end)], dtype=bool)
    idx = np.concatenate([np.arange(n_in), e_idx])
    coll = pa.table(
        {
            "job": pa.array([spec.job] * (n_in + n_end)),
            "rank": pa.array(rank[idx], pa.int32()),
            "comm": pa.array(cids[idx], pa.uint64()),
            "comm_rank": pa.array(crank[idx], pa.int32()),
            "comm_size": pa.array(csize[idx], pa.int32()),
            "seq": pa.array(seq[idx], pa.uint64()),
            "op": pa.array(opn[idx].tolist(), pa.string()),
            "bytes": pa.array(nbytes[idx], pa.uint64()),
            "peer": pa.array(peer[idx], pa.int32()),
            "phase": pa.array(["enter"] * n_in + ["end"] * n_end),
            "t": pa.array(t_col, pa.int64()),
            "t_start": pa.array(
                np.concatenate([np.zeros(n_in, np.int64), ts]),
                pa.int64(),
                mask=np.concatenate([np.ones(n_in, bool), missing]),
            ),
            "send_count": pa.array(
                np.concatenate([np.zeros(n_in, np.uint64), sendc[e_idx].astype(np.uint64)]),
                pa.uint64(),
                mask=np.concatenate([np.ones(n_in, bool), np.zeros(n_end, bool)]),
            ),
            "recv_count": pa.array(
                np.concatenate([np.zeros(n_in, np.uint64), recvc[e_idx].astype(np.uint64)]),
                pa.uint64(),
                mask=np.concatenate([np.ones(n_in, bool), np.zeros(n_end, bool)]),
            ),
        }
    )
    tables: dict[str, pa.Table] = {"coll": coll}
    hang_t = min((h[2] for h in ex.hung), default=None)
    horizon = float(np.nanmax(end[done])) if done.any() else T0
    if hang_t is not None:
        horizon = max(horizon, float(enter.max())) + spec.tail_s * 1e9
    if spec.progress_ms > 0:
        tables["progress"] = _progress(spec, ex, ops, done, horizon, obs)
    if spec.link_rows:
        tables["link"] = _links(spec, lay, ex, horizon, off, drift)
    meta = {
        "job": spec.job,
        "t": T0,
        "world_size": spec.world,
        "tp": spec.tp,
        "pp": spec.pp,
        "dp": spec.dp,
        "cp": 1,
        "microbatches": spec.microbatches if spec.meta_degrees else 0,
        "schedule": "1f1b" if spec.meta_degrees else "unknown",
        "nodes": {str(r): lay.node_names[lay.node[r]] for r in range(spec.world)},
        "comms": [{"comm": c, "kind": k, "ranks": m} for c, k, m in lay.comms]
        if spec.comms_in_meta
        else [],
    }
    truth = ground_truth(spec, lay, ex, obs)
    return meta, tables, truth


def _progress(
    spec: Spec, ex: Executor, ops: list[Op], done: np.ndarray, horizon: float, obs: Any
) -> pa.Table:
    """Samples every ``progress_ms`` of operations in flight longer than that (and of the
    operations a hang left in flight, until ``horizon``)."""
    per = spec.progress_ms * MS
    cols: dict[str, list[Any]] = {k: [] for k in ("rank", "comm", "seq", "t", "s", "r")}
    for o in ops:
        stop = o.end if o.end is not None else horizon
        n = int((stop - o.enter) // per)
        if n <= 0:
            continue
        ts = o.enter + per * np.arange(1, n + 1)
        if o.end is not None:
            assert o.start is not None
            frac = np.clip((ts - o.start) / max(1.0, o.end - o.start), 0, 1)
            sc = (frac * (o.steps or 1)).astype(np.int64)
            rc = sc
        elif o.stall_steps is not None and o.start is not None:
            sc = np.where(ts >= o.start, o.stall_steps[0], 0)
            rc = np.where(ts >= o.start, o.stall_steps[1], 0)
        else:
            sc = rc = np.zeros(n, np.int64)
        cols["rank"].append(np.full(n, o.rank))
        cols["comm"].append(np.full(n, ex.lay.comms[o.comm][0], dtype=np.uint64))
        cols["seq"].append(np.full(n, o.seq, dtype=np.uint64))
        cols["t"].append(obs(np.full(n, o.rank), ts))
        cols["s"].append(np.asarray(sc, np.uint64))
        cols["r"].append(np.asarray(rc, np.uint64))
    cat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}
    m = len(cat["t"])
    return pa.table(
        {
            "job": pa.array([spec.job] * m),
            "rank": pa.array(cat["rank"], pa.int32()),
            "comm": pa.array(cat["comm"].astype(np.uint64), pa.uint64()),
            "seq": pa.array(cat["seq"].astype(np.uint64), pa.uint64()),
            "t": pa.array(cat["t"].astype(np.int64), pa.int64()),
            "send_count": pa.array(cat["s"].astype(np.uint64), pa.uint64()),
            "recv_count": pa.array(cat["r"].astype(np.uint64), pa.uint64()),
        }
    )


def _links(
    spec: Spec, lay: Layout, ex: Executor, horizon: float, off: np.ndarray, drift: np.ndarray
) -> pa.Table:
    """Per queue pair (rank -> peer node) cumulative work requests and bytes, sampled every
    ``link_ms``. A slow link drains slower while its sender keeps posting at the healthy
    rate, so its in-flight count grows (VCCL); hops starved by it keep short queues."""
    chunk = 512 << 10
    qp: dict[tuple[int, int], list[tuple[float, ...]]] = {}
    rounds: dict[tuple[Any, ...], list[Op]] = ex.rounds
    for ops in rounds.values():
        o = ops[0]
        if o.start is None:
            continue
        members = sorted(ops, key=ex.comm_rank)
        if o.kind == "p2p":
            snd = next(x for x in ops if x.op == "send")
            rcv = next(x for x in ops if x.op == "recv")
            pairs = [(snd.rank, rcv.rank, float(o.nbytes))]
        else:
            n = len(members)
            vol = o.nbytes / n * o.steps if o.op == "allreduce" else o.nbytes * o.steps
            pairs = [(members[i].rank, members[(i + 1) % n].rank, vol) for i in range(n)]
        t1 = max(x.end if x.end is not None else horizon for x in ops)
        t0 = float(o.start)
        for a, b, vol in pairs:
            if lay.node[a] == lay.node[b]:
                continue
            slow = ex.link_factor(a, b, o.it)
            hung = o.end is None
            if not hung:
                qp.setdefault((a, lay.node[b]), []).append(
                    (t0, t1, t0 + (t1 - t0) / slow, vol, 1.0, 0.0)
                )
                continue
            # H3: completions stop after the steps done; only the broken queue pair (the
            # root's, towards its ring successor or p2p peer) keeps posting
            root = next((x for x in ops if x.h3), None)
            frac = 0.0
            if root is not None and root.stall_steps is not None and o.steps:
                frac = root.stall_steps[0] / o.steps
            broken = root is not None and a == root.rank
            qp.setdefault((a, lay.node[b]), []).append(
                (
                    t0,
                    t0 + 1 * MS,
                    t0 + 200 * MS if broken else t0 + 1 * MS,
                    vol,
                    frac,
                    1.0 if broken else 0.0,
                )
            )
    cols: dict[str, list[Any]] = {k: [] for k in ("node", "rank", "peer", "t", "p", "c", "b")}
    period = spec.link_ms * MS
    t_lo = T0
    grid = t_lo + period * np.arange(1, int((horizon - t_lo) // period) + 1)
    for (a, pn), xfers in qp.items():
        arr = np.array(xfers)
        a_s0, a_s1, a_sh, a_vol = arr[:, 0:1], arr[:, 1:2], arr[:, 2:3], arr[:, 3:4]
        a_frac, a_broken = arr[:, 4:5], arr[:, 5:6]
        wr = np.ceil(a_vol / chunk)
        done = a_frac * np.clip((grid[None, :] - a_s0) / np.maximum(a_s1 - a_s0, 1.0), 0, 1)
        post = np.clip((grid[None, :] - a_s0) / np.maximum(a_sh - a_s0, 1.0), 0, 1)
        post = np.where(a_broken > 0, np.maximum(post, done), np.where(a_frac < 1, done, post))
        posted = (post * wr).sum(axis=0)
        completed = np.minimum((done * wr).sum(axis=0), posted)
        nbytes = (done * a_vol).sum(axis=0)
        n = lay.node[a]
        k = len(grid)
        cols["node"] += [lay.node_names[n]] * k
        cols["rank"].append(np.full(k, a))
        cols["peer"] += [lay.node_names[pn]] * k
        cols["t"].append((grid + off[n] + drift[n] * (grid - T0)).astype(np.int64))
        cols["p"].append(posted.astype(np.uint64))
        cols["c"].append(completed.astype(np.uint64))
        cols["b"].append(nbytes.astype(np.uint64))
    m = len(cols["node"])
    cat = {
        k: np.concatenate(v) if v else np.zeros(0)
        for k, v in cols.items()
        if k not in ("node", "peer")
    }
    return pa.table(
        {
            "job": pa.array([spec.job] * m),
            "node": pa.array(cols["node"], pa.string()),
            "rank": pa.array(cat["rank"].astype(np.int32), pa.int32()),
            "device": pa.array([f"mlx5_{int(r) % spec.gpus_per_node}" for r in cat["rank"]]),
            "peer_node": pa.array(cols["peer"], pa.string()),
            "t": pa.array(cat["t"].astype(np.int64), pa.int64()),
            "posted": pa.array(cat["p"].astype(np.uint64), pa.uint64()),
            "completed": pa.array(cat["c"].astype(np.uint64), pa.uint64()),
            "bytes": pa.array(cat["b"].astype(np.uint64), pa.uint64()),
        }
    )


def write(spec: Spec, path: Path, keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Generate and write a trace directory (plus ``truth.json``); returns the truth
    (``keep``: as :func:`generate`)."""
    meta, tables, truth = generate(spec, keep)
    path.mkdir(parents=True, exist_ok=True)
    for p in path.iterdir():
        p.unlink()
    (path / "meta.json").write_text(json.dumps(meta))
    rng = np.random.default_rng(spec.seed + 7)
    for kind, table in tables.items():
        if not table.num_rows:
            continue
        if spec.shuffle and table.num_rows:
            table = table.take(rng.permutation(table.num_rows))
        if spec.fmt == "parquet":
            pq.write_table(table, path / f"{kind}.parquet", row_group_size=200_000)
        else:
            with (path / f"{kind}.jsonl").open("w") as fh:
                for row in table.to_pylist():
                    fh.write(json.dumps({k: v for k, v in row.items() if v is not None}))
                    fh.write("\n")
    if spec.post_mortem:
        (path / "import.json").write_text(json.dumps({"post_mortem": True}))
    (path / "truth.json").write_text(json.dumps(truth, indent=1))
    return truth
