"""Where the stream processor keeps its checkpoints: the detector state of the jobs of a
partition together with the input offsets it covers, and a log of the cuts written since.

A restarted processor must neither relearn baselines nor report an anomaly again nor store a
row twice (README, Architecture; issue 6). Kafka's committed offsets alone do not give that:
the detector state (:meth:`failslow.engine.analyzer.JobAnalyzer.snapshot`) has to match them,
and a re-read input that is cut into other batches would be stored again under other
deduplication tokens. So, per consumer group and partition number:

- a *snapshot* (:class:`PartitionSnapshot`) holds the state of every job of the partition
  and the offsets (per topic, the next one to read) it corresponds to. It is taken every
  minute or so (at least 20 times its own cost apart) and at shutdown;
- a *cut* (:class:`Cut`) is logged before each sink write: the offset range of every topic
  the write covers. After a restart the processor restores the snapshot, seeks to its
  offsets and cuts the re-read input exactly at the logged cuts, so every re-written batch
  carries the token of the first write and the store drops it (insert deduplication).

The payload of a snapshot is its JSON skeleton and its numpy arrays as raw bytes, compressed
with zstd (:func:`pack` / :func:`unpack`).
:class:`MemoryStateStore` keeps everything in memory (tests);
:class:`failslow.stream.clickhouse.ClickHouseStateStore` keeps it in two ClickHouse tables
next to the data.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

PAYLOAD_CODEC = "zstd"
#: The first bytes of a packed snapshot. The older format began with its JSON length (eight
#: little-endian bytes), whose last byte is never 0xff.
MAGIC = b"FSSNAP2\xff"
#: Numpy arrays of at least this many numbers are packed as raw bytes, smaller ones as lists.
ARRAY_MIN = 64
_ARRAY_KEY = "$ndarray"


@dataclass(frozen=True)
class Cut:
    """One sink write of one partition: ``ranges`` maps each topic to the first and last
    offset the write covers. ``seq`` counts the cuts of the partition."""

    partition: int
    seq: int
    ranges: Mapping[str, tuple[int, int]]
    created_ns: int = 0

    def ends(self) -> dict[str, int]:
        """Per topic, the next offset after the cut."""
        return {t: last + 1 for t, (_, last) in self.ranges.items()}


@dataclass(frozen=True)
class PartitionSnapshot:
    """The state of one partition's jobs after cut ``seq``, at ``offsets`` (per topic, the
    next offset to read)."""

    partition: int
    seq: int
    offsets: Mapping[str, int]
    state: dict[str, Any] = field(default_factory=dict)
    created_ns: int = 0


def _json_default(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:  # numpy scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def raw_payload(state: Mapping[str, Any]) -> bytes:
    """``state`` (JSON values and numpy arrays) as bytes: a JSON skeleton in which each
    numeric array of :data:`ARRAY_MIN` or more elements is a reference, then those arrays'
    raw bytes. Detector states are mostly large arrays; as JSON lists a 4096-rank job's
    state took 5.5 s and 105 MB (docs/scaling.md, "Snapshots")."""
    blobs: list[bytes] = []

    def default(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.size >= ARRAY_MIN \
                and value.dtype.kind in "biuf":
            blobs.append(np.ascontiguousarray(value).tobytes())
            return {_ARRAY_KEY: len(blobs) - 1, "dtype": value.dtype.str,
                    "shape": list(value.shape)}
        return _json_default(value)

    skeleton = json.dumps(state, default=default, separators=(",", ":")).encode()
    lengths = [len(skeleton), *(len(b) for b in blobs)]
    return b"".join([struct.pack(f"<I{len(lengths)}Q", len(blobs), *lengths), skeleton,
                     *blobs])


def pack(state: Mapping[str, Any]) -> bytes:
    """:func:`raw_payload` compressed with zstd, after :data:`MAGIC` and its size."""
    raw = raw_payload(state)
    body = pa.Codec(PAYLOAD_CODEC, compression_level=1).compress(raw, asbytes=True)
    assert isinstance(body, bytes)
    return MAGIC + len(raw).to_bytes(8, "little") + body


def unpack(payload: bytes) -> dict[str, Any]:
    """Inverse of :func:`pack` (arrays come back as writable numpy arrays); also reads the
    older format, zstd-compressed JSON."""
    new = payload[:len(MAGIC)] == MAGIC
    at = len(MAGIC) if new else 0
    size = int.from_bytes(payload[at:at + 8], "little")
    raw = pa.Codec(PAYLOAD_CODEC).decompress(payload[at + 8:], decompressed_size=size,
                                             asbytes=True)
    if not new:
        out = json.loads(raw)
    else:
        (count,) = struct.unpack_from("<I", raw)
        lengths = struct.unpack_from(f"<{count + 1}Q", raw, 4)
        pos = 4 + 8 * (count + 1)
        skeleton = raw[pos:pos + lengths[0]]
        starts = np.cumsum([pos + lengths[0], *lengths[1:]]).tolist()
        view = memoryview(raw)

        def hook(d: dict[str, Any]) -> Any:
            i = d.get(_ARRAY_KEY)
            if i is None or len(d) != 3:
                return d
            chunk = view[starts[i]:starts[i] + lengths[i + 1]]
            return np.frombuffer(chunk, dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()

        out = json.loads(skeleton, object_hook=hook)
    if not isinstance(out, dict):
        raise ValueError("a processor snapshot must be a JSON object")
    return out


def pack_text(state: Mapping[str, Any]) -> str:
    """:func:`pack` as ASCII (for String columns read back as text)."""
    return base64.b64encode(pack(state)).decode()


def unpack_text(text: str | bytes) -> dict[str, Any]:
    return unpack(base64.b64decode(text))


class StateStore(ABC):
    """Durable cuts and snapshots per consumer group and partition number."""

    @abstractmethod
    def load(self, group: str, partition: int) -> tuple[PartitionSnapshot | None, list[Cut]]:
        """The latest snapshot of ``partition`` and the cuts logged after it (ascending)."""

    @abstractmethod
    def log_cuts(self, group: str, cuts: Iterable[Cut]) -> None:
        """Make ``cuts`` durable (before the sink writes they describe)."""

    @abstractmethod
    def save_snapshots(self, group: str, snapshots: Iterable[PartitionSnapshot]) -> None:
        """Make ``snapshots`` durable; later loads return them."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class MemoryStateStore(StateStore):
    """Keeps cuts and snapshots in memory; snapshots go through :func:`pack` as they would
    in a durable store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cuts: dict[tuple[str, int], list[Cut]] = {}
        self.snapshots: dict[tuple[str, int], tuple[int, int, dict[str, int], bytes, int]] = {}

    def load(self, group: str, partition: int) -> tuple[PartitionSnapshot | None, list[Cut]]:
        with self._lock:
            saved = self.snapshots.get((group, partition))
            cuts = list(self.cuts.get((group, partition), []))
        snap = None
        after = -1
        if saved is not None:
            p, seq, offsets, payload, created = saved
            snap = PartitionSnapshot(p, seq, dict(offsets), unpack(payload), created)
            after = seq
        return snap, sorted((c for c in cuts if c.seq > after), key=lambda c: c.seq)

    def log_cuts(self, group: str, cuts: Iterable[Cut]) -> None:
        with self._lock:
            for cut in cuts:
                self.cuts.setdefault((group, cut.partition), []).append(cut)

    def save_snapshots(self, group: str, snapshots: Iterable[PartitionSnapshot]) -> None:
        with self._lock:
            for s in snapshots:
                self.snapshots[(group, s.partition)] = (
                    s.partition, s.seq, dict(s.offsets), pack(s.state), s.created_ns)
                kept = [c for c in self.cuts.get((group, s.partition), []) if c.seq > s.seq]
                self.cuts[(group, s.partition)] = kept
