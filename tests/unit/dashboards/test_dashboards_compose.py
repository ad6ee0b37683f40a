"""docker-compose.yml, the failslow image and the Grafana provisioning fit together: every
service is there, ports are bound to 127.0.0.1, mounts point at files that exist and at the
paths the provisioning expects, and the compose client (where installed) accepts the file."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO
from failslow.dashboards import panels

ROOT = REPO
COMPOSE = ROOT / "docker-compose.yml"
PROVISIONING = ROOT / "infra" / "grafana" / "provisioning"


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {str(k): str(v) for k, v in env.items()}


def _binds(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path of the bind mounts (named volumes left out)."""
    out = {}
    for v in service.get("volumes", []):
        host, container = v.split(":")[:2]
        if host.startswith(("./", "/")):
            out[container] = host
    return out


def test_every_service_and_ports_on_loopback_only() -> None:
    doc = _compose()
    services = doc["services"]
    assert set(services) == {"kafka", "clickhouse", "grafana", "processor", "archiver",
                             "notifier", "agent", "prometheus", "hang-detector",
                             "iteration-tracker", "evidence-reducer-0", "evidence-reducer-1",
                             "demo", "demo-notifier", "webhook-receiver"}  # profile demo
    published = []
    for name, s in services.items():
        for port in s.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} not bound to loopback"
            published.append(int(str(port).split(":")[1]))
    assert sorted(published) == [3000, 8123, 9094]
    assert services["kafka"]["image"] == "apache/kafka:3.9.1"
    major, minor = map(int, services["clickhouse"]["image"].split(":")[1].split(".")[:2])
    assert (major, minor) >= (25, 8)
    assert services["grafana"]["image"].startswith("grafana/grafana:11.")
    for name in ("processor", "archiver", "notifier", "agent"):
        s = services[name]
        assert s["build"]["dockerfile"] == "infra/Dockerfile" and s["image"] == "failslow:local"
        env = _env(s)
        assert env["FAILSLOW_KAFKA"] == "kafka:9092" and env["FAILSLOW_DATA_DIR"] == "/data"
        assert env["FAILSLOW_CLICKHOUSE"].startswith("http://failslow:")
        assert env["FAILSLOW_CLICKHOUSE"].endswith("@clickhouse:8123")
    # detection and raw-event archiving in two consumer groups, a core each
    assert services["processor"]["command"] == ["process", "--no-store-events"]
    assert services["archiver"]["command"] == ["process", "--no-detect", "--group",
                                               "failslow-archiver"]
    assert services["notifier"]["command"][0] == "notify"
    assert services["agent"]["command"] == ["agent"] and services["agent"]["profiles"] == ["agent"]
    assert set(doc["volumes"]) >= {"clickhouse-data", "grafana-data", "notifier-data"}


def test_kafka_listeners() -> None:
    env = _env(_compose()["services"]["kafka"])
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    advertised = dict(x.split("://") for x in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert advertised == {"PLAINTEXT": "kafka:9092", "HOST": "127.0.0.1:9094"}


def test_mounts_exist_and_match_the_provisioning() -> None:
    services = _compose()["services"]
    for name, s in services.items():
        for _container, host in _binds(s).items():
            if host.startswith("./"):
                assert (ROOT / host).exists(), f"{name}: {host} missing"
    ch = _binds(services["clickhouse"])
    assert ch["/docker-entrypoint-initdb.d/01-schema.sql"] == "./infra/clickhouse/schema.sql"
    assert "CREATE DATABASE IF NOT EXISTS `failslow`" in (ROOT / "infra/clickhouse/schema.sql"
                                                          ).read_text()
    graf = services["grafana"]
    binds = _binds(graf)
    assert binds["/etc/grafana/provisioning"] == "./infra/grafana/provisioning"
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "failslow.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert binds[path] == "./infra/grafana/dashboards"
    env = _env(graf)
    assert "grafana-clickhouse-datasource" in env["GF_INSTALL_PLUGINS"]
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "infra/grafana/dashboards" / Path(home).name).is_file()
    assert home.startswith(path)
    notifier = _binds(services["notifier"])
    assert notifier["/etc/failslow/routes.yaml"] == "./infra/notify/routes.yaml"
    assert services["notifier"]["command"][-1] == "/etc/failslow/routes.yaml"


