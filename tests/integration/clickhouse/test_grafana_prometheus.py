"""The pipeline-health dashboard's Prometheus panels against a real Prometheus (Debian's
package, unpacked by infra/grafana/install-prometheus.sh) scraping a live stream processor's
``/metrics`` (:mod:`failslow.stream.metrics`): every PromQL target, with Grafana's
``$__rate_interval`` / ``$__range`` filled in as Grafana fills them, must be accepted, return
series, and show the processor's rows and the dead letter this test provokes.

Prometheus listens on 127.0.0.1 only and is stopped at the end of the module; the processor
runs in this process with the in-process transport, fed a few messages per second.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import stream_synth as synth

from conftest import REPO
from failslow.dashboards import grafana, panels
from failslow.stream.metrics import MetricsServer, processor_registry, render
from failslow.stream.processor import ProcessorConfig, ProcessorStats, StreamProcessor
from failslow.stream.sink import MemorySink
from failslow.stream.transport import InProcessTransport

ROOT = REPO
DASHBOARD = ROOT / "infra" / "grafana" / "dashboards" / "failslow-pipeline.json"
SCRAPE_S = 1
#: Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)
RATE_INTERVAL = f"{4 * SCRAPE_S}s"
#: one per 0.2 s: 7 s of processing, seven scrapes
ITERATIONS = 35


def _prometheus_binary() -> str | None:
    for candidate in (os.environ.get("FAILSLOW_PROMETHEUS"), shutil.which("prometheus"),
                      str(ROOT / "build/tools/prometheus/usr/bin/prometheus")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
        body = r.read().decode()
    return json.loads(body) if body.startswith("{") else body


@dataclass
class Live:
    prometheus: str  # base URL
    metrics_text: str
    t_start: float
    t_end: float
    log: Path

    def query_range(self, expr: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": expr, "start": f"{self.t_start:.3f}",
                                    "end": f"{self.t_end:.3f}", "step": f"{SCRAPE_S}s"})
        doc = _get(f"{self.prometheus}/api/v1/query_range?{q}")
        assert doc["status"] == "success", (expr, doc)
        result: list[dict[str, Any]] = doc["data"]["result"]
        return result


class _Feeder:
    """Publishes one synthetic iteration (an 8-rank DP all-reduce round) every 0.2 s and runs
    the processor until idle, so its counters keep moving between scrapes; one undecodable
    message goes to the dead-letter topic."""

    def __init__(self) -> None:
        self.bus = InProcessTransport(keep_committed=False)
        self.bus.publish_meta(synth.meta())
        config = ProcessorConfig(clock="event", analyzer_kinds=("coll",), window_ns=10**15,
                                 metrics_interval_s=0.5)
        self.proc = StreamProcessor(self.bus, MemorySink(), config,
                                    analyzer_factory=synth.FakeAnalyzer)
        coll = synth.coll(iterations=ITERATIONS)
        seqs = coll.column("seq").to_pylist()
        self.rounds = [coll.take([i for i, s in enumerate(seqs) if s == it])
                       for it in range(ITERATIONS)]
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def render(self) -> str:
        with self.lock:
            return render(self.proc.stats, self.bus.stats(), time.time())

    def stats(self) -> ProcessorStats:
        with self.lock:
            return copy.deepcopy(self.proc.stats)

    def transport_stats(self) -> dict[str, Any]:
        with self.lock:
            return self.bus.stats()

    def _run(self) -> None:
        for i, table in enumerate(self.rounds):
            if self.stop.is_set():
                return
            with self.lock:
                self.bus.publish("failslow.coll", "synth-1", table)
                if i == 5:
                    self.bus.produce("failslow.coll", "synth-1", b"not an arrow stream")
                self.proc.run(until_idle=True)
            self.stop.wait(0.2)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    binary = _prometheus_binary()
    if binary is None:
        assert not os.environ.get("CI"), "no prometheus (infra/grafana/install-prometheus.sh)"
        pytest.skip("no prometheus binary (run infra/grafana/install-prometheus.sh)")
    tmp = tmp_path_factory.mktemp("prometheus")
    feeder = _Feeder()
    server = MetricsServer(processor_registry(feeder.stats, feeder.transport_stats,
                                              time.time()), port=0)
    config = grafana.prometheus_config([f"127.0.0.1:{server.port}"], f"{SCRAPE_S}s")
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = tmp / "prometheus.log"
    with log.open("w") as out:
        prom = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--web.enable-lifecycle"], stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(f"{base}/-/ready", timeout=1)
                break
            except OSError:
                assert prom.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "prometheus not ready: " + log.read_text()
                time.sleep(0.2)
        t_start = time.time()
        feeder.thread.start()
        feeder.thread.join(timeout=20)
        time.sleep(2.5 * SCRAPE_S)  # a last scrape after the final counters
        feeder.stop.set()
        yield Live(base, feeder.render(), t_start - 1, time.time(), log)
    finally:
        feeder.stop.set()
        prom.terminate()
        try:
            prom.wait(timeout=10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        server.close()


def _targets() -> list[tuple[str, str, str]]:
    """(panel title, expression, legend) of every Prometheus target of the committed
    dashboard."""
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for p in doc["panels"]:
        if p.get("datasource", {}).get("uid") != panels.PROMETHEUS_UID:
            continue
        for t in p["targets"]:
            assert t["datasource"]["uid"] == panels.PROMETHEUS_UID
            out.append((p["title"], t["expr"], t["legendFormat"]))
    return out


TARGETS = _targets()


def _grafana_vars(expr: str, range_s: float) -> str:
    return (expr.replace("$__rate_interval", RATE_INTERVAL)
            .replace("$__range", f"{max(int(range_s), 1)}s"))


def test_the_dashboard_has_the_processor_panels() -> None:
    titles = {t for t, _, _ in TARGETS}
    assert {"Consumer lag", "Rows decoded per second by kind", "Errors",
            "Dead letters by reason", "Dropped in range"} <= titles
    assert len(TARGETS) >= 12


def test_metric_names_exist_in_the_exposition(live: Live) -> None:
    exposed = set(re.findall(r"^# TYPE (\S+) ", live.metrics_text, re.M))
    assert len(exposed) > 15
    used = {m for _, expr, _ in TARGETS for m in re.findall(r"\bfailslow_processor_\w+", expr)}
    assert used and used <= exposed, used - exposed
    for name in ("lag_messages", "rows_total", "dead_letters_total", "errors_total",
                 "dropped_total"):
        assert f"failslow_processor_{name}" in used


def test_legends_name_labels_the_series_carry(live: Live) -> None:
    for title, expr, legend in TARGETS:
        for label in re.findall(r"\{\{(\w+)\}\}", legend):
            series = live.query_range(_grafana_vars(expr, live.t_end - live.t_start))
            assert series and all(label in s["metric"] for s in series), (title, label)


@pytest.mark.parametrize("title,expr,legend", TARGETS, ids=[f"{t}:{e[:40]}"
                                                              for t, e, _ in TARGETS])
def test_promql_runs_and_returns_series(live: Live, title: str, expr: str,
                                        legend: str) -> None:
    series = live.query_range(_grafana_vars(expr, live.t_end - live.t_start))
    assert series, f"{title}: {expr} returned nothing"
    assert all(s["values"] for s in series)


def _last(series: list[dict[str, Any]]) -> float:
    return max(float(s["values"][-1][1]) for s in series)


def _peak(series: list[dict[str, Any]]) -> float:
    return max(float(v) for s in series for _, v in s["values"])


def test_the_panels_show_what_the_processor_did(live: Live) -> None:
    by_title: dict[str, list[str]] = {}
    for title, expr, _ in TARGETS:
        by_title.setdefault(title, []).append(_grafana_vars(expr, live.t_end - live.t_start))

    def run(title: str, i: int = 0) -> list[dict[str, Any]]:
        return live.query_range(by_title[title][i])

    assert _last(run("Processor up")) == 1
    rows = run("Rows decoded per second by kind")
    assert {s["metric"]["kind"] for s in rows} == {"coll", "meta"}
    assert _peak([s for s in rows if s["metric"]["kind"] == "coll"]) > 0
    written = run("Rows written per second by table")
    assert "coll" in {s["metric"]["table"] for s in written} and _peak(written) > 0
    dead = run("Dead letters by reason")
    assert any(s["metric"].get("reason") for s in dead) and _peak(dead) > 0
    assert _last(run("Dead letters in range")) >= 1
    assert _last(run("Dropped in range")) == 0
    assert _last(run("Errors in range")) == 0
    lag = run("Consumer lag")
    exported = re.search(r"^failslow_processor_lag_messages (\S+)$", live.metrics_text, re.M)
    assert exported and _last(lag) == float(exported.group(1)) < 5  # what the processor said
    assert _last(run("Consumer lag now")) == _last(lag)
    assert "error" not in live.log.read_text().lower().replace("level=warn", "")


def test_alert_rules_on_the_processor(live: Live) -> None:
    """The pipeline alert rules' instant queries, as Grafana's threshold sees them: the
    processor is up (no page), the dead letter fires, the lag stays under its threshold."""
    values = {}
    for a in panels.prometheus_alert_defs():
        q = urllib.parse.urlencode({"query": a.expr, "time": f"{live.t_end:.3f}"})
        doc = _get(f"{live.prometheus}/api/v1/query?{q}")
        assert doc["status"] == "success", (a.uid, doc)
        [sample] = doc["data"]["result"]  # one number for the threshold
        values[a.uid] = float(sample["value"][1]) > a.threshold
    assert values == {"failslow-processor-down": False, "failslow-dead-letters": True,
                      "failslow-consumer-lag": False}
    # never scraped at all (no `up` series) pages too
    down = next(a for a in panels.prometheus_alert_defs() if a.uid == "failslow-processor-down")
    q = urllib.parse.urlencode({"query": down.expr.replace(panels.PROCESSOR_JOB, "no-such-job"),
                                "time": f"{live.t_end:.3f}"})
    [sample] = _get(f"{live.prometheus}/api/v1/query?{q}")["data"]["result"]
    assert float(sample["value"][1]) > down.threshold
    provisioned = yaml.safe_load((ROOT / "infra/grafana/provisioning/alerting/failslow.yaml")
                                 .read_text())["groups"][0]["rules"]
    exprs = {r["uid"]: r["data"][0]["model"].get("expr") for r in provisioned}
    assert all(exprs[a.uid] == a.expr for a in panels.prometheus_alert_defs())


def test_promtool_accepts_the_committed_config() -> None:
    """infra/grafana/prometheus/prometheus.yml, what the compose Prometheus loads."""
    binary = _prometheus_binary()
    promtool = Path(binary).with_name("promtool") if binary else None
    if promtool is None or not promtool.is_file():
        assert not os.environ.get("CI"), "no promtool (infra/grafana/install-prometheus.sh)"
        pytest.skip("no promtool next to the prometheus binary")
    config = ROOT / "infra/grafana/prometheus/prometheus.yml"
    result = subprocess.run([str(promtool), "check", "config", str(config)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
