"""Following a live NCCL Inspector dump directory: partial lines, rotation, truncation, and
positions saved only on commit (at-least-once across restarts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from support.inspector_live import inspector_lines

from failslow.collectors.agent import Agent, TraceDirSink
from failslow.collectors.importers import nccl_inspector as ni
from failslow.collectors.inspector_follow import InspectorFollower
from failslow.tracedir import TraceDir

Key = tuple[int, int, int, str]


def _keys(batch: dict[str, pa.Table]) -> list[Key]:
    if "coll" not in batch:
        return []
    d = batch["coll"].select(["rank", "comm", "seq", "phase"]).to_pydict()
    return list(zip(d["rank"], d["comm"], d["seq"], d["phase"], strict=True))


@pytest.fixture(scope="module")
def lines() -> dict[str, list[str]]:
    return inspector_lines()


def _all_keys(lines: dict[str, list[str]], tmp: Path) -> set[Key]:
    """What one follower reads from the complete files in one go."""
    full = tmp / "full"
    full.mkdir()
    for name, ls in lines.items():
        (full / name).write_text("".join(ls))
    keys = _keys(InspectorFollower(full, "j", tmp / "full.state").poll())
    assert len(keys) == len(set(keys))
    return set(keys)


def test_whole_lines_only_and_resume_after_commit(tmp_path: Path,
                                                  lines: dict[str, list[str]]) -> None:
    expected = _all_keys(lines, tmp_path)
    live = tmp_path / "live"
    live.mkdir()
    state = tmp_path / "state.json"
    f = InspectorFollower(live, "j", state)
    got: list[Key] = []
    name = next(iter(lines))
    first = lines[name]
    with (live / name).open("w") as fh:
        fh.write("".join(first[:10]) + first[10][:25])  # a partly written line
        fh.flush()
        got += _keys(f.poll())
        n_first = len(got)
        fh.write(first[10][25:])
        fh.flush()
        got += _keys(f.poll())
    assert len(got) > n_first  # the completed line arrived
    assert not state.exists()  # nothing saved before a commit
    f.commit()
    saved = json.loads(state.read_text())
    assert [x["offset"] for x in saved["files"]] == [len("".join(first[:11]).encode())]
    # a restart resumes at the commit: the rest of the file, no repeats
    with (live / name).open("a") as fh:
        fh.write("".join(first[11:]))
    for other, ls in lines.items():
        if other != name:
            (live / other).write_text("".join(ls))
    g = InspectorFollower(live, "j", state)
    got += _keys(g.poll())
    assert len(got) == len(set(got)) and set(got) == expected


def test_uncommitted_positions_are_read_again(tmp_path: Path,
                                              lines: dict[str, list[str]]) -> None:
    live = tmp_path / "live"
    live.mkdir()
    name, ls = next(iter(lines.items()))
    (live / name).write_text("".join(ls[:20]))
    f = InspectorFollower(live, "j", tmp_path / "s.json")
    f.commit()
    first = _keys(f.poll())
    (live / name).write_text("".join(ls[:40]))  # same inode, grown
    f.poll()  # read, never committed (the sink did not acknowledge)
    again = _keys(InspectorFollower(live, "j", tmp_path / "s.json").poll())
    assert first and set(first) <= set(again)  # at least once: nothing skipped


def test_rotation_by_rename_and_truncation(tmp_path: Path, lines: dict[str, list[str]]) -> None:
    live = tmp_path / "live"
    live.mkdir()
    name, ls = next(iter(lines.items()))
    path = live / name
    path.write_text("".join(ls[:30]))
    f = InspectorFollower(live, "j", tmp_path / "s.json")
    got = _keys(f.poll())
    with path.open("a") as fh:  # more lines, then the file is rotated away
        fh.write("".join(ls[30:60]))
    os.rename(path, live / (name + ".1"))
    marker = next(x for x in reversed(ls[:60]) if "dump_stats" in x)
    path.write_text(marker + "".join(ls[60:]))  # a new file starts with a dump marker
    got += _keys(f.poll())
    assert len(got) == len(set(got))
    whole = tmp_path / "whole"
    whole.mkdir()
    (whole / name).write_text("".join(ls))
    assert set(got) == set(_keys(InspectorFollower(whole, "j", tmp_path / "w.json").poll()))
    assert f.stats["rotated"] == 1
    # truncated in place and rewritten: read again from the start
    with path.open("w") as fh:
        fh.write("".join(ls[:5]))
    again = _keys(f.poll())
    payloads = sum("dump_stats" not in x for x in ls[:5])
    assert len(again) == 2 * payloads and f.stats["rotated"] == 2


def test_agent_follows_into_a_trace_dir(tmp_path: Path, lines: dict[str, list[str]]) -> None:
    live = tmp_path / "nccl-inspector-7"
    live.mkdir()
    for name, ls in lines.items():
        (live / name).write_text("".join(ls))
    follower = InspectorFollower(live, "nccl-inspector-7", tmp_path / "s.json")
    agent = Agent(TraceDirSink(tmp_path / "out"), tmp_path / "rings", node="n",
                  collectors={"gpu": False, "rdma": False}, inspector=follower)
    assert agent.poll() > 0
    agent.close()
    assert (tmp_path / "s.json").exists()
    td = TraceDir(tmp_path / "out")
    meta = td.meta()
    imported = ni.import_dir(live)
    assert meta.world_size == imported.meta.world_size == 8
    assert meta.nodes == imported.meta.nodes
    assert td.read("coll").num_rows == imported.tables["coll"].num_rows
