"""The Kafka topics of the pipeline: their settings, and their creation by a client (the
transport creates what is missing when it connects)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from failslow.engine.probes import PROBE_REQUESTS_TOPIC
from failslow.stream.exports import EXPORT_TOPICS, exported_of
from failslow.stream.sink import ADVICE_TOPIC
from failslow.stream.transport import ANOMALIES_TOPIC, DEADLETTER_TOPIC, EVENT_TOPICS, kind_of

log = logging.getLogger(__name__)

#: Every topic the pipeline uses (created on connect).
ALL_TOPICS: tuple[str, ...] = (*EVENT_TOPICS, ANOMALIES_TOPIC, ADVICE_TOPIC,
                               DEADLETTER_TOPIC, PROBE_REQUESTS_TOPIC, *EXPORT_TOPICS)

#: Retention of the topics this transport creates (the processor is minutes behind at most;
#: anomaly reports and dead letters are kept longer for whoever reads them).
TOPIC_CONFIGS: dict[str, dict[str, str]] = {
    "events": {"retention.ms": str(3 * 24 * 3600 * 1000), "max.message.bytes": str(8 << 20)},
    ANOMALIES_TOPIC: {"retention.ms": str(30 * 24 * 3600 * 1000)},
    ADVICE_TOPIC: {"retention.ms": str(30 * 24 * 3600 * 1000)},
    DEADLETTER_TOPIC: {"retention.ms": str(30 * 24 * 3600 * 1000),
                       "max.message.bytes": str(8 << 20)},
}


def topic_configs(topic: str) -> dict[str, str]:
    """The settings of logical ``topic`` (event topics share theirs)."""
    events_like = kind_of(topic) or exported_of(topic)  # derived tables: as event topics
    return dict(TOPIC_CONFIGS.get(topic, TOPIC_CONFIGS["events"] if events_like else {}))


def create_missing(admin: Any, topics: Mapping[str, Mapping[str, str]],
                   partitions: int) -> list[str]:
    """Create those of ``topics`` (Kafka name -> settings) that do not exist, with
    ``partitions`` partitions each, through kafka-python's ``admin`` client, and wait for
    their leaders; returns the names created."""
    from kafka.errors import TopicAlreadyExistsError

    existing = set(admin.list_topics())
    missing = [name for name in topics if name not in existing]
    if missing:
        spec = {name: {"num_partitions": partitions, "replication_factor": 1,
                       "topic_configs": dict(topics[name])} for name in missing}
        with contextlib.suppress(TopicAlreadyExistsError):  # created concurrently
            admin.create_topics(spec, wait_for_metadata=True)
        wait_for_leaders(admin, missing)
    return missing


def wait_for_leaders(admin: Any, names: list[str], timeout: float = 10.0) -> None:
    """Until every partition of the new topics has a leader (else the first messages
    fail with NotLeaderForPartition and are retried)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            described = admin.describe_topics(names)
            if all(t.get("error_code", 0) == 0 and t.get("partitions") and all(
                    p.get("leader_id", -1) >= 0 for p in t["partitions"])
                   for t in described):
                break
        except Exception as e:  # noqa: BLE001 - not ready yet
            log.debug("waiting for topic leaders: %s", e)
        time.sleep(0.1)
    # a leader in the metadata may not have made its replica yet (KRaft applies the
    # change asynchronously): ask every partition's leader for its end offset, which
    # it answers only once it leads the partition
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    while time.monotonic() < deadline:
        try:
            parts = [TopicPartition(t["name"], p["partition_index"])
                     for t in admin.describe_topics(names) for p in t["partitions"]]
            admin.list_partition_offsets(
                dict.fromkeys(parts, OffsetSpec.LATEST),
                timeout_ms=max(100, int((deadline - time.monotonic()) * 1000)))
            return
        except Exception as e:  # noqa: BLE001 - not ready yet
            log.debug("waiting for topic leaders: %s", e)
        time.sleep(0.1)
