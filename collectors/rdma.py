"""RDMA port-counter sampler of the node agent (sysfs ``/sys/class/infiniband``).

MegaTrace (megatrace.md §III-B) measures work requests per NIC; without the verbs shim
(``native/verbs``) the port counters still give the bandwidth of each port. They map onto the
``link`` kind of the event contract: ``bytes`` from ``port_xmit_data`` (counted in 4-byte
words by the InfiniBand spec, so x4), ``posted`` from ``port_xmit_packets`` and ``completed``
from ``port_rcv_packets`` (packets, not work requests: only their slopes compare).

Without an RDMA NIC the collector is *unavailable* (no data), not *failed*.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from failslow import events

__all__ = ["RdmaCollector", "SYSFS_ROOT"]

SYSFS_ROOT = Path("/sys/class/infiniband")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip() or 0)


class RdmaCollector:
    """Samples the counters of every port of every RDMA device under ``root``."""

    name = "rdma"

    def __init__(self, job: str, node: str, root: str | Path = SYSFS_ROOT) -> None:
        self.job, self.node = job, node
        self.root = Path(root)
        self.ports = sorted(self.root.glob("*/ports/*/counters")) if self.root.is_dir() else []
        self.reason = "" if self.ports else f"no RDMA device under {self.root}"

    @property
    def available(self) -> bool:
        return bool(self.ports)

    def sample(self, now_ns: int | None = None) -> dict[str, pa.Table]:
        if not self.ports:
            return {}
        t = now_ns or time.time_ns()
        rows = []
        for c in self.ports:
            device, port = c.parent.parent.parent.name, c.parent.name
            rows.append({
                "job": self.job, "node": self.node, "rank": None,
                "device": f"{device}/{port}", "peer_node": None, "t": t,
                "posted": _read_int(c / "port_xmit_packets"),
                "completed": _read_int(c / "port_rcv_packets"),
                "bytes": 4 * _read_int(c / "port_xmit_data"),
            })
        return {"link": events.from_rows("link", rows)}

    def close(self) -> None:
        pass
