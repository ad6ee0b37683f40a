"""Training-job simulator with fault injection (``failslow simulate``).

Public API::

    sc = load_scenario("demo")             # a preset name, or a .yaml/.yml/.toml file
    result = simulate(sc, seed=0)           # also simulate("demo") / simulate(path)
    result.meta                             # events.JobMeta (nodes, comms, degrees)
    result.tables                           # {"coll", "span", "progress", "link", "gpu"}
    result.iter_tables("coll")              # the same rows in chunks (large jobs)
    result.truth                            # diagnosis.Diagnosis (the injected faults)
    write_sim(result, "out/", "parquet")    # trace directory + truth.json + scenario.yaml

Model (details in the modules):

* Job: TP x PP x DP (x CP) in Megatron's rank order ``rank = tp + TP*(cp + CP*(dp +
  DP*pp))``; ``gpus_per_node`` consecutive ranks per node (``node000``...). Communicators:
  TP, CP, DP groups and one PP group per pipeline (:mod:`.topology`).
* Schedule: 1F1B (Megatron's warm-up / steady / cool-down) or GPipe over M micro-batches;
  params-sync (DP all-gather) first, grads-sync (DP reduce-scatter) and the optimizer last;
  TP all-reduces (and CP all-gather / reduce-scatter) inside forward and backward compute
  (:mod:`.schedule`; what-if §3.1 Table 1, §3.2 dependency model).
* Semantics: a collective's transfer starts when the last member entered and ends for all at
  once; a p2p message starts when both sides are posted (:mod:`.engine`).
* Noise: log-normal jitter per compute op and per transfer, a per-(iteration, micro-batch,
  replica) sequence-length factor, a 15 % heavier last stage, rare GC pauses on one rank
  (what-if §5.2-5.4), a constant clock offset per node in +-``clock_skew_ms`` applied to every
  timestamp of that node (so two nodes differ by at most twice that).
* Faults (:mod:`.faults`; CCL-D §2.2): ``compute`` (durations x severity, optionally only
  forward or backward), ``communication`` (a slow link between two nodes), ``mixed`` (both),
  and the hangs ``not_entered``, ``inconsistent``, ``hardware``.

Which traffic crosses a slow link {A, B}: a PP message whose two ranks sit on A and B; a ring
collective (TP, CP, DP) one of whose ring edges (member i -> member i+1 in communicator-rank
order, cyclic) joins A and B -- the whole round then transfers ``severity`` x slower.

Ground truth (``truth.json``, diagnosis.md; :func:`.output.build_truth`):

* one anomaly per injected fault that took effect, ``id`` = the fault's ``id`` or
  ``fault-<index>``; ``start_ns`` / ``end_ns`` = the first start / last end of an operation
  the fault affected, in the reference clock (node clocks differ by the skew); ``end_ns`` is
  null when the fault has no duration;
* ``ranks``: compute and mixed: the slowed ranks; communication: the two ranks of ``link``.
  ``link``: a pair of global ranks whose traffic crosses the slow link -- the first PP pair
  (lower stage first) when PP crosses it, else the first crossing ring edge (DP, then TP, CP);
  ``comm`` / ``comm_kind`` / ``stage`` name that pair's communicator (``pp_p2p``,
  ``dp_sync``, ``tp_collective``); every crossing communicator is listed in ``comms``;
* compute: ``comm`` null, ``stage`` "forward" / "backward" when only that pass is slowed,
  else null;
* hangs: ``ranks`` = the root rank, ``comm`` / ``seq`` = the round it hangs at, ``start_ns``
  = when the root would have entered (not_entered), when the round's transfer started
  (inconsistent) or when the transfer stalled (hardware); ``link`` = [root, its ring
  successor or p2p peer] for a hardware hang whose stalled hop leaves the node;
* ``slowdown`` = mean true iteration time over the iterations the fault touched / median of
  the untouched iterations (or a fault-free run with the same seed when fewer than 3);
  null for hangs. Extra fields: ``severity``, ``iteration_start``, ``iteration_end``,
  ``baseline_s``, ``nodes``, ``link_severity``, ``comms``, ``seq``, ``mismatch``.
* ``iterations``: ``period_ops`` = operations per iteration on rank 0, ``median_s`` and
  ``count`` of the complete iterations (an iteration ends when the last rank's optimizer
  step does). ``whatif`` is null.
"""

from failslow.simulator.output import SimResult, write_sim
from failslow.simulator.scenario import (
    PRESETS,
    Fault,
    Scenario,
    ScenarioError,
    load_scenario,
    preset,
    scenario_from_dict,
)
from failslow.simulator.sim import simulate

__all__ = ["PRESETS", "Fault", "Scenario", "ScenarioError", "SimResult", "load_scenario",
           "preset", "scenario_from_dict", "simulate", "write_sim"]
