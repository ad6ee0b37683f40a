"""Change points in iteration times (Greyhound §4.2): BOCD, verification, sliding window."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from support.snapshots import roundtrip

from failslow.detectors.changepoints import (
    BOCD,
    METHODS,
    SERIES_METHODS,
    ChangeConfig,
    ChangeTracker,
    binom_sf,
    bocd_candidates,
    bocpd_map,
    changepoints,
    detect_changepoints,
    fisher_combined,
    run_chance,
    segment,
    standardize,
    window_candidates,
)
from failslow.detectors.slowdown.config import SlowdownConfig


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
    b.restore(roundtrip(a.snapshot()))
    got += [(c.kind, c.index, c.detected_index) for v in x[45:] for c in b.push(float(v))]
    assert got == expected


def test_unknown_method_is_rejected() -> None:
    with pytest.raises(ValueError):
        changepoints(np.ones(10), "magic")


# --------------------------------------------------------------------------- robust verification


def test_pauses_on_a_noisy_baseline_are_not_a_slowdown() -> None:
    # a job whose iterations often carry a 30-60% pause (GC): once the baseline has seen
    # a few of them, bursts of pauses are jitter
    rng = np.random.default_rng(3)
    x = 1 + rng.normal(0, 0.01, 400)
    spikes = rng.random(400) < 0.2
    spikes[:30] = np.arange(30) % 5 == 0
    x[spikes] *= rng.uniform(1.3, 1.6, int(spikes.sum()))
    assert changepoints(x) == []


def test_a_slowdown_on_a_noisy_baseline_is_still_found() -> None:
    rng = np.random.default_rng(4)
    x = np.concatenate([np.ones(60), np.full(40, 1.25)]) * (1 + rng.normal(0, 0.01, 100))
    spikes = rng.random(100) < 0.15
    x[spikes] *= 1.5
    cps = changepoints(x)
    assert cps and 58 <= cps[0] <= 62


def test_binomial_tail() -> None:
    assert binom_sf(0, 5, 0.3) == 1.0
    assert binom_sf(6, 5, 0.3) == 0.0
    assert binom_sf(2, 2, 0.1) == pytest.approx(0.01)
    assert binom_sf(1, 3, 0.5) == pytest.approx(1 - 0.125)


def test_second_slowdown_during_an_open_one_is_its_own_level() -> None:
    tr = ChangeTracker()
    changes = []
    for v in _steps([(1.0, 30), (1.3, 20), (1.8, 15), (1.3, 10), (1.0, 20)], seed=5):
        changes += tr.push(float(v))
    kinds = [(c.kind, c.depth) for c in changes]
    assert kinds[:2] == [("onset", 1), ("onset", 2)]
    first_relief = next(c for c in changes if c.kind == "relief")
    assert first_relief.depth == 1 and 63 <= first_relief.index <= 67  # back to 1.3
    assert changes[-1].kind == "relief" and changes[-1].depth == 0
    assert 73 <= changes[-1].index <= 77


def test_a_slowdown_soon_after_a_relief_is_tested_against_the_earlier_baseline() -> None:
    """A second fault four iterations after the first ended (a straggler, then a link): the
    job is back at its baseline, so the healthy values from before the first stay part of
    the reference and the second is confirmed on two slow iterations, not after
    ``min_baseline`` new healthy ones."""
    x = _steps([(1.0, 30), (1.5, 10), (1.0, 4), (1.4, 10), (1.0, 10)], seed=7)
    tr = ChangeTracker()
    changes = [c for v in x for c in tr.push(float(v))]
    assert [c.kind for c in changes] == ["onset", "relief", "onset", "relief"]
    second = changes[2]
    assert second.index == 44 and second.detected_index - second.index <= 2
    assert abs(second.ratio - 1.4) < 0.05


@pytest.mark.parametrize("seed", [1, 2, 4, 5])
def test_mild_noise_then_a_far_larger_step_opens_the_level_at_the_step(seed: int) -> None:
    """A noisy baseline (8%), two mildly slow iterations (scheduling noise), then an 8x
    step: the first 8x value alone would carry the sign test over the noisy tail and open
    the level at the noise, measured at its height (1.25x). The level opens at the step,
    confirmed one iteration later, at the step's height."""
    x = np.concatenate([_steps([(1.0, 20)], noise=0.08, seed=seed), [1.26, 1.07],
                        _steps([(8.0, 10)], noise=0.02, seed=4)])
    tr = ChangeTracker(SlowdownConfig().change)
    changes = [c for v in x for c in tr.push(float(v))]
    assert [(c.kind, c.index, c.detected_index) for c in changes] == [("onset", 22, 23)]
    assert abs(changes[0].ratio - 8.0) < 0.6


