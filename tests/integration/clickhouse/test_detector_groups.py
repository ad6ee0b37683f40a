"""One job's detection split over consumer groups (issue 13; ``failslow process
--detectors``): each processor runs some of the registered detectors, in its own group, and
the store they share holds the diagnosis ``failslow analyze`` gives, every field compared.

Each group reads every message of the job, as a Kafka consumer group does: here one
in-process bus per group, fed the same messages in the same order.
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
from failslow.engine.offline import analyze
from failslow.stream.processor import ProcessorConfig
from failslow.stream.transport import InProcessTransport

#: the split the README shows: the slow-down side beside the hang detector (run in this
#: order: the group without the iteration tracker writes last)
GROUPS = {"slow": frozenset({"slowdown", "linkrate"}), "hang": frozenset({"hang"})}
FLIGHT_RECORDER = SHARED / "data" / "flight-recorder" / "gpu_error_1st"


def _split_diagnosis(trace: Path, store: Path) -> tuple[dict[str, Any], dict[str, set[str]]]:
    """The store's diagnosis after one processor per group, and the anomaly ids each group
    reported."""
    buses = {}
    for group in GROUPS:
        bus = InProcessTransport()
        bus.group = group  # its checkpoints and write tokens are its own, as in Kafka
        buses[group] = bus
    meta = publish_trace(trace, list(buses.values()))
    reported: dict[str, set[str]] = {}
    for group, names in GROUPS.items():
        processor = process_into(buses[group], store, detectors=names)
        reported[group] = {a.id for st in processor._jobs.states.values()
                           for a in st.anomalies.values()}
    return stored_diagnosis(store, meta.job), reported


def _check(trace: Path, tmp_path: Path) -> tuple[dict[str, Any], dict[str, set[str]]]:
    offline = json.loads(analyze(trace).to_json())
    online, reported = _split_diagnosis(trace, tmp_path / "store")
    assert differences(offline, online) == []
    return offline, reported


@pytest.mark.parametrize("preset", ["mixed", "hang-hardware"])
def test_detectors_split_over_groups_give_the_offline_diagnosis(preset: str,
                                                                tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "failslow", "simulate", "--preset", preset,
                    "--out", str(trace)], check=True, capture_output=True, timeout=300)
    diag, reported = _check(trace, tmp_path)
    kinds = {a["kind"] for a in diag["anomalies"]}
    assert ("hang" if preset.startswith("hang") else "slow") in kinds
    # each group reported only its own detectors' anomalies: the work was split
    assert all(i.startswith("hang-") for i in reported["hang"])
    assert not any(i.startswith("hang-") for i in reported["slow"])
    assert reported["hang"] | reported["slow"] == {a["id"] for a in diag["anomalies"]}
    # the iteration summary comes from the group that tracks the iterations
    assert diag["iterations"] and diag["iterations"]["count"] > 0


@pytest.mark.skipif(not FLIGHT_RECORDER.exists(), reason="../shared/data is not present")
def test_a_post_mortem_hang_split_over_groups(tmp_path: Path) -> None:
    from failslow.collectors.importers import flight_recorder as fr

    trace = tmp_path / "trace"
    fr.import_dumps(FLIGHT_RECORDER).write(trace)
    diag, reported = _check(trace, tmp_path)
    hangs = [a for a in diag["anomalies"] if a["kind"] == "hang"]
    assert sorted(r for a in hangs for r in a["ranks"]) == [12, 14]  # the published culprits
    assert {a["id"] for a in hangs} <= reported["hang"]


def test_a_group_reads_only_the_kinds_its_detectors_need() -> None:
    hang = ProcessorConfig(detectors=frozenset({"hang"}))
    slow = ProcessorConfig(detectors=frozenset({"slowdown"}))
    every = ProcessorConfig()
    assert "gpu" not in hang.analyzer_kinds and "gpu" in slow.analyzer_kinds
    assert "ras" in hang.analyzer_kinds and "ras" not in slow.analyzer_kinds
    assert set(hang.analyzer_kinds) | set(slow.analyzer_kinds) <= set(every.analyzer_kinds)
    with pytest.raises(ValueError, match="no detector 'hnag'; known: iterations"):
        ProcessorConfig(detectors=frozenset({"hnag"}))
