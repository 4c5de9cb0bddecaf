"""A draft head's drafting forward in one native call on a CPU (``native/src/head_step.hpp``).

Why: a head step is a handful of rows through one decoder layer and a draft-vocabulary LM head. Run as
torch ops it is ~100 small operations (dtype conversions, copies, SDPA over the head's cache, top-k),
whose dispatch cost several times what reading the head's weights does. The native step runs the same
arithmetic in one call: the inputs (fc over the target's features, the target's token embedding, the
norms, DART's mask slots), the layer with K/V in the head's cache, the final norm(s), the LM head and each
row's top-k as target ids. Only the rows a drafter reads go past attention (DART: the last real row and the
mask slots; EAGLE-3's real step: its last row).

Numerics: float32 activations over the head's weights (bf16 weights widened exactly, as the target's lean
forward does), so a bf16 head drafts from slightly more exact logits than its torch forward in bf16; the
torch heads stay the reference (tests compare both against a float64 run of the torch head). The head's KV
cache is float32 (:meth:`NativeHeadStep.new_cache`).

    step = NativeHeadStep(head)                  # head on the CPU, float32 or bf16, embedding attached
    cache = step.new_cache()
    values, tokens = step.dart(aux, next_ids, cache, levels=3, top_k=8)
"""
from __future__ import annotations

import numpy as np
import torch

from ..huge_pages import move_to_huge_pages
from ..native_linear import KERNEL_DTYPES, kernel_array
from .cache import HeadCache

try:
    from ... import _native
except ImportError:  # the extension is built by `pip install -e .`; without it the torch heads run
    _native = None


