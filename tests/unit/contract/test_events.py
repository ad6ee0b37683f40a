"""The event contract in code: schemas, numpy round trips, trace directories, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import SHARED, coll_row, meta_row
from failslow import events
from failslow.events import ContractError
from failslow.tracedir import TraceDir, write_trace


def test_schemas_cover_every_kind_and_match_spec_columns() -> None:
    """Version-1 kinds as shared/spec/events.md has them, later kinds as docs/events-v2.md."""
    spec = (SHARED / "spec/events.md").read_text()
    v2 = (Path(__file__).parents[3] / "docs/events-v2.md").read_text()
    assert set(events.SCHEMAS) == set(events.KINDS)
    for kind, schema in events.SCHEMAS.items():
        text = v2 if events.ADDED_IN.get(kind, 1) == 2 else spec
        section = text.split(f"## `{kind}`" if kind in events.ADDED_IN else f"### `{kind}`")[1]
        section = section.split("## `")[0]
        for name in schema.names:
            assert name in section, f"{kind}.{name} not in events.md"


def test_numpy_round_trip_keeps_uint64_and_nulls() -> None:
    rows = [coll_row(), coll_row(phase="end", t=5_000, t_start=4_000, send_count=7)]
    table = events.from_rows("coll", rows)
    cols = events.to_columns(table, "coll")
    assert cols["comm"].dtype == np.uint64 and int(cols["comm"][0]) == 2**64 - 1
    assert list(cols["phase"]) == [events.ENTER, events.END]
    assert cols["op"][0] == events.OP["allreduce"]
    assert cols["t_start"][0] == events.NULL_TIME and cols["t_start"][1] == 4_000
    assert cols["send_count"][0] == events.NULL_COUNT
    back = events.from_columns({**cols, "job": "j1"}, "coll")
    assert back.column("t_start").to_pylist() == [None, 4_000]
    assert back.column("op").to_pylist() == ["allreduce", "allreduce"]
    assert back.column("comm").to_pylist() == [2**64 - 1] * 2


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_trace_dir_round_trip(tmp_path: Path, fmt: str) -> None:
    meta = events.parse_meta_row(meta_row())
    coll = events.from_rows("coll", [coll_row(), coll_row(rank=1, comm_rank=1, t=2_000)])
    write_trace(tmp_path, [meta], {"coll": coll}, fmt=fmt)
    trace = TraceDir(tmp_path)
    assert trace.meta() == meta
    assert trace.read("coll").to_pylist() == coll.to_pylist()
    assert trace.read("span").num_rows == 0


def test_jsonl_accepts_full_uint64_and_absent_nullables(tiny_trace: Path) -> None:
    table = TraceDir(tiny_trace).read("coll")
    assert table.column("comm").to_pylist() == [2**64 - 1] * 4
    assert table.column("t_start").to_pylist() == [None, None, 1_600, None]


def test_meta_json_list_latest_wins_and_text_fields(tmp_path: Path) -> None:
    older = meta_row(t=5, microbatches=1)
    newer = meta_row(t=9, microbatches=4, nodes=json.dumps({"0": "a", "1": "b"}))
    tie = meta_row(t=9, microbatches=8)
    (tmp_path / "meta.json").write_text(json.dumps([older, newer, tie]))
    (tmp_path / "coll.jsonl").write_text(json.dumps(coll_row()) + "\n")
    meta = TraceDir(tmp_path).meta()
    assert meta.microbatches == 8 and meta.comms[0].comm == 2**64 - 1


def _write(tmp_path: Path, lines: list[str]) -> Path:
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    (tmp_path / "coll.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.parametrize(
    ("bad_line", "message", "column"),
    [
        ('{"job": "j1", "rank": 0', "malformed JSON", None),
        (json.dumps({k: v for k, v in coll_row().items() if k != "seq"}),
         "missing required column", "seq"),
        (json.dumps(coll_row(op="allmagic")), "unknown value 'allmagic'", "op"),
        (json.dumps(coll_row(phase="begin")), "unknown value 'begin'", "phase"),
        (json.dumps(coll_row(rank="zero")), "expected int32", "rank"),
        (json.dumps(coll_row(comm=2**64)), "expected uint64", "comm"),
        (json.dumps(coll_row(job="bad job!")), "invalid job id", "job"),
    ],
)
def test_bad_jsonl_names_file_line_and_column(tmp_path: Path, bad_line: str, message: str,
                                              column: str | None) -> None:
    good = json.dumps(coll_row())
    _write(tmp_path, [good, good, bad_line, good])
    with pytest.raises(ContractError) as info:
        TraceDir(tmp_path).read("coll")
    text = str(info.value)
    assert "coll.jsonl" in text and "line 3" in text and message in text
    if column:
        assert f"column '{column}'" in text


def test_truncated_parquet_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    pq.write_table(events.from_rows("coll", [coll_row()] * 100), tmp_path / "coll.parquet")
    data = (tmp_path / "coll.parquet").read_bytes()
    (tmp_path / "coll.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(ContractError, match=r"coll\.parquet.*Parquet"):
        TraceDir(tmp_path).read("coll")


def test_parquet_missing_column_and_wrong_type(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    table = events.from_rows("coll", [coll_row()])
    pq.write_table(table.drop_columns(["bytes"]), tmp_path / "coll.parquet")
    with pytest.raises(ContractError, match=r"coll\.parquet, column 'bytes': missing required"):
        TraceDir(tmp_path).read("coll")
    wrong = table.set_column(table.schema.get_field_index("t"), "t",
                             pa.array(["soon"], pa.string()))
    pq.write_table(wrong, tmp_path / "coll.parquet")
    with pytest.raises(ContractError, match=r"column 't': expected int64, found string"):
        TraceDir(tmp_path).read("coll")


def test_parquet_value_error_names_row(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    rows = [coll_row(seq=i, comm=5) for i in range(10)]
    rows[7]["op"] = "gather"
    table = pa.Table.from_pylist(rows)  # inferred types, as a foreign writer would
    pq.write_table(table, tmp_path / "coll.parquet")
    with pytest.raises(ContractError, match=r"row 7, column 'op': unknown value 'gather'"):
        TraceDir(tmp_path).read("coll")


def test_int64_values_out_of_int32_range_are_named(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    rows = [coll_row(rank=i, comm=5) for i in range(5)]
    rows[3]["rank"] = 2**40
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "coll.parquet")
    with pytest.raises(ContractError, match=r"row 3, column 'rank'"):
        TraceDir(tmp_path).read("coll")


def test_meta_errors(tmp_path: Path) -> None:
    (tmp_path / "coll.jsonl").write_text(json.dumps(coll_row()) + "\n")
    with pytest.raises(ContractError, match="missing meta.json"):
        TraceDir(tmp_path).meta()
    (tmp_path / "meta.json").write_text(json.dumps(meta_row(tp=3)))
    with pytest.raises(ContractError, match="tp\\*pp\\*dp\\*cp"):
        TraceDir(tmp_path).meta()
    (tmp_path / "meta.json").write_text(json.dumps(meta_row(comms="[{bad")))
    with pytest.raises(ContractError, match="column 'comms': malformed JSON"):
        TraceDir(tmp_path).meta()
    (tmp_path / "meta.json").write_text(json.dumps(meta_row(schedule="zigzag")))
    with pytest.raises(ContractError, match="column 'schedule'"):
        TraceDir(tmp_path).meta()


def test_missing_coll_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    with pytest.raises(ContractError, match="no coll.parquet or coll.jsonl"):
        TraceDir(tmp_path)


def test_extra_columns_are_kept(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    table = pa.Table.from_pylist([coll_row(comm=5) | {"stream": 3}])
    pq.write_table(table, tmp_path / "coll.parquet")
    out = TraceDir(tmp_path).read("coll")
    assert out.column("stream").to_pylist() == [3]
    assert out.schema.field("comm").type == pa.uint64()
