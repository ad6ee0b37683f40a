"""The held-out accuracy suite: jobs drawn at random from :mod:`failslow.bench.heldout`.

Nobody tuned the detectors on these jobs: every shape, noise setting and fault is drawn from
a seeded generator (``--seed`` changes every draw), over

* shapes from 16 to 1024 ranks (tp 1/2/4/8, pp 1/2/4/8, dp up to 64), including pure data
  parallelism (tp = pp = 1) with one to three collectives per iteration;
* jitter kinds (log-normal, Pareto, bimodal, uniform), sequence-length noise, GC pauses,
  per-node bursts, clock offsets and drift, missing ``t_start``, other rank orders than
  Megatron's, per-pair PP communicators, the distributed optimizer, JSON Lines or Parquet;
* fault families (:data:`FAMILIES`): a compute straggler (all passes, or only its forward or
  only its backward pass), a slow link on a pipeline path, a slow DP ring hop (mild ones cost
  the job under 1%: family ``link-dp-mild``), ``mixed`` (a rank computing slower whose own
  inter-node link is slow too), a slow link after a compute straggler in the same job, two
  simultaneous stragglers in different groups, clean runs, and hangs of the three CCL-D
  classes (H1 ``not_entered``, H2 ``inconsistent``, H3 ``hardware``).

Truth comes from the generator (ranks, link, cause, stage, onset iteration and time, the
job's cost); :mod:`failslow.bench.heldout_score` scores the diagnoses against it.
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from failslow.bench import heldout as hg
from failslow.bench import heldout_probes as hp
from failslow.bench.heldout_score import figures, floors, score_job

#: Fault families and how many jobs each has at ``scale`` 1.
FAMILIES: dict[str, int] = {
    "compute": 10,
    "compute-pass": 6,
    "link-pp": 7,
    "link-dp": 10,
    "mixed": 6,
    "compute-then-link": 5,
    "two-stragglers": 5,
    "clean": 8,
    "hang-h1": 3,
    "hang-h2": 3,
    "hang-h3": 3,
}
HANG_CAUSE = {"hang-h1": "not_entered", "hang-h2": "inconsistent", "hang-h3": "hardware"}
#: A compute fault costing the job less than this (truth ``slowdown``) is marginal.
MARGINAL = 1.02
#: A DP link fault costing less than this is reported in the family ``link-dp-mild``.
MILD = 1.01
LINK_STAGE = {"pp": "pp_p2p", "dp": "dp_sync", "tp": "tp_collective"}
ORDERS = (("tp", "dp", "pp"), ("tp", "dp", "pp"), ("tp", "dp", "pp"), ("tp", "pp", "dp"),
          ("dp", "tp", "pp"), ("pp", "tp", "dp"))


# ---------------------------------------------------------------------------------------------
# the suite


@dataclass
class Unit:
    """One true fault as scored: the generator's fault(s) it is made of and its truth."""

    family: str
    kind: str  # slow | hang
    cause: str
    ranks: list[int]
    faults: list[int]  # indices into the job's Spec.faults
    link: list[int] | None = None
    stage: str | None = None


@dataclass
class Job:
    name: str
    family: str
    spec: hg.Spec
    units: list[Unit] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.spec.world


