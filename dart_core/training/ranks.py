"""The ranks of a ``torchrun`` run and the few collectives the trainers and the feature pass need.

Without torchrun (no WORLD_SIZE) there is one rank and every collective is a no-op. With it, the process
group is gloo when the run's device is the CPU and NCCL when it is a GPU (chosen from the device the run
resolved, not from whether a GPU exists: ``--device cpu`` on a GPU node is a gloo run).

A collective that fails because another rank is gone (killed, crashed, out of memory) raises
:class:`RankLost`, so the trainer can checkpoint the last finished step before it stops. On gloo the
failure is seen at once (the peer's socket closes); NCCL waits in the GPU stream until its watchdog or
torchrun ends the process, so there the last periodic checkpoint is what a resume starts from.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping

import torch


class RankLost(RuntimeError):
    """A collective failed: another rank of the run stopped."""


class Ranks:
    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.world = int(env.get("WORLD_SIZE", "1"))
        self.rank = int(env.get("RANK", "0"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        self.dist = None
        self._owns_group = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    def start(self, device: torch.device) -> "Ranks":
        """Join the process group (gloo for a CPU run, NCCL for a GPU run); the caller has set the device."""
        if not self.enabled or self.dist is not None:
            return self
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            self._owns_group = True
        self.dist = dist
        return self

    def close(self) -> None:
        """Leave the process group this object joined (torch warns at exit about one left open)."""
        if self._owns_group and self.dist is not None and self.dist.is_initialized():
            self.dist.destroy_process_group()
        self.dist, self._owns_group = None, False

    def _run(self, op, *args) -> None:
        try:
            op(*args)
        except RuntimeError as exc:   # DistBackendError is one; gloo raises a plain RuntimeError
            raise RankLost(f"rank {self.rank} of {self.world}: a collective failed ({str(exc).splitlines()[0]})") \
                from exc

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients over the ranks, in one collective. A rank whose share of the batch gave no gradient
        to a parameter (no sequences, or none with a label) sends zeros; a parameter no rank has a gradient for
        keeps ``grad=None``, as in a one-rank run (AdamW skips it instead of stepping on its momentum)."""
        if not self.enabled:
            return
        params = list(params)
        if not params:
            return
        ref = params[0]
        has = torch.tensor([p.grad is not None for p in params], dtype=ref.dtype, device=ref.device)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                         + [has])
        self._run(self.dist.all_reduce, flat)
        offset = 0
        for p, got in zip(params, flat[-len(params):].tolist()):
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p) if got > 0 else None
            offset += n

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` summed over the ranks (in place; returned)."""
        if self.enabled:
            self._run(self.dist.all_reduce, values)
        return values

    def broadcast_int(self, value: int, device) -> int:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.long, device=device)
        self._run(self.dist.broadcast, t, 0)
        return int(t.item())

    def broadcast_params(self, params: Iterable[torch.Tensor]) -> None:
        """Rank 0's values into every rank's ``params``: the ranks start from one head whatever their setup did."""
        if not self.enabled:
            return
        with torch.no_grad():
            for p in params:
                self._run(self.dist.broadcast, p.data, 0)

    def barrier(self) -> None:
        if self.enabled:
            self._run(self.dist.barrier)
