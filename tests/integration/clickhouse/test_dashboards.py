"""Every dashboard query, as committed under infra/grafana, expanded the way the ClickHouse
plugin expands it and run on real ClickHouse (chDB) holding what ``failslow demo`` leaves
behind: a 16-rank job with a compute straggler (rank 5, throttled GPU) and a slow link
(nodes 1-3, ranks 4-12), plus a hung 8-rank job streamed into the same database. Each query
must return its declared columns, and the injected faults must show where the panel says.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import probe_rows

from conftest import REPO, SMALL
from failslow import cli
from failslow.cli.demo import DEMO_DATABASE
from failslow.dashboards import macros, panels
from failslow.dashboards.macros import ALL, QueryContext, Variable
from failslow.diagnosis import Anomaly

ROOT = REPO
GRAFANA = ROOT / "infra" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

HANG = """job: sim-hang
parallel: {tp: 2, pp: 2, dp: 2, cp: 1}
microbatches: 4
iterations: 16
gpus_per_node: 4
nics_per_node: 4
sampling: {hang_tail_s: 30}
faults:
  - {cause: hardware, ranks: [4], start: 8, comm: dp, op: reducescatter}
"""


@dataclass
class Loaded:
    client: Any
    anomalies: dict[str, list[Anomaly]]
    t0: int
    t1: int
    world: dict[str, int]
    truth: list[Anomaly]  # what was injected into sim-small
    probes: list[dict[str, Any]]  # probe rows of sim-small's anomalies
    probed: list[Anomaly]  # those anomalies with the probes' evidence

    def run(self, sql: str) -> tuple[tuple[str, ...], list[dict[str, Any]]]:
        result = self.client.query(sql)
        cols = tuple(result.column_names)
        if not cols:  # an empty result carries no names: ask ClickHouse for them
            cols = tuple(r[0] for r in self.client.query(f"DESCRIBE ({sql})").result_rows)
        return cols, [dict(zip(cols, row, strict=True)) for row in result.result_rows]


def _stream(client: Any, scenario: Path) -> None:
    """Simulate ``scenario`` and stream it through the processor into the demo database."""
    from failslow.replay import DEFAULT_WINDOW_NS, replay
    from failslow.simulator import load_scenario, simulate
    from failslow.stream.clickhouse import ClickHouseSink
    from failslow.stream.processor import ProcessorConfig, StreamProcessor
    from failslow.stream.transport import InProcessTransport

    sim = simulate(load_scenario(scenario), 0)
    sink = ClickHouseSink(client, DEMO_DATABASE, create=True)
    transport = InProcessTransport(keep_committed=False)
    processor = StreamProcessor(transport, sink, ProcessorConfig(
        clock="event", checkpoint_messages=1 << 30, checkpoint_interval_s=math.inf))
    transport.publish_meta(sim.meta)
    for i, (_, batch) in enumerate(replay(sim.tables, DEFAULT_WINDOW_NS)):
        transport.publish_batch(sim.meta.job, batch)
        if i % 20 == 19:
            processor.run(until_idle=True)
    processor.run(until_idle=True)


def _whatif(client: Any, scenario: Path) -> int:
    """What the processor's what-if hook stores (``failslow process --whatif``): the what-if
    analyzer run over the replayed ``scenario``, each result a row of the ``whatif`` table
    (the demo runs without it)."""
    import time

    from failslow.replay import DEFAULT_WINDOW_NS, replay
    from failslow.simulator import load_scenario, simulate
    from failslow.stream.sink import whatif_table
    from failslow.whatif.analysis import WhatIfAnalyzer

    sim = simulate(load_scenario(scenario), 0)
    analyzer = WhatIfAnalyzer(sim.meta)
    rows = []
    for now, batch in replay(sim.tables, DEFAULT_WINDOW_NS):
        result = analyzer.update(batch)
        if result is not None:
            rows.append((sim.meta.job, max(result["steps"]), now, result, time.time_ns()))
    client.insert_arrow(f"`{DEMO_DATABASE}`.`whatif`", whatif_table(rows))
    return len(rows)


VERSIONS_JOB = "sim-versions"
#: 2030-01-01: far from the simulated jobs, so no other panel sees it
VERSIONS_T = 1_893_456_000_000_000_000


def _two_versions(client: Any) -> None:
    """An anomaly reported open (version 1) and then ended (version 2), in two inserts (two
    parts, not merged): every panel must see only the latest report."""
    import time

    from failslow.stream.sink import AnomalyReport, anomalies_table

    a = Anomaly(id="v", kind="slow", cause="compute", ranks=[1], start_ns=VERSIONS_T,
                detected_ns=VERSIONS_T + 10**9, slowdown=1.5)
    ended = Anomaly.from_dict({**a.to_dict(), "end_ns": VERSIONS_T + 60 * 10**9})
    for version, report in ((1, a), (2, ended)):
        table = anomalies_table([AnomalyReport(VERSIONS_JOB, report, version, time.time_ns())])
        client.insert_arrow(f"`{DEMO_DATABASE}`.`anomalies`", table)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    from failslow.stream.clickhouse import ClickHouseSink, connect

    tmp = tmp_path_factory.mktemp("dashboards")
    (tmp / "small.yaml").write_text(SMALL)
    (tmp / "hang.yaml").write_text(HANG)
    data = tmp / "data"
    # the demo itself fills the database (its own code path, a smaller scenario)
    assert cli.main(["demo", "--data-dir", str(data), "--scenario",
                     str(tmp / "small.yaml")]) == 0
    client = connect(data)
    try:
        _stream(client, tmp / "hang.yaml")
        _two_versions(client)
        if not client.query(f"SELECT count() FROM {DEMO_DATABASE}.whatif").result_rows[0][0]:
            assert _whatif(client, tmp / "small.yaml") >= 3
        sink = ClickHouseSink(client, DEMO_DATABASE, create=False)
        anomalies: dict[str, list[Anomaly]] = {}
        for job, a in sink.anomalies():
            if job != VERSIONS_JOB:
                anomalies.setdefault(job, []).append(a)
        t0, t1 = client.query(f"SELECT min(t), max(t) FROM {DEMO_DATABASE}.coll").result_rows[0]
        # the probes the node agents ran for sim-small's anomalies (issue 17)
        probes = probe_rows.load(client, DEMO_DATABASE, "sim-small", anomalies["sim-small"],
                                 {a.id: min(a.detected_ns or t0, t1)
                                  for a in anomalies["sim-small"]})
        world = dict(client.query(f"SELECT job, world_size FROM {DEMO_DATABASE}.meta FINAL")
                     .result_rows)
        from failslow.simulator import load_scenario, simulate

        truth = simulate(load_scenario(tmp / "small.yaml"), 0).truth.anomalies
        yield Loaded(client, anomalies, int(t0), int(t1), world, truth, *probes)
    finally:
        client.close()


def _context(loaded: Loaded, uid: str, **over: Variable) -> QueryContext:
    ranks = tuple(str(r) for r in range(loaded.world["sim-small"]))
    variables = {
        "database": Variable(DEMO_DATABASE),
        "job": (Variable(ALL, ("sim-small", "sim-hang"), multi=True) if uid == "failslow-hangs"
                else Variable("sim-small")),
        "comm": Variable(ALL, ("0",), multi=True),
        "rank": Variable(ALL, ranks, multi=True),
        **over,
    }
    return QueryContext.around_ns(loaded.t0, loaded.t1, 1000, variables)


def _queries() -> list[panels.Query]:
    out = []
    for path in DASHBOARDS:
        out.extend(panels.queries(json.loads(path.read_text())))
    return out


QUERIES = _queries()


def _id(q: panels.Query) -> str:
    return f"{q.dashboard}:{q.where}:{q.name}"


# ---------------------------------------------------------------------------------------------
# what each panel must show

Rows = list[dict[str, Any]]
Check = Callable[[Rows, Loaded], None]


def _injected(loaded: Loaded, cause: str) -> Anomaly:
    """The fault injected into sim-small (ground truth, whatever the detectors made of it)."""
    return next(a for a in loaded.truth if a.cause == cause)


def _who(a: Anomaly) -> str:
    return (f"link {a.link[0]}-{a.link[1]}" if a.link
            else ",".join(str(r) for r in a.ranks))


def _stored(loaded: Loaded, job: str = "sim-small") -> list[Anomaly]:
    """What the detectors reported and ClickHouse holds, in start order."""
    return sorted(loaded.anomalies[job], key=lambda a: (a.start_ns or 0, a.id))


def _check_fleet_anomalies(rows: Rows, loaded: Loaded) -> None:
    expected = sorted((job, a.id, a.kind, a.cause, _who(a)) for job in ("sim-small", "sim-hang")
                      for a in loaded.anomalies[job])
    assert sorted((r["job"], r["id"], r["kind"], r["cause"], r["root_cause"])
                  for r in rows) == expected
    assert {r["severity"] for r in rows if r["kind"] == "hang"} == {"critical"}
    assert len(loaded.anomalies["sim-small"]) >= 2


def _check_link_anomalies(rows: Rows, loaded: Loaded) -> None:
    links = [a for a in _stored(loaded) if a.link]
    assert links and [r["link_ranks"] for r in rows] == \
        [f"{a.link[0]}-{a.link[1]}" for a in links if a.link]
    # ranks r sit on node r // 4 in this scenario
    assert all(r["link_nodes"] == " - ".join(f"node{int(x) // 4:03d}"
                                              for x in r["link_ranks"].split("-"))
               for r in rows)
    assert "4-12" in [r["link_ranks"] for r in rows]  # the injected slow link


def _within(t: Any, a: Anomaly, slack_s: float = 1.0) -> bool:
    ns = t.timestamp() * 1e9
    assert a.start_ns is not None
    end = a.end_ns if a.end_ns is not None else a.start_ns + 10**12
    return a.start_ns - slack_s * 1e9 <= ns <= end + slack_s * 1e9


def _grid_max(rows: Rows, value: str) -> tuple[str, str]:
    best = max(rows, key=lambda r: r[value])
    return best["dp_rank"], best["pp_rank"]


def _check_iteration_time(rows: Rows, loaded: Loaded) -> None:
    a = _injected(loaded, "compute")
    slow = [r["iteration_ms"] for r in rows if _within(r["time"], a, 0)]
    healthy = sorted(r["iteration_ms"] for r in rows
                     if not any(_within(r["time"], b, 1) for b in loaded.truth))
    assert len(rows) >= 30 and slow and healthy
    assert max(slow) > 1.15 * healthy[len(healthy) // 2]
    assert rows[0]["median_ms"] > healthy[len(healthy) // 2]  # half the job was slow


def _check_per_step(rows: Rows, loaded: Loaded) -> None:
    # rank 5's compute spans, and those of its tensor-parallel partner rank 4 (their TP
    # all-reduces inside the compute wait for rank 5), stand out during the anomaly
    top = max(rows, key=lambda r: r["compute_slowdown"])
    assert top["rank_label"] in ("r00004", "r00005") and top["compute_slowdown"] > 1.3
    assert _within(top["time"], _injected(loaded, "compute"))
    others = [r["compute_slowdown"] for r in rows if r["rank_label"] not in ("r00004", "r00005")]
    assert max(others) < top["compute_slowdown"] - 0.2


def _check_sm_clock(rows: Rows, loaded: Loaded) -> None:
    lowest = min(rows, key=lambda r: r["sm_clock_mhz_value"])
    assert lowest["device"] == "node001 gpu1"  # rank 5 = node 1, GPU 1


def _check_advice(rows: Rows, loaded: Loaded) -> None:
    """The planner re-balances micro-batches (S2) for the compute straggler once its impact
    reaches S2's cost, and reverts when the anomaly ends (Greyhound §5.1)."""
    [compute] = [a for a in _stored(loaded) if a.cause == "compute"]
    assert [(r["anomaly_id"], r["cause"], r["root_cause"], r["strategy"], r["action"])
            for r in rows] == [(compute.id, "compute", "5", "S2", "apply"),
                               (compute.id, "compute", "5", "S2", "revert")]
    apply, revert = rows
    assert apply["impact_s"] >= apply["cost_s"] > 0 and apply["slow_iterations"] > 0
    assert apply["t_slow_s"] > apply["t_healthy_s"] > 0
    assert _within(apply["decided"], _injected(loaded, "compute"))
    assert revert["decided"] > apply["decided"]
    if apply["predicted_after_s"] is not None:  # an S2 plan with the what-if prediction
        assert apply["predicted_after_s"] < apply["predicted_before_s"]


