"""The what-if analysis of a pure data-parallel job whose gradient sync is one all-reduce
(no params-sync all-gather, no pipeline): each step ends with its sync, which is what the
coll-only derivation takes as the step boundary (ByteDance §3)."""

from __future__ import annotations

from pathlib import Path

from failslow.bench import heldout as hg
from failslow.engine.offline import analyze


def test_whatif_runs_on_a_pure_dp_allreduce_job_and_blames_the_sync(tmp_path: Path) -> None:
    spec = hg.Spec(tp=1, pp=1, dp=16, microbatches=2, dp_mode="allreduce", gpus_per_node=4,
                   dp_bytes=512 << 20, iterations=26, seed=21,
                   faults=[hg.Fault("communication", 7, peer=8, start=12, end=19,
                                             factor=4.0)])
    hg.write(spec, tmp_path / "dp")
    diag = analyze(tmp_path / "dp").to_dict()
    whatif = diag["whatif"]
    assert whatif is not None, diag.get("incomplete")
    by = whatif["by_op_type"]
    assert by["dp-communication"] == max(by.values()) and by["dp-communication"] > 1.1
    assert whatif["slowdown"] > 1.1
