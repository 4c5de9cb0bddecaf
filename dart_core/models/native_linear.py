"""Run a draft head's ``nn.Linear`` layers through the native small-GEMM kernel at inference.

A draft head multiplies a handful of rows (the newly committed positions plus the mask
slots or tree level) by each of its weight matrices, the regime where BLAS on a CPU
without AMX pays 2-3x the one-row cost and bf16 weights run slower than float32. The
kernel (native/src/small_gemm.hpp) reads each weight once for all rows and widens bf16
weights in registers, accumulating in float32.

:func:`use_native_linears` patches each layer's ``forward`` in place. The patched forward
falls back to ``F.linear`` whenever the kernel does not apply: autograd (training), a
non-CPU device, weights other than float32/bf16, or no native extension. The result is
cast back to the input's dtype, so the rest of the head runs as before.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

try:
    from .. import _native
except ImportError:
    _native = None

KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def kernel_array(weight: torch.Tensor):
    """A zero-copy numpy view of a contiguous CPU weight as the kernel reads it: float32 as is, bf16 as its
    uint16 bit patterns."""
    w = weight.detach()
    return w.view(torch.uint16).numpy() if w.dtype == torch.bfloat16 else w.numpy()


def _kernel_weight(module: nn.Linear):
    """``kernel_array`` of the layer's weight, cached while the storage is the same."""
    w = module.weight
    key = (w.data_ptr(), w.dtype, tuple(w.shape))
    cached = getattr(module, "_native_weight", None)
    if cached is None or cached[0] != key:
        cached = (key, kernel_array(w))
        module._native_weight = cached
    return cached[1]


def _native_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight
    if (x.device.type != "cpu" or w.device.type != "cpu" or w.dtype not in KERNEL_DTYPES
            or not w.is_contiguous() or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
        return F.linear(x, w, self.bias)
    rows = x.reshape(-1, x.shape[-1]).float().contiguous()
    y = torch.empty(rows.shape[0], w.shape[0], dtype=torch.float32)
    _native.small_gemm(rows.numpy(), _kernel_weight(self), y.numpy(), torch.get_num_threads())
    if self.bias is not None:
        y += self.bias.float()
    return y.view(*x.shape[:-1], w.shape[0]).to(x.dtype)


def use_native_linears(module: nn.Module) -> int:
    """Patch every ``nn.Linear`` in ``module`` to use the kernel; returns how many were patched
    (0 when the extension is missing or the module is not on a CPU)."""
    if _native is None or not hasattr(_native, "small_gemm"):
        return 0
    patched = 0
    for m in module.modules():
        if isinstance(m, nn.Linear) and m.weight.device.type == "cpu":
            m.forward = types.MethodType(_native_forward, m)
            patched += 1
    return patched
