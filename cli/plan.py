"""`failslow plan`: mitigation plans (Greyhound §5)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from failslow.mitigation.microbatches import allocate_microbatches
from failslow.replay import DEFAULT_WINDOW_NS


def _times(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--times: not a comma-separated list of numbers: "
                                         f"{text!r}") from None


def _load_trace(trace_dir: str, diagnosis: str | None = None) -> tuple[Any, Any, Any]:
    """meta, the tables the what-if analysis reads, and the trace's diagnosis (computed by
    :func:`failslow.engine.offline.analyze` unless a diagnosis file is given)."""
    from failslow.cli.analyze import ReplayBar
    from failslow.diagnosis import Diagnosis
    from failslow.engine.offline import analyze
    from failslow.tracedir import TraceDir

    td = TraceDir(trace_dir)
    meta = td.meta()
    tables = {k: td.read(k) for k in ("span", "coll") if k in td.kinds}
    if diagnosis:
        return meta, tables, Diagnosis.load(diagnosis)
    with ReplayBar() as bar:
        return meta, tables, analyze(trace_dir, progress=bar)


def _trace_plans(trace_dir: str, anomaly: str | None, diagnosis: str | None = None
                 ) -> tuple[Any, list[Any], Any]:
    from failslow.mitigation.topology import anomaly_groups, step_start_times
    from failslow.whatif.analysis import build_ops

    meta, tables, diag = _load_trace(trace_dir, diagnosis)
    ops = build_ops(tables, meta)
    starts = step_start_times(tables, ops, meta)
    slow = [a for a in diag.anomalies if a.kind == "slow"]
    if anomaly is not None:
        slow = [a for a in slow if a.id == anomaly]
        if not slow:
            raise ValueError(f"no slow anomaly {anomaly!r} in the diagnosis")
    return (meta, ops, starts), anomaly_groups(slow), diag


def _cmd_microbatches_trace(args: argparse.Namespace) -> int:
    """S2 from a trace: per-DP-group micro-batch times over each slow anomaly's steps."""
    from failslow.mitigation.microbatches import plan_from_ops
    from failslow.mitigation.planner import TracePlans
    from failslow.mitigation.topology import subset_steps

    (meta, ops, starts), groups, diag = _trace_plans(args.trace, args.anomaly, args.diagnosis)
    plans = TracePlans(ops, meta, starts, args.multiple_of)
    out = []
    for group in groups:
        mask = np.zeros(ops.steps.size, dtype=bool)
        for a in group:
            mask |= plans.steps_of(a)
        started = time.perf_counter()
        plan = plan_from_ops(subset_steps(ops, mask), multiple_of=args.multiple_of)
        doc = {"anomalies": [a.id for a in group], **plan.to_dict(),
               "max_time": plan.max_time, "solve_ms": (time.perf_counter() - started) * 1e3}
        out.append(doc)
    if args.json:
        print(json.dumps({"job": diag.job, "plans": out}))
    elif not out:
        print("no slow anomaly in the trace: nothing to re-balance")
    else:
        for doc in out:
            print(f"anomalies {', '.join(doc['anomalies'])}: micro-batches per DP group "
                  f"{' '.join(map(str, doc['m']))}")
            print(f"  micro-batch time per DP group (s): "
                  f"{' '.join(f'{t:.4g}' for t in doc['times_s'])}")
            if doc["predicted_after_s"] is not None:
                print(f"  predicted step time {doc['predicted_before_s']:.4g} s -> "
                      f"{doc['predicted_after_s']:.4g} s"
                      + ("" if doc["feasible"] else f" (not recommended: {doc['reason']})"))
    return 0


def _cmd_microbatches(args: argparse.Namespace) -> int:
    if args.trace is not None:
        return _cmd_microbatches_trace(args)
    if args.times is None or args.total is None:
        raise ValueError("give --times and --total, or --trace DIR")
    started = time.perf_counter()
    alloc = allocate_microbatches(args.times, args.total, args.multiple_of)
    solve_ms = (time.perf_counter() - started) * 1e3
    even = args.total / len(args.times)
    doc = {"m": alloc.m, "max_time": alloc.max_time, "solve_ms": solve_ms,
           "even_split_max_time": float(np.max(np.asarray(args.times) * even))}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"micro-batches per DP group: {' '.join(map(str, alloc.m))}")
        print(f"slowest group time: {alloc.max_time:.6g} (even split: "
              f"{doc['even_split_max_time']:.6g}); solved in {solve_ms:.2f} ms")
    return 0


