"""Inspector accuracy floors (issue 16): every simulator preset written as verbose and as
non-verbose Inspector output and imported; dropped records are no evidence."""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow.bench.accuracy_inspector import SMALL_PRESETS, score_preset
from failslow.collectors.importers import nccl_inspector, nccl_inspector_writer
from failslow.engine.offline import analyze_tables
from failslow.simulator import simulate


@pytest.mark.parametrize("preset", SMALL_PRESETS)
def test_preset_through_inspector_output(preset: str) -> None:
    r = score_preset(preset)
    # verbose: the same diagnosis as the coll rows it was written from
    assert r["verbose"] == r["written_from"]
    if r["hang"]:  # completed operations only: a hang is not in Inspector output
        assert r["plain_compute"] == [] and r["plain_link"] is None
        return
    assert r["verbose"] == r["truth"]
    # non-verbose: compute and link stragglers named from execution times alone
    assert r["plain_compute"] == r["want_compute"]
    assert ([r["plain_link"]] if r["plain_link"] else []) == r["want_links"]


def test_dropped_records_make_no_straggler(tmp_path: Path) -> None:
    sim = simulate("default", seed=0)  # rank 21 computes 1.5x slower
    out = nccl_inspector_writer.write(sim.meta, sim.tables["coll"], tmp_path / "lossy",
                                      drop={12: 0.1, 40: 0.3})
    res = nccl_inspector.import_dir(out)
    assert set(res.info["lossy_ranks"]) == {"12", "40"}
    assert res.info["lossy_held_out"]["ranks"] == [12, 40]
    found = analyze_tables(res.meta, res.tables).anomalies
    assert [(a.cause, a.ranks) for a in found] == [("compute", [21])]
    # the straggler itself lossy: not named from missing rows, listed as unknown
    out = nccl_inspector_writer.write(sim.meta, sim.tables["coll"], tmp_path / "lossy21",
                                      drop={21: 0.05})
    res = nccl_inspector.import_dir(out)
    assert res.info["lossy_held_out"]["ranks"] == [21]
    found = analyze_tables(res.meta, res.tables).anomalies
    assert all(21 not in a.ranks for a in found)
