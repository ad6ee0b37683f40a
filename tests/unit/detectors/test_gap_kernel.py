"""The C form of the compute gaps (native/evidence/gaps.c) against the numpy form
(detectors/slowdown/gaps.py): the same gaps, passes and per-rank state on random row
streams cut into random batches and on simulated jobs; the same again under
AddressSanitizer; and the installed package carries the built kernel."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.native import build_or_skip, run_under_asan
from support.synth_jobs import Fault, generate

from failslow.detectors.slowdown import SlowdownConfig
from failslow.detectors.slowdown.gaps import GapTracker
from failslow.detectors.slowdown.kernel import GapKernel, built_library
from failslow.detectors.slowdown.reducer import EvidenceReducer
from failslow.replay import replay

MS = 1_000_000


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> GapKernel:
    return GapKernel(build_or_skip(tmp_path_factory, "") / "libfailslow_evidence.so")


def random_stream(seed: int, ranks: int = 6, ops: int = 400
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``ranks`` ranks in time order: each operation an enter and an end (some ends
    lost, some batched point-to-point calls overlapping), point-to-point kinds 0-4,
    tensor-parallel flags, ties in time."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(ranks):
        t = int(rng.integers(0, 5 * MS))
        for _ in range(ops):
            kind = int(rng.choice(5, p=[0.5, 0.15, 0.15, 0.1, 0.1]))
            tp = bool(rng.random() < 0.6) and kind == 0
            t += int(rng.choice([0, 1, 1000, 50_000, 2 * MS]))
            rows.append((r, t, 1, kind, tp))
            if rng.random() < 0.97:
                end = t + int(rng.choice([0, 10, 300_000, 4 * MS]))
                rows.append((r, end, 0, kind, tp))
                if rng.random() < 0.8:
                    t = end
    arr = np.array(rows, dtype=np.int64)
    arr = arr[np.argsort(arr[:, 1], kind="stable")]
    return arr[:, 0], arr[:, 1], arr[:, 2].astype(bool), arr[:, 3], arr[:, 4].astype(bool)


def _state(g: GapTracker) -> tuple[list[int], list[int], list[int]]:
    return g.last_end.tolist(), g.ctx.ravel().tolist(), g.tp_ctx.ravel().tolist()


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("microbatches", [0, 2, 4])
def test_random_streams_give_the_numpy_gaps_passes_and_state(
        kernel: GapKernel, seed: int, microbatches: int) -> None:
    rank, t, enter, kind, tp = random_stream(seed)
    rng = np.random.default_rng(1000 + seed)
    cuts = np.sort(rng.choice(np.arange(1, len(rank)), size=25, replace=False))
    with_tp = seed % 2 == 0
    a, b = GapTracker(microbatches), GapTracker(microbatches, kernel)
    for lo, hi in zip([0, *cuts], [*cuts, len(rank)], strict=True):
        args = (rank[lo:hi], t[lo:hi], enter[lo:hi], kind[lo:hi],
                tp[lo:hi] if with_tp else None)
        got, want = b.update(*args), a.update(*args)
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
        assert _state(b) == _state(a)
    assert (a.ctx[:, 0] > 0).any() and (a.tp_ctx[:, 1] > 0).any() == with_tp


@pytest.mark.parametrize(("tp", "pp", "dp"), [(2, 4, 2), (4, 1, 4), (1, 1, 8)])
def test_simulated_jobs_give_the_numpy_evidence(kernel: GapKernel, tp: int, pp: int,
                                                dp: int) -> None:
    job = generate(tp=tp, pp=pp, dp=dp, iterations=12, microbatches=4,
                   faults=[Fault("compute", 6, factor=1.5, rank=1)], seed=3)
    a = EvidenceReducer(job.meta, SlowdownConfig())
    b = EvidenceReducer(job.meta, SlowdownConfig())
    a.gaps.kernel, b.gaps.kernel = None, kernel
    comp = passes = 0
    for _, batch in replay(job.tables, 20 * MS):
        ea, eb = a.update(batch["coll"], 22), b.update(batch["coll"], 22)
        for name in ("comp", "passes"):
            assert len(ea.tables[name]) == len(eb.tables[name])
            for x, y in zip(ea.tables[name], eb.tables[name], strict=True):
                for col in x:
                    np.testing.assert_array_equal(x[col], y[col])
        comp += sum(len(p["d"]) for p in ea.tables["comp"])
        passes += sum(len(p["pass"]) for p in ea.tables["passes"])
    assert comp > 0
    assert (passes > 0) == (max(tp, pp) > 1)  # a pure data-parallel job has no passes


_ASAN_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from failslow.detectors.slowdown.gaps import GapTracker
    from failslow.detectors.slowdown.kernel import GapKernel
    from unit.detectors.test_gap_kernel import random_stream
    kernel = GapKernel(__import__("pathlib").Path({lib!r}))
    for seed in range(6):
        rank, t, enter, kind, tp = random_stream(seed, ranks=9, ops=300)
        a, b = GapTracker(4), GapTracker(4, kernel)
        for lo in range(0, len(rank), 97):
            hi = lo + 97
            args = (rank[lo:hi], t[lo:hi], enter[lo:hi], kind[lo:hi], tp[lo:hi])
            for x, y in zip(b.update(*args), a.update(*args)):
                assert np.array_equal(x, y)
    print("ok")
""")


def test_the_kernel_under_address_sanitizer(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same parity in a child process with the kernel built with ASan and UBSan (the
    sanitizer runtime preloaded, as for the native collectors)."""
    build = build_or_skip(tmp_path_factory, "asan")
    tests = str(Path(__file__).resolve().parents[2])
    run_under_asan(_ASAN_SCRIPT.format(tests=tests,
                                       lib=str(build / "libfailslow_evidence.so")))


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler: the package installs without its kernel")
def test_the_installed_package_carries_the_built_kernel() -> None:
    """``pip install`` built ``setup.py``'s extension (optional: a missing compiler is a
    warning there, so this test is what notices a build that broke)."""
    path = built_library()
    assert path is not None
    GapKernel(path)


def test_a_rank_outside_the_state_arrays_is_refused_before_the_c_loop(
        kernel: GapKernel) -> None:
    """The C loop indexes the per-rank state by rank: a rank it has no row for must not
    reach it (the contract refuses negative ranks; this is the last guard)."""
    g = GapTracker(0, kernel)
    g._grow(4)
    one = np.ones(1, dtype=np.int64)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="outside the state arrays"):
            kernel(one * bad, one, np.ones(1, dtype=bool), one * 0, None, 0,
                   g.last_end, g.ctx, g.tp_ctx)
