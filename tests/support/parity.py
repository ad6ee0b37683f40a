"""Field-by-field comparison of two diagnoses (diagnosis.md dicts): what the parity tests of
the offline analyzer and the stream assert is empty."""

from __future__ import annotations

from typing import Any


def differences(offline: dict[str, Any], online: dict[str, Any]) -> list[str]:
    """Every difference between two diagnoses, field by field, ``extra`` included; the
    what-if analysis is not compared (the processor runs it only with ``--whatif``, over a
    sliding window of steps), nor an ``incomplete`` entry about it."""
    a_top, b_top = _without_whatif(offline), _without_whatif(online)
    diffs = [f"{key}: {a_top.get(key)!r} != {b_top.get(key)!r}"
             for key in sorted((set(a_top) | set(b_top)) - {"anomalies"})
             if a_top.get(key) != b_top.get(key)]
    a = {x["id"]: x for x in offline.get("anomalies", [])}
    b = {x["id"]: x for x in online.get("anomalies", [])}
    if sorted(a) != sorted(b):
        diffs.append(f"anomaly ids: {sorted(a)} != {sorted(b)}")
    for i in sorted(a.keys() & b.keys()):
        for field in sorted(set(a[i]) | set(b[i])):
            if a[i].get(field) != b[i].get(field):
                diffs.append(f"{i}.{field}: {a[i].get(field)!r} != {b[i].get(field)!r}")
    return diffs


def _without_whatif(d: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in d.items() if k not in ("whatif", "incomplete")}
    kept = [i for i in d.get("incomplete", []) if i.get("part") != "whatif"]
    if kept:
        out["incomplete"] = kept
    return out
