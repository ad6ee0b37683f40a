"""The C form of the round joiner (native/evidence/rounds.c) against the numpy form
(detectors/slowdown/rounds.py): the same rounds, in the same order, with the same members
and waits, and the same operations left pending, on simulated jobs cut into random batches
and on random rows with lost, repeated and unmatched operations; the same under
AddressSanitizer."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.native import build_or_skip, run_under_asan
from support.synth_jobs import Fault, generate

from failslow import events
from failslow.detectors.slowdown.comms import CommRegistry
from failslow.detectors.slowdown.kernel import RoundKernel
from failslow.detectors.slowdown.rounds import _POP, RoundJoiner, Rounds
from failslow.events import Comm, JobMeta

MS = 1_000_000


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> RoundKernel:
    return RoundKernel(build_or_skip(tmp_path_factory, "") / "libfailslow_evidence.so")


def _pending(j: RoundJoiner) -> list[tuple[int, ...]]:
    """The pending operations as a sorted list (the two forms keep them in other orders)."""
    cols = [j.pending[c].astype(np.int64) if c != "comm" else j.pending[c].view(np.int64)
            for c in _POP]
    return sorted(zip(*(c.tolist() for c in cols), strict=True))


def assert_same_joins(meta: JobMeta, coll: pa.Table, cuts: np.ndarray, kernel: RoundKernel,
                      max_age_ns: int = 600 * 10**9) -> int:
    """Both forms over ``coll`` cut at ``cuts``; returns the rounds completed."""
    a = RoundJoiner(CommRegistry(meta), max_age_ns)
    b = RoundJoiner(CommRegistry(meta), max_age_ns, kernel)
    total = 0
    for lo, hi in zip([0, *cuts], [*cuts, coll.num_rows], strict=True):
        batch = coll.slice(int(lo), int(hi - lo))
        ra, rb = a.update(batch), b.update(batch)
        for f in dataclasses.fields(Rounds):
            x, y = getattr(ra, f.name), getattr(rb, f.name)
            assert x.dtype == y.dtype, f.name
            np.testing.assert_array_equal(x, y, err_msg=f.name)
        assert _pending(a) == _pending(b)
        np.testing.assert_array_equal(a.p2p_keys, b.p2p_keys)
        total += len(ra)
    return total


@pytest.mark.parametrize(("tp", "pp", "dp", "shuffle"), [
    (2, 4, 2, False), (4, 2, 2, True), (1, 1, 8, False), (2, 2, 4, True)])
def test_simulated_jobs_give_the_numpy_rounds(kernel: RoundKernel, tp: int, pp: int, dp: int,
                                              shuffle: bool) -> None:
    job = generate(tp=tp, pp=pp, dp=dp, iterations=8, shuffle=shuffle, seed=tp + pp,
                   faults=[Fault("link", 3, factor=2.0, link=(0, tp * dp))], skew_ns=20_000)
    coll = job.tables["coll"]
    if not shuffle:
        coll = coll.sort_by("t")
    rng = np.random.default_rng(tp * 100 + dp)
    cuts = np.sort(rng.choice(np.arange(1, coll.num_rows), size=40, replace=False))
    assert assert_same_joins(job.meta, coll, cuts, kernel) >= 8  # a pure DP job: 8 rounds


def random_rows(seed: int, ranks: int = 8, rounds: int = 300) -> tuple[JobMeta, pa.Table]:
    """Collectives of two communicators and point-to-point channels, with members that
    never come, ends lost, rows repeated (at-least-once delivery), transfer starts outside
    the call, and sends without their receive."""
    rng = np.random.default_rng(seed)
    comms = (Comm(comm=2**64 - 7, kind="dp", ranks=tuple(range(ranks))),
             Comm(comm=11, kind="tp", ranks=tuple(range(0, ranks, 2))),
             Comm(comm=2**63 + 5, kind="pp", ranks=tuple(range(ranks))))
    meta = JobMeta(job="r", t=0, world_size=ranks, tp=1, pp=1, dp=ranks, cp=1,
                   microbatches=0, schedule="unknown", nodes={}, comms=comms)
    rows: list[dict[str, object]] = []
    t = 10 * MS
    seqs = {c.comm: 0 for c in comms}
    for _ in range(rounds):
        c = comms[int(rng.integers(0, 3))]
        t += int(rng.integers(0, 3 * MS))
        seq = seqs[c.comm]
        seqs[c.comm] += 1
        if c.kind == "pp":
            a, b = (int(x) for x in rng.choice(ranks, 2, replace=False))
            pairs = [(a, "send", b), (b, "recv", a)]
            if rng.random() < 0.1:
                pairs = pairs[:1]  # a send whose receive never comes
            members = [(r, op, peer) for r, op, peer in pairs]
        else:
            members = [(r, "allreduce", -1) for r in c.ranks]
            if rng.random() < 0.05:
                members = members[1:]  # a member that never comes
        for r, op, peer in members:
            te = t + int(rng.integers(0, 2 * MS))
            # durations often equal: ties for the shortest (the member that came last)
            tx = te + int(rng.choice([MS, 2 * MS, int(rng.integers(0, 4 * MS))]))
            ts = int(rng.choice([te + (tx - te) // 2, 0, tx + 5]))
            base = {"job": "r", "rank": r, "comm": c.comm, "comm_rank": c.ranks.index(r),
                    "comm_size": len(c.ranks), "seq": seq, "op": op,
                    "bytes": int(rng.choice([1024, 4096])),
                    "peer": c.ranks.index(peer) if peer >= 0 else -1}
            rows.append({**base, "phase": "enter", "t": te, "t_start": None})
            if rng.random() < 0.97:
                rows.append({**base, "phase": "end", "t": tx, "t_start": ts})
            if rng.random() < 0.03:
                rows.append(dict(rows[-1]))  # delivered twice
    table = events.from_rows("coll", rows)
    return meta, table.take(np.argsort(table.column("t").to_numpy(), kind="stable"))


@pytest.mark.parametrize("seed", range(8))
def test_random_rows_give_the_numpy_rounds(kernel: RoundKernel, seed: int) -> None:
    meta, coll = random_rows(seed)
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, coll.num_rows), size=30, replace=False))
    # a short pending age: incomplete rounds are dropped as the stream goes on
    assert assert_same_joins(meta, coll, cuts, kernel, max_age_ns=40 * MS) > 50
    assert assert_same_joins(meta, coll, cuts, kernel) > 50


_ASAN_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    from pathlib import Path
    from failslow.detectors.slowdown.kernel import RoundKernel
    from unit.detectors.test_round_kernel import assert_same_joins, random_rows
    kernel = RoundKernel(Path({lib!r}))
    for seed in range(4):
        meta, coll = random_rows(seed, ranks=12, rounds=200)
        cuts = np.arange(50, coll.num_rows, 61)
        assert assert_same_joins(meta, coll, cuts, kernel, max_age_ns=40_000_000) > 50
    print("ok")
""")


def test_the_kernel_under_address_sanitizer(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same parity in a child process with the kernel built with ASan and UBSan (the
    kernel allocates nothing: its workspace is the caller's, so every write is checked
    against it)."""
    build = build_or_skip(tmp_path_factory, "asan")
    tests = str(Path(__file__).resolve().parents[2])
    run_under_asan(_ASAN_SCRIPT.format(tests=tests,
                                       lib=str(build / "libfailslow_evidence.so")))
