"""Ground truth of a finished run (diagnosis.md): :func:`build_truth`, plus the job's
:func:`job_meta` and the iteration figures both the truth and the trace tables use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import JobMeta
from failslow.simulator.engine import Engine
from failslow.simulator.faults import HangRT, LinkRT, Observed
from failslow.simulator.scenario import Fault
from failslow.simulator.schedule import BWD, DPSYNC, FWD, OPT, P2P
from failslow.simulator.topology import K_CP, K_DP, K_PP, K_TP, KIND_NAMES, Topology

STAGE_OF_KIND = {K_TP: "tp_collective", K_CP: "tp_collective", K_DP: "dp_sync",
                 K_PP: "pp_p2p"}


def job_meta(eng: Engine) -> JobMeta:
    sc, topo = eng.sc, eng.topo
    p = sc.parallel
    return JobMeta(job=sc.job, t=sc.start_time_ns, world_size=topo.world, tp=p.tp, pp=p.pp,
                   dp=p.dp, cp=p.cp, microbatches=sc.microbatches, schedule=sc.schedule,
                   nodes=topo.nodes_map(), comms=tuple(topo.comms))


def median_iteration_ns(iter_end: list[float]) -> float:
    d = iteration_durations(iter_end)
    d = d[np.isfinite(d)]
    return float(np.median(d)) if d.size else 0.0


def iteration_durations(iter_end: list[float]) -> np.ndarray:
    ends = np.asarray(iter_end, dtype=float)
    prev = np.concatenate([[0.0], ends[:-1]])
    return ends - prev


def period_ops(eng: Engine) -> int:
    """Operations per iteration on rank 0 (stage 0): its TP/CP rounds, p2p ops and DP syncs."""
    prog = eng.programs[0]
    n = 0
    for st in prog:
        if st.kind == P2P:
            n += len(st.ops)
        elif st.kind == OPT:
            continue
        elif st.kind in (FWD, BWD):
            i = 0 if st.kind == FWD else 1
            n += eng.ntp[i] + eng.ncp[i]
        elif st.kind == DPSYNC and eng.D > 1:
            n += 1
    return n


def build_truth(eng: Engine, counterfactual: Callable[[], Engine] | None = None
                ) -> tuple[Diagnosis, dict[str, Any]]:
    """The ground truth (diagnosis.md) of a finished run, plus figures for the stats.

    ``slowdown`` of a slow fault: the mean true iteration time over the iterations the fault
    touched, over the baseline: the median of the iterations no fault touched (nor the one
    after a fault). With fewer than 3 such iterations the baseline is the same iterations of
    a fault-free run with the same seed (``counterfactual``), the what-if paper's
    straggler-free timeline (§3.2-3.3).
    """
    sc, topo = eng.sc, eng.topo
    t0 = sc.start_time_ns
    dur = iteration_durations(eng.iter_end)
    complete = np.isfinite(dur)
    iterations = {"period_ops": period_ops(eng),
                  "median_s": round(float(np.median(dur[complete])) / 1e9, 6)
                  if complete.any() else None,
                  "count": int(complete.sum())}
    # iterations touched by any fault (plus the one after, which may still be delayed)
    touched = np.zeros(dur.size, dtype=bool)
    for o in _all_observed(eng):
        if o.it_first is not None:
            lo, hi = o.it_first, (o.it_last if o.it_last is not None else dur.size)
            touched[lo:min(dur.size, hi + 2)] = True
    healthy = complete & ~touched
    healthy[0] = False
    baseline = float(np.median(dur[healthy])) if healthy.sum() >= 3 else None
    cf_cache: list[np.ndarray] = []

    def cf_durations() -> np.ndarray | None:
        if counterfactual is None:
            return None
        if not cf_cache:
            cf_cache.append(iteration_durations(counterfactual().iter_end))
        return cf_cache[0]

    def slowdown(obs_list: list[Observed]) -> float | None:
        its: set[int] = set()
        for o in obs_list:
            if o.it_first is not None and o.it_last is not None:
                its.update(range(o.it_first, o.it_last + 1))
        idx = np.array(sorted(i for i in its if i < dur.size and complete[i]), dtype=np.int64)
        if idx.size == 0:
            return None
        if baseline is not None:
            return round(float(dur[idx].mean()) / baseline, 4)
        cf_dur = cf_durations()
        if cf_dur is not None:
            ok = idx[idx < cf_dur.size]
            return round(float(dur[ok].mean() / cf_dur[ok].mean()), 4) if ok.size else None
        return None

    anomalies: list[Anomaly] = []
    unobserved: list[int] = []
    compute_by = {cf.fault_index: cf for cf in eng.faults.compute}
    link_by = {lf.fault_index: lf for lf in eng.faults.links}
    for i, f in enumerate(sc.faults):
        fid = f.id or f"fault-{i}"
        if f.is_hang:
            h = eng.faults.hang
            if h is None or not h.triggered or not math.isfinite(h.trigger_ns):
                unobserved.append(i)
                continue
            anomalies.append(_hang_anomaly(fid, f, h, topo, t0))
            continue
        obs: list[Observed] = []
        cf = compute_by.get(i)
        lf = link_by.get(i)
        if cf is not None:
            obs.append(cf.observed)
        if lf is not None:
            obs.append(lf.observed)
        seen = [o for o in obs if o.it_first is not None]
        if not seen or (f.cause == "mixed" and len(seen) < 2):
            unobserved.append(i)
            if not seen:
                continue
        first = min(o.first_ns for o in seen)
        last = max(o.last_ns for o in seen)
        open_ended = f.duration_iterations is None and f.duration_s is None
        extra: dict[str, Any] = {
            "severity": f.severity,
            "iteration_start": min(o.it_first for o in seen if o.it_first is not None),
            "iteration_end": None if open_ended else
            max(o.it_last for o in seen if o.it_last is not None) + 1,
            "baseline_s": round(baseline / 1e9, 6) if baseline else None,
        }
        link_pair: list[int] | None = None
        comm = comm_kind = stage = None
        if lf is not None:
            pair, kind = _link_pair(lf, topo)
            link_pair = pair
            comm, comm_kind, stage = int(topo.comm[kind, pair[0]]), KIND_NAMES[kind], \
                STAGE_OF_KIND[kind]
            extra["nodes"] = [topo.node_names[n] for n in lf.nodes]
            extra["link_severity"] = lf.severity
            extra["comms"] = _link_comms(lf, topo)
        if f.cause == "compute":
            stage = f.stage
            ranks = sorted(set(f.ranks))
        elif f.cause == "communication":
            assert link_pair is not None
            ranks = sorted(link_pair)
        else:
            ranks = sorted(set(f.ranks))
        anomalies.append(Anomaly(
            id=fid, kind="slow", cause=f.cause, ranks=ranks, link=link_pair, comm=comm,
            comm_kind=comm_kind, stage=stage, start_ns=t0 + int(round(first)),
            end_ns=None if open_ended or not math.isfinite(last) else t0 + int(round(last)),
            slowdown=slowdown(seen), extra=extra))
    truth = Diagnosis(job=sc.job, iterations=iterations, anomalies=anomalies, whatif=None)
    stats = {"baseline_iteration_s": None if baseline is None else baseline / 1e9,
             "unobserved_faults": unobserved}
    return truth, stats


def _all_observed(eng: Engine) -> list[Observed]:
    out = [cf.observed for cf in eng.faults.compute] + [lf.observed for lf in eng.faults.links]
    h = eng.faults.hang
    if h is not None and h.trigger_it is not None:
        o = Observed(it_first=h.trigger_it, it_last=10**9)
        out.append(o)
    return out


def _hang_anomaly(fid: str, f: Fault, h: HangRT, topo: Topology, t0: int) -> Anomaly:
    link = None
    if h.cause == "hardware" and h.peer_rank is not None:
        gpn = topo.gpus_per_node
        if h.peer_rank // gpn != h.rank // gpn:
            link = [h.rank, h.peer_rank]
    extra: dict[str, Any] = {"iteration_start": h.trigger_it, "seq": h.seq}
    if h.cause == "inconsistent":
        extra["mismatch"] = h.mismatch
    if h.cause == "hardware" and h.peer_rank is not None:
        extra["peer_rank"] = h.peer_rank
    return Anomaly(id=fid, kind="hang", cause=h.cause, ranks=[h.rank], link=link,
                   comm=h.comm, comm_kind=KIND_NAMES[h.kind], stage=STAGE_OF_KIND[h.kind],
                   start_ns=t0 + int(round(h.trigger_ns)), end_ns=None, slowdown=None,
                   extra=extra)


def _link_pair(lf: LinkRT, topo: Topology) -> tuple[list[int], int]:
    """Two global ranks whose traffic crosses the slow link: a PP pair if PP crosses it, else
    the first ring edge (DP, then TP, then CP) joining the two nodes, in rank order."""
    pp = lf.masks[K_PP]
    if pp.any():
        e, d, c, t = (int(x) for x in np.argwhere(pp)[0])
        a = int(topo.ranks[e, d, c, t])
        return [a, a + topo.stage_size], K_PP
    a_node, b_node = lf.nodes
    for kind in (K_DP, K_TP, K_CP):
        edge = topo.edge_crosses(kind, a_node, b_node).ravel()
        if edge.any():
            r = int(np.flatnonzero(edge)[0])
            return [r, int(topo.succ[kind, r])], kind
    raise ValueError("no traffic crosses the link")


def _link_comms(lf: LinkRT, topo: Topology) -> list[int]:
    ids: set[int] = set()
    pp = lf.masks[K_PP]
    if pp.any():
        lower = topo.ranks[:-1][pp]
        ids.update(int(x) for x in topo.comm[K_PP, lower])
    a, b = lf.nodes
    for kind in (K_DP, K_TP, K_CP):
        edge = topo.edge_crosses(kind, a, b).ravel()
        ids.update(int(x) for x in topo.comm[kind, np.flatnonzero(edge)])
    return sorted(ids)
