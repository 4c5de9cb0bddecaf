"""DART drafting: one head forward -> top-k per level -> N-gram-guided pruning -> DraftTree.

    drafter = DartDrafter(head, store, eos_token_ids)     # head on the target's device/dtype
    engine  = SpeculativeEngine(target, drafter)

Per step (``propose``): the head runs once over the positions committed since the last step
plus its mask slots and returns a logit row per tree level (row l = level l; only as many levels
as the budget can keep). Each row's top-k draft ids are mapped to target ids through ``d2t``
(on a CPU the forward and the top-k are one native call, ``models.heads.native_step``) and handed
with their logits to
:func:`dart_core.drafters.pruning.prune_dart_tree`, which scores every candidate with its logit and
N-gram terms and keeps the best ``budget`` nodes (budget 0: no draft, a plain target step).
Every scored candidate (kept or pruned) goes into the Proposal, so the StepTrace keeps it.
Stage times: ``draft_forward_s`` = the head forward and each level's top-k; ``tree_build_s`` = pruning.

``shape="chain"`` (the ``dart_chain`` method) drafts one chain of ``budget`` tokens in place of the tree: each level's
best-scored candidate under the same scores (:mod:`.chain`), the draft a chain verifier such as vLLM checks, so our
engine's acceptance can be set beside vLLM's (benchmarks/vllm_check.py). It is the paper's DART: no live context.

With ``PruningConfig.context_weight`` > 0 ("DART + context") the request's own tokens (``self.live``, indexed
as they are committed) add their continuations to every level and past the head's last one, and share the
N-gram term with the corpus table (docs/ARCHITECTURE.md section 5a); at 0 the drafter is the paper's.

State across a request: the head's KV cache holds one entry per committed position; the
features of newly committed positions (from ``begin`` / ``observe``) wait in ``_pending``
until the next ``propose``, which pairs feature i with token i+1 of the context (the last
one with the tree root).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np
import torch

from ..models.heads.dart import DartHead
from ..models.heads.native_step import prepare_head
from ..ngram.live import LiveContext
from .chain import best_chain, chain_pruning
from .pruning import PruningConfig, TreeBuilder
from ..engine.tree import DraftTree
from ..engine.protocol import FeatureDrafter, Proposal, TreeHolder


#: What a DART draft can be: the pruned tree, or its best path as one chain (a chain verifier's draft).
SHAPES = ("tree", "chain")


class DartDrafter(TreeHolder, FeatureDrafter):
    name = "dart"
    tree_kind = "dart"      # its tree settings: PruningConfig's fields (tree_settings / set_tree)

    def __init__(self, head: DartHead, store=None, eos_token_ids: Sequence[int] = (),
                 pruning: PruningConfig | None = None, backend: str = "native", name: str = "dart",
                 head_backend: str = "auto", shape: str = "tree"):
        """head: a DartHead with the target's embedding attached, on the target's device and dtype.
        store: an NgramStore (None = no N-gram term). backend: the pruner, "native" or "python".
        head_backend: how the head runs (models.heads.native_step.HEAD_BACKENDS; "auto": one native call a
        step on a CPU). shape: "tree" (the pruned tree of ``budget`` nodes) or "chain" (its best path, ``budget``
        tokens long; the paper's scores only: context_weight must stay 0)."""
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
        self.shape = shape
        super().__init__(head, name, loader="load_dart_head", prepare=lambda h: prepare_head(h, head_backend))
        self._builder = TreeBuilder(store, eos_token_ids, backend)   # holds the store, EOS ids and pruner backend
        self._tree_config = pruning or PruningConfig()
        self._tree_config.validate()
        self._check_shape()
        self._d2t = head.d2t
        # The request's own tokens, for context candidates (PruningConfig.context_weight > 0; section 5a): the
        # target's vocabulary, or the table's where it is smaller (the pruner looks context tokens up there too).
        vocab = int(head.embedding.shape[0])
        self.live = LiveContext(min(vocab, int(store.vocab_size)) if store is not None else vocab)
        self.head_skipped = 0            # drafting steps the context drafted alone (this drafter's life)
        self.last_head_skipped = False   # whether the last proposal ran without the head (the tree sizer prices it)

    @property
    def max_tree_nodes(self) -> int:
        c = self.head.config
        return self._tree_size_bound(c.draft_length + 1, c.draft_vocab_size)

    # Read-only views of what the tree builder holds (one place, so they cannot drift apart).
    @property
    def store(self):
        return self._builder.store

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._builder.eos_token_ids

    @property
    def backend(self) -> str:
        return self._builder.backend

    def _tree_size_bound(self, rows: int, draft_vocab: int) -> int:
        """Nodes (root included) of the largest tree this drafter can propose: the budget, or fewer when the
        head's rows x top-k x beam cannot produce that many candidates (so a huge budget sizes no cache)."""
        p = self._tree_config
        levels, k = min(rows, int(p.budget)), min(int(p.level_top_k), draft_vocab)
        total, width = 0, 1
        for _ in range(levels):
            width = min(width, int(p.beam_width)) * k if total else k
            total += width
            if total >= p.budget:
                break
        return min(int(p.budget), total) + 1

    # ------------------------------------------------------------------ protocol

    def begin(self, prompt_ids: Sequence[int], prefill_aux: torch.Tensor | None) -> None:
        super().begin(prompt_ids, prefill_aux)
        self.live.begin(prompt_ids)

    def propose(self, context: Sequence[int]) -> Proposal:
        if int(self._tree_config.budget) == 0:
            # Budget 0 drafts nothing: the step is one plain target forward (the output equals vanilla's). The
            # head does not run; its features wait for the next step that drafts.
            return self.skip(context)
        return self.propose_each(context, [int(self._tree_config.budget)])[0]

    def propose_each(self, context: Sequence[int], budgets: Sequence[int]) -> list[Proposal]:
        """One proposal per budget (each >= 1) from one head forward: the rows of a shallower tree are the first
        rows of a deeper one (the head's attention is causal over its mask slots), so the trees are those
        ``propose`` makes at each budget. The tree chooser's offline replay (sizing/replay.py) reads every
        setting this way; ``propose`` is the case of one budget. The draft time goes to each proposal."""
        if not budgets or min(int(b) for b in budgets) < 1:
            raise ValueError(f"propose_each needs budgets >= 1 (a plain step is skip()), got {list(budgets)}")
        live = None
        self._check_shape()     # the tree settings may have changed since (set_tree)
        if self._tree_config.context_weight > 0:
            self.live.sync(context)          # the tokens committed since the last drafting step
            live = self.live.index
        k = min(int(self._tree_config.level_top_k), self.head.config.draft_vocab_size)
        rows = self.head.config.draft_length + 1
        t0 = time.perf_counter()
        if live is not None and self.live.copying(context):
            # The answer is copying: the context alone drafts this tree and the head sits the step out (its
            # features wait, as after a plain step).
            self.skip(context)
            vals, tokens = np.zeros((0, k), dtype=np.float32), np.zeros((0, k), dtype=np.int64)
            self.head_skipped += 1
            self.last_head_skipped = True
        else:
            self.last_head_skipped = False
            start = self._cache.length
            pending = self.take_pending(context)
            # A tree of `budget` nodes is at most `budget` levels deep: deeper rows could never be kept.
            levels = min(rows, max(int(b) for b in budgets))
            if self._step is not None:     # one native call: the head forward and each level's top-k
                vals, tokens = self._step.dart(pending, context[start + 1:], self._cache, levels, k)
            else:
                vals, tokens = self._torch_step(pending, context[start + 1:], levels, k)
        t1 = time.perf_counter()
        out = []
        for b in budgets:
            config = self._tree_config if int(b) == int(self._tree_config.budget) else \
                dataclasses.replace(self._tree_config, budget=int(b))
            levels = min(rows, int(b))
            t2 = time.perf_counter()
            if self.shape == "chain":
                tree, cands = self._chain(vals[:levels], tokens[:levels], context, config)
            else:
                tree, cands = self._builder.build(vals[:levels], tokens[:levels], context, config, live)
            # the parallel logits: each level's top-k before pruning (none when the head sat the step out)
            head_rows = None if self.last_head_skipped else {"token": tokens[:levels], "logit": vals[:levels]}
            out.append(Proposal(tree=tree, candidates=cands, draft_forward_s=t1 - t0,
                                tree_build_s=time.perf_counter() - t2, head_rows=head_rows))
        return out

    def _check_shape(self) -> None:
        if self.shape == "chain" and self._tree_config.context_weight > 0:
            raise ValueError("a DART chain drafts the paper's scores: set context_weight to 0 (context candidates "
                             "are drafted in trees: shape='tree')")

    def _chain(self, vals: np.ndarray, tokens: np.ndarray, context: Sequence[int], config: PruningConfig):
        """The chain of ``len(vals)`` levels as a one-path tree, cut after its first EOS (nothing follows an EOS),
        and the chain search's candidates, those on the chain kept (``node``: their place in it)."""
        chain, picked, cands = best_chain(self._builder, vals, tokens, context,
                                          chain_pruning(config, len(vals), self.head.config.draft_vocab_size))
        eos = np.flatnonzero(np.isin(chain, self.eos_token_ids))
        if eos.size:
            chain, picked = chain[:eos[0] + 1], picked[:eos[0] + 1]
        node = np.full(len(cands.token), -1, dtype=np.int64)
        on = picked >= 0          # a level whose row's best stood in is no candidate of the search
        node[picked[on]] = np.flatnonzero(on) + 1
        cands = dataclasses.replace(cands, node=node, kept=node >= 0)
        return DraftTree.from_paths(int(context[-1]), [chain.tolist()]), cands

    def regime(self, context: Sequence[int]) -> str:
        """"copy" when this step's tree would come from the live context alone (the answer is copying), else
        "head": the tree sizer (sizing.AutoTree) keeps an acceptance model and a choice for each."""
        return "copy" if self._tree_config.context_weight > 0 and self.live.copying(context) else "head"

    def _torch_step(self, pending: torch.Tensor, next_ids: Sequence[int], levels: int, k: int):
        """The head forward in torch (the reference; GPUs), then each level's top-k as target ids (numpy)."""
        dev = self.head.fc.weight.device
        ids = torch.as_tensor(list(next_ids), dtype=torch.long, device=dev)
        logits = self.head.step(pending, ids, self._cache, levels)               # [levels, V_d] float32
        vals, idx = torch.topk(logits, k, dim=-1)                                # [levels, k]
        tokens = idx + self._d2t[idx]                                            # draft ids -> target ids
        return vals.cpu().numpy(), tokens.cpu().numpy()
