"""A fix for kafka-python 3.0 that the secured clients need: the bytes read together with
the broker's close reach the protocol before the connection is dropped.

kafka-python 3.0.12 (``kafka.net.transport``) reads a socket until it would block; when
the last read finds the peer closed, it aborts the connection and discards what it had
read. A broker that refuses a SASL login answers, then closes the connection
(``connection.failed.authentication.delay.ms``). A client that reads both at once, as a
loaded machine does, never sees the refusal and retries until its timeout: ``failslow
doctor`` then says "did not answer" instead of "authentication failed".

:func:`install` wraps ``_sock_recv`` of the TCP and TLS transports: data read before a
close is returned on its own, and the close on the next read. It changes nothing when the
transport has no ``_sock_recv`` (another kafka-python)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_MARK = "_failslow_keeps_data_before_close"
_PENDING = "_failslow_pending_error"

Recv = Callable[[Any], tuple[bytes, Any]]


def _keeping_data(recv: Recv) -> Recv:
    @functools.wraps(recv)
    def sock_recv(transport: Any) -> tuple[bytes, Any]:
        pending = getattr(transport, _PENDING, None)
        if pending is not None:
            setattr(transport, _PENDING, None)
            return b"", pending
        data, error = recv(transport)
        if data and error is not None:
            setattr(transport, _PENDING, error)
            return data, None
        return data, error

    setattr(sock_recv, _MARK, True)
    return sock_recv


def install() -> bool:
    """Patch kafka-python's transports once; True when they are (or were) patched."""
    try:
        from kafka.net import transport
    except ImportError:
        return False
    patched = False
    for name in ("KafkaTCPTransport", "KafkaSSLTransport"):
        cls = getattr(transport, name, None)
        recv = getattr(cls, "__dict__", {}).get("_sock_recv")
        if cls is None or recv is None:
            continue
        if not getattr(recv, _MARK, False):
            cls._sock_recv = _keeping_data(recv)
        patched = True
    return patched
