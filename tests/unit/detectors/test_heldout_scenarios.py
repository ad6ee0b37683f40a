"""Held-out scenarios (issue 3, last floor; issue 4, last floor): traces from an independent
generator (``failslow.bench.heldout``, not built on ``failslow.simulator``) run through
``failslow analyze`` and scored against their known truth.

The generator varies what the simulator does not: ring collectives timed hop by hop with
heavy-tailed jitter, per-node clock offsets, drift and an NTP step, ``t_start`` missing,
``meta.comms`` empty, other rank orders, one PP communicator per stage pair, a distributed
optimizer (reduce-scatter + all-gather), JSON Lines and Parquet with shuffled rows. Faults:
compute stragglers (Greyhound §4, CCL-D §4.2 S1), slow links (S2, MEGATRACE §III, VCCL's
bandwidth-and-queue rule), hangs H1-H3 (CCL-D §2.2, MEGATRACE §III-C Algorithm 1).

Only scenarios failslow gets right are asserted here; the ones it gets wrong are reported
(helper G's report) rather than written as failing tests.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from failslow.bench import heldout as hg
from failslow.engine.offline import analyze
from failslow.tracedir import TraceDir

SCENARIOS = hg.scenarios()

CLEAN = ["c-lognormal", "c-bursts-bimodal", "c-skew-drift-parquet", "c-order-dp-first-rsag",
         "c-order-pp-mid-pairs", "c-meta-unknown-gpn4", "c-tp-cross-node-skew-drift",
         "c-ntp-step-4ms", "c-checkpoint-all-8s", "c-long-gc-rank5-3s"]
SLOW = ["s-compute-1.2-last", "s-compute-3-skew", "s-compute-1.3-order", "s-compute-2-tp1",
        "s-compute-1.5-tp-cross-node-skew", "s-compute-1.5-ntp-step", "l-pp-3x",
        "l-pp-5x-pairs", "l-dp-ring-4x-linkrows", "l-pp-2x-skew-parquet",
        "l-tp-cross-node-3x-linkrows", "l-pp-3x-no-tstart", "s-compute-2-early", "l-pp-64",
        "x-two-episodes"]
HANG = ["h1-tp", "h1-pp-warmup-mb0", "h1-dp", "h2-dp-bytes", "h2-dp-op-rsag", "h2-tp-bytes",
        "h2-pp-bytes", "h3-tp", "h3-dp-linkrows", "h3-pp-linkrows", "h3-dp-128-linkrows",
        "h1-tp-postmortem"]

#: Detection delay allowed after the true onset, in baseline iterations (the suite's worst
#: measured delay over three seeds was under 7).
MAX_LATENCY_IT = 8.0


def _run(name: str, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = SCENARIOS[name]
    truth = hg.write(spec, root / name)
    diag = analyze(root / name).to_dict()
    return truth, diag


def test_generator_is_independent_valid_and_deterministic(tmp_path: Path) -> None:
    """The generator does not use the simulator, writes traces the contract reader accepts
    (uint64 communicator ids over 2^63, nullable columns absent), and is deterministic."""
    modules = sorted(Path(hg.__file__).parent.glob("*.py"))
    assert len(modules) > 1  # the package's modules, not only its __init__
    assert not [line for module in modules for line in module.read_text().splitlines()
                if line.lstrip().startswith(("from failslow", "import failslow"))]
    spec = dataclasses.replace(SCENARIOS["c-skew-drift-parquet"], iterations=6)
    a = hg.write(spec, tmp_path / "a")
    b = hg.write(spec, tmp_path / "b")
    assert a == b
    ta, tb = TraceDir(tmp_path / "a").read("coll"), TraceDir(tmp_path / "b").read("coll")
    assert ta.equals(tb)
    meta = TraceDir(tmp_path / "a").meta()
    assert meta.world_size == 32 and not meta.comms
    assert ta.column("t_start").null_count > 0
    assert max(ta.column("comm").to_pylist()) > 2**63
    spec = dataclasses.replace(SCENARIOS["c-lognormal"], iterations=6, fmt="jsonl")
    hg.write(spec, tmp_path / "j")
    coll = TraceDir(tmp_path / "j").read("coll")
    # two rows per operation, every operation completed
    phases = coll.column("phase").to_pylist()
    assert phases.count("enter") == phases.count("end") > 0


@pytest.mark.parametrize("name", CLEAN)
def test_clean_heldout_run_raises_no_alarm(name: str, tmp_path: Path) -> None:
    truth, diag = _run(name, tmp_path)
    assert diag["anomalies"] == []
    got, true = diag["iterations"]["median_s"], truth["iterations"]["median_s"]
    assert abs(got - true) / true < 0.01


@pytest.mark.parametrize("name", SLOW)
def test_heldout_slowdown_found_and_localized(name: str, tmp_path: Path) -> None:
    truth, diag = _run(name, tmp_path)
    scored = hg.score(truth, diag)
    assert scored["false_alarms"] == []
    assert len(scored["matches"]) == len(truth["anomalies"])
    for m in scored["matches"]:
        assert m["found"], m
        assert m["cause"] and m["ranks"], m
        assert m["link"] in (None, True), m
        assert m["latency_it"] is not None and 0 <= m["latency_it"] <= MAX_LATENCY_IT, m
    # with up to half the iterations slowed the median sits between two clusters of
    # iteration times, where the iteration boundaries' definition moves it by ~1%
    got, true = diag["iterations"]["median_s"], truth["iterations"]["median_s"]
    assert abs(got - true) / true < 0.02


@pytest.mark.parametrize("name", HANG)
def test_heldout_hang_found_and_classified(name: str, tmp_path: Path) -> None:
    truth, diag = _run(name, tmp_path)
    t = truth["anomalies"][0]
    assert t["triggered"]
    hangs = [a for a in diag["anomalies"] if a["kind"] == "hang"]
    assert len(diag["anomalies"]) == len(hangs) == 1, diag["anomalies"]
    h = hangs[0]
    assert h["cause"] == t["cause"]
    assert h["ranks"] == t["ranks"]
    assert h["comm_kind"] == t["comm_kind"] and h["stage"] == t["stage"]
    assert h["detected_ns"] >= t["start_ns"] - 10_000_000
    if t["link"] and SCENARIOS[name].link_rows:
        assert sorted(h["link"]) == sorted(t["link"])


def test_recurring_host_pause_of_one_rank_is_reported_once(tmp_path: Path) -> None:
    """Rank 0 goes silent for ~8 s twice (a checkpoint written by one rank) while its peers
    wait: the first pause is indistinguishable from an H1 hang and is reported, with its
    end; the second is the same wait again, learned as normal (CCL-D §4.2.1)."""
    _, diag = _run("c-checkpoint-rank0-twice", tmp_path)
    hangs = [(a["cause"], a["ranks"], a["end_ns"] is not None) for a in diag["anomalies"]]
    assert hangs == [("not_entered", [0], True)]


def test_early_host_pauses_on_three_ranks_do_not_lock_the_iterations(tmp_path: Path) -> None:
    """Three GC-like pauses of about one iteration on three ranks early in the job make
    ranks learn their period again; job iterations those ranks never report are skipped
    rather than waited for, so the iterations (and a later straggler) are still found."""
    base = hg.Spec(jitter="lognormal", jitter_scale=0.03, gc_prob=0.0, seed=92,
                   pauses=[(0, 0.076, (14,)), (1, 0.046, (7,)), (5, 0.071, (2,))])
    for label, spec in (("clean", base), ("straggler", dataclasses.replace(
            base, faults=[hg.Fault("compute", 3, start=14, end=28, factor=1.6)]))):
        truth = hg.write(spec, tmp_path / label)
        diag = analyze(tmp_path / label).to_dict()
        it = diag["iterations"]
        assert it["count"] >= 25, it
        true = truth["iterations"]["median_s"]
        tolerance = 0.02 if label == "clean" else 0.06  # half the iterations slowed
        assert abs(it["median_s"] - true) / true < tolerance
        found = [(a["kind"], a["cause"], a["ranks"]) for a in diag["anomalies"]]
        assert found == ([] if label == "clean" else [("slow", "compute", [3])])


def test_two_simultaneous_stragglers_reported_together(tmp_path: Path) -> None:
    """Two ranks in different stages slowed over the same iterations: one anomaly naming
    both (the simulator's compute-multi convention), no other."""
    _, diag = _run("x-two-stragglers-same-time", tmp_path)
    assert len(diag["anomalies"]) == 1
    a = diag["anomalies"][0]
    assert (a["kind"], a["cause"], sorted(a["ranks"])) == ("slow", "compute", [3, 29])


def test_slowdown_then_hang_reported_apart(tmp_path: Path) -> None:
    """A straggler from iteration 8, then a rank that never enters its gradient all-reduce
    in iteration 24: one slow anomaly on the straggler, one H1 hang on the other rank."""
    truth, diag = _run("x-slow-then-hang", tmp_path)
    got = sorted((a["kind"], a["cause"], a["ranks"]) for a in diag["anomalies"])
    assert got == [("hang", "not_entered", [9]), ("slow", "compute", [5])]
    slow = next(a for a in diag["anomalies"] if a["kind"] == "slow")
    hang = next(a for a in diag["anomalies"] if a["kind"] == "hang")
    assert slow["start_ns"] < hang["start_ns"]
    assert hang["comm_kind"] == "dp"


@pytest.mark.parametrize("name", ["s-compute-2-tp1", "l-pp-3x", "s-compute-1.2-last",
                                  "s-compute-1.5-first"])
def test_diagnosis_does_not_depend_on_batch_width(name: str, tmp_path: Path) -> None:
    """Streaming and offline agree (issue 3, item 10): replaying the same held-out trace
    in batches of 37 ms, 100 ms or 1.3 s of trace time gives the same slow anomaly."""
    hg.write(SCENARIOS[name], tmp_path / name)
    keys = ("kind", "cause", "ranks", "link", "comm_kind", "stage", "start_ns", "detected_ns",
            "end_ns")
    runs = [[{k: a.get(k) for k in keys} for a in analyze(tmp_path / name, window_ns=w)
             .to_dict()["anomalies"]] for w in (37_000_000, 100_000_000, 1_300_000_000)]
    assert len(runs[0]) == 1 and runs[0][0]["kind"] == "slow"
    assert runs[0] == runs[1] == runs[2]


def test_cli_json_on_heldout_trace(tmp_path: Path) -> None:
    """``failslow analyze DIR --json`` prints the diagnosis and nothing else."""
    truth = hg.write(SCENARIOS["h2-dp-bytes"], tmp_path / "h2")
    out = subprocess.run([sys.executable, "-m", "failslow", "analyze", str(tmp_path / "h2"),
                          "--json"], capture_output=True, text=True, timeout=120, check=True)
    diag = json.loads(out.stdout)
    assert [(a["kind"], a["cause"], a["ranks"]) for a in diag["anomalies"]] == [
        ("hang", "inconsistent", truth["anomalies"][0]["ranks"])]


#: Slow-downs found since issue 3's held-out fixes (helper A2): a 3x slow ring hop named by
#: its sender's filling queue, 5-7% job slow-downs, a DP ring whose sync ends at the
#: iteration boundary; and a 1.3x slow pipeline link (found before, kept as a guard).
SLOW_FIXED = ["l-dp-ring-wrap-3x-linkrows", "s-compute-1.15-last",
              "s-compute-1.25-pp-first-order", "l-pp-1.3x", "l-dp-ring-3x-nolink"]


@pytest.mark.parametrize("name", SLOW_FIXED)
def test_heldout_slowdown_fixed_found_and_localized(name: str, tmp_path: Path) -> None:
    test_heldout_slowdown_found_and_localized(name, tmp_path)
