"""RDMA work-request telemetry (native/verbs) against a stub libibverbs.so.1.

``drv_verbs`` resolves libibverbs the way NCCL does (dlopen + dlvsym "IBVERBS_1.1") and posts
and polls through the inline ctx->ops path; the shim, preloaded, interposes dlvsym and wraps the
context's post_send / poll_cq. ``failslow_verbs_sample`` forces a LINK sample at fixed points:
  A: 10 chains x 4 WRs x 1000 B, last WR of each signaled, all polled
  B: 2 more chains posted, not polled (8 WRs in flight)
  C: those polled, 3 receives completed; then a post that fails at its first WR
  D: second device: a poster and a poller thread, 200 chains x 2 WRs x 100 B, all signaled
  E: after both queue pairs are destroyed
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.native import build_or_skip as _build

from failslow import events
from failslow.collectors import ring
from failslow.collectors.native_build import (
    driver_env,
)

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None,
                                reason="gcc (C compiler) not installed: native collectors "
                                       "cannot be built")

LIB = "libfailslow_verbs.so"
# (device, posted, completed, completed bytes, posted bytes, receive completions)
DEV0_A = ("mlx5_0", 40, 40, 40000, 40000, 0)
DEV0_B = ("mlx5_0", 48, 40, 40000, 48000, 0)
DEV0_C = ("mlx5_0", 48, 48, 48000, 48000, 3)
DEV1_D = ("mlx5_1", 400, 400, 40000, 40000, 0)


def _run_driver(build: Path, ring_dir: Path, san: str, **extra: str) -> np.ndarray:
    env = driver_env(build, ring_dir, san=san, preload=LIB, job="jv", RANK="2", **extra)
    proc = subprocess.run([str(build / "drv_verbs"), "dlvsym"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert '"bad_rc": 22' in proc.stdout and '"sampler": 1' in proc.stdout
    (path,) = ring.find_rings(ring_dir, collector="verbs")
    with ring.RingReader(path) as r:
        assert r.info.rank == 2 and r.caps & ring.CAP_LINK
        return r.drain()


def _rows(recs: np.ndarray) -> list[tuple]:
    link = recs[recs["kind"] == ring.KIND_LINK]
    return [(n.decode(), int(p), int(c), int(b), int(s), int(rv)) for n, p, c, b, s, rv in
            zip(link["name"], link["posted"], link["completed"], link["bytes"],
                link["send_count"], link["recv_count"], strict=True)]


@pytest.mark.parametrize("san", ["", "asan", "tsan"], ids=["O2", "asan", "tsan"])
def test_posted_completed_bytes_per_device(tmp_path_factory: pytest.TempPathFactory,
                                           tmp_path: Path, san: str) -> None:
    build = _build(tmp_path_factory, san)
    recs = _run_driver(build, tmp_path, san, FAILSLOW_LINK_PERIOD_MS="0")
    rows = _rows(recs)
    # forced samples A, B, C; D and E sample both devices; closing each device samples again
    assert rows == [DEV0_A, DEV0_B, DEV0_C,
                    DEV0_C, DEV1_D,   # D
                    DEV0_C, DEV1_D,   # E: destroyed queue pairs stay in the device totals
                    DEV0_C, DEV1_D,   # close of mlx5_1 (mlx5_0 still open)
                    DEV0_C]           # close of mlx5_0
    link = recs[recs["kind"] == ring.KIND_LINK]
    assert (link["device"][[r[0] == "mlx5_1" for r in rows]] == 1).all()
    assert (np.diff(link["t_ns"]) >= 0).all()


def test_periodic_sampler_is_monotonic(tmp_path_factory: pytest.TempPathFactory,
                                       tmp_path: Path) -> None:
    """The sampler thread races the hot path (TSan build): counters never go backwards."""
    build = _build(tmp_path_factory, "tsan")
    recs = _run_driver(build, tmp_path, "tsan", FAILSLOW_LINK_PERIOD_MS="1")
    link = recs[recs["kind"] == ring.KIND_LINK]
    for dev, final in (("mlx5_0", DEV0_C), ("mlx5_1", DEV1_D)):
        mine = link[link["name"] == dev.encode()]
        for col in ("posted", "completed", "bytes", "send_count"):
            assert (np.diff(mine[col].astype(np.int64)) >= 0).all(), (dev, col)
        assert (mine["completed"] <= mine["posted"]).all()
        last = mine[-1]
        assert (dev, int(last["posted"]), int(last["completed"]), int(last["bytes"])) == final[:4]


def test_link_table_conforms(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    build = _build(tmp_path_factory, "")
    recs = _run_driver(build, tmp_path, "", FAILSLOW_LINK_PERIOD_MS="0", FAILSLOW_DETAIL="1")
    qp_rows = recs[(recs["kind"] == ring.KIND_LINK) & ((recs["flags"] & ring.FLAG_QP) != 0)]
    assert len(qp_rows) > 0 and (qp_rows["qp_num"] > 0).all()  # detail: per queue pair too
    tables = ring.to_tables(recs, job="jv", node="node3", rank=2)
    link = events.conform(tables["link"], "link")
    assert link.num_rows == 10
    cols = link.to_pydict()
    assert set(cols["device"]) == {"mlx5_0", "mlx5_1"}
    assert set(cols["node"]) == {"node3"} and set(cols["rank"]) == {2}
    assert cols["peer_node"] == [None] * 10
    with_qp = ring.to_tables(recs, job="jv", node="node3", rank=2, include_qp=True)["link"]
    assert with_qp.num_rows == 10 + len(qp_rows)
    assert any(d.startswith("mlx5_0/qp") for d in with_qp.column("device").to_pylist())


# (TSan does not support starting threads after a multi-threaded fork)
@pytest.mark.parametrize("san", ["", "asan"], ids=["O2", "asan"])
def test_fork_child_samples_its_own_ring(tmp_path_factory: pytest.TempPathFactory,
                                         tmp_path: Path, san: str) -> None:
    """The sampler thread does not survive fork(): the child's handler (registered through
    ring.c's fs_atfork_child) lets the child start its own, which samples into the child's
    own ring."""
    build = _build(tmp_path_factory, san)
    env = driver_env(build, tmp_path, san=san, preload=LIB, job="jf", RANK="1",
                     FAILSLOW_LINK_PERIOD_MS="1")
    proc = subprocess.run([str(build / "drv_verbs"), "fork"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    child = int(proc.stdout.split('"child": ')[1].split(",")[0])
    rings = {}
    for p in ring.find_rings(tmp_path, collector="verbs"):
        with ring.RingReader(p) as r:
            rings[r.info.pid] = p
    assert child in rings and len(rings) == 2
    with ring.RingReader(rings[child]) as r:
        recs = r.drain()
    link = recs[recs["kind"] == ring.KIND_LINK]
    # the child posts until its own sampler thread has sampled 8 times (the ring's
    # heartbeat): that many samples, of the child's device only (posted grows)
    assert len(link) >= 5, len(link)
    assert {n.decode() for n in link["name"]} >= {"mlx5_1"}
    mine = link[link["name"] == b"mlx5_1"]
    assert int(mine["posted"].max()) > 0 and (np.diff(mine["posted"].astype(np.int64)) >= 0).all()
