"""Follow a live NCCL Inspector dump directory (``failslow agent --inspector-dir DIR``).

The Inspector plugin appends JSON lines to one file per process while the job runs
(:mod:`failslow.collectors.importers.nccl_inspector` describes the format). The follower reads
each file from where it stopped and turns new verbose records into ``coll`` rows:

- a file is known by its device, inode and first bytes, so a file renamed by log rotation
  (``x.log`` -> ``x.log.1``) is finished from its offset, and a file replaced or truncated in
  place is read again from its start;
- only whole lines are consumed: a partly written last line stays in the file until its
  newline arrives;
- positions (offset, the last ``dump_stats`` marker, the per-communicator counters) advance in
  memory as lines are read, and are saved to a small JSON state file, atomically replaced, only
  by :meth:`InspectorFollower.commit`, which the agent calls after the sink acknowledged
  everything read so far. A restart (even after ``kill -9``) resumes at the last commit:
  records may be sent twice, never lost (the engine drops repeated ``coll`` rows).

Mapping per record, as the file importer does where one node's view allows: global rank = the
process's rank in the largest communicator it has reported (the world communicator when the
job creates one); ``comm`` = the header id as uint64 (point-to-point on a companion id);
collective ``seq`` = a per (process, communicator) counter that starts at the first ``coll_sn``
seen and skips the numbers a function's ``coll_sn`` skipped (records the plugin dropped);
point-to-point ``seq`` = ``p2p_sn - 1``. Records without timestamps (not verbose) cannot be
placed in time: counted in ``stats["untimed"]``, no rows. Drop counters are summed per rank in
``stats["dropped_by_rank"]``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from failslow import events
from failslow.collectors.importers import ImportResult, stable_id
from failslow.collectors.importers import nccl_inspector as ni
from failslow.events import ContractError

log = logging.getLogger(__name__)

STATE_VERSION = 1
#: Files followed: Inspector output names, also with a rotation suffix (``.log.1``).
FOLLOWED = re.compile(r"\.(log|jsonl|json)(\.\d+)?$")
HEAD_BYTES = 64
MAX_READ = 8 << 20  # bytes per file and poll


@dataclass
class _File:
    """Read position of one file (by device, inode and head digest)."""

    path: str
    dev: int
    ino: int
    head: str
    offset: int = 0
    marker: str | None = None  # the last dump_stats line read (context of later payloads)

    def key(self) -> str:
        return f"{self.dev}:{self.ino}"


@dataclass
class _Seq:
    next: int = -1
    last_sn: dict[str, int] = field(default_factory=dict)


@dataclass
class LiveComm:
    """A communicator as one node sees it."""

    kind: str
    size: int
    members: dict[int, int] = field(default_factory=dict)  # comm rank -> global rank


def _head(path: Path, size: int) -> str:
    with path.open("rb") as fh:
        data = fh.read(min(size, HEAD_BYTES))
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _age_order(path: Path) -> tuple[str, str, int]:
    """Rotated files (``x.log.2``, ``x.log.1``) before the current one (``x.log``): the
    per-communicator counters need each process's records in order."""
    m = FOLLOWED.search(path.name)
    rot = m.group(2) if m else None
    base = path.name[:-len(rot)] if rot else path.name
    return str(path.parent), base, -int(rot[1:]) if rot else 0


