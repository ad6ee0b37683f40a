"""The iteration period of a rank's operation sequence (Greyhound §4.2, "Iteration time
analysis"): each operation is a symbol (communicator, op, bytes); the period is the first
lag ``k`` whose autocorrelation reaches ``M = 0.95`` (``argmin_k ACF(X)_k >= M``), computed
with ``statsmodels.tsa.stattools.acf`` on a few deterministic numeric embeddings of the
symbols, every multiple of ``k`` staying near the threshold too (so a sub-period, e.g. the
micro-batch pattern of a long 1F1B steady state, is not taken for the iteration)."""

from __future__ import annotations

import numpy as np
from statsmodels.tsa.stattools import acf

_U64 = np.uint64
_M1, _M2, _M3 = _U64(0x9E3779B97F4A7C15), _U64(0xC2B2AE3D27D4EB4F), _U64(0x165667B19E3779F9)


def symbols(comm: np.ndarray, op: np.ndarray, nbytes: np.ndarray | None) -> np.ndarray:
    """One uint64 symbol per operation from (communicator, op code, bytes)."""
    h = comm.astype(np.uint64) * _M1
    h ^= (op.astype(np.uint64) + _U64(1)) * _M2
    if nbytes is not None:
        h ^= nbytes.astype(np.uint64) * _M3
    h ^= h >> _U64(31)
    h *= _M1
    h ^= h >> _U64(29)
    return h


def _embed(sym: np.ndarray, j: int) -> np.ndarray:
    """The j-th numeric embedding of the symbols: 16 bits of the hash in [-1, 1]."""
    bits = (sym >> _U64(16 * (j % 4))) & _U64(0xFFFF)
    if j >= 4:
        bits = (bits * _U64(40503 + 2 * j)) & _U64(0xFFFF)
    return bits.astype(np.float64) / 32767.5 - 1.0


def pooled_acf(sym: np.ndarray, nlags: int, projections: int = 4) -> np.ndarray:
    """Autocorrelation of a symbol sequence at lags 0..nlags: the mean of the adjusted
    ACF (statsmodels) of ``projections`` numeric embeddings. A lag at which the sequence
    repeats exactly scores 1."""
    total = np.zeros(nlags + 1)
    used = 0
    for j in range(projections):
        x = _embed(sym, j)
        if np.ptp(x) == 0:
            continue
        total += acf(x, nlags=nlags, adjusted=True, fft=True, missing="none")
        used += 1
    return total / used if used else total


def find_period(sym: np.ndarray, threshold: float = 0.95, max_lag: int = 20000,
                slack: float = 0.05, projections: int = 4) -> int:
    """Greyhound's period, ``argmin_k ACF_k >= M``, among lags whose multiples also reach
    ``M - slack``; 0 when the sequence shows no period (at least two periods are needed)."""
    n = len(sym)
    nlags = min(max_lag, n // 2)
    if nlags < 1 or len(np.unique(sym)) < 2:
        return 0
    r = pooled_acf(sym, nlags, projections)
    for k in np.flatnonzero(r[1:] >= threshold) + 1:
        multiples = r[2 * k::k]
        if np.all(multiples >= threshold - slack):
            return int(k)
    return 0

