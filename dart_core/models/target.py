"""TargetModel: the verifying LLM. Loads once; each engine gets its own TargetSession (KV cache).

    target  = load_target()                    # weights, tokenizer (shared)
    session = target.new_session(capacity)     # one preallocated KV cache per engine/request
    out     = session.prefill(prompt_ids)      # logits of the last prompt position
    out     = session.verify(tree)             # logits + aux features of every tree node
    session.commit(accepted_nodes)             # keep the accepted path's K/V, contiguous

Aux features (for EAGLE-3 and DART heads) are the hidden states *entering* decoder
layers ``2, L//2, L-3`` (HF ``output_hidden_states`` indices), concatenated -> [q, 3H].
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..tree import DraftTree
from .kv_cache import CacheFullError, PreallocatedCache

logger = logging.getLogger(__name__)


@dataclass
class ForwardOutput:
    logits: torch.Tensor        # [q, V] float32: next-token logits of each input position
    aux: torch.Tensor | None    # [q, 3H] model dtype: aux features, when requested


class TargetModel:
    """A Hugging Face causal LM plus its tokenizer, used only through sessions."""

    def __init__(self, model, tokenizer, name: str, template_name: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.template_name = template_name
        cfg = model.config
        self.config = cfg
        self.num_layers = int(cfg.num_hidden_layers)
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_size = int(cfg.vocab_size)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        L = self.num_layers
        self.aux_layer_ids = (2, L // 2, L - 3) if L >= 4 else (0, L // 2, L - 1)
        self.eos_token_ids = _eos_ids(model, tokenizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights read per forward (tied embeddings counted once)."""
        seen, total = set(), 0
        for p in self.model.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                total += p.numel() * p.element_size()
        return total

    def new_session(self, capacity: int) -> "TargetSession":
        """A fresh KV cache for ``capacity`` positions (prompt + answer + one tree)."""
        if capacity <= 0:
            raise ValueError(f"cache capacity must be positive, got {capacity}")
        cache = PreallocatedCache(self.num_layers, capacity, self.kv_heads, self.head_dim, self.dtype, self.device)
        return TargetSession(self, cache)

    @torch.inference_mode()
    def forward(self, cache: PreallocatedCache, input_ids: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, want_aux: bool, last_only: bool = False) -> ForwardOutput:
        """One target forward over ``q`` new positions written after the cache's current length.

        input_ids, position_ids: [q] int64; attention_mask: [1, 1, q, length + q] additive, or None for causal.
        """
        out = self.model(
            input_ids=input_ids.view(1, -1).to(self.device),
            position_ids=position_ids.view(1, -1).to(self.device),
            attention_mask=attention_mask,
            cache=cache,
            use_cache=True,
            output_hidden_states=want_aux,
            logits_to_keep=1 if last_only else 0,
        )
        aux = None
        if want_aux:
            hs = out.hidden_states
            aux = torch.cat([hs[i][0] for i in self.aux_layer_ids], dim=-1)
            if last_only:
                aux = aux[-1:]
        return ForwardOutput(logits=out.logits[0].float(), aux=aux)


class TargetSession:
    """One engine's view of the target: its own KV cache and committed length."""

    def __init__(self, target: TargetModel, cache: PreallocatedCache):
        self.target = target
        self.cache = cache
        self._verified_prefix: int | None = None  # set by verify(), consumed by commit()

    @property
    def length(self) -> int:
        """Positions committed to the cache (the prefix every new node attends to)."""
        return self.cache.length

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def reset(self) -> None:
        self.truncate(0)

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (also an uncommitted verify); the slots are reused."""
        if not 0 <= length <= self.cache.length:
            raise ValueError(f"cannot truncate a cache of {self.cache.length} positions to {length}")
        self.cache.truncate(length)
        self._verified_prefix = None

    def prefill(self, prompt_ids, want_aux: bool = False) -> ForwardOutput:
        """Run the prompt; returns the last position's next-token logits ([1, V]) and, when ``want_aux``,
        the aux features of all T prompt positions ([T, 3H])."""
        ids = torch.as_tensor(prompt_ids, dtype=torch.long).view(-1)
        if ids.numel() == 0:
            raise ValueError("prompt is empty: give at least one token")
        start = self.length
        if start + ids.numel() > self.capacity:
            raise CacheFullError(f"prompt of {ids.numel()} tokens does not fit a cache of {self.capacity}")
        pos = torch.arange(start, start + ids.numel())
        # Only the last position's logits are needed; aux features are needed for every position.
        out = self.target.forward(self.cache, ids, pos, None, want_aux=want_aux, last_only=not want_aux)
        return ForwardOutput(logits=out.logits[-1:], aux=out.aux)

    def verify(self, tree: DraftTree, want_aux: bool = False) -> ForwardOutput:
        """All tree nodes in one forward: node i attends to the prefix, its ancestors and itself,
        at position ``length + depth(i)``. Returns logits [N, V] (and aux [N, 3H])."""
        n, prefix = len(tree), self.length
        if prefix + n > self.capacity:
            raise CacheFullError(f"verifying {n} nodes after {prefix} positions would overflow the "
                                 f"cache of {self.capacity}")
        device, dtype = self.target.device, self.target.dtype
        ids = torch.from_numpy(tree.tokens)
        pos = torch.from_numpy(tree.depths) + prefix
        mask = None
        if n > 1:
            allowed = torch.ones(n, prefix + n, dtype=torch.bool)
            allowed[:, prefix:] = torch.from_numpy(tree.ancestor_mask())
            mask = torch.zeros(n, prefix + n, dtype=dtype)
            mask.masked_fill_(~allowed, torch.finfo(dtype).min)
            mask = mask.view(1, 1, n, prefix + n).to(device)
        out = self.target.forward(self.cache, ids, pos, mask, want_aux=want_aux)
        self._verified_prefix = prefix
        return out

    def commit(self, accepted_nodes) -> None:
        """After ``verify``: keep the accepted nodes' K/V (root first) right after the prefix."""
        if self._verified_prefix is None:
            raise RuntimeError("commit() needs a verify() first: it keeps nodes of the last verified tree")
        self.cache.commit(self._verified_prefix, accepted_nodes)
        self._verified_prefix = None


def _eos_ids(model, tokenizer) -> tuple[int, ...]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))
