"""The diagnosis output, version 1 (shared/spec/diagnosis.md), as typed objects.

The offline analyzer prints it, the stream processor stores one anomaly per row, and the
simulator writes it as ground truth (``truth.json``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "job": self.job,
            "iterations": self.iterations,
            "anomalies": [a.to_dict() for a in self.anomalies],
            "whatif": self.whatif,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        if d.get("version") != VERSION:
            raise ValueError(f"unsupported diagnosis version {d.get('version')!r}")
        return cls(job=d["job"], iterations=d.get("iterations"),
                   anomalies=[Anomaly.from_dict(a) for a in d.get("anomalies", [])],
                   whatif=d.get("whatif"))

    @classmethod
    def load(cls, path: str | Path) -> Diagnosis:
        return cls.from_dict(json.loads(Path(path).read_text()))