def _check_s2_plan(rows: Rows, loaded: Loaded) -> None:
    """One row per DP group; the straggler's group (rank 5: DP 2) is the slow one, and no
    group runs more than the slowest-group bound allows."""
    assert [r["dp_rank"] for r in rows] == [0, 1, 2, 3]
    assert sum(r["microbatches"] for r in rows) == 16  # 4 micro-batches x 4 DP groups
    slow = max(rows, key=lambda r: r["relative_time"])
    assert slow["dp_rank"] == 2 and slow["relative_time"] > 1.05
    assert all(r["microbatches"] >= 1 for r in rows)
    assert max(r["relative_load"] for r in rows) <= 4 * slow["relative_time"] + 1e-6


def _check_whatif_by_time(rows: Rows, loaded: Loaded) -> None:
    assert {r["op_type"] for r in rows} == {"all", "forward-compute", "backward-compute",
                                            "pp-communication", "dp-communication",
                                            "tp-communication"}
    worst = max((r for r in rows if r["op_type"] == "all"), key=lambda r: r["slowdown_x"])
    assert worst["slowdown_x"] > 1.1
    same = [r for r in rows if r["time"] == worst["time"] and r["op_type"] != "all"]
    assert max(same, key=lambda r: r["slowdown_x"])["op_type"].endswith("-compute")


