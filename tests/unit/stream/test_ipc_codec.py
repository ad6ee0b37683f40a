"""The Arrow IPC codec of published record batches (``FAILSLOW_KAFKA_COMPRESSION``): the
setting reaches every Kafka producer, consumers read any codec, and ``lz4`` trades bytes
for decoding time (``failslow bench pipeline`` measures both per stage)."""

from __future__ import annotations

import socket

import pyarrow as pa
import pytest

from failslow import events
from failslow.stream.kafka import KafkaTransport
from failslow.stream.transport import Message, decode, encode, event_headers, topic_for


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _transport(**kw: object) -> KafkaTransport:
    return KafkaTransport(f"127.0.0.1:{_closed_port()}", subscribe=(), produce=False,
                          create_topics=False, **kw)


@pytest.mark.parametrize(("env", "codec"), [(None, "zstd"), ("lz4", "lz4"), ("none", None),
                                            ("zstd", "zstd")])
def test_the_setting_names_the_producers_codec(monkeypatch: pytest.MonkeyPatch,
                                               env: str | None, codec: str | None) -> None:
    if env is None:
        monkeypatch.delenv("FAILSLOW_KAFKA_COMPRESSION", raising=False)
    else:
        monkeypatch.setenv("FAILSLOW_KAFKA_COMPRESSION", env)
    t = _transport()
    try:
        assert t.ipc_compression == codec
    finally:
        t.close()


def test_an_explicit_codec_wins_and_an_unknown_one_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAILSLOW_KAFKA_COMPRESSION", "lz4")
    t = _transport(ipc_compression=None)
    try:
        assert t.ipc_compression is None
    finally:
        t.close()
    with pytest.raises(ValueError, match="ipc_compression must be"):
        _transport(ipc_compression="brotli")


def _coll(n: int) -> pa.Table:
    rows = [{"job": "j1", "rank": i % 64, "comm": 7 + i % 5, "comm_rank": i % 8,
             "comm_size": 8, "seq": i // 64, "op": "allreduce", "bytes": 1 << 20, "peer": -1,
             "phase": "enter" if i % 2 == 0 else "end", "t": 1_700_000_000_000_000_000 + i * 997,
             "t_start": None, "send_count": None, "recv_count": None} for i in range(n)]
    return events.from_rows("coll", rows)


def test_every_codec_decodes_to_the_same_rows() -> None:
    table = _coll(5000)
    sizes = {}
    for codec in ("zstd", "lz4", None):
        value = encode("coll", table, codec)
        sizes[codec] = len(value)
        message = Message(topic=topic_for("coll"), key="j1", value=value,
                          headers=event_headers("coll"), partition=0, offset=0)
        kind, got = decode(message)
        assert kind == "coll" and got.equals(events.conform(table, "coll"))
    assert sizes["zstd"] < sizes["lz4"] < sizes[None]
