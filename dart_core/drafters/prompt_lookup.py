"""Prompt lookup drafting: propose what followed earlier occurrences of the latest n-gram.

For n from ``max_ngram`` down to ``min_ngram``, find earlier places in the context
where its last n tokens occur; the tokens that followed each match (up to
``num_pred_tokens``) are candidate continuations. Several matches that disagree make
a branching tree: their continuations are merged into a prefix tree whose node score
is log(share of matches that pass through the node), so the verifier visits the
best-supported branch first. No model forward: all time is ``tree_build``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..engine.trace import SOURCE_CONTEXT, ScoredCandidates
from ..engine.tree import DraftTree
from ..engine.protocol import AcceptedStep, Proposal, TreeHolder


def _check_whole(name: str, value, low: int) -> None:
    """The lowest value of each setting that drafts anything; every whole number from there on runs."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"PromptLookupDrafter {name} must be a whole number >= {low}, got {value!r}")


@dataclass(frozen=True)
class LookupTreeConfig:
    """Prompt lookup's tree: how far each match is continued, and the most nodes the merged tree may hold."""
    num_pred_tokens: int = 10
    max_tree_nodes: int = 61

    def __post_init__(self) -> None:
        _check_whole("num_pred_tokens", self.num_pred_tokens, 1)
        _check_whole("max_tree_nodes", self.max_tree_nodes, 2)


class PromptLookupDrafter(TreeHolder):
    name = "prompt_lookup"
    tree_kind = "prompt_lookup"   # its tree settings: LookupTreeConfig's fields (tree_settings / set_tree)
    needs_aux = False

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, num_pred_tokens: int = 10,
                 max_matches: int = 8, max_tree_nodes: int = 61):
        for name, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram), ("max_matches", max_matches)):
            _check_whole(name, value, 1)
        if min_ngram > max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self._tree_config = LookupTreeConfig(num_pred_tokens, max_tree_nodes)
        self.max_ngram, self.min_ngram, self.max_matches = max_ngram, min_ngram, max_matches

    @property
    def max_tree_nodes(self) -> int:
        return self._tree_config.max_tree_nodes

    def begin(self, prompt_ids, prefill_aux) -> None:
        return None

    def observe(self, step: AcceptedStep) -> None:
        return None

    def _continuations(self, ctx: np.ndarray) -> list[np.ndarray]:
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ctx) <= n:
                continue
            pattern = ctx[-n:]
            # Windows starting at i cover ctx[i:i+n]; only i + n < len(ctx) leave a continuation.
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            starts = np.flatnonzero((windows == pattern).all(axis=1))
            if starts.size:
                starts = starts[::-1][: self.max_matches]  # most recent first
                return [ctx[s + n: s + n + self._tree_config.num_pred_tokens] for s in starts]
        return []

    def propose(self, context: Sequence[int]) -> Proposal:
        t0 = time.perf_counter()
        ctx = np.asarray(context, dtype=np.int64)
        conts = self._continuations(ctx)
        tokens, parents, counts = [int(ctx[-1])], [-1], [len(conts)]
        child: dict[tuple[int, int], int] = {}
        for cont in conts:  # most recent match first, so its branch gets the lower indices
            node = 0
            for tok in cont.tolist():
                key = (node, tok)
                if key not in child:
                    if len(tokens) >= self._tree_config.max_tree_nodes:
                        break
                    child[key] = len(tokens)
                    tokens.append(tok); parents.append(node); counts.append(0)
                node = child[key]
                counts[node] += 1
        total = max(len(conts), 1)
        scores = [0.0] + [math.log(c / total) for c in counts[1:]]
        tree = DraftTree.from_parents(tokens, parents, scores)
        cands = None
        if len(tokens) > 1:   # every node is a candidate, kept, and came from the context
            n = len(tokens) - 1
            cands = ScoredCandidates(token=tokens[1:], parent=[p - 1 for p in parents[1:]],
                                     depth=tree.depths[1:].tolist(), logit_term=[0.0] * n, ngram_term=[0.0] * n,
                                     score=scores[1:], kept=[True] * n, node=list(range(1, n + 1)),
                                     source=[SOURCE_CONTEXT] * n)
        return Proposal(tree=tree, candidates=cands, tree_build_s=time.perf_counter() - t0)
