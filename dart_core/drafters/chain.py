"""DART's draft as one chain of tokens: what a chain verifier (vLLM) checks, for our engine and the vLLM plugin alike.

The pruner (:mod:`.pruning`) scores candidate c + x at level l by score(c) plus its logit and N-gram terms. The chain
runs that same pruner with a beam of one and a budget that keeps every candidate (:func:`chain_pruning`), and takes
each level's best-scored candidate (:func:`best_chain`): level by level, the best child of the chain so far. The
pruned tree's best path (root, then each time the highest-scored kept child) is that chain until the tree ends (its
next node pruned by the budget or the beam, or an EOS); a chain verifier needs k tokens, so the chain goes on by the
same rule. Level l's token depends on levels 0..l only (the vLLM plugin's k-pass path picks it in pass l).

    config = chain_pruning(PruningConfig(), levels=3, draft_vocab=8192)
    tokens, picked, candidates = best_chain(builder, topk_logits[:3], topk_tokens[:3], context, config)
    chains = best_chains(builder, batch_logits, batch_tokens, tails, config)    # [B, 3]: a batch in one call
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from .pruning import PruningConfig, TreeBuilder


def chain_pruning(pruning: PruningConfig, levels: int, draft_vocab: int) -> PruningConfig:
    """The pruner settings that make its candidate list a chain search: beam 1 (each level expands only the best
    non-EOS candidate of the level before) and a budget that keeps every candidate."""
    width = min(int(pruning.level_top_k), int(draft_vocab))
    return dataclasses.replace(pruning, beam_width=1, budget=max(1, levels * width))


def best_chain(builder: TreeBuilder, topk_logits: np.ndarray, topk_tokens: np.ndarray, context: Sequence[int],
               config: PruningConfig, live: Any = None) -> tuple[np.ndarray, np.ndarray, Any]:
    """topk_logits / topk_tokens [L, k] (target ids) of levels 0..L-1, context ending with the root, ``config`` from
    :func:`chain_pruning` -> ([L] int64: level l's best-scored candidate; [L] int64: its index in the candidates; the
    pruner's scored candidates). Where every candidate of the level before was an EOS nothing expands, and the
    level's row's best (by logit) stands in (index -1)."""
    levels = topk_logits.shape[0]
    _, cands = builder.build(np.ascontiguousarray(topk_logits, dtype=np.float32),
                             np.ascontiguousarray(topk_tokens, dtype=np.int64), context, config, live)
    depth = np.asarray(cands.depth)
    score = np.asarray(cands.score, dtype=np.float64)
    token = np.asarray(cands.token, dtype=np.int64)
    out = np.empty(levels, dtype=np.int64)
    picked = np.full(levels, -1, dtype=np.int64)
    for level in range(levels):
        at = np.flatnonzero(depth == level + 1)
        if at.size:
            picked[level] = at[np.argmax(score[at])]                # argmax: the first of equal scores
            out[level] = token[picked[level]]
        else:
            out[level] = int(topk_tokens[level, int(np.argmax(topk_logits[level]))])
    return out, picked, cands


def context_from_tail(tail: np.ndarray) -> np.ndarray:
    """A context tail as a batch carries it (-1 where a position is unknown) -> the known tokens after the last
    unknown one, root last."""
    tail = np.asarray(tail, dtype=np.int64)
    cut = np.flatnonzero(tail < 0)
    return tail[cut[-1] + 1:] if cut.size else tail


def best_chains(builder: TreeBuilder, topk_logits: np.ndarray, topk_tokens: np.ndarray, tails: np.ndarray,
                config: PruningConfig) -> np.ndarray:
    """A batch at once: topk_logits / topk_tokens [B, L, k], tails [B, T] (each request's context tail, root last, -1
    where unknown) -> [B, L] int64, each request's :func:`best_chain`. The native pruner takes the whole batch in one
    call (``TreeBuilder.chains``); the python backend (the reference) goes request by request."""
    if builder.backend == "native":
        return builder.chains(topk_logits, topk_tokens, tails, config)
    B, levels = topk_logits.shape[:2]
    out = np.empty((B, levels), dtype=np.int64)
    for b in range(B):
        out[b] = best_chain(builder, topk_logits[b], topk_tokens[b], context_from_tail(tails[b]), config)[0]
    return out
