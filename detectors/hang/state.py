"""Snapshot state of the hang detector (version 2): JSON-ready lists, with the large int64
arrays (the ring of recent operations of thousands of ranks) as base64 text, compressed."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from failslow.detectors.hang.detector import HangDetector

VERSION = 2


def _pack(a: np.ndarray) -> str:
    """An int64 array as base64 text (compact in JSON snapshots)."""
    return base64.b64encode(np.ascontiguousarray(a, dtype="<i8").tobytes()).decode("ascii")


def _unpack(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<i8").astype(np.int64)


def _pack_z(a: np.ndarray) -> str:
    """:func:`_pack`, zstd-compressed first (the ring of recent operations of thousands of
    ranks is tens of megabytes raw, a few compressed)."""
    raw = np.ascontiguousarray(a, dtype="<i8").tobytes()
    return base64.b64encode(pa.compress(raw, codec="zstd", asbytes=True)).decode("ascii")


def _unpack_z(text: str, count: int) -> np.ndarray:
    """The ``count`` int64 values of :func:`_pack_z`."""
    raw = pa.decompress(base64.b64decode(text), decompressed_size=8 * count, codec="zstd",
                        asbytes=True)
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


def snapshot(det: HangDetector) -> dict[str, Any]:
    """The detector's state as JSON-ready values and numpy arrays."""
    fl = det.flight
    return {
        "version": VERSION, "latest": det.latest, "now": det.now, "first_t": det.ranks.first_t,
        "comms": det.comms.to_state(),
        "cr": fl.cr.to_state(), "crk": det.comms.crk.to_state(),
        "pairs": fl.pairs.to_state(),
        "inflight": {n: a.copy() for n, a in fl.fl.items()},
        "orphans": {n: a.copy() for n, a in fl.orphans.items()},
        "stats": det.durations.to_state(),
        "ranks": det.ranks.to_state(),
        "qp": det.links.to_state(),
        "signatures": det.signatures.to_state(),
        "link_period": det.links.period,
        "hangs": det.hangs.to_state(),
        "ras": det.ras.to_state(),
    }


def restore(det: HangDetector, state: dict[str, Any]) -> None:
    """Load a :func:`snapshot` into a detector of the same job and configuration."""
    if state.get("version") != VERSION:
        raise ValueError("hang detector: unknown snapshot version")
    det.latest = int(state["latest"])
    det.now = int(state["now"])
    det.ranks.first_t = int(state["first_t"])
    det.comms.load(state["comms"], state["crk"])
    det.flight.load(state["cr"], state["pairs"], state["inflight"], state["orphans"])
    det.durations.load(state["stats"])
    det.ranks.load(state["ranks"])
    det.links.load(state["qp"])
    det.links.period = int(state["link_period"])
    det.signatures.load(state["signatures"])
    det.hangs.load(state["hangs"])
    if "ras" in state:  # snapshots before RAS evidence have none
        det.ras.load(state["ras"])
