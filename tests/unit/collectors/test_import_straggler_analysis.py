"""ByteDance StragglerAnalysis importer on the published AR trial."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import SHARED
from failslow import cli, events
from failslow.collectors.importers import INFO_FILE, ImportResult
from failslow.collectors.importers import straggler_analysis as sa
from failslow.events import ContractError
from failslow.tracedir import TraceDir

DATA = SHARED / "data" / "straggler-analysis"
TRACE, META, RESULT = DATA / "trace-AR.parquet", DATA / "meta-AR.yaml", DATA / "result-AR.json"


@pytest.fixture(scope="module")
def source() -> pa.Table:
    return pq.read_table(TRACE)


@pytest.fixture(scope="module")
def result() -> ImportResult:
    return sa.import_files(TRACE, META)


@pytest.fixture(scope="module")
def written(result: ImportResult, tmp_path_factory: pytest.TempPathFactory) -> TraceDir:
    out = tmp_path_factory.mktemp("sa") / "trace"
    result.write(out)
    return TraceDir(out)


def test_meta_collapses_tensor_parallelism(written: TraceDir) -> None:
    meta = written.meta()
    assert meta.job == "sa-AR-0"
    assert (meta.world_size, meta.tp, meta.pp, meta.dp, meta.cp) == (16, 1, 4, 4, 1)
    assert meta.microbatches == 32 and meta.schedule == "1f1b"
    kinds = collections.Counter(c.kind for c in meta.comms)
    assert kinds == {"pp": 4, "dp": 4, "other": 4}
    assert {c.ranks for c in meta.comms if c.kind == "pp"} == {
        (d, 4 + d, 8 + d, 12 + d) for d in range(4)}
    # the original placement: trace ranks 0 and 4 (dp 0 and 1 of stage 0) share node0
    assert meta.nodes[0] == meta.nodes[1] == "node0" and meta.nodes[15] == "node7"
    info = json.loads((written.path / INFO_FILE).read_text())
    assert info["original_meta"]["tp_size"] == 4 and info["original_meta"]["world_size"] == 64
    assert info["warnings"] == {}


def test_span_rows_match_the_source(written: TraceDir, source: pa.Table) -> None:
    span = written.read("span")
    assert span.num_rows == source.num_rows == 117216
    src = collections.Counter(pc.cast(source.column("optype"), pa.string()).to_pylist())
    got = collections.Counter(span.column("optype").to_pylist())
    assert got == src
    by_op = collections.Counter(span.column("op").to_pylist())
    expected: collections.Counter[str] = collections.Counter()
    for name, n in src.items():
        expected[sa.SPAN_OP_BY_OPTYPE[name]] += n
    assert by_op == expected
    assert by_op["optimizer"] == src["optimizer"] + src["optimizer-clip-main-grad"] == 1408
    assert by_op["params-sync"] == src["params-all-gather"] == 704
    # ranks and steps are preserved (rank = stage * dp + dp_rank = trace rank // tp)
    trace_rank = np.asarray(span.column("trace_rank").to_numpy())
    rank = np.asarray(span.column("rank").to_numpy())
    assert np.array_equal(rank, trace_rank // 4)
    assert set(trace_rank.tolist()) == set(source.column("rank").to_pylist())
    assert (set(span.column("step").to_pylist()) == set(source.column("step").to_pylist())
            and len(set(span.column("step").to_pylist())) == 44)
    # micro-batch ids: compute rows keep mb_id; 32 per (rank, step, pass)
    fwd = span.filter(pc.equal(span.column("op"), "forward-compute"))
    assert set(fwd.column("microbatch").to_pylist()) == set(range(32))
    assert set(span.column("chunk").to_pylist()) == {-1}


def test_durations_are_preserved(result: ImportResult, source: pa.Table) -> None:
    span = result.tables["span"]
    dur = (np.asarray(span.column("t_end").to_numpy()) - np.asarray(span.column("t_start")
                                                                     .to_numpy())) / 1e9
    src = np.asarray(source.column("duration").to_numpy(), dtype=np.float64)
    assert np.abs(dur - src).max() < 2e-9


def test_step_lengths_match_step_t_base(result: ImportResult, source: pa.Table) -> None:
    """``step_t_base`` of result-AR.json is the step time of the trace: the largest
    ``start_ts + duration`` of the step over all workers (times are relative to each step's
    start). Imported steps are laid end to end, so each step lasts exactly that long."""
    base = json.loads(RESULT.read_text())["step_t_base"]
    span = result.tables["span"]
    step = np.asarray(span.column("step").to_numpy())
    t0 = np.asarray(span.column("t_start").to_numpy())
    t1 = np.asarray(span.column("t_end").to_numpy())
    starts = result.info["step_start_ns"]
    steps = sorted(set(step.tolist()))
    assert sorted(int(s) for s in base) == steps
    for i, s in enumerate(steps):
        sel = step == s
        length = (t1[sel].max() - starts[str(s)]) / 1e9
        assert abs(length - base[str(s)]) < 1e-5, s
        assert t0[sel].min() == starts[str(s)]  # each step starts with an operation at 0
        if i + 1 < len(steps):  # the next imported step starts where this one ended
            assert starts[str(steps[i + 1])] == t1[sel].max()
    assert starts[str(steps[0])] == sa.DEFAULT_EPOCH_NS


def test_coll_rows_derived_from_communication(written: TraceDir, source: pa.Table) -> None:
    coll = written.read("coll")
    src = collections.Counter(pc.cast(source.column("optype"), pa.string()).to_pylist())
    ops = collections.Counter(zip(coll.column("op").to_pylist(), coll.column("phase").to_pylist(),
                                  strict=True))
    for phase in ("enter", "end"):
        assert ops[("send", phase)] == src["forward-send"] + src["backward-send"]
        assert ops[("recv", phase)] == src["forward-recv"] + src["backward-recv"]
        assert ops[("allgather", phase)] == src["params-all-gather"]
        assert ops[("reducescatter", phase)] == src["grads-reduce-scatter"]
        assert ops[("allreduce", phase)] == src["embedding-grads-all-reduce"]
    cols = events.to_columns(coll, "coll")
    p2p = (cols["op"] == events.OP["send"]) | (cols["op"] == events.OP["recv"])
    # sends and receives pair up: per (comm, sender, receiver) as many sends as receives
    enter = cols["phase"] == events.ENTER
    meta = written.meta()
    members = {c.comm: c.ranks for c in meta.comms}
    pairs: collections.Counter[tuple[int, int, int, str]] = collections.Counter()
    for comm, rank, peer, op in zip(cols["comm"][p2p & enter].tolist(),
                                    cols["rank"][p2p & enter].tolist(),
                                    cols["peer"][p2p & enter].tolist(),
                                    cols["op"][p2p & enter].tolist(), strict=True):
        other = members[comm][peer]
        if op == events.OP["send"]:
            pairs[(comm, rank, other, "send")] += 1
        else:
            pairs[(comm, other, rank, "recv")] += 1
    for (comm, a, b, kind), n in pairs.items():
        if kind == "send":
            assert pairs[(comm, a, b, "recv")] == n
    # a collective (comm, seq) is one round: every member, same op, same step
    coll_rows = coll.filter(pc.and_(pc.invert(pc.is_in(coll.column("op"),
                                                       pa.array(["send", "recv"]))),
                                    pc.equal(coll.column("phase"), "enter")))
    rounds: dict[tuple[int, int], set[tuple[str, int, int]]] = collections.defaultdict(set)
    for r in coll_rows.select(["comm", "seq", "op", "step", "rank"]).to_pylist():
        rounds[(r["comm"], r["seq"])].add((r["op"], r["step"], r["rank"]))
    for (comm, _), rows in rounds.items():
        assert len({(op, st) for op, st, _ in rows}) == 1
        assert {rk for _, _, rk in rows} == set(members[comm])
    # ends never precede enters
    t = np.asarray(coll.column("t").to_numpy())
    n = coll.num_rows // 2
    assert (t[n:] >= t[:n]).all()


def test_round_trip_parquet_and_jsonl(result: ImportResult, written: TraceDir,
                                      source: pa.Table, tmp_path: Path) -> None:
    for kind in ("coll", "span"):
        names = events.SCHEMAS[kind].names
        back = written.read(kind)
        assert back.select(names).equals(result.tables[kind].select(names))
    # JSON Lines on a few steps (the whole trace is ~50 MB of text)
    few = source.filter(pc.is_in(source.column("step"), pa.array([16, 821, 1238])))
    meta = yaml.safe_load(META.read_text())
    small = sa.convert(few, meta, "sa-few")
    small.write(tmp_path / "j", fmt="jsonl")
    td = TraceDir(tmp_path / "j")
    assert td.meta() == small.meta
    for kind in ("coll", "span"):
        names = events.SCHEMAS[kind].names
        assert td.read(kind).select(names).equals(small.tables[kind].select(names))


def test_bad_inputs_are_rejected(source: pa.Table, tmp_path: Path) -> None:
    meta = yaml.safe_load(META.read_text())
    with pytest.raises(ContractError, match="column 'duration'.*missing required column"):
        sa.convert(source.drop_columns(["duration"]), meta, "j", source="t.parquet")
    with pytest.raises(ContractError, match="row 3.*column 'stage'.*outside"):
        stage = np.asarray(source.column("stage").to_numpy()).astype(np.int8).copy()
        stage[3] = 4
        sa.convert(source.set_column(source.schema.get_field_index("stage"), "stage",
                                     pa.array(stage)), meta, "j", source="t.parquet")
    with pytest.raises(ContractError, match="more than one traced rank"):
        rank = np.asarray(source.column("rank").to_numpy()).astype(np.int16).copy()
        rank[0] = 1
        sa.convert(source.set_column(source.schema.get_field_index("rank"), "rank",
                                     pa.array(rank)), meta, "j")
    bad_meta = tmp_path / "m.yaml"
    bad_meta.write_text("tp_size: 4\n")
    with pytest.raises(ContractError, match=r"m\.yaml.*'dp_size'"):
        sa.read_meta(bad_meta)


def test_unknown_optypes_become_other_with_a_warning(source: pa.Table) -> None:
    few = source.slice(0, 1000)
    names = pc.cast(few.column("optype"), pa.string())
    renamed = pc.replace_substring(names, "optimizer-clip-main-grad", "new-thing")
    meta = yaml.safe_load(META.read_text())
    res = sa.convert(few.set_column(few.schema.get_field_index("optype"), "optype", renamed),
                     meta, "j")
    n = sum(1 for v in renamed.to_pylist() if v == "new-thing")
    assert n > 0
    assert res.warnings["unknown optype 'new-thing' imported as span op 'other'"] == n


def test_cli_writes_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o"
    assert cli.main(["import", "straggler-analysis", "--trace", str(TRACE), "--meta", str(META),
                     "--out", str(out), "--job", "ar", "--epoch-ns", "5000000000"]) == 0
    assert "117216 span rows" in capsys.readouterr().out
    assert TraceDir(out).meta().job == "ar"
    assert json.loads((out / INFO_FILE).read_text())["epoch_ns"] == 5_000_000_000
