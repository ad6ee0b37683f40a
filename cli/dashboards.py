"""``failslow dashboards write|check|verify``: the Grafana provisioning tree as code
(:mod:`failslow.dashboards.grafana`; needs the ``grafana`` extra)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXTRA_HINT = "needs the grafana extra: pip install 'failslow[grafana]'"


def _grafana() -> Any:
    """:mod:`failslow.dashboards.grafana`, or None (with a message) without the SDK."""
    try:
        from failslow.dashboards import grafana
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith(("grafana_foundation_sdk", "grafana_client")):
            print(f"failslow dashboards: {EXTRA_HINT} ({e.name} is missing)", file=sys.stderr)
            return None
        raise
    return grafana


def _cmd_write(args: argparse.Namespace) -> int:
    grafana = _grafana()
    if grafana is None:
        return 2
    for path in grafana.write(args.dir):
        print(path)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    grafana = _grafana()
    if grafana is None:
        return 2
    diffs = grafana.check(args.dir)
    for d in diffs:
        sys.stdout.write(d)
    if diffs:
        print(f"{len(diffs)} file(s) out of date; run failslow dashboards write {args.dir}",
              file=sys.stderr)
    return 1 if diffs else 0


def _cmd_verify(args: argparse.Namespace) -> int:
    grafana = _grafana()
    if grafana is None:
        return 2
    try:
        api = grafana.connect(args.url)
    except ModuleNotFoundError as e:
        print(f"failslow dashboards: {EXTRA_HINT} ({e.name} is missing)", file=sys.stderr)
        return 2
    root = args.root if args.root is not None else grafana.REPO_TREE
    log_text = args.log.read_text(errors="replace") if args.log else None
    problems = grafana.verify_live(api, root, log_text)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{args.url}: every dashboard, datasource and alert rule of {root} "
              "is provisioned")
    return 1 if problems else 0


def add_parser(subparsers: Any) -> None:
    """``failslow dashboards write|check|verify``."""
    dash = subparsers.add_parser(
        "dashboards", help="write, check or verify the Grafana dashboards, datasources and "
                           "alert rules",
        description="The Grafana side as code: the dashboards (fleet, job detail, rank "
                    "heatmap, hangs, links, GPUs, pipeline), the ClickHouse and Prometheus "
                    "datasources, the alert rules and Prometheus' scrape config, as the "
                    "provisioning tree that docker compose mounts (infra/grafana). Needs the "
                    "grafana extra.")
    sub = dash.add_subparsers(dest="dashboards_command", metavar="ACTION", required=True)

    write = sub.add_parser("write", help="write the provisioning tree under DIR",
                           description="Generate every file of the provisioning tree and "
                                       "write it under DIR (print the paths).")
    write.add_argument("dir", metavar="DIR", type=Path, help="the tree, e.g. infra/grafana")
    write.set_defaults(func=_cmd_write)

    check = sub.add_parser("check", help="exit 1 when DIR's files differ from what write "
                                         "would write",
                           description="Compare DIR with the generated files; print unified "
                                       "diffs and exit 1 when any is out of date or missing.")
    check.add_argument("dir", metavar="DIR", type=Path, help="the tree, e.g. infra/grafana")
    check.set_defaults(func=_cmd_check)

    verify = sub.add_parser(
        "verify", help="exit 1 when a running Grafana lacks part of the tree",
        description="Ask the Grafana at URL (e.g. docker compose up) for every provisioned "
                    "dashboard with its panels and variables, both datasources and every "
                    "alert rule of the tree; optionally scan its log for provisioning "
                    "errors. Exit 1 on any problem. User and password come from the "
                    "settings: GRAFANA_USER and GRAFANA_ADMIN_PASSWORD (or "
                    "GRAFANA_ADMIN_PASSWORD_FILE), default admin / admin.")
    verify.add_argument("url", metavar="URL", help="Grafana's address, e.g. "
                                                   "http://127.0.0.1:3000")
    verify.add_argument("--root", metavar="DIR", type=Path, default=None,
                        help="the provisioning tree to verify against (default: the "
                             "repository's infra/grafana)")
    verify.add_argument("--log", metavar="FILE", type=Path, default=None,
                        help="Grafana's server log, checked for provisioning errors")
    verify.set_defaults(func=_cmd_verify)
