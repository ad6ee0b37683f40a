"""The cases of ``failslow bench accuracy-hang`` (:mod:`failslow.bench.accuracy_hang` describes
the suite, streams the cases through the hang detector and scores them): the job shapes, the
hangs (:class:`HangSpec`: class, communicator, pass, stage, micro-batch), the simulator
scenario of each hang case and clean run (:func:`suite`, an evenly spread part of them at
``scale`` < 1), and the checkpoint pauses the simulator cannot make, injected into its tables
(:func:`inject_checkpoint`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.events import Comm, JobMeta
from failslow.schedule import schedule_phase as pipeline_phase

S = 1_000_000_000
WORLD_COMM = 0xC0FFEE_0000_0001  # the checkpoint-only world communicator of the clean runs


# ---------------------------------------------------------------------------------------------
# the suite


@dataclass(frozen=True)
class Shape:
    name: str
    tp: int
    pp: int
    dp: int
    cp: int = 1
    microbatches: int = 8
    schedule: str = "1f1b"

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        """Megatron's order, as the simulator: tp + TP*(cp + CP*(dp + DP*pp))."""
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))


SHAPES = {
    "16": Shape("16", 2, 2, 4, microbatches=4),
    "32cp": Shape("32cp", 2, 2, 4, cp=2, microbatches=4),
    "64": Shape("64", 2, 4, 8),
    "64gpipe": Shape("64gpipe", 2, 4, 8, schedule="gpipe"),
    "128pp8": Shape("128pp8", 2, 8, 8, microbatches=16),
    "256": Shape("256", 4, 4, 16),
    "1024": Shape("1024", 8, 4, 32),
}


@dataclass(frozen=True)
class HangSpec:
    """A hang: class, communicator kind, pass, pipeline stage ("first"/"last"/"any"),
    micro-batch ("first"/"mid"/"last"), the operation (dp: allgather/reducescatter; pp:
    send/recv) and for H2 the mismatch."""

    label: str
    cause: str
    comm: str
    phase: str = "forward"
    stage: str = "any"
    mb: str = "first"
    op: str | None = None
    mismatch: str = "bytes"
    index: int = 0          # which collective of the pass (tp/cp)


HANG_SPECS = (
    HangSpec("tp-warmup-forward", "not_entered", "tp", "forward", "first", "first"),
    HangSpec("pp-warmup-forward-send", "not_entered", "pp", "forward", "first", "first", "send"),
    HangSpec("dp-params-sync", "inconsistent", "dp", op="allgather", mismatch="op"),
    HangSpec("tp-warmup-forward", "hardware", "tp", "forward", "first", "first"),
    HangSpec("tp-steady-forward", "not_entered", "tp", "forward", "last", "mid"),
    HangSpec("tp-steady-forward-op", "inconsistent", "tp", "forward", "last", "mid",
             mismatch="op"),
    HangSpec("pp-steady-forward-send", "hardware", "pp", "forward", "first", "mid", "send"),
    HangSpec("pp-steady-forward-recv", "not_entered", "pp", "forward", "last", "mid", "recv"),
    HangSpec("tp-cooldown-backward-bytes", "inconsistent", "tp", "backward", "first", "last"),
    HangSpec("tp-steady-backward", "hardware", "tp", "backward", "last", "mid", index=1),
    HangSpec("tp-cooldown-backward", "not_entered", "tp", "backward", "first", "last",
             index=1),
    HangSpec("dp-grads-sync-bytes", "inconsistent", "dp", op="reducescatter"),
    HangSpec("pp-cooldown-backward-recv", "hardware", "pp", "backward", "first", "last", "recv"),
    HangSpec("pp-cooldown-backward-recv", "not_entered", "pp", "backward", "first", "last",
             "recv"),
    HangSpec("dp-grads-sync", "hardware", "dp", op="reducescatter"),
    HangSpec("dp-params-sync", "not_entered", "dp", op="allgather"),
    HangSpec("dp-params-sync", "hardware", "dp", op="allgather"),
    HangSpec("dp-grads-sync", "not_entered", "dp", op="reducescatter"),
)
CP_SPECS = (
    HangSpec("cp-forward", "not_entered", "cp", "forward", "first", "mid"),
    HangSpec("cp-backward-bytes", "inconsistent", "cp", "backward", "last", "first"),
    HangSpec("cp-forward", "hardware", "cp", "forward", "last", "mid"),
)
#: Specs run on the 1024-rank shape (the full list on the smaller ones).
LARGE_SPECS = (0, 2, 3, 7, 11, 14)


