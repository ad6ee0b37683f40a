"""Communicators of a job from the event contract alone (events.md: ``meta.comms`` may be
empty; consumers then infer membership from ``coll`` rows and the kind from membership and
the parallel degrees, Megatron's rank layout first)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from failslow.events import Comm, JobMeta

_DIMS = ("tp", "cp", "dp", "pp")


def infer_comm_kind(ranks: Sequence[int], meta: JobMeta, p2p_only: bool = False,
                    prefer: Sequence[str] | None = None) -> str:
    """The kind of a communicator from its members and the job's parallel degrees.

    Ranks are laid out with one dimension varying fastest; we try Megatron's default
    order (tp, cp, dp, pp) first (or ``prefer``, the job's order: :func:`rank_order`), then
    the other orders, and take the first under which the members differ in exactly one
    dimension and cover it. A communicator of the whole world
    is that dimension's when only one dimension is parallel (pure data parallelism: the
    gradient sync), else ``world``; point-to-point-only communicators that fit no layout are
    ``pp``.
    """
    n = len(ranks)
    degrees = {"tp": meta.tp, "cp": meta.cp, "dp": meta.dp, "pp": meta.pp}
    if n == meta.world_size and n > 1:
        only = [d for d, k in degrees.items() if k > 1]
        return only[0] if len(only) == 1 and (only[0] != "pp" or p2p_only) else "world"
    arr = np.asarray(ranks, dtype=np.int64)
    orders = _orders(prefer)
    if p2p_only and n == 2 and meta.pp > 1 and any(
            _varying(arr, order, degrees) == ["pp"] for order in orders):
        # a point-to-point pair that some rank order makes pipeline neighbours is one:
        # data and tensor parallelism do not use send / recv pairs
        return "pp"
    for order in orders:
        stride = 1
        coords = {}
        for dim in order:
            coords[dim] = (arr // stride) % max(1, degrees[dim])
            stride *= max(1, degrees[dim])
        varying = [d for d in order if len(np.unique(coords[d])) > 1]
        if len(varying) == 1 and degrees[varying[0]] == n:
            return varying[0]
        if len(varying) == 1 and p2p_only and n == 2:
            return varying[0]
    return "pp" if p2p_only else "other"


def _varying(arr: np.ndarray, order: Sequence[str], degrees: dict[str, int]) -> list[str]:
    """The dimensions in which ranks ``arr`` differ under rank ``order``."""
    stride, out = 1, []
    for dim in order:
        coord = (arr // stride) % max(1, degrees[dim])
        if len(np.unique(coord)) > 1:
            out.append(dim)
        stride *= max(1, degrees[dim])
    return out


def _orders(prefer: Sequence[str] | None = None) -> list[tuple[str, ...]]:
    rest = [o for o in itertools.permutations(_DIMS) if o != _DIMS]
    first = [tuple(prefer)] if prefer is not None else []
    return [*first, *[o for o in [_DIMS, *rest] if o not in first]]


def rank_order(groups: Sequence[tuple[Sequence[int], bool]], meta: JobMeta,
               calls: Sequence[float] | None = None) -> tuple[str, ...]:
    """The rank order of a job (dimension varying fastest first) that explains most of its
    communicators ``groups`` (members, point-to-point only?): a group fits an order when its
    members differ in one dimension and cover it, and fits it fully when its use agrees
    (send / recv only for ``pp``, collectives otherwise). One order holds for the whole job,
    so degrees that are alike (dp == pp) are told apart by the other groups.

    Tensor- and data-parallel groups of one size use alike (collectives both), so tp == dp
    leaves orders that swap them tied. ``calls`` (collective calls per member of each
    group) then decides: tensor parallelism runs its collectives in every layer of every
    microbatch, data parallelism once per gradient bucket and step (Megatron-LM), so the
    order whose TP groups call more is the job's. Remaining ties go to Megatron's order."""
    degrees = {"tp": meta.tp, "cp": meta.cp, "dp": meta.dp, "pp": meta.pp}
    best: tuple[str, ...] = _DIMS
    best_score = (-1.0, 0)
    if not groups:
        return best
    # every group's members in one array (one pass of numpy per order and dimension)
    sizes = np.array([len(r) for r, _ in groups], dtype=np.int64)
    keep = sizes > 0
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r, _ in groups if len(r)]
                          or [np.zeros(0, dtype=np.int64)])
    starts = np.concatenate([[0], np.cumsum(sizes[keep])[:-1]]).astype(np.int64)
    p2p = np.array([bool(p) for _, p in groups], dtype=bool)[keep]
    n = sizes[keep]
    use_calls = np.asarray(calls, dtype=np.float64)[keep] if calls is not None else None
    for order in _orders():
        stride = 1
        nvary = np.zeros(len(n), dtype=np.int64)
        dim_of = np.full(len(n), -1, dtype=np.int64)
        for j, dim in enumerate(order):
            coord = (flat // stride) % max(1, degrees[dim])
            vary = (np.maximum.reduceat(coord, starts) != np.minimum.reduceat(coord, starts)
                    if len(flat) else np.zeros(0, dtype=bool))
            nvary += vary
            dim_of = np.where(vary, j, dim_of)
            stride *= max(1, degrees[dim])
        deg = np.array([degrees[d] for d in order], dtype=np.int64)
        fits = (nvary == 1) & (deg[np.maximum(dim_of, 0)] == n)
        is_pp = np.array([d == "pp" for d in order])[np.maximum(dim_of, 0)]
        score = float(np.where(is_pp[fits] == p2p[fits], 1.0, 0.5).sum())
        busier = 0
        if use_calls is not None:
            med = {}
            for name in ("tp", "dp"):
                sel = fits & ~p2p & (dim_of == order.index(name))
                med[name] = float(np.median(use_calls[sel])) if sel.any() else None
            if med["tp"] is not None and med["dp"] is not None:
                busier = int(np.sign(med["tp"] - med["dp"]))
        if (score, busier) > best_score:
            best, best_score = order, (score, busier)
    return best


def infer_comms(coll: pa.Table, meta: JobMeta) -> tuple[Comm, ...]:
    """Communicators from ``coll`` rows (events.md: ``comms`` may be empty): members from
    (comm, comm_rank, rank), kinds from membership and degrees (and, where tp == dp, from
    how often each group calls collectives: :func:`rank_order`). A ``rows`` column, when
    there is one, gives how many rows each row stands for (a deduplicated table)."""
    if coll.num_rows == 0:
        return ()
    rows = (coll.column("rows") if "rows" in coll.column_names
            else pa.array(np.ones(coll.num_rows, dtype=np.int64)))
    t = pa.table({"comm": coll.column("comm"), "cr": coll.column("comm_rank"),
                  "rank": coll.column("rank"), "op": coll.column("op"), "rows": rows})
    members = t.group_by(["comm", "cr", "rank"]).aggregate([]).sort_by(
        [("comm", "ascending"), ("cr", "ascending")])
    ops = t.group_by(["comm", "op"]).aggregate([("rows", "sum")])
    p2p_comms: dict[int, bool] = {}
    coll_rows: dict[int, float] = {}
    for c, op, n in zip(ops.column("comm").to_pylist(), ops.column("op").to_pylist(),
                        ops.column("rows_sum").to_pylist(), strict=True):
        p2p = op in ("send", "recv")
        p2p_comms[c] = p2p_comms.get(c, True) and p2p
        coll_rows[c] = coll_rows.get(c, 0.0) + (0.0 if p2p else float(n))
    comm_col = members.column("comm").to_numpy()
    rank_col = members.column("rank").to_numpy()
    uniq, starts = np.unique(comm_col, return_index=True)
    bounds = [*starts.tolist(), len(comm_col)]
    groups = [(int(c), tuple(int(r) for r in rank_col[bounds[i]:bounds[i + 1]]))
              for i, c in enumerate(uniq.tolist())]
    order = rank_order([(ranks, p2p_comms.get(c, False)) for c, ranks in groups], meta,
                       [coll_rows.get(c, 0.0) / max(len(ranks), 1) for c, ranks in groups])
    return tuple(Comm(c, infer_comm_kind(ranks, meta, p2p_comms.get(c, False), order), ranks)
                 for c, ranks in groups)
