"""Embedded chDB stores tables of flat columns (raw events, rounds, iterations, ...) through
its ``Python()`` table function (:func:`failslow.stream.clickhouse.insert_in_process`)
instead of clickhouse-connect's ``insert_arrow``: both paths must store the same rows, and a
repeated block must be dropped by its deduplication token on either."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from failslow.results import SPECS
from failslow.stream import clickhouse as ch

TEXT = ["", "a", "rank's \"quoted\" name", "naïve-μs", "node-17", "x" * 300]
ROWS = 2_000
DAY_NS = 1_764_201_600 * 10**9  # 2025-11-27 00:00 UTC: tables are partitioned by day


def _column(field: pa.Field, rng: np.random.Generator) -> pa.Array:
    """Values of every shape a column of this type holds: extremes, and nulls where allowed."""
    t = field.type
    if pa.types.is_string(t):
        values: Any = [TEXT[i] for i in rng.integers(0, len(TEXT), ROWS)]
    elif pa.types.is_floating(t):
        values = rng.normal(0.0, 1e6, ROWS)
    elif field.name == "t" or field.name.startswith("t_"):  # event times: one day
        values = DAY_NS + rng.integers(0, 86_400 * 10**9, ROWS)
    elif pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        values = rng.integers(info.min, info.max, ROWS, dtype=t.to_pandas_dtype(),
                              endpoint=True)
        values[:2] = (info.min, info.max)
    else:
        raise AssertionError(f"no generator for {t} ({field.name})")
    mask = rng.random(ROWS) < 0.2 if field.nullable else None
    return pa.array(values, type=t, mask=mask)


def _table(name: str, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    schema = SPECS[name].schema
    return pa.table([_column(f, rng) for f in schema], schema=schema)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ch.Store]:
    client = ch.connect(tmp_path)
    try:
        yield ch.Store(client, database="t_paths")
    finally:
        client.close()


def _rows(store: ch.Store, name: str, table: str) -> list[tuple[Any, ...]]:
    columns = ", ".join(f"`{f.name}`" for f in SPECS[name].schema)
    return list(store.client.query(f"SELECT {columns} FROM {table} ORDER BY ALL").result_rows)


@pytest.mark.parametrize("name", sorted(ch.IN_PROCESS_TABLES))
def test_in_process_insert_stores_what_insert_arrow_stores(store: ch.Store, name: str) -> None:
    client = store.client
    assert ch.is_embedded(client)
    data = _table(name, seed=len(name))
    client.command(f"CREATE TABLE t_paths.`{name}_arrow` AS t_paths.`{name}`")
    client.insert_arrow(f"t_paths.`{name}_arrow`", data)
    store.insert(name, data, token="block-1")  # the in-process path
    via_arrow = _rows(store, name, f"t_paths.`{name}_arrow`")
    if name in ch.RAW_EVENT_TABLES:  # raw events are not collapsed at insert
        assert len(via_arrow) == ROWS
    else:  # derived tables collapse the rows of one key
        assert via_arrow
    assert _rows(store, name, f"t_paths.`{name}`") == via_arrow


def test_a_repeated_block_is_dropped_by_its_token(store: ch.Store) -> None:
    data = _table("coll", seed=3)
    store.insert("coll", data, token="block-1")
    store.insert("coll", data, token="block-1")  # a replay after a crash
    store.insert("coll", data.slice(0, 10), token="block-2")
    [(count,)] = store.client.query("SELECT count() FROM t_paths.coll").result_rows
    assert count == ROWS + 10
