"""Prefix-shared masked DART training (DESIGN.md section 4; the original repository ships none).

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

AdamW, linear warmup + cosine decay, gradient clipping, bf16 autocast where the hardware has it.
Checkpoints every ``checkpoint_minutes`` (atomic, resumable with ``--resume``), a time budget that
shrinks the schedule to end on time, and a final evaluation (hit@1 / hit@10 per future position
on held-out rows). Multi-GPU: ``torchrun --nproc-per-node N -m dart_core.train dart ...`` splits
each batch across ranks and all-reduces gradients.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..models.dart_head import (DartHead, check_head_matches_target, load_dart_head, new_head_for_target,
                                save_dart_head)
from .checkpoint import find_checkpoint, save_checkpoint
from .data import DistillRow, corpus_stats, iterate_batches, load_distill_rows, split_rows, truncate
from .features import SequenceFeatures, compute_features
from .schedule import BudgetPlanner, cosine_lr, make_optimizer, set_lr
from .vocab import build_draft_vocab

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"

#: Licences of the prompt sources of ../shared/data (its README): for the model card.
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


@dataclass
class DartTrainConfig:
    """Every knob of a DART training run (the CLI flags, one to one).

    prefixes      prefixes (mask blocks) per sequence: 0 = all; None = auto (all on GPU, 64 on CPU)
    attention     "sdpa" (dense block mask), "flex" (flex_attention; GPU), "auto"
    argmax        target argmax for masking: "full" (full-vocabulary projection), "data" (the corpus token;
                  exact for a greedy self-distilled corpus and cheaper), "auto" (full on GPU, data on CPU)
    time_budget_min  wall time of the whole run (training + final evaluation); the schedule is fitted to it
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
    draft_length: int = 8
    draft_vocab_size: int = 8192
    prefixes: int | None = None
    max_seq_len: int = 1024
    train_rows: int | None = None
    heldout_permille: int = 20
    eval_rows: int = 64
    eval_prefixes: int = 128
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    attention: str = "auto"
    argmax: str = "auto"
    autocast: bool = True
    checkpoint_minutes: float = 10.0
    seed: int = 0
    save_dtype: str = "bfloat16"
    init_lm_head_from_target: bool = True
    progress: bool = True

    def validate(self) -> None:
        def bad(flag: str, rule: str, value: Any) -> TrainError:
            return TrainError(f"--{flag.replace('_', '-')} {rule}, got {value!r}")
        for name in ("batch_seqs", "draft_length", "draft_vocab_size", "max_seq_len"):
            if int(getattr(self, name)) < 1:
                raise bad(name, "must be >= 1", getattr(self, name))
        if self.max_steps is not None and self.max_steps < 1:
            raise bad("max_steps", "must be >= 1", self.max_steps)
        if self.time_budget_min is not None and self.time_budget_min <= 0:
            raise bad("time_budget_min", "must be > 0 minutes", self.time_budget_min)
        if not 0 < self.checkpoint_minutes <= 10:
            raise bad("checkpoint_minutes", "must be in (0, 10]: checkpoints come at least every 10 minutes",
                      self.checkpoint_minutes)
        if not (self.epochs > 0):
            raise bad("epochs", "must be > 0", self.epochs)
        if not (self.lr > 0):
            raise bad("lr", "must be > 0", self.lr)
        if not 0 < self.gamma <= 1:
            raise bad("gamma", "must be in (0, 1]", self.gamma)
        if not (self.clip > 0):
            raise bad("clip", "must be > 0", self.clip)
        if self.prefixes is not None and self.prefixes < 0:
            raise bad("prefixes", "must be >= 0 (0 = all)", self.prefixes)
        if self.attention not in ("auto", "sdpa", "flex"):
            raise bad("attention", "must be auto, sdpa or flex", self.attention)
        if self.argmax not in ("auto", "full", "data"):
            raise bad("argmax", "must be auto, full or data", self.argmax)
        if not 0 <= self.heldout_permille < 1000:
            raise bad("heldout_permille", "must be in [0, 1000)", self.heldout_permille)
        if self.train_rows is not None and self.train_rows < 1:
            raise bad("train_rows", "must be >= 1", self.train_rows)


# ---------------------------------------------------------------------------------------------- the loss
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
    stats = None
    if with_stats:
        with torch.no_grad():
            top = logits.topk(min(10, logits.shape[-1]), dim=-1).indices              # [S, D+1, 10]
            hit1 = (top[..., 0] == labels) & valid
            hit10 = (top == labels[..., None]).any(-1) & valid
            chain = torch.cumprod((hit1 | ~in_range).int(), dim=1) * in_range.int()
            stats = LevelStats(count=valid.sum(0).double().cpu().numpy(), hit1=hit1.sum(0).double().cpu().numpy(),
                               hit10=hit10.sum(0).double().cpu().numpy(),
                               ce_sum=(ce.detach() * valid).sum(0).double().cpu().numpy(),
                               chain_sum=float(chain.sum()), prefixes=int(pe.numel()))
    return loss, stats


