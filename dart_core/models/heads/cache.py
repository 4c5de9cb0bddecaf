"""The draft heads' own KV cache (one class for DART and EAGLE-3)."""
from __future__ import annotations

import torch


class HeadCache:
    """A head's KV cache: keys/values [kv_heads, capacity, head_dim].

    ``length`` counts real (committed) positions. A drafting step writes scratch slots after them
    (DART's mask slots, EAGLE-3's tree nodes) which ``length`` does not count, so the next step
    overwrites them. Grows by doubling, keeping every slot written so far (scratch slots included:
    EAGLE-3 reads a round's earlier tree slots after growing), so it never overflows.
    """

    def __init__(self, config, capacity: int, dtype: torch.dtype, device: torch.device):
        self.config, self.dtype, self.device = config, dtype, device
        shape = (config.num_key_value_heads, max(int(capacity), 16), config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return int(self.k.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values (all capacity, used or not)."""
        return int(self.k.nbytes) + int(self.v.nbytes)

    def reset(self) -> None:
        self.length = 0

    def reserve(self, total: int) -> None:
        """Make room for ``total`` slots, keeping every slot written so far."""
        if total <= self.capacity:
            return
        cap = self.capacity
        while cap < total:
            cap *= 2
        for name in ("k", "v"):
            old = getattr(self, name)
            new = torch.zeros((old.shape[0], cap, old.shape[2]), dtype=old.dtype, device=old.device)
            new[:, : old.shape[1]] = old
            setattr(self, name, new)
