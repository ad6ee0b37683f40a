"""What an on-call engineer reads (:mod:`failslow.dashboards.notify`): one screen per page,
in the order Alertmanager and PagerDuty users expect: what and where (ranks with their
hosts, a link with both hosts, communicator, stage), since when (local time and UTC), how
bad (slowdown, GPU-hours lost so far and per hour), the evidence (one line per signal), the
advice with its cost, and links to the Grafana dashboards filtered on the job and the
anomaly's time range. The receivers' bodies (:mod:`.notify_render`) are built from
:class:`Page`."""

from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from failslow.dashboards.severity import lost_fraction
from failslow.diagnosis import Anomaly

#: Grafana dashboards a page links to (uids of ``dashboards/panels*``).
JOB_DASHBOARD = "failslow-job"
RANKS_DASHBOARD = "failslow-ranks"
HANGS_DASHBOARD = "failslow-hangs"
#: Time range shown around the anomaly in the dashboard links.
LINK_MARGIN_S = 300


def zone(name: str | None) -> tzinfo | None:
    """The IANA zone ``name`` (``None``/empty: this machine's local zone)."""
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name, e.g. Europe/Berlin)"
                         ) from None


def when(ns: int | None, tz: tzinfo | None = None) -> str:
    """``2025-06-15 16:53:20 CEST (14:53:20 UTC)``: local time and UTC."""
    if ns is None:
        return "unknown"
    t = datetime.fromtimestamp(ns / 1e9, UTC)
    local = t.astimezone(tz)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname() or ''} ({t:%H:%M:%S} UTC)".replace(
        "  ", " ")


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2 h 05 min``."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    h, m = divmod(int(s // 60), 60)
    return f"{h} h {m:02d} min"