def _check_whatif_by_op(rows: Rows, loaded: Loaded) -> None:
    # the worst window is the compute straggler's (steps 8-17 slowed, window 10-19)
    assert rows[0]["op_type"] in ("forward-compute", "backward-compute")
    assert rows[0]["share_of_slowdown"] > 0.5 and rows[0]["steps"] == "10-19"
    assert rows[0]["step_slowdown_x"] > 1.1
    comm = {r["op_type"]: r["slowdown_x"] for r in rows if r["op_type"].endswith("-communication")}
    assert len(comm) == 3 and max(comm.values()) < 1.02


def _check_whatif_steps(rows: Rows, loaded: Loaded) -> None:
    top = max(rows, key=lambda r: r["whatif_slowdown"])
    assert top["worker"] == "pp0 dp2" and top["whatif_slowdown"] > 1.1
    assert _within(top["time"], _injected(loaded, "compute"))
    others = [r["whatif_slowdown"] for r in rows if r["worker"] != "pp0 dp2"
              and _within(r["time"], _injected(loaded, "compute"))]
    assert max(others) < top["whatif_slowdown"] - 0.05
    assert len({r["worker"] for r in rows}) == 8 and len({r["time"] for r in rows}) >= 25


def _check_fleet_probes(rows: Rows, loaded: Loaded) -> None:
    """One row for the probed job: every outcome counted, and the figures are the sum of
    the anomalies' probe_cost in the diagnosis."""
    from failslow.engine.probes import probe_cost

    [r] = rows
    statuses = [p["status"] for p in loaded.probes]
    assert (r["job"], r["probes"], r["ok"], r["timed_out"], r["failed"], r["skipped"]) == (
        "sim-small", len(statuses), statuses.count("ok"), statuses.count("timeout"),
        statuses.count("failed"), statuses.count("skipped"))
    assert r["anomalies_probed"] == len(loaded.probed) >= 2 and statuses.count("ok") >= 3
    cost = probe_cost(loaded.probes)
    assert (r["probe_s"], r["training_lost_s"]) == (round(cost["probe_s"], 3),
                                                    round(cost["training_lost_s"], 3))
    assert math.isclose(r["training_lost_s"], sum(
        a.extra["probe_cost"]["training_lost_s"] for a in loaded.probed), abs_tol=1e-3)


