"""``failslow analyze``: the offline analyzer on synthetic and simulated trace directories."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from support.synth_jobs import Fault, generate

from failslow import cli
from failslow.diagnosis import Diagnosis
from failslow.engine.offline import analyze
from failslow.tracedir import write_trace

MS = 1_000_000

TOP_KEYS = {"version", "job", "iterations", "anomalies", "whatif"}


def _shuffled(table: pa.Table, seed: int = 0) -> pa.Table:
    order = list(range(table.num_rows))
    random.Random(seed).shuffle(order)
    return table.take(pa.array(order))


@pytest.fixture(scope="module")
def straggler_job():  # type: ignore[no-untyped-def]
    return generate(tp=2, pp=2, dp=2, iterations=30, faults=[Fault("compute", 12, None, 1.5,
                                                                   rank=4)])


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_bare_trace_any_order_no_comms(tmp_path: Path, straggler_job, fmt: str) -> None:  # type: ignore[no-untyped-def]
    # only meta.json (without communicators) and coll, rows in random order
    meta = dataclasses.replace(straggler_job.meta, comms=())
    write_trace(tmp_path, [meta], {"coll": _shuffled(straggler_job.tables["coll"])}, fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["meta.json", f"coll.{fmt}"])
    diag = analyze(tmp_path)
    (a,) = diag.anomalies
    assert a.kind == "slow" and a.cause == "compute" and a.ranks == [4]
    assert diag.iterations is not None and diag.iterations["count"] >= 25


def test_cli_json_prints_only_the_diagnosis(tmp_path: Path, straggler_job,  # type: ignore[no-untyped-def]
                                            capsys: pytest.CaptureFixture[str]) -> None:
    write_trace(tmp_path, [straggler_job.meta], straggler_job.tables, "parquet")
    assert cli.main(["analyze", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert set(data) == TOP_KEYS
    assert Diagnosis.from_dict(data).anomalies[0].ranks == [4]


def test_cli_table(tmp_path: Path, straggler_job, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    write_trace(tmp_path, [straggler_job.meta], straggler_job.tables, "parquet")
    assert cli.main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "iterations" in out and "compute" in out and "slow-0" in out


def test_cli_rejects_a_broken_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "meta.json").write_text("{}")
    assert cli.main(["analyze", str(tmp_path), "--json"]) == 2
    assert capsys.readouterr().out == ""


# --------------------------------------------------------------------------- simulator


def _simulate(tmp_path_factory: pytest.TempPathFactory, preset: str) -> Path:
    out = tmp_path_factory.mktemp(preset)
    assert cli.main(["simulate", "--out", str(out), "--preset", preset]) == 0
    return out


def _check_iterations(diag: Diagnosis, truth: Diagnosis) -> None:
    assert diag.iterations is not None and truth.iterations is not None
    err = abs(diag.iterations["median_s"] - truth.iterations["median_s"])
    assert err / truth.iterations["median_s"] <= 0.01
    assert diag.iterations["period_ops"] == truth.iterations["period_ops"]


@pytest.mark.slow
def test_simulated_default_straggler(tmp_path_factory: pytest.TempPathFactory) -> None:
    trace = _simulate(tmp_path_factory, "default")
    truth = Diagnosis.load(trace / "truth.json")
    diag = analyze(trace)
    _check_iterations(diag, truth)
    (want,) = truth.anomalies
    (got,) = diag.anomalies
    assert got.cause == "compute" and got.ranks == want.ranks
    base = want.extra["baseline_s"] * 1e9
    assert got.detected_ns is not None and want.start_ns is not None
    assert got.detected_ns - want.start_ns <= 3 * base
    assert abs((got.start_ns or 0) - want.start_ns) <= base
    assert want.end_ns is not None and abs((got.end_ns or 0) - want.end_ns) <= 2 * base


@pytest.mark.slow
def test_simulated_link(tmp_path_factory: pytest.TempPathFactory) -> None:
    trace = _simulate(tmp_path_factory, "link")
    truth = Diagnosis.load(trace / "truth.json")
    diag = analyze(trace)
    _check_iterations(diag, truth)
    (want,) = truth.anomalies
    (got,) = diag.anomalies
    assert got.cause == "communication"
    assert got.link == want.link and got.comm == want.comm and got.stage == want.stage


@pytest.mark.slow
def test_simulated_healthy(tmp_path_factory: pytest.TempPathFactory) -> None:
    trace = _simulate(tmp_path_factory, "healthy")
    diag = analyze(trace)
    _check_iterations(diag, Diagnosis.load(trace / "truth.json"))
    assert diag.anomalies == []


@pytest.mark.parametrize("piece_rows", [65_536, 97])
def test_directory_replay_matches_the_in_memory_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece_rows: int) -> None:
    """Row groups read as the replay reaches them give the same batches (and so the same
    diagnosis) as the whole tables; rows out of order within and across row groups too,
    and row groups in time order read in pieces (97 rows: many pieces per window)."""
    import pyarrow.parquet as pq

    import failslow.engine.offline as offline
    from failslow.engine.offline import analyze_tables, replay_dir

    monkeypatch.setattr(offline, "PIECE_ROWS", piece_rows)
    from failslow.replay import replay
    from failslow.tracedir import TraceDir

    job = generate(tp=2, pp=2, dp=2, iterations=30, faults=[Fault("compute", 12, 24, 1.6,
                                                                  rank=6)])
    coll = job.tables["coll"].sort_by("t")
    # time-ordered row groups, one of them shuffled inside
    write_trace(tmp_path, [job.meta], {}, "parquet")
    n = coll.num_rows
    parts = [coll.slice(0, n // 3), _shuffled(coll.slice(n // 3, n // 3)),
             coll.slice(2 * (n // 3))]
    with pq.ParquetWriter(tmp_path / "coll.parquet", coll.schema) as w:
        for p in parts:
            w.write_table(p)
    got = [(now, {k: t.num_rows for k, t in b.items()}) for now, b in
           replay_dir(TraceDir(tmp_path), 20 * MS)]
    want = [(now, {k: t.num_rows for k, t in b.items()}) for now, b in
            replay({"coll": coll}, 20 * MS)]
    assert got == want
    assert analyze(tmp_path, 20 * MS).to_dict() == \
        analyze_tables(job.meta, {"coll": coll}, 20 * MS).to_dict()


def test_large_trace_whatif_goes_on_over_a_sliding_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the row bound the offline what-if input stops growing and the stream's windowed
    analysis takes over: a result still comes, from the trace's last steps."""
    import failslow.engine.offline as an

    assert cli.main(["simulate", "--preset", "default", "--out", str(tmp_path)]) == 0
    whole = analyze(tmp_path).whatif
    monkeypatch.setattr(an, "WHATIF_MAX_ROWS", 100_000)
    windowed = analyze(tmp_path).whatif
    assert whole is not None and windowed is not None
    assert windowed != whole  # a different (windowed) computation
    for result in (whole, windowed):
        assert result["slowdown"] > 1.1  # the straggler's slow-down shows in both


