"""Per-level statistics of a head's predictions (hit@1, hit@10, cross-entropy, the top-1 chain), summed over
sequences and ranks and written to the log and eval.json."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class LevelStats:
    """Per level t (future position t+1): valid predictions, hits in top-1 / top-10, loss sum."""
    count: np.ndarray
    hit1: np.ndarray
    hit10: np.ndarray
    ce_sum: np.ndarray
    chain_sum: float = 0.0     # sum over prefixes of the top-1 chain length (levels matched in a row)
    prefixes: int = 0

    @classmethod
    def zeros(cls, levels: int) -> "LevelStats":
        z = np.zeros(levels, dtype=np.float64)
        return cls(z.copy(), z.copy(), z.copy(), z.copy())

    def add(self, other: "LevelStats") -> None:
        self.count += other.count; self.hit1 += other.hit1; self.hit10 += other.hit10
        self.ce_sum += other.ce_sum; self.chain_sum += other.chain_sum; self.prefixes += other.prefixes

    def to_vector(self, device=None) -> torch.Tensor:
        """The stats as one float64 vector (to sum them over ranks in one collective)."""
        v = np.concatenate([self.count, self.hit1, self.hit10, self.ce_sum, [self.chain_sum, self.prefixes]])
        return torch.from_numpy(v).to(device)

    @classmethod
    def from_vector(cls, v: torch.Tensor, levels: int) -> "LevelStats":
        a = v.double().cpu().numpy()
        L = levels
        return cls(a[:L].copy(), a[L:2 * L].copy(), a[2 * L:3 * L].copy(), a[3 * L:4 * L].copy(),
                   chain_sum=float(a[4 * L]), prefixes=int(a[4 * L + 1]))

    def summary(self) -> dict:
        c = np.maximum(self.count, 1)
        return {"hit@1": (self.hit1 / c).round(4).tolist(), "hit@10": (self.hit10 / c).round(4).tolist(),
                "ce": (self.ce_sum / c).round(4).tolist(), "count": self.count.astype(int).tolist(),
                "mean_top1_chain": round(self.chain_sum / max(self.prefixes, 1), 4)}


@torch.no_grad()
def level_stats(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, in_range: torch.Tensor,
                ce: torch.Tensor) -> LevelStats:
    """Stats of [S, L] predictions (S prefixes / anchors, L levels): logits [S, L, V_d], labels [S, L] draft ids,
    valid [S, L] (a label inside the draft vocabulary), in_range [S, L] (a label exists), ce [S, L]."""
    return level_stats_from_top(logits.topk(min(10, logits.shape[-1]), dim=-1).indices, labels, valid, in_range, ce)


@torch.no_grad()
def level_stats_from_top(top: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor, in_range: torch.Tensor,
                         ce: torch.Tensor) -> LevelStats:
    """:func:`level_stats` from the top-10 draft ids [S, L, 10] (best first) instead of the logits."""
    hit1 = (top[..., 0] == labels) & valid
    hit10 = (top == labels[..., None]).any(-1) & valid
    chain = torch.cumprod((hit1 | ~in_range).int(), dim=1) * in_range.int()
    return LevelStats(count=valid.sum(0).double().cpu().numpy(), hit1=hit1.sum(0).double().cpu().numpy(),
                      hit10=hit10.sum(0).double().cpu().numpy(),
                      ce_sum=(ce.detach() * valid).sum(0).double().cpu().numpy(),
                      chain_sum=float(chain.sum()), prefixes=int(labels.shape[0]))