def _check_job_probes(rows: Rows, loaded: Loaded) -> None:
    """Per anomaly, probe kind and outcome; a probe that did not run says why; the verdict
    is the stored anomaly's latest report's."""
    assert sum(r["runs"] for r in rows) == len(loaded.probes)
    verdicts = {a.id: a.extra["probe"].get("verdict", "") for a in loaded.probed}
    assert {r["anomaly_id"] for r in rows} == set(verdicts)
    assert all(r["verdict"] == verdicts[r["anomaly_id"]] for r in rows)
    for r in rows:
        mine = [p for p in loaded.probes if p["request"].startswith(r["anomaly_id"] + "/")
                and (p["probe"], p["status"]) == (r["probe_kind"], r["status"])]
        assert r["runs"] == len(mine) and r["probe_s"] == round(
            sum(p["duration_ns"] for p in mine) / 1e9, 3)
        assert (r["reason"] == "") == (r["status"] == "ok")
    timeout = next(r for r in rows if r["status"] == "timeout")
    # a probe that timed out held the link until its deadline: that time is charged
    assert timeout["reason"] == "no answer in 2.0 s"
    assert timeout["training_lost_s"] == timeout["probe_s"] > 0
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert all(r["training_lost_s"] == 0 for r in skipped)


CHECKS: dict[str, Check] = {
    # fleet overview
    "failslow-fleet:annotation:-": lambda rows, ld: None,
    "failslow-fleet:panel:Jobs reporting": lambda rows, ld: _eq(rows[0]["jobs"], 2),
    "failslow-fleet:panel:Open anomalies": lambda rows, ld: _eq(rows[0]["open_anomalies"], 1),
    "failslow-fleet:panel:Time lost": lambda rows, ld: _true(
        rows[0]["gpu_hours_lost"] > rows[0]["job_hours_lost"] > 0),
    "failslow-fleet:panel:Jobs": lambda rows, ld: _eq(
        {r["job"]: (r["anomalies"], r["open"]) for r in rows},
        {"sim-hang": (1, 1), "sim-small": (len(ld.anomalies["sim-small"]), 0)}),
    "failslow-fleet:panel:Anomalies": _check_fleet_anomalies,
    "failslow-fleet:panel:Mitigation advice": lambda rows, ld: _eq(
        [(r["job"], r["cause"], r["strategy"], r["last_action"], r["decisions"]) for r in rows],
        [("sim-small", "compute", "S2", "revert", 2)]),
    "failslow-fleet:panel:Probe cost by job": _check_fleet_probes,
    "failslow-fleet:panel:Iteration time by job": lambda rows, ld: _eq(
        {r["job_name"] for r in rows}, {"sim-small", "sim-hang"}),
    # job detail
    "failslow-job:annotation:anomalies": lambda rows, ld: _eq(
        sorted(r["text"].split(" in ")[0].split(", ")[0] for r in rows),
        sorted(f"{a.id}: {a.kind}/{a.cause} {_who(a)}" for a in _stored(ld))),
    "failslow-job:annotation:change points": lambda rows, ld: _true(
        len(rows) == len(_stored(ld)) and all("at iteration" in r["text"] for r in rows)),
    "failslow-job:panel:Iteration time": _check_iteration_time,
    "failslow-job:panel:Anomalies of this job": lambda rows, ld: _eq(
        [(r["id"], r["cause"], r["root_cause"]) for r in rows],
        [(a.id, a.cause, _who(a)) for a in _stored(ld)]),
    "failslow-job:panel:Slowdown, R and P per anomaly": lambda rows, ld: _true(
        len(rows) == len(_stored(ld)) and all(r["slowdown_x"] > 1.05 for r in rows)),
    "failslow-job:panel:Round time by communicator kind": lambda rows, ld: _eq(
        {r["comm_type"] for r in rows}, {"tp", "pp", "dp"}),
    "failslow-job:panel:Round time per communicator": lambda rows, ld: _true(len(
        {r["communicator"] for r in rows}) == 20),
    "failslow-job:panel:Communicators": lambda rows, ld: _eq(rows[0]["most_often_last"], 5),
    "failslow-job:panel:Iteration time per rank": lambda rows, ld: _eq(
        len({r["rank_label"] for r in rows}), 16),
    "failslow-job:panel:Mitigation advice": _check_advice,
    "failslow-job:panel:S2 plan: micro-batches per DP group": _check_s2_plan,
    "failslow-job:annotation:mitigation advice": lambda rows, ld: _eq(
        [(r["text"].split(":")[0], r["tags"]) for r in rows],
        [("S2 apply", "advice,S2,apply"), ("S2 revert", "advice,S2,revert")]),
    "failslow-job:panel:What-if slowdown by op type": _check_whatif_by_time,
    "failslow-job:panel:What-if: slowdown attributed per op type": _check_whatif_by_op,
    "failslow-job:panel:What-if: slowest workers": lambda rows, ld: _eq(
        (rows[0]["global_rank"], rows[0]["dp_coord"], rows[0]["pp_coord"]), (5, 2, 0)),
    "failslow-job:panel:What-if slowdown per worker": lambda rows, ld: _eq(
        max(rows, key=lambda r: r["slowdown_x"])["worker"], "rank 5"),
    "failslow-job:panel:Probes and their cost": _check_job_probes,
    # rank heatmap
    "failslow-ranks:panel:What-if slowdown per worker (DP x PP)": lambda rows, ld: _eq(
        (len(rows), _grid_max(rows, "whatif_slowdown")), (8, ("dp2", "pp0"))),
    "failslow-ranks:panel:What-if per-step slowdown by worker": _check_whatif_steps,
    "failslow-ranks:panel:Wait imposed on peers (DP x PP)": lambda rows, ld: _eq(
        (len(rows), _grid_max(rows, "wait_ms_per_iteration")), (8, ("dp2", "pp0"))),
    "failslow-ranks:panel:Compute slowdown (DP x PP)": lambda rows, ld: _eq(
        _grid_max(rows, "compute_slowdown"), ("dp2", "pp0")),
    "failslow-ranks:panel:Per-step compute slowdown by rank": _check_per_step,
    "failslow-ranks:panel:Top stragglers": lambda rows, ld: _eq(
        (rows[0]["global_rank"], rows[0]["node_name"], rows[0]["dp_coord"],
         rows[0]["pp_coord"]), (5, "node001", 2, 0)),
    # hangs
    "failslow-hangs:annotation:hangs": lambda rows, ld: _true(
        len(rows) == 1 and rows[0]["text"].startswith("sim-hang")),
    "failslow-hangs:panel:Hangs": lambda rows, ld: _eq(
        [(r["job"], r["cause"], r["root_cause"], r["halt_op"], "4" in r["entered"].split(","),
          r["waiting_ranks"], r["is_open"]) for r in rows],
        [("sim-hang", "hardware", "4", "reducescatter", True, 7, 1)]),
    "failslow-hangs:panel:Operations in flight": lambda rows, ld: _true(any(
        r["job"] == "sim-hang" and r["global_rank"] == 4 and r["op"] == "reducescatter"
        and r["in_flight_s"] > 5 for r in rows)),
    "failslow-hangs:panel:Last operation per rank": lambda rows, ld: _true(any(
        r["job"] == "sim-hang" and r["global_rank"] == 4 and r["last_op"] == "reducescatter"
        and not r["completed"] for r in rows)),
    "failslow-hangs:panel:Progress of in-flight operations": lambda rows, ld: _true(any(
        r["operation"].startswith("sim-hang r4 ") for r in rows)),
    # links
    "failslow-links:annotation:link anomalies": lambda rows, ld: _eq(
        sorted(r["text"].split(": ")[0] for r in rows),
        sorted(a.id for a in _stored(ld) if a.link)),
    "failslow-links:panel:Link anomalies": _check_link_anomalies,
    "failslow-links:panel:Bandwidth per NIC": lambda rows, ld: _true(
        len({r["nic"] for r in rows}) >= 8 and max(r["GBps"] for r in rows) > 0),
    "failslow-links:panel:Work requests in flight per NIC": lambda rows, ld: _true(
        max(r["work_requests"] for r in rows) > 0),
    "failslow-links:panel:Links": lambda rows, ld: _eq(
        {rows[0]["node_name"], rows[0]["peer_node"]}, {"node001", "node003"}),
    # GPUs
    "failslow-gpus:panel:Throttled GPUs": lambda rows, ld: _eq(
        max(r["throttled_gpus"] for r in rows), 1),
    "failslow-gpus:panel:Throttle events": lambda rows, ld: _true(
        [r["global_rank"] for r in rows] == [5] and "hw_slowdown" in rows[0]["reasons"]),
    "failslow-gpus:panel:SM clock": _check_sm_clock,
    "failslow-gpus:panel:Temperature": lambda rows, ld: _eq(len({r["device"] for r in rows}), 16),
    "failslow-gpus:panel:Power": lambda rows, ld: _true(min(r["power_w_value"] for r in rows) > 0),
    "failslow-gpus:panel:Utilization": lambda rows, ld: _true(
        0 < max(r["util_pct_value"] for r in rows) <= 100),
    # pipeline health
    "failslow-pipeline:panel:Rows per second by table": lambda rows, ld: _true(
        {"coll", "link", "gpu", "span", "rounds", "iterations", "anomalies", "advice", "whatif"}
        <= {r["table_name"] for r in rows}),
    "failslow-pipeline:panel:Ingestion delay by table": lambda rows, ld: _true(
        {"coll", "link", "gpu", "iterations", "anomalies"} <= {r["table_name"] for r in rows}
        and min(r["delay_s"] for r in rows) > 0),
    "failslow-pipeline:panel:Data lag per job": lambda rows, ld: _true(
        {r["job"] for r in rows} == {"sim-small", "sim-hang"} and
        min(r["lag_s"] for r in rows) > 0),
    "failslow-pipeline:panel:Detection delay": lambda rows, ld: _true(
        len(rows) == 1 + len(ld.anomalies["sim-small"])
        and all(r["detection_delay_s"] >= 0 for r in rows)),
    "failslow-pipeline:panel:Storage": lambda rows, ld: _true(
        {"coll", "anomalies", "rounds"} <= {r["table_name"] for r in rows}),
}


