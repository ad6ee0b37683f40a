"""The held-out job: its faults (:class:`Fault`), its shape and noise (:class:`Spec`),
and where its ranks, nodes and communicators are (:class:`Layout`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

MS = 1_000_000
US = 1_000
T0 = 1_760_000_000_000_000_000
DIMS = ("tp", "dp", "pp")


@dataclass
class Fault:
    """One injected fault. ``cause``: ``compute`` | ``communication`` | ``not_entered`` |
    ``inconsistent`` | ``hardware``. Slow faults last iterations ``[start, end)``; hangs hit
    the ``index``-th operation of kind ``comm`` (``tp``/``pp``/``dp``) of ``rank`` in
    iteration ``start`` (for ``tp``/``pp``: in micro-batch ``microbatch``)."""

    cause: str
    rank: int
    peer: int | None = None  # communication: the other end of the slow link
    start: int = 12
    end: int | None = None
    factor: float = 2.0
    comm: str = "tp"
    microbatch: int = 1
    index: int = 0
    mismatch: str = "bytes"  # inconsistent: "bytes" or "op"
    phase: str | None = None  # compute: only this pass is slowed, "f" or "b" (None: all)


@dataclass
class Spec:
    """A whole held-out job. Times in ms unless named otherwise."""

    tp: int = 2
    pp: int = 2
    dp: int = 4
    microbatches: int = 4
    iterations: int = 36
    order: tuple[str, ...] = ("tp", "dp", "pp")  # fastest-varying dimension first
    gpus_per_node: int = 8
    forward_ms: float = 3.0
    backward_ratio: float = 2.0
    optimizer_ms: float = 2.0
    last_stage: float = 1.1
    tp_per_pass: int = 2
    tp_bytes: int = 8 << 20
    pp_bytes: int = 8 << 20
    dp_bytes: int = 256 << 20
    dp_mode: str = "allreduce"  # or "rs_ag" (distributed optimizer)
    pp_comm: str = "pipeline"  # one PP group per pipeline, or "pair"
    small_allreduce: bool = False  # a 4-byte loss all-reduce per iteration
    intra_gbps: float = 150.0
    inter_gbps: float = 20.0
    intra_lat_us: float = 4.0
    inter_lat_us: float = 12.0
    jitter: str = "lognormal"  # lognormal | pareto | bimodal | uniform
    jitter_scale: float = 0.03
    comm_jitter: str = "pareto"
    seqlen_sigma: float = 0.03
    burst_prob: float = 0.0  # per node and iteration: node 10-25% slower
    gc_prob: float = 0.0  # per rank and iteration: 20-90 ms pause
    # host pauses (checkpoint writes, long GC): (iteration, seconds, ranks; empty: all ranks)
    # at the start of that iteration, before its first operation
    pauses: list[tuple[int, float, tuple[int, ...]]] = field(default_factory=list)
    skew_ms: float = 1.5  # per-node clock offset in +-this
    drift_ppm: float = 20.0  # per-node clock drift in +-this
    clock_step_ms: float = 0.0  # node 1's clock jumps by this (NTP step)
    clock_step_s: float = 1.0  # ... this long after the job start
    missing_t_start: float = 0.0  # chance an end row has no t_start
    comms_in_meta: bool = False
    meta_degrees: bool = True  # microbatches/schedule known in meta
    fmt: str = "jsonl"
    shuffle: bool = True
    progress_ms: float = 50.0  # 0: no progress rows
    link_rows: bool = False
    link_ms: float = 20.0
    tail_s: float = 15.0  # how long a hung job keeps being traced
    post_mortem: bool = False  # import.json says post-mortem
    seed: int = 0
    job: str = "heldout"
    faults: list[Fault] = field(default_factory=list)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


class Layout:
    """Ranks, nodes and communicators under ``spec.order`` (fastest dimension first)."""

    def __init__(self, spec: Spec, rng: random.Random) -> None:
        self.spec = spec
        deg = {"tp": spec.tp, "dp": spec.dp, "pp": spec.pp}
        self.coord: list[dict[str, int]] = []
        for r in range(spec.world):
            c, x = {}, r
            for d in spec.order:
                c[d] = x % deg[d]
                x //= deg[d]
            self.coord.append(c)
        self.rank_of = {(c["tp"], c["dp"], c["pp"]): r for r, c in enumerate(self.coord)}
        n_nodes = (spec.world + spec.gpus_per_node - 1) // spec.gpus_per_node
        names = [f"h{rng.randrange(10**6):06d}-{i}" for i in range(n_nodes)]
        self.node = [r // spec.gpus_per_node for r in range(spec.world)]
        self.node_names = names
        # communicators: list of (id, kind, ranks in comm-rank order)
        self.comms: list[tuple[int, str, list[int]]] = []
        self.comm_of: dict[tuple[str, int], int] = {}  # (kind, rank) -> comm index
        groups: dict[str, dict[tuple[int, ...], list[int]]] = {"tp": {}, "dp": {}, "pp": {}}
        for r, c in enumerate(self.coord):
            groups["tp"].setdefault((c["dp"], c["pp"]), []).append(r)
            groups["dp"].setdefault((c["tp"], c["pp"]), []).append(r)
            groups["pp"].setdefault((c["tp"], c["dp"]), []).append(r)
        for kind, by in groups.items():
            for members in by.values():
                members.sort(key=lambda r, k=kind: self.coord[r][k])  # type: ignore[misc]
                if len(members) < 2:
                    continue
                if kind == "pp" and spec.pp_comm == "pair":
                    for a, b in zip(members, members[1:], strict=False):
                        self._add(rng, "pp", [a, b], pair=True)
                else:
                    self._add(rng, kind, members)
        self.pair_comm: dict[tuple[int, int], int] = {}
        for i, (_, kind, members) in enumerate(self.comms):
            if kind == "pp" and spec.pp_comm == "pair":
                self.pair_comm[(members[0], members[1])] = i

    def _add(self, rng: random.Random, kind: str, members: list[int], pair: bool = False) -> None:
        cid = rng.getrandbits(64) or 1
        self.comms.append((cid, kind, list(members)))
        if not pair:
            for r in members:
                self.comm_of[(kind, r)] = len(self.comms) - 1

    def pp_neighbour(self, r: int, step: int) -> int:
        c = self.coord[r]
        return self.rank_of[(c["tp"], c["dp"], c["pp"] + step)]

    def p2p(self, r: int, peer: int) -> tuple[int, int]:
        """(comm index, peer's comm rank) of a PP message between ``r`` and ``peer``."""
        if self.spec.pp_comm == "pair":
            a, b = sorted((r, peer), key=lambda x: self.coord[x]["pp"])
            ci = self.pair_comm[(a, b)]
        else:
            ci = self.comm_of[("pp", r)]
        return ci, self.comms[ci][2].index(peer)

    def bw_lat(self, a: int, b: int) -> tuple[float, float]:
        """Bytes per ns and latency in ns of the hop a -> b."""
        s = self.spec
        if self.node[a] == self.node[b]:
            return s.intra_gbps, s.intra_lat_us * US
        return s.inter_gbps, s.inter_lat_us * US
