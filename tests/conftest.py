"""Shared test fixtures (the Kafka broker fixture is shared by the Kafka transport and the
pipeline tests)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from failslow import events
from failslow.infra import kafka_broker as infra

#: the repository, its tests' data, and ../shared (spec, papers, real traces)
REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SHARED = REPO.parent / "shared"

#: A small simulated job with a compute straggler (rank 5, GPU throttled) and then a slow
#: link (nodes 1-3): the dashboards' and the report's tests load it.
SMALL = """job: sim-small
parallel: {tp: 2, pp: 2, dp: 4, cp: 1}
microbatches: 4
iterations: 40
gpus_per_node: 4
nics_per_node: 4
faults:
  - {cause: compute, ranks: [5], start: 8, duration: 10, severity: 1.6, gpu_throttle: true}
  - {cause: communication, nodes: [1, 3], start: 24, duration: 10, severity: 8.0}
"""


def coll_row(**overrides: Any) -> dict[str, Any]:
    """One valid ``coll`` row; keyword arguments replace columns."""
    row: dict[str, Any] = {
        "job": "j1", "rank": 0, "comm": 2**64 - 1, "comm_rank": 0, "comm_size": 2, "seq": 0,
        "op": "allreduce", "bytes": 1024, "peer": -1, "phase": "enter", "t": 1_000,
    }
    row.update(overrides)
    return row


def meta_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "job": "j1", "t": 1, "world_size": 2, "tp": 1, "pp": 1, "dp": 2, "cp": 1,
        "microbatches": 1, "schedule": "1f1b", "nodes": {"0": "n0", "1": "n0"},
        "comms": [{"comm": 2**64 - 1, "kind": "dp", "ranks": [0, 1]}],
    }
    row.update(overrides)
    return row


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    """A valid two-rank trace directory in JSON Lines with one allreduce round."""
    (tmp_path / "meta.json").write_text(json.dumps(meta_row()))
    rows = [
        coll_row(rank=0, comm_rank=0, phase="enter", t=1_000),
        coll_row(rank=1, comm_rank=1, phase="enter", t=1_500),
        coll_row(rank=0, comm_rank=0, phase="end", t=3_000, t_start=1_600),
        coll_row(rank=1, comm_rank=1, phase="end", t=3_000, t_start=None),
    ]
    (tmp_path / "coll.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


# ---------------------------------------------------------------------------------------------
# a real Kafka broker for the session
#
# Started once per session with failslow.infra.kafka_broker (infra/kafka/kafka.sh) on free
# ports in a temporary state dir, unless ``FAILSLOW_KAFKA`` names one. If it cannot start, the
# tests fail with the broker's log tail; they skip (with the reason) only outside CI when Java
# or Maven is missing.


@dataclass
class Broker:
    bootstrap: str
    state_dir: Path | None  # None: an external broker ($FAILSLOW_KAFKA), not ours to restart
    port: int = 0
    controller_port: int = 0


def _prerequisites_or_skip() -> None:
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing and not (infra.lib_dir() / ".complete").exists():
        reason = f"Kafka tests need {' and '.join(missing)} to run a broker"
        if os.environ.get("CI"):
            pytest.fail(reason + " (CI must run them)")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    external = os.environ.get(infra.ENV_BOOTSTRAP)
    if external:
        if not infra.probe(external, timeout=10):
            pytest.fail(f"{infra.ENV_BOOTSTRAP}={external} does not answer")
        yield Broker(external, None)
        return
    _prerequisites_or_skip()
    state = tmp_path_factory.mktemp("kafka-state")
    try:
        status = infra.kafka_up(0, state_dir=state, max_lifetime=3 * 3600, timeout=150)
    except infra.InfraError as e:
        pytest.fail(f"the Kafka broker did not start: {e}", pytrace=False)
    assert status.port and status.controller_port
    try:
        yield Broker(status.bootstrap, state, status.port, status.controller_port)
    finally:
        infra.kafka_down(state)


__all__ = ["SHARED", "SMALL", "Broker", "coll_row", "meta_row", "events"]
