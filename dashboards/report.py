"""A self-contained HTML report of one job's diagnosis: one file, figures embedded as PNG.

Contents: the job's iteration time over time with the anomalies as shaded bands (the
"slowdown over the baseline iteration time" of diagnosis.md made visible), a DP x PP
heatmap of how long the other ranks waited for each rank at collectives (from the
``rounds`` table, point-to-point transfers left out: in every round the last rank to enter
holds up the others for ``t_last_enter - t_first_enter``; CCL-D's observation that the
straggler is the last to arrive), the anomaly table and, when a ground truth is given, which
injected faults were found.

Cross-node times differ by the clock offset (events.md: up to a few ms), so small waits in
the heatmap are within clock noise; a straggler stands out by tens of ms per iteration.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.dates import DateFormatter
from matplotlib.figure import Figure  # Agg canvas, no pyplot state

from failslow.dashboards.notify_page import revised_from
from failslow.dashboards.report_story import StoryParts, heat_caption, wall, who
from failslow.diagnosis import Anomaly, Diagnosis
from failslow.events import JobMeta

_COLORS = {"compute": "#d62728", "communication": "#1f77b4", "mixed": "#9467bd",
           "not_entered": "#ff7f0e", "inconsistent": "#8c564b", "hardware": "#e377c2"}
MATCH_SLACK_NS = 5_000_000_000


# ---------------------------------------------------------------------------------------------
# what the figures show


def job_iterations(iterations: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``(t_end, duration_ns)`` of the job's iterations (rank -1), in time order; when no
    job-level rows exist, the slowest rank's duration per iteration."""
    if iterations.num_rows == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rank = iterations.column("rank").to_numpy()
    if (rank == -1).any():
        sel = iterations.filter(pc.equal(iterations.column("rank"), -1))
        t_end = sel.column("t_end").to_numpy()
        dur = sel.column("duration_ns").to_numpy()
    else:
        it = iterations.column("iteration").to_numpy()
        uniq, inv = np.unique(it, return_inverse=True)
        dur = np.zeros(len(uniq), np.int64)
        t_end = np.zeros(len(uniq), np.int64)
        np.maximum.at(dur, inv, iterations.column("duration_ns").to_numpy())
        np.maximum.at(t_end, inv, iterations.column("t_end").to_numpy())
    order = np.argsort(t_end, kind="stable")
    return t_end[order].astype(np.int64), dur[order].astype(np.int64)


