"""``failslow bench pipeline --processes N`` (issue 13 item 6): one job's evidence reduced by
1, 2, ... N reducer processes side by side (``failslow process --detectors evidence
--shard I/n``, each its own consumer group, pinned to the cores round robin) from the
backlog :mod:`.pipeline` published on the real local broker.

Per process count: the time from the first message any of them read to the last
checkpoint of the slowest (``drain_s``), the job's rows over it (``rows_per_s``), each
process's CPU seconds per second of trace, and the consumer lag over time: every half
second, the messages of the event and iterations topics the slowest group has not
committed yet (``lag``: ``[seconds, messages]``). The lag curve falls as fast as the
slowest reducer works through the backlog; a count that keeps up with the job live is one
whose processes each need at most one CPU second per second of trace."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: seconds between two lag samples
LAG_EVERY_S = 0.5


def _lag(bootstrap: str, topics: Sequence[str], groups: Sequence[str]) -> int:
    """The most messages of ``topics`` any of ``groups`` has not committed."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench-lag")
    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                           enable_auto_commit=False, client_id="bench-lag")
    try:
        tps = [TopicPartition(t, p) for t in topics
               for p in (reader.partitions_for_topic(t) or ())]
        ends = {tp: int(o) for tp, o in reader.end_offsets(tps).items()}
        worst = 0
        for group in groups:
            try:
                offsets = admin.list_group_offsets({group: None}).get(group, {})
            except Exception:  # noqa: BLE001 - a group not known yet has committed nothing
                offsets = {}
            done = {tp: int(om.offset) for tp, om in offsets.items()}
            worst = max(worst, sum(max(0, end - done.get(tp, 0)) for tp, end in ends.items()))
        return worst
    finally:
        reader.close()
        admin.close()


def reducer_scaling(bootstrap: str, prefix: str, tmp: Path, counts: Sequence[int],
                    cores: Sequence[int], figures: dict[str, Any],
                    start: Callable[..., Any], finish: Callable[..., dict[str, Any]],
                    cpu_of: Callable[[dict[str, Any]], float]) -> list[dict[str, Any]]:
    """The figures of each process count of ``counts`` (module docstring). ``start``,
    ``finish`` and ``cpu_of`` are :mod:`.pipeline`'s processor helpers."""
    from failslow.stream.exports import export_topic
    from failslow.stream.transport import EVENT_TOPICS

    topics = [prefix + t for t in (*EVENT_TOPICS, export_topic("iterations"))]
    trace_s = figures["iterations"] * figures["simulated_iteration_s"]
    out = []
    for n in counts:
        tag = uuid.uuid4().hex[:6]
        groups = [f"bench-reduce{n}-{i}-{tag}" for i in range(n)]
        dirs = [tmp / f"reduce{n}-{i}" for i in range(n)]
        procs = []
        for i, (group, d) in enumerate(zip(groups, dirs, strict=True)):
            d.mkdir()
            procs.append(start(d, cores[i % len(cores)], group, "--exit-when-idle", "8",
                               "--no-store-events", "--checkpoint-interval", "0.5",
                               "--detectors", "evidence", "--shard", f"{i}/{n}",
                               "--import", "iterations", "--export", "evidence"))
        t0, lag = time.monotonic(), []
        while any(p.poll() is None for p in procs):
            lag.append([round(time.monotonic() - t0, 1), _lag(bootstrap, topics, groups)])
            time.sleep(LAG_EVERY_S)
        stats = [finish(p, d) for p, d in zip(procs, dirs, strict=True)]
        first = min(int(s["first_message_ns"]) for s in stats)
        last = max(int(s["last_checkpoint_ns"]) for s in stats)
        drain = max((last - first) / 1e9, 1e-9)
        cpu = [round(cpu_of(s) / max(trace_s, 1e-9), 3) for s in stats]
        out.append({"processes": n, "drain_s": round(drain, 2),
                    "rows_per_s": round(figures["rows"] / drain),
                    "cpu_s_per_trace_s": cpu, "keeps_up": max(cpu) <= 1.0,
                    "lag": lag})
    return out
