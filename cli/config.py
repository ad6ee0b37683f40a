"""``failslow config show``: the effective settings (:mod:`failslow.settings`), secrets masked."""

from __future__ import annotations

import argparse
import json
from typing import Any

from failslow.settings import get_settings


def _cmd_show(args: argparse.Namespace) -> int:
    settings = get_settings()
    print(json.dumps(settings.masked(), indent=2) if args.json else settings.show())
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``failslow config show [--json]``."""
    config = subparsers.add_parser(
        "config", help="show the effective settings (secrets masked)",
        description="Settings come from, highest first: command-line flags, the environment "
                    "(FAILSLOW_* variables; a secret may come from a file named by "
                    "VARIABLE_FILE), the config file (--config FILE or $FAILSLOW_CONFIG, TOML "
                    "or YAML with the same sections), the defaults.")
    sub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    show = sub.add_parser("show", help="print every setting, its value and its variable",
                          description="Print the effective settings: one 'section.key  value  "
                                      "VARIABLE' line each; secrets as ********.")
    show.add_argument("--json", action="store_true",
                      help="print the settings as one JSON object (secrets masked)")
    show.set_defaults(func=_cmd_show)
