"""Applying Greyhound's S2 in a training loop: per-iteration micro-batch counts from advice.

Greyhound (greyhound.md §5) re-balances micro-batches across data-parallel groups when one is
slow (strategy S2): group i runs m_i micro-batches with sum M, chosen to minimise
max_i m_i t_i (:mod:`failslow.mitigation.microbatches`). The planner publishes that allocation
as a ``mitigation_advice`` (:mod:`failslow.mitigation.planner`); this client is what the
training loop calls every iteration to learn its own m_i.

Source of advice: a JSON file (the latest advice object, or a JSON Lines log of them: the last
line wins) or an HTTP endpoint on 127.0.0.1 serving the latest advice object. ``apply``
advices with an S2 plan set the counts; a ``revert`` advice restores the even split. Reading is
throttled (``min_interval_s``) and never raises: the last good allocation stays in force.

Correctness: with unequal m_i, each group divides its summed gradient by M (not by m_i) and
the DP all-reduce sums: ``sum_i (sum of m_i micro-batch gradients) / M`` is the mean over all
M micro-batches, the same as the even split (:func:`weight`).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["MicrobatchClient", "weight", "even_split"]


def even_split(total: int, dp_size: int) -> list[int]:
    """M micro-batches over ``dp_size`` groups as evenly as possible (the default)."""
    q, r = divmod(total, dp_size)
    return [q + (1 if i < r else 0) for i in range(dp_size)]


def weight(total: int) -> float:
    """Factor applied to a group's summed micro-batch gradients before the SUM all-reduce."""
    return 1.0 / total


class MicrobatchClient:
    """Micro-batch count of one DP group from the latest S2 advice."""

    def __init__(self, source: str | Path, *, dp_rank: int, dp_size: int, total: int,
                 job: str | None = None, min_interval_s: float = 0.0,
                 timeout_s: float = 0.5) -> None:
        self.source = str(source)
        self.dp_rank, self.dp_size, self.total = dp_rank, dp_size, total
        self.job = job
        self.min_interval_s, self.timeout_s = min_interval_s, timeout_s
        self.m = even_split(total, dp_size)
        self.advice_id: str | None = None
        self.errors = 0
        self._last = float("-inf")
        self.history: list[tuple[int, float, int]] = []

    def _read(self) -> dict[str, Any] | None:
        if self.source.startswith(("http://127.0.0.1", "http://localhost")):
            with urllib.request.urlopen(self.source, timeout=self.timeout_s) as r:  # noqa: S310
                text = r.read().decode()
        else:
            p = Path(self.source)
            if not p.exists():
                return None
            text = p.read_text()
        text = text.strip()
        if not text:
            return None
        if "\n" in text and not text.startswith("{\n"):
            text = text.splitlines()[-1]
        obj = json.loads(text)
        return obj if isinstance(obj, dict) else None

    def refresh(self) -> list[int]:
        """Re-read the advice (throttled) and return the allocation of every group."""
        now = time.monotonic()
        if now - self._last < self.min_interval_s:
            return self.m
        self._last = now
        try:
            adv = self._read()
        except (OSError, ValueError) as e:  # unreachable endpoint, partial file: keep the last
            self.errors += 1
            self.last_error = str(e)
            return self.m
        if not adv or (self.job and adv.get("job") not in (None, self.job)):
            return self.m
        if adv.get("strategy", "S2") != "S2":
            return self.m
        if adv.get("action") == "revert":
            self.m = even_split(self.total, self.dp_size)
        else:
            plan = adv.get("plan") or {}
            m = plan.get("m") if isinstance(plan, dict) else None
            if (isinstance(m, list) and len(m) == self.dp_size and all(
                    isinstance(v, int) and v >= 1 for v in m) and sum(m) == self.total):
                self.m = list(m)
            else:
                self.errors += 1
                self.last_error = f"ignored S2 plan {m!r}: needs {self.dp_size} counts >= 1 " \
                                  f"summing to {self.total}"
        self.advice_id = adv.get("advice_id")
        return self.m

    def microbatches(self) -> int:
        """This group's micro-batch count for the next iteration."""
        return self.refresh()[self.dp_rank]

    def report(self, iteration: int, seconds: float) -> None:
        """Record an iteration time (kept for evaluation)."""
        self.history.append((iteration, seconds, self.m[self.dp_rank]))