@dataclass
class Case:
    """One scenario: the simulator scenario, a seed, and what to do with its tables."""

    name: str
    group: str                      # "hang" or "clean"
    shape: Shape
    scenario: dict[str, Any]
    seed: int
    label: str = ""
    cause: str | None = None
    expect: dict[str, Any] = field(default_factory=dict)
    checkpoints: list[tuple[int, float]] = field(default_factory=list)  # (iteration, s)
    checkpoint_comm: str | None = None      # None: nothing in flight; "world" or "dp"
    lag: dict[int, float] = field(default_factory=dict)   # rank -> delivery lag (s)
    gc: bool = False


def _scenario(shape: Shape, iterations: int, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "job": f"hang-{shape.name}", "parallel": {"tp": shape.tp, "pp": shape.pp,
                                                   "dp": shape.dp, "cp": shape.cp},
        "microbatches": shape.microbatches, "schedule": shape.schedule,
        "iterations": iterations,
        "sampling": {"gpu_ms": 0.0, "hang_tail_s": 20.0,
                     "progress_ms": 50.0 if shape.world <= 256 else 100.0,
                     "link_ms": 100.0 if shape.world <= 256 else 250.0},
    }
    d.update(over)
    return d


def schedule_phase(shape: Shape, stage: int, phase: str, mb: int) -> str | None:
    """The 1F1B phase of a forward or backward of micro-batch ``mb`` on pipeline ``stage``
    of the shape (:func:`failslow.schedule.schedule_phase`: Megatron's ``min(P - s - 1, M)``
    warm-up forwards, as many cool-down backwards)."""
    return pipeline_phase(shape.schedule, stage, shape.pp, shape.microbatches, phase, mb)