def add_parser(sub: Any) -> None:
    plan = sub.add_parser("plan", help="compute a mitigation plan",
                          description="Compute mitigation plans (Greyhound §5).")
    plan_sub = plan.add_subparsers(dest="plan", metavar="PLAN", required=True)
    mb = plan_sub.add_parser(
        "microbatches", help="re-balance micro-batches across DP groups (S2)",
        description="Integer micro-batch counts per DP group, each >= 1 (or a multiple of "
                    "--multiple-of), summing to --total, minimizing the slowest group's time.")
    mb.add_argument("--times", type=_times,
                    help="per-micro-batch time of each DP group, comma-separated")
    mb.add_argument("--total", type=int, help="micro-batches in all (M)")
    mb.add_argument("--trace", metavar="TRACE_DIR",
                    help="instead of --times/--total: measure the DP groups' micro-batch "
                         "times over each slow anomaly of this trace and predict the step "
                         "time with the what-if simulator")
    mb.add_argument("--anomaly", metavar="ID", help="with --trace: only this anomaly")
    mb.add_argument("--diagnosis", metavar="FILE",
                    help="with --trace: use this diagnosis JSON (e.g. saved `failslow "
                         "analyze --json` output, or a simulated trace's truth.json) "
                         "instead of analyzing the trace")
    mb.add_argument("--multiple-of", type=int, default=1, metavar="P",
                    help="every count a multiple of P (e.g. the pipeline depth for 1F1B)")
    mb.add_argument("--json", action="store_true", help="print one JSON object")
    mb.set_defaults(func=_cmd_microbatches)
    topo = plan_sub.add_parser(
        "topology", help="new rank placement around stragglers and slow links (S3)",
        description="Diagnose TRACE_DIR, then for each group of concurrent slow anomalies "
                    "plan Greyhound's S3: consolidate stragglers into the fewest (interior) "
                    "pipeline stages and swap the DP/PP roles of nodes so congested links "
                    "carry light or no traffic. Prints the new placement (new global rank "
                    "-> old rank's GPU) and the step time before and after, predicted by "
                    "the what-if dependency simulator.")
    topo.add_argument("trace", metavar="TRACE_DIR", help="a trace directory")
    topo.add_argument("--anomaly", metavar="ID", help="plan only for this anomaly")
    topo.add_argument("--diagnosis", metavar="FILE",
                      help="use this diagnosis JSON instead of analyzing the trace")
    topo.add_argument("--json", action="store_true", help="print one JSON object")
    topo.set_defaults(func=_cmd_topology)
    adv = plan_sub.add_parser(
        "advice", help="replay a trace and print the mitigation planner's advice events",
        description="Replay TRACE_DIR through the detectors as `failslow analyze` and the "
                    "stream processor do, and print the ski-rental planner's decisions "
                    "(Greyhound Algorithm 1): per slow anomaly, S2 / S3 / S4 applied when "
                    "the accumulated impact reaches the strategy's cost, skipped when its "
                    "plan cannot help, reverted when the anomaly ends. With --json: one "
                    "mitigation_advice object per line (what `failslow.advice` carries; "
                    "the micro-batch client reads such a file).")
    adv.add_argument("trace", metavar="TRACE_DIR", help="a trace directory")
    adv.add_argument("--cost", type=_costs, default={}, metavar="S2=SEC,S3=SEC,S4=SEC",
                     help="action costs in seconds of lost training time (defaults: "
                          "S2=5, S3=60, S4=1800; Greyhound §5.2, §7.4)")
    adv.add_argument("--multiple-of", type=int, default=1, metavar="P",
                     help="S2 counts a multiple of P (the pipeline depth for 1F1B)")
    adv.add_argument("--json", action="store_true", help="JSON Lines, one advice per line")
    adv.set_defaults(func=_cmd_advice)


