"""The layers both draft heads are built from (DART and EAGLE-3 use the same published parameter names).

* :class:`RMSNorm`, :class:`HeadAttention` (q/k/v read ``[embedding, hidden]`` = 2H, RoPE),
  :class:`HeadMLP` (SwiGLU), :class:`MidLayer` (attention + MLP + the three norms; DART adds
  ``mask_rep``);
* attention functions: :func:`sdpa_attend` (boolean mask, SDPA) and :func:`flex_attend`
  (torch flex_attention with a block mask, for GPU training);
* :class:`DraftHeadBase`: the draft-vocabulary maps ``d2t`` / ``t2d`` and the borrowed target embedding;
* :func:`init_head_from_target`: a new head's start (seeded random, optionally lm_head and/or the
  decoder layer from the target).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .files import HeadError, mismatch_class, validate_vocab_mapping


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


class HeadAttention(nn.Module):
    """Llama attention over ``[embedding, hidden]`` rows (2H wide), reading only the Llama config fields."""

    def __init__(self, c):
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


class HeadMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The heads' one decoder layer: ``midlayer.{self_attn, mlp, hidden_norm, input_layernorm,
    post_attention_layernorm}``; with ``mask_rep`` (DART) also the mask slot's input [2H]."""

    def __init__(self, c, mask_rep: bool = False):
        super().__init__()
        if mask_rep:
            self.mask_rep = nn.Parameter(torch.randn(2 * c.hidden_size))
        self.self_attn = HeadAttention(c)
        self.mlp = HeadMLP(c)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


# ---------------------------------------------------------------------------------------------- attention
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


_FLEX_COMPILED = None


def flex_attend(layout, compiled: bool | None = None) -> AttendFn:
    """Attention with torch flex_attention and a block mask from ``layout`` (GPU training).

    layout: has ``size`` (rows), ``anchor`` (a tensor on the device) and ``allowed(q, k)`` (the
    mask rule on index tensors), as DART's ``BlockLayout``.
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


# ---------------------------------------------------------------------------------------------- the head base
class DraftHeadBase(nn.Module):
    """What DART and EAGLE-3 heads share: their layers (fc over the target's three aux features, one decoder
    layer, a norm and the draft-vocabulary LM head), the draft-vocabulary maps ``d2t`` / ``t2d``, a borrowed
    reference to the target's token embedding and the seeded initialisation. Subclasses set ``kind`` and
    ``error``; the two heads differ in their layer's ``mask_rep`` (DART's mask-token embedding) and their forward."""
    kind = "draft"
    error: type[HeadError] = HeadError
    config: Any

    def __init__(self, config, *, mask_rep: bool):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c, mask_rep=mask_rep)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self._init_vocab_and_embedding(c)
        self.source: str | None = None
        self.reset_parameters()

    def _init_vocab_and_embedding(self, c) -> None:
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool) if c.full_vocab
                             else torch.zeros(c.vocab_size, dtype=torch.bool))
        # The target's embedding weight [V, H]: held in a list so nn.Module neither registers it as a
        # parameter (it is the target's, frozen) nor saves, moves or casts it with the head.
        self._embed_ref: list[torch.Tensor] = []

    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """Initialise as the original: Linear ~ N(0, initializer_range), norms 1, a ``mask_rep`` ~ N(0, 1)
        (seeded when ``seed`` is given)."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.config.initializer_range
        for m in self.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * std)
            elif isinstance(m, RMSNorm):
                m.weight.fill_(1.0)
        rep = getattr(self.midlayer, "mask_rep", None)
        if rep is not None:
            rep.copy_(torch.randn(rep.shape, generator=g))

    def attach_embedding(self, weight: torch.Tensor):
        """Use the target's token embedding [V, H] (shared, frozen)."""
        if tuple(weight.shape) != (self.config.vocab_size, self.config.hidden_size):
            raise mismatch_class(self.error)(
                f"the target's embedding is {tuple(weight.shape)} but the {self.kind} head "
                f"expects [{self.config.vocab_size}, {self.config.hidden_size}] (vocab, hidden)")
        self._embed_ref[:] = [weight]
        return self

    @property
    def embedding(self) -> torch.Tensor | None:
        """The target's token embedding this head reads (None until :meth:`attach_embedding`)."""
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


