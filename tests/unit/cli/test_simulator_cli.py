"""`failslow simulate`, scenario files and presets, determinism."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from failslow.cli import main
from failslow.diagnosis import Diagnosis
from failslow.simulator import (
    PRESETS,
    ScenarioError,
    load_scenario,
    preset,
    scenario_from_dict,
    simulate,
    write_sim,
)
from failslow.tracedir import TraceDir

REQUIRED_PRESETS = {"default", "demo", "healthy", "compute-multi", "link", "mixed",
                    "hang-not-entered", "hang-inconsistent", "hang-hardware", "large", "gpipe"}

YAML = """\
preset: healthy
job: yaml-job
parallel: {tp: 2, pp: 2, dp: 2}
microbatches: 3
iterations: 6
gpus_per_node: 4
sampling: {link_ms: 50}
faults:
  - cause: link
    link: [node000, node001]
    start: 2
    duration: 3
    severity: 4
"""


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.iterdir())}


def test_presets_all_load_and_describe_themselves() -> None:
    assert set(PRESETS) >= REQUIRED_PRESETS
    for name in PRESETS:
        sc = preset(name)
        assert sc.name == name and sc.description
        assert sc.world_size == (4096 if name == "large" else 64)
    assert preset("gpipe").schedule == "gpipe"
    assert preset("healthy").faults == []
    demo = preset("demo")
    (c, link) = demo.faults
    assert c.cause == "compute" and link.cause == "communication"
    assert c.start_iteration + c.duration_iterations <= link.start_iteration
    causes = {f.cause for n in PRESETS for f in preset(n).faults}
    assert causes == {"compute", "communication", "mixed", "not_entered", "inconsistent",
                      "hardware"}


def test_yaml_and_toml_scenarios(tmp_path: Path) -> None:
    y = tmp_path / "s.yaml"
    y.write_text(YAML)
    sc = load_scenario(y)
    assert sc.name == "healthy" and sc.job == "yaml-job" and sc.world_size == 8
    assert sc.parallel.cp == 1 and sc.timing.forward_ms == 8.0   # defaults kept
    (f,) = sc.faults
    assert (f.cause, f.nodes, f.start_iteration, f.duration_iterations, f.severity) == (
        "communication", [0, 1], 2, 3, 4.0)
    t = tmp_path / "s.toml"
    t.write_text('job = "toml-job"\niterations = 3\n[parallel]\ntp = 1\npp = 2\ndp = 2\n'
                 '[[faults]]\ncause = "compute"\nranks = [1]\nstart = "0.5s"\n'
                 'duration = "200ms"\nseverity = 2.0\n')
    sc = load_scenario(t)
    assert sc.name == "s" and sc.world_size == 4
    (f,) = sc.faults
    assert f.start_s == 0.5 and f.duration_s == pytest.approx(0.2)
    assert f.start_iteration is None


@pytest.mark.parametrize("text, match", [
    ("parallel: {tp: 2, pp: 2, dp: 2, zz: 1}", "zz"),
    ("iterations: many", "iterations"),
    ("faults: [{cause: compute, ranks: [1], start: 1.5}]", "start"),
    ("faults: [{cause: compute, ranks: [1], sevrity: 2}]", "sevrity"),
    ("schedule: interleaved", "schedule"),
    ("preset: nope", "preset"),
    ("parallel: {tp: 0}", "tp"),
])
def test_bad_scenarios_say_which_key(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ScenarioError, match=match):
        load_scenario(p)


def test_unknown_preset_or_missing_file() -> None:
    with pytest.raises(ScenarioError, match="presets"):
        load_scenario("no-such-thing")


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    sc = scenario_from_dict({"job": "det", "parallel": {"tp": 2, "pp": 2, "dp": 2},
                             "microbatches": 3, "iterations": 5, "noise": {"gc_prob": 0.1},
                             "gpus_per_node": 2,
                             "faults": [{"cause": "hardware", "ranks": [5], "start": 3}]})
    a = digest(write_sim(simulate(sc, seed=7), tmp_path / "a"))
    b = digest(write_sim(simulate(sc, seed=7), tmp_path / "b"))
    c = digest(write_sim(simulate(sc, seed=8), tmp_path / "c"))
    assert a == b
    assert set(a) >= {"meta.json", "coll.parquet", "progress.parquet", "link.parquet",
                      "gpu.parquet", "span.parquet", "truth.json", "scenario.yaml"}
    assert a["coll.parquet"] != c["coll.parquet"]
    assert a["truth.json"] != c["truth.json"]
    assert a["meta.json"] == c["meta.json"]   # the job description does not depend on noise
    j1 = digest(write_sim(simulate(sc, seed=7), tmp_path / "j1", "jsonl"))
    j2 = digest(write_sim(simulate(sc, seed=7), tmp_path / "j2", "jsonl"))
    assert j1 == j2


def test_cli_default_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "trace"
    assert main(["simulate", "--out", str(out), "--iterations", "20"]) == 0
    text = capsys.readouterr().out
    assert "64 ranks" in text and "compute" in text
    td = TraceDir(out)
    meta = td.meta()
    assert (meta.world_size, meta.tp, meta.pp, meta.dp) == (64, 2, 4, 8)
    assert len(set(meta.nodes.values())) == 8
    truth = Diagnosis.load(out / "truth.json")
    (a,) = truth.anomalies
    assert (a.kind, a.cause, a.ranks) == ("slow", "compute", [21])
    assert td.read("coll").num_rows > 100_000
    assert {"coll", "span", "progress", "link", "gpu"} == set(td.kinds)


def test_cli_scenario_file_jsonl_and_json_summary(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    y = tmp_path / "s.yaml"
    y.write_text(YAML)
    out = tmp_path / "trace"
    assert main(["simulate", "--scenario", str(y), "--out", str(out), "--format", "jsonl",
                 "--seed", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ranks"] == 8 and summary["rows"]["coll"] > 0
    assert (out / "coll.jsonl").exists() and not (out / "coll.parquet").exists()
    td = TraceDir(out)
    assert td.read("coll").num_rows == summary["rows"]["coll"]
    (a,) = Diagnosis.load(out / "truth.json").anomalies
    assert a.cause == "communication" and a.link is not None
    nodes = td.meta().nodes
    assert {nodes[a.link[0]], nodes[a.link[1]]} == {"node000", "node001"}


def test_cli_list_presets_and_errors(tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--list-presets"]) == 0
    listed = capsys.readouterr().out
    for name in REQUIRED_PRESETS:
        assert name in listed
    assert main(["simulate"]) == 2
    assert "--out" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("faults: [{cause: compute, ranks: [9999]}]\n")
    assert main(["simulate", "--scenario", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "9999" in capsys.readouterr().err
    assert main(["simulate", "--preset", "nope", "--out", str(tmp_path / "y")]) == 2


def test_bench_entry_point_small_scale() -> None:
    import argparse

    from failslow.bench.simulate import BENCHMARKS

    figures = BENCHMARKS["simulate"](argparse.Namespace(json=True, scale=1 / 32))
    assert figures["ranks"] == 8 * 8 * 2
    assert figures["rows"] > 0 and figures["seconds"] > 0
    assert figures["iterations"] == 50
    assert set(figures) >= {"rows_per_s", "baseline_64rank_seconds", "ratio"}


def test_written_scenario_regenerates_the_trace(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    first = tmp_path / "first"
    assert main(["simulate", "--preset", "hang-hardware", "--out", str(first),
                 "--seed", "5"]) == 0
    again = tmp_path / "again"
    assert main(["simulate", "--scenario", str(first / "scenario.yaml"),
                 "--out", str(again)]) == 0
    capsys.readouterr()
    a, b = digest(first), digest(again)
    assert a == b
