"""A probe the agent skipped (its rank stayed inside a collective, a rate limit) is asked
again when the anomaly is next reported, at most ``max_tries`` times; one that ran is not."""

from __future__ import annotations

from failslow.diagnosis import Anomaly
from failslow.engine.analyzer import JobAnalyzer, JobConfig
from failslow.engine.probes import ProbeRequester
from failslow.events import Comm, JobMeta

META = JobMeta(job="pj", t=0, world_size=8, tp=1, pp=1, dp=8, cp=1, microbatches=1,
               schedule="1f1b", nodes={r: f"n{r // 2}" for r in range(8)},
               comms=(Comm(1, "dp", tuple(range(8))),))


def test_a_skipped_probe_is_asked_again_up_to_max_tries() -> None:
    a = Anomaly("slow-0", "slow", "compute", [3], None, comm=1)
    req = ProbeRequester(META, frozenset({"pj"}))
    first = req.requests([a])
    suspect = next(r for r in first if r.role == "suspect")
    assert req.requests([a]) == []  # asked once per anomaly
    for _ in range(req.max_tries - 1):
        req.answered([{"request": suspect.id, "status": "skipped"}])
        again = req.requests([a])
        assert [r.id for r in again] == [suspect.id]
    req.answered([{"request": suspect.id, "status": "skipped"}])
    assert req.requests([a]) == []  # max_tries reached
    other = next(r for r in first if r.role == "reference")
    req.answered([{"request": other.id, "status": "ok"}])
    assert req.requests([a]) == []  # it ran: never again


def test_the_tries_survive_a_snapshot() -> None:
    analyzer = JobAnalyzer(META, JobConfig(probe_jobs=frozenset({"pj"}), planner=None))
    analyzer.requester.asked = {"x"}
    analyzer.requester.tries = {"x": 2}
    restored = JobAnalyzer(META, JobConfig(probe_jobs=frozenset({"pj"}), planner=None))
    restored.restore(analyzer.snapshot())
    assert restored.requester.tries == {"x": 2} and restored.requester.asked == {"x"}