def test_datasource_provisioning_uses_the_services_environment() -> None:
    doc = yaml.safe_load((PROVISIONING / "datasources" / "failslow.yaml").read_text())
    ds, prom = doc["datasources"]
    assert ds["type"] == panels.PLUGIN and ds["uid"] == panels.DATASOURCE_UID
    assert ds["jsonData"]["protocol"] == "http" and ds["jsonData"]["port"] == 8123
    assert ds["jsonData"]["defaultDatabase"] == panels.DEFAULT_DATABASE
    referenced = set(re.findall(r"\$\{(\w+)\}", json.dumps(ds)))
    graf_env = _env(_compose()["services"]["grafana"])
    assert referenced == {"FAILSLOW_CLICKHOUSE_HOST", "FAILSLOW_CLICKHOUSE_USER",
                          "FAILSLOW_CLICKHOUSE_PASSWORD"} and referenced <= set(graf_env)
    assert "password" not in ds["jsonData"]  # only in secureJsonData, from the environment
    assert prom["type"] == panels.PROMETHEUS_PLUGIN and prom["uid"] == panels.PROMETHEUS_UID
    assert prom["url"] == "${FAILSLOW_PROMETHEUS_URL}"
    ch_env = _env(_compose()["services"]["clickhouse"])
    assert graf_env["FAILSLOW_CLICKHOUSE_USER"] == ch_env["CLICKHOUSE_USER"]
    assert graf_env["FAILSLOW_CLICKHOUSE_PASSWORD"] == ch_env["CLICKHOUSE_PASSWORD"]


def test_alert_rules_provisioning() -> None:
    doc = yaml.safe_load((PROVISIONING / "alerting" / "failslow.yaml").read_text())
    [group] = doc["groups"]
    rules = {r["uid"]: r for r in group["rules"]}
    prom = {"failslow-processor-down", "failslow-dead-letters", "failslow-consumer-lag"}
    assert set(rules) == {"failslow-open-anomaly", "failslow-hang", "failslow-pipeline-lag",
                          *prom}
    for r in rules.values():
        a, b = r["data"]
        if r["uid"] in prom:  # tested against a live Prometheus: test_grafana_prometheus.py
            assert a["datasourceUid"] == panels.PROMETHEUS_UID and a["model"]["instant"]
            assert "failslow_processor_" in a["model"]["expr"] or "up{" in a["model"]["expr"]
        else:
            assert a["datasourceUid"] == panels.DATASOURCE_UID and "`failslow`." in \
                a["model"]["rawSql"]
        assert b["datasourceUid"] == "__expr__" and b["model"]["type"] == "threshold"
        assert r["condition"] == "B" and r["labels"]["severity"] in ("warning", "critical")
    assert rules["failslow-hang"]["labels"]["severity"] == "critical"


def test_dockerfile_builds_the_failslow_command() -> None:
    text = (ROOT / "infra" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", text, re.M)
    assert 'ENTRYPOINT ["failslow"]' in text and "USER failslow" in text
    for folder in ("core", "collectors", "detectors", "stream", "dashboards"):
        assert f"COPY {folder} ./{folder}" in text and (ROOT / folder).is_dir()
    assert 'pip install ".[kafka,grafana]"' in text


def _compose_client() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True,
                                 timeout=30).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy and subprocess.run([legacy, "version"], capture_output=True,
                                 timeout=30).returncode == 0:
        return [legacy]
    return None


