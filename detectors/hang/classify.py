"""Classification of a round every member entered (CCL-D §2.2, §4.2.2, Figure 7): H2
``inconsistent`` (members called different operations or byte counts, or some completed the
round while the others hang) or H3 ``hardware`` (nothing completes: the member with the fewest
send/recv steps is the root, a queue pair whose work requests pile up names the link,
MEGATRACE §III-C step 2)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from failslow import events
from failslow.detectors.hang.tables import _cr_key
from failslow.schedule import stage_program

if TYPE_CHECKING:
    from failslow.detectors.hang.graph import WaitGraph
    from failslow.detectors.hang.halt import Placement


class Classifier:
    """H2/H3 of the all-entered rounds of one detection pass."""

    def __init__(self, graph: WaitGraph, placement: Placement) -> None:
        self.graph = graph
        self.placement = placement
        self.det = graph.det

    def classify(self, grnd: tuple[Any, ...], ops: list[int]
                  ) -> tuple[str, list[int], list[int] | None, dict[str, Any]]:
        det, fl = self.det, self.det.flight.fl
        ci = grnd[1]
        stuck = {int(fl["rank"][i]): i for i in ops}
        if grnd[0] == "c":
            seq = grnd[2]
            members = [int(m) for m in det.comms.members(ci) if m >= 0]
            sig: dict[int, tuple[int, int]] = {}
            done: list[int] = []
            for m in members:
                if m in stuck:
                    i = stuck[m]
                    sig[m] = (int(fl["op"][i]), int(fl["bytes"][i]))
                    continue
                done.append(m)
                row = det.flight.cr.find(_cr_key(ci, np.array([m])))[0]
                if row >= 0 and det.flight.cr.cols["done_seq"][row] == seq:
                    sig[m] = (int(det.flight.cr.cols["done_op"][row]),
                              int(det.flight.cr.cols["done_bytes"][row]))
        else:
            _, ci, sender, receiver, _k = grnd
            members = [r for r in (sender, receiver) if r >= 0]
            sig = {m: (0, int(fl["bytes"][stuck[m]])) for m in members if m in stuck}
            done = [m for m in members if m not in stuck]
        if len(set(sig.values())) > 1:
            deviating = (self.minority(ci, grnd[2], sig) if grnd[0] == "c"
                         else self.p2p_deviating(ci, {m: (int(fl["op"][stuck[m]]), b)
                                                       for m, (_, b) in sig.items()}))
            seen = {str(m): {"op": events.COLL_OPS[o] if grnd[0] == "c" else None, "bytes": b}
                    for m, (o, b) in sig.items() if m in deviating}
            return "inconsistent", deviating, None, {"deviating": seen}
        if done and grnd[0] == "c" and self.passed_later(ci, grnd[2], list(stuck), done):
            # the others completed this round and later ones these members still hold in
            # flight: the members' device stopped completing work (H3, e.g. a GPU error)
            return "hardware", sorted(stuck), None, {"stopped_completing": sorted(stuck)}
        if done:
            # CCL-D: all entered, some did not hang: the non-hang ranks are the root
            return "inconsistent", sorted(done), None, {"completed_round": sorted(done)}
        if grnd[0] == "p":
            link = self.p2p_link(grnd[2], grnd[3], stuck)
        else:
            link = self.broken_link(ci, list(stuck), int(fl["t"][ops].min()))
        steps = {m: int(fl["steps"][i]) for m, i in stuck.items() if fl["steps"][i] >= 0}
        extra: dict[str, Any] = {}
        roots: list[int] = []
        if steps and len(set(steps.values())) > 1:
            low = min(steps.values())
            roots = sorted(m for m, s in steps.items() if s == low)
            extra["steps"] = {str(m): s for m, s in sorted(steps.items())}
        if link is not None and (not roots or len(roots) > 1):
            lowest = [r for r in link if r in roots] or link
            roots = sorted(lowest)[:1] if roots else sorted(link)
        if not roots:
            roots = sorted(stuck)
        return "hardware", roots, link, extra

    def passed_later(self, ci: int, seq: int, stuck: list[int], done: list[int]) -> bool:
        """Did a member that completed round ``seq`` also complete a later round of the
        communicator that a stuck member entered and still holds in flight? Then the stuck
        member's work is not completing at all (its device), rather than the completed
        member having called something else (H2 leaves the deviant unable to pass the next
        round, since the others never enter it)."""
        fl = self.det.flight.fl
        on_comm = fl["comm"] == ci
        later = np.unique(fl["seq"][on_comm & np.isin(fl["rank"], stuck) & (fl["seq"] > seq)])
        if not len(later):
            return False
        last = self.det.flight.last_seq(ci, np.asarray(done, dtype=np.int64))
        for d, last_d in zip(done, last.tolist(), strict=True):
            held = set(fl["seq"][on_comm & (fl["rank"] == d)].tolist())
            if any(s2 <= last_d and s2 not in held for s2 in later.tolist()):
                return True
        return False

    def p2p_deviating(self, ci: int, sig: dict[int, tuple[int, int]]) -> list[int]:
        """The side of a mismatched send/recv pair (CCL-D §2.2 H2) whose (op, bytes) the
        pair's communicator completed less often before: the usual transfer is the expected
        one. Both sides when history cannot tell them apart."""
        book = self.det.signatures.book
        seen = {m: book.get((ci, o, b), 0) for m, (o, b) in sig.items()}
        if len(set(seen.values())) == 1:
            return sorted(sig)
        low = min(seen.values())
        return sorted(m for m, n in seen.items() if n == low)

    def minority(self, ci: int, seq: int, sig: dict[int, tuple[int, int]]) -> list[int]:
        """The deviating ranks: those whose (op, bytes) is not the most common one in the
        round (CCL-D §2.2 H2). On a tie (two members, say), the signature the same round had
        on the sibling communicators (same kind and size, same pipeline stage: the same
        program, so the same operation at the same seq), else the one the members called one
        iteration earlier on this communicator, else the one more common in this
        communicator's completed history, is the expected one."""
        book = self.det.signatures.book
        counts = Counter(sig.values())
        top = max(counts.values())
        sibling = None
        if list(counts.values()).count(top) > 1:
            sibling = self.sibling_signature(ci, seq) or self.period_signature(ci, seq,
                                                                                  list(sig))
        keep = max(counts, key=lambda s: (counts[s], s == sibling,
                                          book.get((ci, s[0], s[1]), 0), -s[0], -s[1]))
        return sorted(m for m, s in sig.items() if s != keep)

    def period_signature(self, ci: int, seq: int, ranks: list[int]) -> tuple[int, int] | None:
        """The (op, bytes) of round ``seq - N`` on the communicator, N its rounds per
        iteration: counted among a member's recent operations between two passes through
        the same step of its stage program (the schedule repeats every iteration)."""
        det = self.det
        m = det.meta
        if m.microbatches <= 0 or m.schedule not in ("1f1b", "gpipe"):
            return None
        for q in ranks:
            pl = self.placement.pipeline(q)
            if pl is None:
                continue
            stage, stages, pp_ci = pl
            prog = stage_program(m.schedule, stage, stages, m.microbatches)
            rec = det.recent_ops(q)
            seen: dict[int, int] = {}
            prev = None
            for j in range(len(rec["t"])):
                is_bound, pos = self.placement.locate(q, rec, j, prog, stage, pp_ci)
                if not is_bound or pos is None or pos == prev:
                    continue
                prev = pos
                if pos in seen:
                    n = int(np.sum(rec["comm"][seen[pos]:j] == ci))
                    hit = np.flatnonzero((rec["comm"] == ci) & (rec["seq"] == seq - n))
                    if n and len(hit):
                        return int(rec["op"][hit[-1]]), int(rec["bytes"][hit[-1]])
                seen[pos] = j
        return None

    def sibling_signature(self, ci: int, seq: int, limit: int = 16
                           ) -> tuple[int, int] | None:
        """The (op, bytes) most members of sibling communicators called at round ``seq``
        (from their recent operations)."""
        det = self.det
        kind, size = det.comm_kind(ci), det.comms.size[ci]
        members = [int(m) for m in det.comms.members(ci) if m >= 0]
        if not members:
            return None
        here = self.placement.pipeline(members[0])
        votes: Counter[tuple[int, int]] = Counter()
        looked = 0
        for c2 in range(len(det.comms.u64)):
            if (c2 == ci or det.comms.p2p[c2] or det.comms.size[c2] != size
                    or det.comm_kind(c2) != kind):
                continue
            others = [int(m) for m in det.comms.members(c2) if m >= 0]
            if not others:
                continue
            there = self.placement.pipeline(others[0])
            if here is not None and there is not None and there[0] != here[0]:
                continue
            rec = det.recent_ops(others[0])
            hit = np.flatnonzero((rec["comm"] == c2) & (rec["seq"] == seq))
            if len(hit):
                votes[(int(rec["op"][hit[-1]]), int(rec["bytes"][hit[-1]]))] += 1
            looked += 1
            if looked >= limit:
                break
        return votes.most_common(1)[0][0] if votes else None

    def link_pending(self, ci: int, ops: list[int], roots: list[int]) -> bool:
        """Could a broken network link still show? Only if the root has a communicator
        neighbour on another node (a ring sends to and receives from its neighbours), queue
        pairs on the members' nodes report, and the round has been stuck for less than a
        broken link needs to show: completions frozen for ``link_stall_ns`` plus a few
        sampling periods (capped by ``link_wait_ns``)."""
        det, fl = self.det, self.det.flight.fl
        qp = det.links.qp
        if not len(qp["last_t"]):
            return False
        since = int(fl["t"][ops].min())
        node = det.meta.node_of
        nodes = {node(int(fl["rank"][i])) for i in ops}
        if len(nodes) < 2:          # every member on one node: no network link in between
            return False
        members = [int(m) for m in det.comms.members(ci)]
        if len(roots) == 1 and roots[0] in members:
            pos, n = members.index(roots[0]), len(members)
            near = {members[(pos - 1) % n], members[(pos + 1) % n]}
            if all(m >= 0 and node(m) == node(roots[0]) for m in near):
                return False
        flowing = [q for q, info in enumerate(det.links.info)
                   if info[0] in nodes and qp["last_t"][q] >= since]
        if not flowing:
            return False
        cfg = det.config
        t, _ = self.graph.complete_t(self.graph.round_key[ops[0]])
        stuck_at = t + int(self.graph.thr[ops].min())
        wait = min(cfg.link_wait_ns, cfg.link_stall_ns + 3 * max(det.links.period, 0))
        return self.graph.now < stuck_at + wait

    def p2p_link(self, sender: int, receiver: int, stuck: dict[int, int]) -> list[int] | None:
        """A stalled send/recv between two nodes: the link is the pair itself, the end with
        the fewest steps first."""
        node = self.det.meta.node_of
        if sender < 0 or receiver < 0 or node(sender) == node(receiver):
            return None
        steps = self.det.flight.fl["steps"]
        s_steps = int(steps[stuck[sender]]) if sender in stuck else -1
        r_steps = int(steps[stuck[receiver]]) if receiver in stuck else -1
        return [receiver, sender] if 0 <= r_steps < s_steps else [sender, receiver]

    def broken_link(self, ci: int, ranks: list[int], since: int) -> list[int] | None:
        """A queue pair between nodes of the round's members whose posted work requests
        grow while its completions stand still (MEGATRACE §III-C step 2); its two ends as
        member ranks."""
        det = self.det
        qp = det.links.qp
        if not len(qp["last_t"]):
            return None
        cfg = det.config
        nodes = {r: det.meta.node_of(r) for r in ranks}
        by_node: dict[str, list[int]] = {}
        for r, nd in nodes.items():
            by_node.setdefault(nd, []).append(r)
        stalled = ((qp["posted"] - qp["completed"] > 0)
                   & (qp["posted"] - qp["posted_change"] > 0)
                   & (qp["last_t"] - qp["t_change"] >= cfg.link_stall_ns)
                   & (qp["last_t"] >= since))
        best: tuple[int, list[int]] | None = None
        members = det.comms.members(ci).tolist()
        for q in np.flatnonzero(stalled).tolist():
            node, _dev, peer, owner = det.links.info[q]
            if node not in by_node:
                continue
            a_cands = [owner] if owner in ranks else by_node[node]
            b_cands = by_node.get(peer or "", [])
            if not b_cands:
                continue
            def dist(pair: tuple[int, int]) -> int:
                if pair[0] in members and pair[1] in members:
                    d = abs(members.index(pair[0]) - members.index(pair[1]))
                    return min(d, len(members) - d)
                return len(members)
            pairs = [(x, y) for x in a_cands for y in b_cands if x != y]
            if not pairs:
                continue
            a, b = min(pairs, key=dist)
            score = int(qp["posted"][q] - qp["posted_change"][q])
            if best is None or score > best[0]:
                best = (score, [a, b])
        return best[1] if best else None
