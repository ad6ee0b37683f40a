"""``failslow analyze DIR --json`` end to end on trace directories with contract-v2 ``ras``
rows (NCCL RAS findings), and the line and ``data_quality`` field naming the ranks an NCCL
Inspector import held out."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pytest

from failslow import cli, events
from failslow.collectors.importers import nccl_inspector_writer
from failslow.diagnosis import validate
from failslow.simulator import scenario_from_dict, simulate
from failslow.tracedir import TraceDir, write_trace

S = 1_000_000_000
HEALTHY = {"job": "rasjob", "parallel": {"tp": 2, "pp": 2, "dp": 2, "cp": 1},
           "microbatches": 4, "schedule": "1f1b", "iterations": 12}


def test_analyze_a_trace_dir_with_ras_rows(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The coll rows stop (the collectors died) and RAS keeps reporting rank 3 behind on
    its data-parallel communicator: the diagnosis names it (H1), from RAS alone."""
    sim = simulate(scenario_from_dict(HEALTHY), seed=1)
    dp = next(c for c in sim.meta.comms if c.kind == "dp" and 3 in c.ranks)
    stop = int(pc.max(sim.tables["coll"].column("t")).as_py())
    rows = [{"job": "rasjob", "t": stop + k * 10 * S, "node": "node0", "comm": dp.comm,
             "comm_size": len(dp.ranks), "rank": 3, "finding": "behind",
             "function": "AllReduce", "count": 11, "expected": 12} for k in range(1, 7)]
    tables = {k: t for k, t in sim.tables.items() if k in ("coll", "span")}
    write_trace(tmp_path / "plain", [sim.meta], tables)
    write_trace(tmp_path / "t", [sim.meta], {**tables, "ras": events.from_rows("ras", rows)})
    assert "ras" in TraceDir(tmp_path / "t").kinds

    def hangs(path: Path) -> list[dict[str, object]]:
        assert cli.main(["analyze", str(path), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        validate(doc)
        return [a for a in doc["anomalies"] if a["kind"] == "hang"]

    assert hangs(tmp_path / "plain") == []
    (a,) = hangs(tmp_path / "t")
    assert (a["cause"], a["ranks"], a["comm"], a["comm_kind"]) == (
        "not_entered", [3], dp.comm, "dp")
    assert a["evidence"] == "ras" and a["ras_roots"] == [3]
    # seen in two reports 10 s apart: named at the second, analysed once the merger of
    # sparse windows hands it on (with the next report at the latest)
    assert a["detected_ns"] in (stop + 20 * S, stop + 30 * S)


def test_analyze_prints_the_ranks_an_inspector_import_held_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim = simulate(scenario_from_dict(HEALTHY), seed=2)
    src = nccl_inspector_writer.write(sim.meta, sim.tables["coll"], tmp_path / "dump",
                                      verbose=True, drop={5: 0.2})
    assert cli.main(["import", "nccl-inspector", str(src), "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    assert cli.main(["analyze", str(tmp_path / "t")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "held out (Inspector dropped records): ranks 5" in lines
    assert cli.main(["analyze", str(tmp_path / "t"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    validate(doc)
    assert doc["data_quality"]["held_out_ranks"] == [5]
    assert doc["data_quality"]["source"] == "nccl-inspector"
    # a trace without an import says nothing of the kind
    write_trace(tmp_path / "own", [sim.meta], {"coll": sim.tables["coll"]})
    assert cli.main(["analyze", str(tmp_path / "own"), "--json"]) == 0
    assert "data_quality" not in json.loads(capsys.readouterr().out)
    assert cli.main(["analyze", str(tmp_path / "own")]) == 0
    assert "held out" not in capsys.readouterr().out


def test_inspector_files_and_ras_find_a_hang_the_files_alone_cannot(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The Inspector writes an operation once it completes: a hang leaves no record. With
    RAS reports of the same job (a rank that stopped answering), ``analyze`` names it."""
    sim = simulate(scenario_from_dict(HEALTHY), seed=4)
    src = nccl_inspector_writer.write(sim.meta, sim.tables["coll"], tmp_path / "dump",
                                      verbose=True)
    assert cli.main(["import", "nccl-inspector", str(src), "--out", str(tmp_path / "t")]) == 0
    td = TraceDir(tmp_path / "t")
    coll = td.read("coll")
    meta = td.meta()
    comm = next(c for c in meta.comms if 2 in c.ranks and len(c.ranks) > 1)
    stop = int(pc.max(coll.column("t")).as_py())
    ras = events.from_rows("ras", [
        {"job": meta.job, "t": stop + k * 10 * S, "node": "node1", "comm": comm.comm,
         "comm_size": len(comm.ranks), "rank": 2, "finding": "missing"} for k in range(1, 5)])
    write_trace(tmp_path / "t", [meta], {"coll": coll, "ras": ras})
    capsys.readouterr()
    assert cli.main(["analyze", str(tmp_path / "t"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    hangs = [(a["cause"], a["ranks"], a["comm"]) for a in doc["anomalies"]
             if a["kind"] == "hang"]
    assert hangs == [("not_entered", [2], comm.comm)]