class _Draw:
    """Random choices of one suite (all from one seeded ``random.Random``)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def shape(self, world: int, need_pp: bool = False, need_dp: bool = True,
              pure_dp: bool = False) -> tuple[int, int, int]:
        r = self.rng
        if pure_dp:
            return 1, 1, min(world, 64)
        options = []
        for tp in (1, 2, 4, 8):
            for pp in (1, 2, 4, 8):
                dp, rest = divmod(world, tp * pp)
                if rest or dp > 64 or (need_dp and dp < 2) or dp < 1:
                    continue
                if need_pp and pp < 2:
                    continue
                if tp == pp == 1:  # pure DP is drawn on purpose only
                    continue
                options.append((tp, pp, dp))
        return r.choice(options)

    def spec(self, tp: int, pp: int, dp: int, seed: int, iterations: int,
             pure_dp: bool = False) -> hg.Spec:
        r = self.rng
        world = tp * pp * dp
        mb = r.choice([1, 2, 4]) if pp == 1 else min(8, r.choice([pp, 2 * pp, 8]))
        jitter = r.choice(["lognormal", "pareto", "bimodal", "uniform"])
        spec = hg.Spec(
            tp=tp, pp=pp, dp=dp, microbatches=max(1, mb), iterations=iterations,
            order=r.choice(ORDERS),
            gpus_per_node=r.choice([8, 8, 8, 4]),
            forward_ms=r.uniform(2.0, 5.0),
            backward_ratio=r.uniform(1.8, 2.2),
            last_stage=r.uniform(1.0, 1.2),
            dp_mode=r.choice(["allreduce", "allreduce", "rs_ag"]),
            pp_comm=r.choice(["pipeline", "pipeline", "pair"]),
            small_allreduce=r.random() < 0.4,
            jitter=jitter,
            jitter_scale=r.uniform(0.02, 0.06),
            comm_jitter=r.choice(["pareto", "lognormal"]),
            seqlen_sigma=r.uniform(0.01, 0.06),
            burst_prob=r.choice([0.0, 0.0, 0.01, 0.02]),
            # GC pauses: up to one pause in every four iterations of the whole job
            gc_prob=r.choice([0.0, 0.05, 0.1, 0.25]) / world,
            skew_ms=r.uniform(0.5, 5.0),
            drift_ppm=r.uniform(0.0, 100.0),
            missing_t_start=r.choice([0.0, 0.0, 0.3, 1.0]),
            comms_in_meta=r.random() < 0.3,
            fmt="parquet" if world > 64 or r.random() < 0.5 else "jsonl",
            link_rows=r.random() < 0.4,
            seed=seed,
        )
        if pure_dp:
            spec = replace(spec, order=("tp", "dp", "pp"), pp_comm="pipeline")
        return spec


def _layout(spec: hg.Spec) -> hg.Layout:
    return hg.Layout(spec, random.Random(0))  # coordinates and members only


def _pp_pairs(lay: hg.Layout) -> list[tuple[int, int]]:
    s = lay.spec
    out = []
    for r, c in enumerate(lay.coord):
        if c["pp"] < s.pp - 1:
            out.append((r, lay.pp_neighbour(r, 1)))
    return out


def _dp_hops(lay: hg.Layout) -> list[tuple[int, int]]:
    out = []
    for _, kind, members in lay.comms:
        if kind == "dp":
            n = len(members)
            out += [(members[i], members[(i + 1) % n]) for i in range(n)]
    return out


def _cross(lay: hg.Layout, pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pairs that cross nodes (all pairs when none does)."""
    x = [p for p in pairs if lay.node[p[0]] != lay.node[p[1]]]
    return x or pairs


def _sizes(n_jobs: int, scale: float, rng: random.Random) -> list[int]:
    """World sizes of the slow-fault and clean jobs: a few large ones, most small."""
    if scale >= 1.0:
        big = [1024, 512] + [256] * 4 + [128] * 8
        big = big * max(1, int(round(scale)))
    elif scale >= 0.5:
        big = [512, 256, 256] + [128] * 4
    elif scale >= 0.25:
        big = [128] * 3
    else:
        big = []
    small = [16, 32] if scale < 0.25 else [16, 32, 64, 64]
    out = big[:n_jobs] + [rng.choice(small) for _ in range(max(0, n_jobs - len(big)))]
    rng.shuffle(out)
    return out


def _iterations(world: int, rng: random.Random) -> int:
    if world >= 512:
        return 22
    if world >= 256:
        return 26
    return rng.randint(28, 34)


def _window(rng: random.Random, iterations: int, lo: int = 8, hi: int = 12,
            open_ok: bool = True) -> tuple[int, int | None]:
    start = rng.randint(lo, hi)
    if open_ok and rng.random() < 0.3:
        return start, None
    end = min(iterations - 3, start + rng.randint(8, 12))
    return start, end


def suite(scale: float = 1.0, seed: int = 0) -> list[Job]:
    """Draw the suite: ``FAMILIES[f] * scale`` jobs per family (at least one)."""
    rng = random.Random(f"heldout-suite-{seed}")
    draw = _Draw(rng)
    counts = {f: max(1, int(round(n * scale))) for f, n in FAMILIES.items()}
    sized = ["compute", "link-dp", "link-pp", "clean", "compute-pass", "mixed"]
    n_sized = sum(counts[f] for f in sized)
    sizes = _sizes(n_sized, scale, rng)
    small_cap = 32 if scale < 0.25 else 128
    jobs: list[Job] = []
    for family, n in counts.items():
        for i in range(n):
            name = f"{family}-{i}"
            s = rng.getrandbits(31)
            if family in sized:
                world = sizes.pop()
            else:
                world = rng.choice([16, 32] if scale < 0.25 else [16, 32, 64, small_cap])
            jobs.append(_job(draw, name, family, world, s, i))
    return jobs


