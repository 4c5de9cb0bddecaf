"""Acceptance rules for a verified draft tree: greedy and lossless tree sampling.

Glossary (vLLM's words): *accepted* tokens are drafted nodes the target agrees with;
the *bonus* token is the target's own token after the accepted path (its argmax in
greedy mode, or a draw from the residual distribution when sampling). Every step
emits accepted + 1 tokens.

Greedy: walk from the root; at each node follow the child whose token equals the
target's argmax there (children visited in draft-rank order); stop where none does
and emit the argmax as the bonus. This is the longest root-to-leaf prefix that
matches the target.

Sampling (EAGLE's rule for deterministic drafts, q one-hot): at the current node, with
p the warped target distribution there, visit the children in draft-rank order and
accept child x with probability p(x); on rejection set p(x) = 0 and renormalise. If
a child is accepted, move to it and repeat with its distribution; otherwise draw the
bonus from what is left of p. The emitted tokens are then distributed exactly as
sampling from the target token by token.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass
class Acceptance:
    accepted_nodes: list[int]   # root first
    bonus_token: int


def warp_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature, top-k, then top-p (HF order).

    Any temperature > 0 gives a valid distribution: the logits are shifted so their maximum is 0 before the
    division, so a tiny temperature (1e-39, even a subnormal one) cannot overflow the maximum to inf (inf - inf
    made NaN). As the temperature goes to 0 the distribution tends to the one-hot argmax (greedy decoding),
    split evenly between exactly tied maxima; a temperature too small for float32 is that limit.
    """
    if not temperature > 0:
        raise ValueError(f"warp_probs needs a temperature > 0 (0 = greedy: take the argmax), got {temperature!r}")
    x = logits.float()
    x = x - x.amax(dim=-1, keepdim=True)  # <= 0; the maximum is exactly 0
    # 0 / t stays 0 for the maximum even when t rounds to 0 in float32 (0 / 0 would be NaN); the rest -> -inf
    x = torch.where(x < 0, x / temperature, x)
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        # drop tokens once the mass before them already reaches top_p (the top token always stays)
        drop_sorted = (cum - torch.softmax(sorted_x, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def accept_greedy(tree: DraftTree, target_argmax: list[int], children: list[list[int]]) -> Acceptance:
    node, path = 0, [0]
    while True:
        want = target_argmax[node]
        nxt = next((c for c in children[node] if int(tree.tokens[c]) == want), None)
        if nxt is None:
            return Acceptance(path, want)
        node = nxt
        path.append(node)


def accept_sampling(tree: DraftTree, probs: torch.Tensor, children: list[list[int]],
                    generator: torch.Generator | None) -> Acceptance:
    """probs: [N, V] warped target distribution at every node."""
    node, path = 0, [0]
    while True:
        p = probs[node].clone()
        moved = False
        for c in children[node]:
            x = int(tree.tokens[c])
            px = float(p[x])
            if px > 0.0 and float(torch.rand((), generator=generator)) < px:
                node, moved = c, True
                path.append(c)
                break
            p[x] = 0.0
            total = float(p.sum())
            if total <= 0.0:  # only reachable through rounding: fall back to the unmodified row
                p = probs[node].clone()
                break
            p /= total
        if not moved:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return Acceptance(path, bonus)
