"""Transport: Arrow IPC encoding, validation on decode, the in-process broker."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from support import stream_synth as synth

from failslow import events
from failslow.diagnosis import Anomaly
from failslow.stream import transport as tr
from failslow.stream.transport import DecodeError, InProcessTransport, Message


def _message(kind: str, table: pa.Table, key: str = "synth-1", **headers: str) -> Message:
    h = tr.event_headers(kind)
    h.update(headers)
    return Message(tr.topic_for(kind), key, tr.encode(kind, table), h, offset=7)


def test_round_trip_keeps_values_nulls_and_extra_columns() -> None:
    table = synth.coll(iterations=3)
    table = table.append_column("extra_note", pa.array(["x"] * table.num_rows))
    kind, back = tr.decode(_message("coll", table))
    assert kind == "coll"
    assert back.column_names[: len(events.SCHEMAS["coll"])] == events.SCHEMAS["coll"].names
    assert back.equals(events.conform(table, "coll"))
    assert back.column("comm").to_pylist()[0] == 2**64 - 1  # full uint64 range survives
    assert back.column("t_start").null_count == table.num_rows // 2


def test_one_message_is_one_record_batch_even_for_chunked_tables() -> None:
    table = synth.coll(iterations=4)
    chunked = pa.concat_tables([table.slice(0, 10), table.slice(10)])
    assert chunked.column("rank").num_chunks == 2
    reader = ipc.open_stream(pa.BufferReader(tr.encode("coll", chunked)))
    assert len(list(reader)) == 1


def test_empty_table_round_trips() -> None:
    kind, back = tr.decode(_message("coll", events.empty("coll")))
    assert kind == "coll" and back.num_rows == 0


def test_meta_round_trip() -> None:
    meta = synth.meta()
    kind, back = tr.decode(_message("meta", events.from_rows("meta", [meta.to_row()])))
    assert kind == "meta"
    assert events.parse_meta_row(back.to_pylist()[0]) == meta


@pytest.mark.parametrize("value", [b"", b"not arrow at all", b"\xff\xff\xff\xff\x00\x00"])
def test_malformed_bytes(value: bytes) -> None:
    msg = Message("failslow.coll", "synth-1", value, tr.event_headers("coll"))
    with pytest.raises(DecodeError) as e:
        tr.decode(msg)
    assert e.value.reason_class == "malformed"


def test_wrong_schema_is_a_contract_error_naming_the_column() -> None:
    bad = synth.coll(iterations=1).drop_columns(["seq"])
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, bad.schema) as w:
        w.write_table(bad)
    msg = Message("failslow.coll", "synth-1", bytes(sink.getvalue()), tr.event_headers("coll"))
    with pytest.raises(DecodeError) as e:
        tr.decode(msg)
    assert e.value.reason_class == "contract" and "seq" in str(e.value)


def test_bad_enum_value_is_a_contract_error() -> None:
    table = synth.coll(iterations=1)
    table = table.set_column(table.schema.get_field_index("op"), "op",
                             pa.array(["allreduce_v2"] * table.num_rows))
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    msg = Message("failslow.coll", "synth-1", bytes(sink.getvalue()), tr.event_headers("coll"))
    with pytest.raises(DecodeError, match="allreduce_v2") as e:
        tr.decode(msg)
    assert e.value.reason_class == "contract"


def test_unknown_kind_and_kind_header_mismatch() -> None:
    value = tr.encode("coll", synth.coll(iterations=1))
    with pytest.raises(DecodeError) as e:
        tr.decode(Message("failslow.bogus", "synth-1", value, tr.event_headers("coll")))
    assert e.value.reason_class == "unknown_kind"
    with pytest.raises(DecodeError) as e:
        tr.decode(Message("failslow.coll", "synth-1", value, tr.event_headers("gpu")))
    assert e.value.reason_class == "unknown_kind"


@pytest.mark.parametrize("version", ["3", "0", "", None])
def test_schema_version_header_is_checked(version: str | None) -> None:
    headers = tr.event_headers("coll")
    if version is None:
        del headers[tr.H_VERSION]
    else:
        headers[tr.H_VERSION] = version
    msg = Message("failslow.coll", "synth-1", tr.encode("coll", synth.coll(iterations=1)),
                  headers)
    with pytest.raises(DecodeError) as e:
        tr.decode(msg)
    assert e.value.reason_class == "schema_version"


def test_version_1_messages_are_still_read() -> None:
    """Contract v2 only adds kinds: a producer still on v1 is read as before."""
    headers = tr.event_headers("coll")
    assert headers[tr.H_VERSION] == "2"
    headers[tr.H_VERSION] = "1"
    table = synth.coll(iterations=1)
    msg = Message("failslow.coll", "synth-1", tr.encode("coll", table), headers)
    kind, decoded = tr.decode(msg)
    assert kind == "coll" and decoded.num_rows == table.num_rows


def test_key_must_be_the_rows_job() -> None:
    with pytest.raises(DecodeError) as e:
        tr.decode(_message("coll", synth.coll(iterations=1), key="other-job"))
    assert e.value.reason_class == "key"


def test_two_batches_in_one_message_are_rejected() -> None:
    table = synth.coll(iterations=2)
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=4):
            w.write_batch(b)
    msg = Message("failslow.coll", "synth-1", bytes(sink.getvalue()), tr.event_headers("coll"))
    with pytest.raises(DecodeError, match="one record batch"):
        tr.decode(msg)


def test_anomaly_message_round_trip() -> None:
    a = Anomaly(id="x", kind="slow", cause="communication", ranks=[3], link=[3, 5],
                comm=2**64 - 1, start_ns=5, slowdown=1.5, extra={"score": 0.7})
    value, headers = tr.encode_anomaly("synth-1", a, 42)
    job, version, back = tr.decode_anomaly(Message(tr.ANOMALIES_TOPIC, "synth-1", value,
                                                   headers))
    assert (job, version, back) == ("synth-1", 42, a)
    assert headers[tr.H_CONTENT_TYPE] == tr.JSON


def test_in_process_order_commit_and_redelivery() -> None:
    bus = InProcessTransport()
    bus.publish_meta(synth.meta())
    coll = synth.coll(iterations=2)
    for i in range(3):
        bus.publish("failslow.coll", "synth-1", coll.slice(i, 1))
    bus.produce(tr.ANOMALIES_TOPIC, "synth-1", b"{}")  # not subscribed: never delivered
    first = bus.poll(max_messages=2)
    assert [(m.topic, m.offset) for m in first] == [("failslow.meta", 0), ("failslow.coll", 0)]
    bus.commit()
    second = bus.poll(max_messages=10)
    assert [(m.topic, m.offset) for m in second] == [("failslow.coll", 1), ("failslow.coll", 2)]
    assert bus.committed("failslow.coll") == 1 and bus.lag() == 2
    bus.seek_to_committed()  # a restarted consumer gets the uncommitted messages again
    again = bus.poll(max_messages=10)
    assert [m.offset for m in again] == [1, 2]
    bus.commit()
    assert bus.poll() == [] and bus.lag() == 0
    assert bus.committed("failslow.coll") == 3 == bus.end_offset("failslow.coll")


def test_keep_committed_false_trims_the_log() -> None:
    bus = InProcessTransport(keep_committed=False)
    for i in range(5):
        bus.publish("failslow.coll", "synth-1", synth.coll(iterations=1).slice(i, 1))
    assert len(bus.poll(max_messages=3)) == 3
    bus.commit()
    assert [m.offset for m in bus.messages("failslow.coll")] == [3, 4]
    assert [m.offset for m in bus.poll()] == [3, 4]


def test_poll_waits_for_a_producer_thread() -> None:
    bus = InProcessTransport()
    assert bus.poll(timeout=0.0) == []

    def produce() -> None:
        time.sleep(0.05)
        bus.publish_meta(synth.meta())

    thread = threading.Thread(target=produce)
    thread.start()
    got = bus.poll(timeout=5.0)  # blocked when the other thread publishes
    thread.join()
    assert [m.topic for m in got] == ["failslow.meta"]


def test_publish_refuses_non_event_topics_and_bad_tables() -> None:
    bus = InProcessTransport()
    with pytest.raises(ValueError):
        bus.publish(tr.ANOMALIES_TOPIC, "synth-1", synth.coll(iterations=1))
    with pytest.raises(events.ContractError):
        bus.publish("failslow.coll", "synth-1", synth.coll(iterations=1).drop_columns(["t"]))
