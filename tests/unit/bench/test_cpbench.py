"""``failslow bench changepoints``: TCPD metrics against hand-computed cases, loading, and
a run on a small TCPD-format directory written here (no TCPD data is shipped)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from failslow import cli
from failslow.bench.changepoints import (
    BENCHMARKS,
    PUBLISHED,
    cover_single,
    covering,
    evaluate,
    f_measure,
    load_tcpd,
    parse_tcpd,
    synthetic_suite,
    true_positives,
)


def test_true_positives_use_each_prediction_once() -> None:
    # 10 and 12 both want 11: 10 comes first and takes it, 12 has nothing left within 1
    assert true_positives([10, 12], [11], margin=1) == {10}
    assert true_positives([10, 12], [11, 13], margin=1) == {10, 12}
    # the margin is inclusive
    assert true_positives([20], [25]) == {20} and true_positives([20], [26]) == set()
    assert true_positives([], [1, 2]) == set() and true_positives([3], []) == set()


def test_f_measure_by_hand() -> None:
    # one annotator at 50, prediction at 52: X = {0, 52}, T = {0, 50}: P = R = 1
    assert f_measure({"a": [50]}, [52]) == (1.0, 1.0, 1.0)
    # X = {0, 52, 80}; T* = {0, 50}: P = 2/3; annotators {0,50} -> 1, {0} -> 1: R = 1
    f, p, r = f_measure({"a": [50], "b": []}, [52, 80])
    assert p == pytest.approx(2 / 3) and r == 1.0 and f == pytest.approx(0.8)
    # nothing predicted: X = {0}, P = 1; R = (1/2 + 1/3) / 2 = 5/12; F = 2PR/(P+R) = 10/17
    f, p, r = f_measure({"a": [30], "b": [30, 90]}, [])
    assert p == 1.0 and r == pytest.approx(5 / 12) and f == pytest.approx(10 / 17)
    # a prediction 6 points away is outside the margin of 5
    f, p, r = f_measure({"a": [40]}, [46])
    assert p == 0.5 and r == 0.5 and f == 0.5


def test_cover_by_hand() -> None:
    # truth {0..9}{10..19}; predicted one segment: each true segment overlaps it 10/20
    assert cover_single([10], [], 20) == pytest.approx(0.5)
    # exact segmentation
    assert cover_single([10], [10], 20) == 1.0
    # truth one segment of 20; predicted split at 5: best overlap 15/20, weight 20 -> 0.75
    assert cover_single([], [5], 20) == pytest.approx(0.75)
    # truth {0..5}{6..9}, predicted {0..3}{4..9}: 6 * max(4/6, 2/10) + 4 * max(0, 4/6) = 6.667
    assert cover_single([6], [4], 10) == pytest.approx((6 * 4 / 6 + 4 * 4 / 6) / 10)
    # change points outside (0, n) are ignored; average over annotators
    assert covering({"a": [10], "b": []}, [0, 10, 25], 20) == pytest.approx((1.0 + 0.5) / 2)


def _write_tcpd(root: Path) -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1, 80), rng.normal(5, 1, 70)]).round(3).tolist()
    x[7] = None  # a missing value
    docs = {
        "nile": {"name": "nile", "n_obs": 150, "n_dim": 1,
                 "series": [{"label": "V1", "type": "float", "raw": x}]},
        "run_log": {"name": "run_log", "n_obs": 60, "n_dim": 2,
                    "series": [{"label": "a", "raw": [1.0] * 30 + [9.0] * 30},
                               {"label": "b", "raw": [0.0, 1.0] * 30}]},
    }
    for name, doc in docs.items():
        (root / "datasets" / name).mkdir(parents=True)
        (root / "datasets" / name / f"{name}.json").write_text(json.dumps(doc))
    (root / "annotations.json").write_text(json.dumps(
        {"nile": {"1": [80], "2": [79]}, "run_log": {"1": [30]}, "other": {"1": []}}))


def test_load_and_evaluate_a_tcpd_directory(tmp_path: Path) -> None:
    _write_tcpd(tmp_path)
    ds = load_tcpd(tmp_path)
    assert [d.name for d in ds] == ["nile", "run_log"]
    assert ds[0].values.shape == (150, 1) and np.isnan(ds[0].values[7, 0])
    assert ds[1].dims == 2
    res = evaluate(ds)
    rows = {r["dataset"]: r for r in res["datasets"]}
    for method in ("bocd+v", "bocd", "window"):
        assert rows["nile"][method]["f1"] == 1.0, method
        assert rows["nile"][method]["cover"] > 0.95
    assert rows["run_log"]["bocd+v"]["changepoints"] == [30]
    assert rows["nile"]["published_bocpd"]["default_f1"] == 1.0
    assert res["means"]["multivariate"]["datasets"] == 1
    assert "occupancy" in res["missing_published_datasets"]


def test_parse_rejects_ragged_series() -> None:
    with pytest.raises(ValueError):
        parse_tcpd({"name": "x", "series": [{"raw": [1, 2]}, {"raw": [1]}]})


def test_benchmark_entry_and_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_tcpd(tmp_path)
    out = BENCHMARKS["changepoints"](argparse.Namespace(data=str(tmp_path), json=True))
    assert out["source"] == str(tmp_path) and set(out["datasets"]) == {"nile", "run_log"}
    flat = BENCHMARKS["changepoints"](argparse.Namespace(data=str(tmp_path), json=False))
    assert "bocd+v F1 1.000" in flat["univariate (1)"]
    assert "default F1 1.000" in flat["univariate published BOCPD (1)"]
    assert "per-dataset" not in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a directory"):
        BENCHMARKS["changepoints"](argparse.Namespace(data=str(tmp_path / "x"), json=True))
    assert cli.main(["bench", "changepoints", "--data", str(tmp_path / "nowhere")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_synthetic_suite_scores() -> None:
    res = evaluate(synthetic_suite())
    m = res["means"]["all"]
    assert m["bocd+v"]["f1"] >= 0.9 and m["bocd+v"]["cover"] >= 0.85
    rows = {r["dataset"]: r for r in res["datasets"]}
    assert rows["constant"]["bocd+v"]["changepoints"] == []
    assert rows["outliers_no_change"]["bocd+v"]["changepoints"] == []


def test_published_figures_reproduce_the_paper_means() -> None:
    uni = [k for k in PUBLISHED if k not in ("apple", "bee_waggle_6", "occupancy", "run_log")]
    excluded = {"bitcoin", "scanline_126007", "uk_coal_employ"}
    d = [PUBLISHED[k] for k in uni if k not in excluded]
    assert np.mean([v["default_cover"] for v in d]) == pytest.approx(0.636, abs=6e-4)
    assert np.mean([v["default_f1"] for v in d]) == pytest.approx(0.611, abs=6e-4)
    o = [PUBLISHED[k] for k in uni if PUBLISHED[k]["oracle_f1"] is not None]
    assert np.mean([v["oracle_f1"] for v in o]) == pytest.approx(0.831, abs=6e-4)
    assert np.mean([v["oracle_cover"] for v in o]) == pytest.approx(0.789, abs=6e-4)
