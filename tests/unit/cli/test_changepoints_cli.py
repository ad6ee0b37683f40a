"""``failslow changepoints SERIES.csv``: CSV reading, methods, output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from failslow.cli import changepoints as changepoints_cli
from failslow.cli.changepoints import SeriesError, read_series


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="failslow")
    sub = parser.add_subparsers()
    changepoints_cli.add_parser(sub)
    args = parser.parse_args(["changepoints", *argv])
    code = args.func(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _write(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    lines = [",".join(header)] + [",".join("" if v is None else str(v) for v in r)
                                  for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def _step(n: int = 200, at: int = 120, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(10, 1, at), rng.normal(14, 1, n - at)])


def test_json_output_with_a_date_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    x = _step()
    f = _write(tmp_path / "s.csv", ["date", "latency_ms"],
               [[f"2024-01-{1 + i // 24:02d}T{i % 24:02d}", round(v, 3)] for i, v in enumerate(x)])
    code, out, _ = _run([str(f), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["method"] == "bocd+v" and doc["n"] == 200 and doc["columns"] == ["latency_ms"]
    assert doc["changepoints"] == [120]
    assert doc["labels"] == ["2024-01-06T00"]


def test_text_output_lists_one_index_per_line(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    f = _write(tmp_path / "s.csv", ["value"], [[round(v, 3)] for v in _step(at=80)])
    code, out, _ = _run([str(f)], capsys)
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert code == 0 and lines == ["80"]


@pytest.mark.parametrize("method", ["bocd+v", "bocd", "window"])
def test_every_method_finds_a_clear_step(tmp_path: Path, method: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    f = _write(tmp_path / "s.csv", ["t", "x"], [[i, round(v, 3)] for i, v in enumerate(_step())])
    code, out, _ = _run([str(f), "--json", "--method", method], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["method"] == method and doc["columns"] == ["x"]
    assert any(abs(c - 120) <= 2 for c in doc["changepoints"])


def test_several_columns_are_one_multivariate_series_with_gaps(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(0, 1, 200)
    b = _step(seed=2)
    rows: list[list[object]] = [[round(u, 3), round(v, 3)] for u, v in zip(a, b, strict=True)]
    rows[5][0] = "NA"
    rows[60][1] = None
    f = _write(tmp_path / "s.csv", ["a", "b"], rows)
    code, out, _ = _run([str(f), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["columns"] == ["a", "b"] and doc["changepoints"] == [120]


def test_an_evenly_counting_first_column_is_the_index() -> None:
    names, values, index = read_series("step;x;y\n0;1;2\n5;1;3\n10;2;2\n", "s")
    assert names == ["x", "y"] and values.shape == (3, 2) and index == ["0", "5", "10"]
    # a single numeric column is the series itself
    names, values, index = read_series("x\n3\n1\n2\n", "s")
    assert names == ["x"] and index is None and values[:, 0].tolist() == [3.0, 1.0, 2.0]


def test_files_without_a_series_are_rejected(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SeriesError):
        read_series("name,host\na,b\nc,d\n", "s")
    with pytest.raises(SeriesError):
        read_series("x\n", "s")
    f = _write(tmp_path / "bad.csv", ["name"], [["a"], ["b"]])
    code, out, err = _run([str(f)], capsys)
    assert code == 2 and out == "" and "no numeric column" in err
    code, _, err = _run([str(tmp_path / "missing.csv")], capsys)
    assert code == 2 and err


def test_a_bad_cell_is_an_error_naming_its_line_and_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SeriesError, match=r"line 4, column 3 \(b\): 'oops'"):
        read_series("t,a,b\n0,1,2\n1,1,3\n2,2,oops\n3,2,2\n", "s")
    with pytest.raises(SeriesError, match=r"line 3, column 1 \(x\): 'inf'"):
        read_series("x\n1\ninf\n2\n", "s")
    with pytest.raises(SeriesError, match="line 3 has 3 cells but the header has 2"):
        read_series("a,b\n1,2\n1,2,3\n", "s")
    f = _write(tmp_path / "bad.csv", ["a", "b"], [[1, 2], [3, "x1"], [5, 6]])
    code, out, err = _run([str(f), "--json"], capsys)
    assert code == 2 and out == "" and "line 3, column 2 (b)" in err


def test_missing_values_and_a_text_index_are_accepted() -> None:
    names, values, index = read_series(
        "date,a,b\n2024-01,1,NA\n2024-02,,2\n2024-03,null,n/a\n2024-04,4,5\n", "s")
    assert names == ["a", "b"] and index == ["2024-01", "2024-02", "2024-03", "2024-04"]
    assert np.isnan(values[1, 0]) and np.isnan(values[0, 1]) and values[3].tolist() == [4, 5]


def test_bad_options_and_binary_files_are_clear_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _write(tmp_path / "s.csv", ["x"], [[round(v, 3)] for v in _step()])
    code, out, err = _run([str(f), "--hazard", "0.5"], capsys)
    assert code == 2 and out == "" and "--hazard" in err
    b = tmp_path / "b.csv"
    b.write_bytes(b"\xff\xfe\x00\x81x\n")
    code, out, err = _run([str(b)], capsys)
    assert code == 2 and out == "" and str(b) in err