# ---------------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate_head(head: DartHead, target, rows: Sequence[DistillRow], *, gamma: float, prefixes: int = 128,
                  attention: str = "sdpa", argmax_mode: str = "full", autocast: bool = False, seed: int = 0,
                  progress: bool = False) -> dict:
    """hit@1 / hit@10 / cross-entropy per future position on ``rows`` (held-out), plus the weighted loss."""
    from tqdm.auto import tqdm

    was_training = head.training
    head.eval()
    t2d_index = head.target_to_draft()
    D = head.config.draft_length
    total = LevelStats.zeros(D + 1)
    losses, weights = 0.0, 0.0
    g = torch.Generator().manual_seed(seed)
    for row in tqdm(rows, desc="eval", unit="row", disable=not progress, file=sys.stderr, dynamic_ncols=True):
        feats = compute_features(target, row.ids, len(row.prompt_ids), head.draft_ids, argmax_mode)
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


# ---------------------------------------------------------------------------------------------- the run
def _resolve_runtime(cfg: DartTrainConfig, dist: _Dist):
    from ..models.loader import cpu_supports_bf16, resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    if dist.enabled and device.type == "cuda":
        device = torch.device(f"cuda:{dist.local_rank}")
        torch.cuda.set_device(device)
    dtype = resolve_dtype(cfg.dtype, device)
    attention = cfg.attention if cfg.attention != "auto" else ("flex" if device.type == "cuda" else "sdpa")
    if attention == "flex" and device.type != "cuda":
        raise TrainError("--attention flex needs a GPU (flex_attention has no backward on CPU); use --attention sdpa")
    argmax = cfg.argmax if cfg.argmax != "auto" else ("full" if device.type == "cuda" else "data")
    prefixes = cfg.prefixes if cfg.prefixes is not None else (0 if device.type == "cuda" else 64)
    autocast = cfg.autocast and (device.type == "cuda" or cpu_supports_bf16())
    return device, dtype, attention, argmax, prefixes, autocast


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"]); np.random.set_state(s["numpy"]); random.setstate(s["python"])


def _save_dtype(name: str) -> torch.dtype | None:
    names = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float32": torch.float32, "fp32": torch.float32}
    if name not in names:
        raise TrainError(f"--save-dtype must be one of {', '.join(names)}, got {name!r}")
    return names[name]


class _Interrupted(Exception):
    pass


