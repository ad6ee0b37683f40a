"""Reader (and a single-producer writer) of the native collectors' shared-memory ring.

The native collectors (``native/``: the NCCL API interposer, the NCCL profiler plugin and the
RDMA verbs shim) write fixed 128-byte records into one memory-mapped ring file per process and
collector, ``$FAILSLOW_RING_DIR/failslow-<job>-<pid>-<collector>.ring``. The layout is defined
once, in ``native/include/failslow_ring.h``; :data:`RECORD_DTYPE` and :data:`HEADER_DTYPE` mirror
it byte for byte (``tests/integration/native/test_native_ring.py`` compares them with offsets
printed by C).

What the records carry is the telemetry of the papers: API-call (enter) and completion (end)
times of every collective / point-to-point operation keyed by CCL-D's Trace ID (communicator,
per-communicator operation counter; ccl-d.md §5.1), host-driven completion and step counts
(§5.2), and MegaTrace's work-request counters -- posted, completed, bytes -- per NIC
(megatrace.md §III-B). :func:`to_tables` turns a drained record array into the ``coll``,
``progress`` and ``link`` tables of the event contract (shared/spec/events.md).

Draining never copies record by record: the mapped records are a numpy view; the published
prefix is found with one vectorized comparison of the commit words against the expected index,
copied out with at most two slice copies, and released by advancing ``read_idx``.

Memory ordering: numpy reads and writes the mapping with plain loads and stores, so the
reader and writer place fences where the C side uses acquire/release atomics (commit words
read, *acquire*, payload copied, *release*, ``read_idx`` stored; the writer mirrors it). On
x86-64 the hardware (TSO) already keeps those orders and each numpy call is opaque to the
compiler, so no fence is needed; on other machines (aarch64) the fences are
``fs_fence_acquire``/``fs_fence_release`` of ``libfailslow_ring.so`` called through ctypes, and
without that library rings are refused (:func:`memory_order`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import mmap
import os
import platform
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa

from failslow import events

__all__ = [
    "RECORD_DTYPE", "HEADER_DTYPE", "MAGIC", "VERSION", "HEADER_SIZE", "RECORD_SIZE",
    "KIND_COLL", "KIND_PROGRESS", "KIND_LINK", "KIND_COMM", "KIND_GROUP",
    "CTL_PAUSE", "CTL_DETAIL", "RingError", "RingInfo", "RingReader", "RingWriter",
    "find_rings", "to_tables", "comm_table", "empty_records", "MemoryOrder", "memory_order",
]

MAGIC = 0x31474E4952534C46  # "FLSRING1"
VERSION = 1
HEADER_SIZE = 512
RECORD_SIZE = 128

KIND_COLL, KIND_PROGRESS, KIND_LINK, KIND_COMM, KIND_GROUP = 1, 2, 3, 4, 5
OP_UNKNOWN = 255
SRC_INTERPOSER, SRC_PROFILER, SRC_VERBS, SRC_TEST = 1, 2, 3, 4

FLAG_ENTER_AT_LAUNCH = 0x01
FLAG_INFERRED_END = 0x02
FLAG_LOCAL_COMM = 0x04
FLAG_GRAPH = 0x08
FLAG_ERROR = 0x10
FLAG_UNTRACKED = 0x20
FLAG_NONBLOCKING = 0x40
FLAG_EARLY_END = 0x80
FLAG_QP = 0x100
FLAG_ABORT = 0x200

CTL_PAUSE = 0x1
CTL_DETAIL = 0x2

CAP_END_ROWS = 0x1
CAP_T_START = 0x2
CAP_COUNTS = 0x4
CAP_LINK = 0x8

_RECORD_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("commit", "<u8", 0), ("kind", "u1", 8), ("op", "u1", 9), ("phase", "u1", 10),
    ("source", "u1", 11), ("rank", "<i4", 12), ("comm_rank", "<i4", 16),
    ("comm_size", "<i4", 20), ("peer", "<i4", 24), ("device", "<i4", 28), ("comm", "<u8", 32),
    ("seq", "<u8", 40), ("bytes", "<u8", 48), ("t_ns", "<i8", 56), ("t_start_ns", "<i8", 64),
    ("send_count", "<u8", 72), ("recv_count", "<u8", 80), ("posted", "<u8", 88),
    ("completed", "<u8", 96), ("flags", "<u4", 104), ("qp_num", "<u4", 108), ("name", "S16", 112),
)
_HEADER_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("magic", "<u8", 0), ("version", "<u4", 8), ("header_size", "<u4", 12),
    ("record_size", "<u4", 16), ("collector", "<u4", 20), ("capacity", "<u8", 24),
    ("pid", "<i4", 32), ("rank", "<i4", 36), ("local_rank", "<i4", 40), ("world_size", "<i4", 44),
    ("created_ns", "<i8", 48), ("job", "S72", 56), ("host", "S64", 128),
    ("write_idx", "<u8", 192), ("read_idx", "<u8", 256), ("dropped", "<u8", 320),
    ("pool_dropped", "<u8", 328), ("control", "<u4", 336), ("closed", "<u4", 340),
    ("caps", "<u4", 344), ("heartbeat_ns", "<u8", 352),
)


def _dtype(fields: tuple[tuple[str, str, int], ...], size: int) -> np.dtype[Any]:
    return np.dtype({"names": [f[0] for f in fields], "formats": [f[1] for f in fields],
                     "offsets": [f[2] for f in fields], "itemsize": size})


#: One ring record (``struct fs_record``), 128 bytes.
RECORD_DTYPE: np.dtype[Any] = _dtype(_RECORD_FIELDS, RECORD_SIZE)
#: The ring header (``struct fs_ring_header``), 512 bytes.
HEADER_DTYPE: np.dtype[Any] = _dtype(_HEADER_FIELDS, HEADER_SIZE)

# 8-byte word indices of the header fields the reader updates or polls.
_W_WRITE, _W_READ, _W_DROPPED, _W_POOL = 192 // 8, 256 // 8, 320 // 8, 328 // 8
_W_HEARTBEAT = 352 // 8
_D_CONTROL, _D_CLOSED, _D_CAPS = 336 // 4, 340 // 4, 344 // 4

_RING_NAME = re.compile(r"^failslow-(?P<job>[A-Za-z0-9._-]+)-(?P<pid>\d+)-(?P<tag>[a-z]+)\.ring$")


class RingError(ValueError):
    """A file that is not a ring of this layout version (or rings unusable on this machine)."""


#: Machines whose hardware memory model (TSO) orders the ring's plain loads and stores.
TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


@dataclass(frozen=True)
class MemoryOrder:
    """The fences the Python reader and writer put between their plain accesses.

    ``acquire``/``release`` are ``None`` where the hardware already orders them (TSO);
    ``source`` says where the fences come from (``"tso"`` or the library path)."""

    machine: str
    source: str
    acquire: Callable[[], object] | None = None
    release: Callable[[], object] | None = None


def _fence_library_candidates() -> list[str]:
    found = ctypes.util.find_library("failslow_ring")
    out = [found] if found else []
    out.append(str(Path(__file__).resolve().parents[1] / "native" / "build"
                   / "libfailslow_ring.so"))  # `make -C native` in a source checkout
    return out


@functools.cache
def memory_order(machine: str | None = None, library: str | None = None) -> MemoryOrder:
    """Fences for ``machine`` (default: this one); ``library``: the ``libfailslow_ring.so``
    to take them from (default: the library search path, then ``native/build``).

    Raises :class:`RingError` (one line) on a machine without TSO when no library loads."""
    mach = (machine or platform.machine()).lower()
    if mach in TSO_MACHINES:
        return MemoryOrder(mach, "tso")
    for cand in [library] if library else _fence_library_candidates():
        try:
            lib = ctypes.CDLL(cand)
            acquire, release = lib.fs_fence_acquire, lib.fs_fence_release
        except (OSError, AttributeError):
            continue
        acquire.restype = release.restype = None
        acquire.argtypes = release.argtypes = []
        return MemoryOrder(mach, cand, acquire, release)
    raise RingError(f"failslow rings on {mach} need the memory fences of libfailslow_ring.so "
                    "(build it with `make -C native`); not found, refusing to use rings")


@dataclass(frozen=True)
class RingInfo:
    """The static part of a ring header."""

    path: Path
    job: str
    host: str
    pid: int
    rank: int
    local_rank: int
    world_size: int
    collector: int
    capacity: int
    caps: int
    created_ns: int


def empty_records(n: int = 0) -> np.ndarray:
    """A zeroed record array (``RECORD_DTYPE``) of length ``n``."""
    return np.zeros(n, dtype=RECORD_DTYPE)


class RingReader:
    """Maps one ring file and drains it (the agent side; one reader per ring).

    >>> with RingReader(path) as ring:          # doctest: +SKIP
    ...     recs = ring.drain()
    ...     tables = ring.tables(recs)
    """

    def __init__(self, path: str | os.PathLike[str], *, order: MemoryOrder | None = None) -> None:
        self.path = Path(path)
        self.order = order or memory_order()
        self._file = open(self.path, "r+b")  # noqa: SIM115 -- kept open with the mapping
        try:
            size = os.fstat(self._file.fileno()).st_size
            if size < HEADER_SIZE:
                raise RingError(f"{self.path}: {size} bytes, shorter than a ring header")
            self._mm = mmap.mmap(self._file.fileno(), size, access=mmap.ACCESS_WRITE)
        except BaseException:
            self._file.close()
            raise
        hdr = np.frombuffer(self._mm, dtype=HEADER_DTYPE, count=1)[0]
        cap = int(hdr["capacity"])
        if (int(hdr["magic"]) != MAGIC or int(hdr["version"]) != VERSION
                or int(hdr["header_size"]) != HEADER_SIZE
                or int(hdr["record_size"]) != RECORD_SIZE or cap <= 0 or cap & (cap - 1)
                or size != HEADER_SIZE + cap * RECORD_SIZE):
            self.close()
            raise RingError(f"{self.path}: not a failslow ring of version {VERSION} "
                            "(bad magic, version, sizes or capacity)")
        self.capacity = cap
        self._mask = cap - 1
        self._u64 = np.frombuffer(self._mm, dtype="<u8", count=HEADER_SIZE // 8)
        self._u32 = np.frombuffer(self._mm, dtype="<u4", count=HEADER_SIZE // 4)
        self._records = np.frombuffer(self._mm, dtype=RECORD_DTYPE, count=cap, offset=HEADER_SIZE)
        self._commit = self._records["commit"]
        # the same memory as raw bytes: a structured copy is ~10x slower than a byte copy
        self._raw = np.frombuffer(self._mm, dtype=np.uint8, count=cap * RECORD_SIZE,
                                  offset=HEADER_SIZE).reshape(cap, RECORD_SIZE)
        self.info = RingInfo(
            path=self.path, job=_cstr(hdr["job"]), host=_cstr(hdr["host"]), pid=int(hdr["pid"]),
            rank=int(hdr["rank"]), local_rank=int(hdr["local_rank"]),
            world_size=int(hdr["world_size"]), collector=int(hdr["collector"]), capacity=cap,
            caps=int(hdr["caps"]), created_ns=int(hdr["created_ns"]))

    # -- live header fields --------------------------------------------------------------

    @property
    def write_index(self) -> int:
        return int(self._u64[_W_WRITE])

    @property
    def read_index(self) -> int:
        return int(self._u64[_W_READ])

    @property
    def pending(self) -> int:
        """Records reserved by producers and not drained yet."""
        return self.write_index - self.read_index

    @property
    def dropped(self) -> int:
        """Records lost because the ring was full (the producer never waits)."""
        return int(self._u64[_W_DROPPED])

    @property
    def pool_dropped(self) -> int:
        """Events a collector dropped because one of its fixed pools was exhausted."""
        return int(self._u64[_W_POOL])

    @property
    def caps(self) -> int:
        """``FS_CAP_*`` bits: e.g. whether a missing ``end`` row means "in flight"."""
        return int(self._u32[_D_CAPS])

    @property
    def closed(self) -> bool:
        """True once the producer process finished (its library destructor ran)."""
        return bool(self._u32[_D_CLOSED])

    @property
    def heartbeat_ns(self) -> int:
        return int(self._u64[_W_HEARTBEAT])

    @property
    def control(self) -> int:
        return int(self._u32[_D_CONTROL])

    @control.setter
    def control(self, value: int) -> None:
        self._u32[_D_CONTROL] = np.uint32(value)

    def set_detail(self, on: bool) -> None:
        """Switch the optional detail records on or off (read by producers on every event)."""
        self.control = (self.control | CTL_DETAIL) if on else (self.control & ~CTL_DETAIL)

    def set_paused(self, on: bool) -> None:
        """Pause recording (operations are still counted, so ``seq`` stays aligned)."""
        self.control = (self.control | CTL_PAUSE) if on else (self.control & ~CTL_PAUSE)

    def alive(self) -> bool:
        """Whether the producer process still exists (and the ring is not closed)."""
        if self.closed:
            return False
        try:
            os.kill(self.info.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    # -- draining -------------------------------------------------------------------------

    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Copy out the published records in order and release their slots.

        Stops at the first slot that is reserved but not yet published (a producer between
        reservation and commit); the rest comes with the next call.
        """
        r = int(self._u64[_W_READ])
        n = int(self._u64[_W_WRITE]) - r
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return empty_records()
        start = r & self._mask
        first = min(n, self.capacity - start)
        expected = np.arange(r + 1, r + 1 + n, dtype=np.uint64)
        ok1 = self._commit[start:start + first] == expected[:first]
        if n > first:
            ok = np.concatenate([ok1, self._commit[:n - first] == expected[first:]])
        else:
            ok = ok1
        if not ok.all():
            n = int(np.argmin(ok))
            first = min(first, n)
        acquire, release = self.order.acquire, self.order.release
        if acquire is not None:
            acquire()  # the payloads are read after the commit words that published them
        out = np.empty(n, dtype=RECORD_DTYPE)
        raw = out.view(np.uint8).reshape(n, RECORD_SIZE)
        raw[:first] = self._raw[start:start + first]
        if n > first:
            raw[first:] = self._raw[:n - first]
        if n:
            if release is not None:
                release()  # the copies are complete before the slots are handed back
            self._u64[_W_READ] = np.uint64(r + n)
        return out

    def tables(self, records: np.ndarray, *, node: str | None = None,
               **kwargs: Any) -> dict[str, pa.Table]:
        """:func:`to_tables` with job, rank and node taken from this ring's header."""
        return to_tables(records, job=self.info.job, node=node or self.info.host or "unknown",
                         rank=self.info.rank, **kwargs)

    def close(self) -> None:
        for name in ("_records", "_commit", "_raw", "_u64", "_u32"):
            if hasattr(self, name):
                delattr(self, name)
        mm = getattr(self, "_mm", None)
        if mm is not None:
            with contextlib.suppress(BufferError):  # a caller still holds a view: GC closes it
                mm.close()
        self._file.close()

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class RingWriter:
    """A single-producer writer in Python (tests, benchmarks, Python-side collectors).

    It creates its own ring file; it must not share a ring with native producers (they reserve
    slots with a CAS, this writer publishes a whole batch at once).
    """

    def __init__(self, path: str | os.PathLike[str], capacity: int, *, job: str = "default",
                 rank: int = -1, collector: int = SRC_TEST, caps: int = 0,
                 order: MemoryOrder | None = None) -> None:
        cap = 1 << max(6, int(capacity - 1).bit_length())
        self.path = Path(path)
        self.order = order or memory_order()
        size = HEADER_SIZE + cap * RECORD_SIZE
        with open(self.path, "wb") as f:
            f.truncate(size)
        self._file = open(self.path, "r+b")  # noqa: SIM115 -- kept open with the mapping
        self._mm = mmap.mmap(self._file.fileno(), size, access=mmap.ACCESS_WRITE)
        hdr = np.frombuffer(self._mm, dtype=HEADER_DTYPE, count=1)
        h = np.zeros(1, dtype=HEADER_DTYPE)
        h["version"], h["header_size"], h["record_size"] = VERSION, HEADER_SIZE, RECORD_SIZE
        h["collector"], h["capacity"], h["pid"], h["rank"] = collector, cap, os.getpid(), rank
        h["local_rank"], h["world_size"], h["caps"] = -1, -1, caps
        h["created_ns"] = time.time_ns()
        h["job"], h["host"] = job.encode()[:64], socket.gethostname().encode()[:63]
        hdr[0] = h[0]
        self._u64 = np.frombuffer(self._mm, dtype="<u8", count=HEADER_SIZE // 8)
        if self.order.release is not None:
            self.order.release()
        self._u64[0] = np.uint64(MAGIC)  # published last
        self.capacity = cap
        self._records = np.frombuffer(self._mm, dtype=RECORD_DTYPE, count=cap, offset=HEADER_SIZE)

    def write(self, records: np.ndarray) -> int:
        """Publish ``records`` (``RECORD_DTYPE``); returns how many fit (the rest is dropped)."""
        w = int(self._u64[_W_WRITE])
        free = self.capacity - (w - int(self._u64[_W_READ]))
        n = max(0, min(len(records), free))
        if len(records) > n:
            self._u64[_W_DROPPED] = np.uint64(int(self._u64[_W_DROPPED]) + len(records) - n)
        if n == 0:
            return 0
        mask = np.uint64(self.capacity - 1)
        slots = (np.arange(w, w + n, dtype=np.uint64) & mask).astype(np.intp)
        batch = np.array(records[:n], dtype=RECORD_DTYPE)
        batch["commit"] = self._records["commit"][slots]  # payload first, commit words after
        self.fence_acquire()  # the freed slots are written after read_idx was read
        self._records[slots] = batch
        self.fence_release()  # ... and published after their payloads
        self._records["commit"][slots] = np.arange(w + 1, w + 1 + n, dtype=np.uint64)
        self._u64[_W_WRITE] = np.uint64(w + n)
        return n

    def fence_acquire(self) -> None:
        """Order the loads before (``read_idx``) before the stores after (the slots)."""
        if self.order.acquire is not None:
            self.order.acquire()

    def fence_release(self) -> None:
        """Order the stores before (a payload) before the stores after (its commit word)."""
        if self.order.release is not None:
            self.order.release()

    def close(self, *, mark_closed: bool = True) -> None:
        if mark_closed:
            np.frombuffer(self._mm, dtype="<u4", count=HEADER_SIZE // 4)[_D_CLOSED] = 1
        del self._records, self._u64
        self._mm.close()
        self._file.close()


def _cstr(value: bytes | np.bytes_) -> str:
    return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")


def find_rings(directory: str | os.PathLike[str] = "/dev/shm", job: str | None = None,
               collector: str | None = None) -> list[Path]:
    """Ring files in ``directory`` (optionally of one job / collector tag), sorted by name."""
    out = []
    for p in Path(directory).glob("failslow-*.ring"):
        m = _RING_NAME.match(p.name)
        if m and (job is None or m["job"] == job) and (collector is None or m["tag"] == collector):
            out.append(p)
    return sorted(out)


def _fill_rank(rank_col: np.ndarray, rank: int | None) -> np.ndarray:
    out = rank_col.astype(np.int32)
    if rank is not None and rank >= 0:
        out = np.where(out < 0, np.int32(rank), out)
    return out


def to_tables(records: np.ndarray, *, job: str, node: str, rank: int | None = None,
              keep_graph: bool = False, include_qp: bool = False) -> dict[str, pa.Table]:
    """Contract tables (``coll``, ``progress``, ``link``) from drained records.

    ``rank`` replaces the records' unknown global rank (-1), normally the ring header's rank.
    Operations outside the contract's operation list are left out, and so are operations
    recorded during CUDA graph capture unless ``keep_graph``. Link samples are per device;
    per-queue-pair samples (detail mode) are included with ``include_qp`` as device
    ``"<nic>/qp<N>"``. Raises :class:`failslow.events.ContractError` (e.g. an unknown rank).
    """
    kind = records["kind"]
    flags = records["flags"]
    out: dict[str, pa.Table] = {}

    def pick(sel: np.ndarray, *names: str) -> dict[str, np.ndarray]:
        # field by field: selecting whole structured rows is an order of magnitude slower
        idx = np.flatnonzero(sel)
        return {n: records[n][idx] for n in names}

    sel = (kind == KIND_COLL) & (records["op"] < len(events.COLL_OPS))
    if not keep_graph:
        sel &= (flags & FLAG_GRAPH) == 0
    c = pick(sel, "rank", "comm", "comm_rank", "comm_size", "seq", "op", "bytes", "peer", "phase",
             "t_ns", "t_start_ns", "send_count", "recv_count")
    out["coll"] = events.from_columns({
        "job": job, "rank": _fill_rank(c["rank"], rank), "comm": c["comm"],
        "comm_rank": c["comm_rank"], "comm_size": c["comm_size"], "seq": c["seq"],
        "op": c["op"].astype(np.int8), "bytes": c["bytes"], "peer": c["peer"],
        "phase": c["phase"].astype(np.int8), "t": c["t_ns"], "t_start": c["t_start_ns"],
        "send_count": c["send_count"], "recv_count": c["recv_count"],
    }, "coll")

    p = pick(kind == KIND_PROGRESS, "rank", "comm", "seq", "t_ns", "send_count", "recv_count")
    out["progress"] = events.from_columns({
        "job": job, "rank": _fill_rank(p["rank"], rank), "comm": p["comm"], "seq": p["seq"],
        "t": p["t_ns"], "send_count": p["send_count"], "recv_count": p["recv_count"],
    }, "progress")

    sel = kind == KIND_LINK
    if not include_qp:
        sel &= (flags & FLAG_QP) == 0
    lk = pick(sel, "rank", "name", "flags", "qp_num", "t_ns", "posted", "completed", "bytes")
    device = lk["name"].astype("U16")
    qp = (lk["flags"] & FLAG_QP) != 0
    if qp.any():
        device = np.where(qp, np.char.add(np.char.add(device, "/qp"),
                                          lk["qp_num"].astype("U10")), device)
    out["link"] = events.from_columns({
        "job": job, "node": node, "rank": _fill_rank(lk["rank"], rank),
        "device": device.astype(object), "peer_node": None, "t": lk["t_ns"],
        "posted": lk["posted"], "completed": lk["completed"], "bytes": lk["bytes"],
    }, "link")
    return out


def comm_table(records: np.ndarray, rank: int | None = None) -> pa.Table:
    """Communicator lifecycle rows (what the agent needs for ``meta.comms``).

    Columns: ``comm``, ``rank`` (global), ``comm_rank``, ``comm_size``, ``device``, ``t``,
    ``event`` (``init``/``destroy``/``abort``), ``parent`` (split parent id, 0 if none),
    ``local_id`` (True when the id is not shared by the members), ``name``.
    """
    c = records[records["kind"] == KIND_COMM]
    flags = c["flags"]
    event = np.where(c["phase"] == 0, "init",
                     np.where((flags & FLAG_ABORT) != 0, "abort", "destroy"))
    return pa.table({
        "comm": pa.array(c["comm"], pa.uint64()),
        "rank": pa.array(_fill_rank(c["rank"], rank), pa.int32()),
        "comm_rank": pa.array(c["comm_rank"], pa.int32()),
        "comm_size": pa.array(c["comm_size"], pa.int32()),
        "device": pa.array(c["device"], pa.int32()),
        "t": pa.array(c["t_ns"], pa.int64()),
        "event": pa.array(event.astype(object), pa.string()),
        "parent": pa.array(np.where(c["source"] == SRC_INTERPOSER, c["seq"], 0), pa.uint64()),
        "local_id": pa.array((flags & FLAG_LOCAL_COMM) != 0, pa.bool_()),
        "name": pa.array(c["name"].astype("U16").astype(object), pa.string()),
    })
