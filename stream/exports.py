"""Derived tables between consumer groups (issue 13 item 3: stages connected by Kafka
topics): a processor that derives a table (the iteration tracker's ``iterations``) exports
it on ``failslow.derived.<name>``, keyed by job like every event topic, and processors of
other groups import it as one more input kind instead of deriving it again
(``failslow process --export`` / ``--import``; :mod:`failslow.engine.imports`).

A row carries ``t_emit``, the exporting job's event time when it was derived (the largest
event time of the batch that produced it). The importing processor windows the rows by
that time, so its detectors read each row with the records that were analysed with it at
the source: the diagnosis is that of one process doing both (tested). Every message also
says, in its ``failslow-watermark`` header, that every row up to that ``t_emit`` was
published: the importer aligns the kind with the others as it aligns event kinds. The
export is published at each checkpoint of the source, after its sink write and before its
offsets are committed (at least once; the importer drops rows it already took)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from failslow.engine.imports import IMPORTABLE, SCHEMAS
from failslow.stream.sink import select_schema
from failslow.stream.transport import (
    ARROW_STREAM,
    H_CONTENT_TYPE,
    H_KIND,
    H_VERSION,
    H_WATERMARK,
    DecodeError,
    Message,
    one_batch_stream,
)

EXPORT_PREFIX = "failslow.derived."
#: Topics of the exportable derived tables.
EXPORT_TOPICS: tuple[str, ...] = tuple(EXPORT_PREFIX + name for name in sorted(IMPORTABLE))
#: The column every exported row carries: the source's event time when it was derived.
T_EMIT = "t_emit"
#: Version of the exported messages (the table's schema in failslow.results, plus t_emit).
EXPORT_VERSION = "1"
#: Header of an export message published by one of several shards: ``i/n``.
H_SOURCE = "failslow-source"
#: Rows and bytes (uncompressed Arrow) per export message at most (a 4096-rank job's
#: iterations of one checkpoint are tens of thousands of rows, its evidence hundreds of
#: thousands; messages stay below the producers' 900 kB limit even uncompressed).
EXPORT_MESSAGE_ROWS = 16_384
EXPORT_MESSAGE_BYTES = 768 << 10


def message_rows(table: pa.Table) -> int:
    """Rows per export message of ``table`` (:data:`EXPORT_MESSAGE_ROWS`,
    :data:`EXPORT_MESSAGE_BYTES`)."""
    if not table.num_rows:
        return EXPORT_MESSAGE_ROWS
    per_row = max(1, table.nbytes // table.num_rows)
    return max(1, min(EXPORT_MESSAGE_ROWS, EXPORT_MESSAGE_BYTES // per_row))


def export_topic(name: str) -> str:
    """The topic of exportable derived table ``name``."""
    if name not in IMPORTABLE:
        raise ValueError(f"derived table {name!r} cannot be exported (known: "
                         f"{', '.join(sorted(IMPORTABLE))})")
    return EXPORT_PREFIX + name


def exported_of(topic: str) -> str | None:
    """The derived table carried on ``topic``, or None for other topics."""
    if topic.startswith(EXPORT_PREFIX):
        name = topic[len(EXPORT_PREFIX):]
        if name in IMPORTABLE:
            return name
    return None


def schema_of(name: str) -> pa.Schema:
    """The schema of exported table ``name``: its own (:data:`~failslow.engine.imports.
    SCHEMAS`) and ``t_emit``."""
    return SCHEMAS[name].append(pa.field(T_EMIT, pa.int64(), nullable=False))


def with_emit_time(name: str, table: pa.Table, t_emit: int) -> pa.Table:
    """``table`` (rows of derived table ``name``) in its exported schema, every row derived
    at event time ``t_emit``."""
    base = select_schema(table, SCHEMAS[name])
    column = pa.array(np.full(base.num_rows, t_emit, dtype=np.int64))
    return pa.Table.from_arrays([*base.columns, column], schema=schema_of(name))


def encode_export(name: str, table: pa.Table, watermark: int,
                  compression: str | None = None, source: tuple[int, int] | None = None
                  ) -> tuple[bytes, dict[str, str]]:
    """A message of exported rows (:func:`with_emit_time`'s shape; may be empty) whose
    header says every row up to ``t_emit`` ``watermark`` was published; ``source``: by
    shard ``i`` of the ``n`` that export this table (``evidence``)."""
    headers = {H_VERSION: EXPORT_VERSION, H_KIND: name, H_CONTENT_TYPE: ARROW_STREAM,
               H_WATERMARK: str(int(watermark))}
    if source is not None:
        headers[H_SOURCE] = f"{source[0]}/{source[1]}"
    return one_batch_stream(select_schema(table, schema_of(name)), compression), headers


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` as (i, n); ValueError says what is wrong."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"shard {text!r}: want I/N, such as 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"shard {text!r}: want 0 <= I < N")
    return i, n


def source_of(message: Message) -> tuple[int, int] | None:
    """The shard that published an export message (header ``failslow-source``), or None;
    :class:`DecodeError` for a malformed one."""
    text = message.headers.get(H_SOURCE)
    if text is None:
        return None
    try:
        return parse_shard(text)
    except ValueError as e:
        raise DecodeError("contract", f"{message.topic}@{message.offset}: {e}") from None


def decode_export(message: Message) -> tuple[str, pa.Table]:
    """Name and rows of an export message; :class:`DecodeError` says what is wrong."""
    name = exported_of(message.topic)
    if name is None:
        raise DecodeError("unknown_kind", f"topic {message.topic!r} carries no derived table")
    if message.headers.get(H_VERSION) != EXPORT_VERSION:
        raise DecodeError("schema_version", f"export version "
                                            f"{message.headers.get(H_VERSION)!r} is not "
                                            f"supported (expected {EXPORT_VERSION})")
    try:
        table = ipc.open_stream(pa.BufferReader(message.value)).read_all()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError, ValueError) as e:
        raise DecodeError("malformed", f"not an Arrow IPC stream ({e})") from None
    schema = schema_of(name)
    names = set(table.column_names)
    missing = [f.name for f in schema if f.name not in names]
    if missing:
        raise DecodeError("contract", f"{message.topic}@{message.offset}: no column(s) "
                                      f"{', '.join(missing)}")
    try:
        table = select_schema(table, schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise DecodeError("contract", f"{message.topic}@{message.offset}: {e}") from None
    if table.num_rows:
        if any(table.column(f.name).null_count for f in schema):
            raise DecodeError("contract", f"{message.topic}@{message.offset}: null values")
        if table.column("job").unique().to_pylist() != [message.key]:
            raise DecodeError("key", f"{message.topic}@{message.offset}: rows of other jobs "
                                     f"than {message.key!r}")
    return name, table
