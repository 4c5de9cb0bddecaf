"""Optimiser, learning-rate schedule and time-budget planning shared by the head trainers."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def make_optimizer(params, lr: float, weight_decay: float = 0.0, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, betas=betas,
                             weight_decay=weight_decay)


def cosine_lr(step: int, total_steps: int, warmup_steps: int, peak_lr: float, min_ratio: float = 0.0) -> float:
    """Linear warmup to ``peak_lr`` over ``warmup_steps``, then cosine decay to ``min_ratio * peak_lr``
    at ``total_steps`` (``step`` counts optimizer steps already taken, from 0)."""
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return peak_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


@dataclass
class BudgetPlanner:
    """Fits the number of optimizer steps to a wall-time budget.

    After ``calibrate_after`` steps the mean seconds per step is known; ``plan`` returns the
    total steps that end the run (final evaluation and save included, ``reserve_s``) within
    ``budget_s`` of training time. The plan only ever shrinks, so the cosine schedule ends
    on time instead of being cut off mid-decay.
    """
    budget_s: float | None
    reserve_s: float = 120.0
    calibrate_after: int = 3

    def plan(self, total_steps: int, step: int, elapsed_s: float, mean_step_s: float) -> int:
        if self.budget_s is None or step < self.calibrate_after or mean_step_s <= 0:
            return total_steps
        left = self.budget_s - self.reserve_s - elapsed_s
        fit = step + max(0, int(left / mean_step_s))
        return max(step, min(total_steps, fit))

    def over(self, elapsed_s: float) -> bool:
        return self.budget_s is not None and elapsed_s >= self.budget_s - self.reserve_s
