"""A slow level of the change tracker and the anomaly it may become (:class:`SlowLevel`),
the analysis window of a localization against its reference window (:class:`Window`), and
what two levels' evidence share: the chance a root persists by accident
(:func:`persistence_chance`) and whether two signatures name one fault (:func:`agree`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Window:
    """An anomaly window and its reference window (bins ``[lo, hi)`` and ``[b_lo, b_hi)``),
    their lengths (ns), the iteration times in each, and the fraction of wall time the
    slow-down costs (``lost = 1 - ref_iter / iter``)."""

    lo: int
    hi: int
    b_lo: int
    b_hi: int
    win_ns: float
    base_ns: float
    iter_ns: float
    ref_iter_ns: float

    @property
    def lost(self) -> float:
        return max(1.0 - self.ref_iter_ns / max(self.iter_ns, 1.0), 1e-3)

    @property
    def iterations(self) -> float:
        return max(self.win_ns / max(self.iter_ns, 1.0), 1e-3)

    @property
    def ref_iterations(self) -> float:
        return max(self.base_ns / max(self.ref_iter_ns, 1.0), 1e-3)


@dataclass
class SlowLevel:
    """A slow level of the change tracker and the anomaly it may become (internal).
    ``state``: ``pending`` (not yet localized with confidence), ``open`` (reported)."""

    anomaly: dict[str, Any]
    onset_pos: int
    ref_lo_ns: int  # reference window: [ref_lo_ns, start of the onset iteration)
    ref_iter_ns: float  # iteration time of the level below
    healthy_ns: float  # the job's healthy iteration time
    state: str = "pending"
    tries: int = 0
    signature: list[Any] = field(default_factory=list)
    seg_before: int = 0  # the change tracker's healthy segment start before this onset
    per_iter: list[Any] = field(default_factory=list)  # per slow iteration: its signature
    first: int = 0  # the first slow iteration (from the onset) of the persistent root
    # a slow link found with compute roots that are none of its ends' groups: a second,
    # independent fault over the same level, reported as its own anomaly (the communication
    # one; ``anomaly`` is then the compute one)
    extra: list[dict[str, Any]] = field(default_factory=list)
    # what its reports named, in order: [cause, ranks, link, detected_ns]
    named: list[list[Any]] = field(default_factory=list)

    def note_report(self) -> None:
        """Remember what the anomaly's report names (:meth:`known_since`)."""
        a = self.anomaly
        self.named.append([a["cause"], list(a["ranks"] or []), a.get("link"),
                           a["detected_ns"]])

    def known_since(self, now: int) -> int:
        """When the anomaly's diagnosis was first reported, if a report named it before
        and every report since named its ranks too (a transient second root came and
        went; the diagnosis did not change back and forth); else ``now``."""
        a = self.anomaly
        ranks = list(a["ranks"] or [])
        for cause, named, link, detected in reversed(self.named):
            if cause != a["cause"] or not set(named) >= set(ranks):
                break
            if named == ranks and link == a.get("link"):
                return int(detected)
        return now


def persistence_chance(probs: Sequence[float], hits: int) -> float:
    """Probability that one given rank is among the named roots of at least ``hits`` of
    the iterations by accident, when iteration ``i`` names each rank with probability
    ``probs[i]`` (Poisson-binomial upper tail). A fail-slow keeps naming the same one or
    two ranks; noise (pauses, longer sequences of a whole replica) names many ranks at
    once, so two iterations that share one of their many roots are no evidence."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for p in probs:
        dist[1:] = dist[1:] * (1.0 - p) + dist[:-1] * p
        dist[0] *= 1.0 - p
    return float(dist[hits:].sum())


def agree(a: list[Any], b: list[Any]) -> bool:
    """Two localization signatures ``[communication?, link nodes, compute roots]`` name the
    same fault: the same kind of evidence and a common link or a common root rank."""
    if bool(a[0]) != bool(b[0]):
        return False
    if a[0] and a[1] and b[1] and sorted(a[1]) != sorted(b[1]):
        return False
    if a[2] and b[2]:
        # the strongest root of the part is a root of the whole
        return b[2][0] in a[2]
    return bool(a[0]) or not (a[2] or b[2])
