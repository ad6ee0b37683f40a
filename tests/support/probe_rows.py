"""Probe rows (docs/events-v2.md ``probe``) answering a job's stored anomalies, as the node
agents would write them, and the anomalies' next reports with that evidence applied: what
the probe-cost panels read (issue 17)."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from failslow import events
from failslow.diagnosis import Anomaly
from failslow.engine.probes import apply_probe_evidence, request_id

MS = 1_000_000


def rows_for(job: str, a: Anomaly, t: int, world: int = 16) -> list[dict[str, Any]]:
    """Every outcome once: a compute suspect gets a slow GEMM (ok), its reference a healthy
    one (ok) and a GEMM refused while its rank was in a collective (skipped); a link suspect
    a p2p transfer (ok), one that failed and a zero-payload round trip that timed out."""
    def row(probe: str, rank: int, peer: int | None, role: str, status: str, dur: int,
            elapsed: int | None, detail: str | None = None, **kw: Any) -> dict[str, Any]:
        return {"job": job, "t": t, "node": f"node{rank // 4:03d}",
                "request": request_id(a.id, probe, rank, peer, role), "probe": probe,
                "rank": rank, "peer": peer, "status": status, "duration_ns": dur,
                "elapsed_ns": elapsed, "bytes": kw.get("bytes"),
                "baseline_ns": kw.get("baseline_ns"), "detail": detail}

    if a.link:
        x, y = int(a.link[0]), int(a.link[1])
        return [row("p2p", x, y, "suspect", "ok", 90 * MS, 60 * MS, bytes=4 << 20),
                row("p2p", 0, 8, "reference", "failed", 5 * MS, None,
                    "connection refused by node002"),
                row("rtt", x, y, "suspect", "timeout", 2000 * MS, None, "no answer in 2.0 s")]
    if not a.ranks:
        return []
    r = int(a.ranks[0])
    return [row("gemm", r, None, "suspect", "ok", 250 * MS, 32 * MS, baseline_ns=20 * MS),
            row("gemm", (r + 2) % world, None, "reference", "ok", 200 * MS, 20 * MS),
            row("gemm", (r + 4) % world, None, "reference", "skipped", 1 * MS, None,
                "rank inside a collective until the deadline")]


def load(client: Any, database: str, job: str, anomalies: list[Anomaly],
         t: dict[str, int]) -> tuple[list[dict[str, Any]], list[Anomaly]]:
    """Insert the probe rows answering ``anomalies`` (ended at ``t[id]``) and each anomaly's
    next report with the evidence applied; returns both."""
    from failslow.stream.clickhouse import Store
    from failslow.stream.sink import AnomalyReport, anomalies_table

    rows: list[dict[str, Any]] = []
    updated: list[Anomaly] = []
    for a in anomalies:
        mine = rows_for(job, a, t[a.id])
        if not mine:
            continue
        rows += mine
        copy = Anomaly.from_dict(a.to_dict())
        assert apply_probe_evidence(copy, mine)
        updated.append(copy)
    store = Store(client, database, create=False)
    store.insert("probe", events.conform(pa.Table.from_pylist(rows, events.SCHEMAS["probe"]),
                                         "probe"))
    version = int(client.query(f"SELECT max(version) FROM `{database}`.anomalies WHERE "
                               f"job = '{job}'").result_rows[0][0]) + 1
    store.insert("anomalies", anomalies_table(
        [AnomalyReport(job, u, version, time.time_ns()) for u in updated]))
    return rows, updated
