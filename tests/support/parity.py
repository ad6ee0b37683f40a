"""Field-by-field comparison of two diagnoses (diagnosis.md dicts): what the parity tests of
the offline analyzer and the stream assert is empty; and a trace published as ``failslow
replay`` publishes it, for those tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from failslow.comms import infer_comms
from failslow.engine.offline import is_post_mortem
from failslow.events import JobMeta
from failslow.replay import replay
from failslow.stream import clickhouse as ch
from failslow.stream.processor import ProcessorConfig, StreamProcessor
from failslow.stream.transport import Transport
from failslow.tracedir import DATA_KINDS, TraceDir

#: ``failslow process``'s defaults (cli/stream.py) that differ from ProcessorConfig's
PROCESS_DEFAULTS: dict[str, Any] = {"clock": "wall", "tick_interval_ns": 100_000_000}


def process_into(bus: Transport, store: Path, **settings: Any) -> StreamProcessor:
    """A processor with ``failslow process``'s defaults and ``settings`` (ProcessorConfig
    fields) run over ``bus`` until it is drained, into the embedded store at ``store``."""
    sink = ch.ClickHouseSink(ch.connect(store))
    try:
        processor = StreamProcessor(bus, sink, ProcessorConfig(**PROCESS_DEFAULTS, **settings))
        processor.run()
        return processor
    finally:
        sink.close()


def stored_diagnosis(store: Path, job: str) -> dict[str, Any]:
    """The diagnosis the embedded store at ``store`` holds for ``job``."""
    sink = ch.ClickHouseSink(ch.connect(store))
    try:
        return sink.diagnosis(job).to_dict()
    finally:
        sink.close()


def publish_trace(trace: Path, buses: Sequence[Transport]) -> JobMeta:
    """Publish a one-job trace directory on every bus as ``failslow replay`` does: the meta
    (communicators inferred when it has none), then 100 ms windows each with its
    watermark, and a post-mortem trace's end mark. Returns the meta."""
    td = TraceDir(trace)
    [meta] = list(td.metas().values())
    tables = {k: td.read(k) for k in DATA_KINDS if k in td.kinds}
    if not meta.comms:
        meta = dataclasses.replace(meta, comms=infer_comms(tables["coll"], meta))
    kinds = [k for k, t in tables.items() if t.num_rows]
    for bus in buses:
        bus.publish_meta(meta)
    now = None
    for now, batch in replay(tables, 100_000_000):
        for bus in buses:
            bus.publish_batch(meta.job, batch, watermark=now, kinds=kinds)
    if now is not None and is_post_mortem(trace):
        for bus in buses:
            bus.publish_batch(meta.job, {}, watermark=now, kinds=kinds, end="post-mortem")
    return meta


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
