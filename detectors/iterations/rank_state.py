"""Per-rank state of the iteration tracker and its anchor (Greyhound §4.2): each iteration
starts at one *anchor* operation, pinned by its communicator and its ``seq`` residue modulo
the calls on that communicator per period, so boundaries are found with one vectorized
test and the iteration numbers agree across ranks and restarts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from failslow.detectors.iterations.columns import _median0


@dataclass
class _Rank:
    """Per-rank state."""

    period: int = 0  # ops per iteration, 0 while learning
    anchor_comm: int = 0
    anchor_mod: int = 1  # calls on anchor_comm per period
    anchor_res: int = 0
    offset: int = 0  # added to (seq - res) // mod: iteration numbers of the reference rank
    last_idx: int = -1  # the latest boundary seen
    last_t: int = 0
    next_try: int = 0
    nobytes: bool = False  # symbols without bytes (bytes vary between iterations)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def commit_anchor(st: _Rank, period: int, comm: np.ndarray, seq: np.ndarray,
                  t: np.ndarray, ref: np.ndarray | None) -> None:
    """Choose the anchor phase: the operation closest in time to the reference rank's
    boundaries when there is a reference, else the one preceded by the longest median
    pause (the first call after the optimizer step)."""
    n = len(t)
    k = n // period
    lo = n - k * period
    times = t[lo:].reshape(k, period)
    phase = -1
    if ref is not None and len(ref) >= 2:
        rt = ref[:, 1]
        near = times[(times[:, 0] >= rt[0] - (rt[-1] - rt[0])) & (times[:, -1] <= rt[-1]
                                                                  + (rt[-1] - rt[0]))]
        if len(near):
            pos = np.clip(np.searchsorted(rt, near), 1, len(rt) - 1)
            dist = np.minimum(np.abs(near - rt[pos - 1]), np.abs(near - rt[pos]))
            phase = int(np.argmin(_median0(dist)))
    if phase < 0:
        gaps = np.concatenate(([np.nan], np.diff(t).astype(np.float64)))[lo:]
        g = gaps.reshape(k, period)
        if k > 1:
            g = g[1:]  # the first period may hold the pause before the trace began
        phase = int(np.argmax(_median0(np.where(np.isnan(g), -np.inf, g))))
    pos = lo + (k - 1) * period + phase  # the anchor in the last full period
    a_comm = comm[pos]
    window = comm[lo + (k - 1) * period: lo + k * period]
    mod = max(1, int(np.count_nonzero(window == a_comm)))
    phases = lo + np.arange(k) * period + phase
    res_all = seq[phases][comm[phases] == a_comm] % mod
    res = int(np.bincount(res_all).argmax()) if len(res_all) else int(seq[pos] % mod)
    st.period, st.anchor_comm, st.anchor_mod, st.anchor_res = period, int(a_comm), mod, res
    st.offset = 0
    if ref is not None and len(ref):
        # number the iterations like the reference: its boundary nearest to ours
        own = (int(seq[pos]) - res) // mod
        j = int(np.argmin(np.abs(ref[:, 1] - t[pos])))
        st.offset = int(ref[j, 0]) - own

