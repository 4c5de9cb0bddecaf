"""The run loop shared by the head trainers (``train dart``, ``train eagle3``).

A trainer supplies a :class:`TrainMethod` (how to make, load, save and evaluate its head and the
loss of one sequence); :func:`run_training` does the rest, identically for every head:

- load the target, the corpus (``data.load_distill_rows``, truncation, the stable held-out split,
  ``--train-rows``) and build the draft vocabulary (``vocab.build_draft_vocab``);
- AdamW with linear warm-up + cosine decay, gradient clipping, bf16 autocast where available;
- a wall-time budget that shrinks the schedule so the cosine ends on time (``BudgetPlanner``);
- atomic checkpoints every ``checkpoint_minutes`` and on Ctrl-C / SIGTERM; ``--resume`` continues
  them, and ``--resume --max-steps N`` extends a finished run;
- ``train_log.jsonl``, a progress bar, and at the end the held-out evaluation (``eval.json``), the
  head (``config.json`` + ``model.safetensors``), ``training_summary.json`` and the model card.

Multi-GPU (``torchrun``): each rank takes its share of every batch; gradients are all-reduced.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch

from ..config import dtype_name
from ..models.loader import DTYPE_ALIASES
from .checkpoint import find_checkpoint, save_checkpoint
from .data import DistillRow, corpus_stats, iterate_batches, load_distill_rows, split_rows, truncate
from .features import SequenceFeatures, compute_features
from .model_card import lr_restarts, model_card
from .schedule import BudgetPlanner, cosine_lr, make_optimizer, set_lr
from .vocab import build_draft_vocab

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"




class TrainError(ValueError):
    """A training flag or the output directory is wrong; the message names the flag to change."""


# ---------------------------------------------------------------------------------------------- config
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
    """
    method: ClassVar[type["TrainMethod"]]   # set by each trainer module for its config class
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
        if self.init_head is not None and self.init_layer_from_target:
            raise TrainError("--init-layer-from-target cannot be combined with --init-head: the run starts from "
                             "that head's own layer; drop one of them")


# ---------------------------------------------------------------------------------------------- statistics
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


# ---------------------------------------------------------------------------------------------- distributed
class _Dist:
    def __init__(self) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        if self.enabled:
            import torch.distributed as dist
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if not dist.is_initialized():
                dist.init_process_group(backend)
            self.dist = dist

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_reduce_grads(self, params) -> None:
        if not self.enabled:
            return
        for p in params:
            if p.grad is not None:
                self.dist.all_reduce(p.grad)

    def broadcast_int(self, value: int, device) -> int:
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.long, device=device)
        self.dist.broadcast(t, 0)
        return int(t.item())

    def barrier(self) -> None:
        if self.enabled:
            self.dist.barrier()


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"]); np.random.set_state(s["numpy"]); random.setstate(s["python"])


