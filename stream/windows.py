"""Batching of a job's records: splitting at an alignment horizon, and the small table
helpers of the processor (the event-time windows themselves are
:func:`failslow.replay.cut`'s, the same as ``failslow analyze``'s)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from failslow.detectors.base import EventBatch
from failslow.events import NULL_TIME
from failslow.replay import TIME_COLUMN
from failslow.stream.transport import H_END, H_WATERMARK, Message


def split_at(table: pa.Table, column: str, horizon: int) -> tuple[pa.Table, pa.Table]:
    """Rows with ``column <= horizon`` and the others (a null time counts as the least),
    both in time order (ties: in table order, as :func:`failslow.replay.cut` orders them):
    zero-copy slices when the column is in order, else one stable sort. Rows out of order
    are common: messages of several agents, or of several stages' shards, interleave."""
    t = table.column(column)
    values = t.to_numpy() if t.null_count == 0 else pc.fill_null(t, NULL_TIME).to_numpy()
    if values.size > 1 and bool((values[1:] < values[:-1]).any()):
        order = np.argsort(values, kind="stable")
        table, values = table.take(pa.array(order)), values[order]
    cut = int(np.searchsorted(values, horizon, side="right"))
    return table.slice(0, cut), table.slice(cut)


def watermark(message: Message) -> int | None:
    """The producer's ``failslow-watermark`` header (ns), if any."""
    value = message.headers.get(H_WATERMARK)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def post_mortem_end(message: Message) -> bool:
    """The message ends a replayed post-mortem trace (header ``failslow-end``)."""
    return message.headers.get(H_END) == "post-mortem"


def time_span(batch: EventBatch) -> tuple[int, int] | None:
    """Smallest and largest event time of ``batch`` (None: no timed rows)."""
    lows, highs = [], []
    for kind, table in batch.items():
        column = TIME_COLUMN.get(kind)
        if column and table.num_rows:
            mm = pc.min_max(table.column(column)).as_py()
            if mm["min"] is not None:
                lows.append(int(mm["min"]))
                highs.append(int(mm["max"]))
    return (min(lows), max(highs)) if lows else None


def last_step(result: Mapping[str, Any], default: int) -> int:
    """The last step a what-if result covers (its ``steps`` list), else ``default``."""
    steps = result.get("steps") if isinstance(result, Mapping) else None
    if isinstance(steps, list) and steps:
        try:
            return int(max(steps))
        except (TypeError, ValueError):
            pass
    return int(default)


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")
