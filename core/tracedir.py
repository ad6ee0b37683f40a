"""Trace directories (events.md, "Trace directory"): ``meta.json`` plus one Parquet or JSON
Lines file per record kind. Reading validates against the contract and names the file, the
line or row, and the column of the first bad value."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from failslow import events
from failslow.events import ContractError, JobMeta

log = logging.getLogger(__name__)

DATA_KINDS = tuple(k for k in events.KINDS if k != "meta")
BATCH_ROWS = 1 << 20


class TraceDir:
    """A trace directory opened for reading."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise ContractError("not a trace directory (no such directory)", source=str(path))
        self._files: dict[str, Path] = {}
        for kind in DATA_KINDS:
            parquet, jsonl = self.path / f"{kind}.parquet", self.path / f"{kind}.jsonl"
            if parquet.exists():
                if jsonl.exists():
                    log.warning("%s: both %s and %s exist; reading the Parquet file",
                                self.path, parquet.name, jsonl.name)
                self._files[kind] = parquet
            elif jsonl.exists():
                self._files[kind] = jsonl
        if "coll" not in self._files:
            raise ContractError("no coll.parquet or coll.jsonl (required)"
                                + import_hint(self.path), source=str(self.path))

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._files)

    def metas(self) -> dict[str, JobMeta]:
        """The newest ``meta`` row per job (events.md, "Details every reader must handle")."""
        return read_meta_json(self.path / "meta.json")

    def meta(self) -> JobMeta:
        """The one job's meta; a directory with several jobs must be read with :meth:`metas`."""
        metas = self.metas()
        if len(metas) != 1:
            raise ContractError(f"expected one job, found {len(metas)}: {sorted(metas)}",
                                source=str(self.path / "meta.json"))
        return next(iter(metas.values()))

    def read(self, kind: str) -> pa.Table:
        """The whole table of ``kind`` (an empty table when the file is absent)."""
        tables = list(self.iter_batches(kind))
        if not tables:
            return events.empty(kind)
        return pa.concat_tables(tables, promote_options="permissive")

    def iter_batches(self, kind: str, batch_rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
        path = self._files.get(kind)
        if path is None:
            return
        if path.suffix == ".parquet":
            yield from _read_parquet(path, kind, batch_rows)
        else:
            yield from _read_jsonl(path, kind)


#: The formats ``failslow import`` converts.
IMPORT_FORMATS = ("flight-recorder", "straggler-analysis", "nccl-inspector")
_INSPECTOR_SUFFIXES = (".log", ".jsonl", ".json", ".log.gz", ".jsonl.gz", ".json.gz")


def import_hint(path: Path) -> str:
    """``; ...`` naming the ``failslow import`` command for a folder of another tool's files
    (or listing the formats when none is recognised); ``""`` for a folder that has our
    ``meta.json``."""
    files = [p for p in path.iterdir() if p.is_file()] if path.is_dir() else []
    names = [p.name for p in files]
    if any(re.search(r"(dump|rank)_?\d+$", n) for n in names):
        return (f"; these look like PyTorch NCCL Flight Recorder dumps: convert them with "
                f"`failslow import flight-recorder {path} --out TRACE_DIR`")
    traces = [n for n in names if n.startswith("trace") and n.endswith(".parquet")]
    metas = [n for n in names if n.startswith("meta") and n.endswith((".yaml", ".yml"))]
    if traces and metas:
        return (f"; this looks like a ByteDance StragglerAnalysis trial: convert it with "
                f"`failslow import straggler-analysis --trace {path / traces[0]} "
                f"--meta {path / metas[0]} --out TRACE_DIR`")
    if "meta.json" not in names and any(n.endswith(_INSPECTOR_SUFFIXES) for n in names):
        return (f"; if this is NCCL Inspector output, convert it with "
                f"`failslow import nccl-inspector {path} --out TRACE_DIR`")
    if "meta.json" in names:
        return ""
    return ("; not a failslow trace directory: for another tool's files run `failslow import "
            f"FORMAT` ({', '.join(IMPORT_FORMATS)})")


def read_meta_json(path: Path) -> dict[str, JobMeta]:
    if not path.exists():
        raise ContractError("missing meta.json (required)", source=str(path))
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ContractError(f"malformed JSON: {e.msg}", source=str(path), line=e.lineno) from None
    rows = data if isinstance(data, list) else [data]
    if not rows:
        raise ContractError("no meta object", source=str(path))
    return events.latest_meta([events.parse_meta_row(r, str(path), i) for i, r in enumerate(rows)])


def _read_parquet(path: Path, kind: str, batch_rows: int) -> Iterator[pa.Table]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ContractError(f"not a readable Parquet file ({e})", source=str(path)) from None
    names = set(pf.schema_arrow.names)
    for field in events.SCHEMAS[kind]:
        if field.name not in names and not field.nullable:
            raise ContractError("missing required column", source=str(path), column=field.name)
    offset = 0
    try:
        for batch in pf.iter_batches(batch_size=batch_rows):
            table = pa.Table.from_batches([batch])
            yield events.conform(table, kind, str(path), offset)
            offset += table.num_rows
    except (pa.ArrowInvalid, OSError) as e:
        raise ContractError(f"corrupt Parquet data after row {offset} ({e})",
                            source=str(path), row=offset) from None


def _read_jsonl(path: Path, kind: str) -> Iterator[pa.Table]:
    schema = events.SCHEMAS[kind]
    try:
        table = pajson.read_json(
            path,
            parse_options=pajson.ParseOptions(explicit_schema=schema,
                                              unexpected_field_behavior="ignore"),
        )
        yield events.conform(table, kind, str(path))
        return
    except (pa.ArrowInvalid, pa.ArrowTypeError, ContractError):
        pass  # the slow path below finds and names the first bad line
    yield _read_jsonl_checked(path, kind)


def _read_jsonl_checked(path: Path, kind: str) -> pa.Table:
    """Line-by-line parse that names the first bad line and column."""
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    required = [f.name for f in events.SCHEMAS[kind] if not f.nullable]
    torn: ContractError | None = None  # a bad line is an error unless it is the last one
    with path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            if torn is not None:
                raise torn
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                msg = getattr(e, "msg", str(e))
                torn = ContractError(f"malformed JSON: {msg}", source=str(path), line=number)
                continue
            if not isinstance(obj, dict):
                raise ContractError("expected a JSON object", source=str(path), line=number)
            for name in required:
                if obj.get(name) is None:
                    raise ContractError("missing required column", source=str(path),
                                        line=number, column=name)
            rows.append(obj)
            lines.append(number)
    if torn is not None:  # what a crashed writer leaves: drop it, say so
        log.warning("%s; the last line is cut off (what a crashed job leaves): dropped it",
                    torn)
    table = _table_from_rows(kind, rows, str(path), lines)
    try:
        return events.conform(table, kind, str(path))
    except ContractError as e:
        line = lines[e.row] if e.row is not None and e.row < len(lines) else None
        raise ContractError(str(e).split(": ", 1)[-1], source=str(path), line=line,
                            column=e.column) from None


def _table_from_rows(kind: str, rows: Sequence[Mapping[str, Any]], source: str,
                     lines: Sequence[int]) -> pa.Table:
    schema = events.SCHEMAS[kind]
    try:
        return pa.Table.from_pylist(list(rows), schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        return events._rows_to_table_checked(kind, rows, source, lines)


def write_trace(path: str | Path, metas: Sequence[JobMeta], tables: Mapping[str, pa.Table],
                fmt: str = "parquet") -> Path:
    """Write a trace directory; ``fmt`` is ``parquet`` or ``jsonl``."""
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"unknown trace format {fmt!r} (parquet or jsonl)")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    rows = [m.to_row() for m in metas]
    (out / "meta.json").write_text(json.dumps(rows[0] if len(rows) == 1 else rows, indent=1))
    for kind, table in tables.items():
        if kind not in DATA_KINDS:
            raise ValueError(f"unknown record kind {kind!r}")
        table = events.conform(table, kind)
        for stale in (out / f"{kind}.parquet", out / f"{kind}.jsonl"):
            stale.unlink(missing_ok=True)
        if fmt == "parquet":
            pq.write_table(table, out / f"{kind}.parquet", compression="zstd")
        else:
            _write_jsonl(table, out / f"{kind}.jsonl")
    return out


def _write_jsonl(table: pa.Table, path: Path) -> None:
    with path.open("w") as fh:
        for batch in table.to_batches(max_chunksize=65536):
            for row in batch.to_pylist():
                fh.write(json.dumps({k: v for k, v in row.items() if v is not None}))
                fh.write("\n")
