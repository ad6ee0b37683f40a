"""``failslow simulate --live`` on the real broker: about 30 s of a live 64-rank job with a
short fault period -> Kafka -> ``failslow process`` (a subprocess, embedded ClickHouse).

Checked: while the live run goes on, the processor reports the injected compute fault (its
rank) on the anomalies topic, and ``failslow notify`` with the compose demo's routes pages
the demo's webhook receiver (infra/demo/receiver.py, here on 127.0.0.1); afterwards the
store holds the job's events and iterations, all stamped with the wall-clock time of the run
(not the simulator's fixed 2025 date), and ``failslow query anomalies`` names the fault.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from conftest import REPO, Broker
from failslow.diagnosis import Anomaly
from failslow.stream import clickhouse as ch
from failslow.stream import transport as tr
from failslow.stream.kafka import KafkaTransport

JOB = "live-test"


def _env(broker: Broker) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"FAILSLOW_KAFKA": broker.bootstrap, "PYTHONUNBUFFERED": "1"})
    return env


def _stop(p: subprocess.Popen[str], timeout: float) -> int:
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise AssertionError(f"{p.args!r} did not stop within {timeout:.0f} s") from None


def _receiver(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, int]:
    log = tmp_path / "receiver.log"
    p = subprocess.Popen([sys.executable, str(REPO / "infra/demo/receiver.py"), "0",
                          "127.0.0.1"], stdout=log.open("w"), stderr=subprocess.STDOUT,
                         text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return p, log, int(m.group(1))
        time.sleep(0.1)
    p.kill()
    raise AssertionError(log.read_text())


def _demo_routes(tmp_path: Path, port: int) -> Path:
    """infra/demo/routes.yaml, with the receiver on this machine instead of compose's."""
    text = (REPO / "infra/demo/routes.yaml").read_text()
    assert "http://webhook-receiver:8080/page" in text
    path = tmp_path / "routes.yaml"
    path.write_text(text.replace("http://webhook-receiver:8080/page",
                                 f"http://127.0.0.1:{port}/page"))
    return path


def test_live_mode_streams_current_times_and_its_fault_is_reported(
        broker: Broker, tmp_path: Path) -> None:
    prefix = f"live{uuid.uuid4().hex[:8]}."
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    env = _env(broker)
    receiver, receiver_log, port = _receiver(tmp_path)
    notifier = subprocess.Popen(
        [sys.executable, "-m", "failslow", "notify", "--config",
         str(_demo_routes(tmp_path, port)), "--topic-prefix", prefix, "--group",
         f"n-{prefix}", "--state", str(tmp_path / "notify-state.json")],
        env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "notify.log").open("w"),
        text=True)
    started_ns = time.time_ns()
    proc_log = tmp_path / "process.log"
    processor = subprocess.Popen(
        [sys.executable, "-m", "failslow", "-v", "process", "--data-dir", str(data_dir),
         "--topic-prefix", prefix, "--group", f"g-{prefix}", "--metrics-port", "-1",
         "--exit-when-idle", "8"],
        env=env, stdout=subprocess.DEVNULL, stderr=proc_log.open("w"), text=True)
    live_out = tmp_path / "live.out"
    live = subprocess.Popen(
        [sys.executable, "-m", "failslow", "simulate", "--live", "--job", JOB,
         "--topic-prefix", prefix, "--duration", "30", "--first-fault", "3",
         "--fault-every", "60", "--fault-for", "25", "--causes", "compute", "--seed", "1"],
        env=env, stdout=live_out.open("w"), stderr=subprocess.STDOUT, text=True)
    reported: list[tuple[str, int, Anomaly]] = []
    live_ran_on = paged_while_live = False
    try:
        with KafkaTransport(broker.bootstrap, topic_prefix=prefix, produce=False,
                            subscribe=[tr.ANOMALIES_TOPIC],
                            group_id=f"an-{prefix}") as sub:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not reported:
                for m in sub.poll(50, timeout=1.0):
                    job, version, anomaly = tr.decode_anomaly(m)
                    reported.append((job, version, anomaly))
                if reported:
                    live_ran_on = live.poll() is None
        while live.poll() is None and not paged_while_live:
            paged_while_live = " page trigger " in receiver_log.read_text()
            time.sleep(0.5)
        assert _stop(live, 120) == 0, live_out.read_text()[-3000:]
    finally:
        for p in (live, notifier, receiver):
            if p.poll() is None:
                p.terminate()
        for p in (live, notifier, receiver):
            _stop(p, 30)
    ended_ns = time.time_ns()
    code = _stop(processor, 120)
    assert code == 0, proc_log.read_text()[-3000:]
    out = live_out.read_text()
    m = re.search(r"fault 0 injected in live-test: compute slow-down of rank (\d+)", out)
    assert m, out
    rank = int(m.group(1))
    # reported while the live run was still going
    assert reported, proc_log.read_text()[-3000:]
    assert live_ran_on
    job, _, anomaly = reported[0]
    assert job == JOB and anomaly.cause == "compute" and anomaly.ranks == [rank]
    # the demo's notifier routes paged the receiver, whose log shows the page
    assert paged_while_live, (tmp_path / "notify.log").read_text()[-3000:]
    pages = [line for line in receiver_log.read_text().splitlines() if " page " in line]
    assert any(f"{JOB}: slow/compute at rank {rank}" in line for line in pages), pages

    sink = ch.ClickHouseSink(ch.connect(data_dir))
    try:
        for table, column in (("coll", "t"), ("iterations", "t_end")):
            n, lo, hi = sink.client.query(
                f"SELECT count(), min({column}), max({column}) FROM failslow.{table} "
                "WHERE job = {j:String}", parameters={"j": JOB}).result_rows[0]
            assert n > 0, table
            assert started_ns <= lo <= hi <= ended_ns, (table, started_ns, lo, hi, ended_ns)
        n_iter = sink.count("iterations", JOB, final=True)
        assert n_iter > 20  # ~0.4 s iterations over ~30 s, per rank and for the job
    finally:
        sink.close()
    q = subprocess.run([sys.executable, "-m", "failslow", "query", "anomalies", "--job", JOB,
                        "--json", "--data-dir", str(data_dir)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert q.returncode == 0, q.stderr
    stored = json.loads(q.stdout)["anomalies"]
    assert any(a["cause"] == "compute" and a["ranks"] == [rank] for a in stored), stored
