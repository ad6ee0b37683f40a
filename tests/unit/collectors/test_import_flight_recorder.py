"""PyTorch NCCL Flight Recorder importer: the real gpu_error_1st dumps and synthetic ones."""

from __future__ import annotations

import collections
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from conftest import SHARED
from failslow import cli, events
from failslow.collectors.importers import INFO_FILE
from failslow.collectors.importers import flight_recorder as fr
from failslow.events import ContractError
from failslow.tracedir import TraceDir

DUMPS = SHARED / "data" / "flight-recorder" / "gpu_error_1st"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> TraceDir:
    out = tmp_path_factory.mktemp("fr") / "trace"
    fr.import_dumps(DUMPS).write(out)
    return TraceDir(out)


def _comm(meta: events.JobMeta, kind: str, ranks: tuple[int, ...]) -> int:
    (comm,) = [c.comm for c in meta.comms if c.kind == kind and c.ranks == ranks]
    return comm


def _rounds(td: TraceDir) -> tuple[set[int], set[int]]:
    """From the imported rows only: ranks that did not enter a collective round the other
    members entered (their seq counter is behind), and ranks still in flight in a round every
    other member has passed (the others entered later rounds and hold nothing in flight for
    it: they completed it, since these dumps hold only incomplete operations)."""
    meta = td.meta()
    members = {c.comm: c.ranks for c in meta.comms}
    cols = events.to_columns(td.read("coll"), "coll")
    coll = (cols["op"] != events.OP["send"]) & (cols["op"] != events.OP["recv"])
    seqs: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
    for comm, rank, seq in zip(cols["comm"][coll].tolist(), cols["rank"][coll].tolist(),
                               cols["seq"][coll].tolist(), strict=True):
        seqs[(comm, rank)].add(seq)
    not_entered, stuck = set(), set()
    for comm in {c for c, _ in seqs}:
        ranks = members[comm]
        if any((comm, r) not in seqs for r in ranks):
            continue
        for s in set().union(*(seqs[(comm, r)] for r in ranks)):
            inside = {r for r in ranks if s in seqs[(comm, r)]}
            for r in set(ranks) - inside:
                if max(seqs[(comm, r)]) < s:
                    not_entered.add(r)
            if all(min(seqs[(comm, r)]) > s for r in set(ranks) - inside) and inside != set(ranks):
                stuck |= inside
    return not_entered, stuck


# ---------------------------------------------------------------------------------------------
# the real dumps


def test_real_dumps_conform_with_16_ranks_and_megatron_degrees(imported: TraceDir) -> None:
    meta = imported.meta()
    assert meta.job == "gpu_error_1st"
    assert meta.world_size == 16
    assert (meta.tp, meta.pp, meta.dp, meta.cp) == (2, 4, 2, 1)
    assert meta.schedule == "unknown" and meta.microbatches == 0
    assert meta.nodes[12] == "node1" and meta.nodes[7] == "node0"
    coll = imported.read("coll")  # read back through the contract reader
    assert set(coll.column("rank").to_pylist()) == set(range(16))
    n_entries = sum(len(fr.read_dump(DUMPS / f"_dump_{r}")["entries"]) for r in range(16))
    assert coll.num_rows == n_entries == 289  # every entry is in flight: enter rows only
    assert set(coll.column("phase").to_pylist()) == {"enter"}
    # every coll communicator is described in meta, with the row's size and comm rank
    members = {c.comm: c.ranks for c in meta.comms}
    for row in coll.select(["rank", "comm", "comm_rank", "comm_size"]).to_pylist():
        ranks = members[row["comm"]]
        assert len(ranks) == row["comm_size"] and ranks[row["comm_rank"]] == row["rank"]
    info = json.loads((imported.path / INFO_FILE).read_text())
    assert info["only_incomplete_entries"] is True and info["warnings"] == {}


