"""A job whose meta lists no communicators (events.md: consumers infer them from ``coll``
rows): the stream processor learns them as the rows arrive, while ``failslow analyze``
infers them from the whole trace first. Both must label every group alike, or the same
slow ring is a DP sync offline and a TP collective (or nothing) online."""

from __future__ import annotations

from pathlib import Path

from failslow.bench import heldout as hg
from failslow.engine.analyzer import JobAnalyzer
from failslow.engine.offline import KINDS, run_analyzer
from failslow.engine.runner import run
from failslow.replay import replay
from failslow.tracedir import TraceDir


def _keys(anomalies: list[dict]) -> list[tuple]:  # type: ignore[type-arg]
    return [(a["id"], a["cause"], a["ranks"], a.get("link"), a.get("stage"),
             a.get("comm_kind"), a["start_ns"], a["detected_ns"]) for a in anomalies]


def test_a_slow_dp_hop_is_diagnosed_alike_live_and_offline(tmp_path: Path) -> None:
    """Held-out seed 29 ``link-dp-9`` (tp4 pp4 dp4, DP index fastest, no meta.comms): the
    DP hop 52 -> 53 2.8x slower, absorbed by the pipeline. ``analyze`` reported it (the
    link-rate detector, stage ``dp_sync``); online every DP ring had been labelled TP (the
    first rank order a group fits is Megatron's) and nothing was reported. The link-rate
    detector now reads the kinds the slow-down detector learned for the whole job, in the
    rank order that explains every group, as :func:`failslow.comms.infer_comms` does."""
    spec = hg.Spec(tp=4, pp=4, dp=4, microbatches=8, iterations=33, order=("dp", "tp", "pp"),
                   gpus_per_node=8, forward_ms=2.68272645, backward_ratio=2.16107712,
                   last_stage=1.00431466, dp_bytes=33554432, dp_mode="allreduce",
                   pp_comm="pair", small_allreduce=True, jitter="bimodal",
                   jitter_scale=0.02519564, comm_jitter="pareto", seqlen_sigma=0.05399514,
                   burst_prob=0.02, gc_prob=0.00078125, skew_ms=3.48949403,
                   drift_ppm=10.3784982, missing_t_start=0.3, link_rows=True, seed=1403186534,
                   job="heldout-link-dp-9",
                   faults=[hg.Fault("communication", 52, peer=53, start=9, end=20,
                                    factor=2.84341505)])
    hg.write(spec, tmp_path / "job")
    td = TraceDir(tmp_path / "job")
    meta = td.meta()
    assert not meta.comms
    tables = {k: td.read(k) for k in KINDS if k in td.kinds}
    offline = run_analyzer(meta, tables).diagnosis().to_dict()["anomalies"]
    live = run(JobAnalyzer(meta), replay(tables, 100_000_000)).diagnosis().to_dict()["anomalies"]
    assert _keys(live) == _keys(offline)
    assert [(a["cause"], a["stage"], a["comm_kind"]) for a in live] == [
        ("communication", "dp_sync", "dp")]
