"""A small simulated job written as verbose NCCL Inspector output, as lines per file, for
tests that feed a live dump directory progressively."""

from __future__ import annotations

import tempfile
from pathlib import Path

from failslow.collectors.importers import nccl_inspector_writer
from failslow.simulator import scenario_from_dict, simulate


def inspector_lines(iterations: int = 4, layout: str = "markers") -> dict[str, list[str]]:
    """File name -> its lines (each ending in a newline) for an 8-rank job (tp2 pp2 dp2)."""
    sc = scenario_from_dict({"job": "live", "parallel": {"tp": 2, "pp": 2, "dp": 2, "cp": 1},
                             "microbatches": 4, "schedule": "1f1b", "iterations": iterations,
                             "gpus_per_node": 4})
    sim = simulate(sc, seed=3)
    with tempfile.TemporaryDirectory() as d:
        nccl_inspector_writer.write(sim.meta, sim.tables["coll"], Path(d), layout=layout,
                                    world_barrier=True)
        return {p.name: p.read_text().splitlines(keepends=True)
                for p in sorted(Path(d).iterdir())}
