"""The command line of the Inspector sources: ``failslow import nccl-inspector`` on
non-verbose output names the straggler; ``failslow agent --inspector-dir`` and ``--ras``
refuse bad input in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow import cli
from failslow.collectors.importers import nccl_inspector_writer
from failslow.simulator import scenario_from_dict, simulate


def test_import_prints_exec_time_stragglers(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    sc = scenario_from_dict({"job": "small", "parallel": {"tp": 2, "pp": 2, "dp": 4, "cp": 1},
                             "microbatches": 4, "schedule": "1f1b", "iterations": 30,
                             "faults": [{"cause": "compute", "ranks": [5], "start": 10,
                                         "duration": 12, "severity": 1.8}]})
    sim = simulate(sc, seed=2)
    src = nccl_inspector_writer.write(sim.meta, sim.tables["coll"], tmp_path / "dump",
                                      verbose=False, drop={9: 0.2})
    assert cli.main(["import", "nccl-inspector", str(src), "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "ranks with dropped records (held out, never a root cause): 9" in out
    assert "compute stragglers [5]; slow link none" in out


def test_agent_refuses_a_missing_inspector_dir(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["agent", "--out", str(tmp_path / "o"), "--inspector-dir",
                     str(tmp_path / "nope"), "--once"])
    err = capsys.readouterr().err
    assert code == 2 and "no such directory" in err and len(err.strip().splitlines()) == 1
    code = cli.main(["agent", "--out", str(tmp_path / "o"), "--ras", "h:port", "--once"])
    err = capsys.readouterr().err
    assert code == 2 and "bad RAS address" in err
