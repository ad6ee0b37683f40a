"""The ``coll`` deduplicator against a plain reference: a copy is a row whose key (rank,
comm, seq, phase) an earlier row has, within a batch or in the previous batch; rows whose
64-bit key hashes collide but whose keys differ are kept."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.engine import dedup


def _reference(keys: np.ndarray) -> np.ndarray:
    seen: set[tuple[int, ...]] = set()
    out = np.zeros(keys.shape[1], dtype=bool)
    for i, col in enumerate(map(tuple, keys.T.tolist())):
        out[i] = col in seen
        seen.add(col)
    return out


def _hash(keys: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (keys[0] * dedup._K1) ^ (keys[1] * dedup._K2) ^ (keys[2] * dedup._K3)


def _colliding(key: tuple[int, int, int], other_rank_end: int) -> tuple[int, int, int]:
    """A different key with the same hash: the comm chosen so that ``comm * K1`` makes up
    for the other third column (K1 is odd, so it has an inverse modulo 2**64)."""
    k1, k3, m = int(dedup._K1), int(dedup._K3), 2**64
    c, s, r = key
    target = ((c * k1) % m) ^ ((r * k3) % m) ^ ((other_rank_end * k3) % m)
    return (target * pow(k1, -1, m)) % m, s, other_rank_end


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_duplicated_agrees_with_a_plain_set(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 5000
    keys = np.stack([rng.integers(0, 2, n), rng.integers(0, 100, n),
                     rng.integers(0, 8, n)]).astype(np.uint64)  # many real copies
    assert _reference(keys).sum() > 1000
    assert (dedup._duplicated(keys) == _reference(keys)).all()


def test_a_hash_collision_is_not_a_copy() -> None:
    a = (12345, 7, 9)
    b = _colliding(a, 40)
    keys = np.array([a, b, (1, 2, 3), a, b], dtype=np.uint64).T
    h = _hash(keys)
    assert h[0] == h[1] and keys[0, 0] != keys[0, 1]  # the collision is real
    assert dedup._duplicated(keys).tolist() == [False, False, False, True, True]
