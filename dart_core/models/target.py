"""TargetModel: the verifying LLM. Loads once; each engine gets its own TargetSession (KV cache).

    target  = load_target()                    # weights, tokenizer (shared)
    session = target.new_session(capacity)     # one preallocated KV cache per engine/request
    out     = session.prefill(prompt_ids)      # logits of the last prompt position
    out     = session.verify(tree)             # logits of every tree node (on request) + aux features
    session.commit(accepted_nodes)             # keep the accepted path's K/V, contiguous

Aux features (for EAGLE-3 and DART heads) are the hidden states *entering* decoder
layers ``2, L//2, L-3`` (HF ``output_hidden_states`` indices), concatenated -> [q, 3H].
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..config import dtype_name
from ..engine.tree import DraftTree
from .fast_forward import FastForward
from .kv_cache import CacheFullError, PreallocatedCache

logger = logging.getLogger(__name__)


#: LM head rows a verify computes at once: the root and the likeliest nodes. On a CPU the LM head reads its
#: weights (V x H, a fifth of a small model's) once per call whatever the row count, so its first few rows cost
#: about the same as one: a walk that goes past them pays another call. 5, not 4: DART + context's usual tree
#: has 5 nodes (budget 4), and with 4 first rows 22% of its steps on context_dev paid a second pass over the
#: head for the fifth; 5 rows read the weights as fast as 4 (docs/benchmarks.md, issue 38, tenth pass).
LM_HEAD_FIRST_ROWS = 5


@dataclass
class ForwardOutput:
    logits: torch.Tensor | "NodeLogits"   # [q, V] float32: next-token logits of each input position
    aux: torch.Tensor | None              # [q, 3H] model dtype: aux features, when requested


class NodeLogits:
    """The target's next-token logits at each node of a verified tree, each row computed when first asked for.

    An acceptance walk reads the rows of the nodes it visits (the root, then each accepted node), so on the lean
    CPU path the LM head runs for those rows only, not for every node; ``rows`` computes the missing rows of a
    request in one call and keeps them until ``release``. The hidden states stay, so any row can be asked for
    later (the page's tree view shows the target's own token at rejected nodes): a row computed late equals the
    same row computed with the others, bit for bit. On the HF path the forward already computed every row.
    """

    def __init__(self, n: int, *, logits: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                 head: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 first: tuple[Sequence[int], torch.Tensor] | None = None):
        """``first``: (nodes, their logits [len, V]) the forward's own call computed already (one LM head call)."""
        if (logits is None) == (hidden is None or head is None):
            raise ValueError("NodeLogits needs either all logits or the hidden states and an LM head")
        self._n = n
        self._full = logits
        self._hidden = hidden
        self._head = head
        self._rows: dict[int, torch.Tensor] = {}
        self.rows_computed = 0      # LM head rows run so far (tests and benchmarks read these)
        self.head_calls = 0
        if first is not None and len(first[0]):
            for i, row in zip(first[0], first[1].unbind(0)):
                self._rows[int(i)] = row
            self.rows_computed += len(first[0])
            self.head_calls += 1

    def __len__(self) -> int:
        return self._n

    @property
    def nbytes(self) -> int:
        """Bytes kept for later reads once released: the hidden states (lazy), or all logits."""
        return sum(int(t.nbytes) for t in (self._full, self._hidden) if t is not None)

    @property
    def lazy(self) -> bool:
        """True when rows are computed on request (False: every row exists already)."""
        return self._full is None

    def rows(self, nodes: Sequence[int]) -> torch.Tensor:
        """Logits [len(nodes), V] float32 of these nodes, in this order (read-only: rows may be the kept ones)."""
        nodes = [int(i) for i in nodes]
        bad = [i for i in nodes if not 0 <= i < self._n]
        if bad:
            raise IndexError(f"node {bad[0]} is not in a tree of {self._n} nodes")
        if self._full is not None:
            return self._full[nodes]
        missing = sorted(set(nodes) - self._rows.keys())
        if missing:
            computed = self._head(torch.from_numpy(self._hidden.numpy()[missing]))   # numpy: no torch op
            self.rows_computed += len(missing)
            self.head_calls += 1
            for i, row in zip(missing, computed):
                self._rows[i] = row
            if missing == nodes:    # the usual step: the rows just computed, in order (no copy of V floats each)
                return computed
        if not nodes:
            return self._head(self._hidden[:0])
        if len(nodes) == 1:
            return self._rows[nodes[0]].unsqueeze(0)
        return torch.stack([self._rows[i] for i in nodes])

    def row(self, node: int) -> torch.Tensor:
        """Logits [V] of one node."""
        return self.rows([node])[0]

    def __getitem__(self, node: int) -> torch.Tensor:
        return self.row(node)

    def all(self) -> torch.Tensor:
        """Logits [N, V] of every node."""
        return self.rows(range(self._n))

    def release(self) -> None:
        """Forget the computed rows (a row is V floats); the hidden states stay, so rows can be computed again."""
        self._rows.clear()


