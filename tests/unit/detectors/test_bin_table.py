"""BinTable's partial compaction (only the bins a pending row can meet are summed again)
gives, bit for bit, the sums of compacting everything every time."""

from __future__ import annotations

import numpy as np
import pytest

from failslow.detectors.slowdown.bins import BinTable


class WholeTable(BinTable):
    """The reference: every compaction sums all rows again."""

    def compact(self, whole: bool = False) -> None:
        super().compact(whole=True)


def _table(cls: type[BinTable]) -> BinTable:
    return cls(("cidx", "group", "cls"), ("n", "xfer", "dmax", "dmin"), arg="range",
               carried=("rdmax", "rdmin"))


def _rows(rng: np.random.Generator, n: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    rank = rng.integers(0, 6, n)
    return {"bin": rng.integers(lo, hi, n), "cidx": rng.integers(0, 3, n), "group": rank,
            "cls": rng.integers(0, 2, n), "n": np.ones(n), "xfer": rng.random(n) * 1e6,
            "dmax": rng.random(n) * 1e7, "dmin": rng.random(n) * 1e5,
            "range": rng.integers(0, 50, n).astype(np.float64),
            "rdmax": rng.random(n), "rdmin": rng.random(n)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_partial_compaction_equals_compacting_everything(seed: int) -> None:
    rng = np.random.default_rng(seed)
    table, ref = _table(BinTable), _table(WholeTable)
    for step in range(60):
        # mostly later bins, some late rows for bins already compacted
        lo = max(0, step * 5 - int(rng.integers(0, 12)))
        rows = _rows(rng, int(rng.integers(1, 3000)), lo, step * 5 + 6)
        table.add(rows)
        ref.add(rows)
        if step % 3 == 0:
            table.compact()
            ref.compact()
        if step == 30:
            table.rebin(1)
            ref.rebin(1)
    assert len(ref.data["bin"]) > 1000
    for k, v in ref.data.items():
        assert np.array_equal(table.data[k], v), k
