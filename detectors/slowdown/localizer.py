"""Localization of a slow-down window against its reference window (CCL-D §4.2, Greyhound
§4.3, MEGATRACE §III): communication (slow groups, degraded links, :mod:`.communication`),
computation (ranks whose own compute grew, else the sinks of the wait-for graph,
:mod:`.compute`), or both; CCL-D's ``R`` and ``P`` (:mod:`.attribution`) for the
communicator that shows the anomaly, and the onset within the time bins.

Both (CCL-D S3, ``mixed``) only when a compute root is an end of the slow link: one anomaly,
``ranks`` the slow rank, ``link`` the slow link as a communication anomaly names it; compute
roots off the link are ``independent``, a second fault (the package docstring)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from failslow.detectors.slowdown.accounting import BinnedStats
from failslow.detectors.slowdown.attribution import rp
from failslow.detectors.slowdown.communication import (
    TransferNoise,
    edges_of,
    find_link,
    slow_groups,
)
from failslow.detectors.slowdown.compute import (
    compute_roots,
    compute_stage,
    explained_by,
    gpu_evidence,
    link_end_root,
    wait_graph,
)
from failslow.detectors.slowdown.config import KIND_STAGE, SlowdownConfig
from failslow.detectors.slowdown.levels import SlowLevel, Window
from failslow.detectors.slowdown.timeline import IterationTimeline

#: localization outputs that are no anomaly fields
INTERNAL_FIELDS = ("confident", "signature", "evidence", "groups", "independent")


class Localizer:
    """Root cause of the slow-down in a window (:meth:`localize`) from the binned
    statistics of the job; ``evidence`` keeps the latest localization's evidence
    (debugging)."""

    def __init__(self, config: SlowdownConfig, stats: BinnedStats,
                 timeline: IterationTimeline) -> None:
        self.config = config
        self.stats = stats
        self.timeline = timeline
        self.evidence: dict[str, Any] = {}
        # per-group transfer noise of the latest reference window
        self.noise = TransferNoise()

    def localize(self, win: Window, op: SlowLevel | None = None, light: bool = False,
                 roots: list[int] | None = None, comm: bool = True,
                 force_comm: bool = False, link_root: bool = False,
                 skip: frozenset[int] = frozenset()) -> dict[str, Any]:
        """Root cause of the slow-down in ``win`` against its reference window:
        communication (slow groups, degraded links), computation (ranks whose own compute
        grew, else the sinks of the wait-for graph), or both (module docstring). Given
        ``roots`` are the compute roots; with ``link_root``, when they are empty, an end
        of the slow link whose compute grew may still be one (:func:`link_end_root`), but
        none of ``skip`` (the roots of the open anomalies below this one)."""
        c = self.config
        stats = self.stats
        given = roots is not None
        graph = wait_graph(stats, win)
        comp = roots if roots is not None else compute_roots(stats, c, win, graph)
        slow = slow_groups(stats, c, win, self.noise, force_comm, comp or []) if comm else []
        comm_evidence = bool(slow)
        members: set[int] = set()
        for g in slow:
            members.update(g["ranks"])
        if comp is not None:
            roots = comp
            if not roots and comm_evidence and (link_root or not given):
                # a slow link took most of the lost time: one of its ends may still be
                # the slow rank of a mixed slow-down
                roots = link_end_root(stats, c, win, graph, _link_ends(stats, slow) - skip)
        else:
            roots = graph.roots(c.wait_share * win.lost, c.root_asym * win.lost,
                                keep_top=not comm_evidence)
            # with a slow link, a rank found by the wait graph is a compute root only when
            # its peers on slow groups too still wait on it
            roots = [r for r in roots if r not in members
                     or graph.peer_wait(r, members, {g["cidx"] for g in slow})
                     >= c.mixed_share * win.lost]
        side = [g for g in slow if not g["own"]]
        if side and roots and explained_by(stats, c, win, list(roots), side):
            # a root's own transfers that are much slower are no side effect of it
            slow = [g for g in slow if g["own"]]
            comm_evidence = bool(slow)
        members = {r for g in slow for r in g["ranks"]}
        self.evidence = {"window": win, "slow_groups": slow, "compute": comp,
                         "graph": graph, "roots": roots,
                         "compute_source": "gaps" if comp is not None else "waits"}
        out: dict[str, Any] = {"confident": bool(comm_evidence or roots)}
        if comm_evidence and roots:
            cause = "mixed"
        elif comm_evidence:
            cause = "communication"
        else:
            cause = "compute"
            if not roots:
                roots = graph.fallback_root()
        out["cause"] = cause
        link = None
        nodes: list[str] = []
        rp_cidx = -1
        candidates: list[list[int]] = []
        if comm_evidence:
            link, nodes, rp_cidx, occupancy, candidates = find_link(stats, c, win, slow)
            if occupancy is not None:
                self.evidence["occupancy"] = occupancy
        # mixed (CCL-D S3) is a slow rank whose own link is slow too: it is an end of the
        # link, or of a slow edge over the link's node pair
        on_link = cause == "mixed" and (
            _on_link(stats, roots, link, nodes, slow)
            or any(set(roots) & set(p) for p in candidates))
        if cause == "mixed" and not on_link and all(g["own"] for g in slow):
            # the roots' own slow transfers were kept however little time they cost: not
            # over the slow link, they are no fault of their own
            cause, comm_evidence, slow = "compute", False, []
            link, nodes, rp_cidx, candidates = None, [], -1, []
            out["cause"] = cause
        out["link"] = link
        if candidates:
            out["link_candidates"] = candidates
        # an unknown link: the ends of its candidate hops are the smallest set explaining it
        ends = sorted(link) if link else sorted({r for p in candidates for r in p})
        ranks = ends if cause == "communication" else sorted(roots)
        out["ranks"] = [int(r) for r in ranks]
        sig_ranks = [int(r) for r in roots] if cause != "communication" else []
        # the link's identity: its node pair when it joins two nodes, else (all ranks on one
        # host, or node names unknown) its two ranks
        ident = sorted(nodes) if len(set(nodes)) == 2 else [str(r) for r in sorted(link or [])]
        if candidates and not ident:
            ident = sorted("-".join(sorted(map(str, p))) for p in candidates)
        out["signature"] = [cause != "compute", ident, sig_ranks]
        out["groups"] = [[int(g["cidx"]), int(g["group"]), int(g["cls"])] for g in slow]
        # compute roots none of which is on the slow link are a fault of their own next
        # to it (CCL-D S1 and S2 at once): two anomalies
        out["independent"] = cause == "mixed" and not on_link
        if light:
            return out
        if cause in ("communication", "mixed") and rp_cidx >= 0:
            kind = stats.registry.kind(rp_cidx)
            out["comm"], out["comm_kind"] = stats.registry.ids[rp_cidx], kind
            out["stage"] = KIND_STAGE.get(kind, "other")
        else:
            rp_cidx = graph.top_comm(ranks[0]) if ranks else -1
            if rp_cidx >= 0:
                out["comm"] = stats.registry.ids[rp_cidx]
                out["comm_kind"] = stats.registry.kind(rp_cidx)
            else:
                out["comm"] = out["comm_kind"] = None
            out["stage"] = compute_stage(stats, ranks, win)
        rp_win = win
        if op is not None:
            out["start_ns"] = self._refine_start(op, win, slow, ranks if cause !=
                                                 "communication" else [])
            # R and P over the rounds from the anomaly's start on: rounds of the onset
            # iteration that ended before it are healthy and would dilute both
            rp_win = dataclasses.replace(win, lo=min(max(win.lo, out["start_ns"] >> stats.shift),
                                                     win.hi - 1))
        r_val, p_val = rp(stats, rp_cidx, rp_win, link if cause != "compute" else ranks[:1]) \
            if rp_cidx >= 0 else (None, None)
        out["R"], out["P"] = r_val, p_val
        if cause != "communication" and ranks:
            gpu = gpu_evidence(stats, ranks, win)
            if gpu:
                out["gpu"] = gpu
        return out

    def _refine_start(self, op: SlowLevel, win: Window, slow: list[dict[str, Any]],
                      roots: list[int]) -> int:
        """The onset within the time bins: the first bin, from one iteration before the
        onset iteration, where the root's compute (or, without gap data, the wait it
        receives) or the slow group's mean transfer time exceeds every bin of the reference
        window."""
        s = self.stats.shift
        start_ns = int(op.anomaly["start_ns"])
        first = (start_ns - int(op.ref_iter_ns)) >> s
        found: list[int] = []
        if roots:
            d = self.stats.comp.data
            sel = np.isin(d["rank"], roots)
            vals = d["d"][sel]
            if not sel.any():
                d = self.stats.in_w.data
                sel = np.isin(d["waitee"], roots)
                vals = d["w"][sel]
            ub, inv = np.unique(d["bin"][sel], return_inverse=True)
            total = np.bincount(inv.reshape(-1), vals, minlength=len(ub))
            b = _first_above(ub, total, win.b_lo, min(win.b_hi, first), first, win.hi)
            if b is not None:
                found.append(b)
        if slow:
            g = slow[0]
            d = self.stats.grp.data
            sel = (d["cidx"] == g["cidx"]) & (d["group"] == g["group"])
            bins, xfer, n = d["bin"][sel], d["xfer"][sel], d["n"][sel]
            if len(bins):
                ub, inv = np.unique(bins, return_inverse=True)
                inv = inv.reshape(-1)
                mean = np.bincount(inv, xfer) / np.maximum(np.bincount(inv, n), 1)
                b = _first_above(ub, mean, win.b_lo, min(win.b_hi, first), first, win.hi)
                if b is not None:
                    found.append(b)
        if not found:
            return start_ns
        return int(min(min(found) << s, self.timeline.horizon - 1))


def _link_ends(stats: BinnedStats, slow: list[dict[str, Any]]) -> set[int]:
    """The ranks at the ends of the slow groups' edges that join two nodes (all of their
    edges when every one stays inside a node)."""
    node = stats.meta.node_of
    edges = [e for g in slow for e in edges_of(g)]
    cross = [e for e in edges if node(e[0]) != node(e[1])] or edges
    return {int(r) for e in cross for r in e}


def _on_link(stats: BinnedStats, roots: list[int], link: list[int] | None,
             nodes: list[str], slow: list[dict[str, Any]]) -> bool:
    """Is one of ``roots`` an end of the slow ``link``, or of a slow group's edge over the
    link's node pair (a link between two nodes slows every pair across it)?"""
    if link and set(roots) & set(link):
        return True
    node = stats.meta.node_of
    ends = set(nodes)
    return len(ends) == 2 and any(
        {node(a), node(b)} == ends and (a in roots or b in roots)
        for g in slow for a, b in edges_of(g))


def _first_above(bins: np.ndarray, values: np.ndarray, b_lo: int, b_hi: int, lo: int,
                 hi: int) -> int | None:
    """The first bin in ``[lo, hi)`` whose value exceeds every bin of ``[b_lo, b_hi)``."""
    base = values[(bins >= b_lo) & (bins < b_hi)]
    limit = float(base.max()) if len(base) else 0.0
    sel = (bins >= lo) & (bins < hi) & (values > limit)
    return int(bins[sel].min()) if sel.any() else None