def test_compose_client_accepts_the_file() -> None:
    client = _compose_client()
    if client is None:
        assert not os.environ.get("CI"), "no compose client in CI (infra/test.sh installs it)"
        pytest.skip("no compose client here (neither `docker compose` nor `docker-compose` "
                    "runs); the YAML checks above still ran")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    result = subprocess.run([*client, "-f", str(COMPOSE), "config"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert "127.0.0.1" in json.dumps(resolved["services"]["grafana"]["ports"])
    assert set(resolved["services"]) >= {"kafka", "clickhouse", "grafana", "processor",
                                         "notifier"}


def test_prometheus_scrapes_the_processor_on_loopback() -> None:
    """The processor's metrics endpoint listens on 127.0.0.1 only, so Prometheus shares its
    network namespace, scrapes 127.0.0.1:<the processor's default metrics port> and Grafana
    reaches it at processor:9090."""
    from failslow.settings import ProcessorSettings

    default_port = ProcessorSettings().metrics_port
    services = _compose()["services"]
    prom = services["prometheus"]
    assert prom["network_mode"] == "service:processor" and "ports" not in prom
    binds = _binds(prom)
    assert binds["/etc/prometheus/prometheus.yml"] == "./infra/grafana/prometheus/prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    config = yaml.safe_load((ROOT / "infra/grafana/prometheus/prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["job_name"] == panels.PROCESSOR_JOB
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{default_port}"]
    assert "FAILSLOW_METRICS_PORT" not in _env(services["processor"])  # the default port
    graf = _env(services["grafana"])
    assert graf["FAILSLOW_PROMETHEUS_URL"] == "http://processor:9090"


def test_split_profile_runs_one_jobs_detectors_in_three_groups() -> None:
    """``--profile split``: the iteration tracker exporting the iterations and the hang
    detector, each in its own consumer group, and the processor told
    (FAILSLOW_PROCESSOR_DETECTORS, FAILSLOW_PROCESSOR_IMPORT) to run the others on the
    imported iterations; all name real detectors."""
    from failslow.engine.registry import NAMES, JobConfig, parse_names

    services = _compose()["services"]
    hang, track = services["hang-detector"], services["iteration-tracker"]
    processor = services["processor"]
    groups = set()
    for service, names in ((hang, {"hang"}), (track, {"iterations"})):
        assert service["profiles"] == ["split"]
        cmd = service["command"]
        assert parse_names(cmd[cmd.index("--detectors") + 1]) == names
        groups.add(cmd[cmd.index("--group") + 1])
        assert "--no-store-events" in cmd
    assert len(groups) == 2 and not groups & {"failslow-processor", "failslow-archiver"}
    assert track["command"][track["command"].index("--export") + 1] == "iterations"
    assert _env(processor)["FAILSLOW_DETECTORS"] == "${FAILSLOW_PROCESSOR_DETECTORS:-}"
    assert _env(processor)["FAILSLOW_IMPORT"] == "${FAILSLOW_PROCESSOR_IMPORT:-}"
    # the README's split runs every registered detector, each in exactly one group
    imported = frozenset({"iterations"})
    split = [JobConfig(detectors=parse_names("iterations")),
             JobConfig(detectors=parse_names("slowdown,linkrate"), imported=imported),
             JobConfig(detectors=parse_names("hang"))]
    assert [sum(g.enabled(n) for g in split) for n in NAMES if n != "evidence"] == \
        [1] * (len(NAMES) - 1)
    assert not any(g.enabled("evidence") for g in split)  # (a stage of its own: below)


def test_reduce_profile_reduces_the_evidence_in_two_shards() -> None:
    """``--profile reduce``: two evidence reducers, shards 0/2 and 1/2, each in its own
    consumer group, sizing their bins by the imported iterations and exporting their
    evidence; with the processor importing it, every detector runs in exactly one group
    (the reducer once per shard) and the slow-down detector reduces no row itself."""
    from failslow.engine.registry import NAMES, JobConfig, parse_names
    from failslow.stream.exports import parse_shard

    services = _compose()["services"]
    reducers = [services[f"evidence-reducer-{i}"] for i in range(2)]
    groups, shards, split = set(), [], []
    for service in reducers:
        assert service["profiles"] == ["reduce"]
        cmd = service["command"]
        assert parse_names(cmd[cmd.index("--detectors") + 1]) == {"evidence"}
        assert cmd[cmd.index("--export") + 1] == "evidence"
        assert cmd[cmd.index("--import") + 1] == "iterations"
        groups.add(cmd[cmd.index("--group") + 1])
        shards.append(parse_shard(cmd[cmd.index("--shard") + 1]))
        split.append(JobConfig(detectors=parse_names("evidence"), imported=frozenset(
            {"iterations"}), evidence_shard=shards[-1]))
    assert shards == [(0, 2), (1, 2)] and len(groups) == 2
    split += [JobConfig(detectors=parse_names("iterations")),
              JobConfig(detectors=parse_names("slowdown,linkrate"),
                        imported=frozenset({"iterations", "evidence"})),
              JobConfig(detectors=parse_names("hang"))]
    counts = {n: sum(g.enabled(n) for g in split) for n in NAMES}
    assert counts == {**{n: 1 for n in NAMES}, "evidence": 2}
