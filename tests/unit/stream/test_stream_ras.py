"""The stream processor feeds ``ras`` rows (event contract v2) to the hang detector like
every kind the registry's detectors read, stores them, and reaches the diagnosis
``failslow analyze`` gives on the same records."""

from __future__ import annotations

import pyarrow.compute as pc

from failslow import events
from failslow.engine.offline import analyze_tables
from failslow.simulator import scenario_from_dict, simulate
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.sink import MemorySink
from failslow.stream.transport import InProcessTransport

S = 1_000_000_000


def test_processor_feeds_ras_rows_to_the_hang_detector() -> None:
    sim = simulate(scenario_from_dict({
        "job": "rasjob", "parallel": {"tp": 2, "pp": 2, "dp": 2, "cp": 1},
        "microbatches": 4, "schedule": "1f1b", "iterations": 8}), seed=3)
    dp = next(c for c in sim.meta.comms if c.kind == "dp" and 6 in c.ranks)
    coll = sim.tables["coll"]
    stop = int(pc.max(coll.column("t")).as_py())
    ras = events.from_rows("ras", [
        {"job": "rasjob", "t": stop + k * 10 * S, "node": "node3", "comm": dp.comm,
         "comm_size": len(dp.ranks), "rank": 6, "finding": "missing"} for k in range(1, 8)])
    bus, sink = InProcessTransport(), MemorySink()
    bus.publish_meta(sim.meta)
    bus.publish_batch("rasjob", {"coll": coll})
    bus.publish_batch("rasjob", {"ras": ras})
    proc = StreamProcessor(bus, sink, ProcessorConfig(clock="event"))
    stats = proc.run()
    assert stats.rows["ras"] == ras.num_rows and stats.dead_letters == 0
    stored = sink.table("ras")
    assert stored is not None and stored.num_rows == ras.num_rows
    hangs = [a for a in proc.diagnosis("rasjob").anomalies if a.kind == "hang"]
    assert [(a.cause, a.ranks, a.comm) for a in hangs] == [("not_entered", [6], dp.comm)]
    offline = [a for a in analyze_tables(sim.meta, {"coll": coll, "ras": ras}).anomalies
               if a.kind == "hang"]
    assert [a.to_dict() for a in offline] == [a.to_dict() for a in hangs]
