"""``failslow bench pipeline``: the streaming path on this machine (issue 6, item 7).

A simulated job of the ``large`` preset's shape (tp8 pp8, ``64 x --scale`` data-parallel
replicas: 4096 ranks at scale 1, the simulator's operation mix, 12 iterations) goes producer
-> Kafka -> ``failslow process`` -> ClickHouse:

1. *pipeline*: the job's trace is published to Kafka as ``failslow replay --asap`` does
   (100 ms windows, zstd Arrow IPC) while a processor (a subprocess pinned to one CPU core,
   embedded ClickHouse, detectors on, raw events stored) consumes it: ``pipeline_rows_per_s``
   is rows over the time from the first publish to the processor's last checkpoint;
2. *raw consume*, the baseline, in the same run: a bare consumer pinned to the same core
   reads the same messages (``raw_consume_rows_per_s``; and with Arrow decoding);
3. *detect*: a processor with its own consumer group reads the same input as a backlog with
   detection only (``--no-store-events``, as when raw events are stored by another consumer
   group on another core): ``ranks_realtime_detect``;
4. *store*: a processor with its own consumer group that only stores the raw events
   (``--no-detect``): ``ranks_realtime_store``;
5. *detect, 1 s windows*: as 3 with the detectors fed 1 s windows instead of 100 ms
   (``--window-ms 1000``, as ``failslow analyze --window-ms 1000``);
6. *detect, per group*: as 3 with one group's detectors (``--detectors``,
   :data:`DETECTOR_GROUPS`): the detection stages of ``stages``, each on a core of its own,
   against 3 (every detector in one group) as their baseline;
7. *codecs*: the job published again with the other Arrow IPC codec (``lz4`` when the
   settings say ``zstd``, and the reverse; ``FAILSLOW_KAFKA_COMPRESSION``) and the stages
   of 6 run on it: per codec the bytes on Kafka, the producer's CPU seconds, and per stage
   its CPU and decoding seconds per second of trace (``codecs``);
8. *reducer processes* (``--processes N``): the job's evidence reduced by 1, 2, ... N
   processes side by side, their drain time, rows per second, CPU and consumer lag over
   time (``reducer_processes``, :mod:`.reducer_scaling`; 1 process is their baseline).

Capacity is a processor's CPU time (all its threads, pinned to one core) per iteration of
the job, measured as rows over CPU seconds: *overall* (first message to last checkpoint,
including the detectors' learning phase) and *steady* (over the second half of the rows,
from per-checkpoint samples). A job keeps up in real time at one iteration per second when
its CPU time per iteration is at most a second; ``ranks_realtime_*`` is the rank count where
it would be exactly a second, from the larger (conservative) of the overall and steady CPU
times (``*_overall`` and ``*_steady`` give each; cost taken as proportional to ranks: at
scale 1 the job itself
has 4096 ranks, so ``ranks_realtime_* >= 4096`` is measured, not extrapolated, and the floor
of issue 6 is ``ranks_realtime_detect >= 4096``). ``ratio_*_to_raw_consume`` divides each
processor's rows per CPU second by the bare consumer's, measured in the same run on the same
core. ``detector_profile`` lists where the detectors spend their time (cProfile of
``JobAnalyzer`` on the same windows).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from failslow.bench.reducer_scaling import reducer_scaling
from failslow.settings import environment, get_settings

WINDOW_NS = 100_000_000


@contextlib.contextmanager
def _broker() -> Iterator[str]:
    """``$FAILSLOW_KAFKA``, else the broker of ``failslow infra up``, else a temporary one."""
    from failslow.infra import kafka_broker as infra

    configured = get_settings().kafka.bootstrap
    if configured and infra.probe(configured, timeout=10):
        yield configured
        return
    status = infra.kafka_status(check=True)
    if status.running and status.ready:
        yield status.bootstrap
        return
    with tempfile.TemporaryDirectory(prefix="failslow-bench-kafka-") as state:
        started = infra.kafka_up(0, state_dir=state, max_lifetime=3600, timeout=150)
        try:
            yield started.bootstrap
        finally:
            infra.kafka_down(state)


def _core() -> int:
    """The CPU the processors are pinned to (the last one this process may use)."""
    return max(os.sched_getaffinity(0))


def _pinned(core: int) -> Callable[[], None]:
    def pin() -> None:
        os.sched_setaffinity(0, {core})
    return pin


def _simulate(scale: float, iterations: int) -> Any:
    from failslow.simulator import scenario_from_dict, simulate

    dp = max(1, round(64 * scale))
    sc = scenario_from_dict({"preset": "large", "iterations": iterations,
                             "parallel": {"tp": 8, "pp": 8, "dp": dp, "cp": 1},
                             "faults": [], "job": f"bench-{64 * dp}"})
    return simulate(sc, 0)


def _produce(bootstrap: str, prefix: str, sim: Any, codec: str | None = "settings"
             ) -> dict[str, Any]:
    """Publish the job's trace as ``failslow replay --asap`` does; ``codec``: the IPC
    codec (``"settings"``: ``FAILSLOW_KAFKA_COMPRESSION``)."""
    from failslow.replay import replay
    from failslow.stream.kafka import KafkaTransport

    tables = {k: t for k, t in sim.tables.items() if k != "meta" and t.num_rows}
    kinds = list(tables)
    tr = KafkaTransport(bootstrap, topic_prefix=prefix, subscribe=(), partitions=1,
                        on_full="block", max_block_ms=120_000, buffer_memory=256 << 20,
                        linger_ms=20, ipc_compression=codec)
    try:
        if not tr.wait_connected(60):
            raise RuntimeError(f"Kafka at {bootstrap} is not reachable")
        started, cpu0 = time.perf_counter(), time.process_time()
        tr.publish_meta(sim.meta)
        messages = 1
        for now, batch in replay(tables, WINDOW_NS):
            messages += tr.publish_batch(sim.meta.job, batch, watermark=now, kinds=kinds)
        tr.flush(300)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu0
        stats = tr.stats()
    finally:
        tr.close()
    return {"messages": messages, "seconds": seconds, "cpu": cpu, "bytes": stats["bytes_sent"],
            "dropped": stats["dropped"], "errors": stats["errors"], "started": started,
            "codec": tr.ipc_compression or "none"}


_RAW_CONSUMER = """
import json, sys, time
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import decode
bootstrap, prefix, total, do_decode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
tr = KafkaTransport(bootstrap, topic_prefix=prefix, group_id="raw-" + prefix + sys.argv[4],
                    produce=False, partitions=1)
