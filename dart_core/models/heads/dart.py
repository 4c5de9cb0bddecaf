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
keeps its own tiny KV cache (:class:`DartHeadCache`): each step runs the newly accepted
positions plus D mask slots, then drops the mask slots from the cache.

Loading is strict (:func:`load_dart_head`): every missing, unexpected or misshaped key is
an error naming it; the allow-list is ``embed_tokens.weight`` (ignored: the target's is
used), ``*rotary_emb.inv_freq`` (recomputed) and, only when the draft vocabulary is the full
vocabulary, absent ``d2t``/``t2d``. A head records the target it was trained for
(``config.json: dart_target``); :func:`check_head_matches_target` refuses another target.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
ARCHITECTURE = "LlamaForCausalLMDart"
FINGERPRINT_VERSION = 1

#: keys a checkpoint may carry that we do not load (the target's embedding is used; RoPE is recomputed)
OPTIONAL_IGNORED_KEYS = ("embed_tokens.weight",)
OPTIONAL_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class DartHeadError(ValueError):
    """A DART head checkpoint is missing, malformed, or made for another target."""


class HeadTargetMismatch(DartHeadError):
    """The head was trained for another target model."""


# ---------------------------------------------------------------------------------------------- config
_LLAMA_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "vocab_size", "draft_vocab_size")


def head_config_problems(c, extra_int_fields: tuple[str, ...] = ()) -> list[str]:
    """What is wrong with a draft head's Llama-style config (DART and EAGLE-3 share these fields)."""
    problems = []
    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "vocab_size", "draft_vocab_size", *extra_int_fields, "head_dim", "target_hidden_size"):
        v = getattr(c, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            problems.append(f"{name} must be a positive integer, got {v!r}")
    if not problems:
        if c.num_attention_heads % c.num_key_value_heads:
            problems.append(f"num_attention_heads ({c.num_attention_heads}) must be a multiple of "
                            f"num_key_value_heads ({c.num_key_value_heads})")
        if c.draft_vocab_size > c.vocab_size:
            problems.append(f"draft_vocab_size ({c.draft_vocab_size}) exceeds vocab_size ({c.vocab_size})")
        if c.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE, got {c.head_dim}")
    if c.hidden_act not in ("silu", "swish"):
        problems.append(f"hidden_act {c.hidden_act!r} is not supported (only silu)")
    return problems


@dataclass
class DartHeadConfig:
    """The head's ``config.json``: Llama fields + ``draft_length``, ``draft_vocab_size``
    (+ optional ``target_hidden_size``, ``head_dim``, ``rope_theta``) + our ``dart_target``.

    target  what the head was trained for: {"name", "architecture", "model_type", "hidden_size",
            "vocab_size", "num_hidden_layers", "aux_layer_ids", "fingerprint"} (None for published
            heads, which are then checked by shape only)
    extra   every other field of a loaded config.json, written back unchanged on save
    """
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    draft_length: int = 8
    head_dim: int | None = None
    target_hidden_size: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    initializer_range: float = 0.02
    target: dict | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.target_hidden_size is None:
            self.target_hidden_size = self.hidden_size
        problems = head_config_problems(self, extra_int_fields=("draft_length",))
        if problems:
            raise DartHeadError("invalid DART head config: " + "; ".join(problems))

    @property
    def full_vocab(self) -> bool:
        return self.draft_vocab_size == self.vocab_size

    @classmethod
    def from_dict(cls, d: dict, source: str = "config.json") -> "DartHeadConfig":
        missing = [k for k in _LLAMA_FIELDS + ("draft_length",) if k not in d]
        if missing:
            raise DartHeadError(f"{source}: missing field(s) {', '.join(missing)}; a DART head config needs the "
                                f"Llama fields plus draft_length and draft_vocab_size")
        rope_scaling = d.get("rope_scaling")
        rope_params = d.get("rope_parameters") or {}
        rope_type = (rope_scaling or {}).get("rope_type", (rope_scaling or {}).get("type")) if rope_scaling else None
        if rope_type not in (None, "default"):
            raise DartHeadError(f"{source}: rope_scaling {rope_scaling!r} is not supported (plain RoPE only)")
        theta = d.get("rope_theta", rope_params.get("rope_theta", 10000.0))
        known = set(_LLAMA_FIELDS) | {"draft_length", "head_dim", "target_hidden_size", "rms_norm_eps", "rope_theta",
                                      "hidden_act", "max_position_embeddings", "initializer_range", "dart_target"}
        extra = {k: v for k, v in d.items() if k not in known}
        try:
            return cls(hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
                       num_attention_heads=d["num_attention_heads"],
                       num_key_value_heads=d.get("num_key_value_heads") or d["num_attention_heads"],
                       vocab_size=d["vocab_size"], draft_vocab_size=d["draft_vocab_size"],
                       draft_length=d["draft_length"], head_dim=d.get("head_dim"),
                       target_hidden_size=d.get("target_hidden_size"),
                       rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
                       hidden_act=d.get("hidden_act", "silu"),
                       max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                       initializer_range=float(d.get("initializer_range", 0.02)),
                       target=d.get("dart_target"), extra=extra)
        except DartHeadError as exc:
            raise DartHeadError(f"{source}: {exc}") from None

    def to_dict(self) -> dict:
        d = dict(self.extra)
        d.setdefault("architectures", [ARCHITECTURE])
        d.setdefault("model_type", "llama")
        d.update(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                 num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                 num_hidden_layers=1, head_dim=self.head_dim, vocab_size=self.vocab_size,
                 draft_vocab_size=self.draft_vocab_size, draft_length=self.draft_length,
                 target_hidden_size=self.target_hidden_size, rms_norm_eps=self.rms_norm_eps,
                 rope_theta=self.rope_theta, rope_scaling=None, hidden_act=self.hidden_act,
                 max_position_embeddings=self.max_position_embeddings, initializer_range=self.initializer_range,
                 pretraining_tp=1, tie_word_embeddings=False)
        if self.target is not None:
            d["dart_target"] = self.target
        return d

    @classmethod
    def for_target(cls, target, draft_vocab_size: int, draft_length: int = 8) -> "DartHeadConfig":
        """A head config sized for ``target`` (a TargetModel), recording the target's identity."""
        cfg = target.config
        theta = getattr(cfg, "rope_theta", None)
        if theta is None:
            theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        return cls(hidden_size=target.hidden_size, intermediate_size=int(cfg.intermediate_size),
                   num_attention_heads=int(cfg.num_attention_heads),
                   num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads),
                   head_dim=target.head_dim, vocab_size=target.vocab_size, draft_vocab_size=int(draft_vocab_size),
                   draft_length=int(draft_length), target_hidden_size=target.hidden_size,
                   rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)), rope_theta=float(theta),
                   max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 2048)),
                   target=describe_target(target))


