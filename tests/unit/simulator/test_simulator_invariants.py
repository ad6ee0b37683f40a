"""Simulator invariants: the emitted trace obeys the event contract and collective semantics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from failslow import events
from failslow.simulator import SimResult, scenario_from_dict, simulate, write_sim
from failslow.simulator.schedule import BWD, FWD, build_program
from failslow.tracedir import TraceDir

SKEW_NS = 1_000_000  # per-node clock offset bound (noise.clock_skew_ms = 1)


def small(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "job": "t16", "parallel": {"tp": 2, "pp": 4, "dp": 2, "cp": 1}, "microbatches": 4,
        "iterations": 5, "gpus_per_node": 4,
        "noise": {"gc_prob": 0.05},
        "sampling": {"progress_ms": 5.0, "link_ms": 20.0, "gpu_ms": 100.0},
        "faults": [{"cause": "compute", "ranks": [5], "start": 2, "duration": 2,
                    "severity": 1.5}],
    }
    d.update(over)
    return d


@pytest.fixture(scope="module")
def sim16() -> SimResult:
    return simulate(scenario_from_dict(small()), seed=3)


@pytest.fixture(scope="module")
def sim_cp() -> SimResult:
    return simulate(scenario_from_dict(small(
        job="tcp", parallel={"tp": 2, "pp": 2, "dp": 2, "cp": 2}, gpus_per_node=8)), seed=4)


def coll_frame(res: SimResult) -> pd.DataFrame:
    return res.tables["coll"].to_pandas()


def rounds(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    enter = df[df.phase == "enter"].set_index(["comm", "rank", "seq"])
    end = df[df.phase == "end"].set_index(["comm", "rank", "seq"])
    return enter, end


@pytest.mark.parametrize("name", ["sim16", "sim_cp"])
def test_every_enter_has_one_end_and_tables_conform(name: str,
                                                    request: pytest.FixtureRequest) -> None:
    res: SimResult = request.getfixturevalue(name)
    for kind, table in res.tables.items():
        assert table.schema.equals(events.SCHEMAS[kind]), kind
        events.conform(table, kind)   # raises on a contract violation
        assert table.num_rows > 0, kind
    enter, end = rounds(coll_frame(res))
    assert enter.index.is_unique and end.index.is_unique
    assert set(enter.index) == set(end.index)
    both = enter.merge(end, left_index=True, right_index=True, suffixes=("_in", "_out"))
    assert (both.t_out >= both.t_in).all()
    assert (both.t_start_out >= both.t_in).all()
    assert (both.t_out >= both.t_start_out).all()
    assert both.t_start_in.isna().all() and both.send_count_in.isna().all()
    assert (both.bytes_in == both.bytes_out).all() and (both.op_in == both.op_out).all()


def test_seq_consecutive_from_zero_per_comm_and_rank(sim16: SimResult) -> None:
    df = coll_frame(sim16)
    enter = df[df.phase == "enter"].sort_values("t")
    for (_, _), g in enter.groupby(["comm", "rank"]):
        seqs = g.seq.to_numpy()
        assert sorted(seqs.tolist()) == list(range(len(seqs)))
        # issued in seq order (host calls are sequential per rank; same node clock)
        assert (np.diff(g.sort_values("seq").t.to_numpy()) >= 0).all()


@pytest.mark.parametrize("name", ["sim16", "sim_cp"])
def test_collective_rounds_end_together(name: str, request: pytest.FixtureRequest) -> None:
    res: SimResult = request.getfixturevalue(name)
    df = coll_frame(res)
    coll = df[~df.op.isin(["send", "recv"])]
    enter, end = rounds(coll)
    both = enter.merge(end, left_index=True, right_index=True,
                       suffixes=("_in", "_out")).reset_index()
    both["transfer"] = both.t_out - both.t_start_out
    nodes = res.meta.nodes
    both["node"] = both["rank"].map(nodes)
    checked = 0
    for (_, _), g in both.groupby(["comm", "seq"]):
        assert len(g) == g.comm_size_in.iloc[0]
        assert g.op_in.nunique() == 1 and g.bytes_in.nunique() == 1
        # the same transfer for everybody: it starts when the last member entered
        assert g.transfer.max() - g.transfer.min() <= 2
        assert g.t_out.max() - g.t_out.min() <= 2 * SKEW_NS
        assert (g.t_start_out - g.t_in.max()).abs().max() <= 2 * SKEW_NS
        for _, same_node in g.groupby("node"):
            assert same_node.t_out.nunique() == 1
        checked += 1
    assert checked > 100


def test_pp_send_recv_pairs_match(sim16: SimResult) -> None:
    df = coll_frame(sim16)
    p2p = df[df.op.isin(["send", "recv"]) & (df.phase == "end")]
    comms = {c.comm: c for c in sim16.meta.comms}
    pairs = 0
    for comm, g in p2p.groupby("comm"):
        assert comms[comm].kind == "pp"
        for (src, dst), sends in g[g.op == "send"].groupby(["comm_rank", "peer"]):
            recvs = g[(g.op == "recv") & (g.comm_rank == dst) & (g.peer == src)]
            sends, recvs = sends.sort_values("seq"), recvs.sort_values("seq")
            assert len(sends) == len(recvs) > 0
            assert (sends.bytes.to_numpy() == recvs.bytes.to_numpy()).all()
            # k-th send and k-th recv are one message: same transfer window (up to skew)
            assert np.abs(sends.t.to_numpy() - recvs.t.to_numpy()).max() <= 2 * SKEW_NS
            assert np.abs(sends.t_start.to_numpy()
                          - recvs.t_start.to_numpy()).max() <= 2 * SKEW_NS
            assert (sends.send_count > 0).all() and (recvs.recv_count > 0).all()
            pairs += len(sends)
    # 2 stages per message direction x 3 edges x 4 micro-batches x 5 iterations x dp2 x tp2
    assert pairs == 2 * 3 * 4 * 5 * 2 * 2


def test_meta_rank_order_nodes_and_comms(sim_cp: SimResult) -> None:
    m = sim_cp.meta
    assert m.tp * m.pp * m.dp * m.cp == m.world_size == 16
    assert m.schedule == "1f1b" and m.microbatches == 4
    assert m.nodes == {r: f"node{r // 8:03d}" for r in range(16)}
    kinds: dict[str, list[tuple[int, ...]]] = {}
    for c in m.comms:
        kinds.setdefault(c.kind, []).append(c.ranks)
    # Megatron order: rank = tp + TP*(cp + CP*(dp + DP*pp)); strides 1, 2, 4, 8
    stride = {"tp": 1, "cp": 2, "dp": 4, "pp": 8}
    for kind, groups in kinds.items():
        assert len(groups) == 16 // 2
        for ranks in groups:
            assert np.all(np.diff(ranks) == stride[kind]), (kind, ranks)
        assert sorted(r for g in groups for r in g) == list(range(16))
    ids = [c.comm for c in m.comms]
    assert len(set(ids)) == len(ids)
    assert any(i >= 2**63 for i in ids) and any(i < 2**63 for i in ids)
    # every coll row names its communicator consistently with meta.comms
    df = coll_frame(sim_cp)
    by_id = {c.comm: c for c in m.comms}
    for (comm, rank, crank), _ in df.groupby(["comm", "rank", "comm_rank"]):
        assert by_id[comm].ranks[crank] == rank


def test_cp_collectives_present(sim_cp: SimResult) -> None:
    df = coll_frame(sim_cp)
    kinds = {c.comm: c.kind for c in sim_cp.meta.comms}
    df["kind"] = df.comm.map(kinds)
    ops = df.groupby("kind").op.unique().to_dict()
    assert set(ops["cp"]) == {"allgather", "reducescatter"}
    assert set(ops["tp"]) == {"allreduce"}
    assert set(ops["dp"]) == {"allgather", "reducescatter"}
    assert set(ops["pp"]) == {"send", "recv"}


def test_1f1b_program_order_and_spans(sim16: SimResult) -> None:
    def order(stage: int) -> list[str]:
        return [("F" if st.kind == FWD else "B") + str(st.mb)
                for st in build_program("1f1b", stage, 4, 8) if st.kind in (FWD, BWD)]

    assert order(0) == words("F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7")
    assert order(3) == words("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7")
    gp = [("F" if st.kind == FWD else "B") + str(st.mb)
          for st in build_program("gpipe", 1, 4, 3) if st.kind in (FWD, BWD)]
    assert gp == words("F0 F1 F2 B0 B1 B2")
    sp = sim16.tables["span"].to_pandas()
    rank0 = sp[(sp["rank"] == 0) & (sp.step == 1)].sort_values("t_start")
    comp = rank0[rank0.op.str.endswith("compute")]
    seq = [("F" if o.startswith("forward") else "B") + str(mb)
           for o, mb in zip(comp.op, comp.microbatch, strict=True)]
    assert seq == words("F0 F1 F2 F3 B0 B1 B2 B3")
    ops = set(sp.op)
    assert {"forward-compute", "backward-compute", "forward-send", "forward-recv",
            "backward-send", "backward-recv", "params-sync", "grads-sync",
            "optimizer"} <= ops
    assert (sp.t_end >= sp.t_start).all()
    # params-sync is the first thing of a step on every rank, grads-sync after the last backward
    first = sp.sort_values("t_start").groupby(["rank", "step"]).first()
    assert (first.op == "params-sync").all()


def words(text: str) -> list[str]:
    return text.split(" ")


def canon(table: Any) -> pd.DataFrame:
    df = table.to_pandas()
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def test_trace_round_trips_through_tracedir(sim16: SimResult, tmp_path: Path) -> None:
    for fmt in ("parquet", "jsonl"):
        out = write_sim(sim16, tmp_path / fmt, fmt)
        td = TraceDir(out)
        assert td.meta() == sim16.meta
        assert set(td.kinds) == set(sim16.tables)
        for kind, table in sim16.tables.items():
            back = td.read(kind)
            assert back.schema.equals(events.SCHEMAS[kind])
            pd.testing.assert_frame_equal(canon(back), canon(table), obj=f"{fmt} {kind}")
        coll = td.read("coll")
        assert max(coll.column("comm").to_pylist()) >= 2**63
        assert (out / "truth.json").exists() and (out / "scenario.yaml").exists()


def test_jsonl_and_parquet_hold_the_same_rows(sim16: SimResult, tmp_path: Path) -> None:
    a = TraceDir(write_sim(sim16, tmp_path / "a", "parquet")).read("coll").to_pandas()
    b = TraceDir(write_sim(sim16, tmp_path / "b", "jsonl")).read("coll").to_pandas()
    key = ["comm", "rank", "seq", "phase"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)


def test_progress_samples_long_ops_with_growing_counts(sim16: SimResult) -> None:
    pr = sim16.tables["progress"].to_pandas()
    enter, end = rounds(coll_frame(sim16))
    assert len(pr) > 0
    joined = pr.join(enter[["t"]].rename(columns={"t": "t_enter"}), on=["comm", "rank", "seq"])
    joined = joined.join(end[["t", "t_start", "send_count", "recv_count"]]
                         .rename(columns={"t": "t_end", "send_count": "total_s",
                                          "recv_count": "total_r"}), on=["comm", "rank", "seq"])
    assert joined.t_enter.notna().all()
    assert ((joined.t > joined.t_enter) & (joined.t < joined.t_end)).all()
    assert (joined.send_count <= joined.total_s).all()
    assert (joined.recv_count <= joined.total_r).all()
    waiting = joined[joined.t < joined.t_start]
    assert len(waiting) and (waiting.send_count == 0).all() and (waiting.recv_count == 0).all()
    for _, g in joined.groupby(["comm", "rank", "seq"]):
        assert (np.diff(g.sort_values("t").send_count.to_numpy().astype(np.int64)) >= 0).all()


def test_link_rows_are_cumulative_per_queue_pair(sim16: SimResult) -> None:
    lk = sim16.tables["link"].to_pandas()
    nodes = sim16.meta.nodes
    assert len(lk) > 0
    assert (lk.node == lk["rank"].map(nodes)).all()
    assert (lk.peer_node != lk.node).all()
    assert lk.device.str.match(r"^mlx5_\d$").all()
    for _, g in lk.groupby(["rank", "peer_node"]):
        g = g.sort_values("t")
        for col in ("posted", "completed", "bytes"):
            assert (np.diff(g[col].to_numpy().astype(np.int64)) >= 0).all()
        assert (g.posted >= g.completed).all()
    assert lk.groupby(["rank", "peer_node"]).bytes.max().min() > 0


def test_gc_pauses_and_last_stage_heavier(sim16: SimResult) -> None:
    sp = sim16.tables["span"].to_pandas()
    gc = sp[sp.op == "gc"]
    assert len(gc) > 0 and (gc.microbatch == -1).all()
    fwd = sp[(sp.op == "forward-compute") & (sp.step < 2)]
    dur = (fwd.t_end - fwd.t_start).groupby(fwd["rank"] // 4).median()
    assert dur[3] > 1.08 * dur[1]   # the last stage (ranks 12-15) is heavier


def test_clock_skew_is_per_node_and_bounded(sim16: SimResult) -> None:
    df = coll_frame(sim16)
    nodes = sim16.meta.nodes
    tp = df[(df.op == "allreduce") & (df.phase == "end")]
    assert tp.groupby(["comm", "seq"]).t.nunique().max() == 1     # TP pairs share a node
    # a PP message ends at one true time on both sides: the difference of the two
    # timestamps is the (constant) clock offset between the two nodes
    p2p = df[df.op.isin(["send", "recv"]) & (df.phase == "end")]
    offsets: dict[tuple[str, str], set[int]] = {}
    for _, msgs in p2p.groupby("comm"):
        s = msgs[msgs.op == "send"].sort_values(["comm_rank", "peer", "seq"])
        r = msgs[msgs.op == "recv"].sort_values(["peer", "comm_rank", "seq"])
        assert len(s) == len(r)
        for rs, rr, ts, tr in zip(s["rank"], r["rank"], s.t, r.t, strict=True):
            offsets.setdefault((nodes[rs], nodes[rr]), set()).add(int(ts) - int(tr))
    assert len(offsets) >= 3
    for pair, values in offsets.items():
        assert max(values) - min(values) <= 1, pair         # one constant per node pair
        assert abs(next(iter(values))) <= 2 * SKEW_NS
    assert any(abs(next(iter(v))) > 1000 for v in offsets.values())
