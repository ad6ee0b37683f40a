"""What-if analysis on ByteDance's published AR trial (StragglerAnalysis, what-if paper A.2):
our figures must agree with result-AR.json, ms-AR.json and mw-AR.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import SHARED
from failslow.collectors.importers import straggler_analysis as sa
from failslow.tracedir import TraceDir
from failslow.whatif import analysis as wi

DATA = SHARED / "data" / "straggler-analysis"
TRACE, META = DATA / "trace-AR.parquet", DATA / "meta-AR.yaml"

pytestmark = pytest.mark.skipif(not TRACE.exists(), reason="AR trace not available")


def _published(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


@pytest.fixture(scope="module")
def tables_meta(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Any]:
    out = tmp_path_factory.mktemp("ar") / "trace"
    sa.import_files(TRACE, META).write(out)
    td = TraceDir(out)
    return {k: td.read(k) for k in ("span", "coll")}, td.meta()


@pytest.fixture(scope="module")
def result(tables_meta: tuple[dict[str, Any], Any]) -> dict[str, Any]:
    tables, meta = tables_meta
    r = wi.whatif(tables, meta)
    assert r is not None
    return r


def test_overall_slowdown_matches_published(result: dict[str, Any]) -> None:
    published = _published("result-AR.json")["blocking_slowdown"]          # 1.973
    assert result["slowdown"] == pytest.approx(published, rel=0.02)
    ms = _published("ms-AR.json")
    assert result["t_original_s"] == pytest.approx(ms["tori"], rel=0.02)
    assert result["t_ideal_s"] == pytest.approx(ms["tideal"], rel=0.02)
    # the simulated original reproduces the traced step (§6), as in the published run
    assert result["discrepancy"] < 0.015


def test_top_worker_and_stage(result: dict[str, Any]) -> None:
    top = result["workers"][0]
    assert (top["dp"], top["pp"], top["rank"]) == (0, 0, 0)      # rank = stage * dp + dp_rank
    assert top["slowdown"] > 1.9
    assert all(w["slowdown"] < 1.05 for w in result["workers"][1:])
    pub = _published("result-AR.json")
    for dim, ours in (("dp_rank", result["by_dp_rank"]), ("stage", result["by_stage"])):
        theirs = pub[f"blocking_decompose_by_{dim}"]
        assert max(ours, key=ours.get) == max(theirs, key=theirs.get) == "0"
        for key, value in theirs.items():
            assert ours[key] == pytest.approx(value, rel=0.02), (dim, key)


def test_op_type_attribution(result: dict[str, Any]) -> None:
    pub = _published("result-AR.json")["blocking_decompose_by_optype"]
    by_op = result["by_op"]
    for name in ("forward-compute", "backward-compute", "embedding-grads-all-reduce"):
        assert by_op[name] == pytest.approx(pub[name], rel=0.02), name
    assert by_op["grads-sync"] == pytest.approx(pub["grads-reduce-scatter"], rel=0.02)
    assert by_op["params-sync"] == pytest.approx(pub["params-all-gather"], rel=0.02)
    bt = result["by_op_type"]
    assert set(bt) == {"forward-compute", "backward-compute", "pp-communication",
                       "dp-communication", "tp-communication"}
    assert max(bt, key=bt.get) == "backward-compute"
    assert bt["pp-communication"] == pytest.approx(1.0, abs=0.02)


def test_mw_ms_match_published(result: dict[str, Any]) -> None:
    mw, ms = _published("mw-AR.json"), _published("ms-AR.json")
    assert result["M_W"] == pytest.approx(mw["Mw"], abs=0.05)
    assert result["M_S"] == pytest.approx(ms["Ms"], abs=0.05)
    assert result["M_W_detail"]["add"] == pytest.approx(mw["add"], abs=0.05)
    assert result["M_S_detail"]["add"] == pytest.approx(ms["add"], abs=0.05)
    assert result["M_W_detail"]["workers"] == [{"rank": 0, "pp": 0, "dp": 0}]


def test_per_step_slowdowns(result: dict[str, Any]) -> None:
    pub = _published("result-AR.json")["blocking_step_slowdown"]
    assert set(result["per_step"]) == set(pub)
    for step, value in pub.items():
        assert result["per_step"][step] == pytest.approx(value, rel=0.02), step


def test_heatmaps_of_ar(result: dict[str, Any], tmp_path: Path) -> None:
    paths = wi.heatmaps(result, tmp_path)
    assert [p.name for p in paths] == ["whatif-workers.png", "whatif-steps.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_framework_names(tmp_path: Path) -> None:
    """Written as JSON Lines the trace loses the importer's ``optype`` column; the generic
    ``other`` spans are told apart by their coll rows, and the figures still agree."""
    out = tmp_path / "jsonl"
    sa.import_files(TRACE, META).write(out, "jsonl")
    td = TraceDir(out)
    assert "optype" not in td.read("span").column_names
    r = wi.whatif({k: td.read(k) for k in ("span", "coll")}, td.meta())
    assert r is not None
    assert r["slowdown"] == pytest.approx(1.973, rel=0.02)
    assert (r["workers"][0]["dp"], r["workers"][0]["pp"]) == (0, 0)
    assert r["M_W"] == pytest.approx(_published("mw-AR.json")["Mw"], abs=0.05)
    assert r["M_S"] == pytest.approx(_published("ms-AR.json")["Ms"], abs=0.05)


def test_coll_only(tables_meta: tuple[dict[str, Any], Any]) -> None:
    """Only the derived coll rows: compute from the gaps between communication (§3.1)."""
    tables, meta = tables_meta
    r = wi.whatif({"coll": tables["coll"]}, meta)
    assert r is not None and r["source"] == "coll"
    assert r["slowdown"] == pytest.approx(1.973, rel=0.02)
    assert (r["workers"][0]["dp"], r["workers"][0]["pp"]) == (0, 0)
