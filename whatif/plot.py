"""SMon's heatmaps (what-if paper §8, Figure 14) of a what-if result, as PNG (matplotlib Agg).

* ``whatif-workers.png``: each cell a worker, x its DP rank, y its PP rank, colour its
  slowdown S_w (Eq. 4). A single dark cell is a worker problem (§5.1), a dark last row a
  stage-partitioning imbalance (§5.2), a diffuse pattern sequence-length imbalance (§5.3).
* ``whatif-steps.png``: the per-step slowdown (§4.2), and the per-step worker slowdown (the
  step's own time in Eq. 4) as a step x worker heatmap when the result holds it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def heatmaps(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """SMon's heatmaps (§8) as PNG: worker slowdown over DP rank (x) and PP rank (y), and
    the per-step view (per-step slowdown, and per-step worker slowdown when available)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    grid = np.asarray(result["worker_grid"], dtype=np.float64)
    P, D = grid.shape
    fig = Figure(figsize=(min(16, 2 + 0.35 * D), min(12, 1.5 + 0.35 * P)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    im = ax.imshow(grid, cmap="Reds", aspect="auto", origin="upper",
                   vmin=1.0, vmax=max(1.0 + 1e-6, float(grid.max())))
    ax.set_xlabel("DP rank")
    ax.set_ylabel("PP rank")
    ax.set_title(f"worker slowdown S_w (job slowdown {result['slowdown']:.3f})")
    if P * D <= 256:
        for p in range(P):
            for d in range(D):
                ax.text(d, p, f"{grid[p, d]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax)
    path = out / "whatif-workers.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    paths.append(path)

    steps = list(result["per_step"])
    values = [result["per_step"][s] for s in steps]
    sg = result.get("per_step_worker_grid")
    nrows = 2 if sg is not None else 1
    fig = Figure(figsize=(min(16, 4 + 0.2 * len(steps)), 3 + 4 * (nrows - 1)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, 1, squeeze=False)
    ax = axes[0, 0]
    ax.bar(range(len(steps)), values, color="tab:red")
    ax.axhline(1.0, color="black", lw=0.8)
    if values:
        ax.set_ylim(max(0.0, min(1.0, min(values)) - 0.05), max(values) + 0.05)
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels(steps, rotation=90, fontsize=7)
    ax.set_ylabel("step slowdown")
    ax.set_title("per-step slowdown (simulated original / ideal)")
    if sg is not None:
        arr = np.asarray(sg, dtype=np.float64).reshape(len(steps), -1)   # step x worker
        ax = axes[1, 0]
        im = ax.imshow(arr.T, cmap="Reds", aspect="auto", vmin=1.0,
                       vmax=max(1.0 + 1e-6, float(arr.max())))
        ax.set_xlabel("step")
        ax.set_ylabel("worker (PP rank x DP + DP rank)")
        ax.set_xticks(range(len(steps)))
        ax.set_xticklabels(steps, rotation=90, fontsize=7)
        ax.set_title("per-step worker slowdown")
        fig.colorbar(im, ax=ax)
    path = out / "whatif-steps.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    paths.append(path)
    return paths
