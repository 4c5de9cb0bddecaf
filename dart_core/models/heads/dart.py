"""The DART draft head in the published fvliang/DART format (docs/ARCHITECTURE.md section 4).

One Llama-style decoder layer that reads the target's aux features and predicts the next
``D + 1`` tokens in one forward: the last real position gives level 0 (the token after the
tree root) and ``D`` appended mask slots give levels 1..D.

Checkpoint (``config.json`` + ``model.safetensors``), keys exactly as published::

    fc.weight                                  [H, 3*H_t]   aux features -> hidden
    midlayer.mask_rep                          [2H]         the mask slot's input
    midlayer.self_attn.{q,k,v}_proj.weight     [heads*hd, 2H]
    midlayer.self_attn.o_proj.weight           [H, heads*hd]
    midlayer.mlp.{gate,up}_proj.weight         [I, H];  midlayer.mlp.down_proj.weight [H, I]
    midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight   [H]
    norm.weight                                [H]
    lm_head.weight                             [V_d, H]
    d2t                                        [V_d] int64  target_id = draft_id + d2t[draft_id]
    t2d                                        [V]   bool   target id is in the draft vocabulary

``embed_tokens`` is the target's (frozen, shared, never copied). Forward, as the original::

    h = fc(aux)                                                  # [n, H]   (the residual)
    x = cat[input_layernorm(embed(next tokens)), hidden_norm(h)] # [n, 2H]  token i+1 with feature i
    x = cat[x, D x mask_rep];  residual = cat[h, D x mask_rep[:H]]
    x = residual + o_proj(causal_attention(x))                   # masks see the prefix and earlier masks
    x = x[-(D+1):];  x = x + mlp(post_attention_layernorm(x))
    logits = lm_head(norm(norm(x)))                              # norm twice: forward + compute_logits

Mask slot j after a prefix ending at position i has position i + j. At inference the head
keeps its own tiny KV cache (:class:`~.cache.HeadCache`): each step runs the newly accepted
positions plus D mask slots, then drops the mask slots from the cache.

Loading is strict (:func:`load_dart_head`): every missing, unexpected or misshaped key is
an error naming it; the allow-list is ``embed_tokens.weight`` (ignored: the target's is
used), ``*rotary_emb.inv_freq`` (recomputed) and, only when the draft vocabulary is the full
vocabulary, absent ``d2t``/``t2d``. A head records the target it was trained for
(``config.json: dart_target``); :func:`~.files.check_head_matches_target` refuses another target.

The layers are shared with EAGLE-3 (:mod:`.layers`), as are the KV cache (:mod:`.cache`) and the
file handling, errors and target identity (:mod:`.files`).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from .cache import HeadCache
from .config import HEAD_KINDS, HeadConfig
from .files import (WEIGHTS_NAME, DartHeadError, HeadTargetMismatch, check_head_matches_target, fill_head,
                    match_state_dict, read_config, read_state, resolve_head_files, save_head)
from .layers import (AttendFn, DraftHeadBase, draft_ids_for, flex_attend, head_shapes, init_head_from_target,
                     sdpa_attend)

logger = logging.getLogger(__name__)

ARCHITECTURE = HEAD_KINDS["dart"].architecture

__all__ = ["ARCHITECTURE", "BlockLayout", "DartHead", "DartHeadError", "HeadTargetMismatch",
           "check_state_dict", "expected_shapes", "load_dart_head", "new_head_for_target", "save_dart_head"]

# ---------------------------------------------------------------------------------------------- the head
class DartHead(DraftHeadBase):
    """The DART draft head. Call :meth:`attach_embedding` with the target's embedding before use.
    Initialised as the original (Linear ~ N(0, initializer_range), norms 1, mask_rep ~ N(0, 1))."""
    kind = "DART"
    error = DartHeadError

    def __init__(self, config: HeadConfig):
        super().__init__(config, mask_rep=True)

    # ------------------------------------------------------------------ pieces of the forward
    def embed_inputs(self, aux: torch.Tensor, next_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """aux [n, 3H_t], next_ids [n] (token i+1 for feature i) -> x [n, 2H], residual h = fc(aux) [n, H]."""
        if self.embedding is None:
            raise RuntimeError("DartHead has no token embedding: call attach_embedding(target embedding) first")
        h = self.fc(aux)
        e = F.embedding(next_ids.to(self.embedding.device), self.embedding).to(h.dtype)
        x = torch.cat([self.midlayer.input_layernorm(e), self.midlayer.hidden_norm(h)], dim=-1)
        return x, h

    def mask_inputs(self, m: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """m mask slots -> x [m, 2H] (mask_rep), residual [m, H] (mask_rep[:H])."""
        rep = self.midlayer.mask_rep.to(like.dtype)
        return rep.expand(m, -1), rep[: self.config.hidden_size].expand(m, -1)

    def layer(self, x: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
              attend: AttendFn, keep: torch.Tensor | slice | None = None,
              qkv_hook: Callable | None = None) -> torch.Tensor:
        """The decoder layer over N rows; returns hidden [N or |keep|, H] (before the final norms).

        keep selects the rows that go through o_proj / MLP (the others are only keys);
        qkv_hook(q, k, v) -> (k, v) lets a cache add earlier keys/values.
        """
        attn = self.midlayer.self_attn
        q, k, v = attn.qkv(x, positions)
        if qkv_hook is not None:
            k, v = qkv_hook(q, k, v)
        out = attend(q, k, v)                                   # [heads, N, hd]
        out = out.transpose(0, 1).reshape(x.shape[0], -1)       # [N, heads*hd]
        if keep is not None:
            out, residual = out[keep], residual[keep]
        hidden = residual + attn.o_proj(out)
        return hidden + self.midlayer.mlp(self.midlayer.post_attention_layernorm(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """lm_head(norm(norm(hidden))): the original normalises in forward and again in compute_logits."""
        return self.lm_head(self.norm(self.norm(hidden)))

    # ------------------------------------------------------------------ inference
    def new_cache(self, capacity: int = 512) -> "HeadCache":
        p = self.fc.weight
        return HeadCache(self.config, capacity, p.dtype, p.device)

    @torch.inference_mode()
    def step(self, aux: torch.Tensor, next_ids: torch.Tensor, cache: "HeadCache",
             levels: int | None = None) -> torch.Tensor:
        """One drafting forward: n new real positions + D mask slots -> logits [D+1, V_d] (float32).

        aux [n, 3H_t] are the target features of the newly committed positions, next_ids [n]
        the token that follows each (the last one is the tree root). The cache keeps the real
        positions and drops this step's mask slots. ``levels`` (1..D+1) drafts only the first
        levels: attention is causal, so row l does not depend on later mask slots and the rows
        it returns equal the first ``levels`` rows of a full step.
        """
        n, D = int(next_ids.shape[0]), self.config.draft_length
        if levels is not None:
            if not 1 <= levels <= D + 1:
                raise ValueError(f"levels must lie in [1, {D + 1}], got {levels}")
            D = levels - 1
        if n < 1 or aux.shape[0] != n:
            raise ValueError(f"step() needs n >= 1 features with one next token each, got aux {tuple(aux.shape)} "
                             f"and next_ids {tuple(next_ids.shape)}")
        dtype = self.fc.weight.dtype
        x_real, r_real = self.embed_inputs(aux.to(self.fc.weight.device, dtype), next_ids)
        x_mask, r_mask = self.mask_inputs(D, x_real)
        x = torch.cat([x_real, x_mask], dim=0)
        residual = torch.cat([r_real, r_mask], dim=0)
        start = cache.length
        total = start + n + D
        positions = torch.arange(start, total, device=x.device)
        cache.reserve(total)

        def with_cache(q, k, v):
            cache.k[:, start:total] = k
            cache.v[:, start:total] = v
            return cache.k[:, :total], cache.v[:, :total]

        qi = torch.arange(start, total, device=x.device)[:, None]
        mask = torch.arange(total, device=x.device)[None, :] <= qi   # causal over cache + new rows
        hidden = self.layer(x, residual, positions, sdpa_attend(mask), keep=slice(n - 1, None),
                            qkv_hook=with_cache)
        cache.length = start + n  # mask slots are dropped: next step overwrites them
        return self.logits(hidden).float()

    # ------------------------------------------------------------------ training
    def forward_blocks(self, aux: torch.Tensor, next_ids: torch.Tensor, prefix_ends: torch.Tensor,
                       attention: str = "sdpa") -> torch.Tensor:
        """Prefix-shared masked forward for training: logits [S, D+1, V_d].

        aux [n, 3H_t], next_ids [n] are the real positions 0..n-1 of one sequence; prefix_ends [S]
        (sorted or not, distinct) are the real positions i whose D mask slots (positions i+1..i+D)
        are appended. Row 0 of block s is real position prefix_ends[s]; rows 1..D its mask slots.
        Exactly what :meth:`step` computes for the prefix ending at i (test_dart_training checks).
        attention: "sdpa" (dense boolean block mask; CPU) or "flex" (torch flex_attention block mask).
        """
        D = self.config.draft_length
        n, S = int(next_ids.shape[0]), int(prefix_ends.shape[0])
        layout = BlockLayout.build(n, prefix_ends.to(aux.device), D)
        x_real, r_real = self.embed_inputs(aux, next_ids)
        x_mask, r_mask = self.mask_inputs(S * D, x_real)
        x = torch.cat([x_real, x_mask], dim=0)
        residual = torch.cat([r_real, r_mask], dim=0)
        if attention == "sdpa":
            attend = sdpa_attend(layout.dense_mask())
        elif attention == "flex":
            attend = flex_attend(layout)
        else:
            raise ValueError(f"attention must be 'sdpa' or 'flex', got {attention!r}")
        rows = layout.output_rows()                                  # [S, D+1]
        hidden = self.layer(x, residual, layout.positions, attend, keep=rows.reshape(-1))
        return self.logits(hidden).view(S, D + 1, -1)


@dataclass
class BlockLayout:
    """Rows of a prefix-shared training forward: n real positions, then S blocks of D mask slots.

    For row r: ``anchor[r]`` = last real position it may see (r itself for a real row, the
    prefix end for a mask slot, -1 for padding); ``block[r]`` = -1 (real), the block index
    (mask slot), or -2 (padding); ``positions[r]`` its RoPE position. The rule
    (:meth:`allowed`): a key k < n (real) is visible when k <= anchor[q]; a key k >= n (mask
    or padding) is visible when it is in q's block and k <= q. So real rows are causal,
    mask slots see their prefix and earlier slots of their own block, never another block.
    """
    n: int
    D: int
    prefix_ends: torch.Tensor   # [S]
    anchor: torch.Tensor        # [N]
    block: torch.Tensor         # [N]
    positions: torch.Tensor     # [N]

    @classmethod
    def build(cls, n: int, prefix_ends: torch.Tensor, D: int, pad_to: int = 1) -> "BlockLayout":
        dev = prefix_ends.device
        pe = prefix_ends.to(torch.int64)
        if pe.numel() and (int(pe.min()) < 0 or int(pe.max()) >= n):
            raise ValueError(f"prefix ends must lie in [0, {n}), got {int(pe.min())}..{int(pe.max())}")
        S = int(pe.numel())
        j = torch.arange(1, D + 1, device=dev)
        real = torch.arange(n, device=dev)
        anchor = torch.cat([real, pe.repeat_interleave(D)])
        block = torch.cat([torch.full((n,), -1, device=dev, dtype=torch.int64),
                           torch.arange(S, device=dev).repeat_interleave(D)])
        positions = torch.cat([real, (pe[:, None] + j[None, :]).reshape(-1)])
        N = n + S * D
        padded = -(-N // pad_to) * pad_to
        if padded > N:
            extra = padded - N
            anchor = torch.cat([anchor, torch.full((extra,), -1, device=dev, dtype=torch.int64)])
            block = torch.cat([block, torch.full((extra,), -2, device=dev, dtype=torch.int64)])
            positions = torch.cat([positions, torch.zeros(extra, device=dev, dtype=torch.int64)])
        return cls(n=n, D=D, prefix_ends=pe, anchor=anchor, block=block, positions=positions)

    @property
    def size(self) -> int:
        return int(self.anchor.numel())

    def allowed(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The mask rule on index tensors (broadcasting; also used as flex_attention's mask_mod)."""
        real_key = k < self.n
        return torch.where(real_key, k <= self.anchor[q], (self.block[q] == self.block[k]) & (k <= q))

    def dense_mask(self) -> torch.Tensor:
        """[N, N] bool: True where row q may attend to key k."""
        idx = torch.arange(self.size, device=self.anchor.device)
        return self.allowed(idx[:, None], idx[None, :])

    def output_rows(self) -> torch.Tensor:
        """[S, D+1] row indices: the prefix's last real row, then its D mask slots."""
        S = int(self.prefix_ends.numel())
        masks = self.n + torch.arange(S * self.D, device=self.anchor.device).view(S, self.D)
        return torch.cat([self.prefix_ends[:, None], masks], dim=1)



