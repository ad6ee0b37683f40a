"""``failslow analyze``'s progress (``engine.runner.Progress``): the trace's span first,
then every analysed batch up to its end, then the what-if phase; the bar on a terminal and
nothing on a pipe; the summary line in the log; the same bar for ``report`` and ``plan
advice``."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from failslow import cli
from failslow.cli.analyze import ReplayBar
from failslow.engine.offline import analyze
from failslow.simulator import scenario_from_dict, simulate
from failslow.tracedir import write_trace

JOB = {"job": "progress", "parallel": {"tp": 2, "pp": 2, "dp": 2, "cp": 1},
       "microbatches": 4, "schedule": "1f1b", "iterations": 14,
       "faults": [{"cause": "compute", "ranks": [5], "start": 5, "duration": 5, "severity": 2.0}]}


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...]]] = []

    def span(self, first_ns: int, last_ns: int) -> None:
        self.calls.append(("span", (first_ns, last_ns)))

    def advance(self, now_ns: int, rows: int, anomalies: int) -> None:
        self.calls.append(("advance", (now_ns, rows, anomalies)))

    def phase(self, name: str) -> None:
        self.calls.append(("phase", (name,)))


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sim = simulate(scenario_from_dict(JOB), seed=3)
    return write_trace(tmp_path_factory.mktemp("progress") / "t", [sim.meta], sim.tables)


def test_progress_follows_the_replay_to_the_end(trace: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder()
    with caplog.at_level(logging.INFO, logger="failslow.engine.offline"):
        diag = analyze(trace, progress=rec)
    kinds = [k for k, _ in rec.calls]
    assert kinds[0] == "span" and kinds[-1] == "phase" and kinds.count("span") == 1
    assert rec.calls[-1][1] == ("what-if analysis",)
    first, last = rec.calls[0][1]
    steps = [args for k, args in rec.calls if k == "advance"]
    times = [int(str(a[0])) for a in steps]
    rows = [int(str(a[1])) for a in steps]
    assert len(steps) >= 3 and times == sorted(times) and rows == sorted(rows)
    assert int(str(first)) < times[0] and times[-1] == last
    coll = pq.read_metadata(trace / "coll.parquet").num_rows
    assert rows[-1] == coll
    assert int(str(steps[-1][2])) == len(diag.anomalies) >= 1
    [line] = [r.getMessage() for r in caplog.records if "analysed in" in r.getMessage()]
    assert f"{coll} coll rows of 8 ranks" in line and f"anomalies: {len(diag.anomalies)}" in line


def test_the_bar_shows_on_a_terminal_only(trace: Path) -> None:
    out = io.StringIO()
    with ReplayBar(Console(file=out, force_terminal=True, width=160)) as bar:
        analyze(trace, progress=bar)
    shown = out.getvalue()
    assert "s of trace" in shown and "what-if analysis" in shown and "anomalies: 1" in shown
    piped = io.StringIO()
    with ReplayBar(Console(file=piped, force_terminal=False)) as bar:
        analyze(trace, progress=bar)
    assert piped.getvalue() == ""


def test_json_output_stays_clean(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["analyze", str(trace), "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["anomalies"] and "s of trace" not in out.out


@pytest.mark.parametrize("command", ["report", "plan advice"])
def test_report_and_advice_show_the_replay_too(trace: Path, command: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``failslow report TRACE_DIR`` and ``failslow plan advice --trace`` replay the trace
    the way ``analyze`` does: the same bar, up to the trace's end."""
    from failslow.cli import analyze as analyze_cli
    from failslow.cli.plan import trace_advice
    from failslow.cli.report import from_trace_dir

    out = io.StringIO()

    class OnTerminal(ReplayBar):
        def __init__(self) -> None:
            super().__init__(Console(file=out, force_terminal=True, width=160))

    monkeypatch.setattr(analyze_cli, "ReplayBar", OnTerminal)
    if command == "report":
        from_trace_dir(trace, whatif=False)
    else:
        trace_advice(str(trace))
    shown = out.getvalue()
    span = pq.read_table(trace / "coll.parquet", columns=["t"]).column("t")
    total = (max(span.to_pylist()) - min(span.to_pylist())) / 1e9
    assert f"{total:.1f} / {total:.1f} s of trace" in shown