def _eq(a: Any, b: Any) -> None:
    assert a == b


def _true(x: bool) -> None:
    assert x


# ---------------------------------------------------------------------------------------------


def _panels_fit_the_grid(d: dict[str, Any]) -> None:
    """Grafana's 24-column grid: no panel sticks out or covers another; ids are unique."""
    taken: set[tuple[int, int]] = set()
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, (d["uid"], p["title"], g)
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                 for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, (d["uid"], p["title"], "overlaps another panel")
        taken |= cells
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    assert len({p["title"] for p in d["panels"]}) == len(d["panels"])


def test_committed_dashboards_are_there() -> None:
    assert {p.stem for p in DASHBOARDS} == {d.uid for d in panels.dashboards()}
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        names = [v["name"] for v in d["templating"]["list"]]
        assert names[0] == "database"
        for p in d["panels"]:
            if p["type"] != "text":
                assert p["datasource"]["uid"] in (panels.DATASOURCE_UID, panels.PROMETHEUS_UID)
                assert p["targets"] and p["description"]
                assert {t["datasource"]["uid"] for t in p["targets"]} == \
                    {p["datasource"]["uid"]}
        _panels_fit_the_grid(d)
    job = json.loads((GRAFANA / "dashboards" / "failslow-job.json").read_text())
    assert [v["name"] for v in job["templating"]["list"]] == ["database", "job", "comm", "rank"]


