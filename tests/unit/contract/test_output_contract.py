"""The output contract (failslow.results): every table defined once; the Arrow schemas, the
ClickHouse DDL (single server and cluster), the sink rows and diagnosis validation derive
from it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from failslow import diagnosis, events, results
from failslow.diagnosis import Anomaly
from failslow.mitigation import planner
from failslow.stream import clickhouse as ch
from failslow.stream.sink import (
    AnomalyReport,
    anomalies_from_table,
    anomalies_table,
    diagnoses_table,
    whatif_table,
)
from failslow.stream.state import Cut, PartitionSnapshot

NAMES = [t.name for t in results.TABLES]


def _table_names(statements: list[str]) -> list[str]:
    return re.findall(r"CREATE TABLE IF NOT EXISTS `\w+`\.`(\w+)`", "\n".join(statements))


def test_schemas_derive_from_the_table_definitions() -> None:
    assert len(set(NAMES)) == len(NAMES)
    for t in results.EVENT_TABLES:  # raw events keep the event contract's columns
        assert t.schema.equals(events.SCHEMAS[t.name], check_metadata=True)
    assert set(results.SCHEMAS) == {t.name for t in results.TABLES} - set(events.SCHEMAS)
    for name, schema in results.SCHEMAS.items():
        assert schema is results.SPECS[name].schema
        assert results.empty(name).schema.equals(schema) and results.empty(name).num_rows == 0
    assert planner.ADVICE_SCHEMA is results.SCHEMAS["advice"]
    with pytest.raises(ValueError, match="unknown or repeated"):
        results.TableSpec("bad", (results.Column("a", pa.int64()),), ("b",), "")


def test_single_server_and_cluster_ddl_come_from_the_same_tables() -> None:
    single = ch.ddl("db")
    cluster = ch.ddl("db", cluster="prod")
    assert _table_names(single) == NAMES
    assert _table_names(cluster) == [n for name in NAMES for n in (f"{name}_local", name)]
    assert cluster[0] == "CREATE DATABASE IF NOT EXISTS `db` ON CLUSTER `prod`"
    for spec, plain, local, dist in zip(results.TABLES, single[1:], cluster[1::2],
                                        cluster[2::2], strict=True):
        # the local table is the single-server table, replicated
        engine = f"{spec.engine}({spec.version})" if spec.version else spec.engine
        args = ["'/clickhouse/tables/{shard}/{database}/{table}'", "'{replica}'"]
        replicated = (plain.replace(f"`db`.`{spec.name}`\n",
                                    f"`db`.`{spec.name}_local` ON CLUSTER `prod`\n")
                      .replace(f"ENGINE = {engine}\n",
                               f"ENGINE = Replicated{spec.engine}("
                               + ", ".join(args + ([spec.version] if spec.version else []))
                               + ")\n")
                      .replace("non_replicated_deduplication_window",
                               "replicated_deduplication_window"))
        assert local == replicated
        assert f"AS `db`.`{spec.name}_local`" in dist
        assert f"Distributed('prod', 'db', '{spec.name}_local', " in dist
    assert "cityHash64(job)" in cluster[2]
    assert "cityHash64(consumer_group)" in cluster[-1]
    assert ch.schema_sql(cluster="prod").count("ON CLUSTER `prod`") == 1 + 2 * len(NAMES)
    with pytest.raises(ValueError):
        ch.ddl(cluster="bad; DROP")


def test_ddl_runs_in_chdb_and_matches_the_contract(tmp_path: Path) -> None:
    """The single-server DDL creates every table with the contract's columns, types,
    engines and keys; the cluster DDL at least parses (chDB has no cluster)."""
    client = ch.connect(tmp_path)
    try:
        for statement in ch.ddl("c_db"):
            client.command(statement)
        tables = {r[0]: r[1:] for r in client.query(
            "SELECT name, engine_full, sorting_key FROM system.tables "
            "WHERE database = 'c_db'").result_rows}
        assert set(tables) == set(NAMES)
        for spec in results.TABLES:
            engine_full, sorting_key = tables[spec.name]
            engine = f"{spec.engine}({spec.version})" if spec.version else spec.engine
            assert engine_full.startswith(engine + " "), (spec.name, engine_full)
            assert sorting_key.removeprefix("(").removesuffix(")") == ", ".join(spec.order_by)
            columns = client.query(
                "SELECT name, type FROM system.columns WHERE database = 'c_db' "
                "AND table = {t:String} AND default_kind != 'ALIAS' ORDER BY position",
                parameters={"t": spec.name}).result_rows
            expected = [(f.name, ch.clickhouse_type(f, f.name in spec.low_cardinality))
                        for f in spec.schema] + [("ingested_at", "DateTime")]
            assert [tuple(c) for c in columns] == expected
        for statement in ch.ddl("c_db", cluster="prod"):
            client.query("SELECT formatQuery({q:String})", parameters={"q": statement})
    finally:
        client.close()


def test_anomaly_rows_derive_from_the_dataclass_fields() -> None:
    fields = [f.name for f in dataclasses.fields(Anomaly)]
    columns = results.SPECS["anomalies"].schema.names
    assert set(columns) - set(fields) == {"job", "version", "reported_ns"}
    a = Anomaly(id="a1", kind="slow", cause="mixed", ranks=[np.int64(3), 5],
                comm=np.uint64(2**64 - 1), stage="dp_sync", start_ns=10,
                slowdown=np.float32(1.5), R=2, extra={"z": np.int64(1), "a": [1, 2]})
    hang = Anomaly(id="h1", kind="hang", cause="hardware", ranks=[1, 2], link=[1, 2])
    table = anomalies_table([AnomalyReport("j", a, 7, 99), AnomalyReport("j", hang, 8, 99)])
    assert table.schema.equals(results.SCHEMAS["anomalies"])
    rows = table.to_pylist()
    assert rows[0]["link"] == [] and rows[1]["link"] == [1, 2]
    assert rows[0]["extra"] == '{"a": [1, 2], "z": 1}' and rows[1]["extra"] == "{}"
    assert rows[0]["version"] == 7 and rows[0]["reported_ns"] == 99 and rows[0]["R"] == 2.0
    back = anomalies_from_table(table)
    assert [j for j, _ in back] == ["j", "j"]
    assert back[1][1] == hang
    assert back[0][1].to_dict() == {**a.to_dict(), "ranks": [3, 5], "comm": 2**64 - 1,
                                    "slowdown": 1.5, "R": 2.0, "z": 1, "a": [1, 2]}
    assert anomalies_from_table(table.set_column(
        columns.index("extra"), "extra", pa.array(["", "[1]"])))[0][1].extra == {}


def test_a_record_field_without_a_column_is_refused() -> None:
    @dataclasses.dataclass
    class Wider(Anomaly):
        score: float = 0.0

    with pytest.raises(ValueError, match="no column"):
        results.record_types("anomalies", Wider)


def test_validation_types_derive_from_the_contract() -> None:
    derived = results.record_types("anomalies", Anomaly)
    del derived["extra"]
    assert derived == diagnosis._ANOMALY_TYPES
    assert diagnosis._ANOMALY_TYPES["link"] == (list, type(None))
    assert diagnosis._ANOMALY_TYPES["slowdown"] == (float, int, type(None))
    good = Anomaly(id="a", kind="slow", cause="compute", ranks=[1], slowdown=2).to_dict()
    doc = {"version": 1, "job": "j", "iterations": None, "anomalies": [good], "whatif": None}
    diagnosis.validate(doc)
    for key, bad in [("comm", "7"), ("ranks", None), ("R", True), ("id", 3)]:
        with pytest.raises(ValueError, match=rf"\.{key}: wrong type"):
            diagnosis.validate({**doc, "anomalies": [{**good, key: bad}]})


def test_json_columns_are_serialized_by_the_contract() -> None:
    result = {"slowdown": 1.25, "workers": [{"rank": np.int32(1)}], "by_op_type": {}}
    w = whatif_table([("j", 4, 100, result, 5)])
    assert w.to_pylist()[0]["result"] == json.dumps(
        {"by_op_type": {}, "slowdown": 1.25, "workers": [{"rank": 1}]})
    assert w.to_pylist()[0]["slowdown"] == 1.25
    assert results.from_table("whatif", w)[0]["result"]["workers"] == [{"rank": 1}]
    d = diagnoses_table([("j", 3, None, 2, 9)])
    assert d.schema.equals(results.SCHEMAS["diagnoses"])
    assert d.to_pylist()[0]["iterations"] == "{}"


def test_processor_checkpoints_round_trip_through_chdb(tmp_path: Path) -> None:
    store = ch.Store(ch.connect(tmp_path), "c_state")
    try:
        state = ch.ClickHouseStateStore(store)
        state.log_cuts("g", [Cut(0, 1, {"b": (5, 9), "a": (0, 3)}, 11)])
        state.save_snapshots("g", [PartitionSnapshot(0, 1, {"b": 10, "a": 4}, {"x": [1]}, 12)])
        state.log_cuts("g", [Cut(0, 2, {"a": (4, 6)}, 13)])
        snap, cuts = state.load("g", 0)
        assert snap == PartitionSnapshot(0, 1, {"a": 4, "b": 10}, {"x": [1]}, 12)
        assert cuts == [Cut(0, 2, {"a": (4, 6)}, 13)]
        text = store.run(lambda c: c.query(
            "SELECT ranges FROM c_state.processor_cuts ORDER BY seq").result_rows)
        assert text[0][0] == '{"a": [0, 3], "b": [5, 9]}'  # as before the contract
    finally:
        store.close()