def _job(draw: _Draw, name: str, family: str, world: int, seed: int, i: int) -> Job:
    rng = draw.rng
    for attempt in range(20):
        job = _try_job(draw, name, family, world, seed + attempt, i)
        if job is not None:
            return job
        rng.random()
    raise RuntimeError(f"no {family} job drawn for {world} ranks")


def _try_job(draw: _Draw, name: str, family: str, world: int, seed: int, i: int
             ) -> Job | None:
    rng = draw.rng
    F = hg.Fault
    # pure data parallelism: the first two compute jobs, a DP-link job, a clean job
    pure = (family == "compute" and i < 2) or (family in ("link-dp", "clean") and i == 0)
    if pure:
        world = rng.choice([16, 32, 64])
    # mild DP hops (odd link-dp jobs) sit in the last pipeline stage, whose gradient sync
    # starts while the first stages still run the backward passes of the cool-down
    mild = family == "link-dp" and i % 2 == 1
    need_pp = family == "link-pp" or mild
    tp, pp, dp = draw.shape(world, need_pp=need_pp, pure_dp=pure)
    if mild and pp < 4:
        return None
    iterations = _iterations(world, rng)
    if family == "compute-then-link":
        iterations = 42
    spec = draw.spec(tp, pp, dp, seed, iterations, pure_dp=pure)
    lay = _layout(spec)
    W = spec.world
    units: list[Unit] = []
    faults: list[hg.Fault] = []

    def link_pair(kind: str, near: int | None = None) -> tuple[int, int] | None:
        pairs = _pp_pairs(lay) if kind == "pp" else _dp_hops(lay)
        if near is not None:
            pairs = [p for p in pairs if near in p]
        pairs = _cross(lay, pairs)
        return rng.choice(pairs) if pairs else None

    def add_link(kind: str, start: int, end: int | None, factor: float,
                 pair: tuple[int, int] | None) -> bool:
        if pair is None:
            return False
        faults.append(F("communication", pair[0], peer=pair[1], start=start, end=end,
                        factor=factor))
        units.append(Unit(family, "slow", "communication", sorted(pair), [len(faults) - 1],
                          link=sorted(pair), stage=LINK_STAGE[kind]))
        return True

    if family in ("compute", "compute-pass"):
        r = rng.randrange(W)
        start, end = _window(rng, iterations)
        phase = rng.choice(["f", "b"]) if family == "compute-pass" else None
        factor = rng.uniform(1.3, 2.5) if phase is None else rng.uniform(1.6, 3.0)
        faults.append(F("compute", r, start=start, end=end, factor=factor, phase=phase))
        units.append(Unit(family, "slow", "compute", [r], [0],
                          stage={"f": "forward", "b": "backward", None: None}[phase]))
    elif family == "link-pp":
        start, end = _window(rng, iterations)
        spec.pp_bytes = rng.choice([32, 64, 128]) << 20
        if not add_link("pp", start, end, rng.uniform(1.5, 5.0), link_pair("pp")):
            return None
    elif family == "link-dp":
        start, end = _window(rng, iterations)
        if dp < 2:
            return None
        spec.dp_bytes = (rng.choice([32, 64, 128]) if mild else rng.choice([256, 512, 1024])) << 20
        factor = rng.uniform(2.0, 4.5) if mild else rng.uniform(2.0, 5.0)
        hops = _dp_hops(lay)
        if mild:
            hops = [h for h in hops if lay.coord[h[0]]["pp"] == pp - 1]
        pair = rng.choice(_cross(lay, hops)) if hops else None
        if not add_link("dp", start, end, factor, pair):
            return None
    elif family == "mixed":
        start, end = _window(rng, iterations, open_ok=False)
        kinds = [k for k, ok in (("pp", pp > 1), ("dp", dp > 1)) if ok]
        rng.shuffle(kinds)
        for kind in kinds:
            if kind == "pp":
                spec.pp_bytes = 64 << 20
            cands = [p for p in (_pp_pairs(lay) if kind == "pp" else _dp_hops(lay))
                     if lay.node[p[0]] != lay.node[p[1]]]
            if cands:
                a, b = rng.choice(cands)
                r = rng.choice([a, b])
                faults.append(F("compute", r, start=start, end=end,
                                factor=rng.uniform(1.3, 2.0)))
                faults.append(F("communication", a, peer=b, start=start, end=end,
                                factor=rng.uniform(2.0, 5.0)))
                units.append(Unit(family, "slow", "mixed", [r], [0, 1], link=sorted((a, b)),
                                  stage=LINK_STAGE[kind]))
                break
        else:
            return None
    elif family == "compute-then-link":
        r = rng.randrange(W)
        s1 = rng.randint(6, 9)
        e1 = s1 + rng.randint(8, 10)
        faults.append(F("compute", r, start=s1, end=e1, factor=rng.uniform(1.4, 2.2)))
        units.append(Unit(family, "slow", "compute", [r], [0]))
        s2 = e1 + rng.randint(4, 6)
        kind = "pp" if pp > 1 and rng.random() < 0.5 else "dp"
        if kind == "pp":
            spec.pp_bytes = 64 << 20
        else:
            spec.dp_bytes = 512 << 20
        if not add_link(kind, s2, min(iterations - 3, s2 + 10), rng.uniform(2.5, 5.0),
                        link_pair(kind)):
            return None
    elif family == "two-stragglers":
        if dp < 2:
            return None
        start, end = _window(rng, iterations)
        a = rng.randrange(W)
        others = [r for r in range(W) if lay.coord[r]["dp"] != lay.coord[a]["dp"]
                  and (pp == 1 or lay.coord[r]["pp"] != lay.coord[a]["pp"])
                  and (tp == 1 or lay.coord[r]["tp"] != lay.coord[a]["tp"])]
        if not others:
            return None
        b = rng.choice(others)
        for r in (a, b):
            faults.append(F("compute", r, start=start, end=end, factor=rng.uniform(1.4, 2.2)))
        units.append(Unit(family, "slow", "compute", sorted((a, b)), [0, 1]))
    elif family.startswith("hang"):
        cause = HANG_CAUSE[family]
        kinds = [k for k, d in (("tp", tp), ("pp", pp), ("dp", dp)) if d > 1]
        kind = rng.choice(kinds)
        start = rng.randint(10, 14)
        spec.iterations = start + 4
        r = rng.randrange(W)
        mb = rng.randrange(spec.microbatches)
        index = rng.randrange(4) if kind == "tp" else 0
        mismatch = "op" if kind != "pp" and rng.random() < 0.5 else "bytes"
        faults.append(F(cause, r, start=start, comm=kind, microbatch=mb, index=index,
                        mismatch=mismatch))
        units.append(Unit(family, "hang", cause, [r], [0], stage=hg.STAGE[kind]))
        spec.progress_ms = 50.0
    elif family != "clean":
        raise ValueError(family)
    spec.faults = faults
    spec.job = f"heldout-{name}"
    return Job(name, family, spec, units)


