"""The EAGLE-3 draft head in the published EAGLE / SpecForge / AngelSlim format (docs/ARCHITECTURE.md section 7).

One Llama-style decoder layer run autoregressively: each step reads a hidden state ``h`` and a
token, and returns the next hidden state ``g`` (before the final norm) and, through
``lm_head(norm(g))``, logits over the draft vocabulary. The first step of a speculative round
uses the target's aux features (``h = fc(aux)``); every deeper step feeds back the head's own
``g``.

Checkpoint (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``), keys as published::

    fc.weight                                  [H, 3*H_t]   aux features -> hidden
    midlayer.self_attn.{q,k,v}_proj.weight     [heads*hd, 2H]  (hd = q_proj rows / heads)
    midlayer.self_attn.o_proj.weight           [H, heads*hd]
    midlayer.mlp.{gate,up}_proj.weight         [I, H];  midlayer.mlp.down_proj.weight [H, I]
    midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight   [H]
    norm.weight                                [H]
    lm_head.weight                             [V_d, H]
    d2t                                        [V_d] int64  target_id = draft_id + d2t[draft_id]
    t2d                                        [V]   bool
    embed_tokens.weight                        [V, H]  optional; ignored (the target's embedding is used)

One step over n rows (token ``ids[i]`` paired with hidden ``h[i]``)::

    x = cat[input_layernorm(embed(ids)), hidden_norm(h)]          # [n, 2H]
    g = h + o_proj(attention(x))                                   # residual = h (pre-norm)
    g = g + mlp(post_attention_layernorm(g))                       # [n, H]: fed back as the next h
    logits = lm_head(norm(g))                                      # [n, V_d]

Loading is strict (:func:`load_eagle3_head`), with the same allow-list as the DART head; errors
are :class:`Eagle3HeadError` (a :class:`~.files.HeadError`, as DART's ``DartHeadError``).
Heads trained here record their target in ``config.json: eagle3_target`` and are refused
for another target (an :class:`~.files.Eagle3HeadTargetMismatch`, both a
:class:`~.files.HeadTargetMismatch` and an :class:`Eagle3HeadError`). The layers, KV cache and
file handling are shared with DART (:mod:`.layers`, :mod:`.cache`, :mod:`.files`).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F

from .cache import HeadCache
from .config import HEAD_KINDS, HeadConfig
from .files import (CONFIG_NAME, Eagle3HeadError, check_head_matches_target, fill_head, match_state_dict,
                    read_config, read_state, resolve_head_files, save_head)
from .layers import DraftHeadBase, draft_ids_for, head_shapes, init_head_from_target, sdpa_attend

WEIGHTS_NAMES = ("model.safetensors", "pytorch_model.bin")   # preference order
ARCHITECTURE = HEAD_KINDS["eagle3"].architecture
#: where the bundled target's default EAGLE-3 head lives (assets/eagle3/, with its model card)
BUNDLED_EAGLE3_HEAD_NAME = "smollm2-135m-instruct"


def expected_shapes(c: HeadConfig) -> dict[str, tuple[int, ...]]:
    return head_shapes(c, mask_rep=False)


# ---------------------------------------------------------------------------------------------- modules
class Eagle3Head(DraftHeadBase):
    """The EAGLE-3 draft head. Call :meth:`attach_embedding` with the target's embedding before use.
    Initialised with Linear ~ N(0, initializer_range), norms 1 (:meth:`DraftHeadBase.reset_parameters`)."""
    kind = "EAGLE-3"
    error = Eagle3HeadError

    def __init__(self, config: HeadConfig):
        super().__init__(config, mask_rep=False)   # DART's layer without mask_rep

    # ------------------------------------------------------------------ forward pieces
    def new_cache(self, capacity: int = 512) -> HeadCache:
        p = self.fc.weight
        return HeadCache(self.config, capacity, p.dtype, p.device)

    def layer(self, h: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor | None,
              cache: HeadCache | None = None, write_at: int = 0) -> torch.Tensor:
        """The decoder layer over n rows -> g [n, H] (pre-norm, fed back as the next h).

        h [n, H] hidden (fc(aux) or a fed-back g), ids [n] target token ids, positions [n] RoPE positions.
        Without a cache: rows attend to each other under ``allowed`` [n, n] bool (None = causal).
        With a cache: this call's K/V are written to slots [write_at, write_at + n) (reserved by the
        caller) and the rows attend to slots [0, write_at + n) under ``allowed`` [n, write_at + n].
        """
        if self.embedding is None:
            raise RuntimeError("Eagle3Head has no token embedding: call attach_embedding(target embedding) first")
        mid = self.midlayer
        n = h.shape[0]
        e = F.embedding(ids.to(self.embedding.device), self.embedding).to(h.device, h.dtype)
        x = torch.cat([mid.input_layernorm(e), mid.hidden_norm(h)], dim=-1)      # [n, 2H]
        q, k, v = mid.self_attn.qkv(x, positions)                                 # [heads|kv, n, hd]
        if cache is not None:
            end = write_at + n
            cache.k[:, write_at:end] = k
            cache.v[:, write_at:end] = v
            k, v = cache.k[:, :end], cache.v[:, :end]                             # no concatenation copy
        if allowed is None:
            allowed = torch.ones(n, k.shape[1], dtype=torch.bool, device=h.device).tril(k.shape[1] - n)
        out = sdpa_attend(allowed)(q, k, v)                                       # [heads, n, hd]
        g = h + mid.self_attn.o_proj(out.transpose(0, 1).reshape(n, -1))
        return g + mid.mlp(mid.post_attention_layernorm(g))

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        """lm_head(norm(g)) -> [n, V_d] float32."""
        return self.lm_head(self.norm(g)).float()

    # ------------------------------------------------------------------ inference with the head's cache
    @torch.inference_mode()
    def step_real(self, aux: torch.Tensor, next_ids: torch.Tensor, cache: HeadCache) -> torch.Tensor:
        """n newly committed positions: target features aux [n, 3H_t], next_ids [n] (token i+1 for feature i).

        They persist in the cache (positions cache.length ...). Returns g [n, H].
        """
        n = int(next_ids.shape[0])
        if n < 1 or aux.shape[0] != n:
            raise ValueError(f"step_real() needs n >= 1 features with one next token each, got aux "
                             f"{tuple(aux.shape)} and next_ids {tuple(next_ids.shape)}")
        w = self.fc.weight
        h = self.fc(aux.to(w.device, w.dtype))                                    # fc only on target features
        start = cache.length
        pos = torch.arange(start, start + n, device=w.device)
        allowed = torch.arange(start + n, device=w.device)[None, :] <= pos[:, None]   # causal
        cache.reserve(start + n)
        g = self.layer(h, next_ids.to(w.device), pos, allowed, cache, write_at=start)
        cache.length = start + n
        return g

    @torch.inference_mode()
    def step_tree(self, h: torch.Tensor, ids: torch.Tensor, position: int, cache: HeadCache,
                  tree_start: int, tree_allowed: torch.Tensor) -> torch.Tensor:
        """One drafting depth: n frontier nodes, all at RoPE ``position``.

        h [n, H] the parents' g; ids [n]; their K/V go to slots tree_start.. (after the real
        positions and earlier tree nodes, which ``cache.length`` does not count, so they are
        discarded with the round). tree_allowed [n, tree_start - cache.length + n] bool: which
        of this round's tree slots (earlier depths + this one) each node sees (its ancestors and
        itself); every real position is visible. Returns g [n, H].
        """
        n = int(ids.shape[0])
        real = cache.length
        if tree_start < real or tuple(tree_allowed.shape) != (n, tree_start - real + n):
            raise ValueError(f"step_tree(): tree_allowed must be [{n}, {tree_start - real + n}] for tree slots "
                             f"{real}..{tree_start + n}, got {tuple(tree_allowed.shape)}")
        cache.reserve(tree_start + n)
        dev = h.device
        allowed = torch.cat([torch.ones(n, real, dtype=torch.bool, device=dev), tree_allowed.to(dev)], dim=1)
        pos = torch.full((n,), int(position), dtype=torch.int64, device=dev)
        return self.layer(h, ids, pos, allowed, cache, write_at=tree_start)


# ---------------------------------------------------------------------------------------------- load / save
def _head_dim_from_weights(state: dict[str, torch.Tensor], raw: dict, source: str) -> int | None:
    """head_dim = q_proj rows / num_attention_heads (published heads may differ from hidden / heads)."""
    q = state.get("midlayer.self_attn.q_proj.weight")
    heads = raw.get("num_attention_heads")
    if q is None or not isinstance(heads, int) or heads <= 0:
        return None  # the strict check reports the missing key / the config field
    if q.shape[0] % heads:
        raise Eagle3HeadError(f"{source}: midlayer.self_attn.q_proj.weight has {q.shape[0]} rows, not a multiple "
                              f"of num_attention_heads ({heads})")
    return int(q.shape[0] // heads)


def load_eagle3_head(path_or_id: str | os.PathLike, target=None, *, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None, check_fingerprint: bool = True) -> Eagle3Head:
    """Load a head (local directory or Hub id) strictly; with ``target`` (a TargetModel) also check it
    was made for that target, attach its embedding and move to its device and dtype."""
    cfg_path, weights_path = resolve_head_files(path_or_id, kind="EAGLE-3", weights_names=WEIGHTS_NAMES,
                                                layout="the published EAGLE-3 layout",
                                                flag="--eagle3-model-name-or-path", error=Eagle3HeadError)
    raw = read_config(cfg_path, Eagle3HeadError)
    state = read_state(weights_path, Eagle3HeadError)
    config = HeadConfig.from_dict(raw, "eagle3", str(cfg_path), head_dim=_head_dim_from_weights(state, raw,
                                                                                           str(weights_path)))
    tensors = match_state_dict(state, expected_shapes(config), config, str(weights_path),
                               what="an EAGLE-3 head checkpoint", error=Eagle3HeadError)
    if target is not None:
        check_head_matches_target(config, target, source=f"the EAGLE-3 head {path_or_id}",
                                  check_fingerprint=check_fingerprint, train_command="eagle3")
    head = fill_head(Eagle3Head(config), tensors, path_or_id, target, dtype=dtype, device=device)
    head.files_dir = Path(cfg_path).parent   # where its eval.json (held-out hit rates) would lie
    return head


def save_eagle3_head(head: Eagle3Head, out_dir: str | os.PathLike,
                     dtype: torch.dtype | None = torch.bfloat16) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (published key layout; float weights in ``dtype``)."""
    return save_head(head, out_dir, dtype)


