"""S3's two moves (Greyhound §5.2), as worker placements ``block_of[p, d]`` (the physical
worker at pipeline stage p, DP rank d) and their rank permutations.

* **Straggler consolidation.** Slow workers are gathered into the minimal number of pipeline
  stages, ``ceil(#stragglers / workers per stage)`` (Greyhound's ceil(#stragglers / #GPUs per
  stage) with TP collapsed; equal when TP = CP = 1), preferring interior stages (the first
  and the last carry the embedding and the loss), then stages that already hold the most
  stragglers (fewest moves). A straggler swaps with a healthy worker of a target stage, on
  its own node when possible (a same-node swap keeps every communicator's node structure).
* **DP/PP role swap (Figure 11).** Two nodes exchange roles: every worker of one node trades
  positions with the worker of the same rank of the other; :func:`crossing` counts the DP
  and PP traffic a node pair carries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from failslow.mitigation.topology_layout import Layout


def rank_permutation(layout: Layout, block_of: np.ndarray) -> np.ndarray:
    """``perm[new_rank] = old_slot`` for the worker placement ``block_of`` (P, D): member t
    of the worker at (p, d) runs the global rank that member t of position (p, d) has."""
    perm = np.empty(layout.world, dtype=np.int64)
    perm[layout.blocks.reshape(-1)] = layout.blocks[block_of.reshape(-1)].reshape(-1)
    return perm


def is_permutation(perm: Sequence[int] | np.ndarray) -> bool:
    p = np.asarray(perm)
    return bool(p.ndim == 1 and np.array_equal(np.sort(p), np.arange(p.size)))


def stages_needed(n_stragglers: int, workers_per_stage: int) -> int:
    """Greyhound §5.2: ceil(#stragglers / #GPUs per stage) (TP collapsed into workers)."""
    return math.ceil(n_stragglers / workers_per_stage) if n_stragglers else 0


def stage_preference(pp: int, straggler_stages: Iterable[int] = ()) -> list[int]:
    """Stages in order of preference for consolidation: interior stages first (the first
    and last stages carry the embedding and the loss, §5.2), among them those that already
    hold the most stragglers, then the middle ones; then the first stage, the last one
    last (it is the heaviest)."""
    held: dict[int, int] = {}
    for s in straggler_stages:
        held[s] = held.get(s, 0) + 1
    mid = (pp - 1) / 2
    interior = sorted(range(1, pp - 1), key=lambda s: (-held.get(s, 0), abs(s - mid), s))
    edges = [s for s in (0, pp - 1) if s not in interior]
    edges = sorted(set(edges), key=lambda s: (s == pp - 1 and pp > 1, -held.get(s, 0)))
    return interior + edges


def consolidate(layout: Layout, stragglers: Sequence[int],
                block_of: np.ndarray | None = None, targets: Sequence[int] | None = None
                ) -> tuple[np.ndarray, list[int]]:
    """Straggler consolidation (see the module docstring): the new placement and the chosen
    target stages (``targets``: force these instead of :func:`stage_preference`'s).
    ``stragglers``: physical workers, the slowest first. When they would need every stage
    there is no room and the placement is returned unchanged."""
    P, D = layout.pp, layout.dp
    place = (layout.identity() if block_of is None else block_of).copy()
    strag = [int(b) for b in stragglers]
    need = stages_needed(len(strag), D)
    if need == 0 or need >= P:
        return place, []
    where = {int(b): divmod(int(i), D) for i, b in enumerate(place.reshape(-1))}
    if targets is None:
        targets = stage_preference(P, (where[b][0] for b in strag))[:need]
    targets = list(targets)
    if len(targets) != need:
        raise ValueError(f"{len(strag)} stragglers need {need} target stages")
    bnode = layout.block_node
    is_strag = set(strag)
    movers = [b for b in strag if where[b][0] not in targets]
    for b in movers:
        p0, d0 = where[b]
        free = [(t, d) for t in targets for d in range(D) if int(place[t, d]) not in is_strag]
        # keep the node structure (same node), then the same pipeline, then the first stage
        t, d = min(free, key=lambda td: (bnode[place[td]] != bnode[b], td[1] != d0,
                                         targets.index(td[0]), td[1]))
        other = int(place[t, d])
        place[t, d], place[p0, d0] = b, other
        where[b], where[other] = (t, d), (p0, d0)
    return place, targets


def node_swap(layout: Layout, block_of: np.ndarray, a: int, b: int) -> np.ndarray | None:
    """Exchange the roles of nodes a and b: the k-th worker on a trades positions with the
    k-th worker on b (None when they hold different numbers of workers)."""
    bnode = layout.block_node
    flat = block_of.reshape(-1)
    on_a = np.flatnonzero(bnode[flat] == a)
    on_b = np.flatnonzero(bnode[flat] == b)
    if on_a.size != on_b.size or on_a.size == 0:
        return None
    out = flat.copy()
    out[on_a], out[on_b] = flat[on_b], flat[on_a]
    return out.reshape(block_of.shape)


def crossing(layout: Layout, block_of: np.ndarray, a: int, b: int) -> dict[str, int]:
    """How much of each traffic kind crosses the node pair {a, b} in a placement: DP ring
    edges and PP messages (pipeline pairs) joining the two nodes."""
    pos = layout.block_node[block_of]
    out = {"dp": 0, "pp": 0}
    if layout.dp > 1:
        nxt = np.roll(pos, -1, axis=1)
        out["dp"] = int((((pos == a) & (nxt == b)) | ((pos == b) & (nxt == a))).sum())
        if layout.dp == 2:
            out["dp"] //= 2
    if layout.pp > 1:
        lo, hi = pos[:-1], pos[1:]
        out["pp"] = int((((lo == a) & (hi == b)) | ((lo == b) & (hi == a))).sum())
    return out
