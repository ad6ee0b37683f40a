"""The evidence reducer's C kernels (``native/evidence/``), loaded with ctypes, in the
manner of clickhouse-connect: a C hot path, the numpy form as the fallback, and a parity
test between them (``tests/unit/detectors/test_gap_kernel.py``,
``test_round_kernel.py``).

``setup.py`` builds them into ``_evidence`` beside this module when a C compiler is there.
``FAILSLOW_EVIDENCE_KERNEL`` (``processor.evidence_kernel``): ``c`` (that library, else
numpy), ``numpy``, or the path of a kernel library (the tests' AddressSanitizer build)."""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from failslow.settings import get_settings

log = logging.getLogger(__name__)

_I64 = ctypes.POINTER(ctypes.c_int64)
_U8 = ctypes.POINTER(ctypes.c_uint8)


def built_library() -> Path | None:
    """The library ``setup.py`` built beside this module, if any."""
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_evidence{suffix}"
        if path.exists():
            return path
    return None


def _kernel_function(path: Path, name: str, restype: Any, argtypes: list[Any]
                     ) -> tuple[ctypes.CDLL, Any]:
    """The library at ``path`` and its function ``name``, typed, after checking that its
    ``<name>_version()`` is the one this module speaks (OSError otherwise)."""
    lib = ctypes.CDLL(str(path))
    version = getattr(lib, f"{name}_version")()
    if version != 1:
        raise OSError(f"{path}: {name} version {version}, expected 1")
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return lib, fn


class GapKernel:
    """``fs_gaps`` of ``native/evidence/gaps.c``: a batch of one job's rows, sorted by
    (rank, time, ends first), against the per-rank state arrays of a
    :class:`~failslow.detectors.slowdown.gaps.GapTracker`, which it updates in place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        _, self._fn = _kernel_function(path, "fs_gaps", ctypes.c_int64, [
            ctypes.c_int64, _I64, _I64, _U8, _I64, _U8, ctypes.c_int64,
            _I64, _I64, _I64, _I64, _I64, _I64])

    def __call__(self, rank: np.ndarray, t: np.ndarray, is_enter: np.ndarray,
                 kind: np.ndarray, tp: np.ndarray | None, microbatches: int,
                 last_end: np.ndarray, ctx: np.ndarray, tp_ctx: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row positions, gaps, passes) of the enters with a known end before them."""
        n = len(rank)
        for name, state in (("last_end", last_end), ("ctx", ctx), ("tp_ctx", tp_ctx)):
            if state.dtype != np.int64 or not state.flags.c_contiguous:
                raise ValueError(f"{name}: a C-contiguous int64 array is needed")
        if n and (int(rank.min()) < 0 or int(rank.max()) >= len(last_end)):
            raise ValueError("a rank outside the state arrays")  # the C loop indexes by rank
        rank = np.ascontiguousarray(rank, dtype=np.int64)
        t = np.ascontiguousarray(t, dtype=np.int64)
        enter = np.ascontiguousarray(is_enter, dtype=np.uint8)
        kind = np.ascontiguousarray(kind, dtype=np.int64)
        tp_arr = None if tp is None else np.ascontiguousarray(tp, dtype=np.uint8)
        pos = np.empty(n, dtype=np.int64)
        gap = np.empty(n, dtype=np.int64)
        passes = np.empty(n, dtype=np.int64)

        def i64(a: np.ndarray) -> ctypes._Pointer[ctypes.c_int64]:
            return a.ctypes.data_as(_I64)

        m = self._fn(n, i64(rank), i64(t), enter.ctypes.data_as(_U8), i64(kind),
                     None if tp_arr is None else tp_arr.ctypes.data_as(_U8), int(microbatches),
                     i64(last_end), i64(ctx), i64(tp_ctx), i64(pos), i64(gap), i64(passes))
        return pos[:m], gap[:m], passes[:m]


