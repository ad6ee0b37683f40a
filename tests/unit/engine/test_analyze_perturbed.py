"""Analysis never raises on any trace we have, perturbed as real collection perturbs it.

Every simulator preset (but ``large``, whose analysis is the ``analyze-large`` benchmark's
subject), the real traces of ../shared/data (ByteDance trial AR, the Flight Recorder dumps)
and the recorded fixtures under tests/data are perturbed one way at a time. ``analyze``
must return a valid diagnosis for every perturbation, and for those a real collector and
transport produce (duplicated rows, rows shuffled within a window, per-node clock skew of a
few milliseconds, no ``t_start``, no ``meta.comms``) it must keep the unperturbed
diagnosis: the same anomalies by kind, cause and root ranks. Dropping 5% of the rows at
random only has to leave analysis standing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import DATA, SHARED
from failslow import diagnosis, events
from failslow.collectors.importers import flight_recorder as fr
from failslow.collectors.importers import straggler_analysis as sa
from failslow.engine.offline import analyze
from failslow.events import JobMeta
from failslow.simulator import PRESETS, simulate, write_sim
from failslow.tracedir import TraceDir, write_trace

REAL = SHARED / "data"
FIXTURES = (DATA / "slow_link", DATA / "straggler")

Tables = dict[str, pa.Table]
Perturb = Callable[[JobMeta, Tables, np.random.Generator], tuple[JobMeta, Tables]]


def _time_columns(kind: str) -> list[str]:
    return [c for c in ("t", "t_start") if c in events.SCHEMAS[kind].names]


def drop_rows(meta: JobMeta, tables: Tables, rng: np.random.Generator
              ) -> tuple[JobMeta, Tables]:
    """A random 5% of every kind's rows lost."""
    return meta, {k: t.filter(pa.array(rng.random(t.num_rows) >= 0.05))
                  for k, t in tables.items()}


def duplicate_rows(meta: JobMeta, tables: Tables, rng: np.random.Generator
                   ) -> tuple[JobMeta, Tables]:
    """2% of the rows delivered twice (at-least-once transport)."""
    out = {}
    for k, t in tables.items():
        again = np.flatnonzero(rng.random(t.num_rows) < 0.02)
        out[k] = pa.concat_tables([t, t.take(pa.array(again))])
    return meta, out


def shuffle_within_window(meta: JobMeta, tables: Tables, rng: np.random.Generator
                          ) -> tuple[JobMeta, Tables]:
    """Rows in random order within each 50 ms of trace time (arrival order)."""
    out = {}
    for k, t in tables.items():
        if not t.num_rows:
            out[k] = t
            continue
        key = np.asarray(t.column(_time_columns(k)[0]).to_numpy(zero_copy_only=False))
        bucket = (key - key.min()) // 50_000_000
        order = np.lexsort((rng.random(t.num_rows), bucket))
        out[k] = t.take(pa.array(order))
    return meta, out


def clock_skew(meta: JobMeta, tables: Tables, rng: np.random.Generator
               ) -> tuple[JobMeta, Tables]:
    """Every node's clock off by its own offset in [-5, 5] ms."""
    hosts = sorted(set(meta.nodes.values()))
    offset = dict(zip(hosts, rng.integers(-5_000_000, 5_000_001, len(hosts)).tolist(),
                      strict=True))
    by_rank = np.zeros(max([int(r) for r in meta.nodes] + [meta.world_size]) + 1,
                       dtype=np.int64)
    for r, host in meta.nodes.items():
        by_rank[int(r)] = offset[host]
    out = {}
    for k, t in tables.items():
        if "rank" not in t.column_names or not t.num_rows:
            out[k] = t
            continue
        ranks = np.asarray(t.column("rank").to_numpy(zero_copy_only=False), dtype=np.int64)
        shift = pa.array(by_rank[np.clip(ranks, 0, len(by_rank) - 1)])
        for c in _time_columns(k):
            i = t.column_names.index(c)
            t = t.set_column(i, c, pc.add(t.column(c), shift).cast(t.schema.field(c).type))
        out[k] = t
    return meta, out


