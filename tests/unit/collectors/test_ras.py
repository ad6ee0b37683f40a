"""NCCL RAS client against a fake RAS server on 127.0.0.1 that speaks the text protocol and
serves JSON reports in the shape NCCL 2.28.7+ writes (docs: troubleshooting/ras)."""

from __future__ import annotations

import json
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from failslow import events
from failslow.collectors.agent import Agent, TraceDirSink, TransportSink
from failslow.collectors.ras import (
    RasCollector,
    RasWatch,
    comm_u64,
    finding_rows,
    parse_address,
    parse_status,
    query,
)

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


def _rank(r: int, host: str, pid: int, counts: dict[str, int]) -> dict[str, Any]:
    return {"rank": r, "host": host, "pid": pid, "cuda_dev": r % 4, "nvml_dev": r % 4,
            "status": {"init_state": 0, "async_error": 0, "finalize_called": False,
                       "destroy_flag": False, "abort_flag": False},
            "collective_counts": {f: counts.get(f, 0) for f in FUNCS}}


def _missing(r: int, host: str, pid: int, dead: bool = False) -> dict[str, Any]:
    return {"rank": r, "host": host, "pid": pid, "cuda_dev": r % 4, "nvml_dev": r % 4,
            "status": {"unresponsive": True, "considered_dead": dead}}


PROCS = [(f"10.0.0.{1 + r // 4}", 5000 + r) for r in range(8)]


def report(world: dict[int, dict[str, int]], missing: dict[int, bool] | None = None,
           pair: dict[int, dict[str, int]] | None = None) -> str:
    """A world communicator of 8 ranks (counts per rank; ``missing``: rank -> dead) and a
    2-rank communicator of ranks 4 and 5 (its own ranks 0 and 1)."""
    missing = missing or {}
    comms = [{"hash": "0xae94423cfbb2ef4a", "secondary_hash": "0x1:0x2", "size": 8,
              "ranks_count": 8 - len(missing), "missing_ranks_count": len(missing),
              "ranks": [_rank(r, *PROCS[r], world[r]) for r in range(8) if r not in missing],
              "missing_ranks": [_missing(r, *PROCS[r], d) for r, d in missing.items()]}]
    if pair is not None:
        comms.append({"hash": "0x77", "secondary_hash": "0x3:0x4", "size": 2, "ranks_count": 2,
                      "missing_ranks_count": 0,
                      "ranks": [_rank(i, *PROCS[4 + i], pair[i]) for i in range(2)],
                      "missing_ranks": []})
    return json.dumps({"nccl_version": "2.29.1", "cuda_runtime_version": 13000,
                       "cuda_driver_version": 13000, "timestamp": "2026-01-01 00:00:00",
                       "communicators_count": len(comms), "communicators": comms,
                       "ras": {"collection_time_sec": 0.001, "timeouts_count": 0}}, indent=2)


class FakeRas(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, reports: list[str]) -> None:
        self.reports = reports
        self.served = 0
        self.commands: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(socketserver.StreamRequestHandler):
    server: FakeRas

    def handle(self) -> None:
        fmt = "text"
        for raw in self.rfile:
            cmd = raw.decode().strip()
            self.server.commands.append(cmd)
            low = cmd.lower()
            if low.startswith("client protocol "):
                self.wfile.write(b"SERVER PROTOCOL 2\n")
            elif low.startswith("timeout "):
                self.wfile.write(b"OK\n")
            elif low.startswith("set format "):
                fmt = low.split()[-1]
                self.wfile.write(b"OK\n" if fmt in ("text", "json") else b"ERROR: format\n")
            elif low in ("status", "verbose status"):
                if fmt != "json":
                    self.wfile.write(b"Job summary\n===========\n")
                else:
                    i = min(self.server.served, len(self.server.reports) - 1)
                    self.server.served += 1
                    self.wfile.write(self.server.reports[i].encode())
                return  # the server closes the connection after a report
            else:
                self.wfile.write(f"ERROR: Unknown command {cmd}\n".encode())


@pytest.fixture
def fake() -> Iterator[FakeRas]:
    srv = FakeRas([])
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _even(n: int) -> dict[int, dict[str, int]]:
    return {r: {"AllReduce": n} for r in range(8)}


