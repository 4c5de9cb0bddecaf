"""A preallocated KV cache that HF decoder layers write into, with tree compaction.

Each layer owns one buffer ``[1, kv_heads, capacity, head_dim]`` for keys and one for
values, allocated once per request. A forward over ``q`` new positions writes them at
``[length, length + q)`` and attends over the view ``[0, length + q)``: no
concatenation, no reallocation. After a tree verification the cache holds the
committed prefix followed by every tree node; ``commit(nodes)`` copies the accepted
nodes' K/V into contiguous slots right after the prefix and drops the rest, so a
rejected branch costs only bookkeeping (its slots are overwritten next step).
"""
from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, DynamicLayer


class CacheFullError(RuntimeError):
    """A forward would write past the preallocated cache."""


class PreallocatedLayer(DynamicLayer):
    """One decoder layer's K/V in a fixed buffer; ``length`` counts the valid slots."""

    def __init__(self, capacity: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.capacity = capacity
        shape = (1, kv_heads, capacity, head_dim)
        self.key_buffer = torch.zeros(shape, dtype=dtype, device=device)
        self.value_buffer = torch.zeros(shape, dtype=dtype, device=device)
        self.device = device
        self.length = 0
        self.keys = self.key_buffer[:, :, :0]
        self.values = self.value_buffer[:, :, :0]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers exist from the start
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        q = key_states.shape[-2]
        end = self.length + q
        if end > self.capacity:
            raise CacheFullError(f"KV cache holds {self.capacity} positions; writing {q} after {self.length} "
                                 "would overflow it (raise max_length)")
        self.key_buffer[:, :, self.length:end].copy_(key_states)
        self.value_buffer[:, :, self.length:end].copy_(value_states)
        self.length = end
        self.keys = self.key_buffer[:, :, :end]
        self.values = self.value_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def truncate(self, length: int) -> None:
        # Only the count changes: the next update() rebuilds the views (keys/values), so a
        # rollback costs no tensor work (this runs for every layer on every step).
        self.length = length

    def reset(self) -> None:
        self.truncate(0)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:  # HF's legacy convention: a positive value is the new length
            self.truncate(tokens_to_remove)
        else:
            self.truncate(self.length + tokens_to_remove)


class PreallocatedCache(Cache):
    """HF ``Cache`` over :class:`PreallocatedLayer` s, plus the tree-commit operation."""

    def __init__(self, num_layers: int, capacity: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        device = torch.device(device)
        super().__init__(layers=[PreallocatedLayer(capacity, kv_heads, head_dim, dtype, device)
                                 for _ in range(num_layers)])
        self.capacity = capacity
        # The buffers bound for the native decoder (``_native.DecoderCache``), set by the lean CPU forward on its
        # first use of this cache; commit() then moves slots in one native call.
        self.native = None

    @property
    def length(self) -> int:
        return self.layers[0].length

    @property
    def key_dtype(self) -> torch.dtype:
        return self.layers[0].key_buffer.dtype

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)

    def set_length(self, length: int) -> None:
        """After a caller wrote K/V of slots ``[length_before, length)`` into the buffers directly."""
        if not 0 <= length <= self.capacity:
            raise CacheFullError(f"KV cache holds {self.capacity} positions, cannot mark {length} as valid")
        for layer in self.layers:
            layer.length = length

    def commit(self, prefix_length: int, kept_offsets: Sequence[int] | torch.Tensor) -> None:
        """Keep only slots ``prefix_length + kept_offsets`` after the prefix, made contiguous.

        ``kept_offsets`` are increasing tree-node indices (the accepted path, root first).
        Slots already in place (the common prefix of the path 0, 1, 2, ...) are not copied.
        """
        # Paths are short (a few nodes): plain Python is cheaper here than tensor ops.
        offsets = [int(o) for o in kept_offsets]
        n = len(offsets)
        if any(b <= a for a, b in zip(offsets, offsets[1:])):
            raise ValueError("kept_offsets must be strictly increasing")
        in_place = 0
        while in_place < n and offsets[in_place] == in_place:
            in_place += 1
        if in_place < n and self.native is not None:   # 2 x layers x K/V heads row copies, one call
            self.native.keep_rows(prefix_length, offsets[in_place:], in_place)
        elif in_place < n:
            src = torch.tensor(offsets[in_place:], dtype=torch.long, device=self.layers[0].device) + prefix_length
            dst = slice(prefix_length + in_place, prefix_length + n)
            for layer in self.layers:
                # index_select makes a copy first, so overlapping source and destination are safe.
                layer.key_buffer[:, :, dst] = layer.key_buffer.index_select(2, src)
                layer.value_buffer[:, :, dst] = layer.value_buffer.index_select(2, src)
        self.truncate(prefix_length + n)
