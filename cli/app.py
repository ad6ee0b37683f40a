"""The ``failslow`` command line: subcommands registered by each component."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from failslow import __version__

#: Modules that define ``add_parser(subparsers)`` for their subcommands.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "failslow.cli.simulate",
    "failslow.analyze",
    "failslow.cli.demo",
    "failslow.infra.kafka_broker",
    "failslow.cli.plan",
    "failslow.cli.importers",
    "failslow.cli.notify",
    "failslow.cli.report",
    "failslow.cli.agent",
    "failslow.cli.stream",
    "failslow.cli.changepoints",
)
#: Modules that define ``BENCHMARKS: dict[name, fn(args) -> dict]``.
BENCHMARK_MODULES: tuple[str, ...] = (
    "failslow.bench.simulate",
    "failslow.cli.plan",
    "failslow.detectors.hang",
    "failslow.bench.whatif",
    "failslow.bench.collector",
    "failslow.bench.mitigation",
    "failslow.bench.accuracy_hang",
    "failslow.bench.accuracy",
    "failslow.bench.pipeline",
    "failslow.bench.changepoints",
)

DESCRIPTION = """\
failslow finds fail-slows (stragglers) and hangs in large hybrid-parallel training jobs:
which rank, link and training stage is to blame, why, and how much it costs.

Start with:
  failslow demo                     simulate a 64-rank job with two faults and diagnose it
  failslow simulate --out DIR       write a simulated trace (with truth.json)
  failslow analyze DIR [--json]     diagnose a trace directory
"""

BenchFn = Callable[[argparse.Namespace], dict[str, Any]]


def _optional_module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise


def benchmarks() -> dict[str, BenchFn]:
    found: dict[str, BenchFn] = {}
    for name in BENCHMARK_MODULES:
        module = _optional_module(name)
        if module is not None:
            found.update(module.BENCHMARKS)
    return found


def _cmd_bench(args: argparse.Namespace) -> int:
    table = benchmarks()
    if args.name not in table:
        print(f"failslow bench: unknown benchmark {args.name!r}; one of: "
              f"{', '.join(sorted(table))}", file=sys.stderr)
        return 2
    figures = table[args.name](args)
    if args.json:
        print(json.dumps(figures))
    else:
        width = max(len(k) for k in figures) if figures else 0
        for key, value in figures.items():
            print(f"{key:<{width}}  {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="failslow", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"failslow {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug) on standard error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        module = _optional_module(name)
        if module is not None:
            module.add_parser(sub)
    bench = sub.add_parser("bench", help="run a benchmark and print its figures",
                           description="Run a benchmark; figures are compared with a baseline "
                                       "run in the same process.")
    bench.add_argument("name", help=f"one of: {', '.join(sorted(benchmarks())) or '(none)'}")
    bench.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    bench.add_argument("--scale", type=float, default=1.0,
                       help="shrink (<1) or grow (>1) the benchmark's work")
    bench.add_argument("--data", metavar="DIR", default=None,
                       help="input data of benchmarks that read some (changepoints: a TCPD "
                            "directory with annotations.json)")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from failslow.events import ContractError

    try:
        return int(args.func(args))
    except ContractError as e:
        print(f"failslow {args.command}: invalid input: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - one clear line; the traceback with -v
        if args.verbose:
            raise
        print(f"failslow {args.command}: failed: {type(e).__name__}: {e} "
              "(run with -v for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
