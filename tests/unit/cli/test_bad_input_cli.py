"""Bad input to the real command line (``python -m failslow ...`` in a subprocess): exit 2
(1 for a server that is not there), one line naming what is wrong, never a traceback."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED, coll_row
from failslow.cli.app import build_parser
from failslow.tracedir import TraceDir

DATA = SHARED / "data"
SA = DATA / "straggler-analysis"
FR = DATA / "flight-recorder" / "gpu_error_1st"


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "failslow", *argv], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


def _torn(tiny: Path, where: str) -> Path:
    """The tiny trace with a line cut off in the middle or at the end of coll.jsonl."""
    lines = (tiny / "coll.jsonl").read_text().splitlines()
    cut = json.dumps(coll_row(rank=1, comm_rank=1, phase="enter", t=9_000))[:25]
    lines = [*lines[:2], cut, *lines[2:]] if where == "middle" else [*lines, cut]
    (tiny / "coll.jsonl").write_text("\n".join(lines))
    return tiny


CASES = {
    "swapped --trace/--meta": (
        ["import", "straggler-analysis", "--trace", str(SA / "meta-AR.yaml"), "--meta",
         str(SA / "trace-AR.parquet"), "--out", "{tmp}/sa"], 2, "swapped"),
    "abbreviated option": (["simulate", "--pre", "mixed", "--out", "{tmp}/x"], 2,
                           "unrecognized arguments: --pre"),
    "abbreviated --clickhouse-url": (["report", "--job", "j", "--clickhouse-u", "x",
                                      "--out", "{tmp}/r.html"], 2, "unrecognized"),
    "missing dir": (["analyze", "{tmp}/nowhere"], 2, "no such directory"),
    "other tool's folder": (["analyze", str(FR)], 2, "failslow import flight-recorder"),
    "torn JSONL line in the middle": (["analyze", "{torn_middle}"], 2, "line 3"),
    "unreachable ClickHouse": (["demo", "--clickhouse-url", "http://127.0.0.1:1",
                                "--data-dir", "{tmp}/data"], 1, "127.0.0.1:1"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_with_one_line_and_no_traceback(name: str, tmp_path: Path,
                                                        tiny_trace: Path) -> None:
    argv, code, needle = CASES[name]
    if "{torn_middle}" in argv:
        _torn(tiny_trace, "middle")
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{torn_middle}", str(tiny_trace))
            for a in argv]
    done = _run(*argv, cwd=tmp_path)
    assert "Traceback" not in done.stderr + done.stdout
    assert done.returncode == code, done.stderr
    ours = [ln for ln in done.stderr.splitlines()
            if ln.startswith("failslow ") and "is deprecated" not in ln]
    assert len(ours) == 1, done.stderr
    assert needle in ours[0], ours[0]
    # client-library logs are quiet without -v: every line is failslow's own
    stray = [ln for ln in done.stderr.splitlines() if ln.strip() and "failslow" not in ln]
    assert stray == [], done.stderr


def test_no_parser_takes_abbreviations() -> None:
    seen = 0
    stack = [build_parser()]
    while stack:
        p = stack.pop()
        assert p.allow_abbrev is False, p.prog
        seen += 1
        for action in p._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):
                stack.extend(c for c in choices.values() if hasattr(c, "allow_abbrev"))
    assert seen > 15


def test_torn_last_line_dropped_with_a_warning(tiny_trace: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    whole = TraceDir(tiny_trace).read("coll").num_rows
    path = _torn(tiny_trace, "end")
    with caplog.at_level(logging.WARNING, logger="failslow.tracedir"):
        table = TraceDir(path).read("coll")
    assert table.num_rows == whole
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "coll.jsonl" in warned[0] and "line 5" in warned[0], warned


def test_torn_last_line_analyze_goes_on(tiny_trace: Path, tmp_path: Path) -> None:
    _torn(tiny_trace, "end")
    done = _run("analyze", str(tiny_trace), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["job"] == "j1"
    assert "line 5" in done.stderr and "cut off" in done.stderr


def test_torn_middle_line_is_still_an_error(tiny_trace: Path) -> None:
    path = _torn(tiny_trace, "middle")
    with pytest.raises(ValueError, match="line 3"):
        TraceDir(path).read("coll")
