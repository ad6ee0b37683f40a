"""Active validation, the job side (issue 17; Greyhound §4.3 validation, MEGATRACE's
zero-payload probes): which suspects to probe, and what the probes' ``probe`` rows
(docs/events-v2.md) say about an open anomaly.

- :class:`ProbeRequester` turns open anomalies the detectors could not pin into
  :class:`ProbeRequest` s: a communication anomaly with ``link: null`` gets a ``p2p`` probe per
  candidate pair (plus one reference pair of the same communicator when there is a single
  candidate), a compute anomaly without GPU evidence (no ``extra["gpu"]``) a ``gemm`` on each
  of its ranks (plus one reference rank), a hardware hang (H3) a zero-payload ``rtt`` on its
  link or candidate hops (which answer is recorded; the link is not changed by it). At most
  one request per suspect per anomaly, only for jobs with probes enabled. Requests travel as
  JSON on :data:`PROBE_REQUESTS_TOPIC`; the node agent of the probed rank runs them
  (:mod:`failslow.collectors.probes`).
- :func:`apply_probe_evidence` reads the rows that answer an anomaly's requests (the request id
  names the anomaly): a ``p2p`` pair clearly slower than its reference names the link, a
  ``gemm`` confirms or clears a compute rank, a failed or timed-out probe changes nothing but
  says why (``extra["probe"]["not_run"]``; :func:`apply_probe_rows` logs one line), and
  ``extra["probe_cost"]`` counts the probes' own seconds and the training time they may have
  cost.
- :func:`apply_probe_rows` and :func:`carry_probe_evidence` are the engine's hooks: the first
  applies a batch's ``probe`` rows to the anomalies they answer, the second keeps that evidence
  when a detector re-reports the anomaly.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from failslow.diagnosis import Anomaly
from failslow.events import PROBE_KINDS, JobMeta

log = logging.getLogger(__name__)

__all__ = ["PROBE_REQUESTS_TOPIC", "ProbeRequest", "ProbeRequester", "apply_probe_evidence",
           "apply_probe_rows", "carry_probe_evidence", "request_id", "parse_request_id"]

#: The topic of probe requests (JSON, keyed by job); every node agent reads all of them in
#: its own consumer group and runs those of its ranks.
PROBE_REQUESTS_TOPIC = "failslow.probe-requests"
#: a probed pair or rank this many times slower than its reference is named
SLOW_FACTOR = 1.5
#: within this factor of its reference a probed GPU or pair is healthy
HEALTHY_FACTOR = 1.15
#: the keys of ``extra`` that probe evidence writes (kept across detector re-reports)
EVIDENCE_KEYS = ("probe", "probe_cost")


@dataclass
class ProbeRequest:
    """One probe to run: ``rank`` (on ``node``) probed alone (``gemm``) or towards ``peer``
    (on ``peer_node``: ``p2p``, ``rtt``). ``role``: ``suspect`` or ``reference``."""

    id: str
    job: str
    probe: str
    rank: int
    node: str = ""
    peer: int | None = None
    peer_node: str | None = None
    deadline_s: float = 2.0
    role: str = "suspect"
    t: int = 0

    def __post_init__(self) -> None:
        if self.probe not in PROBE_KINDS:
            raise ValueError(f"unknown probe kind {self.probe!r}; known: {PROBE_KINDS}")
        if self.probe != "gemm" and self.peer is None:
            raise ValueError(f"a {self.probe} probe needs a peer")
        if not self.deadline_s > 0:
            raise ValueError("deadline_s must be positive")

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> ProbeRequest:
        """Parse a request; ValueError on anything malformed."""
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"probe request is not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError("probe request is not a JSON object")
        known = set(cls.__dataclass_fields__)
        try:
            return cls(**{k: v for k, v in obj.items() if k in known})
        except TypeError as e:
            raise ValueError(f"probe request: {e}") from None


def request_id(anomaly_id: str, probe: str, rank: int, peer: int | None, role: str) -> str:
    """The id of a request answering ``anomaly_id`` (parsed back by
    :func:`parse_request_id`)."""
    return f"{anomaly_id}/{probe}/{rank}/{-1 if peer is None else peer}/{role}"


def parse_request_id(rid: str) -> tuple[str, str, int, int | None, str] | None:
    """``(anomaly_id, probe, rank, peer, role)`` of a request id, None if not one of ours."""
    parts = rid.rsplit("/", 4)
    if len(parts) != 5:
        return None
    try:
        rank, peer = int(parts[2]), int(parts[3])
    except ValueError:
        return None
    return parts[0], parts[1], rank, (None if peer < 0 else peer), parts[4]


@dataclass
class ProbeRequester:
    """Requests for the suspects of open anomalies (module docstring). ``jobs``: the jobs
    with probes enabled (``*``: all). Remembers what it asked, so a suspect is asked about
    once per anomaly; a request the agent skipped (its rank stayed inside a collective, a
    rate limit) may be asked again when the anomaly is next reported, ``max_tries`` times in
    all."""

    meta: JobMeta
    jobs: frozenset[str] = frozenset()
    deadline_s: float = 2.0
    asked: set[str] = field(default_factory=set)
    #: how many times each request was asked
    tries: dict[str, int] = field(default_factory=dict)
    max_tries: int = 3

    def answered(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Probe rows came back: a skipped request may be asked again (``max_tries``)."""
        for r in rows:
            rid = str(r.get("request", ""))
            if r.get("status") == "skipped" and self.tries.get(rid, 0) < self.max_tries:
                self.asked.discard(rid)

    @property
    def enabled(self) -> bool:
        return "*" in self.jobs or self.meta.job in self.jobs

    def node(self, rank: int) -> str:
        return self.meta.nodes.get(rank, "")

    def requests(self, anomalies: Iterable[Anomaly], now_ns: int = 0) -> list[ProbeRequest]:
        """New requests for the open anomalies among ``anomalies``."""
        if not self.enabled:
            return []
        out: list[ProbeRequest] = []
        for a in anomalies:
            if a.end_ns is not None:
                continue
            for probe, rank, peer, role in self._suspects(a):
                rid = request_id(a.id, probe, rank, peer, role)
                if rid in self.asked:
                    continue
                self.asked.add(rid)
                self.tries[rid] = self.tries.get(rid, 0) + 1
                out.append(ProbeRequest(
                    rid, self.meta.job, probe, rank, self.node(rank), peer,
                    None if peer is None else self.node(peer), self.deadline_s, role, now_ns))
        return out

    def _suspects(self, a: Anomaly) -> list[tuple[str, int, int | None, str]]:
        if a.kind == "hang":  # a stalled transfer (H3): does the link still answer?
            if a.cause != "hardware":
                return []
            pairs = [tuple(a.link)] if a.link else self._candidate_pairs(a)
            return [("rtt", int(x), int(y), "suspect") for x, y in pairs]
        out: list[tuple[str, int, int | None, str]] = []
        if a.cause in ("communication", "mixed") and a.link is None:
            pairs = self._candidate_pairs(a)
            out += [("p2p", x, y, "suspect") for x, y in pairs]
            if len(pairs) == 1:
                ref = self._reference_pair(a, pairs[0])
                if ref is not None:
                    out.append(("p2p", ref[0], ref[1], "reference"))
        if a.cause in ("compute", "mixed") and "gpu" not in a.extra and a.ranks:
            out += [("gemm", r, None, "suspect") for r in sorted(set(a.ranks))]
            other = self._reference_rank(a)
            if other is not None:
                out.append(("gemm", other, None, "reference"))
        return out

    def _candidate_pairs(self, a: Anomaly) -> list[tuple[int, int]]:
        """Rank pairs at the ends of the candidate links, sender first: the slow-down
        detector's candidate hops (``link_candidates``), else the link-rate detector's
        candidate node pairs (first rank of each node), else neighbouring ranks of the
        anomaly, else (a mixed anomaly of one rank) that rank's own hops."""
        first: dict[str, int] = {}
        for r, n in sorted(self.meta.nodes.items()):
            first.setdefault(n, r)
        pairs: list[tuple[int, int]] = [
            (int(p[0]), int(p[1])) for p in a.extra.get("link_candidates") or [] if len(p) == 2]
        if not pairs:
            for cand in a.extra.get("candidate_nodes") or []:
                if len(cand) == 2 and cand[0] in first and cand[1] in first:
                    pairs.append((first[cand[0]], first[cand[1]]))
        if not pairs:
            ranks = sorted(set(a.ranks))
            pairs = list(zip(ranks, ranks[1:], strict=False))
        if not pairs and a.cause == "mixed" and len(set(a.ranks)) == 1:
            pairs = self._own_hops(a.ranks[0])
        return list(dict.fromkeys(pairs))

    def _own_hops(self, rank: int) -> list[tuple[int, int]]:
        """The hops of ``rank`` to its neighbours in each of its communicators (to it, then
        from it), those that leave its node when any does: the candidates of the slow link of
        a mixed slow-down whose slow rank is known but not its link."""
        pairs: list[tuple[int, int]] = []
        for c in self.meta.comms:
            members = list(c.ranks)
            if rank not in members or len(members) < 2:
                continue
            i = members.index(rank)
            prev, nxt = members[i - 1], members[(i + 1) % len(members)]
            pairs += [(prev, rank)] if prev == nxt else [(prev, rank), (rank, nxt)]
        cross = [p for p in pairs if self.node(p[0]) != self.node(p[1])]
        return cross or pairs

    def _comm_members(self, a: Anomaly) -> tuple[int, ...]:
        for c in self.meta.comms:
            if c.comm == a.comm:
                return tuple(c.ranks)
        return ()

    def _reference_pair(self, a: Anomaly, pair: tuple[int, int]) -> tuple[int, int] | None:
        """Two neighbouring members of the anomaly's communicator, away from ``pair`` and its
        nodes, so they measure a different link."""
        members = self._comm_members(a) or tuple(sorted(self.meta.nodes))
        avoid = {self.node(pair[0]), self.node(pair[1])}
        for x, y in zip(members, members[1:], strict=False):
            if {x, y} & set(pair) or {self.node(x), self.node(y)} & avoid:
                continue
            if self.node(x) != self.node(y):
                return x, y
        # no neighbours fit: the first two members on other, distinct nodes
        first: dict[str, int] = {}
        for r in members:
            if self.node(r) not in avoid and r not in pair:
                first.setdefault(self.node(r), r)
        picked = sorted(first.values())[:2]
        return (picked[0], picked[1]) if len(picked) == 2 else None

    def _reference_rank(self, a: Anomaly) -> int | None:
        members = self._comm_members(a) or tuple(sorted(self.meta.nodes))
        return next((r for r in members if r not in a.ranks), None)