def test_ep_group_74_all_to_all_in_flight(imported: TraceDir) -> None:
    meta = imported.meta()
    ep = _comm(meta, "ep", (12, 13, 14, 15))
    cols = events.to_columns(imported.read("coll"), "coll")
    mine = cols["comm"] == ep
    assert (cols["op"][mine] == events.OP["alltoall"]).all()
    assert (cols["phase"][mine] == events.ENTER).all()
    # FR round 20537 of group 74 (seq 20536): ranks 13, 14, 15 entered, rank 12 did not
    round_ = mine & (cols["seq"] == 20536)
    assert sorted(cols["rank"][round_].tolist()) == [13, 14, 15]
    # rank 13's buffer is the 4027 x 5120 BFloat16 that NVIDIA's analyzer quotes
    (b13,) = cols["bytes"][round_ & (cols["rank"] == 13)].tolist()
    assert b13 == 4027 * 5120 * 2
    assert max(cols["seq"][mine & (cols["rank"] == 12)].tolist()) == 20535


def test_ranks_12_and_14_are_behind(imported: TraceDir) -> None:
    not_entered, stuck = _rounds(imported)
    assert not_entered == {12}       # 12 stopped issuing: peers entered rounds it never did
    assert stuck == {12, 14}         # 12 and 14 hold rounds in flight that their peers passed
    meta = imported.meta()
    cols = events.to_columns(imported.read("coll"), "coll")
    tp14 = (cols["comm"] == _comm(meta, "tp", (14, 15)))
    # 14 has FR ids 42806..42826 in flight on its TP group, 15 only 42819..42826
    assert sorted(cols["seq"][tp14 & (cols["rank"] == 14)].tolist()) == list(range(42805, 42826))
    assert sorted(cols["seq"][tp14 & (cols["rank"] == 15)].tolist()) == list(range(42818, 42826))


def test_seq_names_the_same_round_on_every_member(imported: TraceDir) -> None:
    table = imported.read("coll")
    rows = table.select(["comm", "seq", "op", "rank", "peer", "fr_seq_id", "fr_pg"]).to_pylist()
    by_round: dict[tuple[int, int], set[str]] = collections.defaultdict(set)
    for r in rows:
        if r["op"] in ("send", "recv"):
            assert r["seq"] == r["fr_seq_id"] - 1  # no coalescing here: p2p_seq_id - 1
            assert r["peer"] >= 0
        else:
            assert r["seq"] == r["fr_seq_id"] - 1  # collective_seq_id - 1
            by_round[(r["comm"], r["seq"])].add(r["op"])
    assert all(len(ops) == 1 for ops in by_round.values())
    # point-to-point operations live on their own communicator of the same members
    meta = imported.meta()
    pp_comms = [c for c in meta.comms if c.kind == "pp" and c.ranks == (0, 4, 8, 12)]
    assert len(pp_comms) == 2
    p2p = {r["comm"] for r in rows if r["op"] in ("send", "recv")}
    assert len(p2p & {c.comm for c in pp_comms}) == 1
    # rank 0 (pipeline rank 0) sends to pipeline rank 3 = global rank 12 ('send 0->3')
    sends0 = [r for r in rows if r["rank"] == 0 and r["op"] == "send"]
    assert {r["peer"] for r in sends0} == {3}


def test_jsonl_round_trip_keeps_uint64_comms(tmp_path: Path, imported: TraceDir) -> None:
    result = fr.import_dumps(DUMPS)
    result.write(tmp_path / "j", fmt="jsonl")
    back = TraceDir(tmp_path / "j")
    names = events.SCHEMAS["coll"].names
    a = imported.read("coll").select(names).sort_by([("rank", "ascending"), ("t", "ascending")])
    b = back.read("coll").select(names).sort_by([("rank", "ascending"), ("t", "ascending")])
    assert a.equals(b)
    assert max(a.column("comm").to_pylist()) > 2**63  # the full uint64 range survives
    assert back.meta() == imported.meta()


