"""Change points in iteration times (Greyhound §4.2): BOCD, verification, sliding window."""

from __future__ import annotations

import json

import numpy as np
import pytest

from failslow.detectors.changepoints import (
    BOCD,
    ChangeConfig,
    ChangeTracker,
    bocd_candidates,
    changepoints,
    window_candidates,
)


def _steps(levels: list[tuple[float, int]], noise: float = 0.01, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.full(n, v) for v, n in levels])
    return x * (1 + rng.normal(0, noise, len(x)))


def test_bocd_finds_a_step() -> None:
    x = _steps([(1.0, 60), (1.4, 40)])
    cands = bocd_candidates(x)
    assert any(abs(c - 60) <= 1 for c in cands)
    assert all(abs(c - 60) <= 2 for c in cands)


def test_bocd_run_length_posterior_is_normalized_and_truncated() -> None:
    b = BOCD()
    for v in np.log(_steps([(1.0, 300)])):
        b.update(float(v))
    post = b.run_length_posterior()
    assert len(post) == b.config.max_run
    assert abs(post.sum() - 1) < 1e-9
    assert np.argmax(post) == len(post) - 1  # one long run, folded into the last bin


@pytest.mark.parametrize("method", ["bocd", "window"])
def test_step_onset_and_relief(method: str) -> None:
    x = _steps([(1.0, 40), (1.3, 30), (1.0, 30)])
    assert changepoints(x, method) == [40, 70]


@pytest.mark.parametrize("method", ["bocd", "window"])
def test_five_percent_jitter_is_ignored(method: str) -> None:
    rng = np.random.default_rng(7)
    x = 1 + rng.uniform(-0.05, 0.05, 300)
    assert changepoints(x, method) == []


def test_single_slow_iterations_are_ignored() -> None:
    x = _steps([(1.0, 100)])
    x[[20, 50, 80]] *= 2.0  # GC pauses
    assert changepoints(x) == []


def test_verification_against_the_baseline_catches_a_ramp() -> None:
    # every step is under 10% of its neighbour, the whole ramp is 50%
    x = np.concatenate([np.ones(30), np.linspace(1, 1.5, 30), np.full(20, 1.5)])
    x = x * (1 + np.random.default_rng(2).normal(0, 0.005, len(x)))
    cps = changepoints(x)
    # caught while it builds up (a ladder may add further levels), and never relieved
    assert cps and 30 <= cps[0] <= 45 and all(c <= 60 for c in cps)


def test_warm_up_speed_up_is_not_an_anomaly() -> None:
    x = _steps([(1.5, 4), (1.0, 60)])
    assert changepoints(x) == []


def test_sliding_window_candidates() -> None:
    x = _steps([(1.0, 30), (1.5, 30)])
    assert window_candidates(x) == [30]


def test_tracker_reports_levels_and_detection_index() -> None:
    tr = ChangeTracker(ChangeConfig())
    changes = []
    for v in _steps([(1.0, 30), (1.5, 20), (1.0, 20)]):
        changes += tr.push(float(v))
    onset, relief = changes
    assert onset.kind == "onset" and onset.index == 30
    assert onset.detected_index - onset.index < 3  # confirmed within 3 iterations
    assert abs(onset.ratio - 1.5) < 0.05
    assert relief.kind == "relief" and relief.index == 50


def test_tracker_snapshot_restore_is_exact() -> None:
    x = _steps([(1.0, 40), (1.4, 30), (1.0, 30)], noise=0.02, seed=3)
    ref = ChangeTracker()
    expected = [(c.kind, c.index, c.detected_index) for v in x for c in ref.push(float(v))]
    a = ChangeTracker()
    got = [(c.kind, c.index, c.detected_index) for v in x[:45] for c in a.push(float(v))]
    b = ChangeTracker()
    b.restore(json.loads(json.dumps(a.snapshot())))
    got += [(c.kind, c.index, c.detected_index) for v in x[45:] for c in b.push(float(v))]
    assert got == expected


def test_unknown_method_is_rejected() -> None:
    with pytest.raises(ValueError):
        changepoints(np.ones(10), "magic")