got = size = rows = 0
first = None
tr.poll(1, timeout=0)  # connect (the CPU time of joining the group is negligible)
cpu0 = time.process_time()  # all threads: kafka-python fetches on its network thread
deadline = time.monotonic() + 600
while got < total and time.monotonic() < deadline:
    batch = tr.poll(1000, timeout=1.0)
    if batch and first is None:
        first = time.perf_counter()
    for m in batch:
        size += len(m.value)
        if do_decode:
            rows += decode(m)[1].num_rows
    got += len(batch)
end, cpu1 = time.perf_counter(), time.process_time()
tr.close()
print(json.dumps({"messages": got, "bytes": size, "rows": rows,
                  "seconds": end - (first or end), "cpu": cpu1 - cpu0}))
"""


def _raw_consume(bootstrap: str, prefix: str, messages: int, core: int,
                 decode: bool) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _RAW_CONSUMER, bootstrap, prefix,
                          str(messages), "1" if decode else "0"],
                         capture_output=True, text=True, timeout=900,
                         preexec_fn=_pinned(core))
    if out.returncode != 0:
        raise RuntimeError(f"raw consumer failed: {out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _processor(bootstrap: str, prefix: str, data_dir: Path, core: int, *args: str
               ) -> subprocess.Popen[str]:
    env = environment()
    env.pop("FAILSLOW_DATA_DIR", None)
    return subprocess.Popen(
        [sys.executable, "-m", "failslow", "process", "--kafka", bootstrap,
         "--topic-prefix", prefix, "--group", f"bench-{uuid.uuid4().hex[:8]}",
         "--data-dir", str(data_dir), "--metrics-port", "-1", "--partitions", "1",
         "--stats-json", str(data_dir / "stats.json"), *args],
        env=env, stdout=subprocess.DEVNULL, stderr=(data_dir / "process.log").open("w"),
        text=True, preexec_fn=_pinned(core))


def _finish(proc: subprocess.Popen[str], data_dir: Path, timeout: float) -> dict[str, Any]:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError("the processor did not finish; log: "
                           + (data_dir / "process.log").read_text()[-2000:]) from None
    if code != 0 or not (data_dir / "stats.json").exists():
        raise RuntimeError(f"the processor failed ({code}): "
                           + (data_dir / "process.log").read_text()[-2000:])
    return dict(json.loads((data_dir / "stats.json").read_text()))


def _cpu(stats: dict[str, Any]) -> float:
    return float(stats["cpu_last_checkpoint_s"]) - float(stats["cpu_first_message_s"])


def _steady(stats: dict[str, Any], rows_per_iteration: float) -> float:
    """CPU seconds per iteration over the second half of the rows (past the detectors'
    learning phase), from the processor's per-checkpoint samples; the overall figure when
    there are too few samples."""
    samples = [(float(c), int(r)) for c, r in stats.get("cpu_samples", [])]
    if len(samples) >= 3:
        total = samples[-1][1]
        mid = next((s for s in samples if s[1] >= total / 2), samples[0])
        last = samples[-1]
        if last[1] > mid[1]:
            return (last[0] - mid[0]) / (last[1] - mid[1]) * rows_per_iteration
    return _cpu(stats) / max(1.0, total_iterations(stats, rows_per_iteration))


def total_iterations(stats: dict[str, Any], rows_per_iteration: float) -> float:
    return sum(stats["rows"].values()) / max(rows_per_iteration, 1.0)


def _detector_profile(sim: Any, iterations: int) -> list[dict[str, Any]]:
    """Top functions (cumulative seconds) of JobAnalyzer over the job's first iterations."""
    from failslow.engine.analyzer import JobAnalyzer
    from failslow.engine.runner import run
    from failslow.replay import replay

    tables = {k: t for k, t in sim.tables.items() if k in ("coll", "progress", "link", "span")}
    windows = list(replay(tables, WINDOW_NS))
    keep = max(1, len(windows) * iterations // max(1, int(sim.stats["iterations"])))
    analyzer = JobAnalyzer(sim.meta)
    profile = cProfile.Profile()
    profile.enable()
    run(analyzer, windows[:keep])
    profile.disable()
    stats = pstats.Stats(profile)
    rows = []
    for (filename, line, name), (_, _, _, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "/detectors/" in filename:
            rows.append({"function": f"{Path(filename).name}:{line}:{name}",
                         "cumulative_s": round(cumulative, 3)})
    rows.sort(key=lambda r: -r["cumulative_s"])
    return rows[:12]


def bench_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    scale = float(getattr(args, "scale", 1.0) or 1.0)
    # enough iterations for the second half (the steady figures) to follow the detectors'
    # learning phase (a rank's period is committed once it covers four iterations)
    iterations = int(getattr(args, "iterations", None) or 12)
    sim = _simulate(scale, iterations)
    core = _core()
    mine = os.sched_getaffinity(0)
    if len(mine) > 1:  # the producer (this process) keeps off the processor's core
        os.sched_setaffinity(0, mine - {core})
    try:
        processes = int(getattr(args, "processes", 0) or 0)
        return _run(sim, core, figures_base(sim, core), processes, sorted(mine))
    finally:
        os.sched_setaffinity(0, mine)


def figures_base(sim: Any, core: int) -> dict[str, Any]:
    ranks = int(sim.meta.world_size)
    rows = int(sum(t.num_rows for t in sim.tables.values()))
    done = int(sim.stats["iterations"])
    return {"ranks": ranks, "iterations": done, "rows": rows,
            "rows_per_rank_iteration": round(rows / ranks / done, 1),
            "simulated_iteration_s": round(float(sim.stats["baseline_iteration_s"]), 3),
            "processor_core": core}


def _phase(stats: dict[str, Any], rows: int, done_iterations: int, ranks: int,
           raw_rate: float) -> dict[str, Any]:
    """The capacity figures of one processor run (see the module docstring)."""
    per_iteration = rows / max(done_iterations, 1)
    cpu = _cpu(stats)
    overall = cpu / max(done_iterations, 1)
    steady = _steady(stats, per_iteration)
    seen = int(sum(stats["rows"].values()))
    return {
        "rows_seen": seen, "complete": seen >= rows,
        "rows_by_kind": {str(k): int(v) for k, v in stats["rows"].items() if v},
        "rows_per_s": round(rows / max(cpu, 1e-9)),
        "cpu_s_per_iteration": round(overall, 3),
        "steady_cpu_s_per_iteration": round(steady, 3),
        # the headline is the lower (more conservative) of the two: the overall figure
        # carries the one-off learning phase, the steady one the order in which a backlog's
        # topics are fetched (one kind may dominate a half) and any state snapshot in it
        "ranks_realtime": int(ranks / max(steady, overall, 1e-9)),
        "ranks_realtime_steady": int(ranks / max(steady, 1e-9)),
        "ranks_realtime_overall": int(ranks / max(overall, 1e-9)),
        "ratio_to_raw_consume": round(rows / max(cpu, 1e-9) / max(raw_rate, 1e-9), 4),
        "phases_s": stats["seconds"],
    }


def _run(sim: Any, core: int, figures: dict[str, Any], processes: int = 0,
         cores: Sequence[int] = ()) -> dict[str, Any]:
    ranks, rows, done_iterations = figures["ranks"], figures["rows"], figures["iterations"]
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    with _broker() as bootstrap, tempfile.TemporaryDirectory(prefix="failslow-bench-") as tmp:
        # 1. the pipeline: the processor consumes while the producer publishes
        from failslow.stream.kafka import KafkaTransport

        KafkaTransport(bootstrap, topic_prefix=prefix, subscribe=(), partitions=1,
                       produce=False).ensure_topics()
        live_dir = Path(tmp) / "live"
        live_dir.mkdir()
        proc = _processor(bootstrap, prefix, live_dir, core, "--exit-when-idle", "30")
        time.sleep(3.0)  # let it join its group
        produced = _produce(bootstrap, prefix, sim)
        live = _finish(proc, live_dir, 3600)
        end_wall = int(live["last_checkpoint_ns"]) / 1e9
        produce_start_wall = time.time() - (time.perf_counter() - produced["started"])
        figures.update({
            "messages": produced["messages"], "megabytes": round(produced["bytes"] / 1e6, 1),
            "producer_rows_per_s": round(rows / produced["seconds"]),
            "producer_dropped": produced["dropped"] + produced["errors"],
            "pipeline_rows_per_s": round(rows / max(end_wall - produce_start_wall, 1e-9)),
            "pipeline_complete": int(sum(live["rows"].values())) >= rows,
            "rows_written": sum(live["rows_written"].values()),
        })
        # 2. the baseline: a bare consumer on the same core, same messages
        raw = _raw_consume(bootstrap, prefix, produced["messages"], core, decode=False)
        decoded = _raw_consume(bootstrap, prefix, produced["messages"], core, decode=True)
        raw_rate = rows / max(raw["cpu"], 1e-9)
        figures.update({
            "raw_consume_rows_per_s": round(raw_rate),
            "raw_consume_mb_per_s": round(raw["bytes"] / 1e6 / max(raw["cpu"], 1e-9), 1),
            "raw_consume_decode_rows_per_s": round(rows / max(decoded["cpu"], 1e-9)),
            # the same capacity measure for the bare consumer (one iteration per second)
            "ranks_realtime_raw_consume": int(raw_rate * done_iterations / rows * ranks),
        })
        phases: dict[str, dict[str, Any]] = {
            "pipeline": _phase(live, rows, done_iterations, ranks, raw_rate)}
        # 3-5. from the backlog, each with its own consumer group on the same core
        runs = {"detect": ("--no-store-events",), "store": ("--no-detect",),
                "detect_1s_windows": ("--no-store-events", "--window-ms", "1000")}
        # 6. the detection split over consumer groups by detector (process --detectors)
        runs.update({f"detect_{group}": ("--no-store-events", *flags)
                     for group, flags in DETECTOR_GROUPS})
        # the slow-down group's baselines: reducing the rows itself (the split before the
        # evidence reducers had groups of their own), and tracking the iterations too
        runs["detect_slowdown_own_evidence"] = ("--no-store-events", "--detectors",
                                                "slowdown,linkrate", "--import",
                                                "iterations")
        runs["detect_slowdown_own_tracker"] = ("--no-store-events", "--detectors",
                                               "slowdown,linkrate")
        for name, extra in runs.items():
            run_dir = Path(tmp) / name
            run_dir.mkdir()
            proc = _processor(bootstrap, prefix, run_dir, core, "--exit-when-idle", "8",
                              *extra)
            phases[name] = _phase(_finish(proc, run_dir, 3600), rows, done_iterations,
                                  ranks, raw_rate)
        for name, ph in phases.items():
            figures[f"ranks_realtime_{name}"] = ph["ranks_realtime"]
            figures[f"ranks_realtime_{name}_steady"] = ph["ranks_realtime_steady"]
            figures[f"ranks_realtime_{name}_overall"] = ph["ranks_realtime_overall"]
            figures[f"{name}_rows_per_s"] = ph["rows_per_s"]
            figures[f"ratio_{name}_to_raw_consume"] = ph["ratio_to_raw_consume"]
        detect, store = phases["detect"], phases["store"]
        figures.update({
            "keeps_up_in_real_time_detect": detect["ranks_realtime"] >= ranks,
            "keeps_up_in_real_time_store": store["ranks_realtime"] >= ranks,
            "floor_4096_ranks_met_detect": detect["ranks_realtime"] >= 4096,
            "floor_4096_ranks_met_store": store["ranks_realtime"] >= 4096,
            "phases": phases,
        })
        figures.update(stage_figures(phases, figures))
        # 8. one job's evidence reduced by 1..N processes side by side (--processes N)
        if processes:
            figures["reducer_processes"] = reducer_scaling(
                bootstrap, prefix, Path(tmp), range(1, processes + 1), cores or [core],
                figures, lambda d, c, group, *a: _processor(bootstrap, prefix, d, c,
                                                            "--group", group, *a),
                lambda p, d: _finish(p, d, 3600), _cpu)
        # 7. the stages again on messages of the other IPC codec (FAILSLOW_KAFKA_COMPRESSION)
        figures["codecs"] = {produced["codec"]: _codec_figures(produced, phases, figures)}
        other = "lz4" if produced["codec"] != "lz4" else "zstd"
        prefix2 = f"bench{uuid.uuid4().hex[:8]}."
        produced2 = _produce(bootstrap, prefix2, sim, other)
        phases2: dict[str, dict[str, Any]] = {}
        for name, phase, _ in STAGES:
            run_dir = Path(tmp) / f"{other}-{name}"
            run_dir.mkdir()
            proc = _processor(bootstrap, prefix2, run_dir, core, "--exit-when-idle", "8",
                              *runs[phase])
            phases2[phase] = _phase(_finish(proc, run_dir, 3600), rows, done_iterations,
                                    ranks, raw_rate)
        figures["codecs"][other] = _codec_figures(produced2, phases2, figures)
    figures["detector_profile"] = _detector_profile(sim, min(3, done_iterations))
    return figures


def _codec_figures(produced: dict[str, Any], phases: dict[str, dict[str, Any]],
                   figures: dict[str, Any]) -> dict[str, Any]:
    """One IPC codec: the bytes on Kafka, the producer's CPU seconds (this process: replay
    and encoding), and per stage its CPU seconds per second of trace, the share of it spent
    decoding messages, and the ranks one core keeps up with."""
    trace_s = figures["iterations"] * figures["simulated_iteration_s"]
    stages = []
    for name, phase, _ in STAGES:
        per_trace_s = phases[phase]["cpu_s_per_iteration"] * figures["iterations"] / trace_s
        decode = phases[phase]["phases_s"].get("decode", 0.0) / trace_s
        stages.append({"name": name, "cpu_s_per_trace_s": round(per_trace_s, 3),
                       "decode_cpu_s_per_trace_s": round(decode, 3),
                       "ranks_per_core": int(figures["ranks"] / max(per_trace_s, 1e-9))})
    return {"megabytes": round(produced["bytes"] / 1e6, 1),
            "producer_cpu_s": round(produced["cpu"], 2), "stages": stages}


#: One job's detection split over consumer groups, as the README and docker-compose.yml
#: run it (``failslow process --detectors``): group name and its flags. The group that
#: tracks the iterations exports them to the slow-down group (``--export``/``--import``),
#: so it runs first.
DETECTOR_GROUPS = (("track", ("--detectors", "iterations", "--export", "iterations")),
                   *((f"reduce{i}", ("--detectors", "evidence", "--shard", f"{i}/2",
                                     "--import", "iterations", "--export", "evidence"))
                     for i in range(2)),
                   ("slowdown", ("--detectors", "slowdown,linkrate",
                                 "--import", "iterations,evidence")),
                   ("hang", ("--detectors", "hang")))
#: Groups whose work for one job is spread over processes (the evidence shards).
SHARDED_GROUPS = frozenset({"reduce0", "reduce1"})

#: The stages of the pipeline today, the processor run that measures each, and whether one
#: job's work in it can be spread over processes (issue 13 item 3): storing, and detection
#: in its consumer groups. ``detect`` (every detector in one group) is their baseline.
STAGES = (("store", "store", False),
          *((f"detect-{group}", f"detect_{group}", group in SHARDED_GROUPS)
            for group, _ in DETECTOR_GROUPS))


def stage_figures(phases: dict[str, dict[str, Any]], figures: dict[str, Any]
                  ) -> dict[str, Any]:
    """Issue 13's keys: per stage its CPU seconds per second of trace and the ranks one core
    keeps up with; the cores a 16,384- and a 65,536-rank job need (None: a stage one job
    cannot spread over processes and one core does not keep up with); the job-level stage's
    input against the raw ``coll`` stream."""
    trace_s = figures["iterations"] * figures["simulated_iteration_s"]

    def stage(name: str, phase: str, shardable: bool) -> dict[str, Any]:
        cpu = phases[phase]["cpu_s_per_iteration"] * figures["iterations"]
        per_trace_s = cpu / max(trace_s, 1e-9)
        return {"name": name, "shardable": shardable,
                "cpu_s_per_trace_s": round(per_trace_s, 3),
                "ranks_per_core": int(figures["ranks"] / max(per_trace_s, 1e-9))}

    stages = [stage(*s) for s in STAGES]

    def cores(ranks: int) -> int | None:
        total = 0
        for st in stages:
            need = -(-ranks // max(st["ranks_per_core"], 1))
            if need > 1 and not st["shardable"]:
                return None  # one process per job: more cores do not help
            total += need
        return total

    return {"stages": stages, "cores_for_16384_ranks": cores(16384),
            "cores_for_65536_ranks": cores(65536),
            # the baselines: every detector in one consumer group; the slow-down group
            # tracking the iterations itself
            "detect_in_one_group": stage("detect", "detect", False),
            **{base: stage(base.replace("_", "-"), base, False)
               for base in ("detect_slowdown_own_evidence", "detect_slowdown_own_tracker")
               if base in phases},
            # the job-level stage (the slow-down group) against the raw coll stream
            **job_stage_rows(phases)}


def job_stage_rows(phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The rows the job-level stage (the slow-down group) reads, by kind, and the raw
    ``coll`` rows over them (None: not measured)."""
    job = phases.get("detect_slowdown", {}).get("rows_by_kind")
    raw = phases.get("store", {}).get("rows_by_kind", {}).get("coll")
    if not job or not raw:
        return {"job_stage_rows": job, "job_stage_row_ratio": None}
    return {"job_stage_rows": job,
            "job_stage_row_ratio": round(raw / max(sum(job.values()), 1), 3)}


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "pipeline": bench_pipeline,
}