# ---------------------------------------------------------------------------------------------- target identity
@torch.no_grad()
def target_fingerprint(model: nn.Module, samples_per_tensor: int = 4096) -> str:
    """A SHA-256 (hex) of a target's weights that takes milliseconds even for large models.

    Per parameter (sorted by name, tied weights once): its name, shape and up to
    ``samples_per_tensor`` evenly spaced values rounded to bfloat16, so a model loaded in
    float32 or bfloat16 gets the same fingerprint, while any retrained or other model differs.
    """
    h = hashlib.sha256(f"dart-target-fingerprint-v{FINGERPRINT_VERSION}".encode())
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        flat = p.detach().reshape(-1)
        n = flat.numel()
        k = min(n, samples_per_tensor)
        idx = (torch.arange(k, dtype=torch.int64, device=flat.device) * (n - 1)) // max(k - 1, 1)
        vals = flat.index_select(0, idx).float().to(torch.bfloat16).cpu().view(torch.int16).numpy().tobytes()
        h.update(f"{name}:{tuple(p.shape)}:".encode())
        h.update(vals)
    return h.hexdigest()


def describe_target(target) -> dict:
    """What a head records about its target (TargetModel) in ``config.json: dart_target``."""
    cfg = target.config
    archs = getattr(cfg, "architectures", None) or []
    return {"name": str(target.name), "architecture": archs[0] if archs else None,
            "model_type": getattr(cfg, "model_type", None), "hidden_size": int(target.hidden_size),
            "vocab_size": int(target.vocab_size), "num_hidden_layers": int(target.num_layers),
            "aux_layer_ids": list(target.aux_layer_ids), "fingerprint": target_fingerprint(target.model),
            "fingerprint_version": FINGERPRINT_VERSION}