def test_a_pause_just_before_a_mild_slow_down_does_not_open_its_level() -> None:
    """Held-out seed 9 ``link-dp-4``: a GC pause (2x), one healthy iteration, then the job
    11% slower. Clipped to the two levels, the pause and the healthy value after it cancel
    out in the CUSUM split, and the level opened at the pause: its localization and the
    healthy one after it delayed the confirmation of the slow link by five iterations. A
    value far above both levels is a pause, of neither level: the level opens at the
    slow-down."""
    x = [76.3, 38.9, 41.6, 40.4, 40.1, 39.6, 38.7, 40.29, 83.6, 40.31, 45.5, 43.3, 44.7]
    tr = ChangeTracker(SlowdownConfig().change)
    changes = [c for v in x for c in tr.push(v)]
    assert [(c.kind, c.index, c.detected_index) for c in changes] == [("onset", 10, 12)]


def test_an_unconfirmed_level_keeps_its_values_in_the_healthy_segment() -> None:
    tr = ChangeTracker()
    for v in _steps([(1.0, 30), (1.4, 6), (1.0, 3)], seed=8):
        tr.push(float(v))
    assert tr.state == "normal" and tr.seg_start > 30 and len(tr.prev_ref) == 30
    tr.keep_segment(0)  # the caller never confirmed the level: undo the new segment
    assert tr.seg_start == 0 and tr.prev_ref == []


def test_reject_returns_to_the_baseline_and_merge_folds_a_level() -> None:
    tr = ChangeTracker()
    for v in _steps([(1.0, 30), (1.4, 5)], seed=6):
        tr.push(float(v))
    assert tr.state == "anomalous"
    tr.reject()
    assert tr.state == "normal" and tr.levels == []
    tr = ChangeTracker()
    for v in _steps([(1.0, 30), (1.3, 15), (1.7, 5)], seed=6):
        tr.push(float(v))
    assert len(tr.levels) == 2
    tr.merge_top()
    assert len(tr.levels) == 1 and tr.level > 1.5


@pytest.mark.parametrize("method", METHODS)
def test_iteration_series_methods(method: str) -> None:
    x = _steps([(1.0, 40), (1.5, 30), (1.0, 30)])
    cps = detect_changepoints(x, method)
    assert any(abs(c - 40) <= 2 for c in cps)


# --------------------------------------------------------------------------- any series


def test_segment_finds_a_mean_shift_and_ignores_outliers() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1, 200), rng.normal(3, 1, 300)])
    x[[50, 350]] += 12  # lone outliers
    assert segment(x) == [200]


def test_segment_ignores_a_trend_and_noise() -> None:
    rng = np.random.default_rng(1)
    assert segment(np.arange(400) * 0.05 + rng.normal(0, 1, 400)) == []
    assert segment(rng.normal(5, 2, 400)) == []


def test_segment_finds_a_variance_change_and_a_slope_change() -> None:
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(0, 1, 250), rng.normal(0, 5, 250)])
    (cp,) = segment(x)
    assert abs(cp - 250) <= 5
    t = np.arange(300, dtype=float)
    y = np.where(t < 150, 0.0, (t - 150) * 0.3) + rng.normal(0, 1, 300)
    (cp,) = segment(y)
    assert abs(cp - 150) <= 10


def test_segment_multivariate_and_missing_values() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (300, 2))
    x[150:, 1] += 4  # only the second column changes
    x[[10, 11, 200], 0] = np.nan
    assert segment(x) == [150]
    for method in SERIES_METHODS:
        cps = segment(x, method)
        assert any(abs(c - 150) <= 3 for c in cps), method


def test_segment_short_and_constant_series() -> None:
    assert segment(np.array([1.0, 2.0])) == []
    assert segment(np.ones(50)) == []
    with pytest.raises(ValueError):
        segment(np.ones(10), "magic")


def test_bocpd_map_recovers_steps() -> None:
    rng = np.random.default_rng(4)
    z = standardize(np.concatenate([rng.normal(0, 1, 100), rng.normal(4, 1, 100),
                                    rng.normal(-2, 1, 100)]))
    cps = bocpd_map(z)
    assert any(abs(c - 100) <= 2 for c in cps) and any(abs(c - 200) <= 2 for c in cps)


def test_segment_places_one_change_at_a_peak() -> None:
    # a rise then a fall: BOCPD (constant-level model) proposes changes on both flanks; the
    # verification moves one to the peak and drops the other
    rng = np.random.default_rng(5)
    t = np.arange(200, dtype=float)
    x = np.where(t < 100, t * 0.1, 10 - (t - 100) * 0.1) + rng.normal(0, 0.3, 200)
    (cp,) = segment(x)
    assert abs(cp - 100) <= 3


