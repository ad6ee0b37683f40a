"""One job's detection as stages connected by a topic (issue 13 item 3; ``failslow process
--export`` / ``--import``): the group that tracks the iterations exports them on
``failslow.derived.iterations``; the slow-down group imports them instead of tracking them
again; the hang group runs beside. The store they share holds the diagnosis ``failslow
analyze`` gives, every field compared.

Each group reads the job's messages as a Kafka consumer group does: one in-process bus per
group, fed the same messages in the same order; the importing group's bus also carries what
the exporting group published (after it, so that the alignment of the imported kind is what
orders them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.parity import differences, process_into, publish_trace, stored_diagnosis

from failslow.engine.offline import analyze
from failslow.stream import jobs
from failslow.stream.exports import EXPORT_TOPICS, decode_export
from failslow.stream.processor import StreamProcessor
from failslow.stream.transport import EVENT_TOPICS, H_WATERMARK, InProcessTransport

STAGES: dict[str, dict[str, Any]] = {
    "track": {"detectors": frozenset({"iterations"}), "exports": frozenset({"iterations"})},
    "slow": {"detectors": frozenset({"slowdown", "linkrate"}),
             "imports": frozenset({"iterations"})},
    "hang": {"detectors": frozenset({"hang"})},
}


def _staged_diagnosis(trace: Path, store: Path, repeat_exports: int = 1
                      ) -> tuple[dict[str, Any], dict[str, StreamProcessor]]:
    buses = {}
    for group in STAGES:
        imports = EXPORT_TOPICS if STAGES[group].get("imports") else ()
        bus = InProcessTransport(subscribe=(*EVENT_TOPICS, *imports))
        bus.group = group  # its checkpoints and write tokens are its own, as in Kafka
        bus.ordered = False  # topics fetched independently: the kinds are aligned
        buses[group] = bus
    meta = publish_trace(trace, list(buses.values()))
    processors = {}
    for group, settings in STAGES.items():
        if group == "slow":  # what the tracking stage exported (again: at least once)
            for _ in range(repeat_exports):
                for m in buses["track"].messages(EXPORT_TOPICS[0]):
                    buses["slow"].produce(m.topic, m.key, m.value, m.headers)
        processors[group] = process_into(buses[group], store, **settings)
    return stored_diagnosis(store, meta.job), processors


@pytest.mark.parametrize("preset", ["mixed", "link", "hang-hardware"])
def test_iterations_exported_by_one_stage_give_the_offline_diagnosis(
        preset: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "failslow", "simulate", "--preset", preset,
                    "--out", str(trace)], check=True, capture_output=True, timeout=300)
    offline = json.loads(analyze(trace).to_json())
    online, processors = _staged_diagnosis(trace, tmp_path / "store")
    assert differences(offline, online) == []
    assert offline["anomalies"] and offline["iterations"]["count"] > 0
    # the tracker ran in the exporting stage only, and its rows reached the other one
    track, slow = processors["track"], processors["slow"]
    [job] = slow.jobs()
    assert "iterations" in track.analyzer(job).detectors  # type: ignore[attr-defined]
    assert "iterations" not in slow.analyzer(job).detectors  # type: ignore[attr-defined]
    assert track.stats.exports_published > 0
    assert slow.stats.rows["iterations"] > 0 and not slow.stats.dead_letters


def test_exports_delivered_twice_change_nothing(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """At least once: a stage that restarts publishes again what it published after its
    last committed cut; the importing engine takes each iteration row once. Exports are cut
    into messages of bounded size, only the last of a checkpoint's moving the watermark."""
    monkeypatch.setattr(jobs, "EXPORT_MESSAGE_ROWS", 300)
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "failslow", "simulate", "--preset", "default",
                    "--out", str(trace)], check=True, capture_output=True, timeout=300)
    offline = json.loads(analyze(trace).to_json())
    online, processors = _staged_diagnosis(trace, tmp_path / "store", repeat_exports=2)
    assert differences(offline, online) == []
    slow = processors["slow"]
    messages = processors["track"].transport.messages(EXPORT_TOPICS[0])
    sizes = [decode_export(m)[1].num_rows for m in messages]
    assert slow.stats.rows["iterations"] == 2 * sum(sizes) > 0
    assert max(sizes) == 300 and len(messages) > sum(sizes) / 300
    marks = [int(m.headers[H_WATERMARK]) for m in messages]
    assert marks == sorted(marks) and len(set(marks)) < len(marks)
