"""Online and offline give the same diagnosis (issue 13, item 2).

For every simulator preset (but ``large``, which has its own benchmark) and the imported
ByteDance trial, ``failslow analyze`` (:func:`failslow.engine.offline.analyze`) and the stream
path (the trace published as ``failslow replay`` publishes it: meta first, then 100 ms
windows each with its watermark; :class:`StreamProcessor` with ``failslow process``'s
defaults; the chDB store read back as ``failslow query anomalies`` reads it) must agree on
every field of every anomaly, ``extra`` included (GPU evidence, R, P, victims, ...), and on
the iteration summary.

A post-mortem trace (the real Flight Recorder case) ends with the message ``failslow
replay`` adds to one (``failslow-end: post-mortem``): the processor then gives it the last
tick past the hang ceiling that ``analyze`` gives it.

Not compared: ``whatif`` (the processor runs the what-if analysis only with ``--whatif``,
over a sliding window of steps; offline it sees the whole trace).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.parity import differences, process_into, publish_trace, stored_diagnosis

from conftest import SHARED
from failslow.engine.offline import analyze, is_post_mortem
from failslow.simulator import PRESETS
from failslow.stream.transport import InProcessTransport

STRAGGLER = SHARED / "data" / "straggler-analysis"
FLIGHT_RECORDER = SHARED / "data" / "flight-recorder" / "gpu_error_1st"
PARITY_PRESETS = sorted(p for p in PRESETS if p != "large")


def _stream_diagnosis(trace: Path, store: Path) -> dict[str, Any]:
    bus = InProcessTransport()
    meta = publish_trace(trace, [bus])
    process_into(bus, store)
    return stored_diagnosis(store, meta.job)


def _check(trace: Path, tmp_path: Path) -> dict[str, Any]:
    offline = json.loads(analyze(trace).to_json())
    online = _stream_diagnosis(trace, tmp_path / "store")
    assert differences(offline, online) == []
    return offline


@pytest.mark.parametrize("preset", PARITY_PRESETS)
def test_every_preset_same_diagnosis_online_and_offline(preset: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "failslow", "simulate", "--preset", preset,
                    "--out", str(trace)], check=True, capture_output=True, timeout=300)
    truth = json.loads((trace / "truth.json").read_text())
    diag = _check(trace, tmp_path)
    # a comparison of two empty diagnoses would prove little: the faults are found
    assert len(diag["anomalies"]) >= len([a for a in truth["anomalies"]
                                          if a["kind"] in ("slow", "hang")]) > 0 \
        or preset == "healthy"


@pytest.mark.skipif(not STRAGGLER.exists(), reason="../shared/data is not present")
def test_imported_bytedance_trial_same_diagnosis_online_and_offline(tmp_path: Path) -> None:
    from failslow.collectors.importers import straggler_analysis as sa

    trace = tmp_path / "trace"
    sa.import_files(STRAGGLER / "trace-AR.parquet", STRAGGLER / "meta-AR.yaml").write(trace)
    diag = _check(trace, tmp_path)
    assert diag["iterations"] and diag["iterations"]["count"] > 0


@pytest.mark.skipif(not FLIGHT_RECORDER.exists(), reason="../shared/data is not present")
def test_imported_flight_recorder_hang_same_diagnosis_online_and_offline(tmp_path: Path
                                                                        ) -> None:
    from failslow.collectors.importers import flight_recorder as fr

    trace = tmp_path / "trace"
    fr.import_dumps(FLIGHT_RECORDER).write(trace)
    assert is_post_mortem(trace)
    diag = _check(trace, tmp_path)
    hangs = [a for a in diag["anomalies"] if a["kind"] == "hang"]
    assert sorted(r for a in hangs for r in a["ranks"]) == [12, 14]  # the published culprits
