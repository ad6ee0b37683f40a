"""Python collector for PyTorch: records every ``torch.distributed`` collective and
point-to-point call of every process group, as the native NCCL collectors do.

Frameworks without NCCL (the gloo backend on CPU, test jobs) get the same telemetry: per
operation an ``enter`` record when the host calls the API and an ``end`` record when the work
completes (synchronous calls: at return; asynchronous ones: when ``Work.is_completed()`` turns
true, observed by a completion thread), keyed by CCL-D's Trace ID, i.e. the communicator id and
its per-communicator operation counter ``seq`` (ccl-d.md §5.1). MegaTrace intercepts the
communication API the same way (megatrace.md §III-B).

gloo's point-to-point work (``isend``/``irecv``) never reports completion before the caller's
``wait()`` (``is_completed()`` stays false and ``get_future()`` is not implemented), so its
end would be the time the training loop happens to wait -- not a transfer time at all. Such
work is waited for by a collector thread per channel (communicator, op, peer: gloo completes
one channel's operations in order), which stamps the true completion; the caller gets a
:class:`_WaitedWork` whose ``wait()`` returns once that thread has seen the work complete.

Communicator id: identical on all members without any exchange. Process groups are created
collectively, in the same order, by every rank (``new_group`` must be called by all ranks), so
a per-process creation counter together with the group's global ranks names one group on all
of them: ``comm = blake2b(counter, ranks)`` (64 bits). The default group is number 0.

Records go into a :class:`~failslow.collectors.ring.RingWriter` ring in ``FAILSLOW_RING_DIR``
(``failslow-<job>-<pid>-torch.ring``), so the node agent reads them exactly as it reads the
native collectors' rings. Group creation emits a communicator record whose ``name`` is the
group's kind (``tp``/``pp``/``dp``/...), from which the agent builds ``meta.comms``.

Usage (before creating groups)::

    col = TorchCollector.install(job="myjob")     # after init_process_group
    tp = col.new_group([0, 1], kind="tp")           # or dist.new_group: kind "other"
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from failslow import events
from failslow.collectors import ring as R
from failslow.settings import get_settings

__all__ = ["TorchCollector", "comm_id", "WRAPPED"]

#: torch.distributed functions the collector wraps, with the contract op they record.
WRAPPED: dict[str, str] = {
    "all_reduce": "allreduce", "all_gather": "allgather", "all_gather_into_tensor": "allgather",
    "reduce_scatter": "reducescatter", "reduce_scatter_tensor": "reducescatter",
    "broadcast": "broadcast", "reduce": "reduce", "all_to_all": "alltoall",
    "all_to_all_single": "alltoall", "send": "send", "recv": "recv", "isend": "send",
    "irecv": "recv", "barrier": "allreduce",
}
#: The argument holding "this rank's buffer" (events.md, ``bytes``) per function.
_BUF_ARG = {
    "all_reduce": "tensor", "all_gather": "tensor", "all_gather_into_tensor": "input_tensor",
    "reduce_scatter": "output", "reduce_scatter_tensor": "output", "broadcast": "tensor",
    "reduce": "tensor", "all_to_all": "input_tensor_list", "all_to_all_single": "input",
    "send": "tensor", "recv": "tensor", "isend": "tensor", "irecv": "tensor",
}
_PEER_ARG = {"broadcast": ("src", "group_src"), "reduce": ("dst", "group_dst"),
             "send": ("dst", "group_dst"), "isend": ("dst", "group_dst"),
             "recv": ("src", "group_src"), "irecv": ("src", "group_src")}


#: A record after its commit word (``struct fs_record`` bytes 8..127, ring.RECORD_DTYPE).
_PAYLOAD = struct.Struct("<BBBBiiiiiQQQqqQQQQII16s")
_COMMIT = struct.Struct("<Q")
assert _PAYLOAD.size == R.RECORD_SIZE - 8


def comm_id(counter: int, ranks: Sequence[int]) -> int:
    """The 64-bit communicator id of the ``counter``-th group of ``ranks`` (same on all members)."""
    h = hashlib.blake2b(f"{counter}:{','.join(map(str, ranks))}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


def _nbytes(x: Any) -> int:
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    try:
        return int(x.numel() * x.element_size())
    except AttributeError:
        return 0


class _Group:
    __slots__ = ("comm", "ranks", "rank", "size", "seq", "wait_p2p")

    def __init__(self, comm: int, ranks: tuple[int, ...], rank: int,
                 wait_p2p: bool = False) -> None:
        self.comm, self.ranks, self.size, self.seq = comm, ranks, len(ranks), 0
        self.rank = ranks.index(rank) if rank in ranks else -1
        #: point-to-point work completes only inside wait() (gloo): a channel thread waits
        self.wait_p2p = wait_p2p


def _work_base() -> type:
    import torch.distributed as dist

    return dist.Work


class _Waiter:
    """A channel's completion thread: waits for each work in turn (gloo completes one
    channel's point-to-point operations in order), writes its ``end`` record at the true
    completion and releases the caller's :class:`_WaitedWork`."""

    def __init__(self, col: TorchCollector, name: str) -> None:
        self.col = col
        self.q: queue.SimpleQueue[tuple[Any, list[Any], Any] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            work, rec, proxy = item
            err: BaseException | None = None
            try:
                work.wait()
            except BaseException as e:  # noqa: BLE001 -- handed to the caller's wait()
                err = e
            self.col._end(rec)
            proxy._finish(err)
            with self.col._lock:
                self.col._outstanding -= 1


def _waited_work(real: Any) -> Any:
    """A ``torch.distributed.Work`` for ``real`` whose completion a :class:`_Waiter` observes."""
    cls = _WAITED_CLS.get("cls")
    if cls is None:
        cls = _WAITED_CLS["cls"] = _make_waited_cls()
    return cls(real)


_WAITED_CLS: dict[str, type] = {}


def _make_waited_cls() -> type:
    base = _work_base()

    class _WaitedWork(base):  # type: ignore[valid-type,misc]
        """The caller's handle on gloo point-to-point work waited for by a collector thread:
        ``wait()`` returns (or raises the work's error) once the work has completed."""

        def __init__(self, real: Any) -> None:
            super().__init__()
            self._real = real
            self._done = threading.Event()
            self._err: BaseException | None = None

        def _finish(self, err: BaseException | None) -> None:
            self._err = err
            self._done.set()

        def wait(self, timeout: Any = None) -> bool:
            secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            if not self._done.wait(None if not secs else float(secs)):
                raise RuntimeError("failslow: timed out waiting for point-to-point work")
            if self._err is not None:
                raise self._err
            return True

        def is_completed(self) -> bool:
            return self._done.is_set()

        def is_success(self) -> bool:
            return self._done.is_set() and self._err is None

        def exception(self) -> Any:
            return self._err

        def source_rank(self) -> int:
            return int(self._real.source_rank())

        def result(self) -> Any:
            return self._real.result()

        def synchronize(self) -> None:
            self.wait()

        def get_future(self) -> Any:
            return self._real.get_future()

    return _WaitedWork


class TorchCollector:
    """Wraps ``torch.distributed`` (see :data:`WRAPPED`); one per process."""

    _installed: TorchCollector | None = None

    def __init__(self, *, job: str | None = None, ring_dir: str | os.PathLike[str] | None = None,
                 capacity: int = 1 << 16, poll_s: float = 0.0002) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        settings = get_settings().collector
        self.job = job or settings.job
        d = Path(ring_dir or settings.ring_dir)
        self.path = d / f"failslow-{self.job}-{os.getpid()}-torch.ring"
        self.ring = R.RingWriter(self.path, capacity, job=self.job, rank=self.rank,
                                 caps=R.CAP_END_ROWS)
        hdr = np.frombuffer(self.ring._mm, dtype=R.HEADER_DTYPE, count=1)
        hdr["world_size"] = self.world
        self._lock = threading.Lock()
        #: signalled when asynchronous work is added: the completion thread sleeps otherwise
        #: (an idle poll loop would take the GIL thousands of times a second in every rank)
        self._cv = threading.Condition(self._lock)
        self._tls = threading.local()
        self._groups: dict[int, _Group] = {}  # id(ProcessGroup) -> group
        self._keep: list[Any] = []  # keeps the groups alive (ids stay unique)
        self._created = 0
        self._pending: list[tuple[list[Any], list[Any]]] = []
        self._waiters: dict[tuple[int, int, int], _Waiter] = {}
        self._outstanding = 0  # point-to-point work handed to the waiters, not complete yet
        self._originals: dict[str, Callable[..., Any]] = {}
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._thread = threading.Thread(target=self._complete_loop, name="failslow-torch",
                                        daemon=True)
        self._thread.start()
        self._register(dist.group.WORLD, "world")

    # -- installation ------------------------------------------------------------------------

    @classmethod
    def install(cls, **kwargs: Any) -> TorchCollector:
        """Create the process's collector and wrap ``torch.distributed`` (idempotent)."""
        if cls._installed is not None:
            return cls._installed
        col = cls(**kwargs)
        col._patch()
        cls._installed = col
        atexit.register(col.close)
        return col

    def _patch(self) -> None:
        import torch.distributed.distributed_c10d as c10d

        for name in (*WRAPPED, "batch_isend_irecv", "new_group"):
            orig = getattr(c10d, name)
            self._originals[name] = orig
            if name == "batch_isend_irecv":
                wrapper = self._wrap_batch(orig)
            elif name == "new_group":
                wrapper = self._wrap_new_group(orig)
            else:
                wrapper = self._wrap(name, orig)
            setattr(c10d, name, wrapper)
            setattr(self.dist, name, wrapper)

    def uninstall(self) -> None:
        import torch.distributed.distributed_c10d as c10d

        for name, orig in self._originals.items():
            setattr(c10d, name, orig)
            setattr(self.dist, name, orig)
        self._originals.clear()
        if TorchCollector._installed is self:
            TorchCollector._installed = None

    # -- groups --------------------------------------------------------------------------------

    def _register(self, group: Any, kind: str, *, created: bool = True) -> _Group:
        import torch.distributed.distributed_c10d as c10d

        # a group seen first in a call (created before install) is numbered -1: members may
        # use their groups in different orders, so only its ranks can name it
        counter = self._created if created else -1
        self._created += created
        if group is None or group == c10d.GroupMember.NON_GROUP_MEMBER:
            return _Group(0, (), self.rank)
        ranks = tuple(c10d.get_process_group_ranks(group))
        try:
            gloo = str(self.dist.get_backend(group)) == "gloo"
        except (RuntimeError, ValueError):
            gloo = False
        g = _Group(comm_id(counter, ranks), ranks, self.rank, wait_p2p=gloo)
        self._groups[id(group)] = g
        self._keep.append(group)
        self._write((R.KIND_COMM, 0, 0, R.SRC_TEST, self.rank, g.rank, g.size, -1, -1, g.comm,
                     0, 0, time.time_ns(), -1, 0, 0, 0, 0, 0, 0, kind.encode()[:16]))
        return g

    def new_group(self, ranks: Sequence[int] | None = None, *, kind: str = "other",
                  **kwargs: Any) -> Any:
        """``torch.distributed.new_group`` that also names the group's kind for ``meta.comms``
        (every rank must call it, for every group, in the same order, as torch requires)."""
        self._tls.kind = kind
        try:
            return self.dist.new_group(ranks, **kwargs)
        finally:
            self._tls.kind = None

    def _wrap_new_group(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def new_group(*args: Any, **kwargs: Any) -> Any:
            group = orig(*args, **kwargs)
            self._register(group, getattr(self._tls, "kind", None) or "other")
            return group
        return new_group

    def _group(self, group: Any) -> _Group:
        g = self._groups.get(id(group if group is not None else self.dist.group.WORLD))
        if g is None:  # a group created before install: id from its ranks only
            g = self._register(group, "other", created=False)
        return g

    # -- records -------------------------------------------------------------------------------

    def _put(self, rec: tuple[Any, ...]) -> None:
        """Publish one record (the lock held), RingWriter's protocol without its batch set-up:
        read_idx, acquire fence, payload bytes, release fence, the commit word, then the write
        index (the fences are no-ops on x86-64, see ring.memory_order)."""
        ring = self.ring
        u64 = ring._u64
        w = int(u64[R._W_WRITE])
        if w - int(u64[R._W_READ]) >= ring.capacity:
            u64[R._W_DROPPED] += np.uint64(1)
            return
        off = R.HEADER_SIZE + (w & (ring.capacity - 1)) * R.RECORD_SIZE
        order = ring.order
        if order.acquire is not None:
            order.acquire()
        _PAYLOAD.pack_into(ring._mm, off + 8, *rec)
        if order.release is not None:
            order.release()
        _COMMIT.pack_into(ring._mm, off, w + 1)
        u64[R._W_WRITE] = np.uint64(w + 1)

    def _write(self, rec: tuple[Any, ...]) -> None:
        with self._lock:
            self._put(rec)

    def _enter(self, name: str, g: _Group, nbytes: int, peer: int) -> list[Any]:
        with self._lock:
            seq = g.seq
            g.seq += 1
            rec = [R.KIND_COLL, events.OP[WRAPPED[name]], events.ENTER, R.SRC_TEST, self.rank,
                   g.rank, g.size, peer, -1, g.comm, seq, nbytes, time.time_ns(),
                   int(events.NULL_TIME),  # t_start unknown: null (events.md), never -1
                   0, 0, 0, 0, 0, 0, b""]
            self._put(tuple(rec))
        return rec

    def _end(self, rec: list[Any], t_ns: int | None = None) -> None:
        end = list(rec)
        end[2], end[12] = events.END, t_ns or time.time_ns()
        self._write(tuple(end))

    def _complete_loop(self) -> None:
        while not self._stop.is_set():
            with self._cv:
                while not self._pending and not self._stop.is_set():
                    self._cv.wait()
                pending = self._pending
                self._pending = []
            keep = []
            now = time.time_ns()
            for works, rec in pending:
                try:
                    done = all(w.is_completed() for w in works)
                except RuntimeError:  # the work failed: completed, with an error
                    done = True
                if done:
                    self._end(rec, now)
                else:
                    keep.append((works, rec))
            if keep:
                with self._lock:
                    self._pending[:0] = keep
            time.sleep(self._poll_s)

    def _peer(self, name: str, g: _Group, bound: dict[str, Any]) -> int:
        if name not in _PEER_ARG:
            return -1
        glob, local = _PEER_ARG[name]
        if bound.get(local) is not None:
            return int(bound[local])
        r = bound.get(glob)
        if r is None:
            return -1
        return g.ranks.index(int(r)) if int(r) in g.ranks else -1

    def _wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        import inspect

        params = list(inspect.signature(orig).parameters)
        is_async = name in ("isend", "irecv")

        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._tls, "busy", False):
                return orig(*args, **kwargs)
            bound = dict(zip(params, args, strict=False))
            if kwargs:
                bound.update(kwargs)
            g = self._group(bound.get("group"))
            if g.rank < 0:  # not a member: torch returns without doing anything
                return orig(*args, **kwargs)
            nbytes = _nbytes(bound.get(_BUF_ARG.get(name, "")))
            rec = self._enter(name, g, nbytes, self._peer(name, g, bound))
            self._tls.busy = True
            try:
                out = orig(*args, **kwargs)
            except BaseException:
                self._end(rec)
                raise
            finally:
                self._tls.busy = False
            if is_async or bound.get("async_op", False):
                batch = getattr(self._tls, "batch", None)
                if out is None and batch is not None:  # coalesced: completes with the batch
                    batch.append(rec)
                elif out is None:
                    self._end(rec)
                elif is_async and g.wait_p2p:
                    out = self._wait_in_thread(out, rec)
                else:
                    with self._lock:
                        self._pending.append(([out], rec))
                        self._cv.notify()
            else:
                self._end(rec)
            return out
        return wrapper

    def _wait_in_thread(self, work: Any, rec: list[Any]) -> Any:
        """Hand gloo point-to-point ``work`` to its channel's waiter; returns the caller's
        :class:`_WaitedWork`."""
        key = (rec[9], rec[1], rec[7])  # comm, op, peer
        proxy = _waited_work(work)
        with self._lock:
            waiter = self._waiters.get(key)
            if waiter is None:
                waiter = self._waiters[key] = _Waiter(self, f"failslow-p2p-{len(self._waiters)}")
            self._outstanding += 1
        waiter.q.put((work, rec, proxy))
        return proxy

    def _wrap_batch(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
            self._tls.batch = []
            try:
                works = orig(p2p_op_list)
            finally:
                coalesced, self._tls.batch = self._tls.batch, None
            with self._lock:
                for rec in coalesced:
                    self._pending.append((list(works), rec))
                self._cv.notify()
            return works
        return batch_isend_irecv

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until every asynchronous operation's ``end`` record is written."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending and not self._outstanding:
                    return
            time.sleep(self._poll_s * 5)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self.flush(1.0)
        with self._cv:
            self._stop.set()
            self._cv.notify()
        self._thread.join(timeout=1.0)
        for w in self._waiters.values():
            w.q.put(None)
        for w in self._waiters.values():
            w.thread.join(timeout=1.0)
        with contextlib.suppress(Exception):
            self.ring.close()
