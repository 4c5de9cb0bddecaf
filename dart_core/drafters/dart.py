"""DART drafting: one head forward -> top-k per level -> N-gram-guided pruning -> DraftTree.

    drafter = DartDrafter(head, store, eos_token_ids)     # head on the target's device/dtype
    engine  = SpeculativeEngine(target, drafter)

Per step (``propose``): the head runs once over the positions committed since the last step
plus its D mask slots and returns D+1 logit rows (row l = tree level l). Each row's top-k
draft ids are mapped to target ids through ``d2t`` and handed with their logits to
:func:`dart_core.drafters.pruning.prune_dart_tree`, which scores every candidate with its logit and
N-gram terms and keeps the best ``budget`` nodes (budget 0: no draft, a plain target step).
Every scored candidate (kept or pruned) goes into the Proposal, so the StepTrace keeps it.
Stage times: ``draft_forward_s`` = the head forward; ``tree_build_s`` = top-k + pruning.

State across a request: the head's KV cache holds one entry per committed position; the
features of newly committed positions (from ``begin`` / ``observe``) wait in ``_pending``
until the next ``propose``, which pairs feature i with token i+1 of the context (the last
one with the tree root).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from ..models.heads.dart import DartHead
from ..models.native_linear import use_native_linears
from .pruning import PruningConfig, prune_dart_tree
from ..engine.tree import DraftTree
from ..engine.protocol import FeatureDrafter, Proposal


class DartDrafter(FeatureDrafter):
    name = "dart"

    def __init__(self, head: DartHead, store=None, eos_token_ids: Sequence[int] = (),
                 pruning: PruningConfig | None = None, backend: str = "native", name: str = "dart",
                 native_linears: bool = True):
        """head: a DartHead with the target's embedding attached, on the target's device and dtype.
        store: an NgramStore (None = no N-gram term). backend: the pruner, "native" or "python".
        native_linears: on a CPU, run the head's projections through the native small-GEMM kernel."""
        super().__init__(head, name, loader="load_dart_head", prepare=use_native_linears if native_linears else None)
        self.store = store
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pruning = pruning or PruningConfig()
        self.pruning.validate()
        self.backend = backend
        self.max_tree_nodes = self._tree_size_bound(head.config.draft_length + 1, head.config.draft_vocab_size)
        self._d2t = head.d2t

    def _tree_size_bound(self, rows: int, draft_vocab: int) -> int:
        """Nodes (root included) of the largest tree this drafter can propose: the budget, or fewer when the
        head's rows x top-k x beam cannot produce that many candidates (so a huge budget sizes no cache)."""
        p = self.pruning
        levels, k = min(rows, int(p.budget)), min(int(p.level_top_k), draft_vocab)
        total, width = 0, 1
        for _ in range(levels):
            width = min(width, int(p.beam_width)) * k if total else k
            total += width
            if total >= p.budget:
                break
        return min(int(p.budget), total) + 1

    # ------------------------------------------------------------------ protocol

    def propose(self, context: Sequence[int]) -> Proposal:
        if int(self.pruning.budget) == 0:
            # Budget 0 drafts nothing: the step is one plain target forward (the output equals vanilla's). The
            # head does not run; its features wait for the next step that drafts.
            return self.skip(context)
        dev = self.head.fc.weight.device
        sync = dev.type == "cuda"
        start = self._cache.length
        pending = self.take_pending(context)
        next_ids = torch.as_tensor(list(context[start + 1:]), dtype=torch.long, device=dev)

        t0 = time.perf_counter()
        # A tree of `budget` nodes is at most `budget` levels deep: deeper rows could never be kept.
        levels = min(self.head.config.draft_length + 1, int(self.pruning.budget))
        logits = self.head.step(pending, next_ids, self._cache, levels)         # [levels, V_d] float32
        if sync:
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()

        k = min(int(self.pruning.level_top_k), logits.shape[-1])
        vals, idx = torch.topk(logits, k, dim=-1)                               # [D+1, k]
        tokens = idx + self._d2t[idx]                                           # draft ids -> target ids
        tree, cands = prune_dart_tree(vals.cpu().numpy().astype(np.float32, copy=False),
                                      tokens.cpu().numpy().astype(np.int64, copy=False), context, self.store,
                                      self.eos_token_ids, self.pruning, backend=self.backend)
        t2 = time.perf_counter()
        return Proposal(tree=tree, candidates=cands, draft_forward_s=t1 - t0, tree_build_s=t2 - t1)