def no_t_start(meta: JobMeta, tables: Tables, rng: np.random.Generator
               ) -> tuple[JobMeta, Tables]:
    """``coll`` end rows without ``t_start`` (a collector that cannot see the transfer)."""
    out = dict(tables)
    coll = tables["coll"]
    i = coll.column_names.index("t_start")
    out["coll"] = coll.set_column(i, "t_start", pa.nulls(coll.num_rows, pa.int64()))
    return meta, out


def no_comms(meta: JobMeta, tables: Tables, rng: np.random.Generator
             ) -> tuple[JobMeta, Tables]:
    """``meta.comms`` empty: communicators inferred from the rows."""
    return dataclasses.replace(meta, comms=[]), tables


#: perturbations a real collector or transport produces: the diagnosis must not change
KEEPS_DIAGNOSIS: dict[str, Perturb] = {
    "duplicate": duplicate_rows, "shuffle": shuffle_within_window, "skew": clock_skew,
    "no_t_start": no_t_start, "no_comms": no_comms,
}
PERTURBATIONS: dict[str, Perturb] = {"drop5": drop_rows, **KEEPS_DIAGNOSIS}


def _simulated(name: str) -> Callable[[Path], Path]:
    def make(out: Path) -> Path:
        write_sim(simulate(name, seed=0), out)
        return out
    return make


def _ar(out: Path) -> Path:
    d = REAL / "straggler-analysis"
    sa.import_files(d / "trace-AR.parquet", d / "meta-AR.yaml").write(out)
    return out


def _flight_recorder(out: Path) -> Path:
    fr.import_dumps(REAL / "flight-recorder" / "gpu_error_1st").write(out)
    return out


def _fixture(path: Path) -> Callable[[Path], Path]:
    def make(out: Path) -> Path:
        return path
    return make


TRACES: dict[str, Callable[[Path], Path]] = {
    **{f"preset-{p}": _simulated(p) for p in PRESETS if p != "large"},
    "real-straggler-AR": _ar,
    "real-flight-recorder": _flight_recorder,
    **{f"fixture-{d.name}": _fixture(d) for f in FIXTURES for d in sorted(f.iterdir())
       if d.is_dir()},
}


def _signature(diag: diagnosis.Diagnosis) -> list[tuple[str, str, tuple[int, ...]]]:
    return sorted((a.kind, a.cause, tuple(sorted(a.ranks))) for a in diag.anomalies)


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, tuple[Path, diagnosis.Diagnosis]]:
    """Each trace, made once, with its unperturbed diagnosis."""
    made = {}
    for name, make in TRACES.items():
        path = make(tmp_path_factory.mktemp(name))
        made[name] = (path, analyze(path))
    return made


@pytest.mark.parametrize("perturbation", sorted(PERTURBATIONS))
@pytest.mark.parametrize("trace", sorted(TRACES))
def test_analysis_never_raises_and_keeps_its_diagnosis(
        trace: str, perturbation: str, tmp_path: Path,
        traces: dict[str, tuple[Path, diagnosis.Diagnosis]]) -> None:
    source, before = traces[trace]
    td = TraceDir(source)
    meta = td.meta()
    tables = {k: td.read(k) for k in td.kinds}
    seed = sum(map(ord, trace + perturbation))
    meta, tables = PERTURBATIONS[perturbation](meta, tables, np.random.default_rng(seed))
    write_trace(tmp_path, [meta], tables)
    for extra in ("import.json",):
        if (source / extra).exists():
            (tmp_path / extra).write_text((source / extra).read_text())

    after = analyze(tmp_path)

    diagnosis.validate(json.loads(after.to_json()))
    assert not [x for x in after.incomplete if x["part"] != "whatif"], after.incomplete
    if perturbation in KEEPS_DIAGNOSIS:
        assert _signature(after) == _signature(before)


def test_the_real_AR_trial_is_analysed_end_to_end(
        traces: dict[str, tuple[Path, diagnosis.Diagnosis]]) -> None:
    """The ByteDance trial AR through import and analyze: it crashed the iteration tracker
    once; its what-if slowdown is the published 1.973 within 2%."""
    _, diag = traces["real-straggler-AR"]
    assert diag.iterations is not None and diag.iterations["count"] >= 40
    assert diag.whatif is not None
    assert diag.whatif["slowdown"] == pytest.approx(1.973, rel=0.02)
    assert diag.whatif["workers"][0]["rank"] == 0
    assert not diag.incomplete