def train_dart(cfg: DartTrainConfig) -> dict:
    """Run (or resume) a DART training run; returns the summary written to ``out/training_summary.json``."""
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
    device, dtype, attention, argmax_mode, prefixes, autocast = _resolve_runtime(cfg, dist)

    t_setup = time.perf_counter()
    target = load_target(cfg.target, dtype=dtype, device=str(device))
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
    if not train_rows:
        raise TrainError(f"no training rows left in {cfg.data} after the held-out split (--heldout-permille)")

    state: dict[str, Any] = {}
    if existing is not None:
        head = load_dart_head(existing / "head", None)
        check_head_matches_target(head.config, target, source=f"the checkpoint in {existing}")
        head.to(device=device, dtype=torch.float32)
        head.attach_embedding(target.model.get_input_embeddings().weight)
        state = torch.load(existing / STATE_FILE, map_location="cpu", weights_only=False)
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
        head = new_head_for_target(target, vocab.draft_ids, cfg.draft_length, seed=cfg.seed,
                                   init_lm_head_from_target=cfg.init_lm_head_from_target)
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
    run_info = {"target": target.name, "data": str(cfg.data), "train_rows": len(train_rows),
                "train_tokens": corpus_stats(train_rows), "heldout_rows": len(heldout), "eval_rows": len(eval_rows),
                "device": str(device), "target_dtype": str(dtype).replace("torch.", ""), "attention": attention,
                "argmax": argmax_mode, "prefixes_per_seq": prefixes, "autocast_bf16": autocast,
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
            save_dart_head(head, tmp / "head", dtype=None)
            torch.save({"step": step, "total_steps": total_steps, "warmup": warmup, "epoch": epoch, "cursor": cursor,
                        "elapsed_s": elapsed, "optimizer": optimizer.state_dict(), "rng": _rng_state(),
                        "data_rows": len(train_rows), "vocab": vocab_info, "history": history,
                        "budget_fitted": budget_fitted, "finished": finished, "config": asdict(cfg)},
                       tmp / STATE_FILE)
        save_checkpoint(ckpt_dir, write)
        logger.info("checkpoint at step %d -> %s", step, ckpt_dir)

    if state.get("finished"):
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
    bar = tqdm(total=total_steps, initial=step, desc="train dart", unit="step", disable=not (cfg.progress and dist.main),
               file=sys.stderr, dynamic_ncols=True)
    interrupted = False
    try:
        while step < total_steps:
            t0 = time.perf_counter()
            epoch_b, cursor_b, idx = next(batches)
            lr = cosine_lr(step, total_steps, warmup, cfg.lr, cfg.min_lr_ratio)
            set_lr(optimizer, lr)
            optimizer.zero_grad(set_to_none=True)
            stats = LevelStats.zeros(cfg.draft_length + 1)
            loss_sum, n_seq, t_feat, tokens = 0.0, 0, 0.0, 0
            my_idx = idx[dist.rank::dist.world]
            for j, i in enumerate(my_idx):
                row = train_rows[i]
                tf = time.perf_counter()
                feats = compute_features(target, row.ids, len(row.prompt_ids), head.draft_ids, argmax_mode)
                t_feat += time.perf_counter() - tf
                g = torch.Generator().manual_seed(hash((cfg.seed, step, int(i))) & 0x7FFFFFFF)
                pe = sample_prefixes(feats, prefixes, g)
                if pe.numel() == 0:
                    continue
                loss, st = dart_loss(head, feats, pe, cfg.gamma, t2d_index, attention=attention, autocast=autocast)
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
        evaluation = evaluate_head(head, target, eval_rows, gamma=cfg.gamma, prefixes=cfg.eval_prefixes,
                                   attention=attention, argmax_mode=argmax_mode, autocast=autocast, seed=cfg.seed,
                                   progress=cfg.progress) if eval_rows else {}
        eval_s = time.perf_counter() - t_eval
        save_dart_head(head, out, dtype=save_dtype)
        summary = {**{k: v for k, v in run_info.items() if k != "config"}, "steps": step,
                   "planned_steps": planned, "batch_seqs": cfg.batch_seqs,
                   "sequences_seen": step * cfg.batch_seqs, "epochs_seen": round(step * cfg.batch_seqs / len(train_rows), 3),
                   "train_wall_s": round(train_s, 1), "eval_wall_s": round(eval_s, 1),
                   "mean_step_s": round(float(np.mean(step_times)) if step_times else 0.0, 3),
                   "final_train_loss": history[-1]["loss"] if history else None, "eval": evaluation,
                   "sources": _source_counts(train_rows), "head_bytes": (out / "model.safetensors").stat().st_size,
                   "config": asdict(cfg)}
        (out / "eval.json").write_text(json.dumps(evaluation, indent=1) + "\n", encoding="utf-8")
        (out / "training_summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        (out / "README.md").write_text(model_card(summary), encoding="utf-8")
        write_checkpoint(finished=True)
        logger.info("done: %d steps in %.0f s; held-out hit@1 per position %s", step, train_s,
                    evaluation.get("hit@1"))
    dist.barrier()
    return summary


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


def model_card(s: dict) -> str:
    """A Markdown model card from a training summary."""
    ev = s.get("eval") or {}
    lines = [f"# DART draft head for {s['target']}", "",
             "A DART draft head (one decoder layer + D mask slots, the fvliang/DART checkpoint layout) trained with "
             "`dart_core.train dart` (prefix-shared masked training, self-distillation).", "",
             "## Training", "",
             f"- target: `{s['target']}` ({s['target_dtype']} on {s['device']}, {s['threads']} threads)",
             f"- data: `{Path(s['data']).name}`: the target's own greedy answers; {s['train_rows']} training rows "
             f"({s['train_tokens']['prompt_tokens']} prompt + {s['train_tokens']['response_tokens']} response tokens), "
             f"{s['heldout_rows']} held out",
             f"- draft vocabulary: {s['vocab']['size']} most frequent response tokens, covering "
             f"{100 * s['vocab']['coverage']:.2f}% of training response tokens",
             f"- steps: {s['steps']} x {s['batch_seqs']} sequences ({s['sequences_seen']} sequences, "
             f"{s['epochs_seen']} epochs); wall time {s['train_wall_s'] / 60:.1f} min "
             f"({s['mean_step_s']:.2f} s/step)",
             f"- method: draft length {s['config']['draft_length']}, gamma {s['config']['gamma']}, AdamW lr "
             f"{s['config']['lr']} cosine with warmup, clip {s['config']['clip']}, {s['prefixes_per_seq'] or 'all'} "
             f"prefixes per sequence, attention `{s['attention']}`, target argmax `{s['argmax']}`",
             "", "## Held-out evaluation", ""]
    if ev:
        lines += [f"{ev['rows']} held-out rows, up to {ev['prefixes_per_row']} prefixes each; future position t+k "
                  "is the k-th token after the tree root.", "",
                  "| position | " + " | ".join(ev["positions"]) + " |",
                  "|---|" + "---|" * len(ev["positions"]),
                  "| hit@1 | " + " | ".join(f"{x:.3f}" for x in ev["hit@1"]) + " |",
                  "| hit@10 | " + " | ".join(f"{x:.3f}" for x in ev["hit@10"]) + " |", "",
                  f"Mean top-1 chain length (levels matched in a row): {ev['mean_top1_chain']:.3f}; "
                  f"weighted loss {ev['loss']:.4f}."]
    else:
        lines.append("(no held-out rows)")
    lines += ["", "## Data sources and licences", "",
              "Prompts from ../shared/data/train/prompts.jsonl, answered by the target itself:", "",
              "| source | rows | licence |", "|---|---|---|"]
    for src, n in (s.get("sources") or {}).items():
        lines.append(f"| {src} | {n} | {SOURCE_LICENCES.get(src, 'see the data README')} |")
    lines += ["", "Several sources are non-commercial (CC-BY-NC); the head inherits those terms.", ""]
    return "\n".join(lines)