@torch.no_grad()
def remap_vocab(head: DraftHeadBase, target, ids: torch.Tensor) -> int:
    """Give a trained head the draft vocabulary ``ids`` (sorted target ids, the head's draft vocabulary size):
    a token it already had keeps its LM-head row, a new one starts from the target's output-embedding row (as a
    new head's would). Returns how many tokens were kept."""
    ids = torch.as_tensor(ids, dtype=torch.int64).cpu()
    if ids.numel() != head.config.draft_vocab_size:
        raise head.error(f"remap_vocab: {ids.numel()} ids for a draft vocabulary of {head.config.draft_vocab_size}")
    V, H = target.vocab_size, head.config.hidden_size
    out_emb = target.model.get_output_embeddings()
    if out_emb is None or tuple(out_emb.weight.shape) != (V, H):
        raise head.error("remap_vocab: the target has no output embedding of shape "
                         f"({V}, {H}) to start the new tokens' rows from")
    old_row = head.target_to_draft().cpu()[ids]               # -1: not in the old vocabulary
    weight = out_emb.weight.detach().float().cpu()[ids]
    kept = old_row >= 0
    weight[kept] = head.lm_head.weight.detach().float().cpu()[old_row[kept]]
    head.lm_head.weight.copy_(weight.to(head.lm_head.weight.device, head.lm_head.weight.dtype))
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    head.set_vocab_mapping((ids - torch.arange(ids.numel())).to(head.d2t.device), t2d.to(head.t2d.device))
    return int(kept.sum())


# ---------------------------------------------------------------------------------------------- a new head
def draft_ids_for(target, draft_ids: torch.Tensor | None) -> torch.Tensor:
    """Sorted target ids of a draft vocabulary (None = the target's full vocabulary), int64 on the CPU."""
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
        init_layer_from_target(head, target)
    head.to(target.device)
    head.attach_embedding(target.model.get_input_embeddings().weight)
    return head


@torch.no_grad()
def init_layer_from_target(head: DraftHeadBase, target) -> None:
    """Copy the target's last decoder layer into the head's (see :func:`init_head_from_target`)."""
    H = head.config.hidden_size
    src = target.model.model.layers[-1]
    mid = head.midlayer

    def put(dst: torch.Tensor, w: torch.Tensor, what: str) -> None:
        w = w.detach().float().cpu()
        if tuple(dst.shape) != tuple(w.shape):
            raise head.error(f"cannot start the head's {what} from the target's last layer: shapes "
                             f"{tuple(dst.shape)} and {tuple(w.shape)} differ; drop --init-layer-from-target")
        dst.copy_(w.to(dst.device, dst.dtype))

    for name in ("q_proj", "k_proj", "v_proj"):
        put(getattr(mid.self_attn, name).weight[:, H:], getattr(src.self_attn, name).weight, name)
    put(mid.self_attn.o_proj.weight, src.self_attn.o_proj.weight, "o_proj")
    for name in ("gate_proj", "up_proj", "down_proj"):
        put(getattr(mid.mlp, name).weight, getattr(src.mlp, name).weight, name)
    put(mid.hidden_norm.weight, src.input_layernorm.weight, "hidden_norm")
    put(mid.input_layernorm.weight, src.input_layernorm.weight, "input_layernorm")
    put(mid.post_attention_layernorm.weight, src.post_attention_layernorm.weight, "post_attention_layernorm")


def head_shapes(c, *, mask_rep: bool) -> dict[str, tuple[int, ...]]:
    """The checkpoint tensors of a head with config ``c`` (published layouts): the DART head also has
    ``midlayer.mask_rep``, the EAGLE-3 head does not."""
    H, I, hd = c.hidden_size, c.intermediate_size, c.head_dim
    shapes = {
        "fc.weight": (H, 3 * c.target_hidden_size),
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
    if mask_rep:
        shapes["midlayer.mask_rep"] = (2 * H,)
    return shapes
