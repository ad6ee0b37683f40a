"""The diagnosis output, version 1 (shared/spec/diagnosis.md), as typed objects.

The offline analyzer prints it, the stream processor stores one anomaly per row, and the
simulator writes it as ground truth (``truth.json``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from failslow import results

VERSION = 1
KINDS = ("slow", "hang")
SLOW_CAUSES = ("compute", "communication", "mixed")
HANG_CAUSES = ("not_entered", "inconsistent", "hardware")
STAGES = ("forward", "backward", "pp_p2p", "dp_sync", "tp_collective", "other")


@dataclass
class Anomaly:
    """One anomaly: a slow-down or a hang, with its root cause and place in the step."""

    id: str
    kind: str
    cause: str
    ranks: list[int]
    link: list[int] | None = None
    comm: int | None = None
    comm_kind: str | None = None
    stage: str | None = None
    start_ns: int | None = None
    detected_ns: int | None = None
    end_ns: int | None = None
    slowdown: float | None = None
    R: float | None = None
    P: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"anomaly kind must be one of {KINDS}, not {self.kind!r}")
        allowed = SLOW_CAUSES if self.kind == "slow" else HANG_CAUSES
        if self.cause not in allowed:
            raise ValueError(f"cause of a {self.kind} anomaly must be one of {allowed}, "
                             f"not {self.cause!r}")
        if self.stage is not None and self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, not {self.stage!r}")

    @property
    def superseded_by(self) -> str | None:
        """The id of the report that took this one over (``extra.superseded_by``: a degraded
        link the job absorbed, reported by the link-rate detector, that the slow-down
        detector later names), or None. Its end is no recovery."""
        by = self.extra.get("superseded_by")
        return str(by) if by else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        d.update(extra)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Anomaly:
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        base = {k: v for k, v in d.items() if k in known}
        base.setdefault("ranks", [])
        return cls(**base, extra={k: v for k, v in d.items() if k not in known})


@dataclass
class Diagnosis:
    """What the detectors conclude about one job."""

    job: str
    iterations: dict[str, Any] | None = None
    anomalies: list[Anomaly] = field(default_factory=list)
    whatif: dict[str, Any] | None = None
    version: int = VERSION
    #: parts of the analysis that could not run or failed, ``{"part", "reason"}`` each
    #: (an added field, diagnosis.md "Unknown fields may be added"; absent when empty)
    incomplete: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "version": self.version,
            "job": self.job,
            "iterations": self.iterations,
            "anomalies": [a.to_dict() for a in self.anomalies],
            "whatif": self.whatif,
        }
        if self.incomplete:
            d["incomplete"] = [dict(x) for x in self.incomplete]
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        if d.get("version") != VERSION:
            raise ValueError(f"unsupported diagnosis version {d.get('version')!r}")
        return cls(job=d["job"], iterations=d.get("iterations"),
                   anomalies=[Anomaly.from_dict(a) for a in d.get("anomalies", [])],
                   whatif=d.get("whatif"), incomplete=list(d.get("incomplete", [])))

    @classmethod
    def load(cls, path: str | Path) -> Diagnosis:
        return cls.from_dict(json.loads(Path(path).read_text()))


#: The Python types of each anomaly field in a diagnosis document: those of its column in
#: the output contract's ``anomalies`` table (``extra`` holds the unknown fields, unchecked).
_ANOMALY_TYPES: dict[str, tuple[type, ...]] = {
    k: v for k, v in results.record_types("anomalies", Anomaly).items() if k != "extra"}


def validate(d: dict[str, Any]) -> None:
    """Check a diagnosis document against diagnosis.md; raise ValueError naming the field."""
    for key in ("version", "job", "iterations", "anomalies", "whatif"):
        if key not in d:
            raise ValueError(f"diagnosis: missing field {key!r}")
    if d["version"] != VERSION:
        raise ValueError(f"diagnosis: version must be {VERSION}")
    it = d["iterations"]
    if it is not None:
        for key in ("period_ops", "median_s", "count"):
            if key not in it:
                raise ValueError(f"diagnosis.iterations: missing field {key!r}")
    ids = set()
    for i, a in enumerate(d["anomalies"]):
        for key, types in _ANOMALY_TYPES.items():
            if key not in a:
                raise ValueError(f"diagnosis.anomalies[{i}]: missing field {key!r}")
            if not isinstance(a[key], types) or isinstance(a[key], bool):
                raise ValueError(f"diagnosis.anomalies[{i}].{key}: wrong type "
                                 f"{type(a[key]).__name__}")
        Anomaly.from_dict(a)  # kind / cause / stage vocabularies
        if a["id"] in ids:
            raise ValueError(f"diagnosis.anomalies[{i}].id: duplicate {a['id']!r}")
        ids.add(a["id"])
        if a["link"] is not None and len(a["link"]) != 2:
            raise ValueError(f"diagnosis.anomalies[{i}].link: must name two ranks")
    w = d["whatif"]
    if w is not None:
        for key in ("slowdown", "by_op_type", "workers"):
            if key not in w:
                raise ValueError(f"diagnosis.whatif: missing field {key!r}")
