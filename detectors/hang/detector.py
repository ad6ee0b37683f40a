"""The hang detector of one job: ingestion of ``coll``, ``progress``, ``link`` and ``ras``
records into its tables, and detection as time passes (CCL-D §4.2.1; MEGATRACE Algorithm 1
line 3). The method is described in :mod:`failslow.detectors.hang`; classification and
reports of one detection pass are in :mod:`~failslow.detectors.hang.reports`, NCCL RAS
evidence in :mod:`~failslow.detectors.hang.ras`."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.detectors.base import EventBatch, Reporting
from failslow.detectors.hang import state as snapshots
from failslow.detectors.hang.comms import CommTable
from failslow.detectors.hang.config import ALLREDUCE, NO_TIME, HangConfig
from failslow.detectors.hang.flight import FlightTable
from failslow.detectors.hang.graph import WaitGraph
from failslow.detectors.hang.history import Durations, SignatureBook
from failslow.detectors.hang.links import QueuePairs
from failslow.detectors.hang.ranks import RankClock
from failslow.detectors.hang.ras import RasEvidence
from failslow.detectors.hang.reports import OpenHangs, Reporter
from failslow.detectors.hang.tables import _RANK_BITS, _saturate, _u64_to_i64
from failslow.detectors.iterations import coll_columns
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta


class HangDetector:
    """Hang detector of one job (see :mod:`failslow.detectors.hang` for the method).

    ``update(batch)`` ingests ``coll``, ``progress``, ``link`` and ``ras`` records and
    reports hangs whose stuck operations completed (``end_ns`` set) plus hangs visible at the
    latest event time; ``on_tick(now_ns)`` detects as time passes with no new records.

    Its state: the communicators (:attr:`comms`), the in-flight table (:attr:`flight`),
    duration history and completed signatures (:attr:`durations`, :attr:`signatures`),
    per-rank clocks (:attr:`ranks`), queue pairs (:attr:`links`), NCCL RAS findings
    (:attr:`ras`) and the hangs reported (:attr:`hangs`).
    """

    name: ClassVar[str] = "hang"
    kinds: ClassVar[frozenset[str]] = frozenset({"coll", "progress", "link", "ras"})
    produces: ClassVar[tuple[str, ...]] = ()

    def __init__(self, meta: JobMeta, config: HangConfig | None = None) -> None:
        self.meta = meta
        self.config = config or HangConfig()
        self.job = meta.job
        self.latest = NO_TIME
        self.now = NO_TIME
        self.comms = CommTable(meta)
        self.flight = FlightTable(self.config, self.comms)
        self.durations = Durations(self.config)
        self.durations.fit(len(self.comms))
        self.signatures = SignatureBook(self.config)
        self.ranks = RankClock(self.config)
        self.links = QueuePairs()
        self.hangs = OpenHangs()
        self.ras = RasEvidence(self.config.ras_fresh_ns)
        # silent ranks nobody waits on, valid while the in-flight operations do not change
        self._quiet_cache: tuple[int, set[int]] = (-1, set())

    # -----------------------------------------------------------------------------------------
    # Detector protocol

    def update(self, batch: EventBatch) -> list[Anomaly]:
        coll = batch.get("coll")
        if coll is not None and coll.num_rows:
            self._ingest_coll(coll)
        prog = batch.get("progress")
        if prog is not None and prog.num_rows:
            self._ingest_progress(prog)
        link = batch.get("link")
        if link is not None and link.num_rows:
            self.latest = max(self.latest, self.links.ingest(link))
        ras = batch.get("ras")
        fresh_ras = ras is not None and ras.num_rows > 0
        if ras is not None and ras.num_rows:
            self.latest = max(self.latest, self.ras.ingest(ras))
        self.ranks.note_lag(max(self.latest, self.now))
        out = self.hangs.finished(self.flight.fl["hang"])
        if self.latest != NO_TIME:
            out += self._check(max(self.latest, self.now))
            out += self._check_ras(max(self.latest, self.now), out, fresh_ras)
        return out

    def on_tick(self, now_ns: int) -> list[Anomaly]:
        self.now = max(self.now, int(now_ns))
        out = self.hangs.finished(self.flight.fl["hang"]) + self._check(int(now_ns))
        return out + self._check_ras(int(now_ns), out, False)

    def outputs(self) -> dict[str, pa.Table]:
        return {}

    def snapshot(self) -> dict[str, Any]:
        return snapshots.snapshot(self)

    def restore(self, state: dict[str, Any]) -> None:
        snapshots.restore(self, state)

    def expected_ns(self, comm: int, op: str, nbytes: int) -> tuple[int | None, int]:
        """``(T_expected, threshold)`` of an operation on communicator ``comm`` as it stands:
        ``T_expected`` learned from history (None: unknown, the threshold is the ceiling),
        the threshold ``clamp(n x T_expected, floor, ceiling)`` (module docstring)."""
        cfg = self.config
        ci = self.comms.ids.get(int(comm), -1)
        if ci < 0:
            return None, cfg.ceiling_ns
        exp = self.durations.expectations(np.array([ci]), np.array([events.OP[op]]),
                                          np.array([int(nbytes)]), self.comms.size)
        if not np.isfinite(exp[0]):
            return None, cfg.ceiling_ns
        thr = int(np.clip(cfg.n_expected * exp[0], cfg.floor_ns, cfg.ceiling_ns))
        return int(exp[0]), thr

    def horizon(self, now_ns: int) -> np.ndarray:
        """Per rank: the time up to which its records are taken as complete at ``now_ns``
        (``now`` less its delivery lag)."""
        return self.ranks.horizon(now_ns)

    def recent_ops(self, rank: int) -> dict[str, np.ndarray]:
        """The rank's last entered operations (:meth:`RankClock.recent_ops`)."""
        return self.ranks.recent_ops(rank)

    def comm_kind(self, ci: int) -> str:
        """Kind of communicator index ``ci`` (:meth:`CommTable.comm_kind`)."""
        return self.comms.comm_kind(ci)

    def comms_of(self, rank: int) -> set[int]:
        """Communicators the rank belongs to (seen entering, or listed in meta)."""
        keys = self.flight.cr.keys
        mine = (keys & ((1 << _RANK_BITS) - 1)) == rank
        out = set((keys[mine] >> _RANK_BITS).tolist())
        out |= {ci for ci, m in self.comms.meta_members.items() if rank in m}
        return out

    # -----------------------------------------------------------------------------------------
    # ingestion

    def _ingest_coll(self, table: pa.Table) -> None:
        cols = coll_columns(table)  # decoded once for all the detectors of the job
        rank, t = cols["rank"], cols["t"]
        ci = self.comms.index(cols["comm"], cols["comm_size"])
        self.durations.fit(len(self.comms))
        self.latest = max(self.latest, int(t.max()))
        self.ranks.observe(rank, t)
        got = self.flight.ingest(rank, ci, cols["comm_rank"], _saturate(cols["seq"]),
                                 cols["op"], _saturate(cols["bytes"]), cols["peer"], t,
                                 cols["is_enter"], self.latest)
        if got.entered is not None:
            self.ranks.remember(got.entered)
        if got.ended is not None:
            self.signatures.count(*got.ended)
        if got.completed is not None:
            comm, op, nbytes, dur, hang = got.completed
            ok = self.hangs.history_mask(hang, dur)
            self.durations.learn(comm[ok], op[ok], nbytes[ok], dur[ok])
        for h, end in got.hang_ends.items():
            self.hangs.note_end(h, end)

    def _ingest_progress(self, table: pa.Table) -> None:
        rank_all = table.column("rank").to_numpy().astype(np.int64)
        t_all = table.column("t").to_numpy().astype(np.int64)
        self.ranks.delivered(rank_all, t_all)     # delivery evidence (lag)
        ci = self.comms.index(table.column("comm").to_numpy())
        known = ci >= 0
        if not known.any() or not len(self.flight.fl["t"]):
            self.latest = max(self.latest, int(t_all.max()))
            return
        rank = rank_all[known]
        seq = _u64_to_i64(table.column("seq").to_numpy())[known]
        t = t_all[known]
        steps = (_u64_to_i64(table.column("send_count").to_numpy())
                 + _u64_to_i64(table.column("recv_count").to_numpy()))[known]
        self.latest = max(self.latest, int(t.max()))
        self.flight.note_steps(ci[known], rank, seq, t, steps)

    # -----------------------------------------------------------------------------------------
    # detection

    def _check(self, now: int) -> list[Anomaly]:
        fl = self.flight.fl
        n = len(fl["t"])
        if n == 0:
            return []
        cfg = self.config
        thr, known = self.durations.thresholds(fl["comm"], fl["op"], fl["bytes"],
                                               self.comms.size)
        horizon = self.horizon(now)
        # an operation's age counts up to its rank's horizon (its records may be late)
        age = horizon[fl["rank"]] - fl["t"]
        barrier = (fl["op"] == ALLREDUCE) & (fl["bytes"] <= cfg.barrier_bytes)
        stuck = (age > thr) & ~barrier & (fl["hang"] < 0)
        silent = self._silent_ranks(horizon) if cfg.silence else np.zeros(0, np.int64)
        version = self.flight.version
        if self._quiet_cache[0] == version:
            silent = silent[~np.isin(silent, list(self._quiet_cache[1]))]
        if not stuck.any() and not len(silent):
            return []
        graph = WaitGraph(self, now, thr, horizon)
        triggers = [graph.round_key[i] for i in np.flatnonzero(stuck).tolist()]
        if len(silent):
            sthr = self.ranks.silence_thresholds()
            if self._quiet_cache[0] != version:
                self._quiet_cache = (version, set())
            for r in silent.tolist():
                if r in self._quiet_cache[1]:
                    continue
                # waits in operations with a learned expectation only: how long an
                # operation never seen before may take is unknown (its own threshold rules)
                waiting = [w for w in graph.waiting_on(r) if known[graph.round_ops[w]].any()]
                if not waiting:     # nobody waits on it: not worth asking again until the
                    self._quiet_cache[1].add(r)   # operations in flight change
                if waiting:
                    # the silence that counts starts when a peer began waiting (a rank that
                    # resumes after a pause where nobody waited is not silent)
                    ref = max(int(self.ranks.last[r]), min(graph.round_t(w) for w in waiting))
                    if int(horizon[r]) - ref > int(sthr[r]):
                        graph.silent_roots[r] = waiting
        return Reporter(graph).resolve(dict.fromkeys(triggers))

    def _check_ras(self, now: int, found: list[Anomaly], fresh: bool) -> list[Anomaly]:
        """NCCL RAS evidence (:mod:`.ras`): the hangs RAS alone shows, the RAS findings of
        the reports just made (``found``, annotated in place) and, when new RAS rows came
        (``fresh``), the open hangs whose RAS evidence changed, reported again."""
        ras = self.ras
        if not ras.seen:
            return []
        out = ras.raise_hangs(self, now)
        done = {a.id for a in out}
        for a in found:
            if a.kind == "hang" and a.id not in done:
                self._note_ras(a)
                done.add(a.id)
        if fresh:
            for h in self.hangs.hangs:
                if h.ended or h.anomaly.id in done:
                    continue
                if self._note_ras(h.anomaly):
                    out.append(Anomaly.from_dict(h.anomaly.to_dict()))
            if all(h.ended for h in self.hangs.hangs):  # open hangs keep their evidence
                ras.forget(now)
        return out

    def _note_ras(self, a: Anomaly) -> bool:
        """Put the RAS evidence of hang ``a`` (a report or the open hang's own anomaly) in
        its ``extra`` and in the open hang's; True if it changed."""
        index = next((h.index for h in self.hangs.hangs if h.anomaly.id == a.id), None)
        if index is None:
            return False
        stored = self.hangs.hangs[index].anomaly
        if stored.extra.get("evidence") == "ras":
            return False        # raised by RAS: its findings are its own evidence
        note = self.ras.annotate(self, stored)
        if note == self.ras.noted.get(index, {}):
            if note:
                a.extra.update(note)
            return False
        self.ras.noted[index] = note
        for target in {id(stored): stored, id(a): a}.values():
            for key in ("ras", "ras_agrees", "ras_roots", "ras_note"):
                target.extra.pop(key, None)
            target.extra.update(note)
        return True

    def _silent_ranks(self, horizon: np.ndarray) -> np.ndarray:
        """Ranks with no operation in flight and no record up to their horizon for longer
        than their silence threshold (only worth following if someone waits on them)."""
        rk = self.ranks
        if not len(rk.last):
            return np.zeros(0, np.int64)
        busy = np.zeros(len(rk.last), dtype=bool)
        busy[self.flight.fl["rank"]] = True
        roots = self.hangs.open_roots()
        seen = rk.last != NO_TIME
        quiet = seen & ~busy & (horizon - rk.last > rk.silence_thresholds())
        cand = np.flatnonzero(quiet)
        return np.array([r for r in cand.tolist() if r not in roots], dtype=np.int64)


def replay_with_ticks(det: Reporting, tables: dict[str, pa.Table],
                      tick_ns: int = 100_000_000, tail_ns: int = 0) -> list[Anomaly]:
    """Feed a trace to the detector as a stream would: ``update`` per replayed window and
    ``on_tick`` every ``tick_ns`` of trace time, also through windows with no records and
    for ``tail_ns`` after the last record (time passing is how hangs show)."""
    from failslow.replay import replay

    out: list[Anomaly] = []
    prev: int | None = None
    for now, batch in replay(tables, window_ns=tick_ns):
        if prev is not None:
            for t in range(prev + tick_ns, now, tick_ns):
                out += det.on_tick(t)
        out += det.update(batch) + det.on_tick(now)
        prev = now
    if prev is not None:
        for t in range(prev + tick_ns, prev + tail_ns + 1, tick_ns):
            out += det.on_tick(t)
    return out
