"""Prefix-shared masked DART training (docs/ARCHITECTURE.md section 4; the original repository ships none).

Per sequence x_0..x_{T-1} (prompt of P tokens + the target's own answer):

1. one target forward (no grad) gives aux features [T, 3H] and the target's next-token
   distributions over the draft vocabulary (``features.compute_features``);
2. the head runs once over the n = T-1 real positions (feature i paired with token i+1) plus,
   for each of S prefixes p (the root x_{p+1} is an answer token: P-1 <= p <= T-3), D mask
   slots at positions p+1..p+D. Each prefix's slots attend to real positions <= p and causally
   to each other, never to another block (``BlockLayout``): SDPA with a dense boolean block mask
   over a sample of prefixes on CPU, torch ``flex_attention`` with a block mask on GPU;
3. block s predicts x_{p+2+t} at level t = 0..D (row 0 = the real position p); the loss is the
   cross-entropy to the target distribution renormalised over the draft vocabulary, weighted
   gamma**t (future position t+1 gets gamma**t), positions whose target argmax lies outside the
   draft vocabulary (or past the end) masked.

The run itself (AdamW, linear warmup + cosine decay, gradient clipping, bf16 autocast where the
hardware has it, checkpoints every ``checkpoint_minutes`` (atomic, resumable with ``--resume``), a time budget that
shrinks the schedule to end on time, and a final evaluation (hit@1 / hit@10 per future position
on held-out rows) is ``runner.run_training``, shared with the EAGLE-3 trainer. Multi-GPU:
``torchrun --nproc-per-node N -m dart_core.train dart ...`` splits each batch across ranks and
all-reduces gradients.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..models.heads.dart import DartHead, load_dart_head, new_head_for_target, save_dart_head
from .data import DistillRow
from .features import SequenceFeatures, compute_features
# Shared with the EAGLE-3 trainer; re-exported here (the names this module always had).
from .checkpoint import STATE_FILE  # noqa: F401
from .method import Runtime, TrainMethod
from .model_card import SOURCE_LICENCES, display_target, lr_restarts, write_model_card  # noqa: F401
from .run_config import BaseTrainConfig, TrainError  # noqa: F401
from .runner import train
from .stats import LevelStats, level_stats  # noqa: F401

logger = logging.getLogger(__name__)


@dataclass
class DartTrainConfig(BaseTrainConfig):
    """Every knob of a DART training run (the CLI flags, one to one); the shared ones are
    :class:`~dart_core.training.runner.BaseTrainConfig`'s.

    prefixes      prefixes (mask blocks) per sequence: 0 = all; None = auto (all on GPU, 64 on CPU)
    attention     "sdpa" (dense block mask), "flex" (flex_attention; GPU), "auto"
    """
    gamma: float = 0.6
    draft_length: int = 8
    prefixes: int | None = None
    eval_prefixes: int = 128
    attention: str = "auto"

    def validate(self) -> None:
        super().validate()
        if self.draft_length < 1:
            raise self.bad("draft_length", "must be >= 1", self.draft_length)
        if self.prefixes is not None and self.prefixes < 0:
            raise self.bad("prefixes", "must be >= 0 (0 = all)", self.prefixes)
        if self.attention not in ("auto", "sdpa", "flex"):
            raise self.bad("attention", "must be auto, sdpa or flex", self.attention)


# ---------------------------------------------------------------------------------------------- the loss
def valid_prefix_range(feats: SequenceFeatures) -> tuple[int, int]:
    """[lo, hi) of prefix ends p whose root x_{p+1} is an answer token and level 0 has a label."""
    return feats.prompt_len - 1, feats.length - 2


def sample_prefixes(feats: SequenceFeatures, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``count`` distinct prefix ends (0 = all), sorted."""
    lo, hi = valid_prefix_range(feats)
    n = hi - lo
    if n <= 0:
        return torch.empty(0, dtype=torch.long)
    if count <= 0 or count >= n:
        return torch.arange(lo, hi)
    return torch.randperm(n, generator=generator)[:count].sort().values + lo


def dart_loss(head: DartHead, feats: SequenceFeatures, prefix_ends: torch.Tensor, gamma: float,
              t2d_index: torch.Tensor, attention: str = "sdpa", autocast: bool = False,
              with_stats: bool = True) -> tuple[torch.Tensor, LevelStats | None]:
    """Weighted soft cross-entropy of one sequence over the given prefixes (see the module docstring).

    t2d_index [V]: draft id of each target id, -1 outside the draft vocabulary.
    Returns (loss, per-level stats); the loss is sum(w*valid*ce) / sum(w*valid).
    """
    D = head.config.draft_length
    dev = head.fc.weight.device
    pe = prefix_ends.to(dev)
    n = feats.length - 1
    aux = feats.aux[:n].to(head.fc.weight.dtype)
    next_ids = feats.ids[1:]
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        logits = head.forward_blocks(aux, next_ids, pe, attention=attention)     # [S, D+1, V_d]
    logits = logits.float()
    t = torch.arange(D + 1, device=dev)
    r = pe[:, None] + 1 + t[None, :] - feats.prompt_len                         # row into feats.logits
    R = feats.logits.shape[0]
    in_range = r < R
    rc = r.clamp(max=max(R - 1, 0))
    labels = t2d_index[feats.argmax[rc]]                                         # [S, D+1] draft ids
    valid = in_range & (labels >= 0)
    target_logp = torch.log_softmax(feats.logits[rc], dim=-1)                    # [S, D+1, V_d]
    logp = torch.log_softmax(logits, dim=-1)
    ce = -(target_logp.exp() * logp).sum(-1)                                     # [S, D+1]
    w = (gamma ** t.float())[None, :] * valid.float()
    loss = (ce * w).sum() / w.sum().clamp(min=1e-8)
    stats = level_stats(logits, labels, valid, in_range, ce) if with_stats else None
    return loss, stats


