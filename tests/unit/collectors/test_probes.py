"""Active validation probes, node side (issue 17): real probe endpoints on 127.0.0.1 (one link
shaped slow), a real ProbeRunner, the agent's hook; the clock is faked only for waiting and
rate limits (nothing asserts a duration)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.rings import coll_records, comm_init_record

from failslow import events
from failslow.collectors import ring as R
from failslow.collectors.agent import Agent, TraceDirSink
from failslow.collectors.probes import (
    BusyTracker,
    GemmProbe,
    LinkShape,
    P2PProbe,
    ProbeEndpoint,
    ProbeRunner,
    ProbeService,
    RttProbe,
)
from failslow.collectors.probes.p2p import resolver
from failslow.collectors.probes.runner import BUSY_DETAIL, STOPPING_DETAIL, rows_table
from failslow.diagnosis import Anomaly
from failslow.engine.probes import (
    SLOW_FACTOR,
    ProbeRequest,
    apply_probe_evidence,
    request_id,
)
from failslow.tracedir import TraceDir

#: healthy links carry 200 MB/s, the slow one 20 MB/s and 20 ms more per answer: sleeps in
#: the endpoint dominate, so the comparison does not depend on this machine's load
HEALTHY = LinkShape(rate_bps=200e6)
SLOW = LinkShape(delay_s=0.02, rate_bps=20e6)
NBYTES = 1 << 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps += 1
        self.now += s


@pytest.fixture
def nodes() -> Iterator[dict[str, ProbeEndpoint]]:
    """Endpoints of nodes n1..n3; traffic from n0 to n2 crosses the slow link."""
    eps = {"n1": ProbeEndpoint(default=HEALTHY, lifetime_s=120),
           "n2": ProbeEndpoint(default=HEALTHY, shapes={"n0": SLOW}, lifetime_s=120),
           "n3": ProbeEndpoint(default=HEALTHY, lifetime_s=120)}
    try:
        yield eps
    finally:
        for e in eps.values():
            e.close()


def runner_for(eps: dict[str, ProbeEndpoint], **kw: object) -> ProbeRunner:
    resolve = resolver({n: e.address for n, e in eps.items()})
    kw.setdefault("jobs", {"j"})
    kw.setdefault("node_per_minute", 600.0)
    kw.setdefault("job_per_minute", 600.0)
    return ProbeRunner("n0", {"p2p": P2PProbe("n0", resolve, NBYTES),
                              "rtt": RttProbe("n0", resolve),
                              "gemm": GemmProbe(n=64, repeats=3, device="cpu")},
                       **kw)  # type: ignore[arg-type]


def p2p(aid: str, peer: int, role: str = "suspect", deadline_s: float = 5.0) -> ProbeRequest:
    return ProbeRequest(request_id(aid, "p2p", 0, peer, role), "j", "p2p", 0, "n0", peer,
                        f"n{peer}", deadline_s, role)


def comm_anomaly(aid: str, ranks: list[int]) -> Anomaly:
    return Anomaly(aid, "slow", "communication", ranks, None, comm=7, comm_kind="dp",
                   stage="dp_sync", start_ns=1, detected_ns=2, slowdown=1.3)


def core(a: Anomaly) -> dict[str, object]:
    d = a.to_dict()
    return {k: d[k] for k in ("ranks", "link", "cause", "slowdown", "start_ns", "end_ns")}


def test_p2p_names_the_slow_pair_not_a_healthy_one(nodes: dict[str, ProbeEndpoint]) -> None:
    runner = runner_for(nodes)
    rows = [runner.run(p2p("slow-3", 1)), runner.run(p2p("slow-3", 2)),
            runner.run(p2p("slow-3", 3, "reference"))]
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert all(r["bytes"] == NBYTES and r["elapsed_ns"] > 0 for r in rows)
    assert rows[1]["elapsed_ns"] > SLOW_FACTOR * max(rows[0]["elapsed_ns"], rows[2]["elapsed_ns"])
    rows_table(rows)  # the contract's probe rows
    a = comm_anomaly("slow-3", [0, 1, 2])
    assert apply_probe_evidence(a, rows)
    assert a.link == [0, 2]
    ev = a.extra["probe"]
    assert ev["link_named_by"] == "p2p" and "0-2" in ev["verdict"]
    by_pair = {tuple(p["pair"]): p for p in ev["p2p"]}
    assert by_pair[(0, 1)]["ratio"] < SLOW_FACTOR <= by_pair[(0, 2)]["ratio"]
    cost = a.extra["probe_cost"]
    assert cost["probes"] == 3
    assert cost["probe_s"] == pytest.approx(sum(r["duration_ns"] for r in rows) / 1e9, abs=1e-5)
    assert 0 < cost["training_lost_s"] <= cost["probe_s"]


def test_healthy_pair_gives_no_evidence_of_slowness(nodes: dict[str, ProbeEndpoint]) -> None:
    runner = runner_for(nodes)
    rows = [runner.run(p2p("slow-4", 1)), runner.run(p2p("slow-4", 3, "reference"))]
    # again: the pair now has a baseline of its own (its earlier run)
    rows.append(runner.run(ProbeRequest(request_id("slow-5", "p2p", 0, 1, "suspect"), "j",
                                        "p2p", 0, "n0", 1, "n1", 5.0)))
    assert rows[2]["baseline_ns"] == rows[0]["elapsed_ns"]
    a = comm_anomaly("slow-4", [0, 1])
    before = core(a)
    apply_probe_evidence(a, rows)
    assert core(a) == before and a.link is None
    assert a.extra["probe"]["verdict"] == "no probed pair is slower than its reference"
    assert all(p["ratio"] < SLOW_FACTOR for p in a.extra["probe"]["p2p"])
    b = comm_anomaly("slow-5", [0, 1])
    apply_probe_evidence(b, rows)
    assert b.link is None and b.extra["probe"]["p2p"][0]["ratio"] < SLOW_FACTOR


def test_rtt_is_a_zero_payload_round_trip(nodes: dict[str, ProbeEndpoint]) -> None:
    runner = runner_for(nodes)
    served = nodes["n2"].served
    row = runner.run(ProbeRequest(request_id("hang-0", "rtt", 0, 2, "suspect"), "j", "rtt", 0,
                                  "n0", 2, "n2", 5.0))
    assert row["status"] == "ok" and row["bytes"] == 0
    assert row["elapsed_ns"] >= SLOW.delay_s * 1e9  # the shaped link's delay is in it
    assert nodes["n2"].served - served == 5  # five pings, median kept


def test_timeout_and_endpoint_down_leave_the_anomaly_and_log_one_line(
        nodes: dict[str, ProbeEndpoint], caplog: pytest.LogCaptureFixture) -> None:
    nodes["n2"].shape("n0", LinkShape(delay_s=30.0))
    nodes["n3"].close()  # node 3's endpoint is down
    runner = runner_for(nodes)
    caplog.set_level(logging.WARNING, "failslow.collectors.probes")
    rows = [runner.run(p2p("slow-6", 2, deadline_s=0.3)), runner.run(p2p("slow-6", 3))]
    assert [r["status"] for r in rows] == ["timeout", "failed"]
    assert all(r["elapsed_ns"] is None and r["detail"] for r in rows)
    logged = [r for r in caplog.records if r.name.startswith("failslow.collectors.probes")]
    assert len(logged) == 2 and all("\n" not in r.getMessage() for r in logged)
    assert "timeout" in logged[0].getMessage() and "failed" in logged[1].getMessage()
    a = comm_anomaly("slow-6", [0, 2, 3])
    before = core(a)
    apply_probe_evidence(a, rows)
    assert core(a) == before
    assert a.extra["probe"]["verdict"] == "inconclusive: no probe completed"
    assert len(a.extra["probe"]["not_run"]) == 2


def test_rate_limits_per_node_and_per_job_with_a_fake_clock() -> None:
    clock = FakeClock()
    runner = ProbeRunner("n0", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")},
                         jobs={"*"}, node_per_minute=60.0, job_per_minute=6000.0, burst=2,
                         clock=clock, sleep=clock.sleep)

    def gemm(job: str, i: int) -> dict[str, object]:
        return runner.run(ProbeRequest(f"a{i}/gemm/0/-1/suspect", job, "gemm", 0))

    assert [gemm("j", i)["status"] for i in range(3)] == ["ok", "ok", "skipped"]
    assert gemm("j", 3)["detail"] == "rate limit of node n0"
    clock.now += 1.0  # one token per second
    assert [gemm("k", i)["status"] for i in range(4, 6)] == ["ok", "skipped"]
    job_limited = ProbeRunner("n0", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")},
                              jobs={"*"}, node_per_minute=6000.0, job_per_minute=60.0,
                              burst=1, clock=clock, sleep=clock.sleep)
    rows = []
    for i, job in enumerate(("j", "j", "k")):
        clock.now += 0.05  # the node's bucket (100/s) refills, the job's (1/s) does not
        rows.append(job_limited.run(ProbeRequest(f"b{i}/gemm/0/-1/suspect", job, "gemm", 0)))
    assert [r["status"] for r in rows] == ["ok", "skipped", "ok"]
    assert rows[1]["detail"] == "rate limit of job j"
    assert clock.sleeps == 0


def test_disabled_job_is_skipped() -> None:
    runner = ProbeRunner("n0", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")}, jobs={"j"})
    row = runner.run(ProbeRequest("x/gemm/0/-1/suspect", "other", "gemm", 0))
    assert row["status"] == "skipped" and "disabled" in row["detail"]
    assert ProbeRunner("n0", {}).enabled("j") is False  # default: off


def _coll(rows: list[tuple[int, int, str]]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"job": "j", "rank": r, "comm": 9, "comm_rank": r, "comm_size": 2, "seq": s,
          "op": "allreduce", "bytes": 8, "peer": -1, "phase": ph, "t": 10 + i}
         for i, (r, s, ph) in enumerate(rows)], schema=events.SCHEMAS["coll"])


def test_busy_rank_waits_for_the_collective_then_gives_up() -> None:
    tracker = BusyTracker()
    tracker.observe(_coll([(0, 4, "enter"), (0, 4, "end"), (0, 5, "enter"), (1, 5, "enter"),
                           (1, 5, "end")]))
    assert tracker.busy(0) and not tracker.busy(1)
    clock = FakeClock()
    runner = ProbeRunner("n0", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")},
                         jobs={"j"}, busy=tracker.busy, clock=clock, sleep=clock.sleep,
                         wait_step_s=0.01)
    row = runner.run(ProbeRequest("a/gemm/0/-1/suspect", "j", "gemm", 0, deadline_s=0.1))
    assert row["status"] == "skipped" and row["detail"] == BUSY_DETAIL
    assert row["elapsed_ns"] is None
    assert 9 <= clock.sleeps <= 11  # waited in steps until the deadline
    # the collective ends after three checks: the probe runs
    checks = {"n": 0}

    def busy_then_free(rank: int) -> bool:
        checks["n"] += 1
        if checks["n"] == 3:
            tracker.observe(_coll([(0, 5, "end")]))
        return tracker.busy(rank)

    runner.busy = busy_then_free
    clock.sleeps = 0
    row = runner.run(ProbeRequest("b/gemm/0/-1/suspect", "j", "gemm", 0, deadline_s=0.1))
    assert row["status"] == "ok" and clock.sleeps == 2
    tracker.observe(_coll([(0, 5, "enter")]))  # an old row again changes nothing
    assert not tracker.busy(0)


def test_the_wait_for_an_idle_rank_is_not_the_probes_time() -> None:
    """``duration_ns`` (what the diagnosis charges as training time lost) is the probe's own
    time: not the wait while its rank was inside a collective (the job lost nothing then)."""
    checks = {"n": 0}

    def busy_twice(rank: int) -> bool:
        checks["n"] += 1
        return checks["n"] <= 2

    waited = 0.3
    runner = ProbeRunner("n0", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")},
                         jobs={"j"}, busy=busy_twice, sleep=lambda s: time.sleep(waited / 2),
                         wait_step_s=0.01)
    row = runner.run(ProbeRequest("c/gemm/0/-1/suspect", "j", "gemm", 0, deadline_s=30.0))
    assert row["status"] == "ok" and checks["n"] == 3
    assert row["duration_ns"] < waited / 2 * 1e9  # a 16x16 GEMM, without the 0.3 s wait


class ListSource:
    def __init__(self, requests: list[ProbeRequest]) -> None:
        self.requests = requests
        self.closed = False

    def poll(self) -> list[ProbeRequest]:
        out, self.requests = self.requests, []
        return out

    def close(self) -> None:
        self.closed = True


def test_agent_runs_requests_for_its_node_and_sees_busy_ranks(
        tmp_path: Path, nodes: dict[str, ProbeEndpoint]) -> None:
    rings, out = tmp_path / "rings", tmp_path / "out"
    rings.mkdir()
    w = R.RingWriter(rings / "failslow-j-100-torch.ring", 1024, job="j", rank=0)
    w.write(comm_init_record(0, 2**63 + 5, "dp"))
    w.write(coll_records(0, 2**63 + 5, 4)[:-1])  # the last collective entered, not ended
    source = ListSource([p2p("slow-9", 1), p2p("slow-9", 2),
                         ProbeRequest("slow-9/gemm/7/-1/suspect", "j", "gemm", 7, "n7")])
    agent = Agent(TraceDirSink(out), rings, node="n0", collectors={"gpu": False, "rdma": False})
    service = ProbeService("n0", source, runner_for(nodes))
    agent.probes = service
    agent.poll()
    assert service.tracker.busy(0) and service.stats["foreign"] == 1
    w.write(coll_records(0, 2**63 + 5, 4)[-1:])  # it ends: the probes may run
    deadline = time.monotonic() + 30
    while not service.idle() and time.monotonic() < deadline:
        agent.poll()
        time.sleep(0.02)
    assert not service.tracker.busy(0)
    w.close()
    agent.close()
    assert source.closed
    probe = TraceDir(out).read("probe").to_pylist()
    assert sorted((r["peer"], r["status"]) for r in probe) == [(1, "ok"), (2, "ok")]
    assert {r["node"] for r in probe} == {"n0"}


def test_a_stopping_agent_answers_every_request_it_took(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing the service while a probe waits for its rank: the requests still queued get
    a ``skipped`` row at once (the agent does not wait for them to run), the running one
    finishes, and every request has exactly one row and one count."""
    gate, started = threading.Event(), threading.Event()

    def busy(rank: int) -> bool:  # the first request waits here until the close began
        started.set()
        gate.wait(60)
        return False

    runner = ProbeRunner("n0", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")},
                         jobs={"j"}, busy=busy)
    service = ProbeService("n0", None, runner)
    requests = [ProbeRequest(f"a{i}/gemm/{i}/-1/suspect", "j", "gemm", i) for i in range(4)]
    for r in requests:
        assert service.submit(r)
    assert started.wait(60) and not service.idle()
    cancel = runner.cancel

    def cancel_then_release(request: ProbeRequest, detail: str) -> dict[str, object]:
        row = cancel(request, detail)
        gate.set()
        return row

    monkeypatch.setattr(runner, "cancel", cancel_then_release)
    service.close(timeout=60)
    rows = [x for _, batch in service.take_rows() for x in batch["probe"].to_pylist()]
    assert sorted(x["request"] for x in rows) == sorted(r.id for r in requests)
    stopped = [x for x in rows if x["detail"] == STOPPING_DETAIL]
    assert [x["rank"] for x in stopped] == [1, 2, 3]
    assert all(x["status"] == "skipped" for x in stopped)
    assert runner.counts == {"ok": 1, "timeout": 0, "failed": 0, "skipped": 3}
    assert service.idle()