def test_segment_survives_an_empty_column_and_infinities() -> None:
    rng = np.random.default_rng(6)
    x = np.stack([np.concatenate([rng.normal(0, 1, 100), rng.normal(5, 1, 100)]),
                  np.full(200, np.nan)], axis=1)
    x[50, 0] = np.inf
    assert segment(x) == [100]


def test_window_series_places_a_step_where_it_is() -> None:
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(0, 1, 80), rng.normal(5, 1, 70)])
    assert segment(x, "window") == [80]


def test_two_far_slower_iterations_confirm_over_a_short_reference_with_a_blip() -> None:
    """Seven healthy iterations, one of them 6.5% long, then a 1.7x slow-down: the blip
    makes the usual limit's exceedance rate 1 in 8, so two values alone are no evidence
    there; at three thresholds up nothing in the reference comes close and the two values
    confirm the onset (the second slow iteration, not the third)."""
    tracker = ChangeTracker(ChangeConfig(alpha=0.01, threshold=0.04))
    healthy = [83.6, 82.9, 88.3, 82.2, 83.3, 81.6, 80.8]
    changes = [tracker.push(v) for v in healthy]
    assert not any(changes)
    assert tracker.push(141.6) == []
    onset = tracker.push(144.8)
    assert [(c.kind, c.index, c.detected_index) for c in onset] == [("onset", 7, 8)]


def test_a_pause_in_the_reference_still_counts_at_the_strong_limit() -> None:
    """A reference holding a pause as long as the slow values: two slow values are no
    more evidence at the strong limit than at the usual one."""
    tracker = ChangeTracker(ChangeConfig(alpha=0.01, threshold=0.04))
    for v in [83.6, 82.9, 150.0, 82.2, 83.3, 81.6, 80.8]:
        tracker.push(v)
    assert tracker.push(141.6) == [] and tracker.push(144.8) == []


def _paused(n: int, every: int, seed: int) -> list[float]:
    """A quiet healthy stretch (100 ms, 0.5% noise) with a pause (1.8x) every ``every``
    iterations, never two in a row."""
    rng = np.random.default_rng(seed)
    x = 100.0 * (1 + rng.normal(0, 0.005, n))
    x[every - 1::every] *= 1.8
    return [float(v) for v in x]