def test_cli_imports_and_rejects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["import", "flight-recorder", str(DUMPS), "--out",
                     str(tmp_path / "o")]) == 0
    assert "16 ranks" in capsys.readouterr().out
    assert TraceDir(tmp_path / "o").meta().world_size == 16
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "_dump_0").write_text("not a pickle at all")
    assert cli.main(["import", "flight-recorder", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "_dump_0" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# synthetic dumps


def _entry(**over: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "record_id": 0, "pg_id": 1, "process_group": ("7", "TENSOR_MODEL_PARALLEL_GROUP"),
        "collective_seq_id": 5, "p2p_seq_id": 0, "op_id": 5, "is_p2p": False,
        "profiling_name": "nccl:all_reduce", "input_sizes": [[4, 8]],
        "output_sizes": [[4, 8]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
        "state": "completed", "time_created_ns": 1_000, "time_discovered_started_ns": 1_500,
        "time_discovered_completed_ns": 3_000, "retired": True, "timeout_ms": 1000,
    }
    e.update(over)
    return e


def _dump(entries: list[dict[str, Any]], world: int = 2) -> dict[str, Any]:
    return {
        "version": "2.9",
        "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": json.dumps(list(range(world)))},
            "7": {"name": "7", "desc": "TENSOR_MODEL_PARALLEL_GROUP",
                  "ranks": json.dumps(list(range(world)))},
        },
        "pg_status": {"1": {"last_enqueued_collective": 5, "last_started_collective": 5,
                            "last_completed_collective": 5}},
        "entries": entries,
    }


def test_completed_entry_gives_enter_and_end_with_start() -> None:
    res = fr.convert({0: _dump([_entry()]), 1: _dump([_entry(time_created_ns=1_200)])}, "j")
    rows = res.tables["coll"].sort_by([("rank", "ascending"), ("phase", "ascending")]).to_pylist()
    end0 = [r for r in rows if r["rank"] == 0 and r["phase"] == "end"][0]
    enter1 = [r for r in rows if r["rank"] == 1 and r["phase"] == "enter"][0]
    assert (end0["t"], end0["t_start"], end0["seq"], end0["op"]) == (3_000, 1_500, 4, "allreduce")
    assert end0["bytes"] == 4 * 8 * 4 and end0["peer"] == -1
    assert enter1["t"] == 1_200 and enter1["t_start"] is None and enter1["comm_rank"] == 1
    assert (res.meta.tp, res.meta.pp, res.meta.dp, res.meta.cp) == (2, 1, 1, 1)


def test_buffer_bytes_follow_the_contract() -> None:
    entries = [
        _entry(record_id=0, collective_seq_id=1, profiling_name="nccl:_all_gather_base",
               input_sizes=[[10]], output_sizes=[[20]], input_dtypes=["BFloat16"],
               output_dtypes=["BFloat16"]),
        _entry(record_id=1, collective_seq_id=2, profiling_name="nccl:_reduce_scatter_base",
               input_sizes=[[20]], output_sizes=[[10]], input_dtypes=["Float"],
               output_dtypes=["Float"]),
        _entry(record_id=2, collective_seq_id=2, is_p2p=True, p2p_seq_id=1, op_id=4,
               profiling_name="nccl:recv 0<-1", input_sizes=[[3]], output_sizes=[[3]],
               input_dtypes=["Long"], output_dtypes=["Long"]),
    ]
    rows = fr.convert({0: _dump(entries)}, "j").tables["coll"].to_pylist()
    got = {r["op"]: (r["bytes"], r["peer"], r["seq"]) for r in rows if r["phase"] == "enter"}
    assert got == {"allgather": (20, -1, 0), "reducescatter": (40, -1, 1), "recv": (24, 1, 1)}


def test_coalesced_group_is_one_round_with_the_markers_state() -> None:
    parts = [_entry(record_id=i, op_id=5 + i, profiling_name="nccl:_all_gather_base",
                    state="scheduled", time_discovered_completed_ns=None,
                    time_discovered_started_ns=None, time_created_ns=1_000 + i)
             for i in range(3)]
    marker = _entry(record_id=3, op_id=7, profiling_name="nccl:coalesced", state="completed",
                    time_discovered_completed_ns=9_000)
    rows = fr.convert({0: _dump(parts + [marker])}, "j").tables["coll"].to_pylist()
    assert [(r["phase"], r["op"], r["seq"], r["t"]) for r in rows] == [
        ("enter", "allgather", 4, 1_000), ("end", "allgather", 4, 9_000)]
    assert rows[0]["bytes"] == 3 * 4 * 8 * 4


def test_batched_p2p_sharing_one_p2p_seq_id_get_distinct_seqs() -> None:
    sends = [_entry(record_id=i, is_p2p=True, collective_seq_id=3, p2p_seq_id=4, op_id=3 + 4 + i,
                    profiling_name=name, state="scheduled", time_discovered_completed_ns=None)
             for i, name in enumerate(["nccl:send 0->1", "nccl:recv 0<-1"])]
    marker = _entry(record_id=2, is_p2p=True, collective_seq_id=3, p2p_seq_id=4, op_id=9,
                    profiling_name="nccl:coalesced", state="completed",
                    time_discovered_completed_ns=7_000)
    rows = fr.convert({0: _dump(sends + [marker])}, "j").tables["coll"].to_pylist()
    enters = [(r["op"], r["seq"]) for r in rows if r["phase"] == "enter"]
    assert enters == [("send", 3), ("recv", 4)]
    assert sorted(r["t"] for r in rows if r["phase"] == "end") == [7_000, 7_000]


def test_unknown_operations_are_counted_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    entries = [_entry(record_id=0, collective_seq_id=1, profiling_name="nccl:frobnicate"),
               _entry(record_id=1, collective_seq_id=2, profiling_name="nccl:frobnicate"),
               _entry(record_id=2, collective_seq_id=3, profiling_name="nccl:barrier",
                      input_sizes=[[1]], input_dtypes=["Int"]),
               _entry(record_id=3, collective_seq_id=4, input_dtypes=["Quaternion"])]
    res = fr.convert({0: _dump(entries)}, "j")
    assert res.warnings["unsupported operation 'nccl:frobnicate': skipped"] == 2
    assert res.warnings["'barrier' imported as 'allreduce' (closest contract operation)"] == 1
    assert res.warnings["unknown dtype 'Quaternion': its bytes count as 0"] == 1
    enters = [r for r in res.tables["coll"].to_pylist() if r["phase"] == "enter"]
    assert [(r["seq"], r["op"], r["bytes"]) for r in enters] == [(2, "allreduce", 4),
                                                                 (3, "allreduce", 0)]
    res.log_warnings(fr.log)
    assert "frobnicate" in caplog.text


def test_degrees_fall_back_when_descriptions_do_not_multiply() -> None:
    groups = [fr.ProcessGroup("1", "TENSOR_MODEL_PARALLEL_GROUP", (0, 1, 2)),
              fr.ProcessGroup("2", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 3))]
    res = fr.convert({0: _dump([_entry()])}, "j")
    assert fr.infer_degrees(groups, 8, res) == (1, 1, 8, 1)
    assert any("not inferable" in w for w in res.warnings)
    ok = [fr.ProcessGroup("1", "TENSOR_MODEL_PARALLEL_GROUP", (0, 1)),
          fr.ProcessGroup("2", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 2)),
          fr.ProcessGroup("3", "CONTEXT_PARALLEL_GROUP", (0, 4))]
    assert fr.infer_degrees(ok, 16) == (2, 2, 2, 2)