# ---------------------------------------------------------------------------------------------
# evidence


def _ratio(elapsed: int, ref: float | None) -> float | None:
    return None if ref is None or ref <= 0 else round(elapsed / ref, 3)


def _reference(row: Mapping[str, Any], others: list[Mapping[str, Any]]) -> float | None:
    """What the row is compared with: the smaller of its own baseline (the same probe's
    earlier runs) and the median of the other probed pairs or ranks of the same kind, so a
    link slow since before its first probe is still seen against its healthy peers."""
    refs = [float(row["baseline_ns"])] if row.get("baseline_ns") else []
    times = [float(o["elapsed_ns"]) for o in others if o is not row]
    if times:
        refs.append(statistics.median(times))
    return min(refs) if refs else None


def probe_cost(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The probes' own wall time (``duration_ns``: set-up, warm-up and every repeat, not the
    wait for idle ranks), and the training time they may have cost: the job is not stopped,
    so at most the time the probed GPU or link was shared with it, the whole of a probe that
    ran (not only its one measured operation, ``elapsed_ns``); a skipped probe costs
    nothing."""
    own = sum(int(r.get("duration_ns") or 0) for r in rows)
    lost = sum(int(r.get("duration_ns") or 0) for r in rows if r.get("status") != "skipped")
    return {"probes": len(rows), "probe_s": round(own / 1e9, 6),
            "training_lost_s": round(lost / 1e9, 6)}


def apply_probe_evidence(anomaly: Anomaly, probe_rows: Iterable[Mapping[str, Any]]) -> bool:
    """Turn the rows answering ``anomaly``'s requests (with those already applied, kept in
    ``extra["probe"]["runs"]``) into evidence on it (module docstring). Returns whether the
    anomaly changed."""
    before = json.dumps(anomaly.to_dict(), sort_keys=True, default=str)
    ev = anomaly.extra.get("probe") or {}
    runs = {r["request"]: r for r in ev.get("runs", [])}
    for row in probe_rows:
        parsed = parse_request_id(str(row.get("request", "")))
        if parsed is None or parsed[0] != anomaly.id:
            continue
        runs[str(row["request"])] = {k: row.get(k) for k in (
            "request", "probe", "rank", "peer", "status", "duration_ns", "elapsed_ns", "bytes",
            "baseline_ns", "detail")}
    if not runs:
        return False
    rows = sorted(runs.values(), key=lambda r: str(r["request"]))
    ev = {"runs": rows}
    problems = [_not_run(r) for r in rows if r["status"] != "ok"]
    if problems:
        ev["not_run"] = problems
    ok = [r for r in rows if r["status"] == "ok" and r.get("elapsed_ns")]
    p2p = [r for r in ok if r["probe"] == "p2p"]
    gemm = [r for r in ok if r["probe"] == "gemm"]
    rtt = [r for r in rows if r["probe"] == "rtt" and r["status"] in ("ok", "timeout")]
    if p2p:
        ev.update(_p2p_verdict(anomaly, p2p))
    if gemm:
        ev.update(_gemm_verdict(anomaly, gemm))
        ev.setdefault("verdict", _gemm_text(ev))
    if rtt:  # MEGATRACE: a path that answers is up; one that does not is a candidate
        ev["rtt"] = [{"pair": [r["rank"], r["peer"]], "answered": r["status"] == "ok",
                      "elapsed_ns": r.get("elapsed_ns")} for r in rtt]
    if not p2p and not gemm and not rtt:
        ev["verdict"] = "inconclusive: no probe completed"
    anomaly.extra["probe"] = ev
    anomaly.extra["probe_cost"] = probe_cost(rows)
    return json.dumps(anomaly.to_dict(), sort_keys=True, default=str) != before


def _not_run(r: Mapping[str, Any]) -> str:
    """Why a probe gave no measurement, in words."""
    return (f"{r['probe']} {r['rank']}" + ("" if r.get("peer") is None else f"-{r['peer']}")
            + f": {r['status']} ({r.get('detail') or 'no detail'})")


def _role(row: Mapping[str, Any]) -> str:
    parsed = parse_request_id(str(row["request"]))
    return parsed[4] if parsed else "suspect"


def _p2p_verdict(anomaly: Anomaly, rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    pairs = []
    for r in rows:
        ref = _reference(r, rows)
        pairs.append({"pair": [r["rank"], r["peer"]], "role": _role(r),
                      "elapsed_ns": r["elapsed_ns"], "reference_ns": ref,
                      "ratio": _ratio(int(r["elapsed_ns"]), ref),
                      "gbit_s": round(8 * int(r.get("bytes") or 0) / int(r["elapsed_ns"]), 3)})
    slow = [p for p in pairs if p["role"] == "suspect" and p["ratio"] is not None
            and p["ratio"] >= SLOW_FACTOR]
    out: dict[str, Any] = {"p2p": pairs}
    if anomaly.link is None and slow:
        worst = max(slow, key=lambda p: p["ratio"])
        anomaly.link = sorted(int(x) for x in worst["pair"])
        out["link_named_by"] = "p2p"
        if anomaly.cause == "communication":  # diagnosis.md: the smallest set explaining it
            out["ranks_before_probe"] = list(anomaly.ranks)
            anomaly.ranks = list(anomaly.link)
        out["verdict"] = (f"link {worst['pair'][0]}-{worst['pair'][1]} is {worst['ratio']}x "
                          "slower than its reference")
    elif slow:
        out["verdict"] = "confirmed: a suspect pair is slow"
    elif all(p["ratio"] is None for p in pairs):
        out["verdict"] = "inconclusive: no reference for the probed pairs"
    else:
        out["verdict"] = "no probed pair is slower than its reference"
    return out


def _gemm_verdict(anomaly: Anomaly, rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    ranks = []
    for r in rows:
        ref = _reference(r, rows)
        ratio = _ratio(int(r["elapsed_ns"]), ref)
        state = ("unknown" if ratio is None else "slow" if ratio >= SLOW_FACTOR
                 else "healthy" if ratio <= HEALTHY_FACTOR else "unclear")
        ranks.append({"rank": r["rank"], "role": _role(r), "elapsed_ns": r["elapsed_ns"],
                      "reference_ns": ref, "ratio": ratio, "state": state})
    suspects = [g for g in ranks if g["role"] == "suspect"]
    confirmed = sorted(g["rank"] for g in suspects if g["state"] == "slow")
    cleared = sorted(g["rank"] for g in suspects if g["state"] == "healthy")
    return {"gemm": ranks, "gpu_confirmed": confirmed, "gpu_cleared": cleared}


def _gemm_text(ev: Mapping[str, Any]) -> str:
    """The GEMM evidence in words (the link verdict, when there is one, comes first)."""
    said = [f"{what} on rank {','.join(str(r) for r in ev[key])}"
            for key, what in (("gpu_confirmed", "GPU slow"), ("gpu_cleared", "GPU healthy"))
            if ev.get(key)]
    return "; ".join(said) or "inconclusive: no probed GPU clearly slow or healthy"


# ---------------------------------------------------------------------------------------------
# engine hooks


def rows_of(table: pa.Table | None) -> list[dict[str, Any]]:
    return [] if table is None or not table.num_rows else table.to_pylist()


def apply_probe_rows(anomalies: MutableMapping[str, Anomaly],
                     probe: pa.Table | None) -> list[Anomaly]:
    """Apply a batch's ``probe`` rows to the anomalies they answer (by request id). Each
    changed anomaly is replaced by an updated copy, returned as a new report."""
    rows = rows_of(probe)
    by_anomaly: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        parsed = parse_request_id(str(row.get("request") or ""))
        if parsed is not None and parsed[0] in anomalies:
            by_anomaly.setdefault(parsed[0], []).append(row)
    out = []
    for aid, answered in by_anomaly.items():
        copy = Anomaly.from_dict(anomalies[aid].to_dict())
        _log_not_run(anomalies[aid], answered)
        if apply_probe_evidence(copy, answered):
            anomalies[aid] = copy
            out.append(copy)
    return out


def _log_not_run(anomaly: Anomaly, rows: list[dict[str, Any]]) -> None:
    """One line per anomaly and batch for the probes that newly timed out, failed or were
    skipped (a warning, or info when all were only refused): they change nothing in the
    diagnosis, and the line says why."""
    seen = {r.get("request"): r.get("status")
            for r in (anomaly.extra.get("probe") or {}).get("runs", [])}
    new = [r for r in rows if r.get("status") != "ok"
           and seen.get(r.get("request")) != r.get("status")]
    if new:  # a refusal (rate limit, busy rank) is routine; a timeout or failure is not
        level = (logging.INFO if all(r.get("status") == "skipped" for r in new)
                 else logging.WARNING)
        log.log(level, "job %s: %d probe(s) of anomaly %s gave no measurement, its diagnosis "
                "is left as it was: %s", new[0].get("job") or "?", len(new), anomaly.id,
                "; ".join(_not_run(r) for r in new))


def carry_probe_evidence(previous: Anomaly | None, report: Anomaly) -> None:
    """A detector re-reported ``report``: keep the probe evidence (and the link it named)
    that ``previous`` held."""
    if previous is None or "probe" not in previous.extra:
        return
    for key in EVIDENCE_KEYS:
        if key in previous.extra and key not in report.extra:
            report.extra[key] = previous.extra[key]
    if (report.link is None and previous.link is not None
            and previous.extra.get("probe", {}).get("link_named_by")):
        report.link = list(previous.link)
        if report.cause == "communication" == previous.cause:
            report.ranks = list(previous.ranks)
