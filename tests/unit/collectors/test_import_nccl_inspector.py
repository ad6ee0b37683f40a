"""NCCL Inspector importer: hand-written sample files of both layouts, malformed input, and a
round trip of a simulated job through an independent Inspector-format writer."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import DATA
from failslow import events
from failslow.collectors.importers import INFO_FILE, ImportResult, stable_id
from failslow.collectors.importers import nccl_inspector as ni
from failslow.events import ContractError
from failslow.simulator import simulate
from failslow.tracedir import TraceDir

DATA = DATA / "nccl_inspector"
T0 = 1_750_000_000_000_000  # microseconds, the sample files' epoch


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r["rank"], r["comm"], r["seq"], r["phase"]))


# ---------------------------------------------------------------------------------------------
# sample files


def test_v40_verbose_rows_and_meta(tmp_path: Path) -> None:
    result = ni.import_dir(DATA / "v40_verbose")
    meta = result.meta
    assert meta.world_size == 4 and (meta.tp, meta.pp, meta.dp, meta.cp) == (1, 1, 4, 1)
    assert meta.schedule == "unknown" and meta.microbatches == 0
    assert meta.nodes == {0: "gpu-a", 1: "gpu-a", 2: "gpu-b", 3: "gpu-b"}
    world = 0x1A2B3C4D5E6F70
    pair_p2p = stable_id(ni.SOURCE, "0xff00ff00ff01", "p2p")
    comms = {c.comm: c for c in meta.comms}
    assert comms[world].kind == "world" and comms[world].ranks == (0, 1, 2, 3)
    assert comms[pair_p2p].ranks == (0, 2)
    assert not result.warnings

    coll = result.tables["coll"]
    assert coll.num_rows == 2 * (4 * 3 + 2)
    rows = _rows(coll)
    # gpu-b's clock is 3 ms ahead, yet every member numbers the three rounds alike
    for rank in range(4):
        mine = [r for r in rows if r["rank"] == rank and r["comm"] == world]
        assert [(r["seq"], r["op"], r["phase"]) for r in mine] == [
            (0, "allreduce", "end"), (0, "allreduce", "enter"), (1, "allgather", "end"),
            (1, "allgather", "enter"), (2, "allreduce", "end"), (2, "allreduce", "enter")]
        assert [r["bytes"] for r in mine if r["phase"] == "enter"] == [1 << 20, 65536, 1 << 20]
    r3 = [r for r in rows if r["rank"] == 3 and r["comm"] == world and r["seq"] == 1]
    end, enter = r3
    assert enter["t"] == (T0 + 3000 + 200 + 3000) * 1000
    assert end["t"] == (T0 + 3000 + 900 + 3000) * 1000  # the last channel's stop
    assert end["t_start"] == (T0 + 3000 + 210 + 3000) * 1000  # the first channel's start
    assert enter["t_start"] is None and end["exec_us"] == 690.0 and end["busbw_gbs"] == 147.0
    send = [r for r in rows if r["op"] == "send"]
    recv = [r for r in rows if r["op"] == "recv"]
    assert {r["comm"] for r in send + recv} == {pair_p2p}
    assert [(r["rank"], r["peer"], r["seq"], r["comm_rank"]) for r in send + recv] == [
        (0, 1, 0, 0), (0, 1, 0, 0), (2, 0, 0, 1), (2, 0, 0, 1)]

    out = result.write(tmp_path / "trace")
    td = TraceDir(out)
    assert td.read("coll").num_rows == coll.num_rows
    assert td.meta().world_size == 4
    info = json.loads((out / INFO_FILE).read_text())
    assert info["format_versions"] == ["v4.0"] and info["lossy_ranks"] == {}
    assert info["operations"] == {"records": 14, "placed_in_time": 14, "held_out": 0,
                                  "not_placed": 0}
    assert "untimed" not in info and info["processes"]["2"] == "gpu-b/pid 201"


def test_v43_markers_loss_partial_line_and_untimed(tmp_path: Path) -> None:
    result = ni.import_dir(DATA / "v43_markers", job="job-43")
    meta = result.meta
    assert meta.job == "job-43" and meta.world_size == 2
    assert (meta.tp, meta.pp, meta.dp, meta.cp) == (1, 1, 2, 1)  # from "DP/TP Group" names
    assert {c.kind for c in meta.comms} == {"dp", "tp"}
    rows = _rows(result.tables["coll"])
    # the non-verbose ReduceScatter and AllGather records have no rows; the broadcast follows;
    # rank 1 dropped records: its operations are held out (no rows, never a root cause)
    assert [(r["seq"], r["op"]) for r in rows if r["rank"] == 0 and r["phase"] == "enter"] == [
        (0, "allreduce"), (1, "allreduce"), (2, "broadcast")]
    assert not [r for r in rows if r["rank"] == 1]
    assert info_held(result) == (3, [1])
    assert all(r["comm"] == 0xABCDEF0123456789 for r in rows)
    info = result.info
    assert info["layouts"] == ["dump_stats markers (v4.3)"]
    assert info["lossy_ranks"] == {"1": 5}
    lossy = [w for w in result.warnings if "dropped" in w]
    assert len(lossy) == 1 and "1 (5)" in lossy[0] and result.warnings[lossy[0]] == 5
    assert any("partly written last line" in w for w in result.warnings)
    assert any("proxy_op" in w for w in result.warnings)
    assert info["operations"]["not_placed"] == 4
    assert "hang" in info["untimed"]["detectors_unavailable"]
    assert info["rank_stats"]["1"]["records"] == 5
    assert info["rank_stats"]["1"]["placed_in_time"] == 0
    assert info["rank_stats"]["0"]["placed_in_time"] == 3
    out = result.write(tmp_path / "t")
    assert json.loads((out / INFO_FILE).read_text())["lossy_ranks"] == {"1": 5}


def info_held(result: ImportResult) -> tuple[int, list[int]]:
    held = result.info["lossy_held_out"]
    return held["operations"], held["ranks"]


def test_non_verbose_gives_statistics_and_no_rows(tmp_path: Path) -> None:
    result = ni.import_dir(DATA / "v40_plain")
    assert result.tables["coll"].num_rows == 0
    info = result.info
    assert info["operations"] == {"records": 6, "placed_in_time": 0, "held_out": 0,
                                  "not_placed": 6}
    assert "no timestamps" in info["untimed"]["missing"]
    assert info["rank_stats"]["1"]["busbw_gbs_p50"] == 250.0
    assert info["rank_stats"]["0"]["exec_us_max"] == 1002.0
    assert result.warnings["operations without timestamps, no coll rows: not verbose "
                           "(no event_trace_ts)"] == 6
    td = TraceDir(result.write(tmp_path / "t"))
    assert td.read("coll").num_rows == 0 and td.meta().nodes == {0: "h0", 1: "h1"}


def test_gzip_files_read_alike(tmp_path: Path) -> None:
    for path in (DATA / "v40_verbose").iterdir():
        with gzip.open(tmp_path / (path.name + ".gz"), "wb") as fh:
            fh.write(path.read_bytes())
    plain = ni.import_dir(DATA / "v40_verbose").tables["coll"]
    packed = ni.import_dir(tmp_path).tables["coll"]
    assert _rows(plain) == [dict(r, job=plain.column("job")[0].as_py()) for r in _rows(packed)]


def test_lost_round_keeps_its_number_across_skewed_clocks(tmp_path: Path) -> None:
    """Rank 0 lost the AllGather; rank 1's clock is 5 ms ahead. Unaligned, rank 1's AllGather
    would sort after the second AllReduce; aligned on the shared rounds it stays between."""
    def line(host: str, pid: int, rank: int, func: str, sn: int, t_us: int) -> str:
        return json.dumps({
            "header": {"id": "0x99", "rank": rank, "n_ranks": 2, "nnodes": 2},
            "metadata": {"inspector_output_format_version": "v4.0", "hostname": host, "pid": pid},
            "coll_perf": {"coll": func, "coll_sn": sn, "coll_msg_size_bytes": 8192,
                          "coll_exec_time_us": 50, "event_trace_ts": {
                              "coll_start_ts": t_us, "kernel_events": [
                                  {"channel_id": 0, "kernel_start_ts": t_us + 5,
                                   "kernel_stop_ts": t_us + 55}]}}}) + "\n"
    (tmp_path / "a-pid1.log").write_text(line("a", 1, 0, "AllReduce", 0, T0)
                                         + line("a", 1, 0, "AllReduce", 1, T0 + 200))
    (tmp_path / "b-pid2.log").write_text("".join(
        line("b", 2, 1, f, sn, T0 + 5000 + dt)
        for f, sn, dt in (("AllReduce", 0, 0), ("AllGather", 0, 100), ("AllReduce", 1, 200))))
    rows = _rows(ni.import_dir(tmp_path).tables["coll"])
    assert [(r["rank"], r["seq"], r["op"]) for r in rows if r["phase"] == "enter"] == [
        (0, 0, "allreduce"), (0, 2, "allreduce"),
        (1, 0, "allreduce"), (1, 1, "allgather"), (1, 2, "allreduce")]


# ---------------------------------------------------------------------------------------------
# malformed input


def _copy(tmp_path: Path, name: str = "v40_verbose") -> Path:
    dest = tmp_path / name
    shutil.copytree(DATA / name, dest)
    return dest


def _edit_line(path: Path, index: int, new: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[index] = new
    path.write_text("".join(lines))


def test_malformed_middle_line_names_file_and_line(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    _edit_line(d / "gpu-a-pid102.log", 1, '{"header": {"id": "0x1", \n')
    with pytest.raises(ContractError, match=r"gpu-a-pid102\.log, line 2: malformed JSON"):
        ni.import_dir(d)


def test_missing_field_names_file_line_and_key(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    path = d / "gpu-b-pid201.log"
    obj = json.loads(path.read_text().splitlines()[2])
    del obj["coll_perf"]["coll_sn"]
    _edit_line(path, 2, json.dumps(obj) + "\n")
    with pytest.raises(ContractError, match=r"gpu-b-pid201\.log, line 3: .*'coll_perf\.coll_sn'"):
        ni.import_dir(d)


def test_bad_header_and_orphan_payload(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    path = d / "gpu-a-pid101.log"
    obj = json.loads(path.read_text().splitlines()[0])
    obj["header"]["rank"] = 7
    _edit_line(path, 0, json.dumps(obj) + "\n")
    with pytest.raises(ContractError, match=r"line 1: header\.rank 7 is not below"):
        ni.import_dir(d)
    d2 = _copy(tmp_path, "v43_markers")
    path = d2 / "node-x-pid11.log"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[1:]))  # the first marker is gone
    with pytest.raises(ContractError, match=r"node-x-pid11\.log, line 1: 'coll_perf' record "
                                            "with no header"):
        ni.import_dir(d2)


def test_partial_last_line_is_only_a_warning(tmp_path: Path) -> None:
    d = _copy(tmp_path)
    with (d / "gpu-a-pid101.log").open("a") as fh:
        fh.write('{"header":{"id":"0x1a2b3c4d5e6f70","rank":0,"n_r')
    result = ni.import_dir(d)
    assert result.tables["coll"].num_rows == 28
    assert list(result.warnings) == ["partly written last line skipped (the process was still "
                                     "writing or was killed)"]


def test_no_files_or_no_records(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="no NCCL Inspector output files"):
        ni.import_dir(tmp_path)
    (tmp_path / "empty.log").write_text("\n")
    with pytest.raises(ContractError, match="no operation records"):
        ni.import_dir(tmp_path)


# ---------------------------------------------------------------------------------------------
# round trip: a simulated job written in the Inspector format by the test's own writer

FUNC = {"allreduce": "AllReduce", "allgather": "AllGather", "reducescatter": "ReduceScatter",
        "broadcast": "Broadcast", "reduce": "Reduce", "alltoall": "All2All", "send": "Send",
        "recv": "Recv"}
PREFIX = 30  # operations per (communicator, rank) written: keeps the test fast


def _operations(coll: pa.Table) -> pd.DataFrame:
    coll = coll.set_column(coll.schema.get_field_index("t_start"), "t_start",
                           pc.fill_null(coll.column("t_start"), -1))  # exact int64, no floats
    df = coll.select(["rank", "comm", "comm_rank", "comm_size", "seq", "op", "bytes", "peer",
                      "phase", "t", "t_start"]).to_pandas()
    df = df[df["seq"] < PREFIX]
    enter = df[df["phase"] == "enter"].drop(columns=["phase", "t_start"])
    end = df[df["phase"] == "end"][["rank", "comm", "seq", "t", "t_start"]]
    ops = enter.merge(end, on=["rank", "comm", "seq"], suffixes=("", "_end"))
    return ops.sort_values(["rank", "comm", "seq"]).reset_index(drop=True)


def _write_inspector(meta: events.JobMeta, ops: pd.DataFrame, out: Path, layout: str) -> None:
    """Inspector JSON Lines, verbose, one file per process (``layout``: "record" or
    "markers")."""
    out.mkdir(parents=True)
    ops = ops.copy()
    p2p = ops["op"].isin(["send", "recv"])
    ops["sn"] = 0
    ops.loc[~p2p, "sn"] = ops[~p2p].groupby(["rank", "comm", "op"]).cumcount()
    ops.loc[p2p, "sn"] = ops[p2p].groupby(["rank", "comm"]).cumcount() + 1
    hosts_of = {c.comm: len({meta.nodes[r] for r in c.ranks}) for c in meta.comms}
    for rank, mine in ops.groupby("rank"):
        host, pid = meta.nodes[int(rank)], 10_000 + int(rank)
        metadata = {"inspector_output_format_version": "v4.3" if layout == "markers" else "v4.0",
                    "dump_timestamp_us": int(ops["t_end"].max()) // 1000, "hostname": host,
                    "pid": pid}
        lines: list[dict[str, Any]] = []
        for comm, group in mine.groupby("comm"):
            header = {"id": f"0x{int(comm):016x}", "rank": int(group["comm_rank"].iloc[0]),
                      "n_ranks": int(group["comm_size"].iloc[0]), "nnodes": hosts_of[comm]}
            if layout == "markers":
                lines.append({"header": header, "metadata": metadata,
                              "dump_stats": {"coll_records": len(group), "p2p_records": 0,
                                             "coll_dropped_records": 0}})
            for op in group.itertuples():
                pre = "p2p" if op.op in ("send", "recv") else "coll"
                enter_us, end_us = int(op.t) // 1000, int(op.t_end) // 1000
                start_us = int(op.t_start) // 1000 if op.t_start >= 0 else enter_us
                payload: dict[str, Any] = {pre: FUNC[op.op], f"{pre}_sn": int(op.sn)}
                if pre == "p2p":
                    payload["p2p_peer"] = int(op.peer)
                payload.update({
                    f"{pre}_msg_size_bytes": int(op.bytes),
                    f"{pre}_exec_time_us": end_us - start_us,
                    f"{pre}_timing_source": "kernel_gpu",
                    f"{pre}_busbw_gbs": round(int(op.bytes) / max(end_us - start_us, 1) / 1e3, 6),
                    "event_trace_ts": {
                        f"{pre}_start_ts": enter_us, f"{pre}_stop_ts": enter_us + 2,
                        "kernel_events": [
                            {"channel_id": 0, "kernel_start_ts": start_us,
                             "kernel_stop_ts": end_us - 1, "kernel_record_ts": end_us - 1},
                            {"channel_id": 1, "kernel_start_ts": start_us + 1,
                             "kernel_stop_ts": end_us - 2, "kernel_record_ts": end_us}]}})
                record = {f"{pre}_perf": payload}
                if layout == "record":
                    record = {"header": header, "metadata": metadata, **record}
                lines.append(record)
        with (out / f"{host}-pid{pid}.log").open("w") as fh:
            fh.writelines(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)


@pytest.mark.parametrize("layout", ["record", "markers"])
def test_round_trip_simulated_job(tmp_path: Path, layout: str) -> None:
    sim = simulate("default", seed=1)
    ops = _operations(sim.tables["coll"])
    _write_inspector(sim.meta, ops, tmp_path / "nccl-inspector-42", layout)
    result = ni.import_dir(tmp_path / "nccl-inspector-42")
    assert result.meta.job == "nccl-inspector-42"
    assert result.meta.world_size == sim.meta.world_size
    assert result.meta.nodes == sim.meta.nodes
    imported = _operations(result.tables["coll"])
    assert len(imported) == len(ops)

    # map the companion point-to-point communicators back to the simulator's ids
    back = {stable_id(ni.SOURCE, f"0x{c.comm:016x}", "p2p"): c.comm for c in sim.meta.comms}
    imported["comm"] = [back.get(int(c), int(c)) for c in imported["comm"]]
    imported = imported.sort_values(["rank", "comm", "seq"]).reset_index(drop=True)
    key = ["rank", "comm", "comm_rank", "comm_size", "seq", "op", "bytes", "peer"]
    pd.testing.assert_frame_equal(imported[key], ops[key], check_dtype=False)
    for col in ("t", "t_end", "t_start"):  # microsecond precision
        diff = (imported[col].astype("int64") - ops[col].astype("int64")).abs()
        assert int(diff.max()) < 1000, col
    sim_comms = {c.comm: c.ranks for c in sim.meta.comms}
    for c in result.meta.comms:
        assert sim_comms[back.get(c.comm, c.comm)] == c.ranks
    # no world communicator in the simulated job: ranks follow (hostname, pid) order
    assert "(hostname, pid) order" in result.info["rank_assignment"]
    assert not any("disagrees" in w for w in result.warnings)