def test_run_chance_never_beats_the_count_without_exceedances_and_tracks_runs() -> None:
    """Without exceedances ``q`` falls back to its prior and the count test (``p ** n``)
    is the stricter; exceedances in runs make a run of slow values likelier than their
    count says, lone ones make it rarer."""
    quiet = np.zeros(20, dtype=bool)
    p = 0.5 / 21
    assert run_chance(quiet, p, 3) >= p ** 3
    runs = np.zeros(20, dtype=bool)
    runs[4:8] = runs[12:16] = True
    alone = np.zeros(20, dtype=bool)
    alone[3::4] = True
    p_runs, p_alone = 8.5 / 21, 5.5 / 21
    assert run_chance(runs, p_runs, 3) > p_runs ** 3
    assert run_chance(alone, p_alone, 3) < p_alone ** 3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_three_slow_iterations_confirm_where_pauses_come_alone(seed: int) -> None:
    """A reference with a lone pause every fourth iteration (p ~ 0.26): the count of
    exceedances needs four slow values in a row (0.26^3 > alpha), the run test three
    (pauses never came two in a row, so three slow values in a row are no pause)."""
    tr = ChangeTracker(SlowdownConfig().change)
    for v in _paused(22, 4, seed):  # the last pause two iterations before the step
        assert tr.push(v * 1e6) == []
    pushed = [tr.push(130.0e6 * f) for f in (1.0, 1.004, 0.997, 1.002)]
    at = [i for i, out in enumerate(pushed) if any(c.kind == "onset" for c in out)]
    assert at == [2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_pause_over_two_iterations_does_not_confirm_where_pauses_come_alone(seed: int
                                                                               ) -> None:
    """A pause may straddle an iteration boundary: two long values in a row, then back to
    normal, are no onset even though the reference's pauses all came alone."""
    tr = ChangeTracker(SlowdownConfig().change)
    for v in _paused(22, 4, seed):
        tr.push(v * 1e6)
    out = [tr.push(v * 1e6) for v in (175.0, 150.0, 100.2, 99.8, 100.1)]
    assert not any(c.kind == "onset" for o in out for c in o)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mild_noise_before_a_step_is_no_part_of_its_run(seed: int) -> None:
    """Two mildly slow values (above the usual limit, below three thresholds up) and then
    a step not far enough above them for ``jump_k`` (held-out seed 1, ``compute-7``): the
    run test counts only values far above the reference, so the new level starts at the
    step, not at the noise before it (a root found only from the level's third iteration
    on needs one more iteration to persist)."""
    tr = ChangeTracker(SlowdownConfig().change)
    for v in _paused(22, 4, seed):
        tr.push(v * 1e6)
    onsets = [c for v in (114.0, 109.0, 147.0, 148.0, 146.5, 147.5)
              for c in tr.push(v * 1e6) if c.kind == "onset"]
    assert [c.index for c in onsets] == [24]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_mild_slowdown_confirms_where_every_exceedance_is_a_far_pause(seed: int) -> None:
    """Held-out seed 11 ``compute-pass-0``: the reference's exceedances are all pauses far
    up (1.8x, p ~ 0.24 at the usual limit), the slow-down is mild (1.1x). Values between
    the usual and the strong limit are what the reference never holds, so two of them
    confirm (the count test alone needed four in a row), pauses in the tail or not."""
    tr = ChangeTracker(SlowdownConfig().change)
    for v in _paused(22, 4, seed):
        assert tr.push(v * 1e6) == []
    pushed = [tr.push(v * 1e6) for v in (110.2, 109.7, 180.0, 110.4, 109.9)]
    at = [i for i, out in enumerate(pushed) if any(c.kind == "onset" for c in out)]
    assert at == [1]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_mild_values_the_reference_holds_often_do_not_confirm(seed: int) -> None:
    """The mirror: a reference with a far pause every fourth value and a mild one (1.1x)
    every eighth. The band test applies (fewer mild exceedances than far ones), and against
    the reference's own rate in the band (p ~ 0.13) two mild values in a row are its usual
    noise, not an onset."""
    rng = np.random.default_rng(seed)
    x = 100.0 * (1 + rng.normal(0, 0.005, 40))
    x[1::8] *= 1.1
    x[3::4] *= 1.8
    tr = ChangeTracker(SlowdownConfig().change)
    for v in x:
        assert tr.push(float(v) * 1e6) == []
    assert [tr.push(v * 1e6) for v in (110.2, 109.7, 100.3, 99.8)] == [[], [], [], []]


def test_noise_whose_exceedances_are_mostly_mild_keeps_the_count_test() -> None:
    """The simulator's clean ``h256-noise`` job (sequence-length noise of 10%, a GC pause
    now and then; ``failslow bench accuracy``): its reference exceeds the usual limit mostly
    by mild values, so the band test does not apply, and the drift after iteration 19 is no
    change point (with the band test it was one)."""
    ms = [578.0, 687.4, 508.3, 539.7, 755.2, 472.7, 585.0, 498.2, 520.3, 556.7, 609.2,
          573.0, 510.6, 549.8, 527.7, 582.9, 541.6, 500.5, 497.8, 681.9, 485.7, 633.2,
          497.6, 600.4, 692.4, 588.6, 568.2, 661.7, 647.8, 597.6, 468.9]
    assert changepoints(np.array(ms) * 1e6) == []


def test_a_few_fast_iterations_do_not_reset_the_baseline_before_a_slowdown() -> None:
    """A short job's noisy start (held-out, 512 ranks): three iterations faster than the
    first ones are jitter, not the end of warm-up; the slow-down right after them is
    confirmed within three iterations against the baseline so far (it was confirmed seven
    iterations late against a three-iteration baseline)."""
    ms = [146.3, 89.5, 101.9, 97.2, 98.6, 98.7, 89.9, 89.5, 89.9,  # healthy
          201.5, 130.4, 130.0, 137.9, 182.4, 130.3, 142.6, 141.7, 139.5]  # 1.4x from 9
    tr = ChangeTracker(SlowdownConfig().change)  # the slow-down detector's settings
    onsets = [(i, ch) for i, v in enumerate(ms) for ch in tr.push(v * 1e6)
              if ch.kind == "onset"]
    assert onsets, "no onset"
    at, onset = onsets[0]
    assert onset.index == 9
    assert at - onset.index <= 3


def test_a_lasting_speed_up_still_resets_the_baseline() -> None:
    """The end of a long warm-up: once the faster level lasts a baseline's length it is
    the new baseline, so a later slow-down back to the warm-up time is an onset."""
    x = _steps([(1.6, 12), (1.0, 20), (1.5, 10)], noise=0.01, seed=3)
    tr = ChangeTracker(ChangeConfig())
    onsets = [ch for v in x for ch in tr.push(float(v)) if ch.kind == "onset"]
    assert [o.index for o in onsets] == [32]


def test_fisher_combination_of_two_chances() -> None:
    assert fisher_combined(1.0, 1.0) == pytest.approx(1.0)
    assert fisher_combined(0.0, 0.5) == 0.0
    # chi-square with 4 degrees of freedom beyond -2 ln(p1 p2)
    p = 0.01 * 0.05
    x = -2 * np.log(p)
    assert fisher_combined(0.01, 0.05) == pytest.approx(np.exp(-x / 2) * (1 + x / 2))
    # never below either chance alone times its own log factor: two weak chances make no
    # strong one (0.1 and 0.1 -> 0.056, not 0.01)
    assert fisher_combined(0.1, 0.1) > 0.05


def _noisy_then_slow(seed: int) -> np.ndarray:
    """40 healthy iterations, two in every five slowed 30-50% by pauses that last two
    iterations, then a 25% slow-down: the iteration times alone confirm it only after
    several values (the reference's exceedances come in runs)."""
    rng = np.random.default_rng(seed)
    x = 1 + rng.normal(0, 0.01, 60)
    spikes = np.arange(60) % 5 < 2
    spikes[40:] = False
    x[spikes] *= rng.uniform(1.3, 1.5, int(spikes.sum()))
    x[40:] *= 1.25
    return x


def _first_onset(x: np.ndarray, corroborate: Callable[[int, int], float] | None = None,
                 after: int = 3) -> tuple[int, int] | None:
    tracker = ChangeTracker(ChangeConfig(alpha=0.01, threshold=0.04, corroborate_after=after))
    tracker.corroborate = corroborate
    for v in x:
        for ch in tracker.push(float(v)):
            if ch.kind == "onset":
                return ch.index, ch.detected_index
    return None


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rank_evidence_confirms_an_onset_that_pauses_hide(seed: int) -> None:
    x = _noisy_then_slow(seed)
    alone = _first_onset(x)
    assert alone == (40, 45)  # the series alone: 6 values
    calls: list[tuple[int, int]] = []

    def one_root_each(hi: int, i: int) -> float:
        calls.append((hi, i))
        return 32 * (1 / 32) ** (i - hi + 1) if hi >= 40 else 1.0  # one rank of 32, each

    got = _first_onset(x, one_root_each)
    assert got == (40, 42)  # 3 values (2 are not enough: Fisher's 0.03 > 0.01)
    assert all(i - hi + 1 <= 3 for hi, i in calls)  # never beyond corroborate_after
    # evidence that says nothing, or no evidence asked for, changes nothing
    assert _first_onset(x, lambda hi, i: 1.0) == alone
    assert _first_onset(x, one_root_each, after=0) == alone


def test_rank_evidence_alone_opens_no_level_on_healthy_values() -> None:
    # rank evidence joins the series' test, it does not replace it: where pauses slow
    # two iterations in every five (never two in a row), one or two paused values among
    # the last two or three are no news however strongly the caller vouches for them
    # (their own chance is over corroborate_alpha)
    rng = np.random.default_rng(6)
    x = 1 + rng.normal(0, 0.01, 80)
    spikes = np.isin(np.arange(80) % 5, (0, 2))
    x[spikes] *= rng.uniform(1.3, 1.5, int(spikes.sum()))
    assert _first_onset(x, lambda hi, i: 1e-9) is None


def test_the_series_test_at_the_floor_confirms_nothing_without_the_callers_evidence() -> None:
    """The floor test leaves the limits where pauses in the reference do not raise them:
    alone, however small its chance, it is no onset (the caller's evidence must point
    that way on its own too, ``corroborate_alpha``)."""
    tracker = ChangeTracker(ChangeConfig(alpha=0.01, corroborate_after=3))
    asked: list[float] = []

    def evidence(value: float) -> None:
        def chance(hi: int, i: int) -> float:
            asked.append(value)
            return value

        tracker.corroborate = chance

    evidence(1.0)
    assert not tracker._corroborated(10, 12, True, 1e-9)
    evidence(0.3)
    assert not tracker._corroborated(10, 12, True, 1e-9)
    evidence(0.15)
    assert tracker._corroborated(10, 12, True, 1e-4)
    assert not tracker._corroborated(10, 12, True, 0.05)  # Fisher: 0.0075 -> 0.056
    assert not tracker._corroborated(10, 12, True, 0.3)  # the series says no
    assert not tracker._corroborated(10, 12, False, 1e-9)  # nor its median
    assert asked == [1.0, 0.3, 0.15, 0.15]  # not asked when the series says no
