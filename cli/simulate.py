"""``failslow simulate``: write a simulated trace directory with its ground truth."""

from __future__ import annotations

import argparse
import json
from typing import Any

from failslow.cli.simulate_live import add_arguments as add_live_arguments
from failslow.cli.simulate_live import run_live
from failslow.simulator.output import write_sim
from failslow.simulator.scenario import PRESETS, ScenarioError, load_scenario, preset
from failslow.simulator.sim import simulate

HELP = """\
Simulate a hybrid-parallel training job (TP x PP x DP [x CP], 1F1B or GPipe) with injected
faults and write a trace directory: meta.json, coll/span/progress/link/gpu records, and
truth.json (the injected faults in the diagnosis format). Without --preset or --scenario,
simulates the 'default' preset: 64 ranks (tp2 pp4 dp8) with one compute straggler.

With --live, streams a job in real time instead, with current timestamps and a new fault
every few minutes, to Kafka (or with --embedded to a processor in this process):

  failslow simulate --live --kafka 127.0.0.1:9094 --fault-every 3m
"""


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate", help="write a simulated trace (with truth.json)", description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", "-o", metavar="DIR", help="trace directory to write")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", "-p", metavar="NAME",
                     help=f"a named scenario: {', '.join(PRESETS)}")
    src.add_argument("--scenario", "-s", metavar="FILE",
                     help="a YAML or TOML scenario file (may start from 'preset: NAME')")
    p.add_argument("--seed", type=int, default=None,
                   help="random seed (default: the scenario's 'seed', else 0)")
    p.add_argument("--format", choices=("parquet", "jsonl"), default="parquet",
                   help="record file format (default parquet)")
    p.add_argument("--iterations", type=int, metavar="N", help="override the iteration count")
    p.add_argument("--list-presets", action="store_true", help="list the presets and exit")
    p.add_argument("--json", action="store_true",
                   help="print a JSON summary (out, ranks, rows per kind, truth) to stdout")
    add_live_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.live:
        return run_live(args)
    if args.list_presets:
        width = max(len(n) for n in PRESETS)
        for name in PRESETS:
            print(f"{name:<{width}}  {preset(name).description}")
        return 0
    if not args.out:
        raise ValueError("--out DIR is required")
    sc = load_scenario(args.scenario) if args.scenario else preset(args.preset or "default")
    if args.iterations is not None:
        if args.iterations < 1:
            raise ScenarioError("--iterations must be >= 1")
        sc.iterations = args.iterations
    seed = args.seed if args.seed is not None else (sc.seed or 0)
    result = simulate(sc, seed)
    out = write_sim(result, args.out, args.format)
    rows = result.stats["rows_by_kind"]
    summary = {"out": str(out), "scenario": sc.name, "seed": seed,
               "ranks": result.meta.world_size, "iterations": result.stats["iterations"],
               "hung": result.stats["hung"], "rows": rows,
               "truth": result.truth.to_dict()}
    if args.json:
        print(json.dumps(summary))
        return 0
    p = sc.parallel
    print(f"wrote {out} ({args.format}): scenario {sc.name}, seed {seed}, "
          f"{result.meta.world_size} ranks (tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp}, "
          f"{sc.schedule}, {sc.microbatches} micro-batches), "
          f"{result.stats['iterations']} iterations"
          + (" (hung)" if result.stats["hung"] else ""))
    print("rows: " + ", ".join(f"{k} {v}" for k, v in rows.items()))
    it = result.truth.iterations or {}
    print(f"iterations: median {it.get('median_s')} s, {it.get('count')} complete, "
          f"{it.get('period_ops')} operations each on rank 0")
    for a in result.truth.anomalies:
        where = f"link {a.link} " if a.link else ""
        slow = f", slowdown {a.slowdown}" if a.slowdown else ""
        print(f"truth: {a.id} {a.kind}/{a.cause} ranks {a.ranks} {where}"
              f"stage {a.stage}{slow}")
    return 0
