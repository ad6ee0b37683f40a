"""`failslow simulate --preset P && failslow analyze DIR --json` for every preset: valid
diagnosis JSON whose anomalies match the simulator's truth.json (kind, cause, root ranks,
link). The 4096-rank `large` preset is left to `failslow bench simulate`."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from failslow import cli, diagnosis
from failslow.simulator import PRESETS

SMALL_PRESETS = sorted(p for p in PRESETS if p != "large")


def _key(a: dict[str, Any]) -> tuple[Any, ...]:
    return (a["kind"], a["cause"], sorted(a["ranks"]), a["link"] and sorted(a["link"]))


@pytest.mark.parametrize("preset", SMALL_PRESETS)
def test_preset_diagnosis_matches_truth(tmp_path: Path, preset: str) -> None:
    assert cli.main(["simulate", "--preset", preset, "--out", str(tmp_path)]) == 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["analyze", str(tmp_path), "--json"]) == 0
    doc = json.loads(out.getvalue())
    diagnosis.validate(doc)
    truth = json.loads((tmp_path / "truth.json").read_text())
    diagnosis.validate(truth)
    assert sorted(map(_key, doc["anomalies"])) == sorted(map(_key, truth["anomalies"]))
    for found in doc["anomalies"]:
        assert found["start_ns"] is not None and found["detected_ns"] >= found["start_ns"]