def _vector(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().contiguous().numpy()


class NativeHeadStep:
    """The native drafting forward of one DART or EAGLE-3 head, bound to its weights (borrowed, not copied:
    the head must not be moved or cast while this is in use)."""

    @staticmethod
    def supports(head) -> str | None:
        """None when the native step can run ``head``; otherwise why not (the torch forward runs instead)."""
        if _native is None or not hasattr(_native, "DraftHeadKernel"):
            return "the native extension is not built (pip install -e .)"
        p = head.fc.weight
        if p.device.type != "cpu":
            return f"the head is on {p.device.type}; the native step is for CPUs"
        if p.dtype not in KERNEL_DTYPES:
            return f"the head's weights are {p.dtype}; the kernel reads float32 or bfloat16"
        linears = [m.weight for m in head.modules() if isinstance(m, torch.nn.Linear)]
        if any(w.dtype != p.dtype or not w.is_contiguous() for w in linears):
            return "the head's weights are not all contiguous and of one dtype"
        embed = head.embedding
        if embed is None:
            return "the head has no token embedding attached"
        if embed.device.type != "cpu" or embed.dtype not in KERNEL_DTYPES or not embed.is_contiguous():
            return f"the target's embedding ({embed.dtype} on {embed.device.type}) is not a contiguous CPU array"
        if head.config.head_dim % 2:
            return "RoPE needs an even head_dim"
        return None

    def __init__(self, head):
        why = self.supports(head)
        if why is not None:
            raise ValueError(f"the native draft step cannot run this head: {why}")
        # Every draft streams the head's weights: on 2 MiB pages first (before the kernel arrays view them).
        self.weight_pages = move_to_huge_pages(head)
        c, mid = head.config, head.midlayer
        attn = mid.self_attn
        mask_rep = getattr(mid, "mask_rep", None)
        arrays = {
            "fc": kernel_array(head.fc.weight), "q": kernel_array(attn.q_proj.weight),
            "k": kernel_array(attn.k_proj.weight), "v": kernel_array(attn.v_proj.weight),
            "o": kernel_array(attn.o_proj.weight), "gate": kernel_array(mid.mlp.gate_proj.weight),
            "up": kernel_array(mid.mlp.up_proj.weight), "down": kernel_array(mid.mlp.down_proj.weight),
            "lm_head": kernel_array(head.lm_head.weight),
            "hidden_norm": _vector(mid.hidden_norm.weight), "input_norm": _vector(mid.input_layernorm.weight),
            "post_norm": _vector(mid.post_attention_layernorm.weight), "norm": _vector(head.norm.weight),
            "mask_rep": None if mask_rep is None else _vector(mask_rep),
            "inv_freq": _vector(attn.inv_freq), "embed": kernel_array(head.embedding),
            "d2t": head.d2t.detach().to(torch.int64).contiguous().numpy(),
        }
        self.config = c
        self.kernel = _native.DraftHeadKernel(
            int(c.hidden_size), int(c.num_attention_heads), int(c.num_key_value_heads), int(c.head_dim),
            int(c.intermediate_size), int(head.fc.weight.shape[1]), int(c.draft_vocab_size), int(c.vocab_size),
            float(head.norm.variance_epsilon), head.fc.weight.dtype == torch.bfloat16, arrays)

    def new_cache(self, capacity: int = 512) -> HeadCache:
        """The head's KV cache as the native step reads it: float32 on the CPU."""
        return HeadCache(self.config, capacity, torch.float32, torch.device("cpu"))

    @staticmethod
    def _rows(x: torch.Tensor) -> np.ndarray:
        return x.detach().to(torch.float32).contiguous().numpy()

    def dart(self, aux: torch.Tensor, next_ids, cache: HeadCache, levels: int, top_k: int,
             ) -> tuple[np.ndarray, np.ndarray]:
        """DART's step (as ``DartHead.step(aux, next_ids, cache, levels)`` then each row's top-k): the top-k
        logits [levels, top_k] float32 and their target ids [levels, top_k] int64. The n real positions stay in
        the cache; the mask slots are dropped."""
        vals, toks, _ = self.dart_logits(aux, next_ids, cache, levels, top_k)
        return vals, toks

    def dart_logits(self, aux: torch.Tensor, next_ids, cache: HeadCache, levels: int, top_k: int):
        """:meth:`dart` with the whole logit rows [levels, V_d] too (tests, the page's extras)."""
        ids = np.ascontiguousarray(next_ids, dtype=np.int64)
        n, start = int(ids.shape[0]), cache.length
        cache.reserve(start + n + levels - 1)
        out = self.kernel.dart_step(self._rows(aux), ids, cache.k.numpy(), cache.v.numpy(), start, int(levels),
                                    int(top_k), torch.get_num_threads())
        cache.length = start + n
        return out

    def eagle3_real(self, aux: torch.Tensor, next_ids, cache: HeadCache, top_k: int):
        """EAGLE-3's real step (``Eagle3Head.step_real`` then the last row's log-softmax and top-k):
        g [1, H], top-k log-probs [1, top_k] and their target ids. The positions stay in the cache."""
        ids = np.ascontiguousarray(next_ids, dtype=np.int64)
        n, start = int(ids.shape[0]), cache.length
        cache.reserve(start + n)
        g, _, vals, toks = self.kernel.eagle3_real(self._rows(aux), ids, cache.k.numpy(), cache.v.numpy(), start,
                                                   int(top_k), torch.get_num_threads())
        cache.length = start + n
        return g, vals, toks

    def eagle3_tree(self, h: np.ndarray, ids, position: int, cache: HeadCache, tree_start: int,
                    tree_allowed: np.ndarray, top_k: int):
        """One EAGLE-3 tree depth (``Eagle3Head.step_tree`` then log-softmax and top-k per row): g [n, H], the
        top-k log-probs [n, top_k] and their target ids. The nodes' K/V go to scratch slots after the real
        positions."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        cache.reserve(int(tree_start) + int(ids.shape[0]))
        g, _, vals, toks = self.kernel.eagle3_tree(np.ascontiguousarray(h, dtype=np.float32), ids, cache.k.numpy(),
                                                   cache.v.numpy(), int(position), cache.length, int(tree_start),
                                                   np.ascontiguousarray(tree_allowed, dtype=np.bool_), int(top_k),
                                                   torch.get_num_threads())
        return g, vals, toks


#: How a drafter runs its head: "native" (one native call a step, CPU), "torch+gemm" (the torch forward with
#: its projections through the native small-GEMM kernel), "torch" (the torch forward as it is; the reference),
#: "auto" (native where :meth:`NativeHeadStep.supports` the head, else torch+gemm on a CPU, else torch).
HEAD_BACKENDS = ("auto", "native", "torch+gemm", "torch")


def prepare_head(head, backend: str = "auto") -> tuple[str, NativeHeadStep | None]:
    """Set ``head`` up for drafting with ``backend`` (see ``HEAD_BACKENDS``); returns the backend that runs and
    its native step (None unless "native"). Raises ValueError for an unknown name, or "native" on a head it
    cannot run (saying why)."""
    from ..native_linear import use_native_linears

    if backend not in HEAD_BACKENDS:
        raise ValueError(f"head backend must be one of {', '.join(HEAD_BACKENDS)}, got {backend!r}")
    if backend == "auto":
        backend = "native" if NativeHeadStep.supports(head) is None else "torch+gemm"
    if backend == "native":
        return backend, NativeHeadStep(head)
    if backend == "torch+gemm" and not use_native_linears(head):
        backend = "torch"   # not on a CPU, or no extension: the patch does not apply
    return backend, None
