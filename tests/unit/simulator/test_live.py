"""The live simulator (``failslow simulate --live``): chunks of the ordinary simulator
stitched into one endless job with current times, and its fault schedule."""

from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from failslow import events
from failslow.cli.simulate_live import causes, seconds
from failslow.simulator.live import GAP_NS, LiveConfig, LiveSimulator
from failslow.simulator.scenario import CAUSES, ScenarioError

NOW = 1_900_000_000_000_000_000


def _chunks(sim: LiveSimulator, n: int) -> list:
    return [sim.next_chunk() for _ in range(n)]


def _cat(chunks: list, kind: str) -> pa.Table:
    return pa.concat_tables([c.tables[kind] for c in chunks])


def test_chunks_start_now_and_follow_each_other() -> None:
    sim = LiveSimulator(LiveConfig(first_fault_s=1e6), clock=lambda: NOW)
    chunks = _chunks(sim, 4)
    first = pc.min(chunks[0].tables["coll"].column("t")).as_py()
    assert NOW - 2_000_000 <= first < NOW + 10**9    # the wall clock (+- skew), not 2025
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert b.start_ns == a.end_ns + GAP_NS
        assert b.first_iteration == a.first_iteration + a.iterations
    for c in chunks:
        for kind, table in c.tables.items():
            assert table.schema.equals(events.SCHEMAS[kind]), kind
            col = "t" if "t" in table.schema.names else "t_start"
            t = table.column(col).to_numpy()
            assert c.start_ns - 2_000_000 <= t.min() and t.max() <= c.end_ns + 2_000_000
    # every rank's records stay in time order across chunks
    coll = _cat(chunks, "coll")
    rank, t = coll.column("rank").to_numpy(), coll.column("t").to_numpy()
    chunk_of = np.repeat(np.arange(4), [c.tables["coll"].num_rows for c in chunks])
    for r in (0, 21, 63):
        sel = rank == r
        for k in range(3):
            assert t[sel & (chunk_of == k)].max() < t[sel & (chunk_of == k + 1)].min()
    assert [c.new_job for c in chunks] == [True, False, False, False]


def test_sequence_numbers_iterations_and_link_counters_continue() -> None:
    sim = LiveSimulator(LiveConfig(first_fault_s=1e6), clock=lambda: NOW)
    chunks = _chunks(sim, 3)
    coll = _cat(chunks, "coll")
    keys = pc.binary_join_element_wise(
        pc.cast(coll.column("rank"), pa.string()), pc.cast(coll.column("comm"), pa.string()),
        pc.cast(coll.column("seq"), pa.string()), coll.column("phase"), "/")
    assert pc.count_distinct(keys).as_py() == coll.num_rows      # no round repeated
    for r in (0, 17, 50):                   # a rank's seq per communicator: 0, 1, 2, ...
        rows = coll.filter(pc.and_(pc.equal(coll.column("rank"), r),
                                   pc.equal(coll.column("phase"), "enter")))
        for comm in set(rows.column("comm").to_pylist()):
            same = pc.equal(rows.column("comm"), pa.scalar(comm, pa.uint64()))
            seq = np.sort(rows.filter(same).column("seq").to_numpy())
            assert (np.diff(seq) > 0).all()
    steps = _cat(chunks, "span").column("step").to_numpy()
    assert set(steps[steps >= 0].tolist()) == set(range(15))   # 3 chunks of 5 iterations
    link = _cat(chunks, "link")             # cumulative counters never go back
    peer = np.unique(np.asarray(link.column("peer_node").to_pylist(), dtype=str),
                     return_inverse=True)[1]
    qp = link.column("rank").to_numpy().astype(np.int64) * 1000 + peer
    order = np.lexsort((link.column("t").to_numpy(), qp))
    same_qp = qp[order][1:] == qp[order][:-1]
    assert same_qp.sum() > 100
    for name in ("posted", "completed", "bytes"):
        v = link.column(name).to_numpy().astype(np.int64)[order]
        assert (np.diff(v)[same_qp] >= 0).all(), name
    assert link.column("completed").to_numpy()[order][-1] > 0


def test_faults_cycle_through_the_causes_and_slow_the_job() -> None:
    cfg = LiveConfig(first_fault_s=3.0, fault_every_s=6.0, fault_for_s=4.0, hang_tail_s=2.0)
    sim = LiveSimulator(cfg, clock=lambda: NOW)
    assert [sim.fault(i).cause for i in range(8)] == [*CAUSES, *CAUSES[:2]]
    assert sim.fault(1).start_ns - sim.fault(0).start_ns == 6 * 10**9
    seen, jobs, hung = [], [], []
    while sim.t_ns < NOW + 38 * 10**9:        # faults 0-5 start at 3, 9, ... 33 s
        c = sim.next_chunk()
        jobs.append(c.job)
        if c.fault_started:
            assert c.fault is not None and c.fault.start_ns <= c.start_ns < c.fault.end_ns
            seen.append(c.fault.cause)
        if c.hung:
            hung.append(c.job)
    assert seen == list(CAUSES)
    # each hang hangs the job, which restarts under a new id with fresh numbering
    assert hung == ["live-job", "live-job-r1", "live-job-r2"]
    assert jobs[-1] == "live-job-r3"
    assert sim.fault(0).spec.ranks and sim.fault(1).spec.nodes


def test_a_compute_fault_slows_its_rank() -> None:
    cfg = LiveConfig(first_fault_s=0.0, fault_every_s=100.0, fault_for_s=50.0,
                     causes=("compute",))
    sim = LiveSimulator(cfg, clock=lambda: NOW)
    c = sim.next_chunk()
    assert c.fault is not None and c.fault_started
    [rank] = c.fault.spec.ranks
    span = c.tables["span"].filter(pc.equal(c.tables["span"].column("op"), "forward-compute"))
    d = pc.subtract(span.column("t_end"), span.column("t_start")).to_numpy()
    ranks = span.column("rank").to_numpy()
    stage = ranks // 16 == rank // 16
    assert np.median(d[ranks == rank]) > 1.3 * np.median(d[stage & (ranks != rank)])


def test_memory_stays_flat_over_many_chunks() -> None:
    sim = LiveSimulator(LiveConfig(fault_every_s=4.0, fault_for_s=2.0, first_fault_s=1.0,
                                   hang_tail_s=1.0), clock=lambda: NOW)
    for _ in range(10):
        sim.next_chunk()
    base = pa.total_allocated_bytes()
    for _ in range(40):
        sim.next_chunk()
    assert pa.total_allocated_bytes() <= base + (1 << 20)   # nothing kept but one chunk
    assert len(sim.state.link) <= 64 * 8 and sim.state.seq is not None


@pytest.mark.parametrize("bad", [{"ranks": 100}, {"ranks": 32}, {"fault_every_s": 0},
                                 {"fault_for_s": 300}, {"causes": ("slow",)},
                                 {"causes": ()}])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ScenarioError):
        LiveSimulator(LiveConfig(**bad))


def test_option_types() -> None:
    assert seconds("90") == 90 and seconds("3m") == 180 and seconds("1h") == 3600
    assert causes("compute,link,h1") == ("compute", "communication", "not_entered")
    for bad in ("x", "3 weeks"):
        with pytest.raises(argparse.ArgumentTypeError):
            seconds(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        causes("compute,nope")
