"""Resolve a target model from a name: the bundled default, a local directory, a .gguf file or a Hub id."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from ..hardware import cpu_supports_bf16   # a fact of the machine; also imported from here by training
from .templates import guess_template_name
from .bundled import BUNDLED_ALIASES, BUNDLED_DEFAULT_NAME, prepare_bundled_model
from .target import TargetModel

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

#: Every dtype name a flag or config may use -> the torch dtype (the one table; names back: config.dtype_name).
DTYPE_ALIASES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
    "half": torch.float16, "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


class ModelLoadError(ValueError):
    """The model could not be found or is not a supported causal LM."""


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"--device {device} asked for CUDA but no GPU is visible; use --device cpu")
    return dev


def native_kernel_available() -> bool:
    """True when the native small-GEMM kernel runs vectorised here (it reads bf16 weights at full speed
    on any AVX2 CPU, native bf16 or not)."""
    try:
        from .. import _native
    except ImportError:
        return False
    return bool(getattr(_native, "small_gemm_has_avx2", lambda: False)())


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, inference: bool = True) -> torch.dtype:
    """``auto`` on a CPU: bf16 where bf16 is fast, float32 elsewhere. For inference bf16 is fast on CPUs
    with native bf16 or with the native kernel (the lean forward, models/fast_forward.py); training
    runs torch's own kernels, so only native bf16 counts there."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        fast_bf16 = cpu_supports_bf16() or (inference and native_kernel_available())
        return torch.bfloat16 if fast_bf16 else torch.float32
    if dtype not in DTYPE_ALIASES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of auto, bfloat16, float16, float32 (--dtype)")
    return DTYPE_ALIASES[dtype]


def resolve_model_path(name_or_path: str | None) -> tuple[str, dict]:
    """Return (path or Hub id, extra from_pretrained kwargs) for a model reference."""
    if name_or_path is None or name_or_path in BUNDLED_ALIASES:
        return str(prepare_bundled_model()), {}
    p = Path(name_or_path).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelLoadError(f"GGUF file {p} does not exist; check the path")
        return str(p.parent), {"gguf_file": p.name}
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{p} is a directory but has no config.json; point to a Hugging Face model "
                                 "directory (config.json + weights + tokenizer)")
        return str(p), {}
    if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1:
        raise ModelLoadError(f"model {name_or_path!r} is not a local directory, a .gguf file or a Hub id "
                             "(owner/name); check --base-model-name-or-path")
    return name_or_path, {}


def load_tokenizer(name_or_path: str | None = None):
    """A target's tokenizer by the names load_target takes (None / 'bundled', directory, .gguf, Hub id). A local
    directory needs only the tokenizer files (no config.json): N-gram tables are built from such folders."""
    from transformers import AutoTokenizer
    if name_or_path is not None and Path(name_or_path).expanduser().is_dir():
        return AutoTokenizer.from_pretrained(str(Path(name_or_path).expanduser()))
    path, extra = resolve_model_path(name_or_path)
    return AutoTokenizer.from_pretrained(path, **extra)


def load_target(name_or_path: str | None = None, *, dtype: str | torch.dtype | None = "auto",
                device: str | None = "auto", template_name: str | None = None,
                attn_implementation: str = "sdpa", fast_forward: bool = True) -> TargetModel:
    """Load a Llama / Qwen2 / Qwen3 causal LM as a TargetModel (None = the bundled SmolLM2-135M).

    ``fast_forward``: on a CPU, run sessions through the lean native forward (models/fast_forward.py);
    False keeps the HF forward (for comparisons)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    path, extra = resolve_model_path(name_or_path)
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    try:
        config = AutoConfig.from_pretrained(path, **extra)
    except (OSError, ValueError) as exc:
        hint = " (HF_HUB_OFFLINE=1 is set: only models already in the Hub cache load)" if offline else ""
        raise ModelLoadError(f"could not load model {name_or_path!r}{hint}: {exc}") from exc
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelLoadError(f"model type {config.model_type!r} is not supported; targets must be one of "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)} causal LMs")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation=attn_implementation,
                                                 **extra).to(dev)
    tokenizer = AutoTokenizer.from_pretrained(path, **extra)
    template = template_name or guess_template_name(config.model_type)
    name = name_or_path or BUNDLED_DEFAULT_NAME
    logger.info("target %s: %s, %d layers, dtype %s, device %s", name, config.model_type,
                config.num_hidden_layers, torch_dtype, dev)
    return TargetModel(model, tokenizer, name=name, template_name=template, fast_forward=fast_forward)
