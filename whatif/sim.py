"""The what-if simulator (what-if paper §3.2, "Extract operation dependencies" and "Simulate
an alternative timeline"), vectorized over steps, DP ranks and what-if variants.

Dependency model. Every worker runs its stage's program (:class:`~.whatif_ops.OpTrace`):

* same stream: a program step starts when the previous one has finished (compute, then the
  point-to-point batch that sends its result, then the next compute...);
* DP communication: ``params-sync`` is the first step (before the first forward), and
  ``grads-sync`` follows the last backward, as in the traced order;
* PP communication: a receive precedes the compute that uses it, a send follows the compute
  that produced it; a batch of sends and receives issued together finishes when all of them
  have;
* cross-rank: a collective or a point-to-point pair starts its transfer when the last member
  has launched it (``dp`` groups reduce over the DP axis); each member then ends after its
  own transfer duration.

Every step starts at 0 on every worker (launch delays are not simulated, §6), so a step's
simulated time is the latest end of its last operation.

Vectorization. The program is the same for every DP rank and step, so the dependency graph
is compiled once into a topological order of (stage, program step) instructions: a stage
advances until it reaches a group whose other members have not launched yet. Each
instruction is one numpy operation over an array ``(variants, steps, pipelines)``. A
*variant* is one what-if question: which operation kinds on which workers keep their traced
duration (the rest take the idealized value). *Pipelines* are the DP ranks, or for
per-worker questions two virtual pipelines (the worker's own, and one idealized pipeline that
stands for every other DP rank: they are identical).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from failslow.whatif.ops import Kind, OpTrace, WhatIfInputError

COMPUTE, POST, COMPLETE = 0, 1, 2


@dataclass
class Variants:
    """A batch of what-if questions. ``keep[b, kind, stage, j]``: pipeline ``j`` of variant
    ``b`` keeps the traced durations of ``kind`` on ``stage``; ``src[b, j]``: the DP rank
    whose traced durations pipeline ``j`` uses (None: pipeline j is DP rank j)."""

    keep: np.ndarray
    src: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.keep.shape[0])


class Plan:
    """The compiled dependency model of an :class:`OpTrace` (see the module docstring)."""

    def __init__(self, trace: OpTrace) -> None:
        self.trace = trace
        self.P = trace.pp
        self.kind_names: list[str] = sorted(trace.dur)
        self.kind_id = {n: i for i, n in enumerate(self.kind_names)}
        # per stage, per program step: list of (components, group)
        self.steps: list[list[list[tuple[list[tuple[int, int]], int]]]] = []
        groups: dict[tuple[object, ...], list[tuple[int, int]]] = {}
        keys: list[list[list[tuple[object, ...] | None]]] = []
        for p, prog in enumerate(trace.programs):
            stage_steps = []
            stage_keys = []
            for k, ops in enumerate(prog):
                row = []
                krow: list[tuple[object, ...] | None] = []
                for name, i in ops:
                    comps = [(self.kind_id[name], i)]
                    comps += [(self.kind_id[part], i) for part in trace.parts.get(name, [])]
                    key = _group_key(trace.kinds[name], name, i, p, self.P)
                    if key is not None:
                        groups.setdefault(key, []).append((p, k))
                    row.append((comps, -1))
                    krow.append(key)
                stage_steps.append(row)
                stage_keys.append(krow)
            self.steps.append(stage_steps)
            keys.append(stage_keys)
        self.group_members: list[list[tuple[int, int]]] = []
        self.group_dp: list[bool] = []
        gid: dict[tuple[object, ...], int] = {}
        for key, members in groups.items():
            dp_sync = bool(key[-1])
            if len(members) == 1 and not dp_sync:
                continue
            gid[key] = len(self.group_members)
            self.group_members.append(members)
            self.group_dp.append(dp_sync)
        for p in range(self.P):
            for k, row in enumerate(self.steps[p]):
                for j, (comps, _) in enumerate(row):
                    key = keys[p][k][j]
                    row[j] = (comps, gid.get(key, -1) if key is not None else -1)
        self.instructions = self._schedule()

    def _schedule(self) -> list[tuple[int, int, int]]:
        """Topological order: stages advance round-robin until they block on a group."""
        P = self.P
        ptr = [0] * P
        posted_steps: set[tuple[int, int]] = set()
        out: list[tuple[int, int, int]] = []
        lengths = [len(s) for s in self.steps]
        while ptr != lengths:
            progressed = False
            for p in range(P):
                while ptr[p] < lengths[p]:
                    k = ptr[p]
                    row = self.steps[p][k]
                    gs = [g for _, g in row if g >= 0]
                    if not gs:
                        if len(row) == 1:
                            out.append((COMPUTE, p, k))
                        else:
                            out += [(POST, p, k), (COMPLETE, p, k)]
                        ptr[p] += 1
                        progressed = True
                        continue
                    if (p, k) not in posted_steps:
                        posted_steps.add((p, k))
                        out.append((POST, p, k))
                        progressed = True
                    if all(m in posted_steps for g in gs for m in self.group_members[g]):
                        out.append((COMPLETE, p, k))
                        ptr[p] += 1
                        progressed = True
                        continue
                    break
            if not progressed:
                raise WhatIfInputError(f"the dependency model deadlocks at program steps "
                                       f"{ptr} of {lengths}")
        return out

    # -----------------------------------------------------------------------------------------

    def run(self, variants: Variants, ideal: dict[str, np.ndarray]) -> np.ndarray:
        """Simulated step times, shape (variants, steps). ``ideal[kind]``: the idealized
        duration, shape (steps,) (the same value repeated for a job-wide ideal)."""
        tr = self.trace
        B = variants.size
        S = tr.steps.size
        J = variants.keep.shape[3]
        src = variants.src
        keep = variants.keep
        ideal_v = [np.asarray(ideal[n], dtype=np.float64).reshape(1, S, 1)
                   for n in self.kind_names]
        origs = [tr.dur[n] for n in self.kind_names]
        all_keep: np.ndarray = np.all(keep, axis=(0, 3))        # (kinds, stages)
        none_keep: np.ndarray = ~np.any(keep, axis=(0, 3))

        def dur(comps: list[tuple[int, int]], p: int) -> np.ndarray | float:
            total: np.ndarray | float = 0.0
            for c, i in comps:
                if none_keep[c, p]:
                    total = total + ideal_v[c]
                    continue
                o = origs[c][:, i, p, :]                       # (S, D)
                ov = o[None] if src is None else np.moveaxis(o[:, src], 0, 1)
                if all_keep[c, p]:
                    total = total + ov
                else:
                    total = total + np.where(keep[:, c, p, :][:, None, :], ov, ideal_v[c])
            return total

        zero = np.zeros((B, S, J))
        t: list[np.ndarray] = [zero] * self.P
        post: dict[tuple[int, int], np.ndarray] = {}
        gstart: dict[int, np.ndarray] = {}
        remaining = [len(m) for m in self.group_members]
        steps = self.steps
        for code, p, k in self.instructions:
            if code == COMPUTE:
                t[p] = t[p] + dur(steps[p][k][0][0], p)
            elif code == POST:
                post[(p, k)] = t[p]
            else:
                base = post.pop((p, k))
                end: np.ndarray | None = None
                for comps, g in steps[p][k]:
                    if g < 0:
                        st = base
                    else:
                        st = gstart.get(g)  # type: ignore[assignment]
                        if st is None:
                            members = self.group_members[g]
                            st = post[members[0]] if members[0] != (p, k) else base
                            for m in members[1:]:
                                st = np.maximum(st, base if m == (p, k) else post[m])
                            if self.group_dp[g]:
                                st = np.broadcast_to(st.max(axis=2, keepdims=True), st.shape)
                            gstart[g] = st
                    e = st + dur(comps, p)
                    end = e if end is None else np.maximum(end, e)
                assert end is not None
                t[p] = np.broadcast_to(end, (B, S, J))
                for _, g in steps[p][k]:
                    if g >= 0:
                        remaining[g] -= 1
                        if remaining[g] == 0:
                            del gstart[g]
        out = t[0].max(axis=2)
        for p in range(1, self.P):
            out = np.maximum(out, t[p].max(axis=2))
        return out


def _group_key(kind: Kind, name: str, i: int, p: int, P: int) -> tuple[object, ...] | None:
    """Operations with the same key form one collective or point-to-point pair; the last
    element says whether the group also spans every DP rank. A pipeline pair is named by
    its edge (lower stage; the edge P-1 joins the last stage and the first, as interleaved
    schedules do)."""
    if kind.group == "p2p":
        edge = {"forward-send": p, "forward-recv": (p - 1) % P, "backward-send": (p - 1) % P,
                "backward-recv": p}[name]
        return ("f" if name.startswith("forward") else "b", i, edge, False)
    if kind.group == "dp":
        return ("dp", name, i, p, True)
    if kind.group == "world":
        return ("world", name, i, True)
    if kind.group == "stages":
        return ("stages", name, i, kind.dp_sync)
    return None
