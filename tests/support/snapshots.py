"""A detector state as a restarted processor reads it back: through the snapshot payload
(:func:`failslow.stream.state.pack` / :func:`~failslow.stream.state.unpack`)."""

from __future__ import annotations

from typing import Any

from failslow.stream.state import pack, unpack


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` packed and unpacked (numpy arrays come back as arrays, the rest as JSON)."""
    return unpack(pack(state))
