"""NCCL RAS findings (``ras`` rows, event contract v2) as evidence of the hang detector:
beside coll rows that show the hang they confirm or contradict its root, never change it;
where coll rows stopped they raise the hang themselves (H1 missing/behind, H2
inconsistent, H3 candidate for a stall that lasted the detector's timeout)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from support.snapshots import roundtrip
from test_detectors_hang import MS, Fault, Job, S, drive, step_index, timeline

from failslow import events
from failslow.detectors.hang import HangConfig, HangDetector
from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import only


def ras_rows(job: Job, comm: int, ranks: list[int], finding: str, start: int, stop: int,
             every: int = 10 * S, function: str | None = "AllReduce", count: int | None = 40,
             expected: int | None = 41, size: int | None = None) -> pa.Table:
    """What the agent publishes: the same finding in every report from ``start`` to
    ``stop``."""
    rows: list[dict[str, Any]] = []
    for t in range(start, stop + 1, every):
        for r in ranks:
            rows.append({"job": "synth", "t": t, "node": "n0", "comm": comm,
                         "comm_size": size or job.world, "rank": r, "finding": finding,
                         "function": function, "count": count, "expected": expected})
    return events.from_rows("ras", rows)


def latest(reports: list[Anomaly]) -> dict[str, Anomaly]:
    """The latest report of each anomaly (refinements share the id)."""
    out: dict[str, Anomaly] = {}
    for a in reports:
        out[a.id] = a
    return out


def dead_rank_job() -> tuple[Job, int, int]:
    """A tensor-parallel member that never enters its collective (H1), its comm and rank."""
    job = Job(iterations=10)
    comm = job.tp_comm[(1, 1)]
    k = step_index(job, "coll", lambda s: s[1] == comm and s[6] == 2)
    root = job.rank(1, 1, 1)
    job.faults = [Fault("die", root, 6, k)]
    return job, comm, root


def last_t(table: pa.Table) -> int:
    return int(pc.max(table.column("t")).as_py())


def test_coll_hang_with_agreeing_ras_keeps_the_diagnosis_and_carries_the_evidence() -> None:
    job, comm, root = dead_rank_job()
    tables = job.run()
    plain = drive(job, tables)
    stop = last_t(tables["coll"])
    # RAS every 2 s from the moment the coll rows stop: seen before the coll report
    ras = ras_rows(job, comm, [root], "behind", stop + 2 * S, stop + 40 * S, every=2 * S,
                   size=2)
    run = drive(job, {**tables, "ras": ras})
    want = [(a.kind, a.cause, a.ranks, a.comm, a.start_ns) for a in plain.opened]
    got = latest(run.opened)
    assert len(want) == 1 and len(got) == 1
    a = next(iter(got.values()))
    assert [(a.kind, a.cause, a.ranks, a.comm, a.start_ns)] == want
    assert a.extra["ras_agrees"] is True and a.extra["ras_roots"] == [root]
    assert {(f["finding"], f["rank"], f["comm"]) for f in a.extra["ras"]} == {
        ("behind", root, comm)}
    assert "ras_note" not in a.extra
    # the first report already says so (RAS was seen before the coll rows showed the hang)
    assert run.opened[0].extra.get("ras_roots") == [root]
    assert a.extra["halt_point"] == plain.opened[0].extra["halt_point"]


def test_ras_alone_raises_not_entered_when_coll_rows_stopped_before_the_hang() -> None:
    job = Job(iterations=6)
    tables = job.run()      # healthy: every operation completed, then the rows stop
    stop = last_t(tables["coll"])
    assert drive(job, tables, tail=120 * S).reports == []
    ras = ras_rows(job, job.world_comm, [3], "behind", stop + 10 * S, stop + 60 * S)
    run = drive(job, {**tables, "ras": ras})
    assert len(run.opened) == 1, run.opened
    a = run.opened[0]
    assert (a.kind, a.cause, a.ranks, a.comm, a.comm_kind) == (
        "hang", "not_entered", [3], job.world_comm, "world")
    # seen twice, 10 s apart (>= the idle floor): named at the second report
    assert a.start_ns == stop + 10 * S and a.detected_ns == stop + 20 * S
    assert a.extra["evidence"] == "ras" and a.extra["ras_roots"] == [3]
    assert a.extra["halt_point"]["missing"] == [3]
    assert a.extra["halt_point"]["op"] == "allreduce"
    assert a.extra["victims_count"] == job.world - 1
    # missing: the same, for a rank that stopped answering RAS
    ras = ras_rows(job, job.world_comm, [5], "missing", stop + 10 * S, stop + 60 * S,
                   function=None, count=None, expected=None)
    got = drive(job, {**tables, "ras": ras}).opened
    assert [(a.cause, a.ranks) for a in got] == [("not_entered", [5])]
    assert "count" not in got[0].extra["halt_point"]


def test_ras_alone_inconsistent_is_h2() -> None:
    job = Job(iterations=6)
    tables = job.run()
    stop = last_t(tables["coll"])
    ras = ras_rows(job, job.world_comm, [5], "inconsistent", stop + 10 * S, stop + 60 * S,
                   function="AllGather", count=1, expected=0)
    run = drive(job, {**tables, "ras": ras})
    assert [(a.kind, a.cause, a.ranks) for a in run.opened] == [("hang", "inconsistent", [5])]


def test_stall_shorter_than_the_timeout_is_nothing_longer_is_an_h3_candidate() -> None:
    job = Job(iterations=6)
    tables = job.run()
    stop = last_t(tables["coll"])
    timeout = HangConfig().ceiling_ns
    members = list(range(job.world))
    short = ras_rows(job, job.world_comm, members, "stalled", stop + 10 * S,
                     stop + timeout - 20 * S, count=40, expected=40)
    assert drive(job, {**tables, "ras": short}, tail=20 * S).reports == []
    long = ras_rows(job, job.world_comm, members, "stalled", stop + 10 * S,
                    stop + timeout + 30 * S, count=40, expected=40)
    run = drive(job, {**tables, "ras": long}, tail=20 * S)
    assert [(a.cause, a.ranks) for a in run.opened] == [("hardware", [])]
    a = run.opened[0]
    assert a.extra["candidate"] is True and a.detected_ns is not None
    assert a.detected_ns - (stop + 10 * S) >= timeout


def test_ras_naming_another_rank_never_changes_the_coll_root() -> None:
    job, comm, root = dead_rank_job()
    tables = job.run()
    plain = latest(drive(job, tables).opened)
    other = job.rank(0, 1, 1)      # the member that entered and waits
    stop = last_t(tables["coll"])
    # first seen after the coll report: the open hang is reported again with the evidence
    ras = ras_rows(job, comm, [other], "behind", stop + 10 * S, stop + 50 * S, size=2)
    run = drive(job, {**tables, "ras": ras})
    got = latest(run.opened)
    assert list(got) == list(plain)
    a = next(iter(got.values()))
    assert (a.cause, a.ranks) == ("not_entered", [root])
    assert a.extra["ras_agrees"] is False and a.extra["ras_roots"] == []
    assert f"{other} behind" in a.extra["ras_note"]
    assert len(run.opened) == 2          # opened, then refined once (not per RAS report)
    assert "ras" not in run.opened[0].extra


def test_engine_keeps_a_root_ras_names_although_it_sent_no_rows() -> None:
    """Missing data is not evidence, but RAS naming the rank is: a rank without coll rows
    is a root only when RAS calls it missing."""
    job, comm, gone = dead_rank_job()
    coll = job.run()["coll"]      # its collector never worked: none of its rows
    coll = coll.filter(pc.not_equal(coll.column("rank"), gone))
    stop = last_t(coll)
    ras = ras_rows(job, comm, [gone], "missing", stop + 2 * S, stop + 40 * S, every=2 * S,
                   function=None, count=None, expected=None, size=2)

    def hangs(tables: dict[str, pa.Table]) -> list[Anomaly]:
        eng = only(job.meta(), {"hang"})
        from failslow.replay import replay

        last, reports = 0, []
        for now, batch in replay(tables):
            reports += eng.update(batch).anomalies + eng.on_tick(now).anomalies
            last = now
        for t in range(last, last + 30 * S, 100 * MS):
            reports += eng.on_tick(t).anomalies
        return list(latest(reports).values())

    without = hangs({"coll": coll})
    assert without and all(gone not in a.ranks for a in without)
    assert any(gone in a.extra.get("unknown_ranks", []) for a in without)
    with_ras = hangs({"coll": coll, "ras": ras})
    assert [(a.cause, a.ranks) for a in with_ras] == [("not_entered", [gone])]
    assert with_ras[0].extra["ras_roots"] == [gone]


def test_snapshot_restore_with_ras_and_older_snapshots() -> None:
    job = Job(iterations=6)
    tables = job.run()
    stop = last_t(tables["coll"])
    ras = ras_rows(job, job.world_comm, [3], "behind", stop + 10 * S, stop + 60 * S)
    steps = timeline({**tables, "ras": ras})

    def feed(det: HangDetector, part: list[tuple[int, Any]]) -> list[dict[str, Any]]:
        out: list[Anomaly] = []
        for now, batch in part:
            if batch:
                out += det.update(batch)
            out += det.on_tick(now)
        return [a.to_dict() for a in out]

    ref = feed(HangDetector(job.meta()), steps)
    assert [(a["cause"], a["ranks"]) for a in ref] == [("not_entered", [3])]
    for cut in range(1, len(steps), max(1, len(steps) // 7)):
        det = HangDetector(job.meta())
        got = feed(det, steps[:cut])
        state = roundtrip(det.snapshot())
        det2 = HangDetector(job.meta())
        det2.restore(state)
        assert feed(det2, steps[cut:]) == ref[len(got):] and got == ref[:len(got)]
    # a snapshot from before RAS evidence existed still restores
    det = HangDetector(job.meta())
    feed(det, steps[: len(steps) // 2])
    old = roundtrip(det.snapshot())
    old.pop("ras")
    HangDetector(job.meta()).restore(old)


def test_ras_is_an_input_kind_of_the_hang_detector() -> None:
    from failslow.engine.registry import KINDS, JobConfig, input_kinds
    from failslow.stream.config import ProcessorConfig

    assert "ras" in HangDetector.kinds and "ras" in KINDS
    assert "ras" in input_kinds(JobConfig(detectors=frozenset({"hang"})))
    assert "ras" not in input_kinds(JobConfig(detectors=frozenset({"slowdown"})))
    assert "ras" in ProcessorConfig().analyzer_kinds
