"""``failslow report``: from a trace directory and from ClickHouse, the critical path, the
what-if section, the Perfetto export, and the page in headless Chromium (renders, no console
errors, shows the anomaly, screenshot)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import SMALL
from failslow.cli import report as report_cli
from failslow.dashboards import critical_path as cp
from failslow.events import from_rows

PNG = b"\x89PNG\r\n\x1a\n"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="failslow")
    report_cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["report", *argv])


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.images: dict[str, str] = {}
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"] or "")
        if tag == "img":
            self.images[a.get("id") or a.get("alt") or ""] = a.get("src") or ""
            if not (a.get("src") or "").startswith("data:image/png;base64,"):
                self.external.append(tag)
        if tag in ("script", "link", "iframe"):
            self.external.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "small.yaml").write_text(SMALL)
    from failslow import cli

    assert cli.main(["simulate", "--scenario", str(tmp / "small.yaml"),
                     "--out", str(tmp / "trace")]) == 0
    return tmp / "trace"


@pytest.fixture(scope="module")
def built(trace: Path) -> tuple[Path, Path]:
    out, perfetto = trace.parent / "out" / "report.html", trace.parent / "out" / "trace.json"
    assert report_cli.run(_parse([str(trace), "--out", str(out),
                                  "--perfetto", str(perfetto)])) == 0
    return out, perfetto


def test_report_from_a_trace_directory(built: tuple[Path, Path]) -> None:
    out, _ = built
    html = out.read_text()
    page = _Page()
    page.feed(html)
    assert page.external == []  # one self-contained file
    assert {"iterations", "heatmap", "critical"} <= set(page.images)
    assert {"anomalies", "truth", "critical-path", "whatif", "whatif-table"} <= page.ids
    # the default planner costs (S2: 5 s) exceed this short job's loss: a note says so
    assert "advice" in page.ids and "No advice: the impact so far" in html
    assert "below the cheapest action" in html and "cost: S2" in html
    text = " ".join(page.text)
    assert "compute" in text and "communication" in text and "4–12" in text
    assert "pp_p2p" in text and "2 of 2 found" in text
    assert html.count("data:image/png;base64,") >= 5  # + what-if heatmaps


def test_critical_path_of_the_slow_iteration_blames_the_straggler(trace: Path) -> None:
    data = report_cli.from_trace_dir(trace, whatif=False)
    assert data.truth is not None  # truth.json of the simulated trace
    # the injected compute fault (ground truth, whatever the detectors made of it)
    compute = next(a for a in data.truth.anomalies if a.cause == "compute")
    it, t0, t1 = cp.slow_iteration(data.iterations, [compute])
    assert compute.start_ns is not None and compute.end_ns is not None
    assert t1 >= compute.start_ns and t0 <= compute.end_ns  # inside the slow-down
    coll, _ = data.window(t0, t1)
    path = cp.critical_path(coll, t0, t1)
    # contiguous: every segment starts where the previous one ended
    assert all(a.t1 == b.t0 for a, b in zip(path, path[1:], strict=False))
    assert path[-1].t1 <= t1 and path[0].t0 >= t0
    summary = cp.summarize(path)
    top_rank, top_ns = next(iter(summary["compute_by_rank_ns"].items()))
    # the straggler's compute is most of the path's compute (its peers wait in collectives)
    assert top_rank == 5 and top_ns > 0.5 * summary["by_kind_ns"]["compute"]


def test_critical_path_of_a_tiny_job() -> None:
    """Two ranks, two all-reduces; rank 1 is late to the second one."""
    def row(rank: int, seq: int, phase: str, t: int) -> dict[str, object]:
        return {"job": "j", "rank": rank, "comm": 9, "comm_rank": rank, "comm_size": 2,
                "seq": seq, "op": "allreduce", "bytes": 8, "peer": -1, "phase": phase, "t": t}

    coll = from_rows("coll", [
        row(0, 0, "enter", 10), row(1, 0, "enter", 12), row(0, 0, "end", 20),
        row(1, 0, "end", 21), row(0, 1, "enter", 25), row(1, 1, "enter", 60),
        row(0, 1, "end", 70), row(1, 1, "end", 70)])
    path = cp.critical_path(coll, 0, 100)
    assert [(s.kind, s.rank, s.t0, s.t1) for s in path] == [
        ("compute", 1, 0, 12), ("communication", 1, 12, 21),
        ("compute", 1, 21, 60), ("communication", 1, 60, 70)]
    assert cp.critical_path(coll, 200, 300) == []


def test_perfetto_trace(built: tuple[Path, Path], trace: Path) -> None:
    _, perfetto = built
    doc = json.loads(perfetto.read_text())
    events = doc["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"pipeline stage 0", "pipeline stage 1", "critical path"} <= names
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and all(e["dur"] >= 0 and e["ts"] >= -1e6 for e in slices)
    assert {"allreduce", "send", "recv"} <= {e["name"] for e in slices}
    assert any(e["cat"] == "span" and e["name"] == "forward-compute" for e in slices)
    critical = sorted((e for e in slices if e["cat"].startswith("critical")),
                      key=lambda e: e["ts"])
    assert critical and all(e["name"].split(": ")[1].startswith("rank ") for e in critical)
    for a, b in zip(critical, critical[1:], strict=False):  # one contiguous chain
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=0.01)
    instants = [e for e in events if e["ph"] == "i"]
    assert any("slow/compute" in e["name"] for e in instants)
    assert doc["otherData"]["job"] == "sim-small"


def test_report_from_clickhouse(tmp_path: Path, trace: Path) -> None:
    from failslow import cli
    from failslow.cli.demo import DEMO_DATABASE

    (tmp_path / "small.yaml").write_text(SMALL)
    data = tmp_path / "data"
    assert cli.main(["demo", "--data-dir", str(data), "--scenario",
                     str(tmp_path / "small.yaml")]) == 0
    out, perfetto = tmp_path / "job.html", tmp_path / "job.json"
    args = _parse(["--job", "sim-small", "--data-dir", str(data), "--database", DEMO_DATABASE,
                   "--out", str(out), "--perfetto", str(perfetto)])
    assert report_cli.run(args) == 0
    page = _Page()
    page.feed(out.read_text())
    assert {"anomalies", "critical-path", "whatif"} <= page.ids and "critical" in page.images
    assert "slow-0" in " ".join(page.text)
    # the planner's decisions as the processor stored them (the demo scales its costs): S2
    # applied to the compute straggler's anomaly, then reverted when it ended
    assert "advice" in page.ids
    html = out.read_text()
    rows = [r for r in html.split('<table id="advice">')[1].split("</table>")[0].split("<tr")
            if "advice-" in r]
    assert [("S2" in r, "apply" in r or "revert" in r) for r in rows] == [(True, True)] * 2
    assert 'class="advice-apply"' in rows[0] and 'class="advice-revert"' in rows[1]
    assert json.loads(perfetto.read_text())["traceEvents"]
    missing = _parse(["--job", "nope", "--data-dir", str(data), "--database", DEMO_DATABASE,
                      "--out", str(tmp_path / "x.html")])
    assert report_cli.run(missing) == 1


def test_missing_data_leaves_a_clear_placeholder(tmp_path: Path) -> None:
    from failslow import results
    from failslow.diagnosis import Diagnosis
    from failslow.events import JobMeta

    meta = JobMeta(job="j", t=1, world_size=2, tp=1, pp=1, dp=2, cp=1, microbatches=1,
                   schedule="1f1b", nodes={}, comms=())
    data = report_cli.JobData(meta, Diagnosis("j"), results.empty("iterations"),
                              results.empty("rounds"), whatif_reason="not computed here")
    done = report_cli.build(data, tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert done["critical_segments"] == 0
    assert "Not available: no iterations were detected" in html
    assert "Not available: not computed here" in html
    with pytest.raises(ValueError, match="Perfetto"):
        report_cli.build(data, tmp_path / "r.html", tmp_path / "t.json")
    assert report_cli.run(_parse(["--out", str(tmp_path / "y.html")])) == 2


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.skipif(not Path(CHROMIUM).exists() and not os.environ.get("CI"),
                    reason="chromium not installed: headless rendering not checked "
                           "(infra/test.sh installs it; in CI this test never skips)")
def test_report_renders_in_headless_chromium(built: tuple[Path, Path],
                                            tmp_path: Path) -> None:
    out, _ = built
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0", "--window-size=1200,3600",
             "--hide-scrollbars"]
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True,
                         timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "slow-0" in dom.stdout and "Critical path of a slow iteration" in dom.stdout
    console = [line for line in dom.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console  # nothing logged to the page's console
    assert "net::ERR" not in dom.stderr
    shot = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={shot}", out.as_uri()], capture_output=True,
                   timeout=90, check=True)
    data = shot.read_bytes()
    assert data.startswith(PNG)
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1200, 3600)
    from matplotlib.image import imread

    pixels = imread(str(shot))
    assert pixels.std() > 0.05  # not a blank page: figures and tables were painted
    keep = os.environ.get("FAILSLOW_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_chrome_trace_of_a_window_without_spans() -> None:
    from failslow.events import JobMeta

    meta = JobMeta(job="j", t=1, world_size=2, tp=1, pp=1, dp=2, cp=1, microbatches=1,
                   schedule="1f1b", nodes={}, comms=())
    coll = from_rows("coll", [
        {"job": "j", "rank": r, "comm": 9, "comm_rank": r, "comm_size": 2, "seq": 0,
         "op": "allreduce", "bytes": 8, "peer": -1, "phase": ph, "t": t}
        for r, ph, t in [(0, "enter", 1000), (1, "enter", 3000), (0, "end", 9000),
                         (1, "end", 9000)]])
    doc = cp.chrome_trace(meta, coll, 0, 10_000, None, cp.critical_path(coll, 0, 10_000))
    ops = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "comm"]
    assert sorted((e["tid"], e["ts"], e["dur"]) for e in ops) == [(0, 1.0, 8.0), (1, 3.0, 6.0)]