def rank_ranges(ranks: Sequence[int], limit: int = 6) -> str:
    """``0-21, 25-37`` (at most ``limit`` ranges, then ``…``)."""
    runs: list[tuple[int, int]] = []
    for r in sorted(set(int(x) for x in ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return text + (", …" if len(runs) > limit else "")


def _host(hosts: Mapping[str, str], rank: int) -> str:
    return hosts.get(str(rank), "")


def _rank_with_host(hosts: Mapping[str, str], rank: int) -> str:
    h = _host(hosts, rank)
    return f"rank {rank} ({h})" if h else f"rank {rank}"


def culprits(a: Anomaly) -> list[int]:
    """The root-cause ranks, the link's ends when there are none."""
    return list(a.ranks) or list(a.link or [])


def revised_from(a: Anomaly) -> Anomaly | None:
    """The anomaly as reported before its root was revised (``extra.revised``: the cause,
    ranks and link it named then), else None."""
    prev = a.extra.get("revised")
    if not isinstance(prev, Mapping) or not prev.get("cause"):
        return None
    try:
        return dataclasses.replace(
            a, cause=str(prev["cause"]), ranks=[int(r) for r in prev.get("ranks") or []],
            link=[int(r) for r in prev["link"]] if prev.get("link") else None, extra={})
    except (TypeError, ValueError):
        return None


def victims(a: Anomaly) -> tuple[list[int], int]:
    """The ranks that wait on the culprits (a hang's ``victims``) and how many there are."""
    listed = [int(r) for r in a.extra.get("victims") or []]
    count = int(a.extra.get("victims_count") or len(listed))
    return listed, count


def hosts_for(a: Anomaly, nodes: Mapping[int, str]) -> dict[str, str]:
    """Rank -> host of every rank a page names (culprits, link ends, missing ranks at the
    halt point, victims), from the job's ``meta`` (events.md ``nodes``)."""
    ranks = set(a.ranks) | set(a.link or []) | set(victims(a)[0])
    halt = a.extra.get("halt_point")
    if isinstance(halt, Mapping):
        ranks |= {int(r) for r in halt.get("missing") or [] if isinstance(r, int)}
    return {str(r): nodes[r] for r in sorted(ranks) if r in nodes}


def where(a: Anomaly, hosts: Mapping[str, str]) -> str:
    """Rank(s) with hosts, the link with both hosts, the communicator and the stage."""
    parts = []
    if a.link and len(a.link) == 2:
        x, y = a.link
        hx, hy = _host(hosts, x), _host(hosts, y)
        both = f" ({hx} ↔ {hy})" if hx or hy else ""
        parts.append(f"link {x}-{y}{both}")
    if a.ranks and (not a.link or set(a.ranks) - set(a.link)):
        shown = [_rank_with_host(hosts, r) for r in a.ranks[:4]]
        more = f" and {len(a.ranks) - 4} more" if len(a.ranks) > 4 else ""
        parts.append(", ".join(shown) + more)
    if a.comm_kind or a.comm is not None:
        parts.append(f"{a.comm_kind or '?'} communicator"
                     + (f" {a.comm}" if a.comm is not None else ""))
    if a.stage:
        parts.append(f"stage {a.stage}")
    return "; ".join(parts) or "unknown"


def evidence(a: Anomaly, world_size: int, hosts: Mapping[str, str],
             tz: tzinfo | None = None) -> list[str]:
    """One line per signal the diagnosis rests on."""
    out = []
    if a.slowdown is not None:
        out.append(f"iteration time {a.slowdown:.2f}x its baseline")
    if a.R is not None:
        out.append(f"slowest collective {100 * a.R:.0f}% over its baseline time (CCL-D R)")
    if a.P is not None:
        side = "late arrival (compute)" if a.P >= 0.5 else "transfer (communication)"
        out.append(f"{100 * a.P:.0f}% of the extra time is {side} (CCL-D P)")
    halt = a.extra.get("halt_point")
    if isinstance(halt, Mapping):
        op = halt.get("op", "?")
        missing = [r for r in halt.get("missing") or [] if isinstance(r, int)]
        stuck = f"{op}" + (f" seq {halt['seq']}" if halt.get("seq") is not None else "")
        line = f"halted at {stuck}"
        if missing:
            line += " waiting for " + ", ".join(_rank_with_host(hosts, r) for r in missing[:4])
        if halt.get("t_enter") is not None:
            line += f", entered {when(int(halt['t_enter']), tz)}"
        out.append(line)
    listed, count = victims(a)
    if count:
        vhosts = sorted({hosts[str(r)] for r in listed if str(r) in hosts})
        on = f" on {len(vhosts)} host(s)" if vhosts else ""
        out.append(f"{count} of {world_size} ranks wait on it{on}: ranks {rank_ranges(listed)}"
                   + (" …" if count > len(listed) else ""))
    if a.extra.get("detected_post_mortem"):
        out.append("found in a snapshot taken after the job stopped (post-mortem)")
    if a.extra.get("note"):
        out.append(str(a.extra["note"]))
    if a.kind == "hang" and not out:
        out.append("no progress on the named rank(s) since the start time")
    return out


def grafana_links(base: str, job: str, a: Anomaly, now_ns: int | None = None
                  ) -> dict[str, str]:
    """Dashboard links pre-filtered on the job and the anomaly's time range (± 5 min); ``{}``
    without a base URL."""
    if not base:
        return {}
    start = a.start_ns if a.start_ns is not None else (a.detected_ns or now_ns or 0)
    end = a.end_ns if a.end_ns is not None else (now_ns or a.detected_ns or start)
    t_from = start // 1_000_000 - LINK_MARGIN_S * 1000
    t_to = max(end, start) // 1_000_000 + LINK_MARGIN_S * 1000
    root = base.rstrip("/")

    def link(uid: str, **var: Any) -> str:
        q = {"var-job": job, "from": t_from, "to": t_to, **{f"var-{k}": v for k, v in
                                                              var.items()}}
        return f"{root}/d/{uid}/?{urllib.parse.urlencode(q)}"

    out = {"job dashboard": link(JOB_DASHBOARD)}
    ranks = culprits(a)
    if ranks:
        out[f"rank {ranks[0]} heatmap"] = link(RANKS_DASHBOARD, rank=ranks[0])
    if a.kind == "hang":
        out["hangs"] = link(HANGS_DASHBOARD)
    return out


def advice_line(advice: Mapping[str, Any] | None, resolved: bool = False) -> str:
    """The anomaly's current advice with its cost ("" when none)."""
    if not advice:
        return ""
    strategy, action = advice.get("strategy", "?"), advice.get("action", "?")
    if resolved and action == "apply" and strategy in ("S2", "S3"):
        action = "revert"
    text = f"{strategy} {action}: {advice.get('description', '')}".rstrip(": ")
    if action == "apply" and advice.get("reason"):
        text += f" ({advice['reason']})"
    plan = advice.get("plan") or {}
    if action == "apply" and strategy == "S2" and isinstance(plan, Mapping) and plan.get("m"):
        text += f", micro-batches per DP group {' '.join(str(m) for m in plan['m'])}"
    cost, impact = advice.get("cost_s"), advice.get("impact_s")
    if isinstance(cost, int | float):
        text += f"; costs {duration(cost)} of training"
        if isinstance(impact, int | float):
            text += f", against {duration(impact)} lost so far"
    return text


@dataclass(frozen=True)
class Page:
    """One screen: a title line and labelled lines."""

    title: str
    what: str
    where: str
    since: str
    impact: str
    evidence: list[str]
    advice: str
    links: dict[str, str] = field(default_factory=dict)
    resolved: str = ""

    def lines(self) -> list[tuple[str, str]]:
        out = [("what", self.what), ("where", self.where), ("since", self.since)]
        if self.resolved:
            out.append(("resolved", self.resolved))
        out.append(("impact", self.impact))
        out += [("evidence", e) for e in self.evidence]
        out.append(("advice", self.advice))
        out += [(k, v) for k, v in self.links.items()]
        return out

    def text(self) -> str:
        """The page as plain text: the title, then ``label: value`` lines."""
        width = max(len(k) for k, _ in self.lines())
        return "\n".join([self.title] + [f"{k:<{width}}  {v}" for k, v in self.lines()])


def build_page(title: str, event: str, job: str, a: Anomaly, cost_gpu_h: float,
               world_size: int, hosts: Mapping[str, str], advice: Mapping[str, Any] | None,
               grafana_url: str = "", tz_name: str | None = None,
               now_ns: int | None = None) -> Page:
    """The page of one notice (see the module docstring)."""
    tz = zone(tz_name)
    rate = world_size * lost_fraction(a.kind, a.slowdown)
    how = ([f"{a.slowdown:.2f}x slower"] if a.slowdown is not None and a.kind == "slow"
           else ["no progress"] if a.kind == "hang" else [])
    how += [f"{cost_gpu_h:.3g} GPU-h lost so far", f"{rate:.3g} GPU-h per hour while it lasts "
            f"({world_size} GPUs)"]
    since = when(a.start_ns, tz)
    if a.detected_ns is not None:
        since += f"; detected {when(a.detected_ns, tz)}"
    resolved = ""
    by = a.superseded_by if event == "resolve" else None
    if event == "resolve" and a.end_ns is not None:
        lasted = "" if a.start_ns is None else f" after {duration((a.end_ns - a.start_ns) / 1e9)}"
        resolved = f"ended {when(a.end_ns, tz)}{lasted}"
        if by:
            resolved = (f"not recovered: it now slows the job and {by} reports it; this "
                        f"report closed {when(a.end_ns, tz)}{lasted}")
    if by:
        why_none = f"follow {by}"
    elif event == "resolve":
        why_none = "none needed any more"
    elif a.kind == "hang":
        bad = sorted({hosts[str(r)] for r in culprits(a) if str(r) in hosts})
        why_none = ("none from the planner for a hang: restart from the last checkpoint "
                    f"without {', '.join(bad) if bad else 'the named rank(s)'} and check "
                    "their GPUs and links")
    else:
        why_none = ("none yet: the impact so far is below the cheapest action's cost; "
                    "the planner re-decides as it grows")
    what = f"{a.kind}/{a.cause} in job {job} ({a.id})"
    prev = revised_from(a) if event == "revise" else None
    if prev is not None:
        what += f"; revised, was {prev.kind}/{prev.cause} at {where(prev, hosts)}"
    return Page(title=title, what=what, where=where(a, hosts),
                since=since, impact=", ".join(how), evidence=evidence(a, world_size, hosts, tz),
                advice=advice_line(advice, resolved=event == "resolve") or why_none,
                links=grafana_links(grafana_url, job, a, now_ns), resolved=resolved)
