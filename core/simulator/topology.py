"""Rank layout, nodes and communicators of a hybrid-parallel job.

Megatron's rank order (what-if §2.1, Figure 1): ``rank = tp + TP*(cp + CP*(dp + DP*pp))``, so
the ranks of one pipeline stage are contiguous and every per-rank array of the simulator is
shaped ``(pp, dp, cp, tp)`` and flattens to rank order. Nodes hold ``gpus_per_node``
consecutive ranks. Communicators (MEGATRACE §II-A): one TP group per (pp, dp, cp), one CP
group per (pp, dp, tp), one DP group per (pp, cp, tp) and one PP group per (dp, cp, tp);
groups of one rank are not created (Megatron skips their collectives).

Ring collectives send from each member to the next in communicator-rank order (cyclic); a
point-to-point message goes from the sending stage's rank to the adjacent stage's rank.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from failslow.events import Comm

K_TP, K_CP, K_DP, K_PP = 0, 1, 2, 3
KIND_NAMES = ("tp", "cp", "dp", "pp")
#: The axis of the (pp, dp, cp, tp) array a communicator kind runs along.
KIND_AXIS = {K_TP: 3, K_CP: 2, K_DP: 1, K_PP: 0}


def comm_id(job: str, kind: str, index: int) -> int:
    """A stable uint64 communicator id over the full range (like a hash of ncclUniqueId)."""
    digest = hashlib.blake2b(f"{job}/{kind}/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass
class Topology:
    """Ranks, nodes and communicators of one job."""

    job: str
    tp: int
    pp: int
    dp: int
    cp: int
    gpus_per_node: int
    nics_per_node: int

    def __post_init__(self) -> None:
        self.shape = (self.pp, self.dp, self.cp, self.tp)
        self.stage_size = self.dp * self.cp * self.tp
        self.world = self.pp * self.stage_size
        self.ranks = np.arange(self.world, dtype=np.int64).reshape(self.shape)
        self.node = (self.ranks // self.gpus_per_node).astype(np.int64)
        self.n_nodes = int(self.node.max()) + 1
        width = max(3, len(str(self.n_nodes - 1)))
        self.node_names = [f"node{i:0{width}d}" for i in range(self.n_nodes)]
        local = (np.arange(self.world) % self.gpus_per_node) % self.nics_per_node
        self.device_names = [f"mlx5_{i}" for i in range(self.nics_per_node)]
        self.device_of_rank = local.astype(np.int64)
        self.sizes = {K_TP: self.tp, K_CP: self.cp, K_DP: self.dp, K_PP: self.pp}
        # comm ids / comm ranks per kind, as (pp, dp, cp, tp) arrays (0 when the kind is absent)
        self.comm = np.zeros((4, self.world), dtype=np.uint64)
        self.comm_rank = np.zeros((4, self.world), dtype=np.int32)
        self.comms: list[Comm] = []
        coords = np.indices(self.shape).reshape(4, -1)
        for kind in (K_TP, K_CP, K_DP, K_PP):
            axis = KIND_AXIS[kind]
            self.comm_rank[kind] = coords[axis]
            if self.sizes[kind] == 1:
                continue
            groups = np.moveaxis(self.ranks, axis, -1).reshape(-1, self.shape[axis])
            name = KIND_NAMES[kind]
            ids = np.array([comm_id(self.job, name, g) for g in range(groups.shape[0])],
                           dtype=np.uint64)
            self.comm[kind, groups.ravel()] = np.repeat(ids, groups.shape[1])
            self.comms.extend(Comm(int(ids[g]), name, tuple(int(r) for r in groups[g]))
                              for g in range(groups.shape[0]))
        # ring successor of every rank per kind, and whether that ring edge leaves the node
        self.succ = np.zeros((4, self.world), dtype=np.int64)
        for kind in (K_TP, K_CP, K_DP, K_PP):
            axis = KIND_AXIS[kind]
            self.succ[kind] = np.roll(self.ranks, -1, axis=axis).ravel()
        self.succ_node = self.succ // self.gpus_per_node
        rank_node = np.arange(self.world) // self.gpus_per_node
        self.succ_crosses = self.succ_node != rank_node[None, :]
        # whether each ring stays inside one node (then it runs at NVLink bandwidth)
        self.intra = {}
        for kind in (K_TP, K_CP, K_DP):
            axis = KIND_AXIS[kind]
            nmin = self.node.min(axis=axis, keepdims=True)
            nmax = self.node.max(axis=axis, keepdims=True)
            self.intra[kind] = nmin == nmax
        # p2p between stage s and s+1, element-wise: (pp-1, dp, cp, tp)
        self.pp_intra = self.node[:-1] == self.node[1:]

    # -----------------------------------------------------------------------------------------

    def nodes_map(self) -> dict[int, str]:
        return {r: self.node_names[r // self.gpus_per_node] for r in range(self.world)}

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(pp, dp, cp, tp) of a global rank."""
        s, rest = divmod(rank, self.stage_size)
        d, rest = divmod(rest, self.cp * self.tp)
        c, t = divmod(rest, self.tp)
        return s, d, c, t

    def crossing(self, a: int, b: int) -> dict[int, np.ndarray]:
        """Which rounds' traffic crosses the node pair {a, b} (a slow or broken link).

        A ring collective crosses it when one of its ring edges (member i -> member i+1 in
        communicator-rank order, cyclic) joins the two nodes: the round is as slow as its
        slowest edge. A PP message crosses it when its two ranks sit on the two nodes. Returns
        per kind a boolean array over rounds: TP (pp, dp, cp, 1), CP (pp, dp, 1, tp),
        DP (pp, 1, cp, tp), and PP (pp-1, dp, cp, tp) for the messages between s and s+1.
        """
        out: dict[int, np.ndarray] = {}
        for kind in (K_TP, K_CP, K_DP):
            if self.sizes[kind] == 1:
                out[kind] = np.zeros([1 if i == KIND_AXIS[kind] else n
                                      for i, n in enumerate(self.shape)], dtype=bool)
                continue
            edge = self.edge_crosses(kind, a, b)
            out[kind] = np.asarray(edge.any(axis=KIND_AXIS[kind], keepdims=True))
        na, nb = self.node[:-1], self.node[1:]
        out[K_PP] = ((na == a) & (nb == b)) | ((na == b) & (nb == a))
        return out

    def edge_crosses(self, kind: int, a: int, b: int) -> np.ndarray:
        """Per rank (pp, dp, cp, tp): does its ring edge to the successor join nodes a, b."""
        n = self.node.ravel()
        sn = self.succ_node[kind]
        hit = ((n == a) & (sn == b)) | ((n == b) & (sn == a))
        if self.sizes[kind] == 1:
            hit[:] = False
        return hit.reshape(self.shape)
