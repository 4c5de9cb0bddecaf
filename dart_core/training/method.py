"""What differs between head trainers (``TrainMethod``: make, load, save and evaluate a head, the loss of one
sequence) and what a run resolved from the flags and the hardware (``Runtime``); ``runner.run_training`` does
the rest for every method."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from .data import DistillRow
from .features import SequenceFeatures
from .run_config import BaseTrainConfig, TrainError
from .stats import LevelStats


@dataclass
class Runtime:
    """What the run resolved from the flags and the hardware."""
    device: torch.device
    dtype: torch.dtype
    argmax: str
    autocast: bool
    extra: dict            # method-specific settings recorded in run_info (e.g. attention, prefixes_per_seq)
    # (row, draft ids) -> SequenceFeatures: the feature cache, or the target run on the fly (set once loaded)
    features: Callable[[DistillRow, torch.Tensor], SequenceFeatures] | None = None


class TrainMethod:
    """What differs between head trainers. ``levels``: predictions per position (DART: D+1 future
    positions; EAGLE-3: the unrolled steps)."""
    name = "head"
    bar_desc = "train"

    def __init__(self, cfg: BaseTrainConfig):
        self.cfg = cfg

    @property
    def levels(self) -> int:
        raise NotImplementedError

    def resolve(self, device: torch.device) -> dict:
        """Method-specific runtime settings (may raise TrainError for flags the device cannot honour)."""
        return {}

    def new_head(self, target, draft_ids: torch.Tensor):
        """A new head for ``target`` over ``draft_ids`` (seeded; lm_head / layer from the target as the flags say)."""
        raise NotImplementedError

    def read_head(self, path_or_id: str | Path):
        """This method's head from a directory or Hub id (strict load, no target)."""
        raise NotImplementedError

    def check_start_head(self, head) -> None:
        """Refuse (TrainError) an --init-head whose shape the run's flags contradict."""

    def load_head(self, path_or_id: str | Path, target, device: torch.device, source: str):
        """A saved head (a checkpoint's, or --init-head's), checked against ``target``, float32 on ``device``,
        embedding attached."""
        from ..models.heads.files import check_head_matches_target

        head = self.read_head(path_or_id)
        check_head_matches_target(head.config, target, source=source, train_command=self.name)
        head.to(device=device, dtype=torch.float32)
        head.attach_embedding(target.model.get_input_embeddings().weight)
        return head

    def start_head(self, path_or_id: str, target, device: torch.device):
        """The --init-head head to fine-tune, with a TrainError naming the flag when it cannot be used."""
        from ..models.heads.files import HeadError, HeadTargetMismatch

        try:
            head = self.load_head(path_or_id, target, device, source=f"the --init-head head {path_or_id}")
        except HeadTargetMismatch as exc:
            raise TrainError(f"--init-head {path_or_id} was made for another target, so it cannot start a run for "
                             f"{target.name}: {exc}. Drop --init-head to start a new head") from None
        except HeadError as exc:
            raise TrainError(f"--init-head {path_or_id} is not a usable {self.name} head: {exc}") from None
        self.check_start_head(head)
        return head

    def save_head(self, head, out: Path, dtype: torch.dtype | None) -> None:
        raise NotImplementedError

    def sequence_loss(self, head, feats: SequenceFeatures, t2d_index: torch.Tensor, rt: Runtime,
                      generator: torch.Generator) -> tuple[torch.Tensor, LevelStats] | None:
        """Loss + stats of one training sequence (None: nothing to learn from it)."""
        raise NotImplementedError

    def evaluate(self, head, target, rows: Sequence[DistillRow], rt: Runtime) -> dict:
        raise NotImplementedError