def test_protocol_and_parse(fake: FakeRas) -> None:
    fake.reports = [report(_even(10), missing={6: False})]
    comms = parse_status(query(fake.server_address[:2]))  # type: ignore[index]
    assert fake.commands[:3] == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json"]
    assert fake.commands[3] == "STATUS"
    (world,) = comms
    assert world.size == 8 and sorted(world.ranks) == [0, 1, 2, 3, 4, 5, 7]
    assert world.ranks[3].counts["AllReduce"] == 10 and world.missing[6].unresponsive
    assert parse_address("") == ("127.0.0.1", 28028)
    assert parse_address("h:1") == ("h", 1) and parse_address(":9") == ("127.0.0.1", 9)


def _kinds(found: list[dict[str, Any]]) -> list[tuple[str, str, list[int]]]:
    return sorted((f["kind"], f["hang_cause"], f["ranks"]) for f in found)


def test_watch_turns_reports_into_hang_evidence() -> None:
    w = RasWatch(stall_reports=3)
    assert w.update(parse_status(report(_even(10)))) == []
    racing = _even(12) | {3: {"AllReduce": 11}}
    assert w.update(parse_status(report(racing))) == []  # moving: RAS races the collectives
    stuck = _even(13) | {3: {"AllReduce": 12}}
    assert w.update(parse_status(report(stuck))) == []  # first sight of this mismatch
    found = w.update(parse_status(report(stuck)))  # unchanged: rank 3 did not enter
    assert _kinds(found) == [("behind", "not_entered", [3])]
    assert found[0]["behind_by"] == {"3": 1}
    # a process stops answering, later declared dead: rank 6
    assert _kinds(w.update(parse_status(report(_even(14), missing={6: False})))) == [
        ("missing", "not_entered", [6])]
    assert _kinds(w.update(parse_status(report(_even(14), missing={6: True})))) == [
        ("dead", "not_entered", [6])]


def test_inconsistent_and_stalled_and_global_ranks() -> None:
    w = RasWatch(stall_reports=3)
    # the 2-rank communicator's rank 1 is global rank 5: it called AllGather where rank 4
    # called AllReduce, at the same count
    mixed = {0: {"AllReduce": 4}, 1: {"AllReduce": 3, "AllGather": 1}}
    rep = report(_even(20), pair=mixed)
    w.update(parse_status(rep))
    found = [f for f in w.update(parse_status(rep)) if f["comm_hash"] == "0x77"]
    assert [(f["kind"], f["hang_cause"]) for f in found] == [("inconsistent", "inconsistent")]
    assert found[0]["ranks"] in ([4], [5])
    # the world communicator: all equal and unchanged for three reports -> H3 candidate
    stalled = [f for f in w.update(parse_status(rep)) if f["comm_hash"] == "0xae94423cfbb2ef4a"]
    assert [(f["kind"], f["hang_cause"], f["reports"]) for f in stalled] == [
        ("stalled", "hardware", 3)]


def test_agent_queries_ras_in_the_background(fake: FakeRas, tmp_path: Path) -> None:
    stuck = _even(13) | {2: {"AllReduce": 12}}
    fake.reports = [report(stuck)]
    host, port = fake.server_address[:2]  # type: ignore[misc]
    ras = RasCollector(f"{host}:{port}", interval_s=0.05)
    agent = Agent(TraceDirSink(tmp_path / "out"), tmp_path / "rings", node="n",
                  collectors={"gpu": False, "rdma": False}, ras=ras)
    agent.poll()
    deadline_polls = 0
    while ras.snapshot()["queries"] < 2 and deadline_polls < 2000:
        ras._stop.wait(0.01)
        deadline_polls += 1
    agent.close()
    snap = ras.snapshot()
    assert snap["queries"] >= 2 and snap["failures"] == 0
    assert _kinds(snap["findings"]) == [("behind", "not_entered", [2])]
    # the findings are published as ras rows (one per report that found them), the job's
    # meta carries the hosts RAS reported
    out = tmp_path / "out"
    rows = events.conform(pq.read_table(out / "ras.parquet"), "ras").to_pylist()
    assert len(rows) == snap["queries"] - 1 and len({r["t"] for r in rows}) == len(rows)
    assert {(r["job"], r["node"], r["comm"], r["comm_size"], r["rank"], r["finding"],
             r["function"], r["count"], r["expected"]) for r in rows} == {
        ("default", "n", 0xae94423cfbb2ef4a, 8, 2, "behind", "AllReduce", 12, 13)}
    meta = events.parse_meta_row(json.loads((out / "meta.json").read_text()))
    assert meta.world_size == 8 and meta.nodes[5] == "10.0.0.2"