def _hang_case(i: int, shape: Shape, spec: HangSpec, lag: str | None = None) -> Case:
    rng = np.random.default_rng([i, shape.world])
    stage = {"first": 0, "last": shape.pp - 1}.get(spec.stage, int(rng.integers(shape.pp)))
    mb = {"first": 0, "last": shape.microbatches - 1}.get(spec.mb, shape.microbatches // 2)
    root = shape.rank(tp=int(rng.integers(shape.tp)), cp=int(rng.integers(shape.cp)),
                      dp=int(rng.integers(shape.dp)), pp=stage)
    start = int(rng.integers(3, 7))
    fault: dict[str, Any] = {"cause": spec.cause, "ranks": [root], "start": start,
                             "comm": spec.comm}
    expect: dict[str, Any] = {}
    if spec.comm == "dp":
        fault["op"] = spec.op
        expect["op"] = spec.op
    else:
        fault.update({"phase": spec.phase, "microbatch": mb})
        if spec.comm in ("tp", "cp") and spec.index:
            fault["index"] = spec.index
        if spec.op is not None:
            fault["op"] = spec.op
        expect.update({"pass": spec.phase, "microbatch": mb,
                       "schedule_phase": schedule_phase(shape, stage, spec.phase, mb)})
    if spec.cause == "inconsistent":
        fault["mismatch"] = spec.mismatch
    lags: dict[int, float] = {}
    name = f"{shape.name}-{spec.cause}-{spec.label}"
    if lag == "victim":
        # a tensor-parallel peer of the root (in the hung round's group when tp) lags 3 s
        lags[root ^ 1 if shape.tp > 1 else (root + shape.tp) % shape.world] = 3.0
        name += "-late-victim"
    elif lag == "root":
        lags[root] = 2.0
        name += "-late-root"
    sc = _scenario(shape, start + 3, faults=[fault])
    return Case(name, "hang", shape, sc, seed=i, label=spec.label, cause=spec.cause,
                expect=expect, lag=lags)


def suite(scale: float = 1.0) -> list[Case]:
    """The cases; ``scale`` < 1 keeps an evenly spread part of them (at least one of each
    hang class and of each kind of clean run) and drops the largest shapes (1024 ranks below
    0.5, 256 ranks below 0.25)."""
    hang: list[Case] = []
    i = 0
    for shape in SHAPES.values():
        if (shape.world > 256 and scale < 0.5) or (shape.world > 64 and scale < 0.25):
            continue
        specs = list(HANG_SPECS)
        if shape.world > 256:
            specs = [HANG_SPECS[k] for k in LARGE_SPECS]
        elif shape.schedule == "gpipe":
            specs = specs[:8]
        if shape.cp > 1:
            specs = list(CP_SPECS) + specs[:6]
        for spec in specs:
            i += 1
            hang.append(_hang_case(i, shape, spec))
    # records of some rank arriving late (streaming): a late victim, a late root
    for shape_name, spec_i, lag in (("16", 4, "victim"), ("64", 0, "victim"),
                                    ("64", 7, "root"), ("16", 11, "victim")):
        if SHAPES[shape_name].world > 64 and scale < 0.25:
            continue
        i += 1
        hang.append(_hang_case(i, SHAPES[shape_name], HANG_SPECS[spec_i], lag))
    clean: list[Case] = []
    for shape in SHAPES.values():
        if (shape.world > 256 and scale < 0.5) or (shape.world > 64 and scale < 0.25):
            continue
        clean.append(Case(f"{shape.name}-clean-healthy", "clean", shape,
                          _scenario(shape, 12), seed=100 + shape.world))
    for shape_name, seed in (("16", 0), ("64", 1), ("256", 2)):
        shape = SHAPES[shape_name]
        if shape.world > 64 and scale < 0.25:
            continue
        iters = 16
        prob = 5.0 / (shape.world * iters)          # about five GC pauses per run
        clean.append(Case(f"{shape.name}-clean-gc-2to4s", "clean", shape,
                          _scenario(shape, iters, noise={"gc_prob": prob,
                                                         "gc_ms": [2000.0, 4000.0]}),
                          seed=200 + seed, gc=True))
    clean.append(Case("64-clean-checkpoint-idle", "clean", SHAPES["64"],
                      _scenario(SHAPES["64"], 10), seed=300,
                      checkpoints=[(4, 60.0)]))
    clean.append(Case("16-clean-checkpoint-world-inflight", "clean", SHAPES["16"],
                      _scenario(SHAPES["16"], 12), seed=301,
                      checkpoints=[(2, 30.0), (5, 40.0), (8, 50.0)],
                      checkpoint_comm="world"))
    clean.append(Case("64-clean-checkpoint-dp-inflight", "clean", SHAPES["64"],
                      _scenario(SHAPES["64"], 12), seed=302,
                      checkpoints=[(2, 20.0), (5, 30.0), (8, 35.0)], checkpoint_comm="dp"))
    if scale >= 0.25:
        clean.append(Case("256-clean-checkpoint-idle", "clean", SHAPES["256"],
                          _scenario(SHAPES["256"], 9), seed=303,
                          checkpoints=[(3, 120.0), (6, 90.0)]))
        clean.append(Case("256-clean-checkpoint-world-inflight", "clean", SHAPES["256"],
                          _scenario(SHAPES["256"], 9), seed=304,
                          checkpoints=[(3, 45.0), (6, 45.0)], checkpoint_comm="world"))
    clean.append(Case("64-clean-late-rank", "clean", SHAPES["64"], _scenario(SHAPES["64"], 12),
                      seed=305, lag={13: 3.0}))
    clean.append(Case("16-clean-late-ranks", "clean", SHAPES["16"], _scenario(SHAPES["16"], 12),
                      seed=306, lag={3: 1.5, 10: 4.0}))
    for c in clean:
        c.label = ("late" if c.lag else "gc" if c.gc else "healthy" if not c.checkpoints
                   else "checkpoint-inflight" if c.checkpoint_comm else "checkpoint-idle")
    return _spread(hang, scale, lambda c: c.cause or "") + _spread(clean, scale,
                                                                   lambda c: c.label)


def _spread(cases: list[Case], scale: float, key: Callable[[Case], str]) -> list[Case]:
    """An evenly spread ``scale`` part of each stratum (at least one case of each)."""
    if scale >= 1.0:
        return cases
    keep: set[int] = set()
    strata: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        strata.setdefault(key(c), []).append(i)
    for idx in strata.values():
        k = max(1, int(round(scale * len(idx))))
        pick = np.unique(np.linspace(0, len(idx) - 1, k).round().astype(int))
        keep.update(idx[j] for j in pick.tolist())
    return [c for i, c in enumerate(cases) if i in keep]


# ---------------------------------------------------------------------------------------------
# post-processing: checkpoint pauses


def _boundaries(span: pa.Table, iteration: int, world: int) -> np.ndarray:
    """Per rank, the end of its optimizer step of ``iteration``: its iteration boundary."""
    sel = pc.and_(pc.equal(span.column("op"), "optimizer"),
                  pc.equal(span.column("step"), iteration))
    t = span.filter(sel)
    out = np.full(world, -1, dtype=np.int64)
    out[t.column("rank").to_numpy()] = t.column("t_end").to_numpy()
    if (out < 0).any():
        raise ValueError(f"iteration {iteration} has no optimizer step on some rank")
    return out


def _shift(cols: dict[str, np.ndarray], rank: np.ndarray, bound: np.ndarray, by: int,
           names: tuple[str, ...]) -> np.ndarray:
    """Add ``by`` to the time columns ``names`` of rows after their rank's boundary."""
    after = cols["t"] > bound[rank]
    for name in names:
        col = cols[name].copy()
        ok = after & (col != events.NULL_TIME)
        col[ok] += by
        cols[name] = col
    return after


def inject_checkpoint(tables: dict[str, pa.Table], span: pa.Table, meta: JobMeta,
                      iteration: int, pause_s: float, comm: str | None
                      ) -> tuple[dict[str, pa.Table], JobMeta]:
    """A checkpoint after ``iteration``: every record after a rank's iteration boundary moves
    later, so the job pauses for ``pause_s`` plus the spread of the boundaries.

    ``comm=None``: every rank writes its shard; nothing is in flight during the pause.
    ``"world"``: rank 0 writes while every other rank waits in an 8-byte all-reduce on a world
    communicator used only for checkpoints. ``"dp"``: the first member of each data-parallel
    group writes while the others wait in an 8-byte all-gather on that group (whose usual
    rounds are the parameter all-gathers of MBs)."""
    world = meta.world_size
    bound = _boundaries(span, iteration, world)
    shift = int(bound.max() - bound.min() + pause_s * S + 20_000_000)
    out: dict[str, pa.Table] = {}
    coll = events.to_columns(tables["coll"], "coll")
    after = _shift(coll, coll["rank"].astype(np.int64), bound, shift, ("t", "t_start"))
    new_meta = meta
    if comm is not None:
        if comm == "world":
            if not any(c.comm == WORLD_COMM for c in meta.comms):
                new_meta = replace(meta, comms=(*meta.comms,
                                                Comm(WORLD_COMM, "world", tuple(range(world)))))
            groups = [(WORLD_COMM, list(range(world)))]
            op = events.OP["allreduce"]
        else:
            groups = [(c.comm, list(c.ranks)) for c in meta.comms if c.kind == "dp"]
            op = events.OP["allgather"]
        coll = _add_round(coll, after, groups, bound, pause_s, op, world)
    out["coll"] = events.from_columns(coll, "coll")
    if "progress" in tables:
        prog = events.to_columns(tables["progress"], "progress")
        later = _shift(prog, prog["rank"].astype(np.int64), bound, shift, ("t",))
        if comm == "dp":    # the rounds after the inserted one moved one seq up
            dp_ids = np.array([c.comm for c in meta.comms if c.kind == "dp"], dtype=np.uint64)
            prog["seq"] = prog["seq"].copy()
            prog["seq"][later & np.isin(prog["comm"], dp_ids)] += np.uint64(1)
        out["progress"] = events.from_columns(prog, "progress")
    if "link" in tables:
        link = events.to_columns(tables["link"], "link")
        r = link["rank"].astype(np.int64)
        _shift(link, np.where(r >= 0, r, 0), bound, shift, ("t",))
        out["link"] = events.from_columns(link, "link")
    return out, new_meta


def _add_round(coll: dict[str, np.ndarray], after: np.ndarray,
               groups: list[tuple[int, list[int]]], bound: np.ndarray, pause_s: float,
               op: int, world: int) -> dict[str, np.ndarray]:
    """One 8-byte round per group at the boundary: the group's first member enters
    ``pause_s`` late, the others 1 ms after their boundary; all complete together. Later
    rounds of the communicator move one sequence number up."""
    rows: dict[str, list[Any]] = {k: [] for k in coll}
    comm_col = coll["comm"]
    for cid, members in groups:
        on = comm_col == np.uint64(cid)
        enters = {}
        for pos, r in enumerate(members):
            mine = on & (coll["rank"] == r)
            before = mine & ~after
            seq = int(coll["seq"][before].max()) + 1 if before.any() else 0
            coll["seq"] = coll["seq"].copy()
            coll["seq"][mine & after] += np.uint64(1)
            t = int(bound[r]) + (int(pause_s * S) if pos == 0 else 1_000_000)
            enters[r] = (pos, seq, t)
        t_end = max(t for _, _, t in enters.values()) + 50_000
        for r, (pos, seq, t) in enters.items():
            for phase, tt in ((events.ENTER, t), (events.END, t_end)):
                vals = {"job": coll["job"][0], "rank": r, "comm": cid, "comm_rank": pos,
                        "comm_size": len(members), "seq": seq, "op": op, "bytes": 8,
                        "peer": -1, "phase": phase, "t": tt,
                        "t_start": t_end - 40_000 if phase == events.END else events.NULL_TIME,
                        "send_count": 1 if phase == events.END else events.NULL_COUNT,
                        "recv_count": 1 if phase == events.END else events.NULL_COUNT}
                for k in rows:
                    rows[k].append(vals[k])
    out = {}
    for k, col in coll.items():
        extra = np.asarray(rows[k], dtype=col.dtype)
        out[k] = np.concatenate([col, extra])
    return out
