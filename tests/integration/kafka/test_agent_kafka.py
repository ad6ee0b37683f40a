"""The agent publishing to a real Kafka broker (the session fixture ``broker``)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from support.rings import ring_with_records

from failslow.collectors.agent import Agent, TransportSink
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import decode


def test_agent_to_kafka(broker: Any, tmp_path: Path) -> None:
    pfx = f"t{uuid.uuid4().hex[:10]}."
    rings = tmp_path / "rings"
    rings.mkdir()
    for r in range(2):
        ring_with_records(rings, r, 900000 + r, 30).close()
    producer = KafkaTransport(broker.bootstrap, topic_prefix=pfx, subscribe=())
    agent = Agent(TransportSink(producer), rings, node="n1",
                  collectors={"gpu": False, "rdma": False})
    agent.close()  # drains, publishes, closes (flushes) the producer
    consumer = KafkaTransport(broker.bootstrap, topic_prefix=pfx,
                              group_id=f"g-{uuid.uuid4().hex[:8]}",
                              subscribe=["failslow.meta", "failslow.coll"])
    rows: dict[str, int] = {}
    deadline = time.monotonic() + 30
    try:
        while rows.get("coll", 0) < 120 and time.monotonic() < deadline:
            for m in consumer.poll(500, timeout=1.0):
                kind, table = decode(m)
                assert m.key == "job1"
                rows[kind] = rows.get(kind, 0) + table.num_rows
    finally:
        consumer.close()
    assert rows.get("coll") == 2 * 2 * 30 and rows.get("meta", 0) >= 1
