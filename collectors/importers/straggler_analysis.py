"""Import the operation traces of ByteDance's what-if straggler analysis (StragglerAnalysis).

The what-if paper (papers/whatif-stragglers.md) publishes, per trial, a Parquet trace of a
Megatron-LM job with one row per framework operation: ``dp_rank``, ``stage``, ``rank``,
``step``, ``optype`` (``forward-compute``, ``backward-send``, ``params-all-gather``, ...),
``start_ts`` and ``duration`` (float seconds, relative to the start of each step), ``seq_id``
(the operation's index among the same optype of the worker in that step), ``mb_id``
(micro-batch), ``mc`` / ``gmc`` (model chunk), plus a YAML meta with the parallel degrees.
Only one worker per (dp rank, stage) is traced: tensor parallelism is collapsed.

Conversion to the event contract (events.md):

- Ranks. Because tp (and the sequence-parallel ``dsp``) is collapsed, the imported job is a
  ``dp x pp`` job: ``world_size = dp * pp``, ``tp = cp = 1``. Each traced worker becomes rank
  ``stage * dp + dp_rank`` (Megatron order, tp fastest, with tp removed; here equal to the
  trace's ``rank // (tp * dsp)``), so ranks are dense and match the degrees. The trace's own
  rank is kept in the extra column ``trace_rank`` and in ``import.json`` with the original
  tp/dsp/vpp/world sizes (meta has no free field for them). Nodes are ``node<trace_rank // 8>``
  (the original placement, 8 GPUs per node).
- Time. Steps are sampled (non-consecutive) and times are relative to each step's start.
  Steps are laid end to end in step order from a synthetic epoch (``--epoch-ns``, default
  2023-11-14T22:13:20Z): a step starts where the previous imported step ended (its largest
  ``start_ts + duration`` over all workers). The step's length is therefore exactly the
  trace's step time, which is what ``result-AR.json``'s ``step_t_base`` holds (the baseline
  step time of the what-if analysis equals the maximum end over workers of the step, to
  float32 precision). Nanosecond times are rounded from the float seconds.
- ``span`` rows: one per trace row. ``op``: the six pipeline ops keep their names,
  ``params-all-gather`` -> ``params-sync``, ``grads-reduce-scatter`` -> ``grads-sync``,
  ``optimizer`` and ``optimizer-clip-main-grad`` -> ``optimizer``, ``gc`` -> ``gc``, anything
  else (``layernorm-grads-all-reduce``, ``embedding-grads-all-reduce``, ...) -> ``other``;
  the original name is kept in the extra column ``optype``. ``microbatch`` = ``mb_id`` for
  compute, ``seq_id`` for the pipeline send/recv ops (the k-th send of a step carries
  micro-batch k in both 1F1B and GPipe order), -1 otherwise. ``chunk`` = the model chunk
  ``mc`` when the schedule is interleaved (vpp > 1), else -1.
- ``coll`` rows derived from the communication spans, so coll-based detectors read the trace:
  ``forward-send`` / ``backward-recv`` (to / from stage + 1) and ``forward-recv`` /
  ``backward-send`` (from / to stage - 1) become ``send`` / ``recv`` on a pipeline
  communicator per dp rank (comm rank = stage); ``params-all-gather`` / ``grads-reduce-scatter``
  become ``allgather`` / ``reducescatter`` on a data-parallel communicator per stage (comm
  rank = dp rank); ``embedding-grads-all-reduce`` becomes an ``allreduce`` between the first
  and last stage of each dp rank (kind ``other``). ``enter`` at the span start, ``end`` at the
  span end, ``t_start`` unknown. ``seq`` counts the rank's imported calls on that communicator
  in time order (calls of steps that were not sampled are not counted). ``bytes`` is unknown
  and written as 0. Layer-norm all-reduces run on the collapsed tensor-parallel group and
  have no coll rows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from failslow import events
from failslow.collectors.importers import ImportResult, sanitize_job, stable_id
from failslow.events import Comm, ContractError, JobMeta

log = logging.getLogger(__name__)

SOURCE = "bytedance-straggler-analysis"
#: 2023-11-14T22:13:20Z: the synthetic start of the first imported step.
DEFAULT_EPOCH_NS = 1_700_000_000_000_000_000
GPUS_PER_NODE = 8

#: trace optype -> span op (unknown optypes become ``other``).
SPAN_OP_BY_OPTYPE: dict[str, str] = {
    "forward-compute": "forward-compute", "backward-compute": "backward-compute",
    "forward-send": "forward-send", "forward-recv": "forward-recv",
    "backward-send": "backward-send", "backward-recv": "backward-recv",
    "params-all-gather": "params-sync", "grads-reduce-scatter": "grads-sync",
    "optimizer": "optimizer", "optimizer-clip-main-grad": "optimizer", "gc": "gc",
    "layernorm-grads-all-reduce": "other", "embedding-grads-all-reduce": "other",
}
#: Communicator families of the derived coll rows.
_PP, _DP, _EMB = 1, 2, 3
#: trace optype -> (coll op, communicator family, peer stage offset for send/recv).
COLL_BY_OPTYPE: dict[str, tuple[str, int, int]] = {
    "forward-send": ("send", _PP, +1), "forward-recv": ("recv", _PP, -1),
    "backward-send": ("send", _PP, -1), "backward-recv": ("recv", _PP, +1),
    "params-all-gather": ("allgather", _DP, 0), "grads-reduce-scatter": ("reducescatter", _DP, 0),
    "embedding-grads-all-reduce": ("allreduce", _EMB, 0),
}
_COMPUTE = ("forward-compute", "backward-compute")
_REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration")


# ---------------------------------------------------------------------------------------------
# reading


def read_meta(path: str | Path) -> dict[str, Any]:
    """The trial's YAML meta (``dp_size``, ``pp_size``, ``tp_size``, ...), validated."""
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ContractError(f"cannot read ({e.strerror})", source=source) from None
    except UnicodeDecodeError:
        hint = " (it is a Parquet file: the trace goes to --trace)" if _is_parquet(path) else ""
        raise ContractError(f"not a YAML text file{hint}", source=source) from None
    except yaml.YAMLError as e:
        raise ContractError(f"malformed YAML ({e})", source=source) from None
    if not isinstance(data, dict):
        raise ContractError("expected a YAML mapping", source=source)
    for key in ("dp_size", "pp_size"):
        if not isinstance(data.get(key), int) or data[key] < 1:
            raise ContractError(f"missing or invalid '{key}' (a positive integer)",
                                source=source)
    for key in ("tp_size", "dsp_size", "vpp_size"):
        value = data.setdefault(key, 1)
        if not isinstance(value, int) or value < 1:
            raise ContractError(f"invalid '{key}' (a positive integer)", source=source)
    return data