# ---------------------------------------------------------------------------------------------- load / save
def expected_shapes(c: HeadConfig) -> dict[str, tuple[int, ...]]:
    return head_shapes(c, mask_rep=True)


def check_state_dict(state: dict[str, torch.Tensor], config: HeadConfig, source: str) -> dict[str, torch.Tensor]:
    """Strictly match a checkpoint to the config; returns the tensors to load (allow-listed keys removed)."""
    return match_state_dict(state, expected_shapes(config), config, source, what="a DART head checkpoint")



def load_dart_head(path_or_id: str | os.PathLike, target=None, *, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None, check_fingerprint: bool = True) -> DartHead:
    """Load a head (local directory or Hub id) strictly; with ``target`` (a TargetModel) also check it
    was made for that target, attach its embedding and move to its device and dtype."""
    cfg_path, weights_path = resolve_head_files(path_or_id, kind="DART", weights_names=(WEIGHTS_NAME,),
                                                layout="the published fvliang/DART layout",
                                                flag="--dart-model-name-or-path", error=DartHeadError)
    config = HeadConfig.from_dict(read_config(cfg_path, DartHeadError), "dart", str(cfg_path))
    tensors = check_state_dict(read_state(weights_path, DartHeadError), config, str(weights_path))
    if target is not None:
        check_head_matches_target(config, target, source=f"the DART head {path_or_id}",
                                  check_fingerprint=check_fingerprint)
    head = fill_head(DartHead(config), tensors, path_or_id, target, dtype=dtype, device=device)
    head.files_dir = Path(cfg_path).parent   # where its eval.json (held-out hit rates) would lie
    return head


def save_dart_head(head: DartHead, out_dir: str | os.PathLike, dtype: torch.dtype | None = torch.bfloat16) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (published key layout; float weights in ``dtype``)."""
    return save_head(head, out_dir, dtype)


def new_head_for_target(target, draft_ids: torch.Tensor | None = None, draft_length: int = 8,
                        seed: int = 0, init_lm_head_from_target: bool = False,
                        init_layer_from_target: bool = False) -> DartHead:
    """A freshly initialised head for ``target`` (float32, on the target's device).

    draft_ids: sorted target ids of the draft vocabulary (None = the full vocabulary).
    init_lm_head_from_target / init_layer_from_target: see :func:`~.layers.init_head_from_target`.
    """
    ids = draft_ids_for(target, draft_ids)
    head = DartHead(HeadConfig.for_target(target, "dart", draft_vocab_size=int(ids.numel()), draft_length=draft_length))
    return init_head_from_target(head, target, ids, seed, lm_head=init_lm_head_from_target,
                                 layer=init_layer_from_target)
