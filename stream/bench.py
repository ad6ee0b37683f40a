"""``failslow bench pipeline``: the streaming path on this machine (issue 6, item 7).

A simulated job of the ``large`` preset's shape (tp8 pp8, ``64 x --scale`` data-parallel
replicas: 4096 ranks at scale 1, the simulator's operation mix) goes producer -> Kafka ->
``failslow process`` -> ClickHouse:

1. the job's trace is published to Kafka as ``failslow replay --asap`` does (100 ms windows,
   zstd Arrow IPC), while a processor (a subprocess pinned to one CPU core, embedded
   ClickHouse, raw events stored) consumes it: ``pipeline_rows_per_s`` is rows over the time
   from the first publish to the processor's last checkpoint;
2. the baseline, in the same run: a bare consumer pinned to the same core reads the same
   messages (``raw_consume_rows_per_s``; and with Arrow decoding);
3. a second processor reads the same input as a backlog with detection only
   (``--no-store-events``: raw events stored by another consumer group on another core,
   ``--no-detect``), and a third one with the detectors fed 1 s windows instead of 100 ms
   (``--window-ms 1000``, as ``failslow analyze --window-ms 1000``).

Capacity is the processor's CPU time (all its threads, pinned to one core) per iteration of
the job: overall (first message to last checkpoint, including the detectors' learning
phase) and steady (over the second half of the rows, from per-checkpoint samples). The job
keeps up in real time at one iteration per second when the steady figure is at most a
second; ``realtime_ranks_one_core*`` is the rank count where it would be exactly a second
(cost taken as proportional to ranks).
``detector_profile`` lists where the detectors spend their time (cProfile of
``JobAnalyzer`` on the same windows), since they dominate.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

WINDOW_NS = 100_000_000


@contextlib.contextmanager
def _broker() -> Iterator[str]:
    """``$FAILSLOW_KAFKA``, else the broker of ``failslow infra up``, else a temporary one."""
    from failslow import infra

    env = os.environ.get(infra.ENV_BOOTSTRAP)
    if env and infra.probe(env, timeout=10):
        yield env
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


def _produce(bootstrap: str, prefix: str, sim: Any) -> dict[str, Any]:
    from failslow.replay import replay
    from failslow.stream.kafka import KafkaTransport

    tables = {k: t for k, t in sim.tables.items() if k != "meta" and t.num_rows}
    kinds = list(tables)
    tr = KafkaTransport(bootstrap, topic_prefix=prefix, subscribe=(), partitions=1,
                        on_full="block", max_block_ms=120_000, buffer_memory=256 << 20,
                        linger_ms=20)
    try:
        if not tr.wait_connected(60):
            raise RuntimeError(f"Kafka at {bootstrap} is not reachable")
        started = time.perf_counter()
        tr.publish_meta(sim.meta)
        messages = 1
        for now, batch in replay(tables, WINDOW_NS):
            messages += tr.publish_batch(sim.meta.job, batch, watermark=now, kinds=kinds)
        tr.flush(300)
        seconds = time.perf_counter() - started
        stats = tr.stats()
    finally:
        tr.close()
    return {"messages": messages, "seconds": seconds, "bytes": stats["bytes_sent"],
            "dropped": stats["dropped"], "errors": stats["errors"], "started": started}


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
    env = dict(os.environ)
    env.pop("FAILSLOW_DATA_DIR", None)
    return subprocess.Popen(
        [sys.executable, "-m", "failslow.stream_cli", "process", "--kafka", bootstrap,
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


def _wall(stats: dict[str, Any]) -> float:
    return (int(stats["last_checkpoint_ns"]) - int(stats["first_message_ns"])) / 1e9


def _detector_profile(sim: Any, iterations: int) -> list[dict[str, Any]]:
    """Top functions (cumulative seconds) of JobAnalyzer over the job's first iterations."""
    from failslow.detectors.job import JobAnalyzer
    from failslow.replay import replay

    tables = {k: t for k, t in sim.tables.items() if k in ("coll", "progress", "link", "span")}
    windows = list(replay(tables, WINDOW_NS))
    keep = max(1, len(windows) * iterations // max(1, int(sim.stats["iterations"])))
    analyzer = JobAnalyzer(sim.meta)
    profile = cProfile.Profile()
    profile.enable()
    for now, batch in windows[:keep]:
        analyzer.update(batch)
        analyzer.on_tick(now)
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
    iterations = 8
    sim = _simulate(scale, iterations)
    core = _core()
    mine = os.sched_getaffinity(0)
    if len(mine) > 1:  # the producer (this process) keeps off the processor's core
        os.sched_setaffinity(0, mine - {core})
    try:
        return _run(sim, core, figures_base(sim, core))
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


def _run(sim: Any, core: int, figures: dict[str, Any]) -> dict[str, Any]:
    ranks, rows, done_iterations = figures["ranks"], figures["rows"], figures["iterations"]
    prefix = f"bench{uuid.uuid4().hex[:8]}."
    with _broker() as bootstrap, tempfile.TemporaryDirectory(prefix="failslow-bench-") as tmp:
        store_dir, detect_dir = Path(tmp) / "store", Path(tmp) / "detect"
        store_dir.mkdir()
        detect_dir.mkdir()
        # 1. the pipeline: the processor consumes while the producer publishes
        from failslow.stream.kafka import KafkaTransport

        KafkaTransport(bootstrap, topic_prefix=prefix, subscribe=(), partitions=1,
                       produce=False).ensure_topics()
        proc = _processor(bootstrap, prefix, store_dir, core, "--exit-when-idle", "8")
        time.sleep(3.0)  # let it join its group
        produced = _produce(bootstrap, prefix, sim)
        stats = _finish(proc, store_dir, 3600)
        end_wall = int(stats["last_checkpoint_ns"]) / 1e9
        produce_start_wall = time.time() - (time.perf_counter() - produced["started"])
        figures.update({
            "messages": produced["messages"], "megabytes": round(produced["bytes"] / 1e6, 1),
            "producer_rows_per_s": round(rows / produced["seconds"]),
            "producer_dropped": produced["dropped"] + produced["errors"],
            "pipeline_rows_per_s": round(rows / max(end_wall - produce_start_wall, 1e-9)),
            "processor_rows_per_s": round(rows / max(_cpu(stats), 1e-9)),
            "processor_cpu_s_per_iteration": round(_cpu(stats) / done_iterations, 3),
            "processor_wall_s": round(_wall(stats), 2),
            "processor_phases_s": stats["seconds"],
            "rows_written": sum(stats["rows_written"].values()),
        })
        # 2. the baseline: a bare consumer on the same core, same messages
        raw = _raw_consume(bootstrap, prefix, produced["messages"], core, decode=False)
        decoded = _raw_consume(bootstrap, prefix, produced["messages"], core, decode=True)
        raw_rate = rows / max(raw["cpu"], 1e-9)
        figures.update({
            "raw_consume_rows_per_s": round(raw_rate),
            "raw_consume_mb_per_s": round(raw["bytes"] / 1e6 / max(raw["cpu"], 1e-9), 1),
            "raw_consume_decode_rows_per_s": round(rows / max(decoded["cpu"], 1e-9)),
            "ratio_processor_to_raw_consume": round(figures["processor_rows_per_s"] / raw_rate,
                                                    4),
        })
        # 3. detection only, from the backlog; then with 1 s windows for the detectors
        proc = _processor(bootstrap, prefix, detect_dir, core, "--exit-when-idle", "8",
                          "--no-store-events")
        detect = _finish(proc, detect_dir, 3600)
        wide_dir = Path(tmp) / "wide"
        wide_dir.mkdir()
        proc = _processor(bootstrap, prefix, wide_dir, core, "--exit-when-idle", "8",
                          "--no-store-events", "--window-ms", "1000")
        wide = _finish(proc, wide_dir, 3600)
        per_iteration = rows / done_iterations
        cpu_store = _cpu(stats) / done_iterations
        cpu_detect = _cpu(detect) / done_iterations
        cpu_wide = _cpu(wide) / done_iterations
        steady_store = _steady(stats, per_iteration)
        steady_detect = _steady(detect, per_iteration)
        steady_wide = _steady(wide, per_iteration)
        figures.update({
            "detect_only_rows_per_s": round(rows / max(_cpu(detect), 1e-9)),
            "detect_only_cpu_s_per_iteration": round(cpu_detect, 3),
            "detect_only_phases_s": detect["seconds"],
            "steady_cpu_s_per_iteration": round(steady_store, 3),
            "steady_cpu_s_per_iteration_detect_only": round(steady_detect, 3),
            "steady_cpu_s_per_iteration_detect_only_1s_windows": round(steady_wide, 3),
            "realtime_ranks_one_core": int(ranks / max(cpu_store, 1e-9)),
            "realtime_ranks_one_core_detect_only": int(ranks / max(cpu_detect, 1e-9)),
            "realtime_ranks_one_core_steady": int(ranks / max(steady_store, 1e-9)),
            "realtime_ranks_one_core_detect_only_steady": int(ranks / max(steady_detect, 1e-9)),
            "keeps_up_in_real_time": steady_store <= 1.0,
            "keeps_up_in_real_time_detect_only": steady_detect <= 1.0,
            "detect_only_1s_windows_cpu_s_per_iteration": round(cpu_wide, 3),
            "realtime_ranks_one_core_detect_only_1s_windows": int(ranks / max(cpu_wide,
                                                                              1e-9)),
            "floor_4096_ranks_met": int(ranks / max(steady_store, 1e-9)) >= 4096,
            "floor_4096_ranks_met_detect_only": int(ranks / max(steady_detect, 1e-9)) >= 4096,
        })
    figures["detector_profile"] = _detector_profile(sim, min(3, done_iterations))
    return figures


BENCHMARKS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "pipeline": bench_pipeline,
}


def main(argv: list[str] | None = None) -> int:
    """``python -m failslow.stream.bench [--scale S]`` (what ``failslow bench pipeline``
    runs)."""
    parser = argparse.ArgumentParser(prog="python -m failslow.stream.bench")
    parser.add_argument("--scale", type=float, default=1.0)
    print(json.dumps(bench_pipeline(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
