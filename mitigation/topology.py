"""S3 of Greyhound's mitigation (§5.2, "Adjust parallelism topology"): a new rank placement
and its predicted effect.

Two moves, both expressed as one *placement*: the physical worker (a TP x CP group of GPUs,
moved as a whole so tensor parallelism stays inside its node) that takes each logical
position (pipeline stage p, DP rank d). As a rank permutation, ``placement[new_rank] =
old_slot``: the GPU that held global rank ``old_slot`` runs global rank ``new_rank`` after
the change.

* **Straggler consolidation.** Slow workers are gathered into the minimal number of pipeline
  stages, ``ceil(#stragglers / workers per stage)`` (Greyhound's ceil(#stragglers / #GPUs per
  stage) with TP collapsed; equal when TP = CP = 1), preferring interior stages (the first
  and the last carry the embedding and the loss, §5.2), then stages that already hold the
  most stragglers (fewest moves). A straggler swaps with a healthy worker of a target stage,
  on its own node when possible (a same-node swap keeps every communicator's node
  structure).
* **DP/PP role swap (Figure 11).** A congested node pair that carries heavy DP (or TP) ring
  traffic is handed to light PP traffic (or none) by exchanging the roles of two nodes:
  every worker of one node trades positions with the worker of the same rank of the other.

Prediction (what-if §3.2 dependency simulator). The OpDuration tensors of the trace are
re-timed for the new placement: compute durations follow the physical worker (the estimated
slow-down factor of a straggler moves with it), transfer durations follow the node pairs the
traffic crosses (a congested pair multiplies the transfer time of every ring round or
pipeline message that crosses it, as in the simulator; a ring or message that changes
between intra- and inter-node is scaled by the inter/intra transfer ratio measured in the
trace, else :data:`DEFAULT_INTER_RATIO`). Both timelines are then replayed by
:class:`~failslow.whatif.sim.Plan` over the steps of the fail-slow; candidates
(consolidation, role swaps, both) are ranked by their predicted step time and the plan only
recommends a change predicted to help.

This module holds the plan (:class:`TopologyPlan`, :func:`plan_topology`,
:func:`plan_for_anomalies`) and re-exports the parts, one module each:

* :mod:`.topology_layout`: :class:`Layout` (workers, nodes) and :class:`PhysicalFaults`;
* :mod:`.topology_placement`: placements, consolidation, node swaps, traffic crossing a pair;
* :mod:`.topology_retime`: re-timing OpDuration tensors and replaying them;
* :mod:`.topology_faults`: estimating the physical faults from a trace;
* :mod:`.topology_steps`: step times, fail-slow windows, anomaly groups.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.diagnosis import Anomaly
from failslow.events import JobMeta
from failslow.mitigation.topology_faults import (
    DEFAULT_LINK_FACTOR,
    SCAN_COMPUTE,
    SCAN_LINK,
    estimate_faults,
    scan_faults,
)
from failslow.mitigation.topology_layout import MIN_FACTOR, Layout, PhysicalFaults
from failslow.mitigation.topology_placement import (
    consolidate,
    crossing,
    is_permutation,
    node_swap,
    rank_permutation,
    stage_preference,
    stages_needed,
)
from failslow.mitigation.topology_retime import (
    COMPUTE_KINDS,
    DEFAULT_INTER_RATIO,
    P2P_EDGE,
    SIMULATE_BATCH_FLOATS,
    inter_ratios,
    retime,
    simulate_many,
    structure_changes,
    subset_steps,
)
from failslow.mitigation.topology_steps import anomaly_groups, step_start_times, steps_in_window
from failslow.whatif.ops import OpTrace

__all__ = [
    "COMPUTE_KINDS", "DEFAULT_INTER_RATIO", "DEFAULT_LINK_FACTOR", "MAX_TARGET_SETS",
    "MIN_FACTOR", "MIN_GAIN", "P2P_EDGE", "SCAN_COMPUTE", "SCAN_LINK", "SIMULATE_BATCH_FLOATS",
    "Layout", "PhysicalFaults", "TopologyPlan", "anomaly_groups", "consolidate", "crossing",
    "estimate_faults", "inter_ratios", "is_permutation", "node_swap", "plan_for_anomalies",
    "plan_topology", "rank_permutation", "retime", "scan_faults", "simulate_many",
    "stage_preference", "stages_needed", "step_start_times", "steps_in_window",
    "structure_changes", "subset_steps",
]

#: A candidate placement must be predicted at least this much faster to be recommended.
MIN_GAIN = 0.005
#: Alternative consolidation target-stage sets replayed when there are at most this many.
MAX_TARGET_SETS = 64


# ---------------------------------------------------------------------------------------------
# the plan


@dataclass
class TopologyPlan:
    """S3's plan: the new placement and its predicted effect (``to_dict`` for JSON)."""

    layout: Layout
    faults: PhysicalFaults
    block_of: np.ndarray
    strategy: str                      # consolidate | role-swap | consolidate+role-swap | none
    stragglers: list[int]              # physical workers
    stages_needed: int
    target_stages: list[int]
    node_swaps: list[tuple[int, int]]
    predicted_before_s: float | None = None
    predicted_after_s: float | None = None
    candidates: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    alternatives: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return not np.array_equal(self.block_of, self.layout.identity())

    @property
    def feasible(self) -> bool:
        """A change is recommended: the placement differs and is not predicted slower."""
        if not self.changed:
            return False
        if self.predicted_before_s is None or self.predicted_after_s is None:
            return True
        return self.predicted_after_s < self.predicted_before_s

    @property
    def placement(self) -> np.ndarray:
        return rank_permutation(self.layout, self.block_of)

    def moves(self) -> list[dict[str, Any]]:
        """Workers that change position: the old and new ranks of their GPUs."""
        lay = self.layout
        out = []
        ident = lay.identity()
        for (p, d), b in np.ndenumerate(self.block_of):
            if b != ident[p, d]:
                out.append({"worker_ranks_before": lay.blocks[b].tolist(),
                            "worker_ranks_after": lay.blocks[ident[p, d]].tolist(),
                            "node": lay.node_names[lay.block_node[b]],
                            "stage_before": int(b) // lay.dp, "stage_after": int(p),
                            "dp_before": int(b) % lay.dp, "dp_after": int(d)})
        return out

    @property
    def reason(self) -> str:
        if self.feasible:
            return ""
        if not self.stragglers and not self.faults.links:
            return "no straggler or slow link to work around"
        if self.stages_needed >= self.layout.pp and not self.faults.links:
            return (f"{len(self.stragglers)} stragglers need every stage: no room for "
                    "consolidation")
        return "no placement is predicted to be faster"

    def to_dict(self) -> dict[str, Any]:
        lay = self.layout
        perm = self.placement
        before, after = self.predicted_before_s, self.predicted_after_s
        return {
            "strategy": "S3",
            "kind": self.strategy,
            "feasible": self.feasible,
            "reason": self.reason,
            "stragglers": [lay.blocks[b].tolist() for b in self.stragglers],
            "stages_needed": self.stages_needed,
            "target_stages": self.target_stages,
            "node_swaps": [[lay.node_names[a], lay.node_names[b]] for a, b in self.node_swaps],
            "placement": perm.tolist(),
            "node_of_rank": [lay.node_names[lay.node[s]] for s in perm.tolist()],
            "moves": self.moves(),
            "faults": self.faults.to_dict(lay),
            "predicted_before_s": before,
            "predicted_after_s": after,
            "predicted_speedup": before / after if before and after else None,
            "candidates": self.candidates,
            "notes": self.notes,
        }


