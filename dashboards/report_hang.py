"""The hang part of a report (:mod:`failslow.dashboards.report`): the halt point, the hung
ranks and their hosts, the victims, the timeline of every rank's operations up to the halt,
and a per-rank heatmap of how long each rank had shown no activity (its last operation
entered or completed) when the trace ends (every rank, so the hung ones are in it). Times
are wall-clock (UTC)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from failslow.dashboards.report_story import wall, who
from failslow.diagnosis import Anomaly
from failslow.events import JobMeta

#: Seconds of history before the halt in the timeline.
TIMELINE_S = 10.0


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _ranges(ranks: Sequence[int]) -> str:
    runs: list[list[int]] = []
    for r in sorted(set(int(x) for x in ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def hung_ranks(hangs: Sequence[Anomaly]) -> list[int]:
    return sorted({r for a in hangs for r in (a.ranks or a.link or [])})


def last_progress(coll: pa.Table | None, world: int) -> tuple[np.ndarray, int]:
    """Per rank, the time of its last operation event, entered or completed (-1: none; a
    Flight Recorder dump of a hung job holds entries only), and the trace's last event
    time."""
    out = np.full(world, -1, np.int64)
    if coll is None or coll.num_rows == 0:
        return out, 0
    t_last = int(pc.max(coll.column("t")).as_py())
    rank = coll.column("rank").to_numpy().astype(np.int64)
    t = coll.column("t").to_numpy().astype(np.int64)
    ok = (rank >= 0) & (rank < world)
    np.maximum.at(out, rank[ok], t[ok])
    return out, t_last


def _node_grid(meta: JobMeta) -> tuple[list[str], dict[int, tuple[int, int]]]:
    """Hosts in order of their first rank, and each rank's (host row, slot) cell."""
    hosts: list[str] = []
    cell: dict[int, tuple[int, int]] = {}
    slots: dict[str, int] = {}
    for r in range(meta.world_size):
        h = meta.nodes.get(r, f"ranks {r // 8 * 8}-{r // 8 * 8 + 7}")
        if h not in slots:
            hosts.append(h)
            slots[h] = 0
        cell[r] = (hosts.index(h), slots[h])
        slots[h] += 1
    return hosts, cell


def stall_heatmap(meta: JobMeta, coll: pa.Table | None, hung: Sequence[int]) -> str:
    """Hosts x ranks heatmap: seconds since each rank's last completed operation when the
    trace ends; hung ranks outlined. Base64 PNG."""
    from failslow.dashboards.report import _png

    last, t_end = last_progress(coll, meta.world_size)
    hosts, cell = _node_grid(meta)
    width = max(c[1] for c in cell.values()) + 1 if cell else 1
    grid = np.full((len(hosts), width), np.nan)
    for r, (i, j) in cell.items():
        grid[i, j] = (t_end - last[r]) / 1e9 if last[r] >= 0 else np.nan
    fig = Figure(figsize=(2.5 + 0.9 * width, 1.3 + 0.55 * len(hosts)))
    ax = fig.subplots()
    image = ax.imshow(np.nan_to_num(grid, nan=float(np.nanmax(grid)) if np.isfinite(
        grid).any() else 0.0), cmap="magma_r", aspect="auto", vmin=0)
    fig.colorbar(image, ax=ax, label="s since the rank's last operation")
    ax.set_yticks(range(len(hosts)), hosts)
    ax.set_xticks(range(width), [f"gpu{j}" for j in range(width)])
    top = float(np.nanmax(grid)) if np.isfinite(grid).any() else 0.0
    for r, (i, j) in cell.items():
        value = grid[i, j]
        label = f"r{r}\n" + ("none" if np.isnan(value) else f"{value:.2f}s")
        dark = top > 0 and not np.isnan(value) and value > 0.55 * top
        ax.text(j, i, label + ("\nHUNG" if r in hung else ""), ha="center", va="center",
                fontsize=7, color="white" if dark else "black",
                fontweight="bold" if r in hung else "normal")
        if r in hung:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2.5,
                                   edgecolor="#1f77b4"))
    ax.set_title("Time since each rank's last operation when the trace ends (outlined: hung)")
    return _png(fig)


