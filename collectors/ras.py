"""NCCL RAS as a hang source (``failslow agent --ras [HOST:PORT]``).

NCCL (2.24 and later) runs a RAS thread in every process; the threads watch each other and
answer queries on a local TCP socket (``localhost:28028`` unless ``NCCL_RAS_ADDR`` says
otherwise). The exchange is line-based text: the client sends ``CLIENT PROTOCOL <n>`` and
reads ``SERVER PROTOCOL <n>``, may send ``TIMEOUT <s>`` and (2.28.7 and later)
``SET FORMAT json``, each answered ``OK`` (or a line starting ``ERROR``), then ``STATUS``
(or ``VERBOSE STATUS``); the answer is the job report, after which the server closes the
connection. The JSON report holds ``communicators``: per communicator ``hash`` (hex text),
``size``, ``ranks`` (per communicator rank: ``host``, ``pid``, ``status`` and
``collective_counts``, the number of operations launched per function) and ``missing_ranks``
(ranks that did not answer, with ``status.unresponsive`` and ``status.considered_dead``).

:class:`RasWatch` turns consecutive reports into hang evidence, naming global ranks (a
process's rank in the largest communicator, as the Inspector importer does):

- ``missing`` (``unresponsive`` / ``dead``): a member that did not answer cannot enter the
  next round -> evidence for H1 (``not_entered``) with that rank;
- ``behind``: members that launched fewer operations of a function than the others and did not
  launch any since the previous report while the leaders wait -> H1 with the ranks behind.
  A mismatch that moves between reports is normal (RAS queries race the collectives);
- ``inconsistent``: members launched the same number of operations but of different
  functions -> H2 (``inconsistent``: different operations at the same round);
- ``stalled``: every member present, counts equal and unchanged for ``stall_reports`` reports:
  all entered and nothing more launched -> consistent with H3 (``hardware``), or a job that
  simply paused; only a candidate.

Each finding becomes ``ras`` rows of the event contract (version 2, docs/events-v2.md;
:func:`finding_rows`): one per (communicator, global rank, finding) and report, with the
collective function, the rank's count and the leaders' count where known (``dead`` is
published as ``missing``; ``stalled`` names every member). The agent publishes them like its
other rows (Kafka topic ``failslow.ras``, or a trace directory), repeated while the condition
lasts: they are evidence over time. The hang detector reads them
(:mod:`failslow.detectors.hang.ras`): beside ``coll`` rows they confirm (or contradict) its
root, and where ``coll`` rows stopped or never existed (a dead collector, an Inspector-only
job) they raise the hang themselves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from failslow import events
from failslow.events import ContractError

log = logging.getLogger(__name__)

DEFAULT_ADDR = ("127.0.0.1", 28028)
CLIENT_PROTOCOL = 2
MAX_REPLY = 64 << 20
#: ``ras`` rows kept for the agent at most (older ones are dropped and counted)
MAX_PENDING_ROWS = 100_000


@dataclass
class RasRank:
    host: str
    pid: int
    counts: dict[str, int] = field(default_factory=dict)
    unresponsive: bool = False
    dead: bool = False


@dataclass
class RasComm:
    hash: str
    size: int
    ranks: dict[int, RasRank] = field(default_factory=dict)  # comm rank -> present rank
    missing: dict[int, RasRank] = field(default_factory=dict)


def parse_address(text: str | None) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT``, ``HOST`` or empty (the default ``127.0.0.1:28028``)."""
    if not text:
        return DEFAULT_ADDR
    host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    try:
        return host or DEFAULT_ADDR[0], int(port) if port else DEFAULT_ADDR[1]
    except ValueError:
        raise ValueError(f"bad RAS address {text!r} (HOST:PORT)") from None


