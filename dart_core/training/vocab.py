"""The draft vocabulary: the most frequent target tokens of the training responses.

A head predicts over ``V_d`` draft ids; ``d2t[d]`` is the offset to its target id
(``target = d + d2t[d]``) and ``t2d`` marks the target ids in the draft vocabulary (the
fvliang/DART and EAGLE-3 layout). Draft ids are the chosen target ids in ascending order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch


@dataclass
class DraftVocab:
    draft_ids: torch.Tensor      # [V_d] int64, ascending target ids
    d2t: torch.Tensor            # [V_d] int64 offsets
    t2d: torch.Tensor            # [V] bool
    coverage: float              # share of counted response tokens inside the draft vocabulary
    counted_tokens: int

    @property
    def size(self) -> int:
        return int(self.draft_ids.numel())


def build_draft_vocab(sequences: Iterable[Sequence[int]], vocab_size: int, draft_vocab_size: int = 8192,
                      always_include: Sequence[int] = ()) -> DraftVocab:
    """Count tokens of ``sequences`` (the training responses) and keep the ``draft_vocab_size`` most frequent
    (ties: lower id first); ``always_include`` ids (e.g. EOS) are kept regardless. When the target vocabulary
    is not larger than ``draft_vocab_size`` the draft vocabulary is the full vocabulary."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for seq in sequences:
        arr = np.asarray(seq, dtype=np.int64)
        if arr.size:
            counts += np.bincount(arr, minlength=vocab_size)[:vocab_size]
    total = int(counts.sum())
    k = min(int(draft_vocab_size), vocab_size)
    if k >= vocab_size:
        ids = np.arange(vocab_size)
    else:
        boosted = counts.astype(np.float64)
        for t in always_include:
            if 0 <= int(t) < vocab_size:
                boosted[int(t)] = np.inf
        order = np.lexsort((np.arange(vocab_size), -boosted))   # by count desc, then id asc
        ids = np.sort(order[:k])
    coverage = float(counts[ids].sum() / total) if total else 1.0
    draft_ids = torch.from_numpy(ids.astype(np.int64))
    d2t = draft_ids - torch.arange(len(ids), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return DraftVocab(draft_ids=draft_ids, d2t=d2t, t2d=t2d, coverage=coverage, counted_tokens=total)
