"""``failslow notify --once`` on the real broker: reports already in the anomalies topic are
delivered to a real local webhook receiver, then the command exits (issue 18, Deliver 2);
with no webhook configured the notifier stays up idle with one warning (issue 15, 6)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import Broker
from failslow.diagnosis import Anomaly
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import ANOMALIES_TOPIC, encode_anomaly

T0 = 1_750_000_000_000_000_000


class Inbox:
    """A webhook receiver on 127.0.0.1 that keeps the JSON bodies it got."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                size = int(self.headers.get("Content-Length", 0))
                inbox.bodies.append(json.loads(self.rfile.read(size)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    try:
        yield box
    finally:
        box.server.shutdown()
        box.server.server_close()


def routes(tmp_path: Path) -> Path:
    path = tmp_path / "routes.yaml"
    path.write_text("state_file: notify-state.json\n"
                    "severity: {warning: 0.0, error: 1.0, critical: 10.0}\n"
                    "receivers:\n  - {name: hook, type: generic, url_env: HOOK_URL}\n"
                    "routes:\n  - {match: {job: '*', min_severity: info}, receivers: [hook]}\n")
    return path


def publish_reports(bootstrap: str, prefix: str, count: int,
                    security: dict[str, object] | None = None) -> None:
    t = KafkaTransport(bootstrap, subscribe=(), topic_prefix=prefix, partitions=2,
                       security=security, on_full="block", max_block_ms=30_000)
    try:
        assert t.wait_connected(30)
        for i in range(count):
            a = Anomaly(id=f"slow-{i}", kind="slow", cause="compute", ranks=[i],
                        start_ns=T0, detected_ns=T0 + 10**9, slowdown=2.0)
            value, headers = encode_anomaly(f"job-{i}", a, 1)
            t.produce(ANOMALIES_TOPIC, f"job-{i}", value, headers)
        assert t.flush(30)
        stats = t.stats()  # all acknowledged (none dropped while a connection was made)
        assert (stats["sent"], stats["dropped"], stats["errors"]) == (count, 0, 0), stats
    finally:
        t.close()


def run_once(bootstrap: str, prefix: str, config: Path, env: dict[str, str],
             tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # the first join of a new consumer group took over 30 s (the default --once-timeout)
    # once on 2 loaded cores in CI: the reads are bounded by a longer timeout here
    return subprocess.run(
        [sys.executable, "-m", "failslow", "notify", "--config", str(config), "--once",
         "--once-timeout", "120", "--kafka", bootstrap, "--topic-prefix", prefix,
         "--group", "n-" + prefix, "--state", str(tmp_path / "state.json")],
        env=env, capture_output=True, text=True, timeout=240)


def test_once_delivers_the_reports_already_in_the_topic(broker: Broker, tmp_path: Path,
                                                        inbox: Inbox) -> None:
    prefix = f"once-{uuid.uuid4().hex[:6]}."
    publish_reports(broker.bootstrap, prefix, 3)
    env = {**os.environ, "HOOK_URL": inbox.url, "FAILSLOW_DATA_DIR": str(tmp_path)}
    out = run_once(broker.bootstrap, prefix, routes(tmp_path), env, tmp_path)
    assert out.returncode == 0, out.stderr
    stats = dict(w.split("=", 1) for w in out.stdout.split())
    assert int(stats["delivered"]) == 3, out.stdout
    assert len(inbox.bodies) == 3
    assert "Traceback" not in out.stderr
    # run again: everything was committed, nothing is delivered twice
    again = run_once(broker.bootstrap, prefix, routes(tmp_path), env, tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(inbox.bodies) == 3


def test_once_that_cannot_read_to_the_end_in_time_says_so(broker: Broker, tmp_path: Path,
                                                          inbox: Inbox) -> None:
    """Another member of the group holds every partition (one per topic; the range assignor
    gives it to the member whose id sorts first), so the notifier never gets to read them:
    after --once-timeout it says so and exits 1."""
    from failslow.stream.sink import ADVICE_TOPIC
    from failslow.stream.transport import topic_for

    prefix, group = f"once-{uuid.uuid4().hex[:6]}.", "n-once-held"
    holder = KafkaTransport(broker.bootstrap, group_id=group, topic_prefix=prefix,
                            partitions=1, client_id="a-holder",
                            subscribe=(topic_for("meta"), ANOMALIES_TOPIC, ADVICE_TOPIC))
    stop = threading.Event()

    def hold() -> None:
        while not stop.is_set():
            holder.poll(10, timeout=0.2)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while holder.lag() is None or not holder.drained():
            assert time.monotonic() < deadline, "the holder did not get its partitions"
            time.sleep(0.2)
        publish_reports(broker.bootstrap, prefix, 1)
        env = {**os.environ, "HOOK_URL": inbox.url, "FAILSLOW_DATA_DIR": str(tmp_path)}
        out = subprocess.run(
            [sys.executable, "-m", "failslow", "notify", "--config", str(routes(tmp_path)),
             "--once", "--once-timeout", "5", "--kafka", broker.bootstrap, "--topic-prefix",
             prefix, "--group", group], env=env, capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        thread.join(30)
        holder.close()
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.startswith("failslow notify")]
    assert len(lines) == 1 and "not read to their end within 5 s" in lines[0], out.stderr
    # it says what was missing: the holder kept every partition of the group
    assert f"no partitions of {prefix}" in lines[0], lines[0]
    assert "Traceback" not in out.stderr and inbox.bodies == []


def test_without_a_webhook_the_notifier_stays_up_idle(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HOOK_URL"}
    env["FAILSLOW_DATA_DIR"] = str(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "failslow", "notify", "--config",
                          str(routes(tmp_path)), "--kafka", "127.0.0.1:1"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(5)
        assert p.poll() is None, p.communicate()  # still up: no exit 2, no restart loop
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "HOOK_URL" in lines[0] and "idle" in lines[0], err