def _role_swaps(layout: Layout, start: np.ndarray, links: dict[tuple[int, int], float],
                evaluate: Any | None, max_candidates: int = 24, to_pp: bool = False
                ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Greedy DP/PP role swaps: for each congested pair (worst first) that carries DP ring
    traffic, the node swap of one of its ends after which the pair carries no DP traffic,
    the least traffic, chosen by ``evaluate`` (predicted step time) when given.
    ``to_pp``: only swaps after which the pair carries PP traffic (Figure 11 exactly)."""
    place = start.copy()
    swaps: list[tuple[int, int]] = []
    n_nodes = len(layout.node_names)
    for (a, b), _f in sorted(links.items(), key=lambda kv: -kv[1]):
        if crossing(layout, place, a, b)["dp"] == 0:
            continue
        options: list[tuple[tuple[int, int, int], np.ndarray, tuple[int, int]]] = []
        for end in (b, a):
            for n in range(n_nodes):
                if n in (a, b):
                    continue
                cand = node_swap(layout, place, end, n)
                if cand is None:
                    continue
                c = crossing(layout, cand, a, b)
                if c["dp"] or (to_pp and not c["pp"]):
                    continue
                others = sum(crossing(layout, cand, x, y)["dp"]
                             for (x, y) in links if (x, y) != (a, b))
                options.append(((others, c["pp"], abs(n - end)), cand, (end, n)))
        if not options:
            continue
        options.sort(key=lambda o: o[0])
        options = options[:max_candidates]
        if evaluate is not None:
            times = evaluate([o[1] for o in options] + [place])
            best = int(np.argmin(times[:-1]))
            if times[best] >= times[-1]:
                continue
        else:
            best = 0
        place = options[best][1]
        swaps.append(options[best][2])
    return place, swaps


def plan_topology(layout: Layout, faults: PhysicalFaults, ops: OpTrace | None = None,
                  ratios: dict[str, float] | None = None, notes: Sequence[str] = ()
                  ) -> TopologyPlan:
    """S3 for the given physical faults (see the module docstring). With ``ops`` (the
    OpDuration tensors of the fail-slow's steps, traced under the current placement with
    these faults), every candidate is replayed and the fastest is chosen."""
    strag = faults.stragglers()
    need = stages_needed(len(strag), layout.dp)
    all_notes = list(notes)
    ratio_notes: list[str] = []
    if ops is not None and ratios is None:
        ratios, ratio_notes = inter_ratios(ops, layout, faults.links)
    ident = layout.identity()

    evaluate = None
    if ops is not None:
        trace = ops

        def evaluate(places: Sequence[np.ndarray]) -> np.ndarray:
            durs = [retime(trace, layout, faults, faults, p, ratios) for p in places]
            return simulate_many(trace, durs).mean(axis=1)

    cands: dict[str, tuple[np.ndarray, list[int], list[tuple[int, int]]]] = {
        "none": (ident, [], [])}
    if need >= layout.pp and strag:
        all_notes.append(f"{len(strag)} stragglers need {need} of {layout.pp} stages: no "
                         "room for consolidation")
    if strag and need < layout.pp:
        cons, targets = consolidate(layout, strag)
        cands["consolidate"] = (cons, targets, [])
        if evaluate is not None and math.comb(layout.pp, need) <= MAX_TARGET_SETS:
            # the paper's preference first; other stage sets compete on the prediction
            for other in itertools.combinations(range(layout.pp), need):
                if sorted(other) != sorted(targets):
                    alt, _ = consolidate(layout, strag, targets=list(other))
                    name = "consolidate@" + ",".join(map(str, other))
                    cands[name] = (alt, list(other), [])
    if faults.links:
        swapped, swaps = _role_swaps(layout, ident, faults.links, evaluate)
        cands["role-swap"] = (swapped, [], swaps)
        to_pp, swaps_pp = _role_swaps(layout, ident, faults.links, evaluate, to_pp=True)
        if not np.array_equal(to_pp, swapped):
            cands["role-swap-to-pp"] = (to_pp, [], swaps_pp)
        if "consolidate" in cands:
            base, targets, _ = cands["consolidate"]
            both, swaps2 = _role_swaps(layout, base, faults.links, evaluate)
            cands["consolidate+role-swap"] = (both, targets, swaps2)
    names = list(cands)
    predicted: dict[str, float] = {}
    if evaluate is not None:
        times = evaluate([cands[n][0] for n in names])
        predicted = {n: float(t) for n, t in zip(names, times, strict=True)}
        choice = min(names, key=lambda n: (predicted[n], names.index(n)))
        if predicted[choice] > predicted["none"] * (1.0 - MIN_GAIN):
            choice = "none"
    else:
        order = ["consolidate+role-swap", "consolidate", "role-swap"]
        choice = next((n for n in order if n in cands
                       and not np.array_equal(cands[n][0], ident)), "none")
    place, targets, swaps = cands[choice]
    if ratio_notes and structure_changes(layout, ident, place):
        all_notes += ratio_notes
    return TopologyPlan(layout=layout, faults=faults, block_of=place, strategy=choice,
                        stragglers=strag, stages_needed=need, target_stages=targets,
                        node_swaps=swaps,
                        predicted_before_s=predicted.get("none"),
                        predicted_after_s=predicted.get(choice),
                        candidates=predicted, notes=all_notes,
                        alternatives={n: c[0] for n, c in cands.items()})


def plan_for_anomalies(ops: OpTrace, meta: JobMeta, anomalies: Sequence[Anomaly],
                       step_starts: np.ndarray | None) -> TopologyPlan:
    """S3 for a group of concurrent slow anomalies: faults estimated over their steps
    (compute and mixed anomalies' ranks are stragglers, their ``link`` ranks' nodes the
    congested pair), candidates replayed over those steps."""
    layout = Layout.from_meta(meta)
    notes: list[str] = []
    mask = steps_in_window(ops, step_starts, anomalies)
    if not mask.any():
        mask[:] = True
        notes.append("step times unknown: all steps used")
    strag: list[int] = []
    links: list[tuple[int, int]] = []
    for a in anomalies:
        if a.cause in ("compute", "mixed"):
            strag += list(a.ranks)
        if a.cause in ("communication", "mixed") and a.link and len(a.link) == 2:
            links.append((int(layout.node[a.link[0]]), int(layout.node[a.link[1]])))
    faults, more = estimate_faults(ops, layout, mask, strag, links)
    notes += more
    sub = subset_steps(ops, mask)
    plan = plan_topology(layout, faults, sub, notes=notes)
    return plan