def query(addr: tuple[str, int], timeout_s: float = 10.0, ras_timeout_s: int = 5) -> str:
    """One ``STATUS`` query in JSON format; returns the report text."""
    with socket.create_connection(addr, timeout=timeout_s) as sock:
        sock.settimeout(timeout_s + ras_timeout_s)
        fh = sock.makefile("rwb")

        def ask(line: str) -> str:
            fh.write(line.encode() + b"\n")
            fh.flush()
            reply = fh.readline().decode(errors="replace").strip()
            if not reply:
                raise ConnectionError(f"RAS closed the connection after {line!r}")
            return reply

        reply = ask(f"CLIENT PROTOCOL {CLIENT_PROTOCOL}")
        if not reply.upper().startswith("SERVER PROTOCOL"):
            raise ConnectionError(f"not a RAS server (answered {reply[:60]!r})")
        for cmd in (f"TIMEOUT {ras_timeout_s}", "SET FORMAT json"):
            reply = ask(cmd)
            if reply.upper() != "OK":
                raise ConnectionError(f"RAS refused {cmd!r}: {reply[:80]} (JSON output needs "
                                      "NCCL 2.28.7 or later)")
        fh.write(b"STATUS\n")
        fh.flush()
        data = b""
        while len(data) < MAX_REPLY:
            chunk = fh.read1(65536)
            if not chunk:
                break
            data += chunk
            if data.rstrip().endswith(b"}"):
                try:
                    json.loads(data)
                    break
                except ValueError:
                    continue
        return data.decode(errors="replace")


