"""Reading NCCL Inspector output files (for :mod:`failslow.collectors.importers.nccl_inspector`,
whose docstring describes the format, and the live follower
:mod:`failslow.collectors.inspector_follow`): the output files of a folder, and a reader
(:class:`_Reader`) that parses their lines, per-record headers or ``dump_stats`` markers
(format v4.3), into flat per-operation columns, validating every field it uses, and keeps
the processes, the communicators with their members and sizes, the format versions and the
plugin's drop counters.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from failslow.collectors.importers import ImportResult
from failslow.events import ContractError

#: Output file names the plugin (and its exporter) use.
SUFFIXES = (".log", ".jsonl", ".json", ".log.gz", ".jsonl.gz", ".json.gz")
_MAX_US = (2**63 - 1) // 1000


@dataclass(frozen=True)
class _Context:
    """What a ``header`` / ``metadata`` pair says about the records it covers."""

    comm_id: str
    comm_name: str
    comm_rank: int
    comm_size: int
    nnodes: int | None
    host: str
    pid: int
    version: str
    dump_us: int | None


# ---------------------------------------------------------------------------------------------
# reading


def find_files(root: str | Path) -> list[Path]:
    """Inspector output files under ``root`` (recursively), or ``root`` itself if a file."""
    path = Path(root)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ContractError("no such directory", source=str(path))
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)
                   and p.name != "import.json")
    if not files:
        raise ContractError(f"no NCCL Inspector output files ({', '.join(SUFFIXES)})",
                            source=str(path))
    return files


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener: Any = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
        yield from enumerate(fh, start=1)


def _int(d: Mapping[str, Any], key: str, prefix: str, source: str, line: int,
         minimum: int = 0, required: bool = True) -> int | None:
    v = d.get(key)
    if v is None and not required:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum or v >= 2**64:
        raise ContractError(f"missing or invalid '{prefix}{key}' (an integer >= {minimum})",
                            source=source, line=line)
    return v


def _num(d: Mapping[str, Any], key: str, prefix: str, source: str, line: int,
         required: bool = True) -> float:
    v = d.get(key)
    if v is None and not required:
        return float("nan")
    if not isinstance(v, int | float) or isinstance(v, bool) or not v >= 0:
        raise ContractError(f"missing or invalid '{prefix}{key}' (a number >= 0)",
                            source=source, line=line)
    return float(v)


def _str(d: Mapping[str, Any], key: str, prefix: str, source: str, line: int) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise ContractError(f"missing or invalid '{prefix}{key}' (a string)", source=source,
                            line=line)
    return v


def _obj(value: Any, key: str, source: str, line: int) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ContractError(f"'{key}' must be a JSON object", source=source, line=line)
    return value


def _drop_counters(*parts: Any) -> dict[str, int]:
    """``*_dropped_*`` (or ``*dropped*``) integer counters found in the given objects."""
    out: dict[str, int] = {}
    for part in parts:
        if isinstance(part, Mapping):
            for k, v in part.items():
                if "dropped" in k and isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    out[k] = v
    return out


class _Reader:
    """Parses files into flat per-operation columns; keeps process and drop bookkeeping."""

    COLS = ("proc", "comm", "comm_rank", "comm_size", "p2p", "func", "sn", "peer", "bytes",
            "exec_us", "busbw", "timing", "t_enter", "t_start", "t_end", "reason")

    def __init__(self, result: ImportResult) -> None:
        self.result = result
        self.cols: dict[str, list[Any]] = {k: [] for k in self.COLS}
        self.procs: dict[tuple[str, int], int] = {}
        self.comm_ids: dict[str, int] = {}
        self.comm_names: dict[int, str] = {}
        self.members: dict[int, dict[int, int]] = {}  # comm -> comm rank -> proc
        self.sizes: dict[int, int] = {}
        self.nnodes: dict[int, int] = {}
        self.versions: set[str] = set()
        self.layouts: set[str] = set()
        self.marker_drops: dict[tuple[int, int, str], int] = {}  # summed over markers
        self.header_drops: dict[tuple[int, int, str], int] = {}  # max of cumulative values
        self.files: dict[str, int] = {}
        self.latest_dump_us = 0

    def context(self, header: Any, metadata: Any, source: str, line: int) -> _Context:
        h = _obj(header, "header", source, line)
        m = _obj(metadata, "metadata", source, line)
        size = _int(h, "n_ranks", "header.", source, line, minimum=1)
        rank = _int(h, "rank", "header.", source, line)
        assert size is not None and rank is not None
        if rank >= size:
            raise ContractError(f"header.rank {rank} is not below header.n_ranks {size}",
                                source=source, line=line)
        name = h.get("comm_name")
        pid = _int(m, "pid", "metadata.", source, line)
        assert pid is not None
        return _Context(
            comm_id=_str(h, "id", "header.", source, line),
            comm_name=name if isinstance(name, str) and name != "unknown" else "",
            comm_rank=rank, comm_size=size,
            nnodes=_int(h, "nnodes", "header.", source, line, minimum=1, required=False),
            host=_str(m, "hostname", "metadata.", source, line), pid=pid,
            version=str(m.get("inspector_output_format_version", "unknown")),
            dump_us=_int(m, "dump_timestamp_us", "metadata.", source, line, required=False))

    def register(self, ctx: _Context, source: str, line: int) -> tuple[int, int]:
        proc = self.procs.setdefault((ctx.host, ctx.pid), len(self.procs))
        comm = self.comm_ids.setdefault(ctx.comm_id, len(self.comm_ids))
        if ctx.comm_name:
            self.comm_names[comm] = ctx.comm_name
        size = self.sizes.setdefault(comm, ctx.comm_size)
        if size != ctx.comm_size:
            raise ContractError(f"communicator {ctx.comm_id} has n_ranks {ctx.comm_size} here "
                                f"and {size} elsewhere", source=source, line=line)
        owner = self.members.setdefault(comm, {}).setdefault(ctx.comm_rank, proc)
        if owner != proc:
            other = next(k for k, v in self.procs.items() if v == owner)
            raise ContractError(f"rank {ctx.comm_rank} of communicator {ctx.comm_id} is claimed "
                                f"by {ctx.host}/pid {ctx.pid} and by {other[0]}/pid {other[1]}",
                                source=source, line=line)
        if ctx.nnodes is not None:
            self.nnodes[comm] = ctx.nnodes
        self.versions.add(ctx.version)
        self.latest_dump_us = max(self.latest_dump_us, ctx.dump_us or 0)
        return proc, comm

    def read(self, path: Path) -> None:
        source = str(path)
        marker: _Context | None = None
        pending: tuple[int, str] | None = None  # an unparsable line: fatal unless it is last
        n = 0
        try:
            for line, text in _lines(path):
                if not text.strip():
                    continue
                if pending is not None:
                    raise ContractError(f"malformed JSON ({pending[1]})", source=source,
                                        line=pending[0])
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    pending = (line, e.msg)
                    continue
                if not isinstance(obj, dict):
                    raise ContractError("expected a JSON object", source=source, line=line)
                marker, added = self.record(obj, marker, source, line)
                n += added
        except EOFError:
            self.result.warn("compressed file cut short: its end was skipped")
        except (OSError, UnicodeError) as e:
            raise ContractError(f"cannot read ({e})", source=source) from None
        if pending is not None:
            self.result.warn("partly written last line skipped (the process was still writing "
                             "or was killed)")
        self.files[source] = n

    def record(self, obj: dict[str, Any], marker: _Context | None, source: str,
               line: int) -> tuple[_Context | None, int]:
        if "dump_stats" in obj:
            stats = obj["dump_stats"]
            inner = stats if isinstance(stats, Mapping) else {}
            ctx = self.context(obj.get("header", inner.get("header")),
                               obj.get("metadata", inner.get("metadata")), source, line)
            proc, comm = self.register(ctx, source, line)
            for key, v in _drop_counters(stats, obj.get("header"), obj.get("metadata")).items():
                k = (proc, comm, key)
                self.marker_drops[k] = self.marker_drops.get(k, 0) + v
            self.layouts.add("dump_stats markers (v4.3)")
            return ctx, 0
        payload_key = "coll_perf" if "coll_perf" in obj else "p2p_perf" if "p2p_perf" in obj \
            else None
        if payload_key is None:
            keys = ", ".join(sorted(obj)[:4])
            self.result.warn(f"records without coll_perf/p2p_perf ignored (keys: {keys})")
            return marker, 0
        if "header" in obj or "metadata" in obj:
            ctx = self.context(obj.get("header"), obj.get("metadata"), source, line)
            self.layouts.add("per-record header (v4.0-v4.2)")
            proc, comm = self.register(ctx, source, line)
            for key, v in _drop_counters(obj.get("header"), obj.get("metadata")).items():
                k = (proc, comm, key)
                self.header_drops[k] = max(self.header_drops.get(k, 0), v)
        elif marker is not None:
            ctx = marker
            proc, comm = self.procs[(ctx.host, ctx.pid)], self.comm_ids[ctx.comm_id]
        else:
            raise ContractError(f"'{payload_key}' record with no header: neither on the line "
                                "nor in a preceding dump_stats record", source=source, line=line)
        self.payload(_obj(obj[payload_key], payload_key, source, line), payload_key == "p2p_perf",
                     ctx, proc, comm, source, line)
        return marker, 1

    def payload(self, p: Mapping[str, Any], p2p: bool, ctx: _Context, proc: int, comm: int,
                source: str, line: int) -> None:
        pre = "p2p" if p2p else "coll"
        c = self.cols
        c["proc"].append(proc)
        c["comm"].append(comm)
        c["comm_rank"].append(ctx.comm_rank)
        c["comm_size"].append(ctx.comm_size)
        c["p2p"].append(p2p)
        c["func"].append(_str(p, pre, f"{pre}_perf.", source, line))
        c["sn"].append(_int(p, f"{pre}_sn", f"{pre}_perf.", source, line))
        c["peer"].append(_int(p, "p2p_peer", "p2p_perf.", source, line) if p2p else -1)
        c["bytes"].append(_int(p, f"{pre}_msg_size_bytes", f"{pre}_perf.", source, line))
        c["exec_us"].append(_num(p, f"{pre}_exec_time_us", f"{pre}_perf.", source, line))
        c["busbw"].append(_num(p, f"{pre}_busbw_gbs", f"{pre}_perf.", source, line, False))
        timing = p.get(f"{pre}_timing_source")
        c["timing"].append(timing if isinstance(timing, str) else "unknown")
        t_enter = t_start = t_end = -1
        reason = "not verbose (no event_trace_ts)"
        trace = p.get("event_trace_ts")
        if trace is not None:
            tr = _obj(trace, f"{pre}_perf.event_trace_ts", source, line)
            where = f"{pre}_perf.event_trace_ts."
            start = _int(tr, f"{pre}_start_ts", where, source, line, required=False) or 0
            kernels = tr.get("kernel_events", [])
            if not isinstance(kernels, list) or not all(isinstance(k, Mapping) for k in kernels):
                raise ContractError(f"'{where}kernel_events' must be a list of objects",
                                    source=source, line=line)
            starts, stops = [], []
            for k in kernels:
                kw = f"{where}kernel_events[]."
                starts.append(_int(k, "kernel_start_ts", kw, source, line, required=False) or 0)
                stops.append(max(_int(k, "kernel_stop_ts", kw, source, line, required=False) or 0,
                                 _int(k, "kernel_record_ts", kw, source, line,
                                      required=False) or 0))
            if max([start, *stops]) > _MAX_US:
                raise ContractError(f"timestamp beyond int64 nanoseconds in '{where}'",
                                    source=source, line=line)
            good_starts = [s for s in starts if s > 0]
            if start <= 0:
                reason = "event_trace_ts without a start timestamp"
            elif max(stops, default=0) <= 0:
                reason = "no kernel completion timestamp (no kernel events)"
            else:
                t_enter, t_end = start * 1000, max(stops) * 1000
                t_start = min(good_starts) * 1000 if good_starts else -1
                reason = ""
        c["t_enter"].append(t_enter)
        c["t_start"].append(t_start)
        c["t_end"].append(t_end)
        c["reason"].append(reason)
