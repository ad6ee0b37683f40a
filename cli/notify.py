"""``failslow notify``: page on anomalies (see :mod:`failslow.dashboards.notify`).

Consumes ``failslow.anomalies``, ``failslow.advice`` (the mitigation planner's advice, put
in the payloads) and ``failslow.meta`` (for the jobs' sizes) from Kafka as
consumer group ``failslow-notify`` and sends the webhooks that the routes config asks for.
``--check`` only validates the config and the environment it names.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_GROUP = "failslow-notify"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "notify", help="send webhooks (generic, Slack, PagerDuty, Alertmanager) on anomalies",
        description="Consume anomaly reports and send webhooks: routing by job and severity "
                    "(GPU-hours lost; hangs are critical), de-duplication by anomaly id, a "
                    "resolve when an anomaly ends, retries with backoff and jitter, rate "
                    "limits, HMAC-SHA256 signatures; the mitigation planner's advice "
                    "rides in the payloads and an update is sent when it escalates. "
                    "Secrets come only from the environment. The outbox is kept in a state "
                    "file, so a restart loses no page.")
    p.add_argument("--config", type=Path, required=True,
                   help="routes and receivers (YAML or TOML)")
    p.add_argument("--kafka", default=None, metavar="SERVERS",
                   help="bootstrap servers (default: $FAILSLOW_KAFKA)")
    p.add_argument("--group", default=DEFAULT_GROUP, help=f"consumer group ({DEFAULT_GROUP})")
    p.add_argument("--topic-prefix", default="", help="Kafka topic prefix (as the processor's)")
    p.add_argument("--state", type=Path, default=None,
                   help="state file (default: the config's state_file)")
    p.add_argument("--once", action="store_true",
                   help="stop when nothing is left to read or send")
    p.add_argument("--check", action="store_true",
                   help="validate the config and its environment variables, then exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from failslow.dashboards import notify

    try:
        config = notify.load_config(args.config)
        if args.state is not None:
            config = dataclasses.replace(config, state_file=args.state)
        notifier = notify.Notifier(config)
    except (notify.ConfigError, OSError) as e:
        print(f"failslow notify: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(f"config ok: {len(config.receivers)} receiver(s), {len(config.routes)} route(s), "
              f"state {config.state_file}, {len(notifier.outbox)} waiting deliver(ies)")
        return 0

    from failslow.stream.kafka import KafkaTransport
    from failslow.stream.sink import ADVICE_TOPIC
    from failslow.stream.transport import ANOMALIES_TOPIC, topic_for

    transport = KafkaTransport(args.kafka, group_id=args.group, topic_prefix=args.topic_prefix,
                               subscribe=(topic_for("meta"), ANOMALIES_TOPIC, ADVICE_TOPIC),
                               produce=False)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        stats = notify.run(notifier, transport, until_idle=args.once,
                           should_stop=lambda: stopping)
    finally:
        notifier.save()
        transport.close()
    log.info("notify: %s", stats.to_dict())
    print(" ".join(f"{k}={v}" for k, v in stats.to_dict().items()))
    return 0
