"""docker-compose.yml's ``demo`` profile: the live job (``failslow simulate --live``), a
notifier routed to the demo's webhook receiver, and that receiver (infra/demo/receiver.py)
logging the pages it gets. There is no Docker engine here: the compose client only
validates the file (``docker-compose --profile demo config``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO
from failslow.cli import app

COMPOSE = REPO / "docker-compose.yml"
DEMO = ("demo", "demo-notifier", "webhook-receiver")


def _services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def _binds(service: dict[str, Any]) -> dict[str, str]:
    out = {}
    for v in service.get("volumes", []):
        host, container = v.split(":")[:2]
        if host.startswith("./"):
            out[container] = host
    return out


def test_demo_profile_services() -> None:
    services = _services()
    for name in DEMO:
        s = services[name]
        assert s["profiles"] == ["demo"], name
        assert s["image"] == "failslow:local" and "ports" not in s, name
        for container, host in _binds(s).items():
            assert (REPO / host).is_file(), (name, container, host)
    for name, s in services.items():      # the default stack stays as it was
        if name not in DEMO and name not in ("agent", "hang-detector", "iteration-tracker",
                                             "evidence-reducer-0",
                                             "evidence-reducer-1"):  # opt-in profiles
            assert "profiles" not in s, name
    demo = services["demo"]
    assert demo["environment"]["FAILSLOW_KAFKA"] == "kafka:9092"
    assert demo["depends_on"]["kafka"]["condition"] == "service_healthy"
    # the demo's command is a valid live run of this failslow
    args = app.build_parser().parse_args(demo["command"])
    assert args.live and args.command == "simulate" and not args.embedded
    assert args.first_fault <= 30 and args.fault_every <= 600 and args.ranks in (64, 128, 256)


def test_demo_notifier_pages_the_receiver() -> None:
    from failslow.dashboards import notify

    services = _services()
    note, recv = services["demo-notifier"], services["webhook-receiver"]
    assert note["command"][0] == "notify"
    routes = _binds(note)[note["command"][note["command"].index("--config") + 1]]
    config = notify.load_config(REPO / routes)
    [receiver] = config.receivers.values()
    port = recv["command"][0]
    assert receiver.resolve_url({}) == f"http://webhook-receiver:{port}/page"
    assert any(r.match.min_severity == "info" for r in config.routes)  # every page
    group = note["command"][note["command"].index("--group") + 1]
    assert group != "failslow-notify"   # beside the notifier, not instead of it
    assert recv["entrypoint"][0] == "python"
    assert _binds(recv)[recv["entrypoint"][1]] == "./infra/demo/receiver.py"


def test_receiver_logs_each_page(tmp_path: Path) -> None:
    log = tmp_path / "receiver.log"
    proc = subprocess.Popen([sys.executable, str(REPO / "infra/demo/receiver.py"), "0",
                             "127.0.0.1"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        port = 0
        for _ in range(300):
            text = log.read_text()
            if "listening on" in text:
                port = int(text.split("listening on ")[1].split(":")[1].split()[0])
                break
            assert proc.poll() is None, text
            time.sleep(0.1)
        assert port, log.read_text()
        body = json.dumps({"event": "trigger", "severity": "warning",
                           "summary": "[warning] live-job: slow/compute at rank 21"}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/page", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    lines = [line for line in log.read_text().splitlines() if " page " in line]
    assert len(lines) == 1
    assert "/page page trigger [warning] [warning] live-job: slow/compute at rank 21" in lines[0]


def test_compose_client_accepts_the_demo_profile() -> None:
    client = shutil.which("docker-compose")
    if client is None:
        assert not os.environ.get("CI"), "no docker-compose in CI (infra/test.sh installs it)"
        pytest.skip("no docker-compose here")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    result = subprocess.run([client, "-f", str(COMPOSE), "--profile", "demo", "config"],
                            capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    assert set(resolved) >= {*DEMO, "kafka", "processor", "grafana"}
    assert resolved["demo"]["command"][:2] == ["simulate", "--live"]


def test_image_holds_every_package_folder() -> None:
    """The demo runs ``failslow simulate`` in the failslow image: its Dockerfile copies every
    folder that pyproject.toml maps to a package, or ``pip install .`` fails."""
    import tomllib

    text = (REPO / "infra" / "Dockerfile").read_text()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    roots = {f if f.startswith("infra/") else f.split("/")[0] for f in folders}
    for folder in sorted(roots):
        assert f"COPY {folder} ./{folder}" in text, folder
