"""``failslow infra up|down|status|fetch``: a local one-node Kafka broker for development and
tests (:mod:`failslow.infra.kafka_broker`; ``infra/kafka/kafka.sh`` runs these commands)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from failslow.infra.kafka_broker import (
    DEFAULT_HEAP,
    DEFAULT_MAX_LIFETIME,
    DEFAULT_PORT,
    fetch_kafka_jars,
    kafka_down,
    kafka_status,
    kafka_up,
)


def _cmd_up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    status = kafka_up(args.port, controller_port=args.controller_port,
                      state_dir=args.state_dir, max_lifetime=args.max_lifetime,
                      timeout=args.timeout, heap=args.heap, secure=args.secure)
    if args.json:
        print(json.dumps({**status.to_dict(), "client": status.client_settings()}))
    elif args.secure:  # KEY=value lines a shell can export; the status on stderr
        print(f"{status.describe()}\n  ready after {time.monotonic() - started:.1f} s",
              file=sys.stderr)
        for key, value in status.client_settings().items():
            print(f"{key}={value}")
    else:
        print(f"{status.describe()}\n  ready after {time.monotonic() - started:.1f} s; "
              f"use FAILSLOW_KAFKA={status.bootstrap}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    was = kafka_down(args.state_dir, timeout=args.timeout)
    print("kafka: stopped" if was else "kafka: was not running")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    status = kafka_status(args.state_dir, check=True)
    print(json.dumps(status.to_dict()) if args.json else status.describe())
    return 0 if status.running else 3


def _cmd_fetch(args: argparse.Namespace) -> int:
    print(fetch_kafka_jars(quiet=not args.verbose_maven))
    return 0


def add_parser(subparsers: Any) -> None:
    """``failslow infra up|down|status|fetch``."""
    infra = subparsers.add_parser(
        "infra", help="start, stop or inspect a local Kafka broker (no Docker needed)",
        description="A one-node Apache Kafka broker (KRaft) on 127.0.0.1 for the stream "
                    "processor, run from Maven Central's jars (Java and Maven needed). "
                    "docker compose up starts the same broker in a container.")
    sub = infra.add_subparsers(dest="infra_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", default=None,
                       help="the broker's folder (default: $FAILSLOW_STATE_DIR/kafka, "
                            "~/.cache/failslow/kafka)")

    up = sub.add_parser("up", help="start the broker in the background and wait until ready")
    common(up)
    up.add_argument("--port", type=int, default=None,
                    help="client port on 127.0.0.1 (default: the port of $FAILSLOW_KAFKA, else "
                         f"{DEFAULT_PORT}; 0 = any free port)")
    up.add_argument("--controller-port", type=int, default=None,
                    help="KRaft controller port (default: any free port)")
    up.add_argument("--max-lifetime", type=float, default=DEFAULT_MAX_LIFETIME,
                    help="seconds after which the broker stops by itself (0 = never; "
                         "default %(default).0f)")
    up.add_argument("--timeout", type=float, default=120.0,
                    help="seconds to wait for the broker to answer (default %(default).0f)")
    up.add_argument("--heap", default=DEFAULT_HEAP, help="Java heap limit (default %(default)s)")
    up.add_argument("--secure", action="store_true",
                    help="listen with SASL_SSL on --port: SCRAM-SHA-256/512 credentials made "
                         "when the storage is formatted, a CA and a server certificate made "
                         "in STATE_DIR/tls; prints the client settings as KEY=value lines "
                         "(the password by its file: FAILSLOW_KAFKA_SASL_PASSWORD_FILE)")
    up.add_argument("--json", action="store_true", help="print the status as JSON")
    up.set_defaults(func=_cmd_up)

    down = sub.add_parser("down", help="stop the broker (SIGTERM, SIGKILL after --timeout)")
    common(down)
    down.add_argument("--timeout", type=float, default=30.0,
                      help="seconds to wait after SIGTERM before SIGKILL (default %(default).0f)")
    down.set_defaults(func=_cmd_down)

    status = sub.add_parser("status", help="whether the broker runs, on which port "
                                           "(exit 0 if it runs, 3 if not)")
    common(status)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=_cmd_status)

    fetch = sub.add_parser("fetch", help="only fetch the broker's jars with Maven")
    fetch.add_argument("--verbose-maven", action="store_true", help="show Maven's output")
    fetch.set_defaults(func=_cmd_fetch)


def main(argv: Sequence[str] | None = None) -> int:
    """``failslow infra ACTION ...`` with ``argv`` the words after ``infra``."""
    from failslow.cli.app import main as app_main

    return app_main(["infra", *(sys.argv[1:] if argv is None else argv)])
