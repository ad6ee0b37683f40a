"""The ``failslow`` command line: subcommands registered by each component, one parser class
(:class:`CommandParser`), the settings (``--config``), logging (``--log-format``) and one error
policy (:func:`main`)."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from failslow import __version__

#: Modules that define ``add_parser(subparsers)`` for their subcommands.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "failslow.cli.simulate",
    "failslow.cli.analyze",
    "failslow.cli.demo",
    "failslow.cli.infra",
    "failslow.cli.plan",
    "failslow.cli.importers",
    "failslow.cli.notify",
    "failslow.cli.report",
    "failslow.cli.dashboards",
    "failslow.cli.agent",
    "failslow.cli.stream",
    "failslow.cli.changepoints",
    "failslow.cli.schema",
    "failslow.cli.config",
    "failslow.cli.doctor",
)
#: Benchmark name -> the module whose ``BENCHMARKS: dict[name, fn(args) -> dict]`` holds it.
#: Only the module of the benchmark that runs is imported (``failslow --help`` imports none).
BENCHMARK_MODULES: dict[str, str] = {
    "simulate": "failslow.bench.simulate",
    "plan-microbatches": "failslow.bench.plan",
    "hang": "failslow.bench.hang",
    "whatif": "failslow.bench.whatif",
    "collector": "failslow.bench.collector",
    "mitigation": "failslow.bench.mitigation",
    "accuracy-hang": "failslow.bench.accuracy_hang",
    "accuracy": "failslow.bench.accuracy",
    "accuracy-heldout": "failslow.bench.heldout_suite",
    "detectors-throughput": "failslow.bench.accuracy",
    "pipeline": "failslow.bench.pipeline",
    "analyze-large": "failslow.bench.analyze_large",
    "changepoints": "failslow.bench.changepoints",
    "validation": "failslow.bench.validation",
}

DESCRIPTION = """\
failslow finds fail-slows (stragglers) and hangs in large hybrid-parallel training jobs:
which rank, link and training stage is to blame, why, and how much it costs.

Start with:
  failslow demo                     simulate a 64-rank job with two faults and diagnose it
  failslow simulate --out DIR       write a simulated trace (with truth.json)
  failslow analyze DIR [--json]     diagnose a trace directory

Settings: flags, then FAILSLOW_* variables, then the config file (--config or
$FAILSLOW_CONFIG); `failslow config show` prints them. Bad input exits 2, other failures 1,
each with one line on standard error (-v: the traceback).
"""

BenchFn = Callable[[argparse.Namespace], dict[str, Any]]
log = logging.getLogger("failslow")


# ---------------------------------------------------------------------------------------------
# parsers


def _verbose_parent() -> argparse.ArgumentParser:
    """``-v`` after the subcommand: default SUPPRESS, so that ``failslow -v CMD`` keeps the
    count of the top-level ``-v`` (a subparser's default would overwrite it)."""
    parent = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parent.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="log more (-v info, -vv debug) and show tracebacks")
    return parent


class CommandParser(argparse.ArgumentParser):
    """Every parser of ``failslow``: no abbreviated options (``--clickhouse`` is not taken for
    ``--clickhouse-url``), ``-v`` before and after the subcommand, one-line usage errors (exit
    2), and ``cli_prog`` (``failslow infra up``) for the error messages of :func:`main`."""

    def __init__(self, *args: Any, top: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        if not top:
            kwargs["parents"] = [*kwargs.get("parents", ()), _verbose_parent()]
        super().__init__(*args, **kwargs)
        self.set_defaults(cli_prog=self.prog)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # name the command they were given to, not ``failslow``
            prog = getattr(parsed, "cli_prog", self.prog)
            self.exit(2, f"{prog}: unrecognized arguments: {' '.join(extra)} "
                         f"(see {prog} --help)\n")
        return parsed


def _optional_module(name: str) -> Any | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return None
        raise


def benchmark(name: str) -> BenchFn:
    """The benchmark ``name``, importing only its module."""
    if name not in BENCHMARK_MODULES:
        raise ValueError(f"unknown benchmark {name!r}; one of: "
                         f"{', '.join(sorted(BENCHMARK_MODULES))}")
    module = importlib.import_module(BENCHMARK_MODULES[name])
    fn: BenchFn = module.BENCHMARKS[name]
    return fn


def benchmarks() -> dict[str, BenchFn]:
    """Every benchmark whose module imports (all of them are imported)."""
    found: dict[str, BenchFn] = {}
    for name, module_name in BENCHMARK_MODULES.items():
        module = _optional_module(module_name)
        if module is not None and name in module.BENCHMARKS:
            found[name] = module.BENCHMARKS[name]
    return found


def _cmd_bench(args: argparse.Namespace) -> int:
    figures = benchmark(args.name)(args)
    if args.json:
        print(json.dumps(figures))
    else:
        width = max(len(k) for k in figures) if figures else 0
        for key, value in figures.items():
            print(f"{key:<{width}}  {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="failslow", description=DESCRIPTION, top=True,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"failslow {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug) on standard error and show "
                             "tracebacks; also accepted after the command")
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="settings file (TOML or YAML, the sections of `failslow config "
                             "show`); default $FAILSLOW_CONFIG")
    parser.add_argument("--log-format", choices=("text", "json"), default=None,
                        help="log lines on standard error: text, or json (one object per "
                             "line: time, level, logger, message); default $FAILSLOW_LOG_FORMAT "
                             "or text")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        module = _optional_module(name)
        if module is not None:
            module.add_parser(sub)
    bench = sub.add_parser("bench", help="run a benchmark and print its figures",
                           description="Run a benchmark; figures are compared with a baseline "
                                       "run in the same process.")
    bench.add_argument("name", help=f"one of: {', '.join(sorted(BENCHMARK_MODULES))}")
    bench.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    bench.add_argument("--scale", type=float, default=1.0,
                       help="shrink (<1) or grow (>1) the benchmark's work")
    bench.add_argument("--seed", type=int, default=0,
                       help="seed of benchmarks that draw their cases (accuracy: the "
                            "held-out suite; every draw changes with it)")
    bench.add_argument("--processes", type=int, default=0, metavar="N",
                       help="pipeline: also reduce the job's evidence with 1, 2, ... N "
                            "processes side by side and show their throughput and "
                            "consumer lag")
    bench.add_argument("--data", metavar="DIR", default=None,
                       help="input data of benchmarks that read some (changepoints: a TCPD "
                            "directory with annotations.json)")
    bench.set_defaults(func=_cmd_bench)
    return parser


