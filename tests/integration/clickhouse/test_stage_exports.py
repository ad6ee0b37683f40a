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

import inspect
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.parity import differences, process_into, publish_trace, stored_diagnosis

from failslow.detectors.slowdown.config import SlowdownConfig
from failslow.detectors.slowdown.evidence_rows import PARTS
from failslow.engine.offline import analyze, run_analyzer
from failslow.stream import jobs
from failslow.stream.exports import EXPORT_TOPICS, decode_export, export_topic, exported_of
from failslow.stream.processor import StreamProcessor
from failslow.stream.transport import EVENT_TOPICS, H_WATERMARK, InProcessTransport
from failslow.tracedir import TraceDir

STAGES: dict[str, dict[str, Any]] = {
    "track": {"detectors": frozenset({"iterations"}), "exports": frozenset({"iterations"})},
    "slow": {"detectors": frozenset({"slowdown", "linkrate"}),
             "imports": frozenset({"iterations"})},
    "hang": {"detectors": frozenset({"hang"})},
}

#: The slow-down detector's evidence reduced by two processors of their own.
REDUCED: dict[str, dict[str, Any]] = {
    "track": STAGES["track"],
    **{f"reduce{i}": {"detectors": frozenset({"evidence"}), "evidence_shard": (i, 2),
                      "exports": frozenset({"evidence"}),
                      "imports": frozenset({"iterations"})} for i in range(2)},
    "slow": {"detectors": frozenset({"slowdown", "linkrate"}),
             "imports": frozenset({"iterations", "evidence"})},
    "hang": STAGES["hang"],
}


def _staged_diagnosis(trace: Path, store: Path, repeat_exports: int = 1,
                      stages: dict[str, dict[str, Any]] | None = None
                      ) -> tuple[dict[str, Any], dict[str, StreamProcessor]]:
    stages = STAGES if stages is None else stages
    buses = {}
    for group, settings in stages.items():
        imports = [t for t in EXPORT_TOPICS
                   if exported_of(t) in settings.get("imports", ())]
        bus = InProcessTransport(subscribe=(*EVENT_TOPICS, *imports))
        bus.group = group  # its checkpoints and write tokens are its own, as in Kafka
        bus.ordered = False  # topics fetched independently: the kinds are aligned
        buses[group] = bus
    meta = publish_trace(trace, list(buses.values()))
    processors = {}
    for group, settings in stages.items():
        for name in sorted(settings.get("imports", ())):
            # what the exporting stages published (again: at least once), their messages
            # interleaved as a topic's partition receives them
            sources = [buses[g].messages(export_topic(name)) for g, other in stages.items()
                       if name in other.get("exports", ())]
            for _ in range(repeat_exports):
                for ms in itertools.zip_longest(*sources):
                    for m in ms:
                        if m is not None:
                            buses[group].produce(m.topic, m.key, m.value, m.headers)
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
    messages = processors["track"].transport.messages(export_topic("iterations"))
    sizes = [decode_export(m)[1].num_rows for m in messages]
    assert slow.stats.rows["iterations"] == 2 * sum(sizes) > 0
    assert max(sizes) == 300 and len(messages) > sum(sizes) / 300
    marks = [int(m.headers[H_WATERMARK]) for m in messages]
    assert marks == sorted(marks) and len(set(marks)) < len(marks)


@pytest.mark.parametrize(("preset", "repeat"), [("mixed", 2), ("link", 1),
                                               ("compute-multi", 1)])
def test_evidence_reduced_by_two_stages_gives_the_offline_diagnosis(
        preset: str, repeat: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processors reduce a half of the job's ranks each (``--detectors evidence --shard
    i/2 --export evidence``); the slow-down group sums their rows and reads no ``coll`` row
    itself; the diagnosis is ``failslow analyze``'s, every field. Delivered twice, in
    messages of 300 rows (one batch's rows of a shard then span messages), the evidence
    changes nothing."""
    if repeat > 1:
        monkeypatch.setattr(jobs, "EXPORT_MESSAGE_ROWS", 300)
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "failslow", "simulate", "--preset", preset,
                    "--out", str(trace)], check=True, capture_output=True, timeout=300)
    offline = json.loads(analyze(trace).to_json())
    online, processors = _staged_diagnosis(trace, tmp_path / "store", repeat, REDUCED)
    assert differences(offline, online) == []
    assert offline["anomalies"]
    slow = processors["slow"]
    [job] = slow.jobs()
    detector = slow.analyzer(job).detectors["slowdown"]  # type: ignore[attr-defined]
    assert detector.evidence_imported and slow.stats.rows["evidence"] > 0
    published = 0
    for i in range(2):
        reducer = processors[f"reduce{i}"]
        assert set(reducer.analyzer(job).detectors) == {"evidence"}  # type: ignore[attr-defined]
        published += sum(decode_export(m)[1].num_rows for m in
                         reducer.transport.messages(export_topic("evidence")))
    assert slow.stats.rows["evidence"] == repeat * published > 0
    assert not slow.stats.dead_letters


def _ccld_windows_of(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Every ``SlowdownConfig`` built from now on (offline and in each processor) has
    CCL-D detection windows of ``seconds``: the dataclass's own default, patched."""
    params = [p for p in inspect.signature(SlowdownConfig.__init__).parameters.values()
              if p.default is not inspect.Parameter.empty]
    defaults = list(SlowdownConfig.__init__.__defaults__ or ())
    defaults[[p.name for p in params].index("ccld_window_s")] = seconds
    monkeypatch.setattr(SlowdownConfig.__init__, "__defaults__", tuple(defaults))
    assert SlowdownConfig().ccld_window_s == seconds


def test_ccld_windows_that_close_in_the_stream_give_the_offline_diagnosis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reducers send the rounds of a class past CCL-D's baseline summed per detection
    window, each window once a batch reached past its end. With 2 s windows, several close
    during the trace: delivered twice in 300-row messages, the diagnosis is still
    ``failslow analyze``'s, every field."""
    _ccld_windows_of(monkeypatch, 2.0)
    monkeypatch.setattr(jobs, "EXPORT_MESSAGE_ROWS", 300)
    trace = tmp_path / "trace"
    subprocess.run([sys.executable, "-m", "failslow", "simulate", "--preset", "link",
                    "--out", str(trace)], check=True, capture_output=True, timeout=300)
    offline = json.loads(analyze(trace).to_json())
    online, processors = _staged_diagnosis(trace, tmp_path / "store", 2, REDUCED)
    assert differences(offline, online) == []
    parts = [decode_export(m)[1].column("part").to_numpy()
             for i in range(2) for m in processors[f"reduce{i}"].transport.messages(
                 export_topic("evidence"))]
    summed = int(sum((p == PARTS.index("ccldw")).sum() for p in parts))
    assert 0 < summed < sum((p == PARTS.index("ccld")).sum() for p in parts)
    # the windows CCL-D closed, their R values and alarms: those of one process
    td = TraceDir(trace)
    one = run_analyzer(td.meta(), {k: td.read(k) for k in td.kinds}).slowdown.stats.ccld
    [job] = processors["slow"].jobs()
    staged = processors["slow"].analyzer(job).slowdown.stats.ccld  # type: ignore[attr-defined]
    first = int(td.read("coll").column("t").to_numpy().min()) // 2_000_000_000
    assert one.closed > first + 3 and one.hist
    assert (staged.closed, staged.hist, staged.run, staged.alarms) == (
        one.closed, one.hist, one.run, one.alarms)
