"""The what-if analysis from ``coll`` rows alone on jobs of other shapes than the simulator's:

* a pipeline whose stages talk over one communicator per pair of adjacent stages
  (``pp_comm="pair"``) instead of one per pipeline gives the same steps and the same S
  either way, in Megatron's rank order and in another one (stages then come from the
  chains of pairs, not from Megatron's formula);
* a few-byte DP all-reduce beside the gradient sync (a loss or grad-norm all-reduce) is not
  taken for the gradient sync: with or without it, the same job gives the same S, with the
  distributed optimizer (reduce-scatter, all-gather) and without, with and without a
  pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from failslow.bench import heldout as hg
from failslow.engine.offline import analyze


@pytest.mark.parametrize("order", [("tp", "dp", "pp"), ("pp", "tp", "dp")])
def test_per_pair_pipeline_communicators_give_the_pipeline_s(tmp_path: Path,
                                                             order: tuple[str, ...]) -> None:
    whatif = {}
    for comm in ("pipeline", "pair"):
        spec = hg.Spec(tp=2, pp=4, dp=2, microbatches=8, iterations=14, seed=5,
                       gpus_per_node=8, order=order, pp_comm=comm)
        hg.write(spec, tmp_path / comm)
        diag = analyze(tmp_path / comm).to_dict()
        assert diag["whatif"] is not None, diag.get("incomplete")
        whatif[comm] = diag["whatif"]
    assert whatif["pair"]["steps"] == whatif["pipeline"]["steps"]
    assert len(whatif["pair"]["steps"]) >= 10
    assert whatif["pair"]["slowdown"] == pytest.approx(whatif["pipeline"]["slowdown"], rel=1e-3)


def test_no_complete_step_says_where_the_most_complete_one_falls_short() -> None:
    import numpy as np

    from failslow.whatif.spans import _closest, _gaps
    # 3 steps, 2 micro-batches, 2 stages, 2 DP replicas; stage 1 of replica 0 never ran its
    # second forward, and step 5 also lacks stage 0's first one
    start = {"forward-compute": np.zeros((3, 2, 2, 2))}
    start["forward-compute"][:, 1, 1, 0] = np.nan
    start["forward-compute"][2, 0, 0, 1] = np.nan
    programs = [[(("forward-compute", 0),), (("forward-compute", 1),)]] * 2
    missing, first = _gaps(start, programs)
    assert missing.tolist() == [1, 1, 2]
    text = _closest(missing, first, np.array([3, 4, 5]))
    assert text == ("step 3, the most complete, lacks 1 operation(s) of the workers' "
                    "programs, first forward-compute #1 of stage 1, DP replica 0")


@pytest.mark.parametrize(("pp", "dp_mode"), [(4, "rs_ag"), (4, "allreduce"), (1, "rs_ag"),
                                             (1, "allreduce")])
def test_a_small_dp_allreduce_is_no_gradient_sync(tmp_path: Path, pp: int,
                                                  dp_mode: str) -> None:
    whatif = {}
    for small in (False, True):
        spec = hg.Spec(tp=1, pp=pp, dp=4, microbatches=8 if pp > 1 else 2, iterations=14,
                       seed=5, gpus_per_node=8, dp_mode=dp_mode, small_allreduce=small)
        hg.write(spec, tmp_path / str(small))
        diag = analyze(tmp_path / str(small)).to_dict()
        assert diag["whatif"] is not None, diag.get("incomplete")
        whatif[small] = diag["whatif"]
    assert whatif[True]["steps"] == whatif[False]["steps"]
    assert whatif[True]["discrepancy"] < 0.02
    assert whatif[True]["slowdown"] == pytest.approx(whatif[False]["slowdown"], rel=0.005)


def test_without_a_pipeline_the_dp_communicators_place_the_ranks(tmp_path: Path) -> None:
    """Tensor parallelism and data parallelism only, data-parallel ranks adjacent (order dp,
    tp): Megatron's formula would put the wrong ranks in each worker."""
    spec = hg.Spec(tp=4, pp=1, dp=8, microbatches=4, iterations=14, seed=5, gpus_per_node=8,
                   order=("dp", "tp", "pp"))
    hg.write(spec, tmp_path / "j")
    diag = analyze(tmp_path / "j").to_dict()
    assert diag["whatif"] is not None, diag.get("incomplete")
    assert len(diag["whatif"]["steps"]) >= 10
    assert diag["whatif"]["discrepancy"] < 0.001


def test_a_slowdown_covering_most_steps_says_it_is_understated(tmp_path: Path) -> None:
    """Held-out seed 3 ``link-dp-0`` (pure DP, 32 ranks): the ring hop 31 -> 0 turns 3x
    slower from step 11 of 29 on. The median of the gradient sync over steps (§3.2) is then
    the slow one, the straggler-free simulation is slower than the job (S 0.87), and every
    step before the fault ran faster than its simulation: the result says so."""
    spec = hg.Spec(tp=1, pp=1, dp=32, iterations=29, forward_ms=3.94431,
                   backward_ratio=2.08631, last_stage=1.05581, dp_bytes=536870912,
                   jitter="uniform", jitter_scale=0.05853, comm_jitter="lognormal",
                   seqlen_sigma=0.02192, gc_prob=0.003125, skew_ms=1.51204,
                   drift_ppm=61.53784, missing_t_start=0.3, link_rows=True, seed=2099042364,
                   job="heldout-link-dp-0",
                   faults=[hg.Fault("communication", 31, peer=0, start=11, factor=3.04263)])
    hg.write(spec, tmp_path / "dp")
    whatif = analyze(tmp_path / "dp").to_dict()["whatif"]
    assert whatif["slowdown"] < 0.95
    faster = whatif["caveat"]["steps_faster_than_ideal"]
    assert faster and max(faster) < 11 and "understates" in whatif["caveat"]["text"]
    # a job whose slowdown is above 1 has no caveat (the test above, same shapes)
    spec_ok = hg.Spec(tp=1, pp=1, dp=32, iterations=29, forward_ms=3.94431,
                      dp_bytes=536870912, seed=2099042364, job="heldout-compute",
                      faults=[hg.Fault("compute", 5, start=11, end=15, factor=1.5)])
    hg.write(spec_ok, tmp_path / "ok")
    whatif_ok = analyze(tmp_path / "ok").to_dict()["whatif"]
    assert whatif_ok["slowdown"] > 1.0 and "caveat" not in whatif_ok
