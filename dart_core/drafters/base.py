"""The Drafter protocol: the only seam between drafting and verification.

The decoding loop calls, per request::

    drafter.begin(prompt_ids, prefill_aux)       # once, after the target's prefill
    loop:
        proposal = drafter.propose(context)      # context[-1] is the tree root
        ... target verifies proposal.tree, accepts a path ...
        drafter.observe(AcceptedStep(...))        # what was accepted, with target features

The verifier never branches on the drafter's type; everything it needs is in the
Proposal (tree, scored candidates for the trace, and the drafter's own stage times).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from ..trace import ScoredCandidates
from ..tree import DraftTree


@dataclass
class Proposal:
    tree: DraftTree                              # root = context[-1]
    candidates: ScoredCandidates | None = None   # every candidate scored (kept or pruned), for the trace
    draft_forward_s: float = 0.0                 # all head forwards of this step
    tree_build_s: float = 0.0                    # top-k, pruning / reranking, tree assembly


@dataclass
class AcceptedStep:
    tokens: list[int]                 # accepted tree nodes' tokens, root first (all now in the target's cache)
    bonus_token: int                  # the target's own next token: the next tree's root
    aux: torch.Tensor | None          # [len(tokens), 3H] target aux features of those nodes (if needs_aux)


@runtime_checkable
class Drafter(Protocol):
    name: str
    needs_aux: bool       # whether begin/observe need the target's aux features
    max_tree_nodes: int   # upper bound on len(proposal.tree), root included: sizes the KV cache

    def begin(self, prompt_ids: Sequence[int], prefill_aux: torch.Tensor | None) -> None:
        """Start a request. prefill_aux: [T, 3H] features of the prompt positions (if needs_aux)."""

    def propose(self, context: Sequence[int]) -> Proposal:
        """Draft a tree whose root is ``context[-1]`` (prompt + answer so far)."""

    def observe(self, step: AcceptedStep) -> None:
        """Learn what the target accepted (update drafter caches/state)."""