def rank_coordinates(meta: JobMeta) -> tuple[np.ndarray, np.ndarray]:
    """``(dp, pp)`` coordinate of every global rank: from the communicators in the meta when
    they describe full DP and PP groups, else Megatron's default order (tp fastest, then cp,
    dp, pp)."""
    n = meta.world_size
    dp = np.full(n, -1, np.int64)
    pp = np.full(n, -1, np.int64)
    for comm in meta.comms:
        target, size = {"dp": (dp, meta.dp), "pp": (pp, meta.pp)}.get(comm.kind, (None, 0))
        if target is not None and len(comm.ranks) == size:
            for i, r in enumerate(comm.ranks):
                if 0 <= r < n:
                    target[r] = i
    if (dp < 0).any() or (pp < 0).any():
        ranks = np.arange(n)
        inner = max(meta.tp * meta.cp, 1)
        dp = (ranks // inner) % max(meta.dp, 1)
        pp = ranks // (inner * max(meta.dp, 1))
    return dp, pp


P2P_OPS = ("send", "recv")


def imposed_wait(rounds: pa.Table, world_size: int) -> np.ndarray:
    """Per global rank: total ns its peers spent waiting because it entered a collective
    round last (``t_last_enter - t_first_enter`` summed over the rounds where it was
    ``last_rank``). Point-to-point rounds are left out: there the receiver posts early by
    design (pipeline bubbles), which is not a straggler's doing."""
    out = np.zeros(world_size, np.float64)
    if rounds.num_rows:
        rounds = rounds.filter(pc.invert(pc.is_in(rounds.column("op"),
                                                  value_set=pa.array(P2P_OPS))))
    if rounds.num_rows == 0:
        return out
    last = rounds.column("last_rank").to_numpy().astype(np.int64)
    wait = (rounds.column("t_last_enter").to_numpy()
            - rounds.column("t_first_enter").to_numpy()).astype(np.float64)
    ok = (last >= 0) & (last < world_size) & (wait >= 0)
    np.add.at(out, last[ok], wait[ok])
    return out


def wait_grid(meta: JobMeta, rounds: pa.Table, n_iterations: int,
              ) -> tuple[np.ndarray, np.ndarray]:
    """DP x PP grid of the imposed wait in ms per iteration (the largest over the TP/CP
    ranks sharing a cell) and the rank that holds each cell's value."""
    per_rank = imposed_wait(rounds, meta.world_size) / 1e6 / max(n_iterations, 1)
    dp, pp = rank_coordinates(meta)
    grid = np.zeros((max(meta.dp, 1), max(meta.pp, 1)))
    who = np.full(grid.shape, -1, np.int64)
    for r in np.argsort(per_rank, kind="stable"):  # ascending: the largest ends up in place
        grid[dp[r], pp[r]] = per_rank[r]
        who[dp[r], pp[r]] = r
    return grid, who


@dataclass(frozen=True)
class Match:
    """One ground-truth anomaly and the diagnosed anomaly that matches it, if any."""

    truth: Anomaly
    found: Anomaly | None


def _involved(a: Anomaly) -> set[int]:
    return set(a.ranks) | set(a.link or [])


def _overlaps(a: Anomaly, b: Anomaly, slack: int) -> bool:
    if a.start_ns is None or b.start_ns is None:
        return True
    a_end = a.end_ns if a.end_ns is not None else np.iinfo(np.int64).max
    b_end = b.end_ns if b.end_ns is not None else np.iinfo(np.int64).max
    return a.start_ns <= b_end + slack and b.start_ns <= a_end + slack


def match_truth(found: Sequence[Anomaly], truth: Sequence[Anomaly],
                slack_ns: int = MATCH_SLACK_NS) -> tuple[list[Match], list[Anomaly]]:
    """Pair each truth anomaly with a diagnosed one of the same kind that names one of its
    ranks or link ends and overlaps it in time (``slack_ns`` either side). Returns the
    matches (``found`` None = missed) and the diagnosed anomalies left unmatched."""
    left = list(found)
    matches = []
    for t in truth:
        best = None
        for a in left:
            if a.kind == t.kind and _involved(a) & _involved(t) and _overlaps(a, t, slack_ns):
                best = a
                break
        if best is not None:
            left.remove(best)
        matches.append(Match(t, best))
    return matches, left


# ---------------------------------------------------------------------------------------------
# figures


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _label(a: Anomaly) -> str:
    ranks = "ranks " + ",".join(str(r) for r in a.ranks[:4]) + ("…" if len(a.ranks) > 4 else "")
    if a.link and len(a.link) == 2:
        link = f"link {a.link[0]}-{a.link[1]}"
        who = f"{ranks}, {link}" if set(a.ranks) - set(a.link) else link
    else:
        who = ranks
    return f"{a.kind}/{a.cause} {who}"


def iteration_figure(t_end: np.ndarray, dur: np.ndarray, anomalies: Sequence[Anomaly],
                     t0: int, truth: Sequence[Anomaly] = ()) -> str:
    """Iteration time over time with anomaly bands; base64 PNG."""
    fig = Figure(figsize=(10, 3.8))
    ax = fig.subplots()

    def at(ns: Any) -> Any:  # wall-clock (UTC) on the x axis
        return np.asarray(ns, dtype=np.int64).astype("datetime64[ns]")

    x = at(t_end)
    y = dur / 1e6
    ax.plot(x, y, lw=1, marker=".", ms=3, color="#333333", label="iteration time")
    if len(y):
        ax.axhline(float(np.median(y)), color="#888888", ls="--", lw=0.8, label="median")
    x_max = x.max() if len(x) else at(t0)
    y_top = float(y.max()) * 1.15 if len(y) else 1.0
    # not anchored at 0: a 10 % slowdown must be visible
    y_bottom = float(y.min()) * 0.85 if len(y) else 0.0
    span = y_top - y_bottom
    for i, a in enumerate(anomalies):
        if a.start_ns is None:
            continue
        lo = at(a.start_ns)
        hi = at(a.end_ns) if a.end_ns is not None else x_max
        color = _COLORS.get(a.cause, "#7f7f7f")
        ax.axvspan(lo, max(hi, lo + np.timedelta64(1, "ms")), color=color, alpha=0.18, lw=0)
        ax.text(lo, y_top - span * (0.03 + 0.07 * (i % 4)), " " + _label(a), color=color,
                fontsize=8, va="top")
    for i, t in enumerate(truth):
        if t.start_ns is None:
            continue
        lo = at(t.start_ns)
        hi = at(t.end_ns) if t.end_ns is not None else x_max
        level = y_bottom + span * (0.015 + 0.025 * (i % 3))
        ax.plot([lo, hi], [level, level], lw=4, color=_COLORS.get(t.cause, "#7f7f7f"),
                solid_capstyle="butt", alpha=0.8)
    ax.set_ylim(y_bottom, y_top)
    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S"))
    ax.set_xlabel(f"time (UTC) on {wall(t0, date=True)[:10]}")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title("Iteration time; shaded: diagnosed anomalies"
                 + ("; bars at the bottom: injected faults" if truth else ""))
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def heatmap_figure(grid: np.ndarray, who: np.ndarray) -> str:
    """DP x PP heatmap of the imposed wait; base64 PNG."""
    n_dp, n_pp = grid.shape
    fig = Figure(figsize=(2.2 + 1.3 * n_pp, 1.4 + 0.45 * n_dp))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="magma_r", aspect="auto", vmin=0)
    fig.colorbar(image, ax=ax, label="peers' wait (ms / iteration)")
    ax.set_xticks(range(n_pp), [f"pp{j}" for j in range(n_pp)])
    ax.set_yticks(range(n_dp), [f"dp{i}" for i in range(n_dp)])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("data-parallel replica")
    top = float(grid.max()) if grid.size else 0.0
    for i in range(n_dp):
        for j in range(n_pp):
            dark = top > 0 and grid[i, j] > 0.55 * top
            ax.text(j, i, f"r{who[i, j]}\n{grid[i, j]:.1f}", ha="center", va="center",
                    fontsize=7, color="white" if dark else "black")
    ax.set_title("Who holds up the collectives")
    return _png(fig)