class TargetModel:
    """A Hugging Face causal LM plus its tokenizer, used only through sessions."""

    def __init__(self, model, tokenizer, name: str, template_name: str, fast_forward: bool = True):
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
        # transformers 5.24 renamed the forward's past_key_values to cache; an older forward takes an unknown
        # ``cache=`` into **kwargs and ignores it (the cache then stays empty), so the name is read off the forward.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # The lean CPU path (models/fast_forward.py) when it applies; the HF forward otherwise.
        self.fast: FastForward | None = None
        self.fast_unavailable_reason: str | None = None
        self.set_fast_forward(fast_forward)

    def set_fast_forward(self, enabled: bool) -> None:
        """Run sessions through the lean CPU forward (when the model allows it) or the HF forward.
        Sessions made before a switch hold a cache of the old activation dtype: make new ones."""
        self.fast_unavailable_reason = FastForward.supports(self.model) if enabled else "switched off"
        if self.fast_unavailable_reason is None:
            # Built once (it binds every layer's weights); switching back reuses it.
            if getattr(self, "_fast_built", None) is None:
                self._fast_built = FastForward(self.model)
            self.fast = self._fast_built
        else:
            self.fast = None
        if enabled and self.fast is None:
            logger.info("lean CPU forward not used for %s: %s", self.name, self.fast_unavailable_reason)

    @property
    def activation_dtype(self) -> torch.dtype:
        """dtype of hidden states and the KV cache: float32 on the lean CPU path, else the weights'."""
        return torch.float32 if self.fast is not None else self.dtype

    @property
    def forward_backend(self) -> str:
        """Short description for logs and benchmark records."""
        if self.fast is None:
            return f"hf ({dtype_name(self.dtype)})"
        from ..hardware import gemm_paths
        path = gemm_paths()["gemm_path"]
        # the bf16 dot-product paths round the activations to bf16 inside bf16-weight products (float32 sums)
        rounded = self.dtype == torch.bfloat16 and path in ("avx512bf16", "amx")
        acts = "activations rounded to bf16 in the products" if rounded else "float32 activations"
        from .gemv_prefetch import chosen
        choice = chosen(path)
        prefetch = f"; {choice.describe()}" if choice is not None else ""
        how = self.fast.gemm_path
        where = how.describe() if how.path == path else f"kernel path {path}"
        from .gemm_split import chosen as chosen_split
        cut = chosen_split()
        split = f"; {cut.describe()}" if cut is not None else ""
        return f"native small-GEMM ({dtype_name(self.dtype)} weights, {acts}; {where}{prefetch}{split})"

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
        cache = PreallocatedCache(self.num_layers, capacity, self.kv_heads, self.head_dim, self.activation_dtype,
                                  self.device)
        return TargetSession(self, cache)

    @torch.inference_mode()
    def forward(self, cache: PreallocatedCache, input_ids: torch.Tensor, position_ids: torch.Tensor,
                allowed: torch.Tensor | None, want_aux: bool, last_only: bool = False,
                lazy_logits: bool = False, first_rows: Sequence[int] = ()) -> ForwardOutput:
        """One target forward over ``q`` new positions written after the cache's current length.

        input_ids, position_ids: [q] int64; allowed: bool [q, length + q], True where a new position may
        attend, or None for causal attention. ``last_only`` computes the last position's logits only
        (the LM head is a large share of a long prompt's cost); aux features cover every position.
        ``lazy_logits`` returns :class:`NodeLogits` that run the LM head on request (lean path; the HF
        forward computes every row anyway and wraps them), the rows ``first_rows`` computed already (on the lean
        path in the forward's own native call).
        """
        if cache.key_dtype != self.activation_dtype:
            raise RuntimeError(f"this session's cache holds {cache.key_dtype} but the target now runs "
                               f"{self.activation_dtype} activations: make a new session after set_fast_forward()")
        if self.fast is not None:
            rows = "last" if last_only else ("hidden" if lazy_logits else "all")
            head_rows = [int(i) for i in first_rows] if lazy_logits else []
            out, aux, first = self.fast.forward(cache, input_ids, position_ids, allowed,
                                                self.aux_layer_ids if want_aux else None, rows, head_rows)
            if lazy_logits:
                return ForwardOutput(logits=NodeLogits(len(out), hidden=out, head=self.fast.lm_head,
                                                       first=(head_rows, first) if head_rows else None), aux=aux)
            return ForwardOutput(logits=out, aux=aux)
        attention_mask = None
        if allowed is not None:
            attention_mask = torch.zeros(allowed.shape, dtype=self.dtype)
            attention_mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
            attention_mask = attention_mask.view(1, 1, *allowed.shape).to(self.device)
        out = self.model(
            input_ids=input_ids.view(1, -1).to(self.device),
            position_ids=position_ids.view(1, -1).to(self.device),
            attention_mask=attention_mask,
            **{self._cache_kwarg: cache},
            use_cache=True,
            output_hidden_states=want_aux,
            logits_to_keep=1 if last_only else 0,
        )
        aux = None
        if want_aux:
            hs = out.hidden_states
            aux = torch.cat([hs[i][0] for i in self.aux_layer_ids], dim=-1)
        logits = out.logits[0].float()
        return ForwardOutput(logits=NodeLogits(len(logits), logits=logits) if lazy_logits else logits, aux=aux)


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
        out = self.target.forward(self.cache, ids, pos, None, want_aux=want_aux, last_only=True)
        return ForwardOutput(logits=out.logits[-1:], aux=out.aux)

    def verify(self, tree: DraftTree, want_aux: bool = False) -> ForwardOutput:
        """All tree nodes in one forward: node i attends to the prefix, its ancestors and itself,
        at position ``length + depth(i)``. Returns :class:`NodeLogits` of the N nodes (the root's and the
        likeliest nodes' rows computed, ``LM_HEAD_FIRST_ROWS`` in all; the rest on request) and aux [N, 3H]."""
        n, prefix = len(tree), self.length
        if prefix + n > self.capacity:
            raise CacheFullError(f"verifying {n} nodes after {prefix} positions would overflow the "
                                 f"cache of {self.capacity}")
        ids = torch.from_numpy(tree.tokens)
        pos = torch.from_numpy(tree.depths) + prefix
        allowed = None
        if n > 1:
            allowed = torch.ones(n, prefix + n, dtype=torch.bool)
            allowed[:, prefix:] = torch.from_numpy(tree.ancestor_mask())
        out = self.target.forward(self.cache, ids, pos, allowed, want_aux=want_aux, lazy_logits=True,
                                  first_rows=tree.likeliest(LM_HEAD_FIRST_ROWS))
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
