"""Reading PyTorch NCCL Flight Recorder dumps, and the process groups they describe (for
:mod:`failslow.collectors.importers.flight_recorder`, which converts them to the event
contract): the dump files of a folder by rank, one dump as a dict, each group's description,
member ranks and contract communicator kind, and the parallel degrees (tp, pp, dp, cp) the
Megatron group descriptions imply. Dumps are read with an unpickler that refuses every class
(dumps hold only plain data), so a hostile file cannot run code; JSON dumps are accepted too.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from failslow.collectors.importers import ImportResult, stable_id
from failslow.events import ContractError

#: Normalized group description -> contract communicator kind.
KIND_BY_DESC: dict[str, str] = {
    "DEFAULT_PG": "world", "WORLD": "world",
    "TENSOR_MODEL_PARALLEL_GROUP": "tp", "EXPERT_TENSOR_PARALLEL_GROUP": "tp", "TP": "tp",
    "PIPELINE_MODEL_PARALLEL_GROUP": "pp", "PP": "pp",
    "DATA_PARALLEL_GROUP": "dp", "DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "EXPERT_DATA_PARALLEL_GROUP": "dp", "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "INTER_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "dp",
    "INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "dp",
    "INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": "dp",
    "DP": "dp", "DP_SHARD": "dp", "DP_REPLICATE": "dp", "DP_CP": "dp", "DP_SHARD_CP": "dp",
    "CONTEXT_PARALLEL_GROUP": "cp", "CP": "cp",
    "EXPERT_MODEL_PARALLEL_GROUP": "ep", "EP": "ep",
}

_REQUIRED_DUMP_KEYS = ("entries", "pg_config")
_RANK_IN_NAME = re.compile(r"(\d+)$")


# ---------------------------------------------------------------------------------------------
# reading dumps


class _PlainDataUnpickler(pickle.Unpickler):
    """Loads only plain data (dict, list, tuple, str, numbers): a dump holds nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: Flight Recorder dumps hold only plain data")


def read_dump(path: str | Path) -> dict[str, Any]:
    """One dump file (pickle or JSON) as a dict; :class:`ContractError` naming the file when
    it is not a Flight Recorder dump or lacks a required key."""
    path = Path(path)
    source = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ContractError(f"cannot read ({e.strerror})", source=source) from None
    obj: Any
    try:
        obj = _PlainDataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        if "refusing" in str(e):
            raise ContractError(str(e), source=source) from None
        obj = _json_or_none(data)
    except Exception:  # noqa: BLE001 - any unpickling failure means "not a pickle"
        obj = _json_or_none(data)
    if obj is None:
        raise ContractError("not a Flight Recorder dump (neither a pickle nor JSON)",
                            source=source)
    if not isinstance(obj, dict):
        raise ContractError(f"not a Flight Recorder dump (a {type(obj).__name__}, expected a "
                            "dict with 'entries' and 'pg_config')", source=source)
    for key in _REQUIRED_DUMP_KEYS:
        if key not in obj:
            raise ContractError(f"not a Flight Recorder dump: missing key '{key}'",
                                source=source)
    if not isinstance(obj["entries"], list):
        raise ContractError("'entries' must be a list", source=source)
    if not isinstance(obj["pg_config"], dict):
        raise ContractError("'pg_config' must be a dict (process group name -> config); dumps "
                            "older than PyTorch 2.3 are not supported", source=source)
    return obj


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def find_dumps(dump_dir: str | Path) -> dict[int, Path]:
    """Dump files of a folder by rank: regular files whose name ends in the rank
    (``_dump_12``, ``nccl_trace_rank_12``); other files are ignored."""
    root = Path(dump_dir)
    if root.is_file():
        match = _RANK_IN_NAME.search(root.name)
        return {int(match.group(1)) if match else 0: root}
    if not root.is_dir():
        raise ContractError("no such dump folder", source=str(root))
    found: dict[int, Path] = {}
    for path in sorted(root.iterdir()):
        match = _RANK_IN_NAME.search(path.name)
        if not path.is_file() or match is None:
            continue
        rank = int(match.group(1))
        if rank in found:
            raise ContractError(f"two dumps for rank {rank}: {found[rank].name} and {path.name}",
                                source=str(root))
        found[rank] = path
    if not found:
        raise ContractError("no Flight Recorder dump files (names ending in the rank, e.g. "
                            "_dump_0)", source=str(root))
    return found


