"""Acceptance model: how many drafted tokens a tree of a given shape is expected to get accepted.

A drafted node can only be accepted when its parent was; given that, the chance that it is the
target's next token depends (to first order) on its depth and on its rank among its siblings (by the
drafter's own score). The model keeps that conditional rate ``rate[d, r]`` for depth d = 1.. and
sibling rank r = 0.., so a node's chance of being accepted is the product of the rates along its path,
and a tree's expected accepted length is the sum of its nodes' chances.

    model = AcceptanceModel.from_hit_rates(hit1=[0.45, 0.30, ...], hit10=[0.75, 0.62, ...])
    model.begin_request()                 # this answer gets its own copy of the long-run rates
    model.observe(trace)                  # after every verify step: trials and hits per (depth, rank)
    model.value_curve(8, max_depth=4, width=3)[8]    # expected accepted drafts of the best 8-node tree

Seeding: a head's held-out hit@1 and hit@10 per future position (its model card's ``eval.json``)
give rank 0 and spread the rest of the top-10 mass over ranks 1..9. Those are a position's own hit rates, not
conditional on the positions before it being right; hits come in runs, so the product of them along a path
underrates deep trees (the bundled DART head: 1.18 expected top-1 levels in a row against the 1.35 measured),
and a chooser that never drafts deep never learns otherwise. With the held-out mean top-1 chain, the rates past
depth 1 are raised toward the nested extreme (rate = hit@1[d] / hit@1[d-1], as if every hit at d followed hits
before it) just enough for the product to give that chain (``chain_conditional``). Online: every node whose parent
was accepted is one trial of its (depth, rank) cell; the request's rates move by an exponential
moving average (so a code answer and a chat answer each get their own), and the long-run rates move
more slowly and seed the next request. Cells the request has not tried yet follow its level: the
long-run rate times how its tried cells fare against theirs (a request the head does badly on must
not keep believing in the wide or deep trees it has not drafted).
"""
from __future__ import annotations

import heapq
import json
from pathlib import Path
from typing import Sequence

import numpy as np

#: Depths and sibling ranks the model keeps (deeper / lower-ranked nodes share the last cell).
MAX_DEPTH = 16
MAX_RANK = 16
#: Rates used when a head has no held-out figures: a modest drafter, decaying with depth.
GENERIC_RANK0 = 0.55
GENERIC_DEPTH_DECAY = 0.9
#: Expected hits of prior weight on a request's level (``AcceptanceModel.request_level``).
REQUEST_PRIOR = 2.0


def chain_conditional(hit1: Sequence[float], chain: float, tol: float = 1e-6) -> list[float]:
    """Per-depth rank-0 rates, conditional on the path above being accepted, from a position's own hit@1 and the
    mean top-1 chain (levels matched in a row). Depth 1 is hit@1[0]; deeper ones ``h[d]^(1-t) * (h[d]/h[d-1])^t``
    for the one t in [0, 1] whose chain sum ``sum_d prod_{e<=d} rate[e]`` equals ``chain``: t = 0 treats the
    positions as independent (the least chain), t = 1 as nested (a hit at d always after hits before it, the
    most). A chain outside that range takes the nearer end."""
    h = [min(max(float(x), 1e-9), 1.0) for x in hit1]

    def rates(t: float) -> list[float]:
        return [h[0]] + [min(1.0, h[d] ** (1 - t) * (h[d] / h[d - 1]) ** t) for d in range(1, len(h))]

    def total(t: float) -> float:
        out, p = 0.0, 1.0
        for r in rates(t):
            p *= r
            out += p
        return out

    lo, hi = 0.0, 1.0
    if chain <= total(lo):
        return rates(lo)
    if chain >= total(hi):
        return rates(hi)
    while hi - lo > tol:      # the chain sum grows with t (every rate does, a hit rate falling with depth)
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) < chain else (lo, mid)
    return rates(0.5 * (lo + hi))


def _sibling_ranks(parents: Sequence[int], scores: Sequence[float] | None) -> list[int]:
    """Each node's rank among its parent's children, by score (desc), ties by node index (the root: 0)."""
    n = len(parents)
    ranks = [0] * n
    by_parent: dict[int, list[int]] = {}
    for i in range(1, n):
        by_parent.setdefault(parents[i], []).append(i)
    for kids in by_parent.values():
        if scores is not None and len(kids) > 1:
            kids = sorted(kids, key=lambda i: (-scores[i], i))
        for r, i in enumerate(kids):
            ranks[i] = r
    return ranks