def test_every_panel_query_is_checked() -> None:
    ids = {_id(q) for q in QUERIES if q.where != "variable"}
    assert ids == set(CHECKS) - {"failslow-fleet:annotation:-"}
    assert len(ids) >= 35


@pytest.mark.parametrize("query", [q for q in QUERIES if q.where != "variable"], ids=_id)
def test_query_runs_and_shows_the_faults(query: panels.Query, loaded: Loaded) -> None:
    ctx = _context(loaded, query.dashboard)
    expanded = {macros.expand(query.sql, ctx, order=o) for o in macros.macro_orders(3)}
    assert len(expanded) == 1  # the plugin's macro order is random
    sql = expanded.pop()
    cols, rows = loaded.run(sql)
    assert cols == panels.expected_columns()[(query.dashboard, query.where, query.name)]
    assert rows, f"{_id(query)} returned no rows"
    if query.fmt == panels.TIMESERIES:  # the plugin's long-to-wide needs time order
        times = [r["time"] for r in rows]
        assert times == sorted(times)
    CHECKS[_id(query)](rows, loaded)


@pytest.mark.parametrize("query", [q for q in QUERIES if q.where == "variable"], ids=_id)
def test_variable_queries(query: panels.Query, loaded: Loaded) -> None:
    cols, rows = loaded.run(macros.expand(query.sql, _context(loaded, query.dashboard)))
    values = {str(next(iter(r.values()))) for r in rows}
    expected = {"database": {DEMO_DATABASE}, "job": {"sim-small", "sim-hang"},
                "rank": {str(i) for i in range(16)}}
    if query.name == "comm":
        assert cols == ("value", "label") and len(rows) == 20
        assert all(r["label"].split()[0] in ("tp", "pp", "dp") for r in rows)
    else:
        assert values == expected[query.name]


