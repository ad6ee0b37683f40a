"""The ClickHouse schema carries a version (issue 15, 7): a processor that finds an older
schema adds what is missing; it refuses, in one line naming the migration, a store whose
columns it does not know or expect, and never writes into it. On the embedded chDB."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from failslow import results
from failslow.diagnosis import Anomaly
from failslow.stream import clickhouse as ch
from failslow.stream.sink import AnomalyReport, SinkBatch, anomalies_table

DB = "failslow"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Any]:
    c = ch.connect(tmp_path)
    try:
        yield c
    finally:
        c.close()


def _make_version_1(client: Any) -> None:
    """The schema as the first releases left it: no version in the comments, the what-if
    table not there yet and a column of the anomalies table missing."""
    for statement in ch.ddl(DB):
        client.command(statement)
    for spec in results.TABLES:
        client.command(f"ALTER TABLE `{DB}`.`{spec.name}` MODIFY COMMENT "
                       f"'{spec.comment.replace(chr(39), '')}'")
    client.command(f"DROP TABLE `{DB}`.`whatif`")
    client.command(f"ALTER TABLE `{DB}`.`anomalies` DROP COLUMN `reported_ns`")


def _write_anomaly(sink: ch.ClickHouseSink) -> None:
    a = Anomaly(id="slow-1", kind="slow", cause="compute", ranks=[3], start_ns=1, detected_ns=2)
    sink.write(SinkBatch({"anomalies": anomalies_table([AnomalyReport("job-1", a, 1, 5)])}))


def test_a_new_store_is_at_the_current_version(client: Any) -> None:
    found, plan = ch.upgrade_schema(client, DB)
    assert found == 0 and plan
    version, columns, _ = ch.stored_schema(client, DB)
    assert version == results.SCHEMA_VERSION
    assert set(columns) == {t.name for t in results.TABLES}
    assert ch.upgrade_schema(client, DB, dry_run=True) == (results.SCHEMA_VERSION, [])


def test_an_older_store_gets_what_is_missing(client: Any) -> None:
    _make_version_1(client)
    assert ch.stored_schema(client, DB)[0] == 1
    found, plan = ch.upgrade_schema(client, DB, dry_run=True)
    assert found == 1 and any("reported_ns" in s for s in plan)
    assert any("CREATE TABLE" in s and "`whatif`" in s for s in plan)
    sink = ch.ClickHouseSink(client, DB)  # what the processor does on connecting
    _write_anomaly(sink)
    version, columns, _ = ch.stored_schema(client, DB)
    assert version == results.SCHEMA_VERSION
    assert "reported_ns" in columns["anomalies"] and "whatif" in columns
    assert [a.id for _, a in sink.anomalies("job-1")] == ["slow-1"]


@pytest.mark.parametrize("change", ["unknown column", "other type", "newer version"])
def test_a_store_it_does_not_know_is_refused_in_one_line(client: Any, change: str) -> None:
    for statement in ch.ddl(DB):
        client.command(statement)
    table = f"`{DB}`.`anomalies`"
    if change == "unknown column":
        client.command(f"ALTER TABLE {table} ADD COLUMN `blast_radius` UInt32")
    elif change == "other type":
        client.command(f"ALTER TABLE {table} MODIFY COLUMN `slowdown` Nullable(String)")
    else:
        client.command(f"ALTER TABLE {table} MODIFY COMMENT 'anomalies [failslow schema v99]'")
    with pytest.raises(ch.SchemaError) as e:
        ch.ClickHouseSink(client, DB)
    text = str(e.value)
    assert "\n" not in text
    assert ("newer" in text) if change == "newer version" else ("anomalies" in text)
    if change == "other type":
        assert "MIGRATIONS.md" in text and "slowdown" in text
    if change == "unknown column":
        assert "blast_radius" in text
    assert client.query(f"SELECT count() FROM {table}").result_rows[0][0] == 0  # nothing written


def test_doctor_reports_the_schema_version(tmp_path: Path) -> None:
    c = ch.connect(tmp_path)
    try:
        _make_version_1(c)
    finally:
        c.close()
    out = subprocess.run([sys.executable, "-m", "failslow", "doctor", "--no-kafka",
                          "--data-dir", str(tmp_path), "--ring-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "warn  schema" in out.stdout and "version 1" in out.stdout
    c = ch.connect(tmp_path)
    try:
        c.command(f"ALTER TABLE `{DB}`.`meta` ADD COLUMN `owner` String")
    finally:
        c.close()
    out = subprocess.run([sys.executable, "-m", "failslow", "doctor", "--no-kafka",
                          "--data-dir", str(tmp_path), "--ring-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "FAIL  schema" in out.stdout and "owner" in out.stdout