class RoundWorkspace:
    """The round kernel's scratch and output buffers for one joiner, kept between its
    batches (fresh pages for every batch cost more than the join) and growing with them;
    freed with the joiner."""

    def __init__(self) -> None:
        self.cap = 0
        self.buf: dict[str, np.ndarray] = {}

    def ensure(self, n: int, work_words: Callable[[int], int]) -> dict[str, np.ndarray]:
        if n > self.cap:
            cap = max(n, int(self.cap * 1.1), 1024)
            self.buf = {"rows": np.empty(13 * cap, dtype=np.int64),
                        "work": np.empty(int(work_words(cap)), dtype=np.int64),
                        "transfer": np.empty(cap, dtype=np.float64),
                        "m_round": np.empty(cap, dtype=np.int64),
                        "m_rank": np.empty(cap, dtype=np.int64),
                        "m_wait": np.empty(cap, dtype=np.int64)}
            self.cap = cap
        return self.buf


class RoundKernel:
    """``fs_rounds`` of ``native/evidence/rounds.c``: the pending member operations and a
    batch's rows (the :class:`~failslow.detectors.slowdown.rounds.RoundJoiner`'s column
    layout, one int64 matrix) -> the rounds completed, their members and what stays
    pending (results are copies; the buffers are the caller's :class:`RoundWorkspace`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lib, self._fn = _kernel_function(path, "fs_rounds", ctypes.c_int, [
            ctypes.c_int64, _I64, ctypes.c_int64, ctypes.c_int64, _I64, ctypes.c_int64,
            _I64, _I64, ctypes.POINTER(ctypes.c_double), _I64, _I64, _I64, _I64])
        self._work_of = lib.fs_rounds_work
        self._work_of.restype = ctypes.c_int64
        self._work_of.argtypes = [ctypes.c_int64]

    def rows(self, space: RoundWorkspace, n: int) -> np.ndarray:
        """The (13, n) input matrix to fill, in ``space``."""
        return space.ensure(n, self._work_of)["rows"][:13 * n].reshape(13, n)

    def __call__(self, space: RoundWorkspace, n: int, now: int, max_age: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                            np.ndarray]:
        """Join the ``n`` rows filled into :meth:`rows`. Returns the pending operations
        (13, kept), the rounds (13 columns, r), their transfer times, and the members'
        round, rank and wait. The pending operations and the rounds are written over the
        input rows (all read before): the first from the head, the second at the tail."""
        b = space.ensure(n, self._work_of)
        rows = b["rows"][:13 * n].reshape(13, n)
        counts = np.zeros(4, dtype=np.int64)

        def i64(a: np.ndarray) -> ctypes._Pointer[ctypes.c_int64]:
            return a.ctypes.data_as(_I64)

        if self._fn(n, i64(rows), int(now), int(max_age), i64(b["work"]), len(b["work"]),
                    i64(rows), i64(rows),
                    b["transfer"].ctypes.data_as(ctypes.POINTER(ctypes.c_double)),
                    i64(b["m_round"]), i64(b["m_rank"]), i64(b["m_wait"]), i64(counts)) != 0:
            raise RuntimeError(f"round kernel: workspace of {len(b['work'])} words, "
                               f"{int(counts[3])} needed")
        kept, r, m = (int(x) for x in counts[:3])
        return (rows[:, :kept].copy(), rows[:, n - r:].copy(), b["transfer"][:r].copy(),
                b["m_round"][:m].copy(), b["m_rank"][:m].copy(), b["m_wait"][:m].copy())


@functools.cache
def _load(choice: str) -> GapKernel | None:
    if choice == "numpy":
        return None
    path = built_library() if choice == "c" else Path(choice)
    if path is None:
        log.info("no compiled evidence kernel (no C compiler at install): numpy runs")
        return None
    try:
        return GapKernel(path)
    except (OSError, AttributeError) as e:
        log.warning("evidence kernel %s does not load (%s): numpy runs", path, e)
        return None


def gap_kernel() -> GapKernel | None:
    """The gap kernel the setting chooses (None: the numpy form)."""
    return _load(get_settings().processor.evidence_kernel)


@functools.cache
def _load_rounds(choice: str) -> RoundKernel | None:
    gaps = _load(choice)  # logs once why there is none
    if gaps is None:
        return None
    try:
        return RoundKernel(gaps.path)
    except (OSError, AttributeError) as e:
        log.warning("round kernel %s does not load (%s): numpy runs", gaps.path, e)
        return None


def round_kernel() -> RoundKernel | None:
    """The round kernel the setting chooses (None: the numpy form)."""
    return _load_rounds(get_settings().processor.evidence_kernel)
