"""Node agent: rings written by RingWriter -> trace directory, crash and restart safety."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.rings import coll_records, ring_with_records

from conftest import REPO
from failslow.collectors.agent import COLLECTORS, Agent, TraceDirSink, TransportSink
from failslow.collectors.gpu import GpuCollector
from failslow.collectors.rdma import RdmaCollector
from failslow.stream.transport import InProcessTransport, decode
from failslow.tracedir import TraceDir


def test_agent_writes_trace_dir_with_meta_comms(tmp_path: Path) -> None:
    rings, out = tmp_path / "rings", tmp_path / "out"
    rings.mkdir()
    ws = [ring_with_records(rings, r, 100 + r, 50) for r in range(2)]
    agent = Agent(TraceDirSink(out), rings, node="n0", collectors={"gpu": False, "rdma": False})
    assert agent.poll() == 2 * 101
    for w in ws:
        w.close()  # closed by the producer: drained, then removed
    agent.poll()
    assert agent.rings == [] and not list(rings.iterdir())
    agent.close()
    td = TraceDir(out)
    coll = td.read("coll")
    assert coll.num_rows == 2 * 2 * 50
    assert sorted(set(coll.column("rank").to_pylist())) == [0, 1]
    assert set(coll.column("comm").to_pylist()) == {2**63 + 5}
    meta = td.meta()
    assert meta.job == "job1" and meta.world_size == 2 and meta.dp == 2
    assert [(c.kind, c.ranks) for c in meta.comms] == [("dp", (0, 1))]
    assert meta.nodes == {0: "n0", 1: "n0"}


def test_agent_names_emulated_nodes_of_ranks(tmp_path: Path) -> None:
    """One agent draining ranks of two emulated nodes (network namespaces, the example job's
    slow link): ``rank_nodes`` names their nodes in ``meta.nodes``."""
    rings, out = tmp_path / "rings", tmp_path / "out"
    rings.mkdir()
    ws = [ring_with_records(rings, r, 200 + r, 5) for r in range(2)]
    agent = Agent(TraceDirSink(out), rings, node="host", rank_nodes={1: "nsB"},
                  collectors={"gpu": False, "rdma": False})
    agent.poll()
    for w in ws:
        w.close()
    agent.close()
    assert TraceDir(out).meta().nodes == {0: "host", 1: "nsB"}


def test_crashed_producer_drained_fully_then_removed(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    code = (
        "import sys, numpy as np\n"
        "from failslow.collectors import ring as R\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from support.rings import ring_with_records\n"
        "import os\n"
        "w = ring_with_records(__import__('pathlib').Path(sys.argv[1]), 3, os.getpid(), 200)\n"
        "os._exit(1)\n"  # crash: no close, ring not marked closed
    )
    subprocess.run([sys.executable, "-c", code, str(rings), str(REPO / "tests")],
                   check=False, timeout=60)
    [path] = list(rings.iterdir())
    sink = TransportSink(InProcessTransport())
    transport = sink.transport
    agent = Agent(sink, rings, collectors={"gpu": False, "rdma": False})
    agent.poll()
    assert not path.exists() and agent.stats["rings_removed"] == 1
    rows = sum(decode(m)[1].num_rows for m in transport.messages("failslow.coll"))
    assert rows == 400
    assert transport.messages("failslow.meta")


def test_agent_restart_loses_nothing_the_ring_holds(tmp_path: Path) -> None:
    rings, out1, out2 = tmp_path / "rings", tmp_path / "a", tmp_path / "b"
    rings.mkdir()
    w = ring_with_records(rings, 0, os.getpid(), 10)  # alive producer (this process)
    a1 = Agent(TraceDirSink(out1), rings, collectors={"gpu": False, "rdma": False})
    a1.poll()
    a1.close()  # the agent stops; the producer goes on
    w.write(coll_records(0, 2**63 + 5, 30, t0=5_000_000_000)[20:])  # seq 10..29
    a2 = Agent(TraceDirSink(out2), rings, collectors={"gpu": False, "rdma": False})
    a2.poll()
    a2.close()
    w.close()
    s1 = TraceDir(out1).read("coll").column("seq").to_pylist()
    s2 = TraceDir(out2).read("coll").column("seq").to_pylist()
    assert sorted(set(s1)) == list(range(10)) and sorted(set(s2)) == list(range(10, 30))


class _FailingSink(TraceDirSink):
    fail = True

    def write(self, job: str, batch: dict) -> None:  # type: ignore[override]
        if self.fail:
            raise ConnectionError("broker down")
        super().write(job, batch)


def test_sink_error_keeps_batches(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    w = ring_with_records(rings, 0, os.getpid(), 5)
    sink = _FailingSink(tmp_path / "o")
    agent = Agent(sink, rings, collectors={"gpu": False, "rdma": False})
    agent.poll()
    assert agent.stats["sink_errors"] == 1
    sink.fail = False
    agent.close()
    w.close()
    assert TraceDir(tmp_path / "o").read("coll").num_rows == 10


def test_collectors_absent_are_no_data_not_failed(tmp_path: Path) -> None:
    agent = Agent(TraceDirSink(tmp_path), tmp_path)
    assert set(agent.status) == set(COLLECTORS)
    gpu = GpuCollector("j", "n")
    if not gpu.available:
        st = agent.status["gpu"]
        assert not st.available and st.reason and st.failures == 0
    assert RdmaCollector("j", "n", root=tmp_path / "none").available is False


def test_rdma_sysfs_counters(tmp_path: Path) -> None:
    c = tmp_path / "mlx5_0" / "ports" / "1" / "counters"
    c.mkdir(parents=True)
    for name, v in (("port_xmit_data", 250), ("port_xmit_packets", 7), ("port_rcv_packets", 6)):
        (c / name).write_text(f"{v}\n")
    t = RdmaCollector("j", "n", root=tmp_path).sample(123)["link"]
    assert t.to_pylist()[0] | {} == {"job": "j", "node": "n", "rank": None,
                                     "device": "mlx5_0/1", "peer_node": None, "t": 123,
                                     "posted": 7, "completed": 6, "bytes": 1000}


def test_failing_collector_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        name, reason, available = "broken", "", True

        def sample(self, now_ns: int | None = None) -> dict:
            raise OSError("sysfs went away")

        def close(self) -> None:
            pass

    monkeypatch.setitem(COLLECTORS, "broken", (lambda j, n: Broken(), True))  # type: ignore[arg-type,return-value]
    agent = Agent(TraceDirSink(tmp_path), tmp_path, collectors={"gpu": False, "rdma": False})
    agent.sample_collectors(force=True)
    st = agent.status["broken"]
    assert st.available and st.failures == 1 and "sysfs" in st.last_error


def test_agent_cli_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import argparse
    import json

    from failslow.cli.agent import add_parser

    rings = tmp_path / "rings"
    rings.mkdir()
    w = ring_with_records(rings, 0, 777777, 4)
    w.close()
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["agent", "--ring-dir", str(rings), "--out", str(tmp_path / "o"),
                              "--once", "--json", "--disable", "gpu"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["records"] == 9 and "gpu" not in report["collectors"]
    assert TraceDir(tmp_path / "o").read("coll").num_rows == 8
