"""kafka-python 3.0 drops bytes read together with the broker's close (a refused SASL
login is exactly that); :mod:`failslow.stream.kafka_compat` hands them over first."""

from __future__ import annotations

import socket

import pytest

from failslow.stream import kafka_compat

transport = pytest.importorskip("kafka.net.transport")


def _transport_with_answer_then_close() -> object:
    ours, broker = socket.socketpair()
    ours.setblocking(False)
    broker.sendall(b"refused: invalid credentials")
    broker.close()  # the answer and the close are read in one go
    return transport.KafkaTCPTransport(None, ours, host="127.0.0.1")


def test_the_answer_read_with_the_close_is_delivered_before_the_close() -> None:
    assert kafka_compat.install()
    t = _transport_with_answer_then_close()
    data, error = t._sock_recv()  # type: ignore[attr-defined]
    assert data == b"refused: invalid credentials" and error is None
    data, error = t._sock_recv()  # type: ignore[attr-defined]
    assert data == b"" and "socket disconnected" in str(error)


def test_install_wraps_once() -> None:
    assert kafka_compat.install() and kafka_compat.install()
    recv = transport.KafkaTCPTransport._sock_recv
    assert getattr(recv, "__wrapped__", None) is not None
    assert getattr(recv.__wrapped__, "__wrapped__", None) is None
