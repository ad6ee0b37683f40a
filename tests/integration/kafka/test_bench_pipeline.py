"""``failslow bench pipeline`` (bench/pipeline.py, issue 6 item 7): the capacity figures of a
processor run, from the counters the processor writes with ``--stats-json``."""

from __future__ import annotations

from typing import Any

import pytest

from failslow.bench.pipeline import _phase, _steady


def _stats(cpu_per_row_first: float, cpu_per_row_second: float, rows: int) -> dict:
    """A processor run over ``rows`` rows in 20 checkpoints: the first half of the rows at
    one CPU cost per row (learning), the second half at another (steady)."""
    samples, cpu, seen = [], 1.0, 0
    step = rows // 20
    for i in range(20):
        cpu += step * (cpu_per_row_first if i < 10 else cpu_per_row_second)
        seen += step
        samples.append((cpu, seen))
    return {"cpu_first_message_s": 1.0, "cpu_last_checkpoint_s": cpu, "cpu_samples": samples,
            "rows": {"coll": seen}, "seconds": {"analyze": 1.0}}


def test_steady_figure_is_the_second_half() -> None:
    rows, iterations = 2_000_000, 10
    stats = _stats(2e-6, 1e-6, rows)
    per_iteration = rows / iterations
    # 1 us per row in the second half: 0.2 s per iteration of 200k rows
    assert _steady(stats, per_iteration) == pytest.approx(0.2, rel=0.02)
    # overall: 3 s of CPU over 10 iterations
    phase = _phase(stats, rows, iterations, 4096, raw_rate=20e6)
    assert phase["cpu_s_per_iteration"] == pytest.approx(0.3, abs=0.001)
    assert phase["steady_cpu_s_per_iteration"] == pytest.approx(0.2, abs=0.001)
    assert phase["ranks_realtime_steady"] == pytest.approx(4096 / 0.2, rel=0.02)
    # the headline is the conservative one
    assert phase["ranks_realtime"] == phase["ranks_realtime_overall"]
    assert phase["ranks_realtime_overall"] == pytest.approx(4096 / 0.3, rel=0.01)
    assert phase["rows_per_s"] == pytest.approx(rows / 3.0, rel=0.01)
    assert phase["ratio_to_raw_consume"] == pytest.approx(rows / 3.0 / 20e6, rel=0.01)
    assert phase["complete"] is True


def test_incomplete_run_is_flagged_and_few_samples_fall_back_to_overall() -> None:
    stats = _stats(1e-6, 1e-6, 1_000_000)
    stats["cpu_samples"] = stats["cpu_samples"][-2:]
    phase = _phase(stats, 2_000_000, 10, 1024, raw_rate=1e6)
    assert phase["complete"] is False and phase["rows_seen"] == 1_000_000
    # too few samples for a second half: the overall CPU over the iterations seen
    assert phase["steady_cpu_s_per_iteration"] == pytest.approx(
        (stats["cpu_last_checkpoint_s"] - 1.0) / 5, rel=0.01)


def test_headline_is_the_more_expensive_of_steady_and_overall() -> None:
    # a second half dearer than the first (a snapshot, a costly kind fetched last)
    stats = _stats(1e-6, 3e-6, 2_000_000)
    phase = _phase(stats, 2_000_000, 10, 4096, raw_rate=20e6)
    assert phase["steady_cpu_s_per_iteration"] > phase["cpu_s_per_iteration"]
    assert phase["ranks_realtime"] == phase["ranks_realtime_steady"] < 4096 / 0.4 * 1.01


