"""A lean CPU forward pass for Llama / Qwen2 / Qwen3 targets, over the HF model's own weights.

Why: on a CPU a decoding step is bound by reading the weights once, but the stock path
pays twice that and more. BLAS libraries run the 2..64-row products of a tree
verification as a small GEMM costing 2-3x a one-row product (on CPUs without AMX), bf16
weights run slower than float32 without AVX512-BF16, and the HF modules add per-layer
Python and mask work. This path keeps the model's math and changes only how it is run:

* the decoder layers run in one native call per stretch of layers (``_native.Decoder``): RMSNorm,
  projections, RoPE, K/V written straight into the preallocated cache, tree-masked attention
  and the MLP, with no torch op per layer; a step (a token or a draft tree) is one chunk, a prompt
  runs in chunks of ``NATIVE_MAX_ROWS`` positions;
* every projection goes through the native small-GEMM kernel, which reads each weight row
  once for all rows of the step (bf16 weights are read as bf16 and widened in registers), so
  a tree of a few dozen nodes costs little more than one token;
* activations, norms, attention and the KV cache are float32 (bf16 weights, float32
  arithmetic, like a native bf16 GEMM that accumulates in float32).

A projection's output row depends only on its input row (the kernel's summation order does
not depend on the number of rows), so tree verification and plain decoding compute the same
projections bit for bit. ``FastForward.supports`` says when the path applies; otherwise
``TargetModel`` uses the HF forward. The stock HF model stays untouched (``hf_generate``
benchmarks it as it is).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from ..openmp import warn_if_spinning
from . import gemm_split, gemv_prefetch, kernel_path
from .huge_pages import move_to_huge_pages
from .kv_cache import CacheFullError, PreallocatedCache
from .native_linear import KERNEL_DTYPES, kernel_array

logger = logging.getLogger(__name__)

try:
    from .. import _native
except ImportError:  # the extension is built by `pip install -e .`; without it the HF path runs
    _native = None

FAST_MODEL_TYPES = ("llama", "qwen2", "qwen3")
NATIVE_MAX_ROWS = 64   # positions per native call; longer inputs run in chunks (measured: a 100-token prompt
                       # in 64-row chunks took 208 ms against 314 ms for torch ops with BLAS on widened weights)
PREFILL_ROWS = 256     # a causal prompt's chunk: the GEMM holds its rate up to 256 rows, and a quarter of the
                       # chunks is a quarter of the parallel regions (each a wait for both cores on a busy machine)


def _float_vector(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().float().contiguous().numpy()


def _norm_eps(module) -> float:
    return float(getattr(module, "variance_epsilon", None) or getattr(module, "eps"))


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class FastForward:
    """The decoder stack of one HF causal LM, run by :meth:`forward` with float32 activations."""

    @staticmethod
    def supports(model) -> str | None:
        """None when the lean path can run ``model``; otherwise why not (the HF path runs instead)."""
        cfg = model.config
        if _native is None or not hasattr(_native, "Decoder"):
            return "the native extension is not built (pip install -e .)"
        if cfg.model_type not in FAST_MODEL_TYPES:
            return f"model type {cfg.model_type!r} is not one of {FAST_MODEL_TYPES}"
        p = next(model.parameters())
        if p.device.type != "cpu":
            return f"the model is on {p.device.type}, the lean path is for CPUs"
        if p.dtype not in KERNEL_DTYPES:
            return f"weights are {p.dtype}; the kernel reads float32 or bfloat16"
        if getattr(cfg, "hidden_act", "silu") != "silu":
            return f"activation {cfg.hidden_act!r} is not silu"
        if getattr(cfg, "use_sliding_window", False):
            return "sliding-window attention is not implemented in the lean path"
        if getattr(cfg, "mlp_bias", False) or getattr(cfg, "attention_bias", False) and cfg.model_type == "llama":
            return "Llama projections with bias are not implemented in the lean path"
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        if isinstance(rope, dict) and rope.get("rope_type", "default") in ("dynamic", "longrope"):
            return f"RoPE type {rope['rope_type']!r} changes with the sequence length"
        if not all(p.is_contiguous() for p in model.parameters()):
            return "some weights are not contiguous"
        return None

    def __init__(self, model):
        why = self.supports(model)
        if why is not None:
            raise ValueError(f"the lean CPU forward cannot run this model: {why}")
        warn_if_spinning(logger)
        # Every step streams all the weights: on 2 MiB pages first (before the kernel arrays view them).
        self.weight_pages = move_to_huge_pages(model)
        cfg = model.config
        inner = model.model
        heads = int(cfg.num_attention_heads)
        kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
        self.eps = _norm_eps(inner.norm)
        self.num_layers = len(inner.layers)
        self.rotary = inner.rotary_emb
        self.head_dim = head_dim
        # cos / sin [positions, head_dim] float32, rows taken by position each step (see _rope)
        self._rope_tables = (np.empty((0, head_dim), np.float32), np.empty((0, head_dim), np.float32))
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight.detach().float().contiguous()
        self.hidden = int(cfg.hidden_size)
        self.lm_head_array = kernel_array(model.lm_head.weight)
        self.decoder = _native.Decoder(int(cfg.hidden_size), heads, kv_heads, head_dim, int(cfg.intermediate_size),
                                       self.eps, next(model.parameters()).dtype == torch.bfloat16)
        matrices = []   # in the order a step reads them
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projections = {name: kernel_array(module.weight) for name, module in (
                ("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj), ("o", attn.o_proj),
                ("gate", mlp.gate_proj), ("up", mlp.up_proj), ("down", mlp.down_proj))}
            matrices.extend(projections.values())
            self.decoder.add_layer({
                **projections,
                "q_bias": _float_vector(attn.q_proj.bias), "k_bias": _float_vector(attn.k_proj.bias),
                "v_bias": _float_vector(attn.v_proj.bias),
                "in_norm": _float_vector(layer.input_layernorm.weight),
                "post_norm": _float_vector(layer.post_attention_layernorm.weight),
                "q_norm": _float_vector(attn.q_norm.weight) if hasattr(attn, "q_norm") else None,
                "k_norm": _float_vector(attn.k_norm.weight) if hasattr(attn, "k_norm") else None,
            })
        self.decoder_matrices = matrices   # views of the weights (benchmarks sweep them)
        self.decoder.set_ends(kernel_array(self.embed), self.final_norm.numpy(), self.lm_head_array)
        threads = torch.get_num_threads()
        # The kernels' path (timed on these weights on a machine's first load, then cached), and the plain step's
        # kernel on it: with or without software prefetch, whichever streams these weights faster here.
        model_id = (f"{getattr(model, 'name_or_path', '') or cfg.model_type} {self.num_layers}x{cfg.hidden_size}"
                    f" {sum(m.nbytes for m in matrices)}B")
        self.gemm_path = kernel_path.choose(matrices, threads, model_id, str(self.lm_head_array.dtype))
        self.gemv_prefetch = gemv_prefetch.choose(matrices, threads)
        # and how each call's rows are cut among the threads (timed on the chosen path, kept with it)
        self.gemm_split = gemm_split.choose(matrices, threads, model_id, str(self.lm_head_array.dtype))

    @torch.inference_mode()
    def forward(self, cache: PreallocatedCache, input_ids: torch.Tensor, position_ids: torch.Tensor,
                allowed: torch.Tensor | None, aux_layer_ids: tuple[int, ...] | None, rows: str = "all",
                head_rows: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``rows="all"``: logits [q, V]; ``"last"``: the last position's logits [1, V]; ``"hidden"``: the
        final-normed hidden states [q, H] without the LM head (:meth:`lm_head` turns rows of them into logits),
        and the logits of rows ``head_rows`` in that order ([len, V], None if empty), from the same call.
        With ``aux_layer_ids``, also the hidden states entering those layers at every position, concatenated
        -> [q, len(ids) * H]. Returns (logits or hidden states, aux or None, head_rows' logits or None).

        ``allowed``: bool [q, length + q], True where a new position may attend; None = causal.
        Longer inputs run in chunks (``PREFILL_ROWS`` positions for a causal prompt, ``NATIVE_MAX_ROWS`` with a
        mask), each attending to the cache the chunks before it wrote; each chunk is one native call.
        """
        if rows not in ("all", "last", "hidden"):
            raise ValueError(f"rows must be 'all', 'last' or 'hidden', got {rows!r}")
        if head_rows and rows != "hidden":
            raise ValueError("head_rows goes with rows='hidden' (the other modes return logits already)")
        q = int(input_ids.numel())
        start = cache.length
        if start + q > cache.capacity:
            raise CacheFullError(f"KV cache holds {cache.capacity} positions; writing {q} after {start} "
                                 "would overflow it (raise max_length)")
        bad = [r for r in head_rows if not 0 <= r < q]
        if bad:
            raise IndexError(f"head row {bad[0]} is not one of the {q} positions")
        ids, pos = input_ids.view(-1), position_ids.view(-1)
        outs, aux = [], []
        first = np.empty((len(head_rows), self.lm_head_array.shape[0]), np.float32) if head_rows else None
        chunk = NATIVE_MAX_ROWS if allowed is not None else PREFILL_ROWS   # trees keep to 64 rows
        for a in range(0, q, chunk):
            b = min(q, a + chunk)
            # A chunk's rows see keys up to their own positions only (tree nodes follow their ancestors).
            sub = None if allowed is None else allowed[a:b, :start + b].contiguous()
            mine = [k for k, r in enumerate(head_rows) if a <= r < b]
            logits = first if len(mine) == len(head_rows) else (
                np.empty((len(mine), self.lm_head_array.shape[0]), np.float32) if mine else None)
            out, ax = self._chunk(cache, ids[a:b], pos[a:b], sub, aux_layer_ids,
                                  "none" if rows == "last" and b < q else rows,
                                  [head_rows[k] - a for k in mine], logits)
            if logits is not None and logits is not first:
                first[mine] = logits
            if out is not None:
                outs.append(out)
            if ax is not None:
                aux.append(ax)
        # One chunk (every decoding step) returns its tensors as they are: torch.cat of a [1, V] row runs on torch's
        # OpenMP threads, which wake on the cores the native pool's worker still spins on (0.13 ms a step, interleaved).
        return (_joined(outs), (_joined(aux) if aux else None),
                torch.from_numpy(first) if first is not None else None)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [r, V] float32 of final-normed hidden rows [r, H] (``forward(rows="hidden")``). A row's logits
        do not depend on the other rows (the kernel's summation order is fixed), so a row computed alone equals
        the same row computed with the whole tree, bit for bit."""
        h = hidden.float().contiguous()
        logits = torch.empty(h.shape[0], self.lm_head_array.shape[0], dtype=torch.float32)
        if h.shape[0]:
            _native.small_gemm(h.numpy(), self.lm_head_array, logits.numpy(), torch.get_num_threads())
        return logits

    def _chunk(self, cache, ids, pos, allowed, aux_layer_ids, rows: str, head_rows: list[int],
               head_logits: np.ndarray | None):
        """One chunk of positions (see ``forward``) through every layer in one native call: the embedding rows, the
        layers, the aux features, the final norm and the LM head's rows ("all" rows' logits, the "last" one's,
        the final-normed "hidden" states with the logits of ``head_rows`` written into ``head_logits``, or
        "none"). Torch ops between native calls ran on torch's OpenMP threads beside the native pool's spinning
        worker: 0.5-0.7 ms of a 9 ms plain step on 2 cores (the final norm alone 0.1-0.2 ms)."""
        q, start = int(ids.numel()), cache.length
        ids_np = np.ascontiguousarray(ids.numpy(), dtype=np.int64)
        pos_np = np.ascontiguousarray(pos.numpy(), dtype=np.int64)
        cos, sin = self._rope_covering(pos_np)
        mask = None if allowed is None else allowed.numpy()
        aux_ids = list(aux_layer_ids) if aux_layer_ids is not None else []
        aux = np.empty((q, len(aux_ids) * self.hidden), np.float32) if aux_layer_ids is not None else None
        out = None if rows == "none" else np.empty((1 if rows == "last" else q, self.hidden), np.float32)
        if rows in ("all", "last"):
            head_rows = list(range(len(out)))
            head_logits = np.empty((len(out), self.lm_head_array.shape[0]), np.float32)
        self.decoder.forward(ids_np, pos_np, cos, sin, mask, start, self._native_cache(cache), aux_ids, aux, out,
                             head_rows, head_logits, torch.get_num_threads())
        cache.set_length(start + q)
        aux_out = torch.from_numpy(aux) if aux is not None else None
        if out is None:
            return None, aux_out
        return torch.from_numpy(head_logits if rows in ("all", "last") else out), aux_out

    def _rope_covering(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The whole cos / sin tables [n, D], grown (see ``_rope``) to cover these positions; the native call takes
        its rows by position."""
        if positions.size and int(positions.max()) >= len(self._rope_tables[0]):
            self._rope(positions)
        return self._rope_tables

    def _rope(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """RoPE's cos and sin rows [q, D] float32 of these positions, from tables the model's own rotary module
        filled once (a row is a function of its position alone, so a table row equals the module's output for
        that position bit for bit; tests check it). Calling the module every step ran a small matmul through
        torch's BLAS, whose OpenMP threads then spun beside the native kernels' pool on the same cores: a verify
        of 3 nodes took 1.2x as long."""
        cos, sin = self._rope_tables
        need = int(positions.max()) + 1 if positions.size else 0
        if need > len(cos):
            n = max(need, 2 * len(cos), 1024)
            with torch.inference_mode():
                probe = torch.zeros(1, 1, self.head_dim, dtype=torch.float32)
                c, s = self.rotary(probe, torch.arange(n).view(1, -1))
            cos, sin = c[0].float().contiguous().numpy(), s[0].float().contiguous().numpy()
            self._rope_tables = (cos, sin)      # replaced whole: a session on another thread reads a consistent pair
        return cos[positions], sin[positions]

    def _native_cache(self, cache: PreallocatedCache):
        """The cache's buffers bound for the native decoder, once per cache."""
        if cache.native is None:
            cache.native = _native.DecoderCache([layer.key_buffer[0].numpy() for layer in cache.layers],
                                                [layer.value_buffer[0].numpy() for layer in cache.layers])
        return cache.native