def parse_status(text: str) -> list[RasComm]:
    """The communicators of a JSON ``STATUS`` report."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ContractError(f"RAS report is not JSON ({e})", source="ras") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("communicators"), list):
        raise ContractError("RAS report without a 'communicators' list", source="ras")
    out = []
    for c in doc["communicators"]:
        if not isinstance(c, Mapping):
            raise ContractError("RAS communicator is not an object", source="ras")
        comm = RasComm(str(c.get("hash", "")), int(c.get("size", 0)))
        for r in c.get("ranks") or []:
            counts = {str(k): int(v) for k, v in (r.get("collective_counts") or {}).items()}
            comm.ranks[int(r["rank"])] = RasRank(str(r.get("host", "")), int(r.get("pid", -1)),
                                                 counts)
        for r in c.get("missing_ranks") or []:
            st = r.get("status") or {}
            comm.missing[int(r["rank"])] = RasRank(
                str(r.get("host", "")), int(r.get("pid", -1)),
                unresponsive=bool(st.get("unresponsive")), dead=bool(st.get("considered_dead")))
        out.append(comm)
    return out


def _global_ranks(comms: list[RasComm]) -> dict[tuple[str, int], int]:
    """(host, pid) -> rank in the largest communicator (ties: the first listed)."""
    out: dict[tuple[str, int], int] = {}
    for comm in sorted(comms, key=lambda c: -c.size):
        for r, info in {**comm.ranks, **comm.missing}.items():
            out.setdefault((info.host, info.pid), r)
    return out


class RasWatch:
    """Compares consecutive RAS reports; :meth:`update` returns the current findings."""

    def __init__(self, stall_reports: int = 3) -> None:
        self.stall_reports = stall_reports
        self._last: dict[str, dict[int, dict[str, int]]] = {}
        self._same: dict[str, int] = {}
        #: global rank -> host, and the largest communicator size, of the reports so far
        self.hosts: dict[int, str] = {}
        self.world = 0

    def update(self, comms: list[RasComm], t_ns: int | None = None) -> list[dict[str, Any]]:
        t = time.time_ns() if t_ns is None else t_ns
        rank_of = _global_ranks(comms)
        self.hosts.update({r: host for (host, _pid), r in rank_of.items() if host})
        self.world = max([self.world, *(c.size for c in comms)])
        found: list[dict[str, Any]] = []

        def note(kind: str, cause: str, comm: RasComm, ranks: list[int], **extra: Any) -> None:
            found.append({"t": t, "kind": kind, "hang_cause": cause, "comm_hash": comm.hash,
                          "comm_size": comm.size, "ranks": sorted(set(ranks)), **extra})

        def glob(r: int, info: RasRank) -> int:
            return rank_of.get((info.host, info.pid), r)

        for comm in comms:

            dead = [glob(r, i) for r, i in comm.missing.items() if i.dead]
            lost = [glob(r, i) for r, i in comm.missing.items() if not i.dead]
            if dead:
                note("dead", "not_entered", comm, dead)
            if lost:
                note("missing", "not_entered", comm, lost,
                     unresponsive=[glob(r, i) for r, i in comm.missing.items()
                                   if i.unresponsive and not i.dead])
            counts = {r: i.counts for r, i in comm.ranks.items()}
            same = counts == self._last.get(comm.hash)
            self._same[comm.hash] = self._same.get(comm.hash, 0) + 1 if same else 0
            self._last[comm.hash] = counts
            if not counts:
                continue
            funcs = sorted({f for c in counts.values() for f in c})
            behind: set[int] = set()
            for f in funcs:
                top = max(c.get(f, 0) for c in counts.values())
                behind |= {r for r, c in counts.items() if c.get(f, 0) < top}
            totals = {r: sum(c.values()) for r, c in counts.items()}
            stuck = self._same[comm.hash] >= 1
            if behind and stuck and len(set(totals.values())) > 1:
                top = max(totals.values())
                lag = [r for r, n in totals.items() if n < top]
                note("behind", "not_entered", comm,
                     [glob(r, comm.ranks[r]) for r in lag], launched=top,
                     behind_by={str(glob(r, comm.ranks[r])): top - totals[r] for r in lag},
                     per_rank={glob(r, comm.ranks[r]): _lag(counts, r) for r in lag})
            elif behind and stuck:
                minority = _minority(counts)
                note("inconsistent", "inconsistent", comm,
                     [glob(r, comm.ranks[r]) for r in minority],
                     per_rank={glob(r, comm.ranks[r]): _deviation(counts, r)
                               for r in minority})
            elif (not behind and not comm.missing
                  and self._same[comm.hash] >= self.stall_reports - 1):
                note("stalled", "hardware", comm, [], launched=max(totals.values()),
                     reports=self._same[comm.hash] + 1,
                     members={glob(r, i): totals[r] for r, i in comm.ranks.items()})
        return found


def _lag(counts: Mapping[int, Mapping[str, int]], r: int) -> dict[str, Any]:
    """The first function (by name) in which rank ``r`` launched fewer operations than the
    leaders: its count and theirs."""
    for f in sorted({f for c in counts.values() for f in c}):
        top = max(c.get(f, 0) for c in counts.values())
        if counts[r].get(f, 0) < top:
            return {"function": f, "count": counts[r].get(f, 0), "expected": top}
    return {}


def _deviation(counts: Mapping[int, Mapping[str, int]], r: int) -> dict[str, Any]:
    """The function whose count of rank ``r`` differs most from the most common breakdown."""
    sig = {q: tuple(sorted(c.items())) for q, c in counts.items()}
    common = dict(max(set(sig.values()), key=lambda s: sum(v == s for v in sig.values())))
    funcs = sorted(set(common) | set(counts[r]))
    if not funcs:
        return {}
    f = max(funcs, key=lambda g: abs(counts[r].get(g, 0) - common.get(g, 0)))
    return {"function": f, "count": counts[r].get(f, 0), "expected": common.get(f, 0)}


def comm_u64(comm_hash: str) -> int:
    """A RAS communicator hash (hex text, NCCL's 64-bit ``commHash``, the id the profiler
    plugin and the Inspector use too) as the contract's uint64; other text is hashed."""
    text = comm_hash.strip()
    try:
        value = int(text, 16)
    except ValueError:
        value = -1
    if 0 <= value < 2**64:
        return value
    return int.from_bytes(hashlib.blake2b(("ras/" + text).encode(), digest_size=8).digest(),
                          "big")


#: RasWatch kinds -> ``ras.finding`` (events.RAS_FINDINGS): a dead rank is a missing one.
FINDING_OF = {"dead": "missing", "missing": "missing", "behind": "behind",
              "inconsistent": "inconsistent", "stalled": "stalled"}


