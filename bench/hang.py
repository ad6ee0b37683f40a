"""``failslow bench hang``: the hang detector's detection latency and root correctness on the
three hang presets against CCL-D's fixed 5-minute threshold (§6.1, the in-process
baseline), and its throughput on a 4096-rank job."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from failslow.detectors.hang import HangConfig, replay_with_ticks
from failslow.engine.analyzer import Reports, only


def _bench_case(scenario: Any, seed: int, config: HangConfig | None, tail_ns: int
                ) -> dict[str, Any]:
    import time

    from failslow.simulator import simulate

    result = simulate(scenario, seed=seed)
    tables: dict[str, pa.Table] = {}
    for kind in ("coll", "progress", "link"):
        if kind in result.kinds:
            parts = list(result.iter_tables(kind))
            if parts:
                tables[kind] = pa.concat_tables(parts)
    det = Reports(only(result.meta, {"hang"}, hang=config))
    started = time.perf_counter()
    found = [a for a in replay_with_ticks(det, tables, tail_ns=tail_ns) if a.end_ns is None]
    seconds = time.perf_counter() - started
    truth = [a for a in result.truth.anomalies if a.kind == "hang"]
    rows = sum(t.num_rows for t in tables.values())
    figures: dict[str, Any] = {"rows": rows, "seconds": round(seconds, 3),
                               "reports": len(found)}
    if truth and found:
        want, got = truth[0], found[0]
        figures["correct"] = bool(
            len(found) == 1 and got.cause == want.cause and got.ranks == want.ranks
            and sorted(got.link or []) == sorted(want.link or []) and got.comm == want.comm)
        if got.detected_ns is not None and want.start_ns is not None:
            figures["latency_s"] = round((got.detected_ns - want.start_ns) / 1e9, 3)
    return figures


def _bench_hang(args: Any) -> dict[str, Any]:
    """Detection latency and root correctness on the three hang presets against CCL-D's
    fixed 5-minute threshold (the in-process baseline), and throughput on a 4096-rank job
    (``--scale`` shrinks its data-parallel degree) with a hardware hang."""
    from failslow.simulator import scenario_from_dict

    scale = float(getattr(args, "scale", 1.0) or 1.0)
    figures: dict[str, Any] = {}
    fixed = HangConfig(floor_ns=HangConfig().ceiling_ns, silence=False)
    for name in ("hang-not-entered", "hang-inconsistent", "hang-hardware"):
        ours = _bench_case(name, 0, None, 0)
        base = _bench_case(name, 0, fixed, fixed.ceiling_ns + 10**9)
        key = name.removeprefix("hang-").replace("-", "_")
        figures[f"{key}_correct"] = ours.get("correct", False)
        figures[f"{key}_latency_s"] = ours.get("latency_s")
        figures[f"{key}_baseline_5min_latency_s"] = base.get("latency_s")
    dp = max(2, min(64, round(64 * scale)))
    sc = scenario_from_dict({"preset": "large", "iterations": 10,
                             "parallel": {"tp": 8, "pp": 8, "dp": dp, "cp": 1},
                             "faults": [{"cause": "hardware", "ranks": [1234 % (64 * dp)],
                                         "start": 6, "comm": "dp", "op": "reducescatter"}]})
    big = _bench_case(sc, 1, None, 0)
    figures.update({"large_ranks": 64 * dp, "large_rows": big["rows"],
                    "large_seconds": big["seconds"],
                    "large_rows_per_s": round(big["rows"] / max(big["seconds"], 1e-9)),
                    "large_correct": big.get("correct", False),
                    "large_latency_s": big.get("latency_s")})
    return figures


BENCHMARKS = {"hang": _bench_hang}
