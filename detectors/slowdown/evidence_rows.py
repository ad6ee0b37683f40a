"""The evidence reducers' output as rows (issue 13 item 3; docs/scaling.md, "Built: evidence
reducers in their own processes"): what an :class:`~.reducer.EvidenceReducer` returns for
one batch (:class:`~.reducer.Evidence`), as one Arrow table a reducing stage exports over
Kafka and the job's slow-down detector sums (:meth:`.accounting.BinnedStats.absorb`).

One row per bin row of a reduced table (column ``part``: its index in :data:`PARTS`), one
``ccld`` row per completed round of a class still learning CCL-D's baseline (§4.2.1), and
one ``ccldw`` row per CCL-D detection window and class for the rounds past it (``bin``: the
window, not shifted; :meth:`~.ccld.CCLDMonitor.add_windows`). Communicators
travel by their id (``comm``), not by the reducer's dense index: each side maps them with
its own :class:`~.comms.CommRegistry`. Columns keep the reducer's dtypes, so the job's bin
tables are those of one process, bit for bit. ``shift`` is the bin width the rows were
summed at (the job coarsens them to its own, never finer: :mod:`.stage`). ``shard`` and
``seq`` (the row's place in its reducer's output of that batch) let the importer take each
row once
(:class:`failslow.engine.imports.EvidenceImport`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from failslow.detectors.slowdown.comms import CommRegistry
from failslow.detectors.slowdown.reducer import REDUCED_TABLES, Evidence

#: What a row is: a bin row of one of the reduced tables, or a round for CCL-D.
PARTS: tuple[str, ...] = (*REDUCED_TABLES, "ccld", "ccldw")
CCLD = PARTS.index("ccld")
CCLD_WINDOWS = PARTS.index("ccldw")

#: Columns of each part besides ``bin`` (``comm`` stands for the reducer's ``cidx``;
#: a ``ccld`` row's ``cls`` is the raw class key and ``t`` the round's end).
PART_COLUMNS: dict[str, tuple[str, ...]] = {
    "grp": ("comm", "group", "cls", "n", "xfer", "dmax", "dmin", "range", "rdmax", "rdmin"),
    "out_w": ("rank", "comm", "w"),
    "in_w": ("comm", "waitee", "w", "n"),
    "comp": ("rank", "d"),
    "passes": ("rank", "pass", "d"),
    "ccld": ("comm", "group", "cls", "t", "dmax", "dmin"),
    "ccldw": ("comm", "group", "cls", "n", "dmax", "dmin"),
}
_FLOAT = frozenset({"n", "xfer", "range", "d"})

#: The exported table (``failslow.derived.evidence``, with the exporter's ``t_emit``).
SCHEMA = pa.schema([
    pa.field("job", pa.string(), nullable=False),
    pa.field("shard", pa.int32(), nullable=False),
    pa.field("seq", pa.int64(), nullable=False),
    pa.field("part", pa.int8(), nullable=False),
    pa.field("shift", pa.int8(), nullable=False),
    pa.field("bin", pa.int64(), nullable=False),
    pa.field("comm", pa.uint64(), nullable=False),
    *(pa.field(name, pa.float64() if name in _FLOAT else pa.int64(), nullable=False)
      for name in ("rank", "group", "cls", "waitee", "pass", "t", "w", "dmax", "dmin",
                   "rdmax", "rdmin", "n", "xfer", "range", "d")),
])


def evidence_table(job: str, ev: Evidence, registry: CommRegistry, shard: int) -> pa.Table:
    """``ev`` (one reducer's evidence of one batch, bins at ``ev.shift``) as rows of
    :data:`SCHEMA`, in the order the reducer produced them."""
    ids = np.asarray(registry.ids, dtype=np.uint64)
    chunks: list[tuple[int, dict[str, np.ndarray]]] = []
    for part, name in enumerate(REDUCED_TABLES):
        for cols in ev.tables[name]:
            row = {k: v for k, v in cols.items() if k != "cidx"}
            if "cidx" in cols:
                row["comm"] = ids[cols["cidx"]]
            chunks.append((part, row))
    rounds = ev.ccld_rows()
    if len(rounds["t"]):
        chunks.append((CCLD, {**{k: v for k, v in rounds.items() if k != "cidx"},
                              "bin": np.zeros(len(rounds["t"]), dtype=np.int64),
                              "comm": ids[rounds["cidx"]]}))
    for cols in ev.ccld_windows:
        chunks.append((CCLD_WINDOWS, {**{k: v for k, v in cols.items() if k != "cidx"},
                                      "comm": ids[cols["cidx"]]}))
    sizes = [len(c["bin"]) for _, c in chunks]
    n = int(sum(sizes))
    columns: dict[str, np.ndarray] = {
        "shard": np.full(n, shard, dtype=np.int32), "seq": np.arange(n, dtype=np.int64),
        "shift": np.full(n, ev.shift, dtype=np.int8),
        "part": np.repeat(np.array([p for p, _ in chunks], dtype=np.int8), sizes)}
    for field in SCHEMA:
        if field.name in columns or field.name == "job":
            continue
        dtype = field.type.to_pandas_dtype()
        out = np.zeros(n, dtype=dtype)
        at = 0
        for (_, c), size in zip(chunks, sizes, strict=True):
            if field.name in c:
                out[at:at + size] = c[field.name]
            at += size
        columns[field.name] = out
    arrays = [pa.repeat(pa.scalar(job, pa.string()), n) if f.name == "job"
              else pa.array(columns[f.name], f.type) for f in SCHEMA]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def evidence_of(table: pa.Table, registry: CommRegistry, shift: int) -> Evidence:
    """The :class:`~.reducer.Evidence` that rows of :data:`SCHEMA` carry (in their order),
    in bins at ``shift`` (a row summed at a coarser one cannot be split: it counts at the
    start of its bin, and is counted in ``coarser_rows``), their communicators in
    ``registry``'s indices (one it does not know is added)."""
    ev = Evidence(shift)
    if not table.num_rows:
        return ev
    part = table.column("part").to_numpy()
    # a ccldw row's bin is a CCL-D window, which no bin width changes
    delta = np.where(part == CCLD_WINDOWS, 0,
                     shift - table.column("shift").to_numpy().astype(np.int64))
    bins = table.column("bin").to_numpy()
    if delta.any():
        ev.coarser_rows = int((delta < 0).sum())
        bins = np.where(delta >= 0, bins >> np.maximum(delta, 0), bins << np.maximum(-delta, 0))
    comm = table.column("comm").to_numpy()
    cidx = registry.indices(comm)
    # rows of one part in a run stay one chunk: the order within each part is kept
    for p, name in enumerate(PARTS):
        rows = np.flatnonzero(part == p)
        if not len(rows):
            continue
        cols = {"bin": bins[rows]}
        for k in PART_COLUMNS[name]:
            if k == "comm":
                cols["cidx"] = cidx[rows]
            else:
                cols[k] = table.column(k).to_numpy()[rows]
        if name == "ccld":
            ev.ccld.append(cols)
        elif name == "ccldw":
            ev.ccld_windows.append(cols)
        else:
            ev.tables[name].append(cols)
    return ev
