"""The ``failslow`` command line: one module per command, registered in
:mod:`failslow.cli.app`, which also holds the one error policy."""

from failslow.cli.app import (
    BENCHMARK_MODULES,
    SUBCOMMAND_MODULES,
    benchmark,
    benchmarks,
    build_parser,
    main,
)

__all__ = ["BENCHMARK_MODULES", "SUBCOMMAND_MODULES", "benchmark", "benchmarks", "build_parser",
           "main"]
