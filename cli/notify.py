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
import threading
import time
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
                   help="deliver what the topics hold now, then exit (waits up to "
                        "--once-timeout seconds for the partitions)")
    p.add_argument("--once-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="with --once: longest wait to read the topics to their end; "
                        "exit 1 when it passes (default %(default)s)")
    p.add_argument("--check", action="store_true",
                   help="validate the config and its environment variables, then exit")
    p.set_defaults(func=run)


def _unconfigured(config: Any) -> list[str]:
    """The variables that name the receivers' addresses and are unset, when no receiver
    has one (compose's default: no webhook configured); [] otherwise."""
    from failslow.settings import environment

    env = environment()
    missing = []
    for r in config.receivers.values():
        var = r.routing_key_env if r.type == "pagerduty" else r.url_env
        if not var or env.get(var):
            return []
        missing.append(var)
    return missing


class _UntilDrained:
    """A transport whose :meth:`poll` returns nothing only once the consumer has its
    partitions and has read them to the end offsets (``--once``), or after ``timeout``
    seconds (then :attr:`timed_out`)."""

    def __init__(self, transport: Any, timeout: float) -> None:
        self.transport = transport
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.timed_out = False

    def poll(self, max_messages: int = 100, timeout: float = 0.0) -> list[Any]:
        while True:
            messages = self.transport.poll(max_messages, timeout=max(timeout, 0.2))
            if messages:
                return list(messages)
            if self.transport.drained():
                return []
            if time.monotonic() > self.deadline:
                self.timed_out = True
                return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def _idle(stopping: threading.Event) -> int:
    """Stay up without a receiver (no restart loop under ``restart: unless-stopped``)."""
    def stop(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping.wait(3600):
        pass
    return 0


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from failslow.dashboards import notify

    try:
        config = notify.load_config(args.config)
        if args.state is not None:
            config = dataclasses.replace(config, state_file=args.state)
        missing = [] if args.check or args.once else _unconfigured(config)
        if missing:
            log.warning("notify: no webhook configured (%s not set): staying idle, paging "
                        "nobody", ", ".join(f"${v}" for v in missing))
            return _idle(threading.Event())
        notifier = notify.Notifier(config)
    except (notify.ConfigError, OSError) as e:
        print(f"failslow notify: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(f"config ok: {len(config.receivers)} receiver(s), {len(config.routes)} route(s), "
              f"state {config.state_file}, {len(notifier.outbox)} waiting deliver(ies)")
        return 0

    from failslow.stream.kafka import KafkaTransport
    from failslow.stream.kafka_security import (
        KafkaConnectError,
        check_connection,
        quiet_client_logs,
    )
    from failslow.stream.sink import ADVICE_TOPIC
    from failslow.stream.transport import ANOMALIES_TOPIC, topic_for

    quiet_client_logs()
    if args.kafka is None:
        from failslow.infra.kafka_broker import bootstrap_servers

        args.kafka = bootstrap_servers()
    try:
        check_connection(args.kafka)
    except KafkaConnectError as e:
        print(f"failslow notify: {e}", file=sys.stderr)
        return 1
    transport = KafkaTransport(args.kafka, group_id=args.group, topic_prefix=args.topic_prefix,
                               subscribe=(topic_for("meta"), ANOMALIES_TOPIC, ADVICE_TOPIC),
                               produce=False)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    source: Any = _UntilDrained(transport, args.once_timeout) if args.once else transport
    try:
        stats = notify.run(notifier, source, until_idle=args.once,
                           should_stop=lambda: stopping)
    finally:
        notifier.save()
        transport.close()
    log.info("notify: %s", stats.to_dict())
    print(" ".join(f"{k}={v}" for k, v in stats.to_dict().items()))
    if isinstance(source, _UntilDrained) and source.timed_out:
        print(f"failslow notify: --once: the topics were not read to their end within "
              f"{source.timeout:g} s ({transport.drain_wait or 'unknown'}); "
              f"what was read is delivered, the rest waits for the next run "
              f"(--once-timeout)",
              file=sys.stderr)
        return 1
    return 0
