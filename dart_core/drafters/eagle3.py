"""EAGLE-3 drafting with the EAGLE-2 dynamic tree: several head forwards -> reranked DraftTree.

    drafter = Eagle3Drafter(head)                       # head on the target's device/dtype
    engine  = SpeculativeEngine(target, drafter)

Per step (``propose``), with k = top_k:

1. Real forward: the positions committed since the last step (target features ``fc(aux)``
   paired with the next token, the last one with the tree root) go into the head's cache.
   The last row's logits give the root's k best children (depth 1), scored by log-prob.
2. ``depth`` tree forwards: the current frontier (k nodes) runs through the head, each node
   with its parent's g as h and attending to every real position, its ancestors and itself.
   Each node's k best children are scored ``score(parent) + log p(child)`` (cumulative
   log-probs); all k*k are candidates, and the best k of them form the next frontier.
3. Rerank: of all ``k + depth*k*k`` candidates keep the best ``total_token - 1`` (the root
   makes ``total_token`` verified nodes, as published).

Orders (deterministic; ties never depend on the device): a row's top-k by log-prob, ties to the
lower draft id; frontier and rerank by (score desc, depth asc, candidate index asc). Scores never
rise along a path, so with the depth tie-break a kept node's parent is always kept. Tree nodes'
K/V live in the head cache only during the step: ``cache.length`` counts real positions only.

Stage times: ``draft_forward_s`` = the head forwards (incl. lm_head + log-softmax);
``tree_build_s`` = top-k, frontier selection, reranking and tree assembly. On CUDA each part is
synchronised, so the split is exact.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch

from ..presets import EAGLE3_FIELDS, LIMITS
from ..models.heads.eagle3 import Eagle3Head
from ..models.heads.native_step import prepare_head
from ..engine.trace import SOURCE_CONTEXT, SOURCE_HEAD, ScoredCandidates
from ..ngram.live import LiveContext, mix_weight
from ..engine.tree import DraftTree
from ..engine.protocol import FeatureDrafter, Proposal, TreeHolder


@dataclass
class Eagle3TreeConfig:
    """The EAGLE-2 dynamic tree's knobs (published EAGLE-3 defaults).

    total_token  nodes verified, root included: the best total_token - 1 candidates are kept
    depth        tree forwards after the first (real) one: drafted depth is at most depth + 1,
                 as in the published topK_generate
    context_weight, context_top_k  the request's own text as a source of candidates, exactly as DART's
                 (docs/ARCHITECTURE.md section 5a): at every expanded node the context's continuations join the
                 children and each child's probability becomes (1 - lam) p_head + lam P_ctx; 0 = the published tree
    top_k        children scored per expanded node, and the frontier width
    """
    total_token: int = 60
    depth: int = 7
    top_k: int = 10
    context_weight: float = 0.0    # "EAGLE-3 + context": the live context's share (as DART's; 0 = the published tree)
    context_top_k: int = 4         # continuations of the context offered per expanded node

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field to change."""
        for name, key in EAGLE3_FIELDS.items():  # the ranges every entry point shares (dart_core.presets)
            v, limit = getattr(self, name), LIMITS[key]
            why = ("must be an integer" if limit.integer and (not isinstance(v, int) or isinstance(v, bool))
                   # a share is bounded above by its meaning, the sizes only by the page and the flags
                   else limit.problem(v, upper=not limit.integer))
            if why is not None:
                raise ValueError(f"Eagle3TreeConfig.{name}={v!r}: {why}")
        t = self.context_top_k
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            raise ValueError(f"Eagle3TreeConfig.context_top_k={t!r}: must be a whole number >= 0")


