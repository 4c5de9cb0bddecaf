"""Generation settings shared by the engine, the benchmark and the app (one source of truth)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A generation setting is out of range; the message names the setting to change."""


def dtype_name(dtype: Any) -> str:
    """A torch dtype's short name, as flags, configs and reports spell it: torch.bfloat16 -> "bfloat16"
    (a name passes through: "bfloat16" -> "bfloat16"). The names resolve back with
    dart_core.models.loader.DTYPE_ALIASES."""
    return str(dtype).replace("torch.", "")


@dataclass
class GenerationConfig:
    """How one request is decoded.

    max_new_tokens  answer tokens to generate at most (--max-new-tokens)
    max_length      prompt + answer tokens at most; the KV cache is sized from it (--max-length)
    temperature     0 = greedy (exactly the target's argmax); > 0 = lossless speculative sampling
    top_p, top_k    nucleus / top-k warping of the target distribution when sampling (1.0 / 0 = off)
    seed            seeds the sampler (None = nondeterministic)
    profile_stages  synchronise the device around each stage so stage times are exact (CUDA only matters)
    """
    max_new_tokens: int = 256
    max_length: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    profile_stages: bool = True

    def __post_init__(self) -> None:
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ConfigError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not isinstance(self.max_length, int) or self.max_length < 2:
            raise ConfigError(f"max_length must be an integer >= 2, got {self.max_length!r}")
        if not (0.0 <= self.temperature < float("inf")):  # also rejects NaN; tiny values act as greedy (sampling.py)
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