def timeline_figure(meta: JobMeta, coll: pa.Table | None, hangs: Sequence[Anomaly]) -> str:
    """Every rank's operations over the last seconds before the halt (ticks: entered, dots:
    completed), its last one (ring), the halt (dashed) and the end of the trace. Base64
    PNG."""
    from failslow.dashboards.report import _png

    hung = set(hung_ranks(hangs))
    halt = min((a.start_ns for a in hangs if a.start_ns is not None), default=None)
    fig = Figure(figsize=(10, 1.4 + 0.22 * meta.world_size))
    ax = fig.subplots()
    last, t_end = last_progress(coll, meta.world_size)
    if coll is not None and coll.num_rows:
        lo = max((halt if halt is not None else t_end) - int(TIMELINE_S * 1e9),
                 int(pc.min(coll.column("t")).as_py()))
        rows = coll.filter(pc.greater_equal(coll.column("t"), lo))
        rank = rows.column("rank").to_numpy()
        t = rows.column("t").to_numpy()
        done = np.asarray(rows.column("phase").to_pylist()) == "end"
        x0 = lo
        for r in range(meta.world_size):
            color = "#d62728" if r in hung else "#555555"
            for mask, marker in ((~done, "|"), (done, ".")):
                sel = t[(rank == r) & mask]
                ax.plot((sel - x0) / 1e9, np.full(len(sel), r), marker, color=color, ms=7,
                        alpha=0.7)
            if last[r] >= 0:
                ax.plot([(last[r] - x0) / 1e9], [r], "o", mfc="none", color=color, ms=8)
        if halt is not None:
            ax.axvline((halt - x0) / 1e9, color="#d62728", lw=1.2, ls="--", label="halt")
        ax.axvline((t_end - x0) / 1e9, color="#888888", lw=0.8, ls=":", label="trace ends")
        ax.set_xlabel(f"seconds after {wall(x0, date=True)}")
        ax.legend(loc="lower left", fontsize=8)
    ax.set_yticks(range(meta.world_size),
                  [f"r{r} {meta.nodes.get(r, '')}" + (" HUNG" if r in hung else "")
                   for r in range(meta.world_size)], fontsize=7)
    ax.invert_yaxis()
    ax.set_title("Operations up to the halt (|: entered, •: completed, ring: last; red: hung)")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _halt_rows(a: Anomaly, meta: JobMeta) -> list[tuple[str, str]]:
    rows = [("hung", who(a, meta)), ("cause", f"{a.kind}/{a.cause}"),
            ("stage", a.stage or "unknown"), ("communicator", f"{a.comm_kind or '?'} {a.comm}"),
            ("since", wall(a.start_ns, date=True)), ("detected", wall(a.detected_ns, True))]
    hp = a.extra.get("halt_point")
    if isinstance(hp, Mapping):
        op = f"{hp.get('op', '?')}" + (f" seq {hp['seq']}" if hp.get("seq") is not None else "")
        if hp.get("bytes") is not None:
            op += f", {int(hp['bytes']) / 2**20:.1f} MiB"
        rows.append(("halt point", op + f", entered {wall(hp.get('t_enter'), True)}"))
        for key in ("in_flight", "completed", "missing", "entered"):
            if hp.get(key):
                rows.append((f"… {key.replace('_', ' ')}", _ranges(hp[key])))
    victims = [int(r) for r in a.extra.get("victims") or []]
    count = int(a.extra.get("victims_count") or len(victims))
    if count:
        hosts = sorted({meta.nodes[r] for r in victims if r in meta.nodes})
        rows.append(("victims", f"{count} ranks wait: {_ranges(victims)}"
                     + (f" on {', '.join(hosts)}" if hosts else "")))
    blocked = a.extra.get("blocked_rounds") or []
    if blocked:
        first = blocked[0]
        rows.append(("blocked rounds", f"{len(blocked)}; first: {first.get('op')} on "
                     f"{first.get('comm_kind')} at {wall(first.get('t_enter'))}, missing "
                     f"{_ranges(first.get('missing') or [])}"))
    if a.extra.get("detected_post_mortem"):
        rows.append(("found", "post-mortem: in a snapshot taken after the job stopped"))
    return rows


def hang_html(hangs: Sequence[Anomaly], meta: JobMeta, coll: pa.Table | None) -> str:
    """The hang section: one table per hang, the timeline and the per-rank heatmap."""
    parts = []
    for a in hangs:
        body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
                       for k, v in _halt_rows(a, meta))
        parts.append(f'<h3>{_e(a.id)}</h3><table class="halt" id="halt-{_e(a.id)}">{body}'
                     "</table>")
    hung = hung_ranks(hangs)
    timeline = timeline_figure(meta, coll, hangs)
    return (f'<div id="hang">{"".join(parts)}'
            f'<h3>Timeline to the halt</h3><img id="hang-timeline" '
            f'alt="operations per rank up to the halt; hung ranks {_e(_ranges(hung))}"'
            f' src="data:image/png;base64,{timeline}"></div>')