def check_head_matches_target(config: DartHeadConfig, target, source: str = "the DART head",
                              check_fingerprint: bool = True, *, train_command: str = "dart") -> None:
    """Raise :class:`HeadTargetMismatch` when the head cannot serve ``target`` (a TargetModel).

    Also used for EAGLE-3 heads (same config fields); ``train_command`` names the trainer in the hint."""
    fix = (f"load the base model this head was made for, or train a head for this one with "
           f"`python -m dart_core.train {train_command} --target {target.name} --data ... --out DIR`")
    if config.target_hidden_size != target.hidden_size:
        raise HeadTargetMismatch(
            f"{source} reads aux features of a target with hidden size {config.target_hidden_size} "
            f"(fc.weight takes 3 x {config.target_hidden_size}), but the target {target.name} has hidden size "
            f"{target.hidden_size}; {fix}")
    if config.hidden_size != target.hidden_size:
        raise HeadTargetMismatch(
            f"{source} has hidden size {config.hidden_size} but shares the target's token embedding of size "
            f"{target.hidden_size} ({target.name}); {fix}")
    if config.vocab_size != target.vocab_size:
        raise HeadTargetMismatch(f"{source} is for a vocabulary of {config.vocab_size} tokens, but the target "
                                 f"{target.name} has {target.vocab_size}; {fix}")
    rec = config.target
    if not rec:
        return  # a published head: shapes are all we can check
    mt = getattr(target.config, "model_type", None)
    if rec.get("model_type") not in (None, mt):
        raise HeadTargetMismatch(f"{source} was trained for a {rec.get('model_type')} target ({rec.get('name')}), "
                                 f"but the target {target.name} is {mt}; {fix}")
    if rec.get("num_hidden_layers") not in (None, target.num_layers):
        raise HeadTargetMismatch(f"{source} was trained for a target with {rec.get('num_hidden_layers')} layers "
                                 f"({rec.get('name')}), but {target.name} has {target.num_layers}; {fix}")
    if check_fingerprint and rec.get("fingerprint") and rec.get("fingerprint_version", 1) == FINGERPRINT_VERSION:
        fp = target_fingerprint(target.model)
        if fp != rec["fingerprint"]:
            raise HeadTargetMismatch(
                f"{source} was trained for the target {rec.get('name')!r} (weights fingerprint "
                f"{rec['fingerprint'][:12]}...), but the loaded target {target.name!r} has other weights "
                f"(fingerprint {fp[:12]}...); {fix}")