def topk_stable(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim, values descending, ties to the lower index (torch.topk leaves ties
    unspecified). Fast path: torch.topk, used when no tie touches the selection."""
    vals, idx = torch.topk(x, k, dim=-1)
    boundary_tie = (x >= vals[..., -1:]).sum(-1) > k
    inner_tie = (vals[..., 1:] == vals[..., :-1]).any(-1) if k > 1 else torch.zeros_like(boundary_tie)
    if bool((boundary_tie | inner_tie).any()):
        idx = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
        vals = x.gather(-1, idx)
    return vals, idx


def rank_candidates(scores: np.ndarray, depths: np.ndarray) -> np.ndarray:
    """Candidate indices in the order (score desc, depth asc, index asc)."""
    return np.lexsort((np.arange(len(scores)), depths, -np.asarray(scores)))


class Eagle3Drafter(TreeHolder, FeatureDrafter):
    name = "eagle3"
    tree_kind = "eagle3"    # its tree settings: Eagle3TreeConfig's fields (tree_settings / set_tree)

    def __init__(self, head: Eagle3Head, tree: Eagle3TreeConfig | None = None, name: str = "eagle3",
                 head_backend: str = "auto"):
        """head: an Eagle3Head with the target's embedding attached, on the target's device and dtype.
        head_backend: how the head runs (models.heads.native_step.HEAD_BACKENDS; "auto": one native call per
        depth on a CPU)."""
        super().__init__(head, name, loader="load_eagle3_head", prepare=lambda h: prepare_head(h, head_backend))
        self._tree_config = tree or Eagle3TreeConfig()
        self._tree_config.validate()
        self.live = LiveContext(int(head.embedding.shape[0]))    # the request's own tokens (context_weight > 0)

    @property
    def max_tree_nodes(self) -> int:
        """The best total_token - 1 of at most k + depth * k^2 candidates, plus the root."""
        tc = self._tree_config
        k = min(int(tc.top_k), self.head.config.draft_vocab_size)
        return min(int(tc.total_token), 1 + k + int(tc.depth) * k * k)

    # ------------------------------------------------------------------ protocol

    def begin(self, prompt_ids: Sequence[int], prefill_aux: torch.Tensor | None) -> None:
        super().begin(prompt_ids, prefill_aux)
        self.live.begin(prompt_ids)

    @torch.inference_mode()
    def propose(self, context: Sequence[int]) -> Proposal:
        tc = self._tree_config
        t_begin = time.perf_counter()
        k = min(int(tc.top_k), self.head.config.draft_vocab_size)
        levels, fwd_s = self._expand(context, k, int(tc.depth))
        tree, cands = self._select(context, levels, int(tc.total_token))
        total = time.perf_counter() - t_begin
        return Proposal(tree=tree, candidates=cands, draft_forward_s=fwd_s, tree_build_s=max(total - fwd_s, 0.0))

    @torch.inference_mode()
    def propose_each(self, context: Sequence[int], settings: Sequence[Mapping[str, int]]) -> list[Proposal]:
        """One proposal per tree setting (``total_token``, ``depth``, ``top_k``), as ``propose`` makes each: one
        expansion per top-k at the deepest depth asked (the head rewound between them, ``mark`` / ``rewind``); a
        shallower tree's candidates are the first levels of a deeper one's (the frontier a level expands does not
        depend on how deep the tree goes), and a smaller total keeps fewer of them by the same ranking. The tree
        chooser's offline replay (sizing/replay.py) reads every setting this way. Each proposal carries its
        top-k's forward time."""
        if not settings:
            return []
        vocab = self.head.config.draft_vocab_size
        by_k: dict[int, list[int]] = {}
        for i, st in enumerate(settings):
            by_k.setdefault(min(int(st["top_k"]), vocab), []).append(i)
        out: list[Proposal | None] = [None] * len(settings)
        for n, (k, idx) in enumerate(by_k.items()):
            state = self.mark()
            levels, fwd_s = self._expand(context, k, max(int(settings[i]["depth"]) for i in idx))
            by_depth: dict[int, list[int]] = {}
            for i in idx:
                by_depth.setdefault(int(settings[i]["depth"]), []).append(i)
            for depth, same in by_depth.items():
                # The context's candidates once, grafted as deep as the largest total reaches: a smaller total's
                # tree is the same (a node deeper than total - 1 ranks after its ancestors, past what it keeps),
                # its candidate list may hold those deeper context candidates too.
                t0 = time.perf_counter()
                pool = self._candidates(context, levels[:depth + 1], max(int(settings[i]["total_token"]) for i in same))
                shared_s = time.perf_counter() - t0
                for i in same:
                    t1 = time.perf_counter()
                    tree, cands = self._keep(context, pool, int(settings[i]["total_token"]))
                    out[i] = Proposal(tree=tree, candidates=cands, draft_forward_s=fwd_s,
                                      tree_build_s=shared_s + time.perf_counter() - t1)
            if n + 1 < len(by_k):
                self.rewind(state)
        return out

    def _expand(self, context: Sequence[int], k: int, depth: int) -> tuple[list[tuple], float]:
        """The head's real forward over the waiting positions, then ``depth`` tree forwards over a frontier of
        ``k`` nodes: each level's candidates as (tokens, parents, log-probs, cumulative scores, depths), level 0
        the real forward's, each later level parent-major, then by rank; and the forwards' seconds."""
        head, cache = self.head, self._cache
        dev = head.fc.weight.device
        sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
        start = cache.length
        pending = self.take_pending(context)
        T = start + int(pending.shape[0])                    # real positions after this step's real forward
        cache.reserve(T + depth * k)
        fwd_s = 0.0

        # 1. Real forward: the new positions persist in the head cache.
        t0 = time.perf_counter()
        g, vals, toks = self._real(pending, context[start + 1:], k)                  # [1, H], [k], [k]
        sync()
        fwd_s += time.perf_counter() - t0

        # The bookkeeping is numpy on every device (a few dozen values a depth): torch ops would cost more in
        # dispatch than the head's native forward.
        vals = np.minimum(vals, 0.0)       # a log-prob; keeps scores non-increasing along every path
        levels = [(toks, np.full(k, -1, dtype=np.int64), vals, vals, np.ones(k, dtype=np.int64))]
        n_cands = k
        frontier = np.arange(k)                                                  # candidate indices
        f_h, f_tok, f_score = self._parent_rows(g, np.zeros(k, dtype=np.int64)), toks, vals
        tree_allowed = np.eye(k, dtype=bool)                                     # frontier x this round's slots
        slots = 0

        # 2. Tree forwards: expand the frontier depth by depth.
        for i in range(depth):
            t0 = time.perf_counter()
            g, vals, toks = self._tree(f_h, f_tok, T + i, T + slots, tree_allowed, k)   # [k, H], [k, k], [k, k]
            sync()
            fwd_s += time.perf_counter() - t0
            slots += k

            cu = (f_score[:, None] + np.minimum(vals, 0.0)).reshape(-1)              # [k*k] cumulative
            toks = toks.reshape(-1)
            levels.append((toks, np.repeat(frontier, k), vals.reshape(-1), cu, np.full(k * k, i + 2, dtype=np.int64)))
            base = n_cands
            n_cands += k * k
            if i + 1 == depth:
                break
            # All children of one frontier share a depth: rank by score, ties to the lower index.
            sel = np.argsort(-cu, kind="stable")[:k]                                 # [k]
            out_ids = sel // k                                                       # parent's frontier row
            frontier = base + sel
            f_h, f_tok, f_score = self._parent_rows(g, out_ids), toks[sel], cu[sel]
            tree_allowed = np.concatenate([tree_allowed[out_ids], np.eye(k, dtype=bool)], axis=1)
        return levels, fwd_s

    def _select(self, context: Sequence[int], levels: list[tuple], total_token: int):
        """Rerank every candidate of ``levels`` (with the live context's, when on); keep the best
        ``total_token - 1`` in candidate (topological) order: the tree and the scored candidates."""
        return self._keep(context, self._candidates(context, levels, total_token), total_token)

    def _candidates(self, context: Sequence[int], levels: list[tuple], total_token: int) -> tuple:
        """Every candidate of ``levels``, with the live context's grafted when it is on (no deeper than a tree of
        ``total_token`` nodes reaches): tokens, parents, log-probs, scores, depths, the context's added score and
        each candidate's source bits (None: all the head's)."""
        tc = self._tree_config
        tok, par, lp, score, depth = (np.concatenate(column) for column in zip(*levels))
        if tc.context_weight > 0 and tc.context_top_k > 0:
            self.live.sync(context)
            return self._graft_context(context, tok, par, lp, depth, total_token)
        return tok, par, lp, score, depth, np.zeros(len(tok)), None

    def _keep(self, context: Sequence[int], pool: tuple, total_token: int):
        """The best ``total_token - 1`` candidates of ``pool`` (:meth:`_candidates`) by score, in candidate
        (topological) order: the tree and the scored candidates."""
        tok, par, lp, score, depth, ctx_term, source = pool
        n_cands = len(tok)
        keep_n = min(int(total_token) - 1, n_cands)
        kept_idx = np.sort(rank_candidates(score, depth)[:keep_n])
        node = np.full(n_cands, -1, dtype=np.int64)
        node[kept_idx] = np.arange(1, keep_n + 1)
        kept = node >= 0
        parents = np.where(par[kept_idx] >= 0, node[np.maximum(par[kept_idx], 0)], 0)
        if (parents < 0).any():  # cannot happen (scores never rise along a path); guard the invariant anyway
            raise RuntimeError("EAGLE-3 reranking kept a node without its parent")
        tree = DraftTree.trusted(np.concatenate([[int(context[-1])], tok[kept_idx]]).astype(np.int64),
                                 np.concatenate([[-1], parents]).astype(np.int64),
                                 np.concatenate([[0], depth[kept_idx]]).astype(np.int64),
                                 np.concatenate([[0.0], score[kept_idx].astype(np.float64)]))
        cands = ScoredCandidates(token=tok.astype(np.int64), parent=par, depth=depth, logit_term=lp.astype(np.float64),
                                 ngram_term=ctx_term, score=score.astype(np.float64), kept=kept, node=node,
                                 source=[] if source is None else source)
        return tree, cands

    def _graft_context(self, context: Sequence[int], tok, par, lp, depth, total_token: int):
        """The live context's candidates in EAGLE-3's tree, by DART's rule (section 5a): at the root and at every
        expanded node whose path the context has seen (``mix_weight``), the context's continuations join the
        children, each child's probability becomes ``(1 - lam) p_head + lam P_ctx`` (0 for p_head of a token the
        head did not rank) and the context's own children are expanded again while it goes on. Scores are
        cumulative log-probabilities again, recomputed from the root.

        The context's own children are expanded best score first, and only while one of them could still be among
        the ``total_token - 1`` candidates kept: a child scores below its parent, so once the kept number of
        candidates score above the best one waiting, nothing under it can be kept. (Expanding every one to the
        tree's depth grew as context_top_k ** depth on text that repeats itself: tens of GB on a translation.)
        Returns the arrays extended, the score each candidate's mixture added over the head's log-probability
        (the trace's N-gram column) and each candidate's SOURCE_* bits."""
        tc, index = self._tree_config, self.live.index
        w, top_k = float(tc.context_weight), int(tc.context_top_k)
        keep = max_depth = int(total_token) - 1
        tok, par, depth = [int(t) for t in tok], [int(p) for p in par], [int(d) for d in depth]
        lp = [float(x) for x in lp]
        kids: dict[int, list[int]] = {}
        for c, p in enumerate(par):
            kids.setdefault(p, []).append(c)
        n_head = len(tok)
        score = [0.0] * n_head
        src = [SOURCE_HEAD] * n_head
        tail = [int(t) for t in context[-index.max_order:]]
        waiting: list[tuple[float, int]] = []          # the context's own children not expanded yet: (-score, node)

        def expand(p: int) -> None:
            """Score ``p``'s children with the context's mixture; add the context's own (queued in ``waiting``)."""
            path, c = [], p
            while c >= 0:
                path.append(tok[c])
                c = par[c]
            ctx = np.asarray((tail + path[::-1])[-index.max_order:], dtype=np.int64)
            base = 0.0 if p < 0 else score[p]
            children = kids.get(p, [])
            matched, _, conts, _ = index.continuations(ctx, top_k)
            lam = mix_weight(int(matched), w)
            if lam == 0.0:
                for c in children:
                    score[c] = base + lp[c]
                return
            d = (0 if p < 0 else depth[p]) + 1
            have = {tok[c] for c in children}
            extra = [int(t) for t in conts.tolist() if int(t) not in have] if d <= max_depth else []
            for t in extra:                 # the context's own children: the head gave them nothing
                kids.setdefault(p, []).append(len(tok))
                tok.append(t); par.append(p); depth.append(d); lp.append(-np.inf); score.append(0.0)
                src.append(0)
            children = kids.get(p, [])
            p_ctx, _ = index.query(ctx, np.asarray([tok[c] for c in children], dtype=np.int64))
            for c, pc in zip(children, p_ctx.tolist()):
                head_p = float(np.exp(lp[c])) if lp[c] > -np.inf else 0.0
                score[c] = base + min(0.0, float(np.log((1.0 - lam) * head_p + lam * pc + 1e-30)))
                if pc > 0:
                    src[c] |= SOURCE_CONTEXT
                if c >= n_head:
                    heapq.heappush(waiting, (-score[c], c))

        for p in [-1] + [p for p in sorted(kids) if p >= 0]:    # the root and the head's expanded nodes, in order
            expand(p)
        best = heapq.nlargest(keep, score)           # the kept number of best scores so far (a min-heap below)
        heapq.heapify(best)
        while waiting and keep > 0:
            neg, p = heapq.heappop(waiting)
            if len(best) >= keep and -neg < best[0]:
                break                                # it and everything under it rank below what is kept
            n_before = len(tok)
            expand(p)
            for s_new in score[n_before:]:
                if len(best) < keep:
                    heapq.heappush(best, s_new)
                elif s_new > best[0]:
                    heapq.heapreplace(best, s_new)
        lp_arr = np.asarray(lp)
        score_arr = np.asarray(score)
        parent_score = np.where(np.asarray(par) >= 0, score_arr[np.maximum(np.asarray(par), 0)], 0.0)
        added = np.where(np.isfinite(lp_arr), score_arr - parent_score - lp_arr, score_arr - parent_score)
        return (np.asarray(tok, dtype=np.int64), np.asarray(par, dtype=np.int64), np.where(np.isfinite(lp_arr),
                lp_arr, 0.0), score_arr, np.asarray(depth, dtype=np.int64), added, np.asarray(src, dtype=np.int64))

    def regime(self, context: Sequence[int]) -> str:
        """"copy" while the answer copies from the request (``LiveContext.copying``), else "head", as DART + context's:
        the tree sizer (sizing.AutoTree) keeps an acceptance model and a choice for each, since the context's long
        chains are accepted far more often there (offline, over 10 context_dev prompts a kind: the chooser's regret
        against the best fixed tree went from +3.8% with one choice to -0.9%). The head drafts in both."""
        return "copy" if self._tree_config.context_weight > 0 and self.live.copying(context) else "head"

    @staticmethod
    def _parent_rows(g, rows: np.ndarray):
        """The frontier's h: the parents' g rows (numpy from the native step, a tensor on the torch path)."""
        return g[rows] if isinstance(g, np.ndarray) else g[torch.as_tensor(rows, device=g.device)]

    # One head forward each, then each row's log-softmax top-k (ties to the lower draft id) as target ids:
    # one native call on a CPU, torch ops otherwise (the reference).
    def _real(self, pending: torch.Tensor, next_ids: Sequence[int], k: int):
        """The real forward: g [1, H] of the last new position, its k best log-probs [k] and target ids [k]."""
        if self._step is not None:
            g, vals, toks = self._step.eagle3_real(pending, next_ids, self._cache, k)
            return g, vals[0], toks[0]
        head = self.head
        dev = head.fc.weight.device
        ids = torch.as_tensor(list(next_ids), dtype=torch.long, device=dev)
        g = head.step_real(pending, ids, self._cache)[-1:]                               # [1, H]
        vals, idx = topk_stable(torch.log_softmax(head.logits(g), dim=-1)[0], k)         # [k]
        return g, vals.cpu().numpy(), (idx + head.d2t[idx]).cpu().numpy()

    def _tree(self, f_h, f_tok: np.ndarray, position: int, tree_start: int, tree_allowed: np.ndarray, k: int):
        """One tree depth over the frontier: g [n, H], each node's k best log-probs [n, k] and target ids."""
        if self._step is not None:
            return self._step.eagle3_tree(f_h, f_tok, position, self._cache, tree_start, tree_allowed, k)
        head = self.head
        dev = f_h.device
        g = head.step_tree(f_h, torch.as_tensor(f_tok, device=dev), position, self._cache, tree_start,
                           torch.as_tensor(tree_allowed, device=dev))                       # [n, H]
        vals, idx = topk_stable(torch.log_softmax(head.logits(g), dim=-1), k)             # [n, k]
        return g, vals.cpu().numpy(), (idx + head.d2t[idx]).cpu().numpy()
