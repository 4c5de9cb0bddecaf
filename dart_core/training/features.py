"""What the target says about one training sequence: aux features and next-token distributions.

For ids x_0..x_{T-1} with a prompt of P tokens, one target forward (no grad) gives

    aux     [T, 3H]   hidden states entering layers target.aux_layer_ids, per position
    logits  [R, V_d]  float32 target logits restricted to the draft vocabulary, for positions
                      P..T-2 (row r predicts token x_{P+r+1}); R = T-1-P
    argmax  [R]       the target's most likely next token at those positions (target ids):
                      the full-vocabulary argmax ("full"), or the corpus token itself ("data":
                      for a self-distilled greedy corpus it is the target's argmax, and it
                      saves the full-vocabulary projection, ~20% of a small target's forward)

Softmax over ``logits`` is the target distribution renormalised over the draft vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SequenceFeatures:
    ids: torch.Tensor          # [T] int64 (on the target device)
    prompt_len: int
    aux: torch.Tensor          # [T, 3H] target dtype
    logits: torch.Tensor       # [R, V_d] float32
    argmax: torch.Tensor       # [R] int64 target ids

    @property
    def length(self) -> int:
        return int(self.ids.numel())


@torch.no_grad()
def target_states(target, x: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's HF forward over ids ``x`` [T]: aux features [T, 3H] and the final-norm hidden
    states of positions P..T-2 [R, H]. The feature cache (feature_cache.py) runs this same forward,
    so cached and on-the-fly features agree."""
    out = target.model.base_model(input_ids=x[None], output_hidden_states=True, use_cache=False)
    hs = out.hidden_states
    aux = torch.cat([hs[i][0] for i in target.aux_layer_ids], dim=-1)
    return aux, out.last_hidden_state[0, prompt_len:x.numel() - 1]


@torch.no_grad()
def compute_features(target, ids: list[int], prompt_len: int, draft_ids: torch.Tensor,
                     argmax_mode: str = "full") -> SequenceFeatures:
    """One target forward over ``ids`` (see the module docstring). ``target`` is a TargetModel."""
    if argmax_mode not in ("full", "data"):
        raise ValueError(f"argmax_mode must be 'full' or 'data', got {argmax_mode!r}")
    dev = target.device
    x = torch.as_tensor(ids, dtype=torch.long, device=dev)
    T, P = int(x.numel()), int(prompt_len)
    if not 1 <= P < T:
        raise ValueError(f"need 1 <= prompt_len < len(ids), got {P} and {T}")
    aux, last = target_states(target, x, P)
    w = target.model.get_output_embeddings().weight                              # [V, H]
    draft_ids = draft_ids.to(dev)
    if argmax_mode == "full":
        full = (last @ w.T).float()                                              # [R, V]
        argmax = full.argmax(-1)
        logits = full.index_select(1, draft_ids)
    else:
        logits = (last @ w.index_select(0, draft_ids).T).float()                 # [R, V_d]
        argmax = x[P + 1:T]
    return SequenceFeatures(ids=x, prompt_len=P, aux=aux, logits=logits, argmax=argmax)
