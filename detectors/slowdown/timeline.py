"""The job iterations the slow-down detector pushed to its change tracker, by their position
in the tracker's stream, and the analysis windows cut from them: every decision is taken
at the end of a job iteration, on the data before that end (whole time bins)."""

from __future__ import annotations

import numpy as np

from failslow.detectors.slowdown.levels import SlowLevel, Window


class IterationTimeline:
    """Pushed job iterations ``[idx, t_start, duration]`` (``iters[0]`` is position
    ``offset`` of the change tracker's stream), the end of the latest one (``horizon``:
    decisions use data before it) and the end of the first (warm-up) one."""

    def __init__(self) -> None:
        self.iters: list[list[int]] = []
        self.offset = 0
        self.horizon = 0
        self.first_t = 0

    def push(self, idx: int, t0: int, dur: int) -> bool:
        """Add a job iteration; False when it is not newer than the latest one."""
        if self.iters and idx <= self.iters[-1][0]:
            return False
        self.iters.append([idx, t0, dur])
        self.horizon = max(self.horizon, t0 + dur)
        if self.first_t == 0:
            self.first_t = t0 + dur  # skip the first iteration (warm-up)
        return True

    def pos(self, pos: int) -> int:
        """The index in ``iters`` of stream position ``pos`` (clipped to the kept ones)."""
        return min(max(pos - self.offset, 0), len(self.iters) - 1)

    def at(self, pos: int) -> list[int]:
        return self.iters[self.pos(pos)]

    def window(self, level: SlowLevel, lo_pos: int, hi_ns: int, shift: int) -> Window:
        """Bins (of width ``2^shift``) of the window from iteration ``lo_pos`` up to
        ``hi_ns`` and of ``level``'s reference window, with their iteration times."""
        s = shift
        t_lo = self.at(lo_pos)[1]
        lo, hi = t_lo >> s, max(hi_ns >> s, (t_lo >> s) + 1)
        b_hi = self.at(level.onset_pos)[1] >> s
        b_lo = min(level.ref_lo_ns >> s, b_hi - 1)
        a, b = self.pos(lo_pos), len(self.iters)
        durs = [d for _, t, d in self.iters[a:b] if t + d <= hi_ns] or [self.iters[a][2]]
        return Window(lo, hi, b_lo, b_hi, float(max((hi << s) - (lo << s), 1)),
                      float(max((b_hi - b_lo) << s, 1)), float(np.median(durs)),
                      level.ref_iter_ns)

    def trim(self, keep: int, earliest: int | None) -> None:
        """Keep ``2 x keep`` iterations once there are more than ``4 x keep``, but none
        from stream position ``earliest`` on (an open level's reference)."""
        if len(self.iters) > 4 * keep:
            drop = len(self.iters) - 2 * keep
            if earliest is not None:
                drop = min(drop, earliest - self.offset)
            if drop > 0:
                self.iters = self.iters[drop:]
                self.offset += drop
