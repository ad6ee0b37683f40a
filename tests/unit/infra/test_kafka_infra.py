"""failslow.infra.kafka_broker and KafkaTransport without a broker: configuration, safety,
failure paths.

(The tests against a running broker are in test_kafka_transport.py.)"""

from __future__ import annotations

import json
import os
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO
from failslow import events
from failslow.cli import infra as infra_cli
from failslow.infra import kafka_broker as infra
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import topic_for

REPO = REPO
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_pom_fetches_the_artifacts_the_module_declares() -> None:
    for text in ((REPO / "infra/kafka/pom.xml").read_text(), infra.render_pom()):
        root = ET.fromstring(text)
        deps = {(d.findtext("m:groupId", namespaces=POM_NS),
                 d.findtext("m:artifactId", namespaces=POM_NS),
                 d.findtext("m:version", namespaces=POM_NS))
                for d in root.iterfind("m:dependencies/m:dependency", POM_NS)}
        props = {p.tag.split("}")[1]: p.text or "" for p in root.iterfind("m:properties/*", POM_NS)}
        deps = {(g, a, v.replace("${kafka.version}", props.get("kafka.version", ""))
                 .replace("${slf4j.version}", props.get("slf4j.version", "")))
                for g, a, v in deps if g and a and v}
        assert deps == set(infra.MAVEN_ARTIFACTS)


def test_server_properties_bind_loopback_only(tmp_path: Path) -> None:
    props = dict(line.split("=", 1) for line in
                 infra.server_properties(19092, 19093, tmp_path / "data").splitlines())
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["process.roles"] == "broker,controller"
    assert props["auto.create.topics.enable"] == "true"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["log.dirs"] == str(tmp_path / "data")


def test_status_and_down_of_an_empty_state_dir(tmp_path: Path) -> None:
    status = infra.kafka_status(tmp_path)
    assert not status.running and status.port is None
    assert "not running" in status.describe()
    assert infra.kafka_down(tmp_path) is False
    assert infra_cli.main(["status", "--state-dir", str(tmp_path)]) == 3


def test_a_stale_pid_of_another_process_is_neither_running_nor_killed(tmp_path: Path) -> None:
    # The pid file names this test process (not a broker): status must not claim it runs,
    # and down must not signal it.
    (tmp_path / "broker.json").write_text(json.dumps({"pid": os.getpid(), "port": 1}))
    assert not infra.kafka_status(tmp_path).running
    assert infra.kafka_down(tmp_path) is False
    assert not (tmp_path / "broker.json").exists()


def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(infra.InfraError, match=f"port {port}"):
            infra.kafka_up(port, state_dir=tmp_path)
    assert not infra.kafka_status(tmp_path).running


def test_bootstrap_servers_env_twin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAILSLOW_KAFKA", "127.0.0.1:19999")
    assert infra.bootstrap_servers() == "127.0.0.1:19999"
    assert infra._default_port() == 19999
    monkeypatch.delenv("FAILSLOW_KAFKA")
    monkeypatch.setenv("FAILSLOW_STATE_DIR", str(tmp_path))
    assert infra.bootstrap_servers() == "127.0.0.1:9092"
    assert infra.kafka_state_dir() == tmp_path / "kafka"


def test_unreachable_broker_drops_and_counts_within_max_block_ms() -> None:
    tr = KafkaTransport(f"127.0.0.1:{_closed_port()}", max_block_ms=200,
                        connect_timeout_ms=1000)
    try:
        table = events.from_rows(
            "coll", [{"job": "j1", "rank": 0, "comm": 2**64 - 1, "comm_rank": 0,
                      "comm_size": 1, "seq": 0, "op": "allreduce", "bytes": 1, "peer": -1,
                      "phase": "enter", "t": 1}])
        for _ in range(5):
            tr.publish(topic_for("coll"), "j1", table)
        stats = tr.stats()  # dropped, never queued waiting for a broker
        assert stats["dropped"] == 5 and stats["sent"] == 0 and not stats["connected"]
        assert tr.poll(10, timeout=0.5) == []
    finally:
        tr.close(timeout=3)


def test_bad_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="on_full"):
        KafkaTransport("127.0.0.1:1", on_full="wait", produce=False)


def test_cluster_ids_are_kafka_uuids_not_options() -> None:
    ids = [infra._cluster_id() for _ in range(2000)]
    assert all(len(c) == 22 and not c.startswith("-") for c in ids)
    assert len(set(ids)) == len(ids)