class AcceptanceModel:
    """Conditional acceptance rates per (depth, sibling rank), long-run and per request (see the module)."""

    def __init__(self, rates: np.ndarray, *, request_alpha: float = 0.15, longrun_alpha: float = 0.03,
                 source: str = "given"):
        rates = np.clip(np.asarray(rates, dtype=np.float64), 0.0, 1.0)
        if rates.shape != (MAX_DEPTH, MAX_RANK):
            raise ValueError(f"rates must be [{MAX_DEPTH}, {MAX_RANK}] (depth 1.., rank 0..), got {rates.shape}")
        self.seed_rates = rates.copy()
        self.longrun = rates.copy()
        self.rates = rates.copy()             # this request's
        self.request_alpha = float(request_alpha)
        self.longrun_alpha = float(longrun_alpha)
        self.source = source
        self.trials = np.zeros_like(rates)    # counted trials (long-run), for the report
        self.hits = np.zeros_like(rates)
        self._request_trials = np.zeros_like(rates)   # this request's trials per cell
        self._request_hits = 0.0                      # and its hits against what the long-run rates expected
        self._request_expected = 0.0
        self._curves_stamp: bytes | None = None       # the rates value_curves' walks were made from
        self._curves: dict = {}                       # and those walks, by (needs, width, beam)

    # ------------------------------------------------------------------ seeding
    @classmethod
    def from_hit_rates(cls, hit1: Sequence[float], hit10: Sequence[float] | None = None,
                       source: str = "held-out hit rates", chain: float | None = None) -> "AcceptanceModel":
        """Seed from held-out hit@1 (and hit@10) per future position t+1, t+2, ... Position d's hit@1 is the
        rank-0 rate at depth d; hit@10 - hit@1 is spread over ranks 1..9, halving each rank. With ``chain`` (the
        held-out mean top-1 chain), each depth's rates are scaled to :func:`chain_conditional`'s rank-0 rate.
        Depths past the figures repeat the last one."""
        h1 = [float(x) for x in hit1] or [GENERIC_RANK0]
        h10 = [float(x) for x in hit10] if hit10 else [min(1.0, 1.6 * x) for x in h1]
        c1 = chain_conditional(h1, chain) if chain is not None else h1
        rates = np.zeros((MAX_DEPTH, MAX_RANK))
        w = 0.5 ** np.arange(1, 10)
        w /= w.sum()
        for d in range(MAX_DEPTH):
            a1 = h1[min(d, len(h1) - 1)]
            a10 = max(h10[min(d, len(h10) - 1)], a1)
            c = c1[min(d, len(c1) - 1)]
            rates[d, 0] = c
            # the siblings' share scales with rank 0's, their total within 1 (one child at most is the target's)
            scale = min(c / a1, (1.0 - c) / (a10 - a1)) if a1 > 0 and a10 > a1 else 1.0
            rates[d, 1:10] = (a10 - a1) * scale * w
        src = f"{source}, conditioned on the top-1 chain {chain:.3f}" if chain is not None else source
        return cls(rates, source=src)

    @classmethod
    def generic(cls) -> "AcceptanceModel":
        h1 = [GENERIC_RANK0 * GENERIC_DEPTH_DECAY ** d for d in range(MAX_DEPTH)]
        return cls.from_hit_rates(h1, None, source="generic prior (no held-out figures for this head)")

    @classmethod
    def for_head_dir(cls, head_dir: str | Path | None) -> "AcceptanceModel":
        """Seeded from ``eval.json`` (the training run's held-out figures) beside a head's weights; the generic
        prior when the head has none (e.g. a published head from the Hub)."""
        if head_dir is not None:
            path = Path(head_dir) / "eval.json"
            try:
                ev = json.loads(path.read_text())
                chain = ev.get("mean_top1_chain")
                return cls.from_hit_rates(ev["hit@1"], ev.get("hit@10"), source=f"held-out hit rates ({path})",
                                          chain=None if chain is None else float(chain))
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return cls.generic()

    # ------------------------------------------------------------------ online
    def begin_request(self) -> None:
        self.rates = self.longrun.copy()
        self._request_trials[:] = 0
        self._request_hits = self._request_expected = 0.0

    def request_level(self) -> float:
        """How this request's drafts fare against the long-run rates: hits / expected hits over its trials,
        shrunk toward 1 by a prior of REQUEST_PRIOR expected hits (a few trials say little)."""
        return (self._request_hits + REQUEST_PRIOR) / (self._request_expected + REQUEST_PRIOR)

    def effective_rates(self) -> np.ndarray:
        """The rates the expectations use: this request's where it has tried a cell; elsewhere the long-run
        rate scaled by the request's level, so a request where the head does badly at the cells it drafts
        does not keep believing in the cells it has not tried (wider or deeper trees)."""
        scaled = np.clip(self.longrun * self.request_level(), 0.0, 1.0)
        return np.where(self._request_trials > 0, self.rates, scaled)

    def observe(self, parents: np.ndarray, scores: np.ndarray | None, accepted_nodes: Sequence[int]) -> None:
        """One verify step: every node whose parent was accepted is a trial of its (depth, rank) cell. In plain
        Python over lists (this runs after every verify, where numpy's per-element calls are slow)."""
        parents = np.asarray(parents).tolist()
        n = len(parents)
        if n <= 1:
            return
        scores = None if scores is None else np.asarray(scores, dtype=np.float64).tolist()
        accepted = [False] * n
        for i in accepted_nodes:
            accepted[int(i)] = True
        depth = [0] * n
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        ranks = _sibling_ranks(parents, scores)
        for i in range(1, n):
            if not accepted[parents[i]]:
                continue
            d, r = min(depth[i], MAX_DEPTH) - 1, min(ranks[i], MAX_RANK - 1)
            x = 1.0 if accepted[i] else 0.0
            longrun = float(self.longrun[d, r])
            rate = float(self.rates[d, r])
            self._request_trials[d, r] += 1
            self._request_hits += x
            self._request_expected += longrun
            self.rates[d, r] = rate + self.request_alpha * (x - rate)
            self.longrun[d, r] = longrun + self.longrun_alpha * (x - longrun)
            self.trials[d, r] += 1
            self.hits[d, r] += x

    # ------------------------------------------------------------------ expectations
    def rate(self, depth: int, rank: int) -> float:
        """The rate the expectations use for a node at ``depth`` (1..) and sibling ``rank`` (0..)."""
        return float(self.effective_rates()[min(depth, MAX_DEPTH) - 1, min(rank, MAX_RANK - 1)])

    def value_curve(self, max_nodes: int, max_depth: int, width: int, beam: int | None = None) -> np.ndarray:
        """``curve[n]`` = expected accepted drafts of the best tree of n drafted nodes (n = 0..max_nodes):
        nodes at most ``max_depth`` deep, at most ``width`` children per node, and at each depth only the
        ``beam`` likeliest nodes expanded (None: all). The best n-node tree holds the n likeliest nodes (a
        child is never likelier than its parent), so a best-first walk builds every size in one pass."""
        return np.asarray(self.value_curves({max_depth: max_nodes}, width, beam)[max_depth])

    def value_curves(self, needs: dict[int, int], width: int, beam: int | None = None) -> dict[int, list[float]]:
        """:meth:`value_curve` for several depth limits at once: ``needs`` maps a depth limit to the nodes its
        curve must reach. One walk to the deepest limit serves them all: a shallower limit's walk is the same
        walk with the deeper nodes left out (a node's chance and whether it may be drafted depend only on its
        ancestors, which are shallower)."""
        rates = self.effective_rates()
        # The walk depends only on the rates and the shape: kept until the rates change (a drafting step's observe,
        # a new request), so the decisions during a run of plain steps, where nothing was learnt, reuse it. The
        # curves returned are shared: read them, do not write them.
        key = (tuple(sorted(needs.items())), width, beam)
        stamp = rates.tobytes()
        if self._curves_stamp != stamp:
            self._curves_stamp, self._curves = stamp, {}
        if key not in self._curves:
            self._curves[key] = self._walk(needs, width, beam, rates.tolist())
        return self._curves[key]

    def _walk(self, needs: dict[int, int], width: int, beam: int | None,
              R: list[list[float]]) -> dict[int, list[float]]:
        """value_curves' best-first walk over the rates R (plain floats: this loop runs on every decision)."""
        curves = {d: [0.0] * (n + 1) for d, n in needs.items()}
        todo = {d: n for d, n in needs.items() if d > 0 and n > 0 and width > 0}
        if not todo:
            return curves
        max_depth = max(todo)
        expanded = [0] * (max_depth + 1)          # nodes expanded per depth (0 = the root)
        last_r = MAX_RANK - 1
        heap: list[tuple[float, int, int, int, float]] = [(-R[0][0], 0, 1, 0, 1.0)]   # (-p, tie, depth, rank,
        tie, expanded[0] = 0, 1                   # parent's p): the root's first child; each popped node brings
        push, pop = heapq.heappush, heapq.heappop  # its next sibling and its own first child
        filled = {d: 0 for d in todo}
        totals = {d: 0.0 for d in todo}
        while heap and todo:
            neg, _, depth, rank, parent_p = pop(heap)
            for d in list(todo):
                if depth <= d:
                    filled[d] += 1
                    totals[d] -= neg
                    curves[d][filled[d]] = totals[d]
                    if filled[d] >= todo[d]:
                        del todo[d]
            if rank + 1 < width:
                tie += 1
                push(heap, (-parent_p * R[min(depth, MAX_DEPTH) - 1][min(rank + 1, last_r)], tie, depth, rank + 1,
                            parent_p))
            if depth < max_depth and (beam is None or expanded[depth] < beam):
                expanded[depth] += 1
                tie += 1
                push(heap, (neg * R[min(depth + 1, MAX_DEPTH) - 1][0], tie, depth + 1, 0, -neg))
        for d, curve in curves.items():          # sizes past what the shape can draft add nothing
            for i in range(filled.get(d, 0) + 1, len(curve)):
                curve[i] = curve[i - 1]
        return curves

    def summary(self, depths: int = 6, ranks: int = 3) -> dict:
        """The request's and long-run rates of the first cells, and the counted trials, for reports."""
        return {"source": self.source,
                "rates": np.round(self.rates[:depths, :ranks], 3).tolist(),
                "longrun": np.round(self.longrun[:depths, :ranks], 3).tolist(),
                "trials": self.trials[:depths, :ranks].astype(int).tolist(),
                "observed": [[None if t == 0 else round(h / t, 3) for h, t in zip(hr, tr)]
                             for hr, tr in zip(self.hits[:depths, :ranks], self.trials[:depths, :ranks])]}


__all__ = ["AcceptanceModel", "MAX_DEPTH", "MAX_RANK"]
