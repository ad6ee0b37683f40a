"""The job as S3 (Greyhound §5.2, "Adjust parallelism topology") sees it: workers (TP x CP
groups of GPUs, moved as a whole), the nodes they sit on, and the fail-slows attached to that
hardware (slow workers, congested node pairs), independent of the placement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.events import JobMeta
from failslow.whatif.ops import WhatIfInputError

#: Straggler factors below this are noise (workers are not moved for them).
MIN_FACTOR = 1.03


@dataclass(frozen=True)
class Layout:
    """Workers and nodes of a job. ``blocks[b]``: the global ranks of worker ``b = p * dp +
    d`` (stage p, DP rank d) in the current placement, its TP/CP members in order;
    ``node[r]``: node index of global rank r."""

    pp: int
    dp: int
    blocks: np.ndarray
    node: np.ndarray
    node_names: tuple[str, ...]

    @classmethod
    def regular(cls, tp: int, pp: int, dp: int, cp: int = 1, gpus_per_node: int = 8) -> Layout:
        """Megatron's rank order ``rank = tp + TP*(cp + CP*(dp + DP*pp))``, consecutive ranks
        on a node."""
        w = tp * cp
        world = w * dp * pp
        blocks = np.arange(world, dtype=np.int64).reshape(pp * dp, w)
        node = np.arange(world, dtype=np.int64) // gpus_per_node
        n = int(node.max()) + 1
        width = max(3, len(str(n - 1)))
        return cls(pp, dp, blocks, node, tuple(f"node{i:0{width}d}" for i in range(n)))

    @classmethod
    def from_meta(cls, meta: JobMeta) -> Layout:
        """Workers from the communicators (what-if's worker table), nodes from ``meta.nodes``."""
        from failslow.whatif.ops import worker_table

        _, members = worker_table(meta)
        sizes = {len(members[p][d]) for p in range(meta.pp) for d in range(meta.dp)}
        if len(sizes) != 1:
            raise WhatIfInputError("workers have different numbers of ranks")
        blocks = np.array([members[p][d] for p in range(meta.pp) for d in range(meta.dp)],
                          dtype=np.int64)
        names: list[str] = []
        index: dict[str, int] = {}
        node = np.zeros(meta.world_size, dtype=np.int64)
        for r in range(meta.world_size):
            name = meta.node_of(r)
            if name not in index:
                index[name] = len(names)
                names.append(name)
            node[r] = index[name]
        return cls(meta.pp, meta.dp, blocks, node, tuple(names))

    @property
    def world(self) -> int:
        return int(self.blocks.size)

    @property
    def block_node(self) -> np.ndarray:
        """Node of every worker (of its first rank)."""
        return np.asarray(self.node[self.blocks[:, 0]])

    def identity(self) -> np.ndarray:
        return np.arange(self.pp * self.dp, dtype=np.int64).reshape(self.pp, self.dp)

    def block_of_rank(self, rank: int) -> int:
        hit = np.flatnonzero((self.blocks == rank).any(axis=1))
        if hit.size == 0:
            raise ValueError(f"rank {rank} is not in the job")
        return int(hit[0])


@dataclass
class PhysicalFaults:
    """Fail-slows attached to hardware, independent of the placement: ``compute[b]`` is the
    compute-duration factor of physical worker b; ``links[(a, b)]`` (a < b, node indices)
    the transfer-time factor of every ring round or pipeline message crossing nodes a, b."""

    compute: dict[int, float] = field(default_factory=dict)
    links: dict[tuple[int, int], float] = field(default_factory=dict)

    def stragglers(self) -> list[int]:
        """Slow workers, the slowest first."""
        return sorted((b for b, f in self.compute.items() if f >= MIN_FACTOR),
                      key=lambda b: (-self.compute[b], b))

    def to_dict(self, layout: Layout) -> dict[str, Any]:
        return {"compute": [{"ranks": layout.blocks[b].tolist(), "factor": round(f, 4)}
                            for b, f in sorted(self.compute.items())],
                "links": [{"nodes": [layout.node_names[a], layout.node_names[b]],
                           "factor": round(f, 4)} for (a, b), f in sorted(self.links.items())]}


def _pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a <= b else (b, a)