# ---------------------------------------------------------------------------------------------
# logging


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message`` (and ``exception`` with the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": datetime.fromtimestamp(record.created, UTC).isoformat(
                   timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


class _StderrHandler(logging.StreamHandler):
    """Writes to the ``sys.stderr`` of the moment (tests replace it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def log_handler(log_format: str) -> logging.Handler:
    handler = _StderrHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    return handler


# ---------------------------------------------------------------------------------------------
# the error policy

#: Exceptions that mean bad input (a file, a flag, a setting): exit 2.
BAD_INPUT: tuple[type[BaseException], ...] = (
    ValueError,  # ContractError, ScenarioError, SeriesError, pydantic's ValidationError, ...
    FileNotFoundError, NotADirectoryError, IsADirectoryError,
    pickle.UnpicklingError,  # a Flight Recorder dump that is not one
)


def _message(e: BaseException) -> str:
    """One line saying what is wrong with the input."""
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        from failslow.settings import ENV

        var_of = {".".join(k for k in key if k): var for var, key in ENV.items()}
        parts = []
        for err in e.errors():
            loc = ".".join(map(str, err["loc"]))
            var = f" (${var_of[loc]})" if loc in var_of else ""
            parts.append(f"{loc}{var}: {err['msg']}, not {err.get('input')!r}")
        return f"{e.title}: {'; '.join(parts)}"
    if isinstance(e, OSError) and e.filename is not None:
        return f"{e.filename}: {e.strerror or e}"
    text = str(e).strip() or type(e).__name__
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _global_config(argv: Sequence[str]) -> str | None:
    """``--config FILE`` among the options before the command (a command may have a
    ``--config`` of its own), so that it is read before the parsers take their defaults."""
    words = list(argv)
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        word = words[i]
        if word == "--config":
            return words[i + 1] if i + 1 < len(words) else None
        if word.startswith("--config="):
            return word.split("=", 1)[1]
        i += 2 if word == "--log-format" else 1
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``failslow ...``: parse, set up settings and logging, run the command under the one
    error policy: bad input (:data:`BAD_INPUT`) -> ``failslow CMD: message`` and exit 2; a
    local server that fails (:class:`~failslow.infra.kafka_broker.InfraError`) -> its message
    and exit 1; anything else -> ``failslow CMD: failed: Type: message`` and exit 1; with
    ``-v`` the traceback too (the exception propagates unless it is bad input)."""
    from failslow import settings

    argv = list(sys.argv[1:] if argv is None else argv)
    previous = settings._config_file
    root = logging.getLogger()
    level, handler = root.level, None
    command, verbose = "failslow", 0
    try:
        try:
            config = _global_config(argv)
            if config is not None:
                settings.set_config_file(config)
            else:  # read afresh: main() may run more than once in a process (tests)
                settings.reload_settings()
            parser = build_parser()
            args = parser.parse_args(argv)
            command, verbose = getattr(args, "cli_prog", "failslow"), args.verbose
            log_format = args.log_format or settings.get_settings().log_format
        except BAD_INPUT as e:
            print(f"{command}: {_message(e)}", file=sys.stderr)
            return 2
        handler = log_handler(log_format)
        root.addHandler(handler)
        root.setLevel((logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)])
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BAD_INPUT as e:
        if verbose:
            traceback.print_exc()
        print(f"{command}: {_message(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - one clear line; the traceback with -v
        if verbose:
            raise
        from failslow.infra.kafka_broker import InfraError

        if isinstance(e, InfraError):  # says what failed and why (with the server's log)
            print(f"{command}: {e}", file=sys.stderr)
        else:
            print(f"{command}: failed: {type(e).__name__}: {_message(e)} "
                  "(run with -v for the traceback)", file=sys.stderr)
        return 1
    finally:
        if handler is not None:
            root.removeHandler(handler)
            root.setLevel(level)
        if settings._config_file != previous:  # main() called in-process (tests)
            settings._config_file = previous
