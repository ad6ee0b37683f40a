"""``failslow agent``: registers the node agent's subcommand (:mod:`failslow.collectors.agent`)."""

from __future__ import annotations

from typing import Any


def add_parser(subparsers: Any) -> None:
    from failslow.collectors.agent import add_parser as agent_parser

    agent_parser(subparsers)