def _write(path: Path, obj: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj))
    return path


def test_malformed_dumps_name_the_file_and_what_is_missing(tmp_path: Path) -> None:
    junk = tmp_path / "a" / "_dump_0"
    junk.parent.mkdir()
    junk.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ContractError, match=r"_dump_0.*not a Flight Recorder dump"):
        fr.import_dumps(junk.parent)
    no_entries = _write(tmp_path / "b" / "_dump_3", {"pg_config": {}, "version": "2.9"})
    with pytest.raises(ContractError, match=r"b/_dump_3.*missing key 'entries'"):
        fr.import_dumps(no_entries.parent)
    bad_entry = _write(tmp_path / "c" / "_dump_1",
                       _dump([{k: v for k, v in _entry().items() if k != "time_created_ns"}]))
    with pytest.raises(ContractError, match=r"c/_dump_1.*entry 0: missing key 'time_created_ns'"):
        fr.import_dumps(bad_entry.parent)
    with pytest.raises(ContractError, match="no Flight Recorder dump files"):
        fr.import_dumps(tmp_path / "a" / "..")


def test_pickles_with_objects_are_refused(tmp_path: Path) -> None:
    """A dump is plain data; a pickle that would build objects (and could run code) is not
    loaded."""
    path = _write(tmp_path / "_dump_0", collections.OrderedDict(entries=[], pg_config={}))
    with pytest.raises(ContractError, match="refusing to load collections.OrderedDict"):
        fr.read_dump(path)