def test_stage_figures_keys_and_cores() -> None:
    """Issue 13's keys from the store run and the detection groups' runs: CPU per trace
    second, ranks per core, and no core count for a job a stage cannot spread over
    processes; the one-group detection run is their baseline."""
    from failslow.bench.pipeline import stage_figures

    figures = {"ranks": 4096, "iterations": 10, "simulated_iteration_s": 0.5}
    phases: dict[str, dict[str, Any]] = {
        "store": {"cpu_s_per_iteration": 0.1, "rows_by_kind": {"coll": 9000, "span": 50}},
        "detect": {"cpu_s_per_iteration": 1.2},
        "detect_track": {"cpu_s_per_iteration": 0.3},
        "detect_reduce0": {"cpu_s_per_iteration": 0.4},
        "detect_reduce1": {"cpu_s_per_iteration": 0.4},
        "detect_slowdown": {"cpu_s_per_iteration": 1.0,
                            "rows_by_kind": {"coll": 9000, "evidence": 4000, "span": 50,
                                             "iterations": 950}},
        "detect_hang": {"cpu_s_per_iteration": 0.25}}
    out = stage_figures(phases, figures)
    stages = {s["name"]: s for s in out["stages"]}
    assert list(stages) == ["store", "detect-track", "detect-reduce0", "detect-reduce1",
                            "detect-slowdown", "detect-hang"]
    assert [s["shardable"] for s in stages.values()] == [False, False, True, True, False,
                                                         False]
    assert stages["detect-track"]["cpu_s_per_trace_s"] == pytest.approx(0.6)
    assert stages["store"]["cpu_s_per_trace_s"] == pytest.approx(0.2)
    assert stages["store"]["ranks_per_core"] == 4096 * 5
    assert stages["detect-slowdown"]["cpu_s_per_trace_s"] == pytest.approx(2.0)
    assert stages["detect-slowdown"]["ranks_per_core"] == 2048
    assert stages["detect-hang"]["ranks_per_core"] == 4096 * 2
    assert out["detect_in_one_group"]["ranks_per_core"] == int(4096 / 2.4)
    # a group's detection of one job runs in one process: 16,384 ranks need 8 cores of it
    assert out["cores_for_16384_ranks"] is None and out["cores_for_65536_ranks"] is None
    # the job-level stage still reads the raw coll rows (the link-rate detector's)
    assert out["job_stage_row_ratio"] == pytest.approx(9000 / 14000, abs=1e-3)
    assert out["job_stage_rows"]["evidence"] == 4000
    cheap = {name: {"cpu_s_per_iteration": 0.01} for name in phases}
    # one core per stage when each keeps up with the job on one core
    assert stage_figures(cheap, figures)["cores_for_16384_ranks"] == len(stages)


def test_codec_figures_per_stage() -> None:
    """Step 7: per IPC codec, the bytes on Kafka, the producer's CPU and per stage its CPU
    and decoding seconds per second of trace."""
    from failslow.bench.pipeline import _codec_figures

    figures = {"ranks": 4096, "iterations": 10, "simulated_iteration_s": 0.5}
    phases = {name: {"cpu_s_per_iteration": cpu, "phases_s": {"decode": dec}}
              for name, cpu, dec in (("store", 0.1, 0.5), ("detect_track", 0.3, 0.5),
                                     ("detect_reduce0", 0.4, 0.5),
                                     ("detect_reduce1", 0.4, 0.5),
                                     ("detect_slowdown", 1.0, 1.0),
                                     ("detect_hang", 0.25, 0.0))}
    out = _codec_figures({"bytes": 12_345_678, "cpu": 3.21}, phases, figures)
    assert out["megabytes"] == 12.3 and out["producer_cpu_s"] == 3.21
    stages = {s["name"]: s for s in out["stages"]}
    assert stages["store"]["cpu_s_per_trace_s"] == pytest.approx(0.2)
    assert stages["store"]["decode_cpu_s_per_trace_s"] == pytest.approx(0.1)
    assert stages["detect-slowdown"]["ranks_per_core"] == 2048
    assert stages["detect-hang"]["decode_cpu_s_per_trace_s"] == 0.0


def test_reducer_processes_figures(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--processes N``: per process count, each reducer gets its shard and a core round
    robin; the drain time spans the first message to the slowest last checkpoint; the lag
    curve is sampled while they run."""
    from failslow.bench import reducer_scaling as rs

    monkeypatch.setattr(rs, "LAG_EVERY_S", 0.0)
    lags = iter(range(100, 0, -1))
    monkeypatch.setattr(rs, "_lag", lambda bootstrap, topics, groups: next(lags))
    started: list[tuple[int, tuple[str, ...]]] = []

    class Proc:
        def __init__(self) -> None:
            self.polls = 0

        def poll(self) -> int | None:
            self.polls += 1
            return None if self.polls < 3 else 0

    def start(d: Any, core: int, group: str, *args: str) -> Proc:
        started.append((core, args))
        return Proc()

    def finish(p: Proc, d: Any) -> dict[str, Any]:
        i = int(str(d).rsplit("-", 1)[1])
        return {"first_message_ns": 1_000_000_000 + i, "last_checkpoint_ns": 3_000_000_000
                + i * 1_000_000_000, "cpu": 2.0 + i}

    figures = {"iterations": 10, "simulated_iteration_s": 0.5, "rows": 1_000_000}
    out = rs.reducer_scaling("b", "p.", tmp_path, [1, 3], [0, 1], figures, start, finish,
                             lambda s: float(s["cpu"]))
    assert [o["processes"] for o in out] == [1, 3]
    shards = [a[a.index("--shard") + 1] for _, a in started]
    assert shards == ["0/1", "0/3", "1/3", "2/3"]
    assert [c for c, _ in started] == [0, 0, 1, 0]
    assert out[0]["drain_s"] == pytest.approx(2.0) and out[0]["rows_per_s"] == 500_000
    assert out[1]["drain_s"] == pytest.approx(4.0)
    assert out[1]["cpu_s_per_trace_s"] == [0.4, 0.6, 0.8] and out[1]["keeps_up"]
    assert out[0]["lag"] and all(m > 0 for _, m in out[1]["lag"])