def _numpy_array_globals() -> list:
    """What a pickled numpy array needs (the numpy RNG state is one): its class, dtype and rebuild function.
    None of them runs code of the file's choosing; numpy 1.x files name the rebuild function numpy.core.*."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    numeric_dtypes = sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdg"}, key=lambda t: t.__name__)
    return [np.ndarray, np.dtype, *numeric_dtypes, multiarray._reconstruct,
            (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
            (multiarray._reconstruct, "numpy._core.multiarray._reconstruct")]


def load_trainer_state(path: Path) -> dict[str, Any]:
    """A checkpoint's trainer state, read as data only (``torch.load(weights_only=True)``): tensors, numbers,
    text, containers and numpy arrays. A run directory may come from someone else, and unpickling an arbitrary
    object can run any code, so a state holding anything else is refused with TrainError."""
    import pickle

    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.split("error:", 1)[-1].strip() for ln in str(exc).splitlines()]
        found = next((ln for ln in lines if "GLOBAL" in ln or "global" in ln or "Can only build" in ln), None)
        if found is None:   # not a pickle of objects at all: a damaged or foreign file
            why = next((ln for ln in lines if "Unsupported" in ln), type(exc).__name__)
            raise TrainError(f"cannot read the trainer state {path} ({why}); the checkpoint is damaged: choose "
                             "another --out to start over") from None
        raise TrainError(f"refusing to resume from {path}: the trainer state holds Python objects besides plain "
                         f"data (tensors, numbers, text, arrays), and loading them could run code ({found}). "
                         "Resume only runs written by dart_core.train; to start over, choose another --out") from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise TrainError(f"cannot read the trainer state {path} ({type(exc).__name__}: {exc}); the checkpoint is "
                         "damaged: choose another --out to start over") from None
    if not isinstance(state, dict) or "step" not in state:
        raise TrainError(f"{path} is not a dart_core trainer state (no step count); choose another --out")
    return state


def _save_dtype(name: str) -> torch.dtype | None:
    if name not in DTYPE_ALIASES:
        raise TrainError(f"--save-dtype must be one of {', '.join(DTYPE_ALIASES)}, got {name!r}")
    return DTYPE_ALIASES[name]


class _Interrupted(Exception):
    pass


# ---------------------------------------------------------------------------------------------- the method hooks
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



def feature_source(cfg: BaseTrainConfig, target, rt: Runtime) -> tuple[Callable, dict]:
    """Where the run's target features come from: the cache of ``--features DIR`` (refused when it was
    built for another target or corpus), the cache found by fingerprint (``auto``), or the target run
    on the fly (``none``, or ``auto`` with no cache). Cached features carry the full-vocabulary argmax."""
    from .feature_cache import FeatureCache, FeatureCacheError, find_cache

    if cfg.features == "none":
        cache = None
    elif cfg.features == "auto":
        cache = find_cache(target, cfg.data)
    else:
        try:
            cache = FeatureCache(cfg.features, target, cfg.data)
        except FeatureCacheError as exc:
            raise TrainError(f"--features {cfg.features}: {exc}") from None
    if cache is None:
        def on_the_fly(row: DistillRow, draft_ids: torch.Tensor) -> SequenceFeatures:
            return compute_features(target, row.ids, len(row.prompt_ids), draft_ids, rt.argmax)
        logger.info("target features: computed on the fly (no feature cache; build one with "
                    "`python -m dart_core.train features`)")
        return on_the_fly, {"source": "on the fly"}

    def cached(row: DistillRow, draft_ids: torch.Tensor) -> SequenceFeatures:
        return cache.features(row, draft_ids, device=rt.device, aux_dtype=target.dtype)
    logger.info("target features: cache %s (top-%d, %.4f of the mass kept)", cache.path, cache.top_k, cache.kept_mass)
    return cached, {"source": "cache", "path": str(cache.path), "fingerprint": cache.meta["fingerprint"][:16],
                    "top_k": cache.top_k, "kept_mass": round(cache.kept_mass, 5), "argmax": "full"}


def resolve_runtime(cfg: BaseTrainConfig, dist: _Dist, method: TrainMethod) -> Runtime:
    from ..models.loader import cpu_supports_bf16, resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    if dist.enabled and device.type == "cuda":
        device = torch.device(f"cuda:{dist.local_rank}")
        torch.cuda.set_device(device)
    dtype = resolve_dtype(cfg.dtype, device, inference=False)
    extra = method.resolve(device)
    argmax = cfg.argmax if cfg.argmax != "auto" else ("full" if device.type == "cuda" else "data")
    autocast = cfg.autocast and (device.type == "cuda" or cpu_supports_bf16())
    return Runtime(device=device, dtype=dtype, argmax=argmax, autocast=autocast, extra=extra)


# ---------------------------------------------------------------------------------------------- the run
def train(cfg: BaseTrainConfig) -> dict:
    """Run (or resume) the training run ``cfg`` describes (its class names the method: ``DartTrainConfig``,
    ``Eagle3TrainConfig``); returns the summary written to ``out/training_summary.json``."""
    return run_training(cfg, cfg.method(cfg))


def run_training(cfg: BaseTrainConfig, method: TrainMethod) -> dict:
    """Run (or resume) a training run; returns the summary written to ``out/training_summary.json``."""
    from tqdm.auto import tqdm

    from ..models.loader import load_target

    cfg.validate()
    save_dtype = _save_dtype(cfg.save_dtype)
    dist = _Dist()
    out = Path(cfg.out)
    ckpt_dir = out / "checkpoint"
    existing = find_checkpoint(ckpt_dir)
    if existing is not None and not cfg.resume:
        raise TrainError(f"{out} already holds a checkpoint ({existing}); pass --resume to continue it, or choose "
                         "another --out")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rt = resolve_runtime(cfg, dist, method)
    device = rt.device

    t_setup = time.perf_counter()
    target = load_target(cfg.target, dtype=rt.dtype, device=str(device))
    for p in target.model.parameters():
        p.requires_grad_(False)
    rows = load_distill_rows(cfg.data, vocab_size=target.vocab_size)
    rows = [truncate(r, cfg.max_seq_len) for r in rows]
    rows = [r for r in rows if len(r.response_ids) >= 2]
    train_rows, heldout = split_rows(rows, cfg.heldout_permille)
    vocab_rows = train_rows  # the draft vocabulary counts the whole training split, even with --train-rows
    if cfg.train_rows is not None and cfg.train_rows < len(train_rows):
        pick = np.random.default_rng([cfg.seed, 7]).permutation(len(train_rows))[: cfg.train_rows]
        train_rows = [train_rows[i] for i in sorted(pick.tolist())]
    eval_rows = heldout[: cfg.eval_rows]
    rt.features, features_info = feature_source(cfg, target, rt)
    if not train_rows:
        raise TrainError(f"no training rows left in {cfg.data} after the held-out split (--heldout-permille)")

    state: dict[str, Any] = {}
    if existing is not None:
        state = load_trainer_state(existing / STATE_FILE)
        if state.get("method", "dart") != method.name:
            raise TrainError(f"the checkpoint in {existing} is a {state.get('method', 'dart')} run, not {method.name}; "
                             f"resume it with `python -m dart_core.train {state.get('method', 'dart')} ...`, or "
                             "choose another --out")
        head = method.load_head(existing / "head", target, device, source=f"the checkpoint in {existing}")
        if state.get("data_rows") != len(train_rows):
            raise TrainError(f"the checkpoint was trained on {state.get('data_rows')} rows but --data/--train-rows "
                             f"now give {len(train_rows)}; resume with the same data flags")
        vocab_info = state["vocab"]
        logger.info("resuming from %s at step %d of %d", existing, state["step"], state["total_steps"])
    elif cfg.init_head:
        # Fine-tuning: the head's own weights and draft vocabulary (--draft-vocab-size does not apply).
        head = method.start_head(cfg.init_head, target, device)
        vocab_info = head_vocab_info(head, vocab_rows)
        logger.info("starting from %s: its draft vocabulary of %d tokens covers %.2f%% of %d training response "
                    "tokens", cfg.init_head, vocab_info["size"], 100 * vocab_info["coverage"],
                    vocab_info["counted_tokens"])
    else:
        vocab = build_draft_vocab((r.response_ids for r in vocab_rows), target.vocab_size, cfg.draft_vocab_size,
                                  always_include=target.eos_token_ids)
        vocab_info = {"size": vocab.size, "coverage": round(vocab.coverage, 5),
                      "counted_tokens": vocab.counted_tokens}
        logger.info("draft vocabulary: %d tokens cover %.2f%% of %d training response tokens", vocab.size,
                    100 * vocab.coverage, vocab.counted_tokens)
        head = method.new_head(target, vocab.draft_ids)
    head.train()
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = make_optimizer(params, cfg.lr, cfg.weight_decay)
    t2d_index = head.target_to_draft()

    planned = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(train_rows) / cfg.batch_seqs))
    if state:
        optimizer.load_state_dict(state["optimizer"])
        _set_rng_state(state["rng"])
        step, total_steps, elapsed0 = state["step"], state["total_steps"], state["elapsed_s"]
        epoch, cursor = state["epoch"], state["cursor"]
        history = state.get("history", [])
        if cfg.max_steps is not None:  # an explicit --max-steps on resume replaces the plan
            total_steps = max(step, cfg.max_steps)
    else:
        torch.manual_seed(cfg.seed)
        step, total_steps, elapsed0, epoch, cursor, history = 0, planned, 0.0, 0, 0, []
    budget = BudgetPlanner(cfg.time_budget_min * 60 if cfg.time_budget_min else None,
                           reserve_s=_eval_reserve_s(len(eval_rows)))
    ceiling = max(total_steps, planned)   # the budget may shorten the plan, never pass this
    budget_fitted = bool(state.get("budget_fitted", False))
    warmup = max(1, int(cfg.warmup_frac * total_steps))
    if state:
        warmup = state.get("warmup", warmup)

    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    if dist.main and state and log_path.is_file():
        # Steps logged after the checkpoint (a hard kill) are redone: drop them from the log.
        kept = [ln for ln in log_path.read_text(encoding="utf-8").splitlines() if _log_step(ln) <= step]
        log_path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
    run_info = {"method": method.name, "target": target.name, "data": str(cfg.data), "train_rows": len(train_rows),
                "train_tokens": corpus_stats(train_rows), "heldout_rows": len(heldout), "eval_rows": len(eval_rows),
                "device": str(device), "cpu": cpu_description(),
                "target_dtype": dtype_name(rt.dtype), **rt.extra,
                "argmax": features_info.get("argmax", rt.argmax), "autocast_bf16": rt.autocast,
                "features": features_info,
                "init": {"head": cfg.init_head, "layer_from_target": cfg.init_layer_from_target,
                         "lm_head_from_target": cfg.init_lm_head_from_target and not cfg.init_head},
                "threads": torch.get_num_threads(), "world_size": dist.world, "vocab": vocab_info,
                "config": asdict(cfg)}
    if dist.main:
        logger.info("run: %s", json.dumps({k: v for k, v in run_info.items() if k != "config"}))
        (out / "run_info.json").write_text(json.dumps(run_info, indent=1) + "\n", encoding="utf-8")
    logger.info("setup took %.1f s", time.perf_counter() - t_setup)

    def write_checkpoint(finished: bool = False) -> None:
        if not dist.main:
            return
        elapsed = elapsed0 + (time.perf_counter() - t_run)

        def write(tmp: Path) -> None:
            method.save_head(head, tmp / "head", None)
            torch.save({"step": step, "total_steps": total_steps, "warmup": warmup, "epoch": epoch, "cursor": cursor,
                        "elapsed_s": elapsed, "optimizer": optimizer.state_dict(), "rng": _rng_state(),
                        "data_rows": len(train_rows), "vocab": vocab_info, "history": history,
                        "budget_fitted": budget_fitted, "finished": finished, "method": method.name,
                        "config": asdict(cfg)},
                       tmp / STATE_FILE)
        save_checkpoint(ckpt_dir, write)
        logger.info("checkpoint at step %d -> %s", step, ckpt_dir)

    if state.get("finished") and step >= total_steps:  # a larger --max-steps extends a finished run
        logger.info("the run in %s already finished (step %d); nothing to do", out, step)
        summary_path = out / "training_summary.json"
        return json.loads(summary_path.read_text()) if summary_path.is_file() else {"finished": True}

    # SIGTERM (e.g. a job scheduler) becomes a clean stop with a checkpoint, like Ctrl-C.
    def on_term(signum, frame):
        raise _Interrupted()
    old_term = signal.signal(signal.SIGTERM, on_term) if dist.main else None

    t_run = time.perf_counter()
    last_ckpt = t_run
    step_times: list[float] = []
    batches = iterate_batches(len(train_rows), cfg.batch_seqs, cfg.seed, epoch, cursor)
    bar = tqdm(total=total_steps, initial=step, desc=method.bar_desc, unit="step",
               disable=not (cfg.progress and dist.main), file=sys.stderr, dynamic_ncols=True)
    interrupted = False
    try:
        while step < total_steps:
            t0 = time.perf_counter()
            epoch_b, cursor_b, idx = next(batches)
            lr = cosine_lr(step, total_steps, warmup, cfg.lr, cfg.min_lr_ratio)
            set_lr(optimizer, lr)
            optimizer.zero_grad(set_to_none=True)
            stats = LevelStats.zeros(method.levels)
            loss_sum, n_seq, t_feat, tokens = 0.0, 0, 0.0, 0
            my_idx = idx[dist.rank::dist.world]
            for i in my_idx:
                row = train_rows[i]
                tf = time.perf_counter()
                feats = rt.features(row, head.draft_ids)
                t_feat += time.perf_counter() - tf
                g = torch.Generator().manual_seed(hash((cfg.seed, step, int(i))) & 0x7FFFFFFF)
                res = method.sequence_loss(head, feats, t2d_index, rt, g)
                if res is None:
                    continue
                loss, st = res
                (loss / len(idx)).backward()
                stats.add(st)
                loss_sum += float(loss.detach())
                n_seq += 1
                tokens += len(row)
            dist.all_reduce_grads(params)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.clip))
            optimizer.step()
            step += 1
            epoch, cursor = epoch_b, cursor_b
            dt = time.perf_counter() - t0
            step_times.append(dt)
            elapsed = elapsed0 + (time.perf_counter() - t_run)

            summ = stats.summary()
            rec = {"step": step, "epoch": epoch, "lr": lr, "loss": round(loss_sum / max(n_seq, 1), 5),
                   "grad_norm": round(grad_norm, 4), "hit@1": summ["hit@1"], "seqs": n_seq, "tokens": tokens,
                   "step_s": round(dt, 3), "features_s": round(t_feat, 3), "elapsed_s": round(elapsed, 1),
                   "total_steps": total_steps}
            history.append({k: rec[k] for k in ("step", "loss")})
            if dist.main:
                with log_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                bar.update(1)
                bar.set_postfix_str(f"loss {rec['loss']:.3f} h1@t1 {summ['hit@1'][0]:.2f} "
                                    f"h1@t2 {summ['hit@1'][1] if len(summ['hit@1']) > 1 else 0:.2f} "
                                    f"{dt:.1f}s/step lr {lr:.2e}", refresh=False)

            # Fit the schedule to the time budget at the recent pace (decided by rank 0, shared with every rank).
            pace_s = budget.pace(step_times)
            new_total = budget.plan(total_steps, ceiling, step, elapsed, pace_s)
            new_total = dist.broadcast_int(new_total, device)
            if new_total != total_steps:
                if not budget_fitted:
                    logger.info("time budget: %.1f s/step -> %d steps instead of %d", pace_s, new_total, total_steps)
                    if step < warmup:   # the warmup is a share of the fitted run, not of the epochs plan
                        warmup = max(1, int(cfg.warmup_frac * new_total))
                budget_fitted = True
                total_steps = new_total
                bar.total = total_steps
            if dist.main and time.perf_counter() - last_ckpt >= cfg.checkpoint_minutes * 60 and step < total_steps:
                write_checkpoint()
                last_ckpt = time.perf_counter()
    except (KeyboardInterrupt, _Interrupted):
        interrupted = True
    finally:
        bar.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if interrupted:
        write_checkpoint()
        logger.warning("interrupted at step %d: checkpoint saved; continue with --resume", step)
        raise KeyboardInterrupt
    train_s = elapsed0 + (time.perf_counter() - t_run)

    summary: dict[str, Any] = {}
    if dist.main:
        t_eval = time.perf_counter()
        evaluation = method.evaluate(head, target, eval_rows, rt) if eval_rows else {}
        eval_s = time.perf_counter() - t_eval
        method.save_head(head, out, save_dtype)
        summary = {**{k: v for k, v in run_info.items() if k != "config"}, "steps": step,
                   "planned_steps": planned, "batch_seqs": cfg.batch_seqs,
                   "sequences_seen": step * cfg.batch_seqs, "epochs_seen": round(step * cfg.batch_seqs / len(train_rows), 3),
                   "train_wall_s": round(train_s, 1), "eval_wall_s": round(eval_s, 1),
                   "mean_step_s": round(float(np.mean(step_times)) if step_times else 0.0, 3),
                   "final_train_loss": history[-1]["loss"] if history else None, "eval": evaluation,
                   "sources": _source_counts(train_rows), "head_bytes": (out / "model.safetensors").stat().st_size,
                   "lr_restarts": lr_restarts(log_path, warmup), "config": asdict(cfg)}
        if cfg.compare_with:
            summary["compare_with"] = compared_run(cfg.compare_with)
        (out / "eval.json").write_text(json.dumps(evaluation, indent=1) + "\n", encoding="utf-8")
        (out / "training_summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        (out / "README.md").write_text(model_card(summary), encoding="utf-8")
        write_checkpoint(finished=True)
        logger.info("done: %d steps in %.0f s; held-out hit@1 per position %s", step, train_s,
                    evaluation.get("hit@1"))
    dist.barrier()
    return summary


# ---------------------------------------------------------------------------------------------- helpers
def head_vocab_info(head, rows: Sequence[DistillRow]) -> dict:
    """The run's vocabulary record for a head that brings its own draft vocabulary (--init-head): its size
    and the share of the training response tokens it covers."""
    V = head.config.vocab_size
    counts = np.zeros(V, dtype=np.int64)
    for r in rows:
        arr = np.asarray(r.response_ids, dtype=np.int64)
        if arr.size:
            counts += np.bincount(arr, minlength=V)[:V]
    total = int(counts.sum())
    covered = int(counts[head.t2d.cpu().numpy()].sum())
    return {"size": int(head.config.draft_vocab_size), "coverage": round(covered / total, 5) if total else 1.0,
            "counted_tokens": total, "from": str(head.source)}


def cpu_description() -> str:
    """The CPU model and whether it has native bf16 matmuls: wall-time budgets on two CPUs compare only
    when both are named (a 2-core AMX Xeon trains several times faster than a 2-core AVX2 EPYC)."""
    from ..hardware import cpu_model
    from ..models.loader import cpu_supports_bf16
    return f"{cpu_model()} ({'native bf16' if cpu_supports_bf16() else 'no native bf16'})"


def compared_run(run_dir: str | Path) -> dict:
    """The budget of another finished run (its training_summary.json), for a model card's comparison."""
    s = json.loads((Path(run_dir) / "training_summary.json").read_text(encoding="utf-8"))
    return {"dir": str(run_dir), "method": s.get("method", "dart"), "steps": s.get("steps"),
            "batch_seqs": s.get("batch_seqs"), "train_wall_s": s.get("train_wall_s"), "device": s.get("device"),
            "threads": s.get("threads"), "time_budget_min": (s.get("config") or {}).get("time_budget_min"),
            "cpu": s.get("cpu"), "sequences_seen": s.get("sequences_seen")}


def _log_step(line: str) -> float:
    try:
        return float(json.loads(line)["step"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf  # a torn line: drop it


def _eval_reserve_s(eval_rows: int) -> float:
    # A CPU held-out row costs about one training sequence's target forward plus a head forward.
    return 60.0 + 2.5 * eval_rows


def _source_counts(rows: Sequence[DistillRow]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.source or "unknown"] = counts.get(r.source or "unknown", 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