def test_windowed_whatif_reads_its_window_again_with_the_buffered_rows_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline, the windowed what-if keeps no rows: it reads the chosen window again from
    the trace at the end. Its result is the one of the analyzer that buffered the rows
    (the same window, the same rows, every field)."""
    import failslow.engine.offline as an
    from failslow.engine.analyzer import JobAnalyzer
    from failslow.engine.runner import steps
    from failslow.tracedir import TraceDir

    assert cli.main(["simulate", "--preset", "default", "--out", str(tmp_path)]) == 0
    monkeypatch.setattr(an, "WHATIF_MAX_ROWS", 100_000)
    reread = analyze(tmp_path).whatif
    td = TraceDir(tmp_path)
    buffered = an.WhatIfInput(td.meta())
    for step in steps(JobAnalyzer(td.meta()), an.replay_dir(td)):
        buffered.add(step.batch)
    assert buffered.windowed is not None and buffered.windowed.reader is None
    assert reread is not None and reread.get("window") is not None
    assert buffered.result() == reread


def test_failing_windowed_whatif_does_not_stop_the_diagnosis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The what-if analysis is optional: if it fails the anomalies are still reported."""
    import failslow.engine.offline as an
    from failslow.whatif.analysis import WhatIfAnalyzer

    assert cli.main(["simulate", "--preset", "default", "--out", str(tmp_path)]) == 0
    monkeypatch.setattr(an, "WHATIF_MAX_ROWS", 100_000)

    def broken(self: WhatIfAnalyzer, batch: object) -> None:
        raise IndexError("index 0 is out of bounds")

    monkeypatch.setattr(WhatIfAnalyzer, "update", broken)
    diag = analyze(tmp_path)
    assert diag.whatif is None
    assert [(a.cause, a.ranks) for a in diag.anomalies] == [("compute", [21])]
    assert diag.incomplete == [{"part": "whatif",
                                "reason": "failed: IndexError: index 0 is out of bounds"}]


def test_windowed_whatif_whose_window_cannot_be_read_again_does_not_stop_the_diagnosis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading the chosen window again at the end may fail (the trace changed on disk): the
    anomalies are still reported, and the diagnosis says why there is no what-if."""
    import failslow.engine.offline as an
    from failslow.events import ContractError

    assert cli.main(["simulate", "--preset", "default", "--out", str(tmp_path)]) == 0
    monkeypatch.setattr(an, "WHATIF_MAX_ROWS", 100_000)

    def gone(td: object, rows: object) -> None:
        raise ContractError("missing required column", source="coll.parquet", column="t")

    monkeypatch.setattr(an, "read_window", gone)
    diag = analyze(tmp_path)
    assert diag.whatif is None
    assert [(a.cause, a.ranks) for a in diag.anomalies] == [("compute", [21])]
    assert [d["part"] for d in diag.incomplete] == ["whatif"]
    assert diag.incomplete[0]["reason"].startswith("failed: ContractError")


def test_cli_failure_is_one_line_and_the_traceback_comes_with_v(
        tmp_path: Path, straggler_job, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
        capsys: pytest.CaptureFixture[str]) -> None:
    import failslow.engine.offline as an

    write_trace(tmp_path, [straggler_job.meta], straggler_job.tables)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("something broke inside")

    monkeypatch.setattr(an, "analyze", broken)
    assert cli.main(["analyze", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "failslow analyze: failed: RuntimeError: something broke inside "
        "(run with -v for the traceback)"]
    with pytest.raises(RuntimeError, match="something broke inside"):
        cli.main(["-v", "analyze", str(tmp_path)])
