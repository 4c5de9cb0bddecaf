"""The knobs every head trainer shares (``BaseTrainConfig``) and the error that names a wrong one (``TrainError``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar


class TrainError(ValueError):
    """A training flag or the output directory is wrong; the message names the flag to change."""


@dataclass
class BaseTrainConfig:
    """The knobs every head trainer shares (CLI flags one to one; see ``dart_core.train``).

    argmax           target argmax for masking: "full", "data" (the corpus token), "auto" (full on GPU, data on CPU)
    time_budget_min  wall time of the whole run (training + final evaluation); the schedule is fitted to it
    compare_with     another head's run directory (e.g. the DART run for an EAGLE-3 head): the model card
                     sets both budgets side by side
    init_head        a head of this method for this target (directory or Hub id): the run starts from its
                     weights and its draft vocabulary (fine-tuning, e.g. from the shipped assets/dart/...)
    init_layer_from_target  start a new head's decoder layer from the target's last layer
    rebuild_vocab    with init_head: build the draft vocabulary from this corpus (--draft-vocab-size most
                     frequent response tokens) instead of keeping the starting head's; kept tokens keep their
                     LM-head rows, new ones start from the target's
    """
    method: ClassVar[type]   # the TrainMethod subclass (training/method.py), set by each trainer module
    data: str
    out: str
    target: str | None = None
    resume: bool = False
    max_steps: int | None = None
    time_budget_min: float | None = None
    epochs: float = 3.0
    batch_seqs: int = 8
    lr: float = 5e-4
    min_lr_ratio: float = 0.05
    warmup_frac: float = 0.03
    weight_decay: float = 0.0
    clip: float = 0.5
    gamma: float = 0.6
    draft_vocab_size: int = 8192
    max_seq_len: int = 1024
    train_rows: int | None = None
    heldout_permille: int = 20
    eval_rows: int = 64
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    argmax: str = "auto"
    autocast: bool = True
    checkpoint_minutes: float = 10.0
    seed: int = 0
    save_dtype: str = "bfloat16"
    init_lm_head_from_target: bool = True
    init_head: str | None = None
    init_layer_from_target: bool = False
    rebuild_vocab: bool = False
    progress: bool = True
    compare_with: str | None = None
    features: str = "auto"

    @staticmethod
    def bad(flag: str, rule: str, value: Any) -> TrainError:
        return TrainError(f"--{flag.replace('_', '-')} {rule}, got {value!r}")

    def validate(self) -> None:
        bad = self.bad
        for name in ("batch_seqs", "draft_vocab_size", "max_seq_len"):
            if int(getattr(self, name)) < 1:
                raise bad(name, "must be >= 1", getattr(self, name))
        if self.max_steps is not None and self.max_steps < 1:
            raise bad("max_steps", "must be >= 1", self.max_steps)
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise bad("time_budget_min", "must be > 0 minutes", self.time_budget_min)
        if not 0 < self.checkpoint_minutes <= 10:
            raise bad("checkpoint_minutes", "must be in (0, 10]: checkpoints come at least every 10 minutes",
                      self.checkpoint_minutes)
        if not self.features:
            raise bad("features", "must be auto, none or a feature-cache directory", self.features)
        if not (self.epochs > 0):
            raise bad("epochs", "must be > 0", self.epochs)
        if not (self.lr > 0):
            raise bad("lr", "must be > 0", self.lr)
        if not 0 < self.gamma <= 1:
            raise bad("gamma", "must be in (0, 1]", self.gamma)
        if not (self.clip > 0):
            raise bad("clip", "must be > 0", self.clip)
        if self.argmax not in ("auto", "full", "data"):
            raise bad("argmax", "must be auto, full or data", self.argmax)
        if not 0 <= self.heldout_permille < 1000:
            raise bad("heldout_permille", "must be in [0, 1000)", self.heldout_permille)
        if self.train_rows is not None and self.train_rows < 1:
            raise bad("train_rows", "must be >= 1", self.train_rows)
        if self.eval_rows < 0:
            raise bad("eval_rows", "must be >= 0", self.eval_rows)
        if self.compare_with is not None and not (Path(self.compare_with) / "training_summary.json").is_file():
            raise bad("compare_with", "must be a finished run directory (with training_summary.json)",
                      self.compare_with)
        if self.rebuild_vocab and self.init_head is None:
            raise TrainError("--rebuild-vocab rebuilds the draft vocabulary of an --init-head head; a new head "
                             "builds its own from the corpus already: drop --rebuild-vocab or give --init-head")
        if self.init_head is not None and self.init_layer_from_target:
            raise TrainError("--init-layer-from-target cannot be combined with --init-head: the run starts from "
                             "that head's own layer; drop one of them")