def test_request_json_round_trip_and_bad_input() -> None:
    r = p2p("slow-1", 2)
    assert ProbeRequest.from_json(r.to_json()) == r
    for bad in (b"{", b"[]", b'{"id": "x", "job": "j", "probe": "nope", "rank": 0}',
                b'{"id": "x", "job": "j", "probe": "p2p", "rank": 0}'):
        with pytest.raises(ValueError):
            ProbeRequest.from_json(bad)


def test_an_old_request_is_not_run() -> None:
    now = 1_000 * 10**9
    runner = ProbeRunner("n0", {"gemm": GemmProbe(n=16, repeats=1, device="cpu")},
                         jobs={"j"}, max_age_s=60.0, wall_ns=lambda: now)
    old = runner.run(ProbeRequest("a/gemm/0/-1/suspect", "j", "gemm", 0, t=now - 61 * 10**9))
    fresh = runner.run(ProbeRequest("b/gemm/0/-1/suspect", "j", "gemm", 0, t=now - 10**9))
    assert (old["status"], old["detail"]) == ("skipped", "request expired (61 s old)")
    assert fresh["status"] == "ok"


def test_a_link_slow_before_its_first_probe_is_still_named(
        nodes: dict[str, ProbeEndpoint]) -> None:
    """The pair's own baseline is slow too (an earlier probe of the slow link): its healthy
    peers are the reference."""
    runner = runner_for(nodes)
    runner.run(p2p("slow-1", 2))  # an earlier anomaly's probe: the history is slow
    rows = [runner.run(p2p("slow-2", 1)), runner.run(p2p("slow-2", 2))]
    assert rows[1]["baseline_ns"] is not None
    assert rows[1]["elapsed_ns"] < SLOW_FACTOR * rows[1]["baseline_ns"]
    a = comm_anomaly("slow-2", [0, 1, 2])
    apply_probe_evidence(a, rows)
    assert a.link == [0, 2]


def test_agent_cli_bad_probe_address_is_one_line(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "failslow", "agent", "--probes", "*",
                          "--probe-bind", "nowhere", "--once", "--out", str(tmp_path / "o"),
                          "--ring-dir", str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "failslow agent: probe endpoint address 'nowhere': expected HOST:PORT"]