def finding_rows(found: list[dict[str, Any]], job: str, node: str) -> list[dict[str, Any]]:
    """``ras`` rows (docs/events-v2.md) of one report's findings: one per (communicator,
    global rank, finding); ``stalled`` names every member with its launched total."""
    rows: dict[tuple[int, int, str], dict[str, Any]] = {}
    for f in found:
        finding = FINDING_OF.get(str(f["kind"]))
        if finding is None:
            continue
        comm = comm_u64(str(f["comm_hash"]))
        base = {"job": job, "t": int(f["t"]), "node": node, "comm": comm,
                "comm_size": int(f["comm_size"]), "finding": finding}
        if finding == "stalled":
            named = {int(r): {"function": None, "count": int(n),
                              "expected": int(f.get("launched", n))}
                     for r, n in (f.get("members") or {}).items()}
        else:
            per = f.get("per_rank") or {}
            named = {int(r): {"function": None, "count": None, "expected": None,
                              **(per.get(r) or {})} for r in f["ranks"]}
        for r, detail in named.items():
            if r < 0:
                continue
            rows.setdefault((comm, r, finding), {**base, "rank": r, **detail})
    return list(rows.values())


def _minority(counts: Mapping[int, Mapping[str, int]]) -> list[int]:
    """Ranks whose per-function counts differ from the most common breakdown."""
    sig = {r: tuple(sorted(c.items())) for r, c in counts.items()}
    common = max(set(sig.values()), key=lambda s: sum(v == s for v in sig.values()))
    return [r for r, s in sig.items() if s != common]


class RasCollector:
    """Queries RAS every ``interval_s`` in a background thread; keeps the latest findings."""

    name = "ras"

    def __init__(self, address: str | None = None, interval_s: float = 10.0,
                 stall_reports: int = 3, timeout_s: float = 10.0, *, job: str | None = None,
                 node: str | None = None) -> None:
        self.addr = parse_address(address)
        #: job and node of the ``ras`` rows (the agent sets them when it knows better)
        self.job = job
        self.node = node or socket.gethostname()
        #: ``ras`` rows of the reports not yet taken by the agent (:meth:`take`)
        self._rows: list[dict[str, Any]] = []
        #: global rank -> host and the world size, as the reports tell them
        self.hosts: dict[int, str] = {}
        self.world = 0
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.watch = RasWatch(stall_reports)
        self.findings: list[dict[str, Any]] = []
        self.stats: dict[str, Any] = {"queries": 0, "failures": 0, "last_error": "",
                                      "rows": 0, "rows_dropped": 0}
        self._seen: set[tuple[str, str, tuple[int, ...]]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def query_once(self) -> list[dict[str, Any]]:
        """One query; returns its findings (and logs the new ones)."""
        try:
            comms = parse_status(query(self.addr, self.timeout_s))
        except (OSError, ContractError, KeyError, TypeError, ValueError) as e:
            with self._lock:
                self.stats["failures"] += 1
                self.stats["last_error"] = f"{type(e).__name__}: {e}"
            return []
        found = self.watch.update(comms)
        rows = finding_rows(found, self.job or "default", self.node)
        with self._lock:
            self.stats["queries"] += 1
            self.findings = found
            self.hosts, self.world = dict(self.watch.hosts), self.watch.world
            self._rows.extend(rows)
            self.stats["rows"] += len(rows)
            over = len(self._rows) - MAX_PENDING_ROWS
            if over > 0:  # nobody takes them (a stuck sink): keep the newest evidence
                del self._rows[:over]
                self.stats["rows_dropped"] += over
        for f in found:
            key = (f["kind"], f["comm_hash"], tuple(f["ranks"]))
            if key not in self._seen:
                self._seen.add(key)
                log.warning("RAS: %s on communicator %s (size %d): ranks %s -> hang evidence "
                            "%s", f["kind"], f["comm_hash"], f["comm_size"], f["ranks"] or "-",
                            f["hang_cause"])
        return found

    def take(self, job: str | None = None, node: str | None = None) -> pa.Table | None:
        """The ``ras`` rows queued since the last call (as ``job`` and from ``node`` when
        given), or None."""
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return None
        tag = {k: v for k, v in (("job", job), ("node", node)) if v is not None}
        if tag:
            rows = [{**r, **tag} for r in rows]
        return events.from_rows("ras", rows, source="ras")

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.query_once()
            self._stop.wait(self.interval_s)

    def maybe_query(self) -> None:
        """Start the background queries (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="failslow-ras", daemon=True)
            self._thread.start()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {**self.stats, "findings": list(self.findings)}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 5)