def test_finding_rows_one_per_comm_rank_and_finding() -> None:
    w = RasWatch(stall_reports=2)
    rep = report(_even(9), missing={6: True})
    w.update(parse_status(rep), t_ns=1)
    rows = finding_rows(w.update(parse_status(rep), t_ns=2), "j", "h")
    table = events.from_rows("ras", rows)     # conforms to the contract
    assert table.num_rows == len(rows)
    # a dead rank is published as missing (no count); the rest of the world stalled with
    # rank 6 gone is not a stall (a member is missing)
    assert [(r["rank"], r["finding"], r["count"]) for r in rows] == [(6, "missing", None)]
    w = RasWatch(stall_reports=2)
    pair = {0: {"AllReduce": 3}, 1: {"AllReduce": 3}}
    w.update(parse_status(report(_even(9), pair=pair)), t_ns=3)
    got = finding_rows(w.update(parse_status(report(_even(9), pair=pair)), t_ns=4), "j", "h")
    stalled = sorted((r["comm"], r["rank"], r["count"], r["expected"]) for r in got
                     if r["finding"] == "stalled")
    # every member of both communicators, once each, with its launched total
    assert stalled == sorted([(0xae94423cfbb2ef4a, r, 9, 9) for r in range(8)]
                             + [(0x77, 4, 3, 3), (0x77, 5, 3, 3)])
    assert len(got) == len(stalled) and all(r["t"] == 4 for r in got)
    assert comm_u64("0x77") == 0x77 and comm_u64("not hex") == comm_u64("not hex") > 0


def test_unreachable_or_old_ras_is_a_counted_failure(fake: FakeRas) -> None:
    fake.reports = ["not json"]
    host, port = fake.server_address[:2]  # type: ignore[misc]
    ras = RasCollector(f"{host}:{port}")
    assert ras.query_once() == [] and ras.stats["failures"] == 1
    assert "not JSON" in ras.stats["last_error"]


def test_agent_publishes_ras_rows_to_kafka(broker: Any, fake: FakeRas, tmp_path: Path) -> None:
    """The agent publishes the findings to the real broker's ras topic; they decode as
    contract rows of the job."""
    from failslow.stream.kafka import KafkaTransport
    from failslow.stream.transport import decode

    stuck = _even(13) | {2: {"AllReduce": 12}}
    fake.reports = [report(_even(10)), report(stuck)]
    host, port = fake.server_address[:2]  # type: ignore[misc]
    pfx = f"t{uuid.uuid4().hex[:10]}."
    producer = KafkaTransport(broker.bootstrap, topic_prefix=pfx, subscribe=())
    ras = RasCollector(f"{host}:{port}", interval_s=3600)
    agent = Agent(TransportSink(producer), tmp_path / "rings", job="jras", node="n9",
                  collectors={"gpu": False, "rdma": False}, ras=ras)
    for _ in range(3):          # three reports: the second and third find rank 2 behind
        ras.query_once()
        agent.poll()
    agent.close()
    consumer = KafkaTransport(broker.bootstrap, topic_prefix=pfx,
                              group_id=f"g-{uuid.uuid4().hex[:8]}",
                              subscribe=["failslow.meta", "failslow.ras"])
    got: list[pa.Table] = []
    metas = 0
    deadline = time.monotonic() + 30
    try:
        while sum(t.num_rows for t in got) < 2 and time.monotonic() < deadline:
            for m in consumer.poll(100, timeout=1.0):
                kind, table = decode(m)
                assert m.key == "jras"
                if kind == "ras":
                    got.append(table)
                else:
                    metas += 1
    finally:
        consumer.close()
    rows = pa.concat_tables(got).to_pylist()
    assert metas >= 1
    assert [(r["job"], r["node"], r["rank"], r["finding"], r["count"], r["expected"])
            for r in rows] == [("jras", "n9", 2, "behind", 12, 13)] * 2
    assert len({r["t"] for r in rows}) == 2