# ---------------------------------------------------------------------------------------------
# process groups


@dataclass(frozen=True)
class ProcessGroup:
    """One process group as the dumps describe it."""

    name: str
    desc: str
    ranks: tuple[int, ...]  # global ranks in group-rank order (sorted, as PyTorch numbers them)

    @property
    def kind(self) -> str:
        return group_kind(self.desc)

    @property
    def comm(self) -> int:
        return stable_id("fr", self.name, ",".join(map(str, self.ranks)))

    @property
    def p2p_comm(self) -> int:
        return stable_id("fr", self.name, ",".join(map(str, self.ranks)), "p2p")


def normalize_desc(desc: str) -> str:
    d = desc.strip().upper().replace("-", "_")
    return d[len("MESH_"):] if d.startswith("MESH_") else d


def group_kind(desc: str) -> str:
    """Contract communicator kind of a process group description (``other`` if unknown)."""
    return KIND_BY_DESC.get(normalize_desc(desc), "other")


def _parse_ranks(value: Any, source: str, name: str) -> tuple[int, ...]:
    ranks = value
    if isinstance(value, str):
        try:
            ranks = json.loads(value)
        except json.JSONDecodeError:
            raise ContractError(f"pg_config['{name}']: ranks {value!r} is not a list",
                                source=source) from None
    if not isinstance(ranks, list | tuple) or not all(
            isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in ranks):
        raise ContractError(f"pg_config['{name}']: ranks must be a list of ranks", source=source)
    return tuple(sorted(int(r) for r in ranks))


def parse_pg_config(dump: Mapping[str, Any], source: str) -> dict[str, ProcessGroup]:
    groups: dict[str, ProcessGroup] = {}
    for key, cfg in dump["pg_config"].items():
        if not isinstance(cfg, Mapping) or "ranks" not in cfg:
            raise ContractError(f"pg_config['{key}']: missing key 'ranks'", source=source)
        name = str(cfg.get("name", key))
        groups[name] = ProcessGroup(name=name, desc=str(cfg.get("desc", "undefined")),
                                    ranks=_parse_ranks(cfg["ranks"], source, name))
    return groups


def infer_degrees(groups: Sequence[ProcessGroup], world: int,
                  result: ImportResult | None = None) -> tuple[int, int, int, int]:
    """(tp, pp, dp, cp) from Megatron-style group descriptions; (1, 1, world, 1) if unsure."""
    def size(*descs: str) -> int | None:
        sizes = {len(g.ranks) for g in groups if normalize_desc(g.desc) in descs}
        return sizes.pop() if len(sizes) == 1 else None

    tp = size("TENSOR_MODEL_PARALLEL_GROUP", "TP")
    pp = size("PIPELINE_MODEL_PARALLEL_GROUP", "PP")
    cp = size("CONTEXT_PARALLEL_GROUP", "CP")
    dp = size("DATA_PARALLEL_GROUP", "DP")
    dp_cp = size("DATA_PARALLEL_GROUP_WITH_CP")
    tp_cp = size("TENSOR_AND_CONTEXT_PARALLEL_GROUP")
    if cp is None and tp and tp_cp and tp_cp % tp == 0:
        cp = tp_cp // tp
    if cp is None and dp and dp_cp and dp_cp % dp == 0:
        cp = dp_cp // dp
    if dp is None and dp_cp and cp and dp_cp % cp == 0:
        dp = dp_cp // cp
    degrees: dict[str, int | None] = {"tp": tp, "pp": pp, "dp": dp, "cp": cp}
    unknown = [k for k in ("dp", "tp", "pp", "cp") if degrees[k] is None]
    if unknown:
        for k in unknown[1:]:
            degrees[k] = 1
        known = math.prod(v for v in degrees.values() if v is not None)
        degrees[unknown[0]] = world // known if known and world % known == 0 else None
    values = (degrees["tp"], degrees["pp"], degrees["dp"], degrees["cp"])
    if any(v is None or v < 1 for v in values) or math.prod(v or 0 for v in values) != world:
        if result is not None:
            result.warn("parallel degrees not inferable from the group descriptions; "
                        "using tp=pp=cp=1, dp=world_size")
        return 1, 1, world, 1
    tp_, pp_, dp_, cp_ = (int(v or 1) for v in values)
    return tp_, pp_, dp_, cp_
