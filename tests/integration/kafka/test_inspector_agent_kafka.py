"""``failslow agent --inspector-dir`` against a real broker: Inspector files written
progressively, the agent killed with SIGKILL mid-file and restarted; every record arrives."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from support.inspector_live import inspector_lines

from failslow.collectors.inspector_follow import InspectorFollower
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import decode

Key = tuple[int, int, int, str]


def _agent(broker: Any, pfx: str, live: Path, state: Path, rings: Path,
           *extra: str) -> subprocess.Popen[bytes]:
    args = ["agent", "--kafka", broker.bootstrap, "--topic-prefix", pfx, "--inspector-dir",
            str(live), "--inspector-state", str(state), "--job", "live", "--ring-dir",
            str(rings), "--disable", "gpu", "--disable", "rdma", "--interval", "0.05", *extra]
    code = "import sys; from failslow.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _saved(state: Path) -> int:
    try:
        return sum(f["offset"] for f in json.loads(state.read_text())["files"])
    except (OSError, ValueError):
        return 0


def _wait(cond: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_kill_9_mid_file_loses_no_record(broker: Any, tmp_path: Path) -> None:
    lines = inspector_lines(iterations=6)
    full = tmp_path / "full"
    full.mkdir()
    for name, ls in lines.items():
        (full / name).write_text("".join(ls))
    batch = InspectorFollower(full, "live", tmp_path / "full.state").poll()
    d = batch["coll"].select(["rank", "comm", "seq", "phase"]).to_pydict()
    expected: set[Key] = set(zip(d["rank"], d["comm"], d["seq"], d["phase"], strict=True))

    live, state, rings = tmp_path / "live", tmp_path / "state.json", tmp_path / "rings"
    live.mkdir()
    rings.mkdir()
    handles = {name: (live / name).open("w") for name in lines}
    pos = dict.fromkeys(lines, 0)

    def feed(upto: float, partial: bool = True) -> None:
        for name, ls in lines.items():
            stop = int(len(ls) * upto)
            fh = handles[name]
            fh.write("".join(ls[pos[name]:stop]))
            if partial and stop < len(ls):  # half of the next line, finished later
                fh.write(ls[stop][:len(ls[stop]) // 2])
                ls[stop] = ls[stop][len(ls[stop]) // 2:]
            fh.flush()
            pos[name] = stop

    pfx = f"t{uuid.uuid4().hex[:10]}."
    feed(0.3)
    first = _agent(broker, pfx, live, state, rings)
    kills = 0
    try:
        _wait(lambda: _saved(state) > 0, "a first acknowledged commit")
        saved = _saved(state)
        feed(0.6)
        _wait(lambda: _saved(state) > saved, "a commit after more lines")
        feed(0.8)  # the agent is killed while reading these
        first.kill()
        kills += 1
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    assert kills == 1 and first.returncode == -9
    after_kill = _saved(state)
    total = sum(p.stat().st_size for p in full.iterdir())
    assert 0 < after_kill < total  # killed mid-file

    feed(1.0, partial=False)
    for fh in handles.values():
        fh.close()
    second = _agent(broker, pfx, live, state, rings, "--until-idle", "2", "--json")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err.decode()[-2000:]
    assert _saved(state) == total
    assert json.loads(out.decode().strip().splitlines()[-1])["stats"]["sink_errors"] == 0

    consumer = KafkaTransport(broker.bootstrap, topic_prefix=pfx,
                              group_id=f"g-{uuid.uuid4().hex[:8]}",
                              subscribe=["failslow.meta", "failslow.coll"])
    got: set[Key] = set()
    rows = 0
    metas = 0
    deadline = time.monotonic() + 60
    try:
        while not expected <= got and time.monotonic() < deadline:
            for m in consumer.poll(500, timeout=1.0):
                kind, table = decode(m)
                assert m.key == "live"
                if kind == "meta":
                    metas += 1
                    continue
                t = table.select(["rank", "comm", "seq", "phase"]).to_pydict()
                got |= set(zip(t["rank"], t["comm"], t["seq"], t["phase"], strict=True))
                rows += table.num_rows
    finally:
        consumer.close()
    assert got == expected  # every record, nothing foreign
    assert rows >= len(expected) and metas >= 1  # duplicates allowed (at least once)
