"""The scenarios of ``failslow bench accuracy`` (:mod:`failslow.bench.accuracy`): simulated
jobs of 16 to 1024 ranks, every slow cause at several severities, compound faults and clean
runs with GC pauses, sequence-length variation and a heavy last stage, each a simulator
scenario dict with its seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GPN = 8  # GPUs per node in every scenario (the simulator's default)


@dataclass
class Case:
    """One scenario of the suite: a name, the simulator scenario dict and a seed."""

    name: str
    spec: dict[str, Any]
    seed: int = 0
    tags: tuple[str, ...] = ()

    @property
    def world(self) -> int:
        p = self.spec["parallel"]
        return int(p["tp"] * p["pp"] * p["dp"] * p.get("cp", 1))


def _job(tp: int, pp: int, dp: int, iterations: int = 32, mb: int | None = None,
         sampling: str = "link", **over: Any) -> dict[str, Any]:
    """A scenario dict. ``sampling``: ``link`` (coll, spans, link rows every 100 ms, gpu rows
    every second), ``full`` (also progress rows) or ``bare`` (coll rows only)."""
    samp = {"link": {"progress_ms": 0.0, "link_ms": 100.0, "gpu_ms": 1000.0},
            "full": {"progress_ms": 50.0, "link_ms": 100.0, "gpu_ms": 1000.0},
            "bare": {"progress_ms": 0.0, "link_ms": 0.0, "gpu_ms": 0.0, "spans": False},
            }[sampling]
    d: dict[str, Any] = {"job": f"acc-{tp}x{pp}x{dp}", "parallel": {"tp": tp, "pp": pp,
                                                                   "dp": dp, "cp": 1},
                         "microbatches": mb if mb is not None else max(4, 2 * pp),
                         "iterations": iterations, "sampling": samp}
    d.update(over)
    return d


def _pp_nodes(tp: int, dp: int, rank: int) -> list[int]:
    """The nodes of ``rank`` and of its next pipeline stage's counterpart."""
    return [rank // GPN, (rank + tp * dp) // GPN]


def _dp_nodes(tp: int, dp: int, stage: int, hop: int = 0) -> list[int]:
    """Two consecutive nodes of one stage (its DP rings cross them; the stage must span
    more than one node)."""
    size = tp * dp
    if size <= GPN:
        raise ValueError("the stage fits in one node: its DP rings cross no link")
    first = stage * size // GPN
    return [first + hop, first + hop + 1]


def _comp(ranks: list[int], start: int, dur: int | None, sev: float,
          stage: str | None = None) -> dict[str, Any]:
    f: dict[str, Any] = {"cause": "compute", "ranks": ranks, "start": start, "severity": sev}
    if dur is not None:
        f["duration"] = dur
    if stage:
        f["stage"] = stage
    return f


def _link(nodes: list[int], start: int, dur: int | None, sev: float) -> dict[str, Any]:
    f: dict[str, Any] = {"cause": "communication", "nodes": nodes, "start": start,
                         "severity": sev}
    if dur is not None:
        f["duration"] = dur
    return f


def _mixed(rank: int, nodes: list[int], start: int, dur: int, sev: float,
           lsev: float) -> dict[str, Any]:
    return {"cause": "mixed", "ranks": [rank], "nodes": nodes, "start": start,
            "duration": dur, "severity": sev, "link_severity": lsev}


def suite(scale: float = 1.0) -> list[Case]:
    """The scenarios (``scale`` < 1 keeps a smaller, cheaper subset). Faults are placed
    where they cost the job time: a middle pipeline stage slowed by less than the last
    stage's extra load is absorbed by pipeline bubbles (MEGATRACE §III-C), and such a
    fault is no slow-down of the job."""
    cases: list[Case] = []

    def add(name: str, spec: dict[str, Any], seed: int = 0) -> None:
        spec = dict(spec)
        spec["job"] = f"acc-{name}"
        cases.append(Case(name, spec, seed))

    comp, link, mixed = _comp, _link, _mixed
    big_pp = {"pp_bytes": 96 << 20}
    heavy_dp = {"dp_bytes": 4 << 30}
    gc = {"gc_prob": 0.01, "gc_ms": [30.0, 150.0]}

    # --- compute stragglers: sizes 16..1024, severities 1.15..5
    add("c16-tp2pp2dp4-1.5", _job(2, 2, 4, faults=[comp([5], 12, 12, 1.5)]))
    add("c16-tp1pp4dp4-1.3", _job(1, 4, 4, faults=[comp([13], 14, 10, 1.3)]), 1)
    add("c16-tp4pp1dp4-2", _job(4, 1, 4, faults=[comp([6], 12, 10, 2.0)]), 2)
    add("c16-tp1pp8dp2-1.2-last", _job(1, 8, 2, faults=[comp([15], 14, 12, 1.2)]), 3)
    add("c32-tp2pp4dp4-1.15-last", _job(2, 4, 4, faults=[comp([27], 14, 12, 1.15)]), 4)
    add("c32-tp2pp4dp4-5", _job(2, 4, 4, faults=[comp([3], 12, 10, 5.0)]), 5)
    add("c32-tp4pp2dp4-1.25", _job(4, 2, 4, faults=[comp([19], 12, 12, 1.25)]), 6)
    add("c64-tp8pp2dp4-1.5", _job(8, 2, 4, faults=[comp([37], 12, 12, 1.5)]), 7)
    add("c64-tp2pp4dp8-1.5-fwd", _job(2, 4, 8, faults=[comp([50], 12, 12, 1.5, "forward")]), 8)
    add("c64-tp2pp4dp8-1.5-bwd", _job(2, 4, 8, faults=[comp([44], 12, 12, 1.5, "backward")]),
        9)
    add("c64-gpipe-1.5", _job(2, 4, 8, schedule="gpipe", faults=[comp([30], 12, 12, 1.5)]),
        10)
    add("c64-cp2-1.5", _job(2, 2, 8, parallel={"tp": 2, "pp": 2, "dp": 8, "cp": 2},
                            faults=[comp([37], 12, 12, 1.5)]), 11)
    add("c64-bare-2", _job(2, 4, 8, sampling="bare", faults=[comp([22], 12, 12, 2.0)]), 12)
    add("c64-bare-fwd-1.5-last", _job(2, 4, 8, sampling="bare",
                                      faults=[comp([51], 12, 12, 1.5, "forward")]), 63)
    add("c64-bare-bwd-2-mid", _job(2, 4, 8, sampling="bare",
                                   faults=[comp([20], 12, 12, 2.0, "backward")]), 64)
    add("c32-bare-fwd-3-first", _job(2, 4, 4, sampling="bare",
                                     faults=[comp([2], 12, 12, 3.0, "forward")]), 65)
    add("c128-tp4pp4dp8-1.25-last", _job(4, 4, 8, faults=[comp([100], 14, 12, 1.25)]), 13)
    add("c128-tp2pp8dp8-3", _job(2, 8, 8, mb=8, faults=[comp([100], 12, 8, 3.0)]), 14)
    add("c256-tp8pp4dp8-1.3", _job(8, 4, 8, faults=[comp([200], 14, 10, 1.3)]), 15)
    add("c256-tp4pp2dp32-1.5-open", _job(4, 2, 32, faults=[comp([131], 16, None, 1.5)]), 16)
    add("c512-tp8pp8dp8-1.5", _job(8, 8, 8, iterations=28, mb=8,
                                   faults=[comp([480], 12, 10, 1.5)]), 17)
    add("c1024-tp8pp4dp32-1.5-last", _job(8, 4, 32, iterations=26, mb=8,
                                          faults=[comp([777], 12, 8, 1.5)]), 18)
    add("c1024-tp4pp4dp64-2", _job(4, 4, 64, iterations=26, mb=8,
                                   faults=[comp([515], 12, 8, 2.0)]), 19)

    # --- slow links: PP and DP, 1.3..5 (jobs with enough traffic that the link matters)
    add("l16-tp2pp2dp4-pp-3", _job(2, 2, 4, timing=big_pp,
                                   faults=[link(_pp_nodes(2, 4, 1), 12, 12, 3.0)]), 20)
    add("l32-tp2pp2dp8-dp-1.3", _job(2, 2, 8, timing=heavy_dp,
                                     faults=[link(_dp_nodes(2, 8, 1), 12, 12, 1.3)]), 21)
    add("l64-tp2pp4dp8-dp-2", _job(2, 4, 8, faults=[link(_dp_nodes(2, 8, 0), 12, 12, 2.0)]), 22)
    add("l64-tp2pp4dp8-pp-5", _job(2, 4, 8, timing=big_pp,
                                   faults=[link(_pp_nodes(2, 8, 16), 12, 12, 5.0)]), 23)
    add("l64-tp8pp4dp2-dp-1.5", _job(8, 4, 2, timing=heavy_dp,
                                     faults=[link(_dp_nodes(8, 2, 0), 12, 12, 1.5)]), 24)
    add("l64-bare-dp-3", _job(2, 4, 8, sampling="bare",
                              faults=[link(_dp_nodes(2, 8, 2), 12, 12, 3.0)]), 25)
    add("l128-tp4pp4dp8-pp-4", _job(4, 4, 8, timing=big_pp,
                                    faults=[link(_pp_nodes(4, 8, 40), 12, 12, 4.0)]), 26)
    add("l128-tp2pp8dp8-dp-3", _job(2, 8, 8, mb=8, timing=heavy_dp,
                                    faults=[link(_dp_nodes(2, 8, 5), 12, 12, 3.0)]), 27)
    add("l256-tp4pp2dp32-pp-3", _job(4, 2, 32, timing={"pp_bytes": 256 << 20},
                                     faults=[link(_pp_nodes(4, 32, 60), 14, 10, 3.0)]), 28)
    add("l512-tp2pp4dp64-pp-2", _job(2, 4, 64, iterations=28, timing={"pp_bytes": 256 << 20},
                                     faults=[link(_pp_nodes(2, 64, 130), 12, 10, 2.0)]), 29)
    add("l1024-tp8pp4dp32-pp-4", _job(8, 4, 32, iterations=26, mb=8,
                                      timing={"pp_bytes": 256 << 20},
                                      faults=[link(_pp_nodes(8, 32, 264), 12, 8, 4.0)]), 30)

    # --- mixed: a slow rank whose own link is slow too
    add("m64-tp2pp4dp8", _job(2, 4, 8, faults=[mixed(37, [4, 6], 12, 12, 1.3, 6.0)]), 31)
    add("m32-tp2pp4dp4", _job(2, 4, 4, faults=[mixed(9, _pp_nodes(2, 4, 9), 12, 12, 1.5, 4.0)]),
        32)
    add("m128-tp4pp4dp8", _job(4, 4, 8, timing=big_pp,
                               faults=[mixed(36, _pp_nodes(4, 8, 36), 12, 12, 1.4, 3.0)]), 33)

    # --- compound: two faults at different times, two ranks at once, overlapping faults
    add("x64-compute-then-link", _job(2, 4, 8, iterations=44,
                                      faults=[comp([21], 8, 10, 1.6),
                                              link(_pp_nodes(2, 8, 32), 28, 10, 8.0)]), 40)
    add("x64-two-ranks-two-stages", _job(2, 4, 8, faults=[comp([9, 42], 12, 12, 1.4)]), 41)
    add("x32-two-ranks-one-stage", _job(2, 4, 4, faults=[comp([17, 22], 12, 12, 1.5)]), 42)
    add("x128-link-then-compute", _job(4, 4, 8, iterations=44, timing=big_pp,
                                       faults=[link(_pp_nodes(4, 8, 8), 8, 10, 4.0),
                                               comp([99], 28, 10, 1.5)]), 43)
    add("x64-two-computes", _job(2, 4, 8, iterations=44,
                                 faults=[comp([55], 8, 10, 1.3), comp([60], 28, 10, 2.0)]), 44)
    add("x64-link-during-compute", _job(2, 4, 8, iterations=44,
                                        faults=[comp([52], 8, 24, 1.3),
                                                link(_dp_nodes(2, 8, 1), 18, 10, 3.0)]), 45)
    add("x32-compute-during-compute", _job(2, 4, 4, iterations=44,
                                           faults=[comp([26], 8, 24, 1.2),
                                                   comp([3], 18, 10, 2.5)]), 46)

    # --- faults in noisy jobs (GC pauses, sequence lengths, jitter)
    add("n64-gc-compute-1.3", _job(2, 4, 8, noise={**gc, "seqlen_sigma": 0.1},
                                   faults=[comp([49], 12, 12, 1.3)]), 47)
    add("n128-noise-dp-2", _job(2, 8, 8, mb=8, timing=heavy_dp,
                                noise={**gc, "compute_jitter": 0.04},
                                faults=[link(_dp_nodes(2, 8, 0), 12, 12, 2.0)]), 48)
    add("n32-gc-compute-2", _job(2, 4, 4, noise={"gc_prob": 0.02, "gc_ms": [30.0, 150.0]},
                                 faults=[comp([12], 12, 12, 2.0)]), 49)

    # --- clean runs: GC pauses, sequence-length variation, heavy last stage, jitter
    add("h16-gc", _job(2, 2, 4, sampling="full", noise=gc), 50)
    add("h32-seqlen", _job(2, 4, 4, sampling="full", noise={"seqlen_sigma": 0.15}), 51)
    add("h64-heavy-last", _job(2, 4, 8, timing={"last_stage_factor": 1.5}), 52)
    add("h64-all-noise", _job(2, 4, 8, timing={"last_stage_factor": 1.3},
                              noise={**gc, "seqlen_sigma": 0.12, "compute_jitter": 0.05,
                                     "comm_jitter": 0.08}), 53)
    add("h16-tp1pp8dp2-noise", _job(1, 8, 2, noise={**gc, "seqlen_sigma": 0.1}), 54)
    add("h128-gc-skew", _job(4, 4, 8, noise={**gc, "clock_skew_ms": 3.0}), 55)
    add("h64-gpipe-noise", _job(2, 4, 8, schedule="gpipe", sampling="full",
                                noise={"seqlen_sigma": 0.1, "compute_jitter": 0.04}), 56)
    add("h256-noise", _job(8, 4, 8, noise={**gc, "seqlen_sigma": 0.1},
                           timing={"last_stage_factor": 1.4}), 57)
    add("h16-tp4pp1dp4-gc", _job(4, 1, 4, noise={"gc_prob": 0.03, "gc_ms": [50.0, 200.0]}), 58)
    add("h512-noise", _job(2, 4, 64, iterations=28, noise={**gc, "seqlen_sigma": 0.1}), 59)
    add("h1024-noise", _job(8, 4, 32, iterations=26, mb=8,
                            noise={"gc_prob": 0.002, "seqlen_sigma": 0.08}), 60)
    add("h64-comm-jitter", _job(2, 4, 8, noise={"comm_jitter": 0.15, "compute_jitter": 0.03},
                                timing={"dp_bytes": 2 << 30}), 61)
    add("h64-bare-noise", _job(2, 4, 8, sampling="bare", noise={**gc, "seqlen_sigma": 0.1}),
        62)

    if scale >= 1.0:
        return cases
    # a smaller suite: the cheapest scenarios, every kind represented
    keep = max(5, int(round(len(cases) * scale)))
    small = sorted(cases, key=lambda c: (c.world, c.name))
    out: list[Case] = []
    for prefix in ("c", "l", "m", "x", "h"):
        first = next((c for c in small if c.name.startswith(prefix)), None)
        if first is not None:
            out.append(first)
    for c in small:
        if len(out) >= keep:
            break
        if c not in out:
            out.append(c)
    return out