def new_eagle3_head_for_target(target, draft_ids: torch.Tensor | None = None, seed: int = 0,
                               init_lm_head_from_target: bool = False,
                               init_layer_from_target: bool = False) -> Eagle3Head:
    """A freshly initialised head for ``target`` (float32, on the target's device, embedding attached).

    draft_ids: sorted target ids of the draft vocabulary (None = the full vocabulary).
    init_lm_head_from_target / init_layer_from_target: see :func:`~.layers.init_head_from_target`.
    """
    ids = draft_ids_for(target, draft_ids)
    head = Eagle3Head(HeadConfig.for_target(target, "eagle3", draft_vocab_size=int(ids.numel())))
    return init_head_from_target(head, target, ids, seed, lm_head=init_lm_head_from_target,
                                 layer=init_layer_from_target)


# ---------------------------------------------------------------------------------------------- defaults
def bundled_eagle3_head_dir() -> Path:
    from ..assets import asset_path
    return asset_path("eagle3", BUNDLED_EAGLE3_HEAD_NAME)


def load_eagle3_for_target(target, base_model_name_or_path: str | None, eagle3_model_name_or_path: str | None,
                           *, check_fingerprint: bool = True) -> Eagle3Head:
    """The EAGLE-3 head for an already loaded ``target``; None = the bundled default, which exists
    only for the bundled target. Shared by the benchmark and the app."""
    from ..bundled import is_bundled_target

    if eagle3_model_name_or_path is None:
        how = ("pass --eagle3-model-name-or-path DIR|HUB_ID (a published EAGLE-3 head for this target, e.g. "
               "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B for meta-llama/Llama-3.1-8B-Instruct), or train one with "
               "`python -m dart_core.train eagle3 --target {t} --data FILE --out DIR`")
        if not is_bundled_target(base_model_name_or_path):
            raise Eagle3HeadError(f"no default EAGLE-3 head for {base_model_name_or_path!r}: "
                                  + how.format(t=base_model_name_or_path))
        head_dir = bundled_eagle3_head_dir()
        if not (head_dir / CONFIG_NAME).is_file():
            raise Eagle3HeadError(f"no EAGLE-3 head ships for the bundled target in this checkout (looked in "
                                  f"{head_dir}): "
                                  + how.format(t="bundled")
                                  + " and copy DIR/config.json and DIR/model.safetensors there")
        eagle3_model_name_or_path = str(head_dir)
    return load_eagle3_head(eagle3_model_name_or_path, target, check_fingerprint=check_fingerprint)