def test_selected_values_narrow_the_panels(loaded: Loaded) -> None:
    link = next(a for a in _stored(loaded) if a.comm is not None)
    ctx = _context(loaded, "failslow-job", comm=Variable((str(link.comm),), multi=True),
                   rank=Variable(("5", "12"), multi=True))
    job = panels.job_detail()
    by_title = {p.title: p for p in job.panels}
    _, rows = loaded.run(macros.expand(by_title["Round time per communicator"].sql, ctx))
    assert rows and {r["communicator"].split()[1] for r in rows} == {str(link.comm)}
    _, rows = loaded.run(macros.expand(by_title["Iteration time per rank"].sql, ctx))
    assert {r["rank_label"] for r in rows} == {"rank 5", "rank 12"}


def test_time_range_outside_the_job_shows_nothing(loaded: Loaded) -> None:
    ctx = QueryContext.around_ns(loaded.t1 + 3600 * 10**9, loaded.t1 + 7200 * 10**9, 1000,
                                 _context(loaded, "failslow-job").variables, pad_s=0)
    job = {p.title: p for p in panels.job_detail().panels}
    for title in ("Iteration time", "Anomalies of this job", "Communicators"):
        assert loaded.run(macros.expand(job[title].sql, ctx))[1] == []
    fleet = {p.title: p for p in panels.fleet().panels}
    _, rows = loaded.run(macros.expand(fleet["Open anomalies"].sql, ctx))
    assert rows[0]["open_anomalies"] == 1  # the hang is still open an hour later