# ---------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_head(head: DartHead, target, rows: Sequence[DistillRow], *, gamma: float, prefixes: int = 128,
                  attention: str = "sdpa", argmax_mode: str = "full", autocast: bool = False, seed: int = 0,
                  progress: bool = False, features: Callable | None = None) -> dict:
    """hit@1 / hit@10 / cross-entropy per future position on ``rows`` (held-out), plus the weighted loss.
    ``features(row, draft_ids)`` supplies the target features (default: the target run on the fly)."""
    from tqdm.auto import tqdm

    was_training = head.training
    head.eval()
    t2d_index = head.target_to_draft()
    D = head.config.draft_length
    total = LevelStats.zeros(D + 1)
    losses, weights = 0.0, 0.0
    g = torch.Generator().manual_seed(seed)
    for row in tqdm(rows, desc="eval", unit="row", disable=not progress, file=sys.stderr, dynamic_ncols=True):
        feats = (features(row, head.draft_ids) if features is not None else
                 compute_features(target, row.ids, len(row.prompt_ids), head.draft_ids, argmax_mode))
        pe = sample_prefixes(feats, prefixes, g)
        if pe.numel() == 0:
            continue
        loss, st = dart_loss(head, feats, pe, gamma, t2d_index, attention=attention, autocast=autocast)
        total.add(st)
        n = float(st.count.sum())
        losses += float(loss.detach()) * n
        weights += n
    head.train(was_training)
    out = total.summary()
    out.update(rows=len(rows), loss=round(losses / max(weights, 1.0), 4), prefixes_per_row=prefixes,
               positions=[f"t+{i + 1}" for i in range(D + 1)])
    return out



# ---------------------------------------------------------------------------------------------- the run
class DartMethod(TrainMethod):
    name = "dart"
    bar_desc = "train dart"
    cfg: DartTrainConfig

    @property
    def levels(self) -> int:
        return self.cfg.draft_length + 1

    def resolve(self, device: torch.device) -> dict:
        cfg = self.cfg
        attention = cfg.attention if cfg.attention != "auto" else ("flex" if device.type == "cuda" else "sdpa")
        if attention == "flex" and device.type != "cuda":
            raise TrainError("--attention flex needs a GPU (flex_attention has no backward on CPU); "
                             "use --attention sdpa")
        prefixes = cfg.prefixes if cfg.prefixes is not None else (0 if device.type == "cuda" else 64)
        return {"attention": attention, "prefixes_per_seq": prefixes}

    def new_head(self, target, draft_ids: torch.Tensor) -> DartHead:
        return new_head_for_target(target, draft_ids, self.cfg.draft_length, seed=self.cfg.seed,
                                   init_lm_head_from_target=self.cfg.init_lm_head_from_target,
                                   init_layer_from_target=self.cfg.init_layer_from_target)

    def read_head(self, path_or_id: str | Path) -> DartHead:
        return load_dart_head(path_or_id, None)

    def check_start_head(self, head: DartHead) -> None:
        # Every mask slot shares one input vector (midlayer.mask_rep) and RoPE gives the slots their places, so
        # no weight depends on the draft length: a head fine-tunes to another --draft-length as it is.
        head.config.draft_length = self.cfg.draft_length

    def save_head(self, head: DartHead, out: Path, dtype: torch.dtype | None) -> None:
        save_dart_head(head, out, dtype=dtype)

    def sequence_loss(self, head: DartHead, feats: SequenceFeatures, t2d_index: torch.Tensor, rt: Runtime,
                      generator: torch.Generator):
        pe = sample_prefixes(feats, rt.extra["prefixes_per_seq"], generator)
        if pe.numel() == 0:
            return None
        return dart_loss(head, feats, pe, self.cfg.gamma, t2d_index, attention=rt.extra["attention"],
                         autocast=rt.autocast)

    def evaluate(self, head: DartHead, target, rows: Sequence[DistillRow], rt: Runtime) -> dict:
        cfg = self.cfg
        return evaluate_head(head, target, rows, gamma=cfg.gamma, prefixes=cfg.eval_prefixes,
                             attention=rt.extra["attention"], argmax_mode=rt.argmax, autocast=rt.autocast,
                             seed=cfg.seed, progress=cfg.progress, features=rt.features)


DartTrainConfig.method = DartMethod
#: Run (or resume) a DART training run (``runner.train``: the config's class picks the method).
train_dart = train