# ---------------------------------------------------------------------------------------------
# running and scoring


def truth_units(job: Job, truth: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's faults as scored: the generator's truth merged per :class:`Unit`.

    ``pinnable``: whether the trace holds what names a slow link. A pipeline send and its
    receive are timed apart; a hop between nodes has link rows when the job has them. A
    hop of a ring inside a node (NVLink: no link rows), or between nodes without link rows,
    is not: every step of a ring waits for its slowest hop, so all members end together
    and only a probe can tell which hop it was."""
    out = []
    lay = _layout(job.spec)
    tas = truth["anomalies"]
    for k, u in enumerate(job.units):
        parts = [tas[i] for i in u.faults]
        starts = [p["start_ns"] for p in parts if p.get("start_ns") is not None]
        ends = [p.get("end_ns") for p in parts]
        slow = [p["slowdown"] for p in parts if p.get("slowdown") is not None]
        family = u.family
        cost = max(slow) if slow else None
        if family == "link-dp" and cost is not None and cost < MILD:
            family = "link-dp-mild"
        out.append({
            "id": f"{job.name}/{k}", "family": family, "kind": u.kind, "cause": u.cause,
            "ranks": sorted(u.ranks), "link": u.link, "stage": u.stage,
            "start_ns": min(starts) if starts else None,
            "end_ns": None if any(e is None for e in ends) else max(int(e) for e in ends),
            "iteration_start": min(p["iteration_start"] for p in parts),
            "iteration_ends_ns": min((p.get("iteration_ends_ns") or [] for p in parts),
                                     key=lambda e: e[0] if e else 2**63),
            "baseline_s": parts[0].get("baseline_s"),
            "slowdown": cost,
            "triggered": all(p.get("triggered", True) for p in parts),
            "marginal": u.cause == "compute" and cost is not None and cost < MARGINAL,
            "pinnable": u.link is None or u.stage == "pp_p2p" or (
                job.spec.link_rows and lay.node[u.link[0]] != lay.node[u.link[1]]),
        })
    return out


def run_job(job: Job, workdir: Path | None = None, probes: bool = True) -> dict[str, Any]:
    """Generate one job, diagnose it like ``failslow analyze`` and score it; ``probes``: and
    again with active validation probes answered by the generated cluster
    (:mod:`failslow.bench.heldout_probes`), scored under ``with_probes``."""
    from failslow.engine.offline import analyze

    keep: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / job.name
        t0 = time.perf_counter()
        truth = hg.write(job.spec, path, keep)
        t1 = time.perf_counter()
        diag = analyze(path).to_dict()
        t2 = time.perf_counter()
        out = result(job, truth, diag, gen_s=t1 - t0, analyze_s=t2 - t1)
        if probes:
            out["with_probes"] = hp.run_probed(job.spec, keep, path, truth_units(job, truth))
    return out


def result(job: Job, truth: dict[str, Any], diag: dict[str, Any], gen_s: float = 0.0,
           analyze_s: float = 0.0) -> dict[str, Any]:
    """Score a diagnosis of ``job`` against the generator's ``truth``."""
    units = truth_units(job, truth)
    anomalies = list(diag.get("anomalies") or [])
    scored = score_job(units, anomalies)
    s = job.spec
    return {"name": job.name, "family": job.family, "ranks": s.world,
            "shape": f"tp{s.tp}pp{s.pp}dp{s.dp}", "order": "".join(d[0] for d in s.order),
            "iterations": s.iterations, "seconds": round(gen_s + analyze_s, 2),
            "analyze_seconds": round(analyze_s, 2), **scored,
            "diagnosed": [{k: a.get(k) for k in ("kind", "cause", "ranks", "link", "stage",
                                                 "start_ns", "end_ns", "detected_ns")}
                          for a in anomalies],
            "truth": units}


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The suite's figures, the floors and the per-family table."""
    fig = figures(results)
    order = [*FAMILIES, "link-dp-mild"]
    fams = sorted({f["family"] for r in results for f in r["faults"]}
                  | {r["family"] for r in results},
                  key=lambda f: order.index("link-dp") + 0.5 if f == "link-dp-mild"
                  else order.index(f))
    per = {fam: figures(results, fam) for fam in fams}
    out = {"figures": fig, "floors": floors(fig),
           "all_floors_pass": all(v["pass"] for v in floors(fig).values()),
           "families": per}
    if any("with_probes" in r for r in results):
        out.update(hp.summary(results, fams))
    return out


def heldout_suite(scale: float = 1.0, seed: int = 0,
                  progress: Callable[[dict[str, Any]], None] | None = None,
                  probes: bool = True) -> dict[str, Any]:
    """Draw, run and score the suite; ``progress`` is called with each job's result;
    ``probes``: each job is diagnosed a second time with probes on (``*_with_probes``)."""
    t0 = time.perf_counter()
    results = []
    for job in suite(scale, seed):
        res = run_job(job, probes=probes)
        results.append(res)
        if progress is not None:
            progress(res)
    out: dict[str, Any] = {"seed": seed, "scale": scale}
    out.update(summarize(results))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["per_job"] = results
    return out


# ---------------------------------------------------------------------------------------------
# printing


def line(r: dict[str, Any]) -> str:
    """One job's outcome on one line."""
    parts = []
    for f in r["faults"]:
        if not f["found"]:
            parts.append(f"MISSED {f['true']['cause']}{f['true']['ranks']}"
                         + (" (marginal)" if f["marginal"] else "")
                         + ("" if f["cost"] is None else f" cost {f['cost'] - 1:+.1%}"))
            continue
        bad = [k for k in ("cause", "ranks", "link", "stage") if f.get(k) is False]
        lat = f.get("latency_it", f.get("latency_s"))
        parts.append(f"{f['got']['cause']}{f['got']['ranks']}"
                     + (f" link {f['got']['link']}" if f['got']['link'] else "")
                     + ("" if lat is None else f" lat {lat:.2f}")
                     + (f" WRONG {','.join(bad)} (true {f['true']})" if bad else ""))
    for a in r["false_positives"]:
        parts.append(f"FP {a['kind']}/{a['cause']}{a['ranks']}")
    probed = hp.line(r["with_probes"]) if "with_probes" in r else ""
    return (f"{r['name']:22s} {r['shape']:14s} {r['order']} {r['ranks']:5d} "
            f"{r['seconds']:5.1f}s  " + ("; ".join(parts) or "-") + probed)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if not math.isinf(v) else "inf"
    return str(v)


def table(out: dict[str, Any]) -> str:
    """The floors (figure, floor, pass/fail) and the per-family table, as text."""
    lines = [f"held-out suite (seed {out.get('seed')}, scale {out.get('scale')}, "
             f"{out['figures']['jobs']} jobs, {out.get('seconds', '-')} s)",
             f"  {'figure':36s} {'value':>8s}  floor    result"]
    for key, f in out["floors"].items():
        lines.append(f"  {key:36s} {_fmt(f['value']):>8s}  {f['op']} {f['floor']:<5g} "
                     f"{'pass' if f['pass'] else 'FAIL'}")
    fig = out["figures"]
    lines.append(f"  also: precision {_fmt(fig['slow_precision'])} recall "
                 f"{_fmt(fig['slow_recall'])} latency p95 {_fmt(fig['latency_p95_iterations'])}"
                 f" (>5: {fig['latency_over_5']}) hang class {_fmt(fig['hang_class_accuracy'])}"
                 f" root {_fmt(fig['hang_root_accuracy'])} marginal {fig['marginal_faults']}")
    lines.append(f"  where the trace can pin the link ({fig['link_faults_pinnable']} of "
                 f"{fig['link_faults_found']} found link faults): link "
                 f"{_fmt(fig['link_accuracy_where_pinnable'])}, exact ranks "
                 f"{_fmt(fig['exact_rank_accuracy_where_pinnable'])} (the others need a probe)")
    cols = [("jobs", "jobs"), ("faults", "slow_faults"), ("found", "slow_found"),
            ("fp", "slow_false_positives"), ("f1", "slow_f1"), ("cause", "cause_accuracy"),
            ("ranks", "exact_rank_accuracy"), ("link", "link_accuracy"),
            ("stage", "stage_accuracy"), ("lat-med", "latency_median_iterations"),
            ("lat-max", "latency_max_iterations"), ("cost", "cost_median"),
            ("clean-a", "clean_run_anomalies"),
            ("hangs", "hang_faults"), ("h-f1", "hang_f1"), ("h-cls", "hang_class_accuracy"),
            ("h-root", "hang_root_accuracy")]
    lines.append("  " + f"{'family':18s}" + "".join(f"{c:>8s}" for c, _ in cols))
    for fam, f in out["families"].items():
        lines.append("  " + f"{fam:18s}" + "".join(f"{_fmt(f.get(k)):>8s}" for _, k in cols))
    if "floors_with_probes" in out:
        lines += hp.table(out)
    return "\n".join(lines)


def bench_heldout(args: argparse.Namespace) -> dict[str, Any]:
    """``failslow bench accuracy-heldout [--seed N] [--scale S] [--json]``: the held-out
    suite alone, one line per job while it runs, then the floors and the families; without
    probes (issue 14's floors) and with them (issue 17: ``*_with_probes``), side by side
    (``args.probes`` False: without only)."""
    seed = int(getattr(args, "seed", 0) or 0)
    quiet = bool(getattr(args, "json", False))
    out = heldout_suite(args.scale, seed,
                        progress=None if quiet else (lambda r: print(line(r), flush=True)),
                        probes=bool(getattr(args, "probes", True)))
    if not quiet:
        print(table(out))
    return out


BENCHMARKS = {"accuracy-heldout": bench_heldout}