def test_only_the_latest_report_of_an_anomaly_counts(loaded: Loaded) -> None:
    parts = loaded.client.query(
        f"SELECT count() FROM {DEMO_DATABASE}.anomalies WHERE job = '{VERSIONS_JOB}'"
    ).result_rows[0][0]
    assert parts == 2  # both reports are stored
    ctx = QueryContext.around_ns(VERSIONS_T, VERSIONS_T + 120 * 10**9, 1000,
                                 _context(loaded, "failslow-fleet").variables)
    fleet = {p.title: p for p in panels.fleet().panels}
    _, rows = loaded.run(macros.expand(fleet["Open anomalies"].sql, ctx))
    assert rows[0]["open_anomalies"] == 1  # only the hang, never the ended one's v1
    _, rows = loaded.run(macros.expand(fleet["Anomalies"].sql, ctx))
    mine = [r for r in rows if r["job"] == VERSIONS_JOB]
    assert len(mine) == 1 and mine[0]["ended"] is not None


def test_alert_rules_run(loaded: Loaded) -> None:
    fired = {}
    for a in panels.alert_defs(DEMO_DATABASE):
        cols, rows = loaded.run(a.sql)
        assert cols == a.columns, a.uid
        fired[a.uid] = [tuple(r.values()) for r in rows if list(r.values())[-1] > a.threshold]
    # reported just now (wall time) and still open: the hang pages; the slow-downs ended
    assert fired["failslow-hang"] == [("sim-hang", "hardware", 1)]
    assert fired["failslow-open-anomaly"] == []
    assert fired["failslow-pipeline-lag"] == []  # the simulated events are from 2025


def test_committed_files_are_up_to_date() -> None:
    pytest.importorskip("grafana_foundation_sdk" if not os.environ.get("CI") else "failslow",
                        reason="grafana-foundation-sdk (failslow[grafana]) builds the JSON")
    from failslow.dashboards import grafana

    assert grafana.check(GRAFANA) == [], "run failslow dashboards write infra/grafana"


def test_check_reports_a_stale_file(tmp_path: Path) -> None:
    if not os.environ.get("CI"):
        pytest.importorskip("grafana_foundation_sdk")
    from failslow.dashboards import grafana

    assert cli.main(["dashboards", "write", str(tmp_path)]) == 0
    assert cli.main(["dashboards", "check", str(tmp_path)]) == 0
    path = tmp_path / "dashboards" / "failslow-job.json"
    doc = json.loads(path.read_text())
    doc["panels"][0]["targets"][0]["rawSql"] = "SELECT 1"
    path.write_text(json.dumps(doc))
    assert cli.main(["dashboards", "check", str(tmp_path)]) == 1
    diffs = grafana.check(tmp_path)
    assert len(diffs) == 1 and "failslow-job.json" in diffs[0]
