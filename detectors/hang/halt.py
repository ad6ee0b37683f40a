"""The halt point of a hang and its place in the pipeline schedule (MEGATRACE §III-C step 3):
the first operation the root failed to call or complete in its own program order, the
training stage, and for pipeline send/recv or tensor- and context-parallel collectives the
pass (forward/backward), micro-batch and 1F1B phase in the stage program rebuilt from ``meta``
(:func:`failslow.schedule.stage_program`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from failslow import events
from failslow.detectors.hang.config import RECV, SEND
from failslow.detectors.hang.tables import _cr_key
from failslow.schedule import schedule_phase, stage_program

if TYPE_CHECKING:
    from failslow.detectors.hang.graph import WaitGraph


def _compute_between(prog: list[tuple[str, Any]], after: int, until: int | None,
                     has_dp: bool) -> list[tuple[str, Any]]:
    """The compute steps that follow step ``after`` of a stage program, cyclically (the
    next iteration follows), up to step ``until`` or the next boundary: a point-to-point
    batch, or a data-parallel sync when the job has one (else the iteration runs on)."""
    out: list[tuple[str, Any]] = []
    n = len(prog)
    for k in range(1, n):
        i = (after + k) % n
        if i == until:
            break
        kind, what = prog[i]
        if kind == "P" or (kind == "D" and has_dp):
            if until is None:
                break
            return []           # another boundary first: not a gap between the two
        if kind in ("F", "B"):
            out.append((kind, what))
    return out


class Placement:
    """Halt points of one detection pass, placed in the job's pipeline schedule."""

    def __init__(self, graph: WaitGraph) -> None:
        self.graph = graph
        self.det = graph.det

    def halt_point(self, rnd: tuple[Any, ...]) -> dict[str, Any]:
        """MEGATRACE §III-C step 3: the first operation missing its completion."""
        det, fl = self.det, self.det.flight.fl
        ops = self.graph.round_ops[rnd]
        first = min(ops, key=lambda i: int(fl["t"][i]))
        ci, op = rnd[1], int(fl["op"][first])
        in_flight = sorted(int(fl["rank"][i]) for i in ops)
        missing = self.graph.missing(rnd)
        hp: dict[str, Any] = {
            "comm": det.comms.u64[ci], "op": events.COLL_OPS[op],
            "bytes": int(fl["bytes"][first]), "t_enter": int(fl["t"][first]),
            "entered": in_flight, "missing": missing,
        }
        if rnd[0] == "c":
            hp["seq"] = rnd[2]
            # members that entered and completed the round (their seq counter is past it):
            # entered = still in flight + completed; with ``missing`` they are the group
            members = det.comms.members(ci)
            done = sorted(set(members[members >= 0].tolist()) - set(in_flight) - set(missing))
            hp.update({"entered": sorted(in_flight + done), "in_flight": in_flight,
                       "completed": done})
        else:
            hp.update({"sender": rnd[2], "receiver": rnd[3], "pair_index": rnd[4]})
        return hp

    def pipeline_pass(self, rnd: tuple[Any, ...], roots: list[int]) -> dict[str, Any]:
        """1F1B position of a pipeline send/recv: activations flow to higher pipeline ranks
        in the forward pass, gradients to lower ones in the backward pass (MEGATRACE
        §III-B1); the k-th such transfer of a pair is micro-batch k mod microbatches; the
        1F1B phase is that of the compute step next to the transfer on the root's stage."""
        det = self.det
        if rnd[0] != "p" or det.comm_kind(rnd[1]) != "pp":
            return {}
        ci, sender, receiver, k = rnd[1], rnd[2], rnd[3], rnd[4]
        members = det.comms.members(ci).tolist()
        if sender not in members or receiver not in members:
            return {}
        forward = members.index(sender) < members.index(receiver)
        pas = "forward" if forward else "backward"
        extra: dict[str, Any] = {"pass": pas}
        m = det.meta
        row = det.flight.cr.find(_cr_key(ci, np.array([sender])))[0]
        from_start = row >= 0 and bool(det.flight.cr.cols["seq0"][row])
        if m.microbatches > 0 and m.schedule in ("1f1b", "gpipe") and from_start:
            mb = k % m.microbatches
            extra["microbatch"] = mb
            extra["iteration_index"] = k // m.microbatches
            who = next((r for r in roots if r in (sender, receiver)), sender)
            phase = schedule_phase(m.schedule, members.index(who), len(members),
                                   m.microbatches, pas, mb)
            if phase is not None:
                extra["schedule_phase"] = phase
        return extra

    def position(self, rnd: tuple[Any, ...]) -> dict[str, Any]:
        """Pass, micro-batch and 1F1B phase of a collective inside forward or backward compute
        (tensor or context parallel): an entered member's last operations, back from the
        halt round to the last pipeline send/recv or data-parallel sync before it, place it
        in the stage program (Megatron's schedule, rebuilt from ``meta``); when that gap holds
        two compute steps (1F1B's forward and backward of the last stage, for instance), the
        communicator's operations per compute step, counted between earlier boundaries,
        tell which one."""
        det = self.det
        m = det.meta
        if (rnd[0] != "c" or m.microbatches <= 0 or m.schedule not in ("1f1b", "gpipe")
                or det.comm_kind(rnd[1]) in ("dp", "pp")):
            return {}
        for i in self.graph.round_ops[rnd]:
            q = int(det.flight.fl["rank"][i])
            found = self._place(q, rnd[1], rnd[2])
            if found:
                return found
        return {}

    def _place(self, rank: int, ci: int, seq: int) -> dict[str, Any]:
        det = self.det
        m = det.meta
        pl = self.pipeline(rank)
        if pl is None:
            return {}
        stage, stages, pp_ci = pl
        prog = stage_program(m.schedule, stage, stages, m.microbatches)
        rec = det.recent_ops(rank)
        hit = np.flatnonzero((rec["comm"] == ci) & (rec["seq"] == seq))
        if not len(hit):
            return {}
        h = int(hit[-1])
        located = [(j, self.locate(rank, rec, j, prog, stage, pp_ci)) for j in range(h)]
        bounds = [(j, pos) for j, (is_bound, pos) in located if is_bound]
        if not bounds:
            return {}
        last_j, last_pos = bounds[-1]
        if last_pos is None:
            return {}
        count = int(np.sum(rec["comm"][last_j + 1:h] == ci))
        has_dp = any(det.comm_kind(c) == "dp" and not det.comms.p2p[c]
                     for c in det.comms_of(rank))
        steps = _compute_between(prog, last_pos, None, has_dp)
        if not steps:
            return {}
        if len(steps) > 1:
            per = self._per_step(rec, ci, prog, bounds, has_dp)
            if per is None:
                return {}
            kind, mb = steps[min(count // per, len(steps) - 1)]
        else:
            kind, mb = steps[0]
        pas = "forward" if kind == "F" else "backward"
        out: dict[str, Any] = {"pass": pas, "microbatch": mb}
        phase = schedule_phase(m.schedule, stage, stages, m.microbatches, pas, mb)
        if phase is not None:
            out["schedule_phase"] = phase
        return out

    @staticmethod
    def _per_step(rec: dict[str, np.ndarray], ci: int, prog: list[Any],
                  bounds: list[tuple[int, int | None]], has_dp: bool) -> int | None:
        """Operations of the communicator per compute step, from complete gaps between two
        consecutive located boundaries among the rank's recent operations."""
        ops = steps = 0
        for (j1, p1), (j2, p2) in zip(bounds, bounds[1:], strict=False):
            if p1 is None or p2 is None or p2 == p1:
                continue
            n = len(_compute_between(prog, p1, p2, has_dp))
            if n:
                steps += n
                ops += int(np.sum(rec["comm"][j1 + 1:j2] == ci))
        if not steps or not ops:
            return None
        return max(1, round(ops / steps))

    def pipeline(self, rank: int) -> tuple[int, int, int | None] | None:
        """``(stage, stages, pipeline communicator)`` of a rank: its index in its pipeline
        communicator (members in stage order); stage 0 of 1 without pipeline parallelism."""
        det = self.det
        for c in sorted(det.comms_of(rank)):
            if det.comm_kind(c) == "pp":
                members = det.comms.members(c).tolist()
                if rank in members:
                    return members.index(rank), len(members), c
        return (0, 1, None) if det.meta.pp <= 1 else None

    def locate(self, rank: int, rec: dict[str, np.ndarray], j: int, prog: list[Any],
                stage: int, pp_ci: int | None) -> tuple[bool, int | None]:
        """Is the rank's recent operation ``j`` a schedule boundary (a pipeline send/recv or a
        data-parallel sync), and at which step of the stage program (None: unknown)?"""
        det = self.det
        ci, op = int(rec["comm"][j]), int(rec["op"][j])
        m = det.meta
        if pp_ci is not None and ci == pp_ci and op in (SEND, RECV):
            row = det.flight.cr.find(_cr_key(ci, np.array([rank])))[0]
            if row < 0 or not det.flight.cr.cols["seq0"][row]:
                return True, None
            send = op == SEND
            peer = int(rec["peer"][j])
            grad = peer < stage if send else peer > stage
            want = (send, grad, int(rec["pidx"][j]) % m.microbatches)
            for i, (kind, what) in enumerate(prog):
                if kind == "P" and want in what:
                    return True, i
            return True, None
        if op not in (SEND, RECV) and det.comm_kind(ci) == "dp":
            name = events.COLL_OPS[op]
            for i, (kind, what) in enumerate(prog):
                if kind == "D" and what == name:
                    return True, i
            return True, None
        return False, None

    def batch_order(self, rnd: tuple[Any, ...], roots: list[int]) -> int:
        """Position of the root's operation inside one ``batch_isend_irecv`` (Megatron's order:
        send-prev, recv-prev, send-next, recv-next): of several operations the partners
        posted together, the root would have called the first one first."""
        if rnd[0] == "c":
            return 4
        _, ci, sender, receiver, _k = rnd
        members = self.det.comms.members(ci).tolist()
        if sender not in members or receiver not in members:
            return 4
        r_is_sender = sender in roots
        mine, other = (sender, receiver) if r_is_sender else (receiver, sender)
        nxt = members.index(other) > members.index(mine)
        return 2 * int(nxt) + int(not r_is_sender)

    def reached(self, rnd: tuple[Any, ...], roots: list[int]) -> bool:
        """Would the root have called this operation by now? MEGATRACE §III-C's halt point is
        the first operation the root failed to call in its own program order. A peer may post
        a send or recv long before the root is due (pipeline ranks run ahead), so a
        point-to-point round counts only if a rank in lockstep with the root (a member of its
        TP, else CP, else DP group: same stage, same program) already passed the matching
        operation on its own pipeline communicator. Likewise a data-parallel (or world)
        round: its members are other model replicas, which may be an iteration ahead; it
        counts only if a lockstep peer (TP, else CP group) entered the round of the same seq
        on its own communicator of that kind. Rounds of the TP and CP groups are reached by
        definition: the members that entered are the root's lockstep peers."""
        det = self.det
        if rnd[0] == "c":
            return self.collective_reached(rnd, roots)
        _, ci, sender, receiver, k = rnd
        r = sender if sender in roots else receiver
        other = receiver if r == sender else sender
        members = det.comms.members(ci).tolist()
        if other not in members:
            return True
        other_pos = members.index(other)
        kind = det.comm_kind(ci)
        mine = det.comms_of(r)
        for lock_kind in ("tp", "cp", "dp"):
            lock = [c for c in mine if not det.comms.p2p[c] and det.comm_kind(c) == lock_kind]
            if not lock:
                continue
            peers = [int(q) for q in det.comms.members(lock[0]) if q >= 0 and q != r]
            for q in peers:
                for cq in det.comms_of(q):
                    if (det.comms.p2p[cq] and det.comm_kind(cq) == kind
                            and det.flight.pair_count(cq, q, other_pos, r == receiver) > k):
                        return True
            return False
        return True

    def lockstep_peers(self, rank: int, kinds: tuple[str, ...]) -> list[int]:
        """Members of the rank's first group of ``kinds`` (same stage, same program)."""
        det = self.det
        mine = det.comms_of(rank)
        for lock_kind in kinds:
            lock = [c for c in mine if not det.comms.p2p[c] and det.comm_kind(c) == lock_kind]
            if lock:
                return [int(q) for q in det.comms.members(lock[0]) if q >= 0 and q != rank]
        return []

    def collective_reached(self, rnd: tuple[Any, ...], roots: list[int]) -> bool:
        det = self.det
        ci, seq = rnd[1], rnd[2]
        kind = det.comm_kind(ci)
        if kind in ("tp", "cp"):
            return True
        r = next((x for x in roots if x in det.comms.members(ci)), roots[0])
        peers = self.lockstep_peers(r, ("tp", "cp"))
        if not peers:
            return True
        for q in peers:
            for cq in det.comms_of(q):
                if (not det.comms.p2p[cq] and det.comm_kind(cq) == kind
                        and int(det.flight.last_seq(cq, np.array([q]))[0]) >= seq):
                    return True
        return False
