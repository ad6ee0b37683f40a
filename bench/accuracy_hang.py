"""``failslow bench accuracy-hang``: the hang detector's accuracy suite (issue 4, item 6).

Scenarios (simulated with :mod:`failslow.simulator`, 16 to 1024 ranks, 1F1B and GPipe, with
and without context parallelism):

* hangs of every class of CCL-D's taxonomy (§2.2: H1 ``not_entered``, H2 ``inconsistent``,
  H3 ``hardware``) at every training stage MEGATRACE locates (§III-C step 3): the forward of
  the 1F1B warm-up, the steady state, the backward of the cool-down, the pipeline send/recv,
  the data-parallel params-sync and grads-sync, the tensor- and context-parallel collectives
  inside forward and backward compute; plus hangs where some rank's records reach the
  detector seconds late (a slow collector or a lagging stream partition);
* clean runs: healthy jobs; Python GC pauses of several seconds on random ranks (their peers
  wait in tensor-parallel collectives and pipeline receives meanwhile); checkpoint pauses with
  nothing in flight; checkpoint pauses while the other ranks wait in a small non-barrier
  collective for the ranks that write (on a world communicator used only then, and on the
  data-parallel communicator, whose usual traffic is large parameter all-gathers), three
  times in a run; a rank whose records arrive seconds late.

The simulator has no checkpoint and no delivery-lag model, so those are made by
post-processing its tables (:func:`inject_checkpoint`, the ``lag`` of :func:`stream`).

Every case is streamed through :class:`~failslow.detectors.hang.HangDetector` in 100 ms
ticks of arrival time (records arrive at their event time plus their rank's lag), as the
stream processor would run it, and scored against the simulator's ``truth.json``:

* detection: precision, recall, F1 over hang reports (a hang case with a report is a true
  positive; every further report in it, and every report in a clean run, a false positive);
* on the detected hangs: class (``cause``), exact root ranks, link, stage (the truth's
  ``stage`` and ``comm``, plus the halt point: the data-parallel operation, or for pipeline,
  tensor- and context-parallel halts the pass, the micro-batch and the 1F1B phase);
* detection latency after the hang's true start, in seconds and in iterations (the
  simulator's median iteration time).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow import events
from failslow.detectors.base import Reporting
from failslow.detectors.hang import HangConfig
from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import Reports, only
from failslow.events import Comm, JobMeta
from failslow.schedule import schedule_phase as pipeline_phase

TICK_NS = 100_000_000
S = 1_000_000_000
KINDS = ("coll", "progress", "link")
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


# ---------------------------------------------------------------------------------------------
# streaming a case through the detector


def _arrival(table: pa.Table, lag_ns: np.ndarray | None) -> np.ndarray:
    t = table.column("t").to_numpy().astype(np.int64)
    if lag_ns is None:
        return t
    rank = pc.fill_null(table.column("rank"), -1).to_numpy().astype(np.int64)
    ok = (rank >= 0) & (rank < len(lag_ns))
    return t + np.where(ok, lag_ns[np.clip(rank, 0, len(lag_ns) - 1)], 0)


def stream(det: Reporting, tables: dict[str, pa.Table], lag_ns: np.ndarray | None = None,
           tick_ns: int = TICK_NS, tail_ns: int = 0) -> Iterator[tuple[int, list[Anomaly]]]:
    """Deliver the records as a stream would: each at its event time plus its rank's lag,
    in ``tick_ns`` windows of arrival time; ``update`` with each window's records, then
    ``on_tick(window end)``; windows with no records tick too, and ``tail_ns`` after the
    last arrival. Yields ``(now, reports)``."""
    parts: dict[str, tuple[pa.Table, np.ndarray]] = {}
    lo, hi = None, None
    for kind, table in tables.items():
        if table.num_rows == 0:
            continue
        arr = _arrival(table, lag_ns)
        order = np.argsort(arr, kind="stable")
        parts[kind] = (table.take(pa.array(order)), arr[order])
        lo = int(arr.min()) if lo is None else min(lo, int(arr.min()))
        hi = int(arr.max()) if hi is None else max(hi, int(arr.max()))
    if lo is None or hi is None:
        return
    edges = np.arange(lo - 1 + tick_ns, hi + tail_ns + tick_ns, tick_ns, dtype=np.int64)
    cuts = {k: np.searchsorted(a, edges, side="right") for k, (_, a) in parts.items()}
    prev = {k: 0 for k in parts}
    for j, now in enumerate(edges.tolist()):
        batch = {}
        for k, (table, _) in parts.items():
            c = int(cuts[k][j])
            if c > prev[k]:
                batch[k] = table.slice(prev[k], c - prev[k])
                prev[k] = c
        found = det.update(batch) if batch else []
        found += det.on_tick(now)
        yield now, found


# ---------------------------------------------------------------------------------------------
# running and scoring


@dataclass
class Result:
    case: Case
    ranks: int
    rows: int
    seconds: float
    reports: list[Anomaly]          # first report of each anomaly id
    truth: Anomaly | None
    iteration_s: float | None
    checks: dict[str, bool] = field(default_factory=dict)
    latency_s: float | None = None
    note: str = ""


def run_case(case: Case, config: HangConfig | None = None) -> Result:
    from failslow.simulator import scenario_from_dict, simulate

    sc = scenario_from_dict(case.scenario, case.name)
    sim = simulate(sc, seed=case.seed)
    tables = {k: sim.tables[k] for k in KINDS if k in sim.kinds}
    meta = sim.meta
    note = ""
    if case.gc:
        span = sim.tables["span"]
        gcs = span.filter(pc.equal(span.column("op"), "gc"))
        dur = (gcs.column("t_end").to_numpy() - gcs.column("t_start").to_numpy()) / 1e9
        note = f"{len(dur)} GC pauses, longest {dur.max():.2f} s" if len(dur) else "no GC"
    for it, pause in sorted(case.checkpoints, reverse=True):
        tables, meta = inject_checkpoint(tables, sim.tables["span"], meta, it, pause,
                                         case.checkpoint_comm)
    lag = None
    if case.lag:
        lag = np.zeros(meta.world_size, dtype=np.int64)
        for r, s in case.lag.items():
            lag[r] = int(s * S)
    det = Reports(only(meta, {"hang"}, hang=config))
    t0 = time.perf_counter()
    seen: dict[str, Anomaly] = {}
    tail = 5 * S if case.group == "hang" else 30 * S
    for _, found in stream(det, tables, lag, tail_ns=tail):
        for a in found:
            seen.setdefault(a.id, a)
    seconds = time.perf_counter() - t0
    hangs = [a for a in sim.truth.anomalies if a.kind == "hang"]
    truth = hangs[0] if hangs else None
    if case.group == "hang" and truth is None:
        raise RuntimeError(f"{case.name}: the simulated hang never took effect")
    med = (sim.truth.iterations or {}).get("median_s")
    res = Result(case, meta.world_size, sum(t.num_rows for t in tables.values()), seconds,
                 list(seen.values()), truth, float(med) if med else None, note=note)
    if truth is not None and res.reports:
        _score(res, res.reports[0], truth)
    return res


def _score(res: Result, got: Anomaly, want: Anomaly) -> None:
    exp = res.case.expect
    hp = got.extra.get("halt_point") or {}
    stage = (got.stage == want.stage and got.comm == want.comm
             and got.comm_kind == want.comm_kind)
    if "op" in exp:
        stage = stage and hp.get("op") == exp["op"]
    if "pass" in exp:
        stage = stage and (got.extra.get("pass"), got.extra.get("microbatch")) == (
            exp["pass"], exp["microbatch"])
        if exp.get("schedule_phase") is not None:
            stage = stage and got.extra.get("schedule_phase") == exp["schedule_phase"]
    res.checks = {
        "cause": got.cause == want.cause,
        "ranks": got.ranks == want.ranks,
        "link": sorted(got.link or []) == sorted(want.link or []),
        "stage": bool(stage),
    }
    if got.detected_ns is not None and want.start_ns is not None:
        res.latency_s = (got.detected_ns - want.start_ns) / 1e9


def _stats(values: list[float], digits: int = 3) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p95": None, "max": None}
    a = np.asarray(values, dtype=float)
    return {"mean": round(float(a.mean()), digits), "median": round(float(np.median(a)), digits),
            "p95": round(float(np.percentile(a, 95)), digits),
            "max": round(float(a.max()), digits)}


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def summarize(results: list[Result]) -> dict[str, Any]:
    """The suite's figures (module docstring)."""
    hang = [r for r in results if r.case.group == "hang"]
    clean = [r for r in results if r.case.group == "clean"]
    tp = sum(1 for r in hang if r.reports)
    fn = len(hang) - tp
    fp = sum(max(0, len(r.reports) - 1) for r in hang) + sum(len(r.reports) for r in clean)
    prec = tp / (tp + fp) if tp + fp else 1.0
    rec = tp / (tp + fn) if tp + fn else 1.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    found = [r for r in hang if r.reports]
    lat = [r.latency_s for r in found if r.latency_s is not None]
    lat_it = [r.latency_s / r.iteration_s for r in found
              if r.latency_s is not None and r.iteration_s]

    def acc(key: str) -> float | None:
        return _ratio(sum(r.checks.get(key, False) for r in found), len(found))

    def group_by(key: Callable[[Result], str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for r in hang:
            g = out.setdefault(key(r), {"cases": 0, "correct": 0, "latency_s": []})
            g["cases"] += 1
            g["correct"] += int(bool(r.reports) and len(r.reports) == 1
                                and all(r.checks.values()))
            if r.latency_s is not None:
                g["latency_s"].append(r.latency_s)
        for g in out.values():
            g["latency_s_max"] = round(max(g.pop("latency_s")), 3) if g.get("latency_s") \
                else None
        return out

    wrong = []
    for r in hang:
        bad = [k for k, ok in r.checks.items() if not ok]
        if not r.reports or len(r.reports) > 1 or bad:
            wrong.append({"case": r.case.name, "reports": len(r.reports), "wrong": bad,
                          "got": [_brief(a) for a in r.reports[:3]],
                          "want": _brief(r.truth) if r.truth else None})
    for r in clean:
        if r.reports:
            wrong.append({"case": r.case.name, "reports": len(r.reports),
                          "got": [_brief(a) for a in r.reports[:3]]})
    return {
        "cases": len(results), "hang_cases": len(hang), "clean_cases": len(clean),
        "ranks": sorted({r.ranks for r in results}),
        "true_positives": tp, "false_positives": fp, "false_negatives": fn,
        "precision": round(prec, 4), "recall": round(rec, 4), "f1": round(f1, 4),
        "class_accuracy": acc("cause"), "root_rank_exact": acc("ranks"),
        "link_accuracy": acc("link"), "stage_accuracy": acc("stage"),
        "clean_false_alarms": sum(len(r.reports) for r in clean),
        "latency_s": _stats(lat), "latency_iterations": _stats(lat_it, 2),
        "by_class": group_by(lambda r: r.case.cause or "-"),
        "by_stage": group_by(lambda r: r.case.label),
        "by_ranks": {str(k): v for k, v in group_by(lambda r: str(r.ranks)).items()},
        "clean": {r.case.name: {"reports": len(r.reports), "note": r.note or None}
                  for r in clean},
        "failures": wrong,
        "detector_rows_per_s": round(sum(r.rows for r in results)
                                     / max(sum(r.seconds for r in results), 1e-9)),
    }


def _brief(a: Anomaly) -> dict[str, Any]:
    return {"cause": a.cause, "ranks": a.ranks, "link": a.link, "comm_kind": a.comm_kind,
            "stage": a.stage, "pass": a.extra.get("pass"),
            "microbatch": a.extra.get("microbatch"),
            "schedule_phase": a.extra.get("schedule_phase"),
            "op": (a.extra.get("halt_point") or {}).get("op"),
            "start_ns": a.start_ns, "detected_ns": a.detected_ns, "end_ns": a.end_ns}


def hang_suite(scale: float = 1.0, config: HangConfig | None = None,
               progress: Callable[[Result], None] | None = None) -> dict[str, Any]:
    """Run the suite (``scale`` shrinks it) and return its figures; ``progress`` is called
    with each case's result."""
    t0 = time.perf_counter()
    results = []
    for case in suite(scale):
        res = run_case(case, config)
        results.append(res)
        if progress is not None:
            progress(res)
    out = summarize(results)
    out["scale"] = scale
    out["seconds"] = round(time.perf_counter() - t0, 1)
    cfg = config or HangConfig()
    out["config"] = {"n_expected": cfg.n_expected, "floor_s": cfg.floor_ns / 1e9,
                     "idle_floor_s": getattr(cfg, "idle_floor_ns", cfg.floor_ns) / 1e9,
                     "ceiling_s": cfg.ceiling_ns / 1e9, "tick_s": TICK_NS / 1e9}
    return out


def _line(r: Result) -> str:
    got = "; ".join(f"{a.cause}{a.ranks}{'' if a.link is None else ' link ' + str(a.link)} "
                    f"{a.stage}/{a.extra.get('pass')}/{a.extra.get('microbatch')}/"
                    f"{a.extra.get('schedule_phase')}" for a in r.reports[:3]) or "-"
    bad = [k for k, ok in r.checks.items() if not ok]
    lat = "" if r.latency_s is None else f" {r.latency_s:6.2f}s"
    return (f"{r.case.name:48s} {r.ranks:5d} {r.seconds:5.1f}s{lat} {got}"
            + (f"  WRONG {','.join(bad)}" if bad else "") + (f"  ({r.note})" if r.note else ""))


def bench_accuracy_hang(args: argparse.Namespace) -> dict[str, Any]:
    """``failslow bench accuracy-hang [--json] [--scale S]``."""
    scale = float(getattr(args, "scale", 1.0) or 1.0)
    quiet = bool(getattr(args, "json", False))
    return hang_suite(scale, progress=None if quiet else (lambda r: print(_line(r),
                                                                          flush=True)))


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "accuracy-hang": bench_accuracy_hang,
}

__all__ = ["BENCHMARKS", "Case", "hang_suite", "inject_checkpoint", "schedule_phase",
           "stream", "suite"]

