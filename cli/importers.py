"""``failslow import ...``: convert foreign traces into a failslow trace directory."""

from __future__ import annotations

import argparse
from typing import Any

from failslow.collectors.importers import ImportResult


def _write(result: ImportResult, args: argparse.Namespace) -> int:
    path = result.write(args.out, args.format)
    print(f"wrote {path}: {result.summary()}")
    return 0


def _cmd_flight_recorder(args: argparse.Namespace) -> int:
    from failslow.collectors.importers import flight_recorder

    return _write(flight_recorder.import_dumps(args.dump_dir, job=args.job), args)


def _cmd_straggler_analysis(args: argparse.Namespace) -> int:
    from failslow.collectors.importers import straggler_analysis

    return _write(straggler_analysis.import_files(args.trace, args.meta, job=args.job,
                                                  epoch_ns=args.epoch_ns), args)


def _cmd_nccl_inspector(args: argparse.Namespace) -> int:
    from failslow.collectors.importers import nccl_inspector

    result = nccl_inspector.import_dir(args.inspector_dir, job=args.job)
    code = _write(result, args)
    info = result.info
    if info.get("lossy_ranks"):
        print(f"ranks with dropped records (held out, never a root cause): "
              f"{', '.join(sorted(info['lossy_ranks'], key=int))}")
    found = info.get("exec_time_stragglers")
    if found:  # records without timestamps: what their execution times say
        link = found["link"]
        nodes = f" (nodes {', '.join(link['nodes'])})" if link["nodes"] else ""
        print(f"untimed records, from execution times: compute stragglers "
              f"{found['compute']['ranks'] or 'none'}; slow link {link['link'] or 'none'}{nodes}")
    return code


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="TRACE_DIR",
                        help="trace directory to write (created if absent)")
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet",
                        help="file format of the record tables (default: parquet)")
    parser.add_argument("--job", default=None, help="job id to use (default: derived from "
                                                    "the input)")


def add_parser(subparsers: Any) -> None:
    """Register ``failslow import flight-recorder|straggler-analysis|nccl-inspector``."""
    top = subparsers.add_parser(
        "import", help="convert other tools' traces into a failslow trace directory",
        description="Convert traces written by other tools into a failslow trace directory "
                    "(meta.json, coll/span tables, import.json with the conversion notes).")
    sub = top.add_subparsers(dest="importer", metavar="FORMAT", required=True)

    fr = sub.add_parser(
        "flight-recorder", help="PyTorch NCCL Flight Recorder dumps (one file per rank)",
        description="Import PyTorch NCCL Flight Recorder dumps: every file of DUMP_DIR whose "
                    "name ends in the rank (e.g. _dump_0). Operations become coll rows "
                    "(enter; end when completed); meta from the process groups.")
    fr.add_argument("dump_dir", metavar="DUMP_DIR", help="folder of dump files (or one file)")
    _common(fr)
    fr.set_defaults(func=_cmd_flight_recorder)

    from failslow.collectors.importers.straggler_analysis import DEFAULT_EPOCH_NS

    sa = sub.add_parser(
        "straggler-analysis", help="ByteDance StragglerAnalysis trace (Parquet + YAML meta)",
        description="Import a StragglerAnalysis trial: span rows for every operation, coll "
                    "rows derived for pipeline send/recv and data-parallel syncs; tensor "
                    "parallelism is collapsed (world = dp x pp).")
    sa.add_argument("--trace", required=True, metavar="T.parquet", help="trace-*.parquet")
    sa.add_argument("--meta", required=True, metavar="M.yaml", help="meta-*.yaml")
    sa.add_argument("--epoch-ns", type=int, default=DEFAULT_EPOCH_NS,
                    help="start time of the first imported step, ns since the Unix epoch "
                         f"(default {DEFAULT_EPOCH_NS})")
    _common(sa)
    sa.set_defaults(func=_cmd_straggler_analysis)

    ni = sub.add_parser(
        "nccl-inspector", help="NCCL Inspector profiler-plugin output (JSON lines per process)",
        description="Import the output folder of NCCL's Inspector profiler plugin (format "
                    "v4.x, per-record or dump_stats markers; .log/.jsonl, gzipped or not). "
                    "Verbose records (event_trace_ts) become coll rows; records without "
                    "timestamps are summarised per rank in import.json, never given made-up "
                    "times; their execution times still name compute and link stragglers "
                    "(import.json: exec_time_stragglers). Ranks with dropped records are named "
                    "as lossy and held out.")
    ni.add_argument("inspector_dir", metavar="DIR", help="the Inspector dump folder")
    _common(ni)
    ni.set_defaults(func=_cmd_nccl_inspector)