# ---------------------------------------------------------------------------------------------- modules
class RMSNorm(nn.Module):
    """Llama RMSNorm as the original: normalise in float32, cast back, then scale."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x32.to(dtype)


class DartAttention(nn.Module):
    def __init__(self, c: DartHeadConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, head_dim] for integer positions [N] (float32 tables, cast as the original)."""
        freqs = positions.to(self.inv_freq.device, torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [N, 2H], positions [N] -> q [heads, N, hd], k, v [kv_heads, N, hd] (RoPE applied)."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim).transpose(0, 1)
        cos, sin = self.rope(positions, q.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class DartMLP(nn.Module):
    def __init__(self, c: DartHeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DartMidLayer(nn.Module):
    def __init__(self, c: DartHeadConfig):
        super().__init__()
        self.mask_rep = nn.Parameter(torch.randn(2 * c.hidden_size))
        self.self_attn = DartAttention(c)
        self.mlp = DartMLP(c)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


# An attention function: (q [heads, Nq, hd], k, v [kv_heads, Nk, hd]) -> [heads, Nq, hd]
AttendFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def sdpa_attend(mask: torch.Tensor | None) -> AttendFn:
    """Attention with a boolean ``mask`` [Nq, Nk] (True = may attend), via SDPA."""
    def attend(q, k, v):
        rep = q.shape[0] // k.shape[0]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)[0]
    return attend


class DraftHeadBase(nn.Module):
    """What DART and EAGLE-3 heads share: the draft-vocabulary maps ``d2t`` / ``t2d`` and a borrowed
    reference to the target's token embedding. Subclasses set ``kind`` and ``error`` and call
    :meth:`_init_vocab_and_embedding` in their constructor."""
    kind = "DART"
    error: type[DartHeadError] = DartHeadError
    config: Any

    def _init_vocab_and_embedding(self, c) -> None:
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if c.full_vocab
                             else torch.zeros(c.vocab_size, dtype=torch.bool))
        # The target's embedding weight [V, H]: held in a list so nn.Module neither registers it as a
        # parameter (it is the target's, frozen) nor saves, moves or casts it with the head.
        self._embed_ref: list[torch.Tensor] = []

    def attach_embedding(self, weight: torch.Tensor):
        """Use the target's token embedding [V, H] (shared, frozen)."""
        if tuple(weight.shape) != (self.config.vocab_size, self.config.hidden_size):
            raise HeadTargetMismatch(f"the target's embedding is {tuple(weight.shape)} but the {self.kind} head "
                                     f"expects [{self.config.vocab_size}, {self.config.hidden_size}] (vocab, hidden)")
        self._embed_ref[:] = [weight]
        return self

    @property
    def _embed(self) -> torch.Tensor | None:
        return self._embed_ref[0] if self._embed_ref else None

    @torch.no_grad()
    def set_vocab_mapping(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        validate_vocab_mapping(d2t, t2d, self.config, "set_vocab_mapping", self.error)
        self.d2t.copy_(d2t.to(torch.int64))
        self.t2d.copy_(t2d.to(torch.bool))

    @property
    def draft_ids(self) -> torch.Tensor:
        """[V_d] target ids of the draft vocabulary, in draft-id order."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def target_to_draft(self) -> torch.Tensor:
        """[V] int64: the draft id of each target id, -1 outside the draft vocabulary."""
        out = torch.full((self.config.vocab_size,), -1, dtype=torch.int64, device=self.d2t.device)
        out[self.draft_ids] = torch.arange(self.config.draft_vocab_size, device=self.d2t.device)
        return out


class DartHead(DraftHeadBase):
    """The DART draft head. Call :meth:`attach_embedding` with the target's embedding before use."""

    def __init__(self, config: DartHeadConfig):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = DartMidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self._init_vocab_and_embedding(c)
        self.reset_parameters()

    # ------------------------------------------------------------------ set-up
    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """Initialise as the original (Linear ~ N(0, initializer_range), norms 1, mask_rep ~ N(0, 1))."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * std)
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)
        self.midlayer.mask_rep.copy_(torch.randn(self.midlayer.mask_rep.shape, generator=g))

    # ------------------------------------------------------------------ pieces of the forward
    def embed_inputs(self, aux: torch.Tensor, next_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """aux [n, 3H_t], next_ids [n] (token i+1 for feature i) -> x [n, 2H], residual h = fc(aux) [n, H]."""
        if self._embed is None:
            raise RuntimeError("DartHead has no token embedding: call attach_embedding(target embedding) first")
        h = self.fc(aux)
        e = F.embedding(next_ids.to(self._embed.device), self._embed).to(h.dtype)
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
    def new_cache(self, capacity: int = 512) -> "DartHeadCache":
        p = self.fc.weight
        return DartHeadCache(self.config, capacity, p.dtype, p.device)

    @torch.inference_mode()
    def step(self, aux: torch.Tensor, next_ids: torch.Tensor, cache: "DartHeadCache",
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


_FLEX_COMPILED = None


def flex_attend(layout: BlockLayout, compiled: bool | None = None) -> AttendFn:
    """Attention with torch flex_attention and a block mask from ``layout`` (GPU training).

    compiled: use ``torch.compile(flex_attention)`` (default on CUDA; eager elsewhere, which is
    slow and forward-only on CPU but exact, for tests).
    """
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    global _FLEX_COMPILED
    dev = layout.anchor.device
    if compiled is None:
        compiled = dev.type == "cuda"
    fn = flex_attention
    if compiled:
        if _FLEX_COMPILED is None:
            _FLEX_COMPILED = torch.compile(flex_attention, dynamic=True)
        fn = _FLEX_COMPILED
    N = layout.size

    def mask_mod(b, h, q_idx, kv_idx):
        return layout.allowed(q_idx, kv_idx)

    block_mask = create_block_mask(mask_mod, None, None, N, N, device=dev)

    def attend(q, k, v):
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(q[None], k[None], v[None], block_mask=block_mask,
                      enable_gqa=q.shape[0] != k.shape[0])[0]
    return attend


class DartHeadCache:
    """The head's own KV cache: keys/values [kv_heads, capacity, head_dim] of real positions.

    ``length`` counts real (committed) positions; a step writes its mask slots after them and
    the next step overwrites those slots. Grows by doubling, so it never overflows.
    """

    def __init__(self, config: DartHeadConfig, capacity: int, dtype: torch.dtype, device: torch.device):
        self.config, self.dtype, self.device = config, dtype, device
        shape = (config.num_key_value_heads, max(int(capacity), 16), config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return int(self.k.shape[1])

    def reset(self) -> None:
        self.length = 0

    def reserve(self, total: int) -> None:
        if total <= self.capacity:
            return
        cap = self.capacity
        while cap < total:
            cap *= 2
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.zeros((old.shape[0], cap, old.shape[2]), dtype=old.dtype, device=old.device)
            new[:, : self.length] = old[:, : self.length]
            setattr(self, name, new)


# ---------------------------------------------------------------------------------------------- load / save
def validate_vocab_mapping(d2t: torch.Tensor, t2d: torch.Tensor, config: DartHeadConfig, source: str,
                           error: type[DartHeadError] = DartHeadError) -> None:
    """d2t [V_d] integer offsets and t2d [V] bool must describe the same V_d distinct target ids."""
    if d2t.dtype.is_floating_point or d2t.dtype == torch.bool:
        raise error(f"{source}: d2t must hold integer offsets (int64), got {d2t.dtype}")
    if t2d.dtype != torch.bool and (t2d.dtype.is_floating_point or not bool(((t2d == 0) | (t2d == 1)).all())):
        raise error(f"{source}: t2d must be a boolean mask, got {t2d.dtype}")
    ids = torch.arange(config.draft_vocab_size) + d2t.cpu().to(torch.int64)
    if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
        raise error(f"{source}: d2t maps draft ids outside the target vocabulary [0, {config.vocab_size})")
    mask = torch.zeros(config.vocab_size, dtype=torch.bool)
    mask[ids] = True
    if int(mask.sum()) != config.draft_vocab_size:
        raise error(f"{source}: d2t maps two draft ids to the same target id")
    if not torch.equal(mask, t2d.cpu().to(torch.bool)):
        raise error(f"{source}: d2t and t2d disagree on which target ids form the draft vocabulary")


def expected_shapes(c: DartHeadConfig) -> dict[str, tuple[int, ...]]:
    H, I, hd = c.hidden_size, c.intermediate_size, c.head_dim
    return {
        "fc.weight": (H, 3 * c.target_hidden_size),
        "midlayer.mask_rep": (2 * H,),
        "midlayer.self_attn.q_proj.weight": (c.num_attention_heads * hd, 2 * H),
        "midlayer.self_attn.k_proj.weight": (c.num_key_value_heads * hd, 2 * H),
        "midlayer.self_attn.v_proj.weight": (c.num_key_value_heads * hd, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, c.num_attention_heads * hd),
        "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.post_attention_layernorm.weight": (H,),
        "norm.weight": (H,),
        "lm_head.weight": (c.draft_vocab_size, H),
        "d2t": (c.draft_vocab_size,),
        "t2d": (c.vocab_size,),
    }


def check_state_dict(state: dict[str, torch.Tensor], config: DartHeadConfig, source: str) -> dict[str, torch.Tensor]:
    """Strictly match a checkpoint to the config; returns the tensors to load (allow-listed keys removed)."""
    return match_state_dict(state, expected_shapes(config), config, source, what="a DART head checkpoint")


def match_state_dict(state: dict[str, torch.Tensor], shapes: dict[str, tuple[int, ...]], config, source: str,
                     what: str, error: type[DartHeadError] = DartHeadError) -> dict[str, torch.Tensor]:
    """Strict key/shape matching shared by the DART and EAGLE-3 loaders.

    shapes: every expected key -> shape (``d2t``/``t2d`` may be absent when ``config.full_vocab``);
    ``embed_tokens.weight`` and ``*rotary_emb.inv_freq`` are allowed and dropped. Every problem
    (missing, unexpected, misshaped key) is collected into one ``error`` naming each key.
    """
    problems: list[str] = []
    out: dict[str, torch.Tensor] = {}
    for key, t in state.items():
        if key in shapes:
            if tuple(t.shape) != shapes[key]:
                problems.append(f"{key} has shape {list(t.shape)}, expected {list(shapes[key])}")
            out[key] = t
        elif key in OPTIONAL_IGNORED_KEYS or key.endswith(OPTIONAL_IGNORED_SUFFIXES):
            logger.debug("%s: ignoring %s (the target's embedding / recomputed RoPE are used)", source, key)
        else:
            problems.append(f"unexpected key {key}")
    for key in shapes:
        if key not in state:
            if key in ("d2t", "t2d") and config.full_vocab:
                continue
            why = (" (d2t/t2d may be absent only when draft_vocab_size equals vocab_size)"
                   if key in ("d2t", "t2d") else "")
            problems.append(f"missing key {key}{why}")
    if problems:
        raise error(f"{source} is not {what} for its config.json: " + "; ".join(problems))
    if "d2t" in out or "t2d" in out:
        if "d2t" not in out or "t2d" not in out:
            raise error(f"{source}: d2t and t2d must be present together")
        validate_vocab_mapping(out["d2t"], out["t2d"], config, source, error)
    return out


def _resolve_head_files(path_or_id: str | os.PathLike) -> tuple[Path, Path]:
    p = Path(path_or_id).expanduser()
    if p.is_dir():
        cfg, weights = p / CONFIG_NAME, p / WEIGHTS_NAME
        for f in (cfg, weights):
            if not f.is_file():
                raise DartHeadError(f"DART head directory {p} has no {f.name}; it needs config.json and "
                                    "model.safetensors (the published fvliang/DART layout)")
        return cfg, weights
    s = str(path_or_id)
    if s.startswith((".", "/", "~")) or s.count("/") != 1:
        raise DartHeadError(f"DART head {s!r} is neither a local directory nor a Hub id (owner/name); "
                            "check --dart-model-name-or-path")
    try:
        from huggingface_hub import hf_hub_download
        return Path(hf_hub_download(s, CONFIG_NAME)), Path(hf_hub_download(s, WEIGHTS_NAME))
    except Exception as exc:  # noqa: BLE001 - network/offline/missing repo: one clear message
        offline = " (HF_HUB_OFFLINE=1 is set: only heads already in the Hub cache load)" \
            if os.environ.get("HF_HUB_OFFLINE") == "1" else ""
        raise DartHeadError(f"could not fetch DART head {s!r} from the Hub{offline}: {exc}") from exc


def load_dart_head(path_or_id: str | os.PathLike, target=None, *, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None, check_fingerprint: bool = True) -> DartHead:
    """Load a head (local directory or Hub id) strictly; with ``target`` (a TargetModel) also check it
    was made for that target, attach its embedding and move to its device and dtype."""
    cfg_path, weights_path = _resolve_head_files(path_or_id)
    try:
        raw = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise DartHeadError(f"{cfg_path}: not a readable JSON config ({exc})") from None
    config = DartHeadConfig.from_dict(raw, str(cfg_path))
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        state = load_file(str(weights_path))
    except (SafetensorError, OSError) as exc:
        raise DartHeadError(f"{weights_path}: not a readable safetensors file ({exc})") from None
    tensors = check_state_dict(state, config, str(weights_path))
    if target is not None:
        check_head_matches_target(config, target, source=f"the DART head {path_or_id}",
                                  check_fingerprint=check_fingerprint)
    head = DartHead(config)
    with torch.no_grad():
        params = dict(head.named_parameters())
        params.update(dict(head.named_buffers()))
        for key, t in tensors.items():
            dst = params[key]
            dst.copy_(t.to(dst.dtype) if key != "t2d" else t.to(torch.bool))
    head.source = str(path_or_id)
    if target is not None:
        head.to(device=target.device, dtype=dtype or target.dtype)
        head.attach_embedding(target.model.get_input_embeddings().weight)
    elif dtype is not None or device is not None:
        head.to(device=device, dtype=dtype)
    return head.eval()


def save_dart_head(head: DartHead, out_dir: str | os.PathLike, dtype: torch.dtype | None = torch.bfloat16) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (published key layout; float weights in ``dtype``)."""
    from safetensors.torch import save_file
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, t in head.state_dict().items():
        t = t.detach().cpu()
        if t.is_floating_point() and dtype is not None:
            t = t.to(dtype)
        state[key] = t.contiguous()
    if head.config.full_vocab and bool(head.t2d.all()) and not bool(head.d2t.any()):
        pass  # keep d2t/t2d anyway: always valid, and what the original writes
    cfg = head.config.to_dict()
    cfg["torch_dtype"] = str(dtype or head.fc.weight.dtype).replace("torch.", "")
    tmp_w, tmp_c = out / (WEIGHTS_NAME + ".tmp"), out / (CONFIG_NAME + ".tmp")
    save_file(state, str(tmp_w), metadata={"format": "pt"})
    tmp_c.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp_w, out / WEIGHTS_NAME)
    os.replace(tmp_c, out / CONFIG_NAME)
    return out


def new_head_for_target(target, draft_ids: torch.Tensor | None = None, draft_length: int = 8,
                        seed: int = 0, init_lm_head_from_target: bool = False,
                        init_layer_from_target: bool = False) -> DartHead:
    """A freshly initialised head for ``target`` (float32, on the target's device).

    draft_ids: sorted target ids of the draft vocabulary (None = the full vocabulary).
    init_lm_head_from_target / init_layer_from_target: see :func:`init_head_from_target`.
    """
    ids = _draft_ids(target, draft_ids)
    head = DartHead(DartHeadConfig.for_target(target, draft_vocab_size=int(ids.numel()), draft_length=draft_length))
    return init_head_from_target(head, target, ids, seed, lm_head=init_lm_head_from_target,
                                 layer=init_layer_from_target)


def _draft_ids(target, draft_ids: torch.Tensor | None) -> torch.Tensor:
    V = target.vocab_size
    return torch.arange(V) if draft_ids is None else torch.as_tensor(draft_ids, dtype=torch.int64).cpu()


@torch.no_grad()
def init_head_from_target(head: DraftHeadBase, target, ids: torch.Tensor, seed: int, *, lm_head: bool,
                          layer: bool) -> DraftHeadBase:
    """Initialise a new DART or EAGLE-3 head for ``target`` with draft vocabulary ``ids``, then place it
    on the target's device with the target's embedding attached.

    lm_head: start lm_head from the target's output embedding rows of ``ids``.
    layer:   start the head's decoder layer from the target's last layer: attention and MLP weights
             and the norms. The head's q/k/v read [embedding, hidden] (2H); the target's weights go
             on the hidden half, the embedding half keeps its random start.
    """
    V = target.vocab_size
    head.reset_parameters(seed)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    head.set_vocab_mapping(ids - torch.arange(ids.numel()), t2d)
    H = head.config.hidden_size
    if lm_head:
        out_emb = target.model.get_output_embeddings()
        if out_emb is not None and tuple(out_emb.weight.shape) == (V, H):
            head.lm_head.weight.copy_(out_emb.weight.detach().float().cpu()[ids])
    if layer:
        src = target.model.model.layers[-1]
        mid = head.midlayer

        def put(dst: torch.Tensor, w: torch.Tensor, what: str) -> None:
            w = w.detach().float().cpu()
            if tuple(dst.shape) != tuple(w.shape):
                raise head.error(f"cannot start the head's {what} from the target's last layer: shapes "
                                 f"{tuple(dst.shape)} and {tuple(w.shape)} differ; drop --init-layer-from-target")
            dst.copy_(w)

        for name in ("q_proj", "k_proj", "v_proj"):
            put(getattr(mid.self_attn, name).weight[:, H:], getattr(src.self_attn, name).weight, name)
        put(mid.self_attn.o_proj.weight, src.self_attn.o_proj.weight, "o_proj")
        for name in ("gate_proj", "up_proj", "down_proj"):
            put(getattr(mid.mlp, name).weight, getattr(src.mlp, name).weight, name)
        put(mid.hidden_norm.weight, src.input_layernorm.weight, "hidden_norm")
        put(mid.input_layernorm.weight, src.input_layernorm.weight, "input_layernorm")
        put(mid.post_attention_layernorm.weight, src.post_attention_layernorm.weight, "post_attention_layernorm")
    head.to(target.device)
    head.attach_embedding(target.model.get_input_embeddings().weight)
    return head
