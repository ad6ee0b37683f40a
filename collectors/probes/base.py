"""The one interface of every probe kind, and the ``probe`` row it returns."""

from __future__ import annotations

import time
from typing import Any, Protocol

from failslow.engine.probes import ProbeRequest

__all__ = ["Probe", "ProbeFailed", "ProbeTimeout", "make_row", "Deadline"]


class ProbeFailed(Exception):
    """The probe could not measure (peer down, refused, protocol error)."""


class ProbeTimeout(Exception):
    """The probe ran out of its deadline."""


class Deadline:
    """Seconds left until a monotonic deadline."""

    def __init__(self, seconds: float, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.at = clock() + seconds

    def left(self) -> float:
        return self.at - self.clock()

    def check(self, what: str) -> float:
        """Seconds left; ProbeTimeout naming ``what`` when none are."""
        left = self.left()
        if left <= 0:
            raise ProbeTimeout(f"deadline reached during {what}")
        return left


class Probe(Protocol):
    """A probe kind: measures one operation for ``request`` before ``deadline`` and returns
    ``(elapsed_ns, bytes)`` (bytes None when it moves none); raises :class:`ProbeTimeout` or
    :class:`ProbeFailed`. The runner adds the baseline and turns everything into a row."""

    kind: str

    def measure(self, request: ProbeRequest, deadline: Deadline) -> tuple[int, int | None]: ...


def make_row(request: ProbeRequest, node: str, status: str, duration_ns: int,
             elapsed_ns: int | None = None, nbytes: int | None = None,
             baseline_ns: int | None = None, detail: str | None = None) -> dict[str, Any]:
    """One ``probe`` row (docs/events-v2.md) answering ``request``."""
    return {"job": request.job, "t": time.time_ns(), "node": node, "request": request.id,
            "probe": request.probe, "rank": request.rank, "peer": request.peer,
            "status": status, "duration_ns": int(duration_ns), "elapsed_ns": elapsed_ns,
            "bytes": nbytes, "baseline_ns": baseline_ns, "detail": detail}