def _costs(text: str) -> dict[str, float]:
    """``S2=5,S3=60`` -> action costs in seconds (strategies not named keep their default)."""
    from failslow.mitigation.planner import PlannerConfig

    try:
        return PlannerConfig.parse_costs(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def trace_advice(trace_dir: str, cost_s: dict[str, float] | None = None,
                 multiple_of: int = 1) -> tuple[Any, list[Any]]:
    """Replay ``trace_dir`` through the job analyzer, as ``failslow analyze`` and the stream
    processor do, and collect the mitigation planner's advice (Greyhound §5.1, Algorithm 1)
    in decision order. Returns the job's meta and the :class:`~failslow.mitigation.planner
    .Advice` list."""
    import dataclasses

    from failslow.cli.analyze import ReplayBar
    from failslow.comms import infer_comms
    from failslow.engine.analyzer import JobAnalyzer, JobConfig
    from failslow.engine.offline import _membership, replay_dir
    from failslow.engine.runner import Tally, steps
    from failslow.mitigation.planner import PlannerConfig
    from failslow.tracedir import TraceDir

    td = TraceDir(trace_dir)
    meta = td.meta()
    if not meta.comms:
        meta = dataclasses.replace(meta, comms=infer_comms(_membership(td), meta))
    config = PlannerConfig()
    config.cost_s.update(cost_s or {})
    analyzer = JobAnalyzer(meta, JobConfig(planner=config, planner_multiple_of=multiple_of))
    advice: list[Any] = []
    with ReplayBar() as bar:
        told = Tally(bar)
        for step in steps(analyzer, replay_dir(td, DEFAULT_WINDOW_NS, on_span=told.span)):
            told.step(step)
            advice += step.update.advice + step.tick.advice
    return meta, advice


def _cmd_advice(args: argparse.Namespace) -> int:
    meta, advice = trace_advice(args.trace, args.cost, args.multiple_of)
    if args.json:
        for a in advice:
            print(a.to_json())
        return 0
    if not advice:
        print(f"{meta.job}: no mitigation advised (no slow anomaly lasted long enough for its "
              "impact to reach the cost of a strategy)")
        return 0
    print(f"{meta.job}: {len(advice)} advice event(s) (trace time from the job's start)")
    for a in advice:
        where = ("link " + "-".join(map(str, a.link))) if a.link else \
            "ranks " + ",".join(map(str, a.ranks))
        print(f"  t+{(a.t_ns - meta.t) / 1e9:8.2f} s  {a.anomaly_id} ({a.cause}, {where}): "
              f"{a.strategy} {a.action} -- {a.description}; {a.reason}")
        if a.plan and a.action == "apply" and a.plan.get("m") is not None:
            print(f"      micro-batches per DP group: {' '.join(map(str, a.plan['m']))}")
    return 0


def _cmd_topology(args: argparse.Namespace) -> int:
    from failslow.mitigation.topology import plan_for_anomalies

    (meta, ops, starts), groups, diag = _trace_plans(args.trace, args.anomaly, args.diagnosis)
    plans = [(g, plan_for_anomalies(ops, meta, g, starts)) for g in groups]
    docs = [{"anomalies": [a.id for a in g], **p.to_dict()} for g, p in plans]
    if args.json:
        print(json.dumps({"job": diag.job, "trace": str(args.trace), "plans": docs}))
        return 0
    if not docs:
        print(f"{diag.job}: no slow anomaly in the trace; nothing to plan")
        return 0
    for doc in docs:
        _print_topology(doc)
    return 0


def _print_topology(doc: dict[str, Any]) -> None:
    print(f"anomalies {', '.join(doc['anomalies'])}: S3 {doc['kind']}"
          + ("" if doc["feasible"] else f" -- no change recommended ({doc['reason']})"))
    for f in doc["faults"]["compute"]:
        print(f"  straggler ranks {f['ranks']}: compute x{f['factor']:.3g}")
    for f in doc["faults"]["links"]:
        print(f"  congested link {f['nodes'][0]}-{f['nodes'][1]}: transfers x{f['factor']:.3g}")
    if doc["stages_needed"]:
        print(f"  stragglers need {doc['stages_needed']} stage(s); target stages "
              f"{doc['target_stages'] or '-'}")
    for a, b in doc["node_swaps"]:
        print(f"  swap the roles of {a} and {b}")
    for m in doc["moves"] if doc["feasible"] else []:
        print(f"  GPUs of ranks {m['worker_ranks_before']} ({m['node']}, stage "
              f"{m['stage_before']} dp {m['dp_before']}) -> ranks {m['worker_ranks_after']} "
              f"(stage {m['stage_after']} dp {m['dp_after']})")
    if doc["predicted_before_s"] is not None:
        print(f"  predicted step time {doc['predicted_before_s']:.4g} s -> "
              f"{doc['predicted_after_s']:.4g} s (x{doc['predicted_speedup']:.3g})")
    for n in doc["notes"]:
        print(f"  note: {n}")
