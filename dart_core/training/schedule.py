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

    From ``calibrate_after`` steps on, ``plan`` re-fits the total at every step from the recent pace (``pace``:
    the mean of the last ``window`` steps) so that the run, final evaluation and save included (``reserve_s``),
    ends within ``budget_s``. A slow start (a busy machine, cold caches) therefore does not fix a short plan for
    the whole run, and a slowdown later compresses the cosine decay instead of cutting it off. The plan shrinks
    as soon as the fit is smaller (the budget holds), grows only when the fit is larger by more than
    ``tolerance`` (timing noise does not wiggle the learning rate), and never passes ``ceiling`` (the plan of
    ``--epochs`` or ``--max-steps``).
    """
    budget_s: float | None
    reserve_s: float = 120.0
    calibrate_after: int = 3
    window: int = 32
    tolerance: float = 0.02

    def pace(self, step_times: list[float]) -> float:
        """Seconds per step lately: the mean of the last ``window`` steps, the first step of a process (start-up
        work) left out when there are others."""
        times = step_times[1:] if len(step_times) > 1 else step_times
        recent = times[-self.window:]
        return sum(recent) / len(recent) if recent else 0.0

    def plan(self, total_steps: int, ceiling: int, step: int, elapsed_s: float, step_s: float) -> int:
        if self.budget_s is None or step < self.calibrate_after or step_s <= 0:
            return total_steps
        left = self.budget_s - self.reserve_s - elapsed_s
        fit = max(step, min(ceiling, step + max(0, int(left / step_s))))
        if fit < total_steps or fit > total_steps * (1 + self.tolerance):
            return fit
        return total_steps

    def over(self, elapsed_s: float) -> bool:
        return self.budget_s is not None and elapsed_s >= self.budget_s - self.reserve_s
