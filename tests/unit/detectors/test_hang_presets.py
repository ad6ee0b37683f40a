"""Hang detector end to end on the simulator presets, and its vectorised building blocks
against plain reference implementations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.hang_jobs import (
    MS,
    T0,
    TPC,
    Job,
    S,
    feed,
    timeline,
    tp_rows,
    two_rank_meta,
)
from support.snapshots import roundtrip

from failslow import events
from failslow.detectors.hang import HangConfig, HangDetector
from failslow.diagnosis import Anomaly

# ---------------------------------------------------------------------------------------------
# end to end on the simulator presets


PRESETS = ("hang-not-entered", "hang-inconsistent", "hang-hardware")


def _analyze(path: Path, tick: int = 100 * MS) -> list[Anomaly]:
    """Read a trace directory and replay it through the detector, ticking through gaps."""
    from failslow.tracedir import TraceDir

    td = TraceDir(path)
    tables = {k: td.read(k) for k in td.kinds if k in ("coll", "progress", "link")}
    return feed(HangDetector(td.meta()), timeline(tables, tick))


def _simulated(scenario: Any, out: Path, seed: int = 0) -> tuple[list[Anomaly], list[Any]]:
    from failslow import simulator as sim

    result = sim.simulate(scenario, seed=seed)
    sim.write_sim(result, out, "parquet")
    found = _analyze(out)
    truth = json.loads((out / "truth.json").read_text())
    return found, [a for a in truth["anomalies"] if a["kind"] == "hang"]


def _assert_matches(found: list[Anomaly], hangs: list[dict[str, Any]]) -> float:
    """Exactly one report per true hang with its cause, root rank, link, communicator and
    stage; returns the detection latency in seconds after the true start."""
    opened = [a for a in found if a.end_ns is None]
    assert len(hangs) == 1 and len(opened) == 1, [a.to_dict() for a in opened]
    want, got = hangs[0], opened[0]
    assert (got.cause, got.ranks) == (want["cause"], want["ranks"])
    assert sorted(got.link or []) == sorted(want.get("link") or [])
    assert (got.comm, got.comm_kind, got.stage) == (want["comm"], want["comm_kind"],
                                                     want["stage"])
    assert got.detected_ns is not None and got.start_ns is not None
    assert abs(got.start_ns - want["start_ns"]) < 100 * MS
    return (got.detected_ns - want["start_ns"]) / S


@pytest.mark.parametrize("preset", PRESETS)
def test_simulator_hang_presets(preset: str, tmp_path: Path) -> None:
    found, hangs = _simulated(preset, tmp_path / preset)
    latency = _assert_matches(found, hangs)
    # floor 1 s + 100 ms ticks; a member that never entered: the host-pause allowance
    low = HangConfig().idle_floor_ns / S if preset == "hang-not-entered" else 0.5
    assert low - 0.1 < latency < low + 1.0


@pytest.mark.parametrize("fault", [
    {"cause": "not_entered", "ranks": [21], "comm": "pp", "phase": "forward", "microbatch": 5},
    {"cause": "not_entered", "ranks": [42], "comm": "pp", "phase": "backward", "microbatch": 1},
    {"cause": "not_entered", "ranks": [63], "comm": "dp", "op": "allgather"},
    {"cause": "inconsistent", "ranks": [5], "comm": "tp", "mismatch": "op", "microbatch": 4},
    {"cause": "hardware", "ranks": [42], "comm": "tp", "phase": "backward", "microbatch": 6},
    {"cause": "hardware", "ranks": [63], "comm": "pp", "phase": "forward", "microbatch": 3},
])
def test_simulator_hang_variants(fault: dict[str, Any], tmp_path: Path) -> None:
    """Other communicators, passes and ranks than the presets; pipeline halts name the pass
    and micro-batch (MEGATRACE §III-C "which stage")."""
    from failslow import simulator as sim

    sc = sim.scenario_from_dict({"preset": "healthy", "iterations": 14,
                                 "faults": [{"start": 8, **fault}]})
    found, hangs = _simulated(sc, tmp_path / "t", seed=3)
    _assert_matches(found, hangs)
    if fault["comm"] == "pp":
        got = next(a for a in found if a.end_ns is None)
        assert (got.extra["pass"], got.extra["microbatch"]) == (fault["phase"],
                                                                fault["microbatch"])


@pytest.mark.parametrize("shape,fault", [
    # H2 between two members calling each other's operation: the sibling data-parallel
    # group (other context-parallel index) shows which one was due
    ((1, 1, 2, 2, 4, "1f1b"), {"cause": "inconsistent", "ranks": [0], "comm": "dp",
                               "op": "reducescatter", "mismatch": "op"}),
    # ... and with no sibling (one context-parallel group per stage): the operation the pair
    # called one iteration earlier at that point of the schedule
    ((1, 4, 1, 2, 8, "gpipe"), {"cause": "inconsistent", "ranks": [1], "comm": "cp",
                                "phase": "backward", "microbatch": 2, "mismatch": "op"}),
    # a tensor-parallel halt in the last stage, whose 1F1B gaps hold a forward and a
    # backward: the second all-reduce of micro-batch 2's backward
    ((2, 4, 2, 1, 8, "1f1b"), {"cause": "hardware", "ranks": [13], "comm": "tp",
                               "phase": "backward", "microbatch": 2, "index": 1}),
    # no data parallelism: the first forward follows the previous iteration's cool-down
    ((2, 4, 1, 1, 4, "1f1b"), {"cause": "inconsistent", "ranks": [0], "comm": "tp",
                               "phase": "forward", "microbatch": 0}),
    # a data-parallel round entered by replicas an iteration ahead is not the halt point
    # of a root whose tensor-parallel peer waits in its cool-down backward
    ((4, 3, 4, 1, 2, "1f1b"), {"cause": "not_entered", "ranks": [8], "comm": "tp",
                               "phase": "backward", "microbatch": 1, "index": 1}),
])
def test_simulator_hang_shapes(shape: tuple[int, int, int, int, int, str],
                               fault: dict[str, Any]) -> None:
    """Small shapes that exercise the tie-breaks of H2 and the placement of halt points in
    the schedule (pass, micro-batch, 1F1B phase: MEGATRACE §III-C step 3)."""
    from failslow.bench.accuracy_hang import Case, Shape, run_case, schedule_phase

    tp, pp, dp, cp, mb, sched = shape
    sh = Shape("t", tp, pp, dp, cp, mb, sched)
    expect: dict[str, Any] = {"op": fault["op"]} if fault["comm"] == "dp" else {
        "pass": fault["phase"], "microbatch": fault["microbatch"],
        "schedule_phase": schedule_phase(sh, fault["ranks"][0] // (tp * cp * dp),
                                         fault["phase"], fault["microbatch"])}
    spec = {"job": "shape", "parallel": {"tp": tp, "pp": pp, "dp": dp, "cp": cp},
            "microbatches": mb, "schedule": sched, "iterations": 6,
            "sampling": {"gpu_ms": 0.0, "hang_tail_s": 12.0},
            "faults": [{"start": 3, **fault}]}
    res = run_case(Case("t", "hang", sh, spec, seed=7, cause=fault["cause"], expect=expect))
    assert len(res.reports) == 1 and all(res.checks.values()), (
        res.checks, [a.to_dict() for a in res.reports])


def test_stage_program_is_megatrons_schedule() -> None:
    """The detector's own rebuild of the 1F1B / GPipe stage programs (MEGATRACE §III-C)
    agrees with the simulator's (both after Megatron-LM's non-interleaved schedules)."""
    from failslow.detectors.hang import stage_program
    from failslow.simulator.schedule import BWD, DPSYNC, FWD, P2P, build_program

    for sched in ("1f1b", "gpipe"):
        for pp in (1, 2, 3, 4, 8):
            for mb in (1, 2, 3, 8):
                for stage in range(pp):
                    theirs: list[tuple[str, Any]] = []
                    for st in build_program(sched, stage, pp, mb):
                        if st.kind in (FWD, BWD):
                            theirs.append(("F" if st.kind == FWD else "B", st.mb))
                        elif st.kind == DPSYNC:
                            theirs.append(("D", st.dp_op))
                        elif st.kind == P2P:
                            theirs.append(("P", tuple((o.send, o.grad, o.mb) for o in st.ops)))
                    assert stage_program(sched, stage, pp, mb) == theirs, (sched, pp, mb, stage)


@pytest.mark.parametrize("preset", ["healthy", "link", "gpipe"])
def test_simulator_slow_or_healthy_presets_raise_no_hang(preset: str, tmp_path: Path) -> None:
    found, hangs = _simulated(preset, tmp_path / preset)
    assert hangs == [] and found == []


def test_bench_hang_figures() -> None:
    """``failslow bench hang``: ours within ~1 s of the hang start on every preset, the
    fixed 5-minute threshold (CCL-D's setting, the baseline) after 300 s."""
    import argparse

    from failslow.bench.hang import BENCHMARKS

    figures = BENCHMARKS["hang"](argparse.Namespace(scale=1 / 32, json=True))
    for key in ("not_entered", "inconsistent", "hardware"):
        assert figures[f"{key}_correct"] is True
        low = HangConfig().idle_floor_ns / S if key == "not_entered" else 0.5
        assert low - 0.1 < figures[f"{key}_latency_s"] < low + 1.0
        assert 299.0 < figures[f"{key}_baseline_5min_latency_s"] < 302.0
    assert figures["large_correct"] is True and figures["large_ranks"] == 128
    json.dumps(figures)


# ---------------------------------------------------------------------------------------------
# the vectorised building blocks give what the plain sorts give (issue 3 item 10: speed
# without a change of behaviour)


def _reference_match(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> np.ndarray:
    first: dict[tuple[int, ...], int] = {}
    for i, key in enumerate(zip(*(x.tolist() for x in a), strict=True)):
        first.setdefault(key, i)
    return np.array([first.get(key, -1) for key in zip(*(x.tolist() for x in b), strict=True)],
                    dtype=np.int64)


@pytest.mark.parametrize("seq_top", [50, 2**40, 2**62])
def test_match_is_the_first_equal_key_packed_or_not(seq_top: int) -> None:
    from failslow.detectors.hang.tables import _match

    rng = np.random.default_rng(seq_top % 1000)
    n = 3000
    a = (rng.integers(0, 40, n), rng.integers(0, 4096, n), rng.integers(0, seq_top, n))
    # repeated keys in a (the first one counts) and keys of b both inside and outside a
    a = tuple(np.concatenate([x, x[:200]]) for x in a)
    pick = rng.integers(0, n, 2000)
    b = tuple(np.concatenate([x[pick], rng.integers(0, 40, 500) + 41 * (j == 0)])
              for j, x in enumerate(a))
    got = _match(a, b)
    assert (got == _reference_match(a, b)).all()
    assert (got[:2000] >= 0).all() and (got[2000:] == -1).all()
    unique = tuple(x[:n] for x in a)
    if len(set(zip(*(x.tolist() for x in unique), strict=True))) == n:
        assert (_match(unique, b) == _reference_match(unique, b)).all()


def test_rank_time_and_group_orders_equal_lexsort() -> None:
    from failslow.detectors.hang.tables import _group_order, _rank_time_order

    rng = np.random.default_rng(3)
    for top in (100, 70_000):
        rank = rng.integers(0, top, 5000)
        t = np.sort(rng.integers(0, 2000, 5000))          # time order, with ties
        seq = rng.integers(0, 5, 5000)                     # ties in (rank, t) out of order
        assert (_rank_time_order(rank, t) == np.lexsort((t, rank))).all()
        assert (_rank_time_order(rank, t, seq) == np.lexsort((seq, t, rank))).all()
        shuffled = rng.permutation(t)                      # not in time order
        assert (_rank_time_order(rank, shuffled, seq)
                == np.lexsort((seq, shuffled, rank))).all()
        grow = np.arange(5000)                             # seq rising within each key
        for key in (rank, rank.astype(np.int64) << 40):
            assert (_group_order(key, grow) == np.lexsort((grow, key))).all()
            assert (_group_order(key, seq) == np.lexsort((seq, key))).all()
            order = _group_order(key, seq, any_order=True)
            k, s = key[order], seq[order]
            # grouped: each key one run, seq non-decreasing inside it
            runs = np.flatnonzero(np.diff(k) != 0)
            assert len(runs) + 1 == len(np.unique(key))
            assert not ((k[1:] == k[:-1]) & (s[1:] < s[:-1])).any()


def test_snapshot_ring_is_compressed_and_old_snapshots_restore() -> None:
    job = Job(iterations=4)
    steps = timeline(job.run())
    det = HangDetector(job.meta())
    feed(det, steps[: len(steps) // 2])
    state = roundtrip(det.snapshot())
    assert "ring_z" in state["ranks"] and "ring" not in state["ranks"]
    old = roundtrip(state)
    old["ranks"].pop("ring_z")
    from failslow.detectors.hang.state import _pack

    old["ranks"]["ring"] = _pack(det.ranks.ring)
    for s in (state, old):
        det2 = HangDetector(job.meta())
        det2.restore(s)
        assert (det2.ranks.ring == det.ranks.ring).all()
        for r in range(job.meta().world_size):
            a, b = det.recent_ops(r), det2.recent_ops(r)
            assert all((a[c] == b[c]).all() for c in a)


def test_signature_book_counted_per_batch_equals_counting_into_the_dict() -> None:
    """The per-batch signature counts merged later (CCL-D §4.2.2 tie-break history) give the
    same book, in the same order, as counting each batch straight into it, also when the
    book overflows ``4 x max_signatures`` and keeps the most frequent."""
    rng = np.random.default_rng(5)
    for max_sig in (10_000, 6):
        lazy = HangDetector(two_rank_meta(), HangConfig(max_signatures=max_sig))
        eager = HangDetector(two_rank_meta(), HangConfig(max_signatures=max_sig))
        for k in range(150):
            n = int(rng.integers(1, 40))
            ci = rng.integers(0, 12, n).astype(np.int64)
            op = rng.integers(0, 4, n).astype(np.int64)
            nbytes = rng.choice([4, 1 << 20, 3 << 20, 1 << 40], n).astype(np.int64)
            if k == 70:                      # a size that does not pack: counted at once
                nbytes[0] = 1 << 50
            lazy.signatures.count(ci, op, nbytes)
            eager.signatures.count_now(ci, op, nbytes)
            if k % 37 == 0:
                assert list(lazy.signatures.book.items()) == list(eager.signatures.book.items())
        assert list(lazy.signatures.book.items()) == list(eager.signatures.book.items())
        if max_sig == 6:
            assert len(eager.signatures.book) <= 4 * max_sig


def test_ends_in_the_batch_of_their_enters_with_duplicates_and_orphans() -> None:
    """An end is matched with the operation in flight before the batch first, then with
    the batch's own enters; a duplicate enter of an operation in flight is ignored, a
    duplicate end completes once (its latest time), and an end whose enter comes later
    waits for it. Nothing is left in flight, and the learned durations are the latest end
    less the first enter."""
    t = T0 + S
    first = tp_rows(0, 0, t) + tp_rows(1, 0, t + 1)             # in flight before
    second = (tp_rows(0, 0, t + 5) + tp_rows(1, 1, t + 10, t + 4 * MS)   # dup enter, same batch
              + [{**tp_rows(0, 0, 0, t + 2 * MS)[1]}, {**tp_rows(0, 0, 0, t + 3 * MS)[1]},
                 {**tp_rows(1, 0, 0, t + 3 * MS)[1]},
                 {**tp_rows(0, 1, 0, t + 6 * MS)[1]}])           # end before its enter
    third = tp_rows(0, 1, t + 4 * MS)
    det = HangDetector(two_rank_meta())
    det.update({"coll": events.from_rows("coll", first)})
    det.update({"coll": events.from_rows("coll", second)})
    assert len(det.flight.fl["t"]) == 0
    assert det.flight.orphans["seq"].tolist() == [1]
    det.update({"coll": events.from_rows("coll", third)})
    assert len(det.flight.fl["t"]) == 0 and len(det.flight.orphans["t"]) == 0
    assert int(det.durations.tail.max()) == 4 * MS - 10   # rank 1 seq 1: enter t+10, end t+4ms
    row = det.durations.stat_row[det.comms.ids[TPC]].max()
    durations = sorted(d for d in det.durations.dur[row].tolist() if d >= 0)
    assert durations == [6 * MS - 4 * MS, 3 * MS - 1, 3 * MS, 4 * MS - 10]
