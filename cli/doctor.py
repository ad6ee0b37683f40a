"""``failslow doctor``: check every configured connection and say in plain words what is
wrong: Kafka (reachable, TLS and SASL accepted, topics present, consumer-group lag),
ClickHouse (reachable, authenticated, schema version), the webhook routes (they parse and the
variables they name are set) and the ring directory. One line per check; exit 1 when one
failed. Secrets are never printed, only the names of the variables that hold them."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from failslow.settings import get_settings, redact_url

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass
class Check:
    name: str
    status: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<5} {self.name:<26} {self.detail}"


def check_kafka(bootstrap: str, prefix: str, groups: list[str],
                timeout: float) -> list[Check]:
    from failslow.stream.kafka_security import (
        KafkaConnectError,
        check_connection,
        client_security,
    )
    from failslow.stream.kafka_topics import ALL_TOPICS

    try:
        security = client_security()
    except ValueError as e:
        return [Check("kafka", FAIL, str(e))]
    how = security["security_protocol"]
    if "sasl_mechanism" in security:
        how += f", {security['sasl_mechanism']} as {security['sasl_plain_username']}"
    try:
        names = set(check_connection(bootstrap, security, timeout, topics=True) or [])
    except KafkaConnectError as e:
        return [Check("kafka", FAIL, str(e))]
    out = [Check("kafka", OK, f"{bootstrap} answers ({how})")]
    missing = [prefix + t for t in ALL_TOPICS if prefix + t not in names]
    if missing:
        out.append(Check("kafka topics", WARN,
                         f"{len(missing)} of {len(ALL_TOPICS)} missing ({', '.join(missing)}); "
                         "'failslow process' or 'replay' creates them"))
    else:
        out.append(Check("kafka topics", OK, f"all {len(ALL_TOPICS)} present"))
    present = sorted(prefix + t for t in ALL_TOPICS if prefix + t in names)
    out += [_group_lag(bootstrap, security, g, present, timeout) for g in groups]
    return out


def _group_lag(bootstrap: str, security: dict[str, Any], group: str, topics: list[str],
               timeout: float) -> Check:
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    name = f"group {group}"
    ms = int(timeout * 1000)
    admin = consumer = None
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="failslow-doctor",
                                 request_timeout_ms=ms, bootstrap_timeout_ms=ms, **security)
        committed = admin.list_group_offsets({group: None}).get(group, {})
        committed = {tp: om for tp, om in committed.items() if tp.topic in topics}
        if not committed:
            return Check(name, WARN, "no committed offsets yet (has it run?)")
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                 client_id="failslow-doctor", request_timeout_ms=ms,
                                 bootstrap_timeout_ms=ms, **security)
        tps = [TopicPartition(tp.topic, tp.partition) for tp in committed]
        ends = consumer.end_offsets(tps)
        lag = sum(max(0, int(ends.get(tp, 0)) - int(om.offset))
                  for tp, om in zip(tps, committed.values(), strict=True))
        return Check(name, OK, f"lag {lag:,} messages over {len(tps)} partitions")
    except Exception as e:  # noqa: BLE001 - one line about it
        return Check(name, WARN, f"lag unknown: {type(e).__name__}: {str(e)[:160]}")
    finally:
        for client in (consumer, admin):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()


def check_clickhouse(url: str | None, data_dir: Path, database: str) -> list[Check]:
    from failslow import results
    from failslow.stream.clickhouse import (
        SchemaError,
        connect,
        describe_error,
        upgrade_schema,
    )

    where = redact_url(url) if url else f"embedded {data_dir / 'clickhouse'}"
    try:
        client = connect(data_dir, url)
        client.query("SELECT 1")
    except Exception as e:  # noqa: BLE001 - say it in one line
        if not url and "Unable to open the chdb engine" in str(e):
            return [Check("clickhouse", WARN, f"{where} is in use by another process "
                                              "(a running 'failslow process'?)")]
        return [Check("clickhouse", FAIL, describe_error(e, url))]
    try:
        user = get_settings().clickhouse.user
        out = [Check("clickhouse", OK, f"{where} answers"
                     + (f" (user {user})" if url and user else ""))]
        want = results.SCHEMA_VERSION
        try:
            found, plan = upgrade_schema(client, database, dry_run=True)
        except SchemaError as e:
            return [*out, Check("schema", FAIL, str(e))]
        if found == 0:
            out.append(Check("schema", WARN, f"database {database} has no failslow tables "
                                             "yet; 'failslow process' creates them"))
        elif plan:
            out.append(Check("schema", WARN, f"database {database} is at version {found}; "
                                             f"'failslow process' upgrades it to {want} "
                                             f"({len(plan)} changes)"))
        else:
            out.append(Check("schema", OK, f"database {database} at version {found}"))
        return out
    finally:
        with contextlib.suppress(Exception):
            client.close()


def check_routes(path: Path | None) -> list[Check]:
    if path is None:
        return [Check("webhook routes", WARN, "not checked (give --routes FILE)")]
    from failslow.dashboards.notify_config import ConfigError, load_config
    from failslow.settings import environment

    try:
        config = load_config(path)
    except (ConfigError, OSError) as e:
        return [Check("webhook routes", FAIL, f"{path}: {e}")]
    env = environment()
    problems = []
    for r in config.receivers.values():
        try:
            r.resolve_url(env)
            r.secret(env)
            if r.type == "pagerduty":
                r.routing_key(env)
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        return [Check("webhook routes", FAIL, f"{path}: {'; '.join(problems)}")]
    return [Check("webhook routes", OK, f"{path}: {len(config.receivers)} receiver(s), "
                                        f"{len(config.routes)} route(s), variables set")]


def check_ring_dir(ring_dir: Path) -> list[Check]:
    from failslow.collectors.ring import find_rings

    if not ring_dir.is_dir():
        return [Check("ring dir", FAIL, f"{ring_dir} is not a directory")]
    if not os.access(ring_dir, os.W_OK | os.X_OK):
        return [Check("ring dir", FAIL, f"{ring_dir} is not writable by this user")]
    rings = find_rings(ring_dir)
    return [Check("ring dir", OK, f"{ring_dir} writable, {len(rings)} ring file(s)")]


def cmd_doctor(args: argparse.Namespace) -> int:
    from failslow.stream.clickhouse import default_data_dir
    from failslow.stream.kafka_security import quiet_client_logs

    quiet_client_logs()
    checks: list[Check] = []
    if not args.no_kafka:
        bootstrap = args.kafka
        if not bootstrap:
            from failslow.infra.kafka_broker import bootstrap_servers

            bootstrap = bootstrap_servers()
        checks += check_kafka(bootstrap, args.topic_prefix, _groups(args), args.timeout)
    if not args.no_clickhouse:
        data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
        checks += check_clickhouse(args.clickhouse or None, data_dir, args.database)
    checks += check_routes(args.routes)
    checks += check_ring_dir(Path(args.ring_dir))
    if args.json:
        print(json.dumps([asdict(c) for c in checks]))
    else:
        for c in checks:
            print(c.line())
    failed = [c for c in checks if c.status == FAIL]
    if failed and not args.json:
        print(f"{len(failed)} check(s) failed", file=sys.stderr)
    return 1 if failed else 0


def add_parser(subparsers: Any) -> None:
    """Register ``failslow doctor``."""
    s = get_settings()
    p = subparsers.add_parser(
        "doctor", help="check the Kafka, ClickHouse, webhook and ring settings",
        description="Check each configured connection and say what is wrong: Kafka "
                    "(reachable, TLS and SASL accepted, topics present, consumer-group lag), "
                    "ClickHouse (reachable, authenticated, schema version), the webhook "
                    "routes (they parse, their variables are set) and the ring directory. "
                    "Exits 1 when a check failed; secrets are never printed.")
    p.add_argument("--kafka", default=s.kafka.bootstrap, metavar="HOST:PORT[,...]",
                   help="Kafka bootstrap servers (env FAILSLOW_KAFKA; security from "
                        "FAILSLOW_KAFKA_SECURITY_PROTOCOL and the others)")
    p.add_argument("--topic-prefix", default=s.kafka.topic_prefix, metavar="PREFIX",
                   help="Kafka topic prefix (env FAILSLOW_TOPIC_PREFIX)")
    p.add_argument("--group", action="append", default=None, metavar="GROUP",
                   help="consumer group whose lag to report (repeatable; default: the "
                        "processor's and the notifier's)")
    p.add_argument("--clickhouse", default=s.clickhouse.url, metavar="URL",
                   help="ClickHouse server URL (env FAILSLOW_CLICKHOUSE; default: the "
                        "embedded store in DATA_DIR)")
    p.add_argument("--data-dir", type=Path, default=s.processor.data_dir, metavar="DIR",
                   help="the embedded store's folder (env FAILSLOW_DATA_DIR)")
    p.add_argument("--database", default=s.clickhouse.database,
                   help="ClickHouse database (env FAILSLOW_DATABASE; default %(default)s)")
    p.add_argument("--routes", type=Path, default=None, metavar="FILE",
                   help="the notifier's routes file to check")
    p.add_argument("--ring-dir", type=Path, default=s.collector.ring_dir, metavar="DIR",
                   help="the collectors' ring directory (env FAILSLOW_RING_DIR; default "
                        "%(default)s)")
    p.add_argument("--no-kafka", action="store_true", help="skip the Kafka checks")
    p.add_argument("--no-clickhouse", action="store_true", help="skip the ClickHouse checks")
    p.add_argument("--timeout", type=float, default=8.0, metavar="SECONDS",
                   help="per connection (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the checks as a JSON array")
    p.set_defaults(func=cmd_doctor)


def _groups(args: argparse.Namespace) -> list[str]:
    return args.group or [get_settings().kafka.group, "failslow-notify"]