# ---------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:left}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.found{color:#1a7f37;font-weight:600}.missed{color:#cf222e;font-weight:600}
.muted{color:#666}img{max-width:100%}
.placeholder{border:1px dashed #bbb;padding:.2em 1em}
.story{background:#f6f8fa;border-left:3px solid #0969da;padding:.3em .8em}
tr.culprit td{background:#fff4e5;font-weight:600}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _sec(ns: int | None, t0: int) -> str:
    """Wall-clock time (UTC) of ``ns``; ``t0`` is kept for the callers' signature."""
    return wall(ns)


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "" if x is None else fmt.format(x)


def anomaly_rows(anomalies: Sequence[Anomaly], t0: int) -> str:
    head = ("<tr><th>id</th><th>kind</th><th>cause</th><th>ranks</th><th>link</th>"
            "<th>comm kind</th><th>stage</th><th>start (UTC)</th><th>detected (UTC)</th>"
            "<th>end (UTC)</th><th>slowdown</th><th>R</th><th>P</th></tr>")
    rows = []
    for a in anomalies:
        link = "" if not a.link else "–".join(str(r) for r in a.link)
        rows.append(
            f'<tr class="anomaly"><td>{_e(a.id)}</td><td>{_e(a.kind)}</td>'
            f"<td>{_e(a.cause)}</td><td>{_e(', '.join(str(r) for r in a.ranks))}</td>"
            f"<td>{_e(link)}</td><td>{_e(a.comm_kind)}</td><td>{_e(a.stage)}</td>"
            f'<td class="num">{_sec(a.start_ns, t0)}</td>'
            f'<td class="num">{_sec(a.detected_ns, t0)}{_revised(a, t0)}</td>'
            f'<td class="num">{_sec(a.end_ns, t0)}{_superseded(a)}</td>'
            f'<td class="num">{_num(a.slowdown)}</td><td class="num">{_num(a.R)}</td>'
            f'<td class="num">{_num(a.P)}</td></tr>')
    if not rows:
        rows.append('<tr><td colspan="13" class="muted">no anomalies</td></tr>')
    return f'<table id="anomalies">{head}{"".join(rows)}</table>'


def _revised(a: Anomaly, t0: int) -> str:
    """A report whose root was revised names what it blamed first, and when."""
    prev = revised_from(a)
    if prev is None:
        return ""
    blamed = f"link {'–'.join(map(str, prev.link))}" if prev.link else \
        f"rank{'s' if len(prev.ranks) != 1 else ''} {', '.join(map(str, prev.ranks))}"
    first_ns = a.extra["revised"].get("detected_ns")
    at = f" at {_sec(int(first_ns), t0)}" if isinstance(first_ns, int) else ""
    return f' <span class="muted">(revised: {_e(prev.cause)} on {_e(blamed)}{at})</span>'


def _superseded(a: Anomaly) -> str:
    """The end of a report another one took over (an absorbed link that now slows the job)
    is no recovery: it names its successor."""
    by = a.superseded_by
    return f' <span class="muted">(superseded by {_e(by)})</span>' if by else ""


def truth_rows(matches: Sequence[Match], extra: Sequence[Anomaly], t0: int) -> str:
    head = ("<tr><th>injected</th><th>ranks / link</th><th>start (UTC)</th><th>end (UTC)</th>"
            "<th>result</th><th>diagnosed as</th></tr>")
    rows = []
    for m in matches:
        t = m.truth
        status = ('<span class="found">found</span>' if m.found is not None
                  else '<span class="missed">missed</span>')
        rows.append(f"<tr><td>{_e(t.kind)}/{_e(t.cause)}</td><td>{_e(_label(t))}</td>"
                    f'<td class="num">{_sec(t.start_ns, t0)}</td>'
                    f'<td class="num">{_sec(t.end_ns, t0)}</td><td>{status}</td>'
                    f"<td>{_e(m.found.id + ': ' + _label(m.found)) if m.found else ''}</td>"
                    "</tr>")
    for a in extra:
        rows.append(f"<tr><td class=muted>(not injected)</td><td>{_e(_label(a))}</td>"
                    f'<td class="num">{_sec(a.start_ns, t0)}</td>'
                    f'<td class="num">{_sec(a.end_ns, t0)}</td>'
                    f"<td>extra</td><td>{_e(a.id)}</td></tr>")
    return f'<table id="truth">{head}{"".join(rows)}</table>'


def critical_path_figure(path: Sequence[Any], t0: int) -> str:
    """The critical path as a timeline, one row per rank on it; base64 PNG."""
    ranks = sorted({s.rank for s in path})
    row = {r: i for i, r in enumerate(ranks)}
    fig = Figure(figsize=(10, 1.2 + 0.32 * len(ranks)))
    ax = fig.subplots()
    for s in path:
        color = "#d62728" if s.kind == "compute" else "#1f77b4"
        ax.barh(row[s.rank], (s.t1 - s.t0) / 1e6, left=(s.t0 - t0) / 1e6, height=0.6,
                color=color, edgecolor="none")
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel(f"ms after {wall(t0, date=True)}")
    ax.set_title("Critical path: compute (red) and communication after the last member "
                 "entered (blue)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _by_rank_html(by_rank: Mapping[int, tuple[float, float]], n: int,
                  mine: Sequence[int]) -> str:
    """On-path compute per rank in the anomaly's iterations and before them."""
    if not by_rank:
        return ""
    rows = "".join(
        f'<tr{" class=culprit" if r in mine else ""}><td>rank {r}'
        f'{" (diagnosed)" if r in mine else ""}</td><td class=num>{d:.1f}</td>'
        f"<td class=num>{b:.1f}</td><td class=num>{d - b:+.1f}</td></tr>"
        for r, (d, b) in list(by_rank.items())[:8])
    return ('<table id="critical-window"><tr><th>on-path compute</th>'
            f"<th>ms/iteration in the anomaly ({n} it.)</th><th>before</th><th>change</th>"
            f"</tr>{rows}</table>")


def _critical_html(path: Sequence[Any] | None, iteration: int | None, reason: str,
                   note: str = "", by_rank: Mapping[int, tuple[float, float]] | None = None,
                   window_iterations: int = 0, mine: Sequence[int] = ()) -> str:
    note_html = f'<p class="story" id="critical-note">{_e(note)}</p>' if note else ""
    if not path:
        return ('<div id="critical-path" class="placeholder"><p class="muted">Not available: '
                f"{_e(reason or 'no completed operations in the iteration')}.</p>"
                f"{note_html}</div>")
    from failslow.dashboards.critical_path import summarize

    t0 = path[0].t0
    total = path[-1].t1 - t0
    summ = summarize(path)
    kinds = "".join(f"<tr><td>{_e(k)}</td><td class=num>{v / 1e6:.1f}</td>"
                    f"<td class=num>{100 * v / max(total, 1):.0f}%</td></tr>"
                    for k, v in summ["by_kind_ns"].items())
    ranks = "".join(f"<tr><td>rank {r}</td><td class=num>{v / 1e6:.1f}</td>"
                    f"<td class=num>{100 * v / max(total, 1):.0f}%</td></tr>"
                    for r, v in list(summ["compute_by_rank_ns"].items())[:8])
    ops = "".join(f"<tr><td>{_e(o)}</td><td class=num>{v / 1e6:.1f}</td>"
                  f"<td class=num>{100 * v / max(total, 1):.0f}%</td></tr>"
                  for o, v in list(summ["communication_by_op_ns"].items())[:8])
    png = critical_path_figure(path, t0)
    on_path = sorted({s.rank for s in path})
    return f"""<div id="critical-path">{note_html}
{_by_rank_html(by_rank or {}, window_iterations, mine)}
<p>Iteration {_e(iteration)} (from {_e(wall(t0, date=True))}): {total / 1e6:.1f} ms,
{len(path)} segments, ranks on the path: {_e(", ".join(map(str, on_path)))}. Walking back
from the last completion: each round waited for its last member to enter; before that, the
member computed since its previous operation.</p>
<img id="critical" alt="critical path of iteration {_e(iteration)}: ranks {_e(on_path)}"
 src="data:image/png;base64,{png}">
<table id="critical-kinds"><tr><th>on the path</th><th>ms</th><th>share</th></tr>{kinds}
</table>
<table id="critical-ranks"><tr><th>compute by rank</th><th>ms</th><th>share</th></tr>{ranks}
</table>
<table id="critical-ops"><tr><th>communication by op</th><th>ms</th><th>share</th></tr>{ops}
</table></div>"""


def _whatif_html(whatif: dict[str, Any] | None, images: Sequence[Path], reason: str,
                 note: str = "", mine: Sequence[int] = ()) -> str:
    note_html = f'<p class="story" id="whatif-note">{_e(note)}</p>' if note else ""
    if not whatif:
        return ('<div id="whatif" class="placeholder"><p class="muted">Not available: '
                f"{_e(reason or 'the what-if analysis was not run')}.</p>{note_html}</div>")
    caveat = (whatif.get("caveat") or {}).get("text")
    if caveat:
        note_html += f'<p class="story" id="whatif-caveat">{_e(caveat)}.</p>'
    rows = [("slowdown (actual / straggler-free)", f"{whatif['slowdown']:.3f}x")]
    for k, v in (whatif.get("by_op_type") or {}).items():
        rows.append((f"only {k} slow", f"{v:.3f}x"))
    for k in ("M_W", "M_S", "waste"):
        if whatif.get(k) is not None:
            rows.append((k, f"{whatif[k]:.3f}"))
    body = "".join(f"<tr><th>{_e(k)}</th><td class=num>{_e(v)}</td></tr>" for k, v in rows)
    def diagnosed(w: Mapping[str, Any]) -> bool:
        return bool(set(mine) & ({w.get("rank")} | set(w.get("ranks") or [])))

    workers = "".join(
        f"<tr{' class=culprit' if diagnosed(w) else ''}>"
        f"<td>{_e(w.get('rank', w.get('ranks', '')))}"
        f"{' (diagnosed)' if diagnosed(w) else ''}</td>"
        f"<td>{_e(', '.join(str(r) for r in w.get('ranks') or []))}</td>"
        f"<td class=num>{float(w.get('slowdown', 0)):.3f}</td></tr>"
        for w in (whatif.get("workers") or [])[:10])
    imgs = "".join(
        f'<img class="whatif-heatmap" alt="{_e(p.stem)}" '
        f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        for p in images)
    return (f'<div id="whatif">{note_html}<table id="whatif-table">{body}</table>'
            f'<table id="whatif-workers"><tr><th>worker</th><th>ranks</th><th>slowdown</th>'
            f"</tr>{workers}</table>{imgs}</div>")


def _advice_html(advice: Sequence[Mapping[str, Any]], t0: int, reason: str) -> str:
    """The planner's decisions: when, for which anomaly, which strategy (S2 re-balance
    micro-batches, S3 adjust topology, S4 checkpoint-and-restart), apply / revert / skip,
    the accumulated impact against the strategy's cost, and the plan's predicted iteration
    time before and after."""
    if not advice:
        return ('<div id="advice" class="placeholder"><p class="muted">No advice: '
                f'{_e(reason or "none was made")}.</p></div>')
    head = ("<tr><th>at (UTC)</th><th>anomaly</th><th>strategy</th><th>action</th>"
            "<th>what</th><th>impact (s)</th><th>cost (s)</th><th>predicted (s)</th>"
            "<th>why</th></tr>")
    body = []
    for a in advice:
        raw = a.get("plan")
        plan: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        before, after = plan.get("predicted_before_s"), plan.get("predicted_after_s")
        predicted = (f"{before:.3f} → {after:.3f}"
                     if isinstance(before, int | float) and isinstance(after, int | float)
                     else "")
        body.append(
            f'<tr class="advice-{_e(a.get("action", ""))}">'
            f'<td>{_sec(a.get("t_ns"), t0)}</td><td>{_e(a.get("anomaly_id", ""))}</td>'
            f'<td>{_e(a.get("strategy", ""))}</td><td>{_e(a.get("action", ""))}</td>'
            f'<td>{_e(a.get("description", ""))}</td><td>{_num(a.get("impact_s"))}</td>'
            f'<td>{_num(a.get("cost_s"))}</td><td>{_e(predicted)}</td>'
            f'<td>{_e(a.get("reason", ""))}</td></tr>')
    return f'<table id="advice">{head}{"".join(body)}</table>'


def write_report(path: str | Path, meta: JobMeta, diagnosis: Diagnosis, iterations: pa.Table,
                 rounds: pa.Table, truth: Diagnosis | None = None,
                 title: str | None = None, *, critical_path: Sequence[Any] | None = None,
                 critical_iteration: int | None = None, critical_reason: str = "",
                 whatif_images: Sequence[Path] = (), whatif_reason: str = "",
                 advice: Sequence[Mapping[str, Any]] = (), advice_reason: str = "",
                 sections: bool = False, story: StoryParts | None = None) -> Path:
    """Write the report of one job to ``path`` (one HTML file) and return its path.

    With ``sections=True`` (what ``failslow report`` asks for) the page also has the critical
    path of a slow iteration (``critical_path``: segments of
    :func:`failslow.dashboards.critical_path.critical_path`) and the what-if breakdown
    (``diagnosis.whatif`` and SMon heatmap PNGs) and the mitigation planner's ``advice``
    (Greyhound §5.1, ``Advice.to_dict()`` shape), each replaced by a note saying why when
    its data is missing. ``story`` ties the sections to one diagnosed anomaly: its name is
    in the title, the heatmap covers its window, a hang gets its halt section."""
    from failslow.dashboards.report_hang import hang_html, stall_heatmap

    story = story or StoryParts()
    focus = story.anomaly
    mine = (list(focus.ranks) or list(focus.link or [])) if focus else []
    t_end, dur = job_iterations(iterations)
    starts = [int(pc.min(iterations.column("t_start")).as_py())] if iterations.num_rows else []
    starts += [int(pc.min(rounds.column("t_first_enter")).as_py())] if rounds.num_rows else []
    if story.hang_coll is not None and story.hang_coll.num_rows:
        starts.append(int(pc.min(story.hang_coll.column("t")).as_py()))
    t0 = min(starts) if starts else meta.t
    anomalies = sorted(diagnosis.anomalies, key=lambda a: (a.start_ns or 0, a.id))
    truth_list = list(truth.anomalies) if truth is not None else []
    hangs = [a for a in anomalies if a.kind == "hang"]
    if len(dur):
        iter_html = ('<img id="iterations" alt="iteration time over time with anomaly bands" '
                     f'src="data:image/png;base64,'
                     f'{iteration_figure(t_end, dur, anomalies, t0, truth_list)}">')
    else:
        iter_html = ('<p id="iterations" class="placeholder muted">No complete iteration was '
                     "detected" + (": the job hung before one ended (see the timeline to the "
                                   "halt below)" if hangs else "") + ".</p>")
    if focus is not None and focus.kind == "hang":
        heat_png = stall_heatmap(meta, story.hang_coll, mine)
        heat_title = "Per-rank time without progress (hosts x GPUs)"
        heat_text = ("Seconds between each rank's last completed operation and the end of "
                     "the trace; the hung ranks are outlined and marked HUNG.")
        heat_alt = f"hung {who(focus, meta)}"
        heat_caption_text = (f'<p id="heatmap-caption" class="story">Hung: '
                             f"{_e(who(focus, meta))}; every one of the {meta.world_size} "
                             "ranks is shown.</p>")
    else:
        heat_rounds = story.heat_rounds if story.heat_rounds is not None else rounds
        n_heat = story.heat_iterations or len(dur)
        grid, who_ = wait_grid(meta, heat_rounds, n_heat)
        heat_png = heatmap_figure(grid, who_)
        heat_title = "Per-rank wait imposed on peers (DP x PP)"
        heat_text = ("For every collective round (point-to-point transfers left out), the "
                     "time between the first and the last member entering is charged to the "
                     "last one; cells show ms per iteration, the largest over the ranks of "
                     "the cell (rank shown). A slow rank lights its cell; the rest of its "
                     "replica's row warms up because its pipeline is late at the DP "
                     "all-reduce.")
        scope = story.heat_scope or "over the whole trace"
        heat_caption_text = heat_caption(grid, who_, mine, scope)
        heat_alt = f"hottest cell rank {int(who_.flat[int(np.argmax(grid))])}" if grid.size \
            else "empty"
    median = (f"{float(np.median(dur)) / 1e6:.1f} ms" if len(dur)
              else "no complete iteration")
    whatif = diagnosis.whatif or {}
    facts = [
        ("job", meta.job), ("ranks", meta.world_size),
        ("parallelism", f"tp{meta.tp} pp{meta.pp} dp{meta.dp} cp{meta.cp}"),
        ("schedule", f"{meta.schedule}, {meta.microbatches} micro-batches"),
        ("trace starts", wall(t0, date=True)),
        ("iterations", len(dur)), ("median iteration", median),
        ("rounds", rounds.num_rows), ("anomalies", len(anomalies)),
    ]
    if focus is not None:
        facts.insert(0, ("diagnosis", f"{focus.kind}/{focus.cause} at {who(focus, meta)}"
                         + (f", stage {focus.stage}" if focus.stage else "")
                         + (f", {focus.slowdown:.2f}x" if focus.slowdown else "")
                         + f", from {wall(focus.start_ns, date=True)}"
                         + (f" to {wall(focus.end_ns)}" if focus.end_ns else "")))
    if whatif.get("slowdown") is not None:
        facts.append(("what-if slowdown", f"{whatif['slowdown']:.2f}x"))
    facts_html = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    truth_html = ""
    if truth is not None:
        matches, extra = match_truth(anomalies, truth_list)
        found = sum(m.found is not None for m in matches)
        truth_html = (f"<h2>Against the injected faults: {found} of {len(matches)} found"
                      f"</h2>{truth_rows(matches, extra, t0)}")
    hang_section = ""
    if hangs:
        hang_section = (f"<h2>Hang: halt point, hung ranks, victims</h2>"
                        f"{hang_html(hangs, meta, story.hang_coll)}")
    extra_html = ""
    if sections:
        critical = _critical_html(critical_path, critical_iteration, critical_reason,
                                  story.critical_note, story.critical_by_rank,
                                  story.critical_iterations, mine)
        whatif_part = _whatif_html(diagnosis.whatif, whatif_images, whatif_reason,
                                   story.whatif_note, mine)
        extra_html = (f"<h2>Critical path of a slow iteration</h2>{critical}"
                      f"<h2>What-if: the job without stragglers</h2>{whatif_part}"
                      f"<h2>Mitigation advice</h2>{_advice_html(advice, t0, advice_reason)}")
    name = title or (f"failslow report: {meta.job}: {focus.kind}/{focus.cause} at "
                     f"{who(focus, meta)}" if focus is not None
                     else f"failslow report: {meta.job}")
    doc = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(name)}</title>
<style>{_CSS}</style></head><body>
<h1>{_e(name)}</h1>
<table id="facts">{facts_html}</table>
<h2>Iteration time</h2>
{iter_html}
{hang_section}
<h2>{_e(heat_title)}</h2>
<p class="muted">{_e(heat_text)}</p>
<img id="heatmap" alt="{_e(heat_title)}: {_e(heat_alt)}" src="data:image/png;base64,{heat_png}">
{heat_caption_text}
<h2>Anomalies</h2>
{anomaly_rows(anomalies, t0)}
{truth_html}
{extra_html}
<p class="muted">Times are wall-clock, UTC; the trace starts {_e(wall(t0, date=True))}.</p>
</body></html>
"""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(doc, encoding="utf-8")
    return out