def test_json_dumps_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "d" / "rank_1"
    path.parent.mkdir()
    path.write_text(json.dumps(_dump([_entry()])))
    res = fr.import_dumps(path.parent)
    assert res.meta.job == "d"
    assert res.tables["coll"].column("rank").to_pylist() == [1, 1]
    assert isinstance(res.tables["coll"], pa.Table)
    assert np.array_equal(res.tables["coll"].column("seq").to_numpy(), [4, 4])


# ---------------------------------------------------------------------------------------------
# end to end: the diagnosis of the imported hang


def test_analyze_names_ranks_12_and_14_as_hang_roots(
        imported: TraceDir, capsys: pytest.CaptureFixture[str]) -> None:
    """The GPU errors were injected on ranks 12 and 14 (fault_injection.log). In the dumps, 12
    stopped issuing (its peers entered rounds it never did) and 12 and 14 both stopped
    completing: they hold rounds in flight that their healthy peers 13 and 15 completed. A
    diagnosis must name exactly 12 and 14 as hang roots, not the peers that wait on them."""
    capsys.readouterr()
    assert cli.main(["analyze", str(imported.path), "--json"]) == 0
    diagnosis = json.loads(capsys.readouterr().out)
    hangs = [a for a in diagnosis["anomalies"] if a["kind"] == "hang"]
    roots = {r for a in hangs for r in a["ranks"]}
    assert roots == {12, 14}, [(a["cause"], a["ranks"]) for a in hangs]


@pytest.mark.parametrize("removed", [3, 12])
def test_a_missing_dump_is_named_and_never_a_root_cause(
        removed: int, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Missing dumps are common (PyTorch's analyzer has --allow-incomplete-ranks). The import
    names the rank without a dump; the diagnosis never blames it: with a healthy rank's dump
    gone the roots stay 12 and 14, with culprit 12's dump gone 14 is still named and 12 is
    listed as unknown, not as a root."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for p in DUMPS.glob("_dump_*"):
        if p.name != f"_dump_{removed}":
            (dumps / p.name).write_bytes(p.read_bytes())
    with caplog.at_level("WARNING"):
        result = fr.import_dumps(dumps)
        result.log_warnings(fr.log)
    assert f"no dump for 1 of 16 ranks (rank {removed})" in caplog.text
    assert result.info["unobserved_ranks"] == [removed]
    from failslow.engine.offline import analyze

    diag = analyze(result.write(tmp_path / "trace"))
    hangs = [a for a in diag.anomalies if a.kind == "hang"]
    roots = {r for a in hangs for r in a.ranks}
    assert removed not in roots
    assert roots == {12, 14} - {removed}
    unknown = {r for a in hangs for r in a.extra.get("unknown_ranks", [])}
    assert unknown <= {removed}


def test_halt_point_and_wave_front_agree_with_the_flight_recorder_analysis(
        imported: TraceDir) -> None:
    """NVIDIA's reference output for these dumps: process group 74 (expert parallel)
    all_to_all with rank 12 missing. Our halt point is rank 12's own stuck operation (a TP
    all-gather its peer completed); the wave front is the first of its blocked rounds. The
    halt point is self-consistent and the report is dated at the last observed event."""
    from failslow.engine.offline import analyze

    diag = analyze(imported.path)
    last = max(imported.read("coll").column("t").to_pylist())
    by_root = {tuple(a.ranks): a for a in diag.anomalies if a.kind == "hang"}
    hang12 = by_root[(12,)]
    hp = hang12.extra["halt_point"]
    assert hp["in_flight"] == [12] and hp["completed"] == [13] and hp["missing"] == []
    assert hp["entered"] == [12, 13]
    front = hang12.extra["blocked_rounds"][0]
    assert (front["comm_kind"], front["op"], front["missing"]) == ("ep", "alltoall", [12])
    assert all(a.detected_ns == last for a in by_root.values())
