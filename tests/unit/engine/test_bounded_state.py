"""A job that runs for days keeps a bounded engine state (issue 13, item 4): past its
histories, the state of every detector stops growing with the iterations. The histories
are shrunk here so that a short trace crosses them."""

from __future__ import annotations

from typing import Any

import pytest

from failslow.bench import heldout as hg
from failslow.detectors.iterations import tracker as tracker_module
from failslow.detectors.linkrate import detector as linkrate_module
from failslow.engine.analyzer import JobAnalyzer
from failslow.events import parse_meta_row
from failslow.replay import replay
from failslow.stream.state import raw_payload

#: the histories, shrunk (each one's default is 4096)
HISTORY = 40


def _sizes(analyzer: JobAnalyzer) -> dict[str, int]:
    snap: dict[str, Any] = analyzer.snapshot()
    # the snapshot payload before compression (arrays as raw bytes)
    sizes = {name: len(raw_payload(state)) for name, state in snap.pop("detectors").items()}
    sizes["engine"] = len(raw_payload(snap))
    return sizes


def test_engine_state_stops_growing_past_its_histories(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    monkeypatch.setattr(tracker_module, "HISTORY", HISTORY)
    monkeypatch.setattr(linkrate_module, "ITER_HISTORY", HISTORY)
    meta, tables, _ = hg.generate(hg.Spec(tp=2, pp=2, dp=2, iterations=480, seed=11,
                                          gc_prob=0.02, link_rows=True))
    analyzer = JobAnalyzer(parse_meta_row(meta))
    marks = {240: {}, 470: {}}  # state sizes once this many job iterations were done
    for now, batch in replay(tables, 100_000_000):
        analyzer.update(batch)
        analyzer.on_tick(now)
        done = analyzer.tracker.job_count
        for mark, sizes in marks.items():
            if done >= mark and not sizes:
                sizes.update(_sizes(analyzer))
    early, late = marks[240], marks[470]
    assert early and late
    # twice the iterations, about the same state (a few % of jitter in what is pending)
    grown = {name: round(late[name] / early[name], 3) for name in early}
    assert all(ratio < 1.15 for ratio in grown.values()), grown
    assert analyzer.diagnosis().iterations["count"] == analyzer.tracker.job_count >= 470
    assert len(analyzer.tracker.job) == HISTORY