def _is_parquet(path: str | Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return False


def check_arguments(trace: str | Path, meta: str | Path) -> None:
    """One clear error for swapped or missing ``--trace``/``--meta`` files."""
    for path, flag in ((trace, "--trace"), (meta, "--meta")):
        if not Path(path).is_file():
            raise ContractError(f"{flag}: no such file", source=str(path))
    if _is_parquet(meta) and not _is_parquet(trace):
        raise ContractError(f"--trace {trace} and --meta {meta} are swapped: --trace takes "
                            "the Parquet trace (trace-*.parquet), --meta the YAML meta "
                            "(meta-*.yaml)")


def read_trace(path: str | Path) -> pa.Table:
    source = str(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ContractError(f"not a readable Parquet file ({e})", source=source) from None
    return table


# ---------------------------------------------------------------------------------------------
# conversion


def _int_column(table: pa.Table, name: str, source: str) -> np.ndarray:
    col = table.column(name)
    if not pa.types.is_integer(col.type):
        raise ContractError(f"expected integers, found {col.type}", source=source, column=name)
    if col.null_count:
        bad = int(pc.index(pc.is_null(col), True).as_py())
        raise ContractError("null value", source=source, row=bad, column=name)
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _float_column(table: pa.Table, name: str, source: str) -> np.ndarray:
    col = table.column(name)
    if not (pa.types.is_floating(col.type) or pa.types.is_integer(col.type)):
        raise ContractError(f"expected numbers, found {col.type}", source=source, column=name)
    values = np.asarray(pc.fill_null(col.cast(pa.float64()), np.nan).to_numpy(),
                        dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if bad.size:
        raise ContractError(f"value {values[bad[0]]!r} is not a finite time >= 0",
                            source=source, row=int(bad[0]), column=name)
    return values


def _optype_codes(table: pa.Table, source: str) -> tuple[list[str], np.ndarray]:
    """(distinct optype names, per-row index into them) without a per-row Python loop."""
    col = table.column("optype")
    if col.null_count:
        bad = int(pc.index(pc.is_null(col), True).as_py())
        raise ContractError("null value", source=source, row=bad, column="optype")
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise ContractError(f"expected strings, found {col.type}", source=source,
                            column="optype")
    encoded = pc.dictionary_encode(col).combine_chunks()
    names = [str(v) for v in encoded.dictionary.to_pylist()]
    return names, np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def _seq_in_call_order(comm: np.ndarray, rank: np.ndarray, t: np.ndarray,
                       tiebreak: np.ndarray) -> np.ndarray:
    """Per (comm, rank): 0, 1, 2, ... in time order (ties broken by ``tiebreak``)."""
    order = np.lexsort((tiebreak, t, rank, comm))
    c, r = comm[order], rank[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (c[1:] != c[:-1]) | (r[1:] != r[:-1])
    starts = np.flatnonzero(new)
    position = np.arange(order.size) - np.repeat(starts, np.diff(np.append(starts, order.size)))
    seq = np.empty(order.size, dtype=np.uint64)
    seq[order] = position.astype(np.uint64)
    return seq


def convert(table: pa.Table, meta: Mapping[str, Any], job: str,
            epoch_ns: int = DEFAULT_EPOCH_NS, source: str = "trace") -> ImportResult:
    """Convert a StragglerAnalysis trace table and its meta (see the module docstring)."""
    for name in _REQUIRED:
        if name not in table.column_names:
            raise ContractError("missing required column", source=source, column=name)
    dp, pp = int(meta["dp_size"]), int(meta["pp_size"])
    tp, dsp, vpp = int(meta.get("tp_size", 1)), int(meta.get("dsp_size", 1)), \
        int(meta.get("vpp_size", 1))
    n = table.num_rows
    dp_rank = _int_column(table, "dp_rank", source)
    stage = _int_column(table, "stage", source)
    trace_rank = _int_column(table, "rank", source)
    step = _int_column(table, "step", source)
    start_s = _float_column(table, "start_ts", source)
    end_s = start_s + _float_column(table, "duration", source)
    seq_id = (_int_column(table, "seq_id", source) if "seq_id" in table.column_names
              else np.full(n, -1, dtype=np.int64))
    mb_id = (_int_column(table, "mb_id", source) if "mb_id" in table.column_names
             else np.full(n, -1, dtype=np.int64))
    mc = (_int_column(table, "mc", source) if "mc" in table.column_names
          else np.full(n, -1, dtype=np.int64))
    for name, values, size in (("dp_rank", dp_rank, dp), ("stage", stage, pp)):
        bad = np.flatnonzero((values < 0) | (values >= size))
        if bad.size:
            raise ContractError(f"value {int(values[bad[0]])} outside [0, {size})",
                                source=source, row=int(bad[0]), column=name)
    rank = (stage * dp + dp_rank).astype(np.int64)
    _check_one_worker_per_coordinate(rank, trace_rank, source)

    result = ImportResult(meta=_placeholder(job), tables={})
    names, codes = _optype_codes(table, source)

    # time: steps end to end, in step order, from the epoch
    steps, step_index = np.unique(step, return_inverse=True)
    step_len = np.zeros(steps.size, dtype=np.float64)
    np.maximum.at(step_len, step_index, end_s)
    step_len_ns = np.rint(step_len * 1e9).astype(np.int64)
    step_start_ns = epoch_ns + np.concatenate(([0], np.cumsum(step_len_ns)[:-1]))
    base = step_start_ns[step_index]
    t_start = base + np.rint(start_s * 1e9).astype(np.int64)
    t_end = base + np.rint(end_s * 1e9).astype(np.int64)

    # span rows
    unknown = [i for i, name in enumerate(names) if name not in SPAN_OP_BY_OPTYPE]
    counts = np.bincount(codes, minlength=len(names))
    for i in unknown:
        result.warn(f"unknown optype {names[i]!r} imported as span op 'other'", int(counts[i]))
    span_code = np.array([events.SPAN_OP[SPAN_OP_BY_OPTYPE.get(name, "other")]
                          for name in names], dtype=np.int8)[codes]
    is_compute = np.isin(codes, [i for i, name in enumerate(names) if name in _COMPUTE])
    is_p2p = np.isin(codes, [i for i, name in enumerate(names)
                             if COLL_BY_OPTYPE.get(name, ("", 0, 0))[1] == _PP])
    microbatch = np.where(is_compute, mb_id, np.where(is_p2p, seq_id, -1))
    chunk = np.where(is_compute & (mc >= 0), mc, -1) if vpp > 1 else np.full(n, -1)
    span = events.from_columns({
        "job": job, "rank": rank.astype(np.int32), "step": step,
        "microbatch": microbatch.astype(np.int32), "chunk": chunk.astype(np.int32),
        "op": span_code, "t_start": t_start, "t_end": t_end}, "span")
    optype_strings = pc.take(pa.array(names, type=pa.string()), pa.array(codes))
    span = (span.append_column("optype", optype_strings)
            .append_column("trace_rank", pa.array(trace_rank.astype(np.int32)))
            .append_column("dp_rank", pa.array(dp_rank.astype(np.int32)))
            .append_column("stage", pa.array(stage.astype(np.int32)))
            .append_column("seq_id", pa.array(seq_id.astype(np.int32))))

    coll, comms = _coll(job, names, codes, rank, dp_rank, stage, step, seq_id, t_start, t_end,
                        dp, pp, result)

    nodes_of = {int(r): f"node{int(tr) // GPUS_PER_NODE}"
                for r, tr in zip(*np.unique(np.stack([rank, trace_rank]), axis=1), strict=True)}
    world = dp * pp
    for r in range(world):
        nodes_of.setdefault(r, f"node{r * tp * dsp // GPUS_PER_NODE}")
    microbatches = int(mb_id[is_compute].max()) + 1 if is_compute.any() else 0
    result.meta = JobMeta(job=job, t=epoch_ns, world_size=world, tp=1, pp=pp, dp=dp, cp=1,
                          microbatches=max(microbatches, 0),
                          schedule="interleaved" if vpp > 1 else "1f1b", nodes=nodes_of,
                          comms=tuple(comms))
    result.tables = {"coll": coll, "span": span}
    rank_map = {int(r): int(tr) for r, tr in zip(rank, trace_rank, strict=True)}
    result.info = {
        "source": SOURCE,
        "original_meta": {k: v for k, v in meta.items() if isinstance(v, int | str | float)},
        "collapsed": {"tp": tp, "dsp": dsp, "note": "one traced worker per (dp_rank, stage): "
                      "world_size = dp * pp, tp = cp = 1; rank = stage * dp + dp_rank"},
        "trace_rank_of_rank": {str(k): rank_map[k] for k in sorted(rank_map)},
        "epoch_ns": epoch_ns,
        "step_start_ns": {str(int(s)): int(t) for s, t in zip(steps, step_start_ns, strict=True)},
        "step_length_ns": {str(int(s)): int(t) for s, t in zip(steps, step_len_ns, strict=True)},
        "bytes": "unknown (0) on every coll row",
    }
    return result


def _check_one_worker_per_coordinate(rank: np.ndarray, trace_rank: np.ndarray,
                                     source: str) -> None:
    pairs = np.unique(np.stack([rank, trace_rank]), axis=1)
    if np.unique(pairs[0]).size != pairs.shape[1] or np.unique(pairs[1]).size != pairs.shape[1]:
        raise ContractError("more than one traced rank per (dp_rank, stage), or one rank at "
                            "several coordinates: only traces with tensor parallelism "
                            "collapsed are supported", source=source, column="rank")


def _placeholder(job: str) -> JobMeta:
    return JobMeta(job=job, t=0, world_size=1, tp=1, pp=1, dp=1, cp=1, microbatches=0,
                   schedule="unknown", nodes={}, comms=())


def _coll(job: str, names: list[str], codes: np.ndarray, rank: np.ndarray,
          dp_rank: np.ndarray, stage: np.ndarray, step: np.ndarray, seq_id: np.ndarray,
          t_start: np.ndarray, t_end: np.ndarray, dp: int, pp: int,
          result: ImportResult) -> tuple[pa.Table, list[Comm]]:
    """Derived collective / point-to-point rows (two per operation) and their communicators."""
    op_of = np.full(len(names), -1, dtype=np.int8)
    family_of = np.zeros(len(names), dtype=np.int8)
    offset_of = np.zeros(len(names), dtype=np.int64)
    for i, name in enumerate(names):
        if name in COLL_BY_OPTYPE:
            op, family, offset = COLL_BY_OPTYPE[name]
            op_of[i], family_of[i], offset_of[i] = events.OP[op], family, offset
    family = family_of[codes]
    op = op_of[codes]
    peer_stage = stage + offset_of[codes]
    keep = family > 0
    bad_peer = keep & (family == _PP) & ((peer_stage < 0) | (peer_stage >= pp))
    result.warn("pipeline send/recv with no neighbouring stage: no coll row",
                int(bad_peer.sum()))
    bad_emb = keep & (family == _EMB) & ((pp < 2) | ((stage != 0) & (stage != pp - 1)))
    result.warn("embedding all-reduce outside the first/last stage: no coll row",
                int(bad_emb.sum()))
    keep &= ~bad_peer & ~bad_emb
    idx = np.flatnonzero(keep)
    fam, st, dr = family[idx], stage[idx], dp_rank[idx]

    pp_ids = np.array([stable_id(job, "pp", str(d)) for d in range(dp)], dtype=np.uint64)
    dp_ids = np.array([stable_id(job, "dp", str(s)) for s in range(pp)], dtype=np.uint64)
    emb_ids = np.array([stable_id(job, "embedding", str(d)) for d in range(dp)],
                       dtype=np.uint64)
    comm = np.where(fam == _PP, pp_ids[dr], np.where(fam == _DP, dp_ids[st], emb_ids[dr]))
    comm_rank = np.where(fam == _PP, st, np.where(fam == _DP, dr, np.where(st == 0, 0, 1)))
    comm_size = np.where(fam == _PP, pp, np.where(fam == _DP, dp, 2))
    peer = np.where(fam == _PP, peer_stage[idx], -1)
    seq = _seq_in_call_order(comm, rank[idx], t_start[idx], codes[idx] * 1_000_000 + seq_id[idx])
    _check_rounds(comm[fam != _PP], seq[fam != _PP], op[idx][fam != _PP],
                  step[idx][fam != _PP], result)

    def both(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values, values])

    m = idx.size
    table = events.from_columns({
        "job": job, "rank": both(rank[idx]).astype(np.int32), "comm": both(comm),
        "comm_rank": both(comm_rank).astype(np.int32),
        "comm_size": both(comm_size).astype(np.int32), "seq": both(seq),
        "op": both(op[idx]), "bytes": np.zeros(2 * m, dtype=np.uint64),
        "peer": both(peer).astype(np.int32),
        "phase": np.repeat(np.array([events.ENTER, events.END], dtype=np.int8), m),
        "t": np.concatenate([t_start[idx], t_end[idx]]),
    }, "coll")
    table = table.append_column("step", pa.array(both(step[idx])))

    comms: list[Comm] = []
    used = set(np.unique(comm).tolist())
    for d in range(dp):
        if int(pp_ids[d]) in used:
            comms.append(Comm(int(pp_ids[d]), "pp", tuple(s * dp + d for s in range(pp))))
    for s in range(pp):
        if int(dp_ids[s]) in used:
            comms.append(Comm(int(dp_ids[s]), "dp", tuple(s * dp + d for d in range(dp))))
    for d in range(dp):
        if int(emb_ids[d]) in used:
            comms.append(Comm(int(emb_ids[d]), "other", (d, (pp - 1) * dp + d)))
    return table, comms


def _check_rounds(comm: np.ndarray, seq: np.ndarray, op: np.ndarray, step: np.ndarray,
                  result: ImportResult) -> None:
    """Every (comm, seq) of a collective must be one round: same op and step on all members."""
    if not comm.size:
        return
    order = np.lexsort((seq, comm))
    c, s, o, st = comm[order], seq[order], op[order], step[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (c[1:] != c[:-1]) | (s[1:] != s[:-1])
    starts = np.flatnonzero(new)
    mixed = ((np.minimum.reduceat(o, starts) != np.maximum.reduceat(o, starts))
             | (np.minimum.reduceat(st, starts) != np.maximum.reduceat(st, starts)))
    result.warn("collective rounds whose members disagree on the op or step (members traced "
                "different numbers of calls)", int(mixed.sum()))


def import_files(trace: str | Path, meta: str | Path, job: str | None = None,
                 epoch_ns: int = DEFAULT_EPOCH_NS) -> ImportResult:
    """Read ``trace-*.parquet`` and ``meta-*.yaml`` and convert them."""
    check_arguments(trace, meta)
    meta_data = read_meta(meta)
    table = read_trace(trace)
    if job is None:
        trial = str(meta_data.get("trial_name", Path(trace).stem))
        job = sanitize_job(f"sa-{trial}-{meta_data.get('run_id', 0)}", "straggler-analysis")
    result = convert(table, meta_data, job, epoch_ns, str(trace))
    result.info["input"] = {"trace": str(trace), "meta": str(meta)}
    result.log_warnings(log)
    return result