class InspectorFollower:
    """Reads new Inspector records of ``root``; :meth:`poll` returns ``coll`` tables."""

    def __init__(self, root: str | Path, job: str, state_path: str | Path | None = None) -> None:
        self.root = Path(root)
        self.job = job
        self.state_path = Path(state_path) if state_path else self.root / ".failslow-follow.json"
        self.files: dict[str, _File] = {}
        self.seqs: dict[str, _Seq] = {}
        self.ranks: dict[str, tuple[int, int]] = {}  # "host/pid" -> (global rank, comm size)
        self.nodes: dict[int, str] = {}
        self.comms: dict[int, LiveComm] = {}
        self.world = 0
        #: positions moved since the last :meth:`commit`
        self.dirty = False
        self.stats: dict[str, Any] = {"records": 0, "untimed": 0, "rotated": 0,
                                      "skipped_lines": 0, "dropped_by_rank": {}}
        self._load()

    # -- state -------------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            state = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("inspector state %s unreadable (%s): reading every file from its start",
                        self.state_path, e)
            return
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            log.warning("inspector state %s has another version: ignored", self.state_path)
            return
        for f in state.get("files", []):
            rec = _File(**f)
            self.files[rec.key()] = rec
        self.seqs = {k: _Seq(v["next"], dict(v["last_sn"])) for k, v in
                     state.get("seqs", {}).items()}
        self.ranks = {k: (int(v[0]), int(v[1])) for k, v in state.get("ranks", {}).items()}

    def _state(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "root": str(self.root),
                "files": [vars(f) for f in self.files.values()],
                "seqs": {k: {"next": s.next, "last_sn": s.last_sn} for k, s in self.seqs.items()},
                "ranks": {k: list(v) for k, v in self.ranks.items()}}

    def commit(self) -> None:
        """Save every position read so far (call once the sink acknowledged the records)."""
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        data = json.dumps(self._state(), separators=(",", ":")).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.state_path)
        self.dirty = False

    # -- files -------------------------------------------------------------------------------

    def _candidates(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.rglob("*") if p.is_file() and FOLLOWED.search(p.name)
                 and not p.name.startswith(".") and p != self.state_path]
        return sorted(found, key=_age_order)

    def _track(self, path: Path) -> _File | None:
        try:
            st = path.stat()
            head = _head(path, st.st_size) if st.st_size else ""
        except OSError:
            return None
        key = f"{st.st_dev}:{st.st_ino}"
        rec = self.files.get(key)
        if rec is not None and (st.st_size < rec.offset or (rec.head and head != rec.head)):
            log.info("%s was truncated or replaced: read from its start", path)
            self.stats["rotated"] += 1
            rec = None
        if rec is None:
            rec = _File(str(path), st.st_dev, st.st_ino, head)
            self.files[key] = rec
            self.dirty = True
        elif rec.path != str(path):
            self.stats["rotated"] += 1
            rec.path = str(path)
        if not rec.head and st.st_size >= HEAD_BYTES:
            rec.head = head
        return rec

    def _read_lines(self, rec: _File) -> list[str]:
        with open(rec.path, "rb") as fh:
            fh.seek(rec.offset)
            data = fh.read(MAX_READ)
        cut = data.rfind(b"\n")
        if cut < 0:
            return []  # a partly written line: wait for its newline
        rec.offset += cut + 1
        self.dirty = True
        return data[:cut + 1].decode("utf-8", errors="replace").splitlines()

    # -- records -----------------------------------------------------------------------------

    def poll(self) -> dict[str, pa.Table]:
        """Read what was appended since the last poll; returns ``{"coll": rows}`` (maybe
        empty). Positions advance in memory only; :meth:`commit` saves them."""
        seen: set[str] = set()
        result = ImportResult(meta=ni._placeholder(self.job), tables={})
        reader = ni._Reader(result)
        for path in self._candidates():
            rec = self._track(path)
            if rec is None:
                continue
            seen.add(rec.key())
            try:
                lines = self._read_lines(rec)
            except OSError as e:
                log.warning("cannot read %s: %s", path, e)
                continue
            marker = self._marker(reader, rec)
            for i, text in enumerate(lines):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                    if not isinstance(obj, dict):
                        raise ContractError("expected a JSON object")
                    marker, _ = reader.record(obj, marker, rec.path, i + 1)
                except (ValueError, ContractError) as e:
                    self.stats["skipped_lines"] += 1
                    log.warning("%s: line skipped (%s)", rec.path, e)
                    continue
                if "dump_stats" in obj:
                    rec.marker = text
        for key in [k for k in self.files if k not in seen]:
            del self.files[key]  # removed: nothing more can arrive
            self.dirty = True
        return self._rows(reader)

    def _marker(self, reader: ni._Reader, rec: _File) -> ni._Context | None:
        if rec.marker is None:
            return None
        try:  # the context only: its drop counters were counted when it was first read
            obj = json.loads(rec.marker)
            inner = obj["dump_stats"] if isinstance(obj.get("dump_stats"), dict) else {}
            ctx = reader.context(obj.get("header", inner.get("header")),
                                 obj.get("metadata", inner.get("metadata")), rec.path, 0)
            reader.register(ctx, rec.path, 0)
        except (ValueError, ContractError):
            return None
        return ctx

    def _rank_of(self, reader: ni._Reader) -> dict[int, int]:
        """proc -> global rank: its rank in the largest communicator it reported so far."""
        proc_key = {p: f"{h}/{pid}" for (h, pid), p in reader.procs.items()}
        for (comm, members) in reader.members.items():
            size = reader.sizes[comm]
            for comm_rank, proc in members.items():
                key = proc_key[proc]
                old = self.ranks.get(key)
                if old is None or size > old[1]:
                    if old is not None and old[0] != comm_rank:
                        log.warning("%s: global rank changes from %d to %d (a larger "
                                    "communicator appeared)", key, old[0], comm_rank)
                    self.ranks[key] = (comm_rank, size)
        out = {}
        for (host, pid), proc in reader.procs.items():
            rank = self.ranks[f"{host}/{pid}"][0]
            out[proc] = rank
            self.nodes[rank] = host
            self.world = max(self.world, self.ranks[f"{host}/{pid}"][1])
        return out

    def _rows(self, reader: ni._Reader) -> dict[str, pa.Table]:
        cols = reader.cols
        n = len(cols["proc"])
        if not reader.procs:
            return {}
        rank_of = self._rank_of(reader)
        proc_key = {p: f"{h}/{pid}" for (h, pid), p in reader.procs.items()}
        names = {v: k for k, v in reader.comm_ids.items()}
        for comm, members in reader.members.items():
            cid = ni._comm_u64(names[comm])
            kind = ni._kind_of(reader.comm_names.get(comm, "")) or "other"
            info = self.comms.setdefault(cid, LiveComm(kind, reader.sizes[comm]))
            for cr, proc in members.items():
                info.members[cr] = rank_of[proc]
        dropped: dict[str, int] = self.stats["dropped_by_rank"]
        for drops in (reader.marker_drops, reader.header_drops):
            for (proc, _, _), v in drops.items():
                r = str(rank_of[proc])
                dropped[r] = dropped.get(r, 0) + v
        keep: list[int] = []
        seq: list[int] = []
        comm_ids: list[int] = []
        for i in range(n):
            func = cols["func"][i]
            if cols["reason"][i] or func not in ni.OP_BY_FUNC:
                self.stats["untimed"] += 1
                continue
            name = names[cols["comm"][i]]
            if cols["p2p"][i]:
                comm_ids.append(stable_id(ni.SOURCE, name, "p2p"))
                seq.append(max(int(cols["sn"][i]) - 1, 0))
            else:
                comm_ids.append(ni._comm_u64(name))
                seq.append(self._coll_seq(f"{proc_key[cols['proc'][i]]}/{name}", func,
                                          int(cols["sn"][i])))
            keep.append(i)
        self.stats["records"] += len(keep)
        if not keep:
            return {}

        def col(name: str) -> np.ndarray:
            arr = np.asarray(cols[name], dtype=object)[keep]
            return np.concatenate([arr, arr])

        m = len(keep)
        ranks = np.array([rank_of[cols["proc"][i]] for i in keep], dtype=np.int32)
        t_start = np.asarray(cols["t_start"], dtype=np.int64)[keep]
        coll = events.from_columns({
            "job": self.job, "rank": np.concatenate([ranks, ranks]),
            "comm": np.array(comm_ids * 2, dtype=np.uint64),
            "comm_rank": col("comm_rank").astype(np.int32),
            "comm_size": col("comm_size").astype(np.int32),
            "seq": np.array(seq * 2, dtype=np.uint64),
            "op": np.array([events.OP[ni.OP_BY_FUNC[f]] for f in col("func")], dtype=np.int8),
            "bytes": col("bytes").astype(np.uint64), "peer": col("peer").astype(np.int32),
            "phase": np.repeat(np.array([events.ENTER, events.END], dtype=np.int8), m),
            "t": np.concatenate([np.asarray(cols["t_enter"], dtype=np.int64)[keep],
                                 np.asarray(cols["t_end"], dtype=np.int64)[keep]]),
            "t_start": np.concatenate([np.full(m, events.NULL_TIME, dtype=np.int64),
                                       np.where(t_start >= 0, t_start, events.NULL_TIME)]),
        }, "coll")
        return {"coll": coll}

    def _coll_seq(self, key: str, func: str, sn: int) -> int:
        s = self.seqs.setdefault(key, _Seq())
        if s.next < 0:
            s.next = sn  # rounds before the first one seen were of this function
        elif func in s.last_sn and sn > s.last_sn[func] + 1:
            s.next += sn - s.last_sn[func] - 1  # records the plugin dropped
        s.last_sn[func] = sn
        s.next += 1
        return s.next - 1

    def dropped(self) -> Mapping[str, int]:
        """Records the plugin reported dropped, per global rank (as text), since start."""
        return dict(self.stats["dropped_by_rank"])
