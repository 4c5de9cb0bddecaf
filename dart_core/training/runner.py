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

Several ranks (``torchrun``; gloo on CPUs, NCCL on GPUs, ``ranks.py``): each rank takes every world-th
sequence of each batch, gradients and log figures are summed over the ranks, so N ranks take the steps one
rank would and a checkpoint resumes at any world size; rank 0 alone writes the log, checkpoints and outputs.
"""
from __future__ import annotations

import json
import logging
import math
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
from .checkpoint import STATE_FILE, find_checkpoint, load_trainer_state, rng_state, save_checkpoint, set_rng_state
from .data import DistillRow, corpus_stats, iterate_batches, load_distill_rows, split_rows, truncate
from .features import SequenceFeatures, compute_features
from .model_card import lr_restarts, model_card
from .method import Runtime, TrainMethod
from .ranks import RankLost, Ranks
from .run_config import BaseTrainConfig, TrainError
from .schedule import BudgetPlanner, cosine_lr, make_optimizer, set_lr
from .stats import LevelStats
from .vocab import build_draft_vocab

logger = logging.getLogger(__name__)


def _save_dtype(name: str) -> torch.dtype | None:
    if name not in DTYPE_ALIASES:
        raise TrainError(f"--save-dtype must be one of {', '.join(DTYPE_ALIASES)}, got {name!r}")
    return DTYPE_ALIASES[name]


class _Interrupted(Exception):
    pass


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


def resolve_runtime(cfg: BaseTrainConfig, ranks: Ranks, method: TrainMethod) -> Runtime:
    from ..models.loader import cpu_supports_bf16, resolve_device, resolve_dtype

    device = resolve_device(cfg.device)
    if ranks.enabled and device.type == "cuda":
        device = torch.device(f"cuda:{ranks.local_rank}")
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
    """Run (or resume) a training run; returns the summary written to ``out/training_summary.json``.
    Under torchrun every rank runs this; each takes its share of every batch (``--batch-seqs`` is the global
    batch) and the gradients are summed, so N ranks take the steps one rank would."""
    ranks = Ranks()
    try:
        run = plan_run(cfg, method, ranks)
        s = run.schedule
        if s.finished and s.step >= s.total_steps:  # a larger --max-steps extends a finished run
            logger.info("the run in %s already finished (step %d); nothing to do", run.out, s.step)
            summary_path = run.out / "training_summary.json"
            return json.loads(summary_path.read_text()) if summary_path.is_file() else {"finished": True}
        step_times = train_loop(run)
        return finish_run(run, step_times)
    finally:
        ranks.close()


@dataclass
class Schedule:
    """Where the run stands: what a checkpoint records besides the head and the optimiser, advanced by the loop."""
    step: int
    total_steps: int
    warmup: int
    epoch: int
    cursor: int
    elapsed0: float          # training seconds of the processes before this one (a resumed run)
    history: list
    budget_fitted: bool
    finished: bool = False   # read back from a finished run's checkpoint
    t_run: float = 0.0       # when this process's loop started

    def elapsed(self) -> float:
        return self.elapsed0 + (time.perf_counter() - self.t_run)


@dataclass
class Run:
    """What :func:`plan_run` resolved before the first step: flags, ranks, target, rows, head, optimiser, schedule."""
    cfg: BaseTrainConfig
    method: TrainMethod
    ranks: Ranks
    rt: Runtime
    target: Any
    out: Path
    train_rows: list
    heldout: list
    eval_rows: list
    vocab_info: dict
    head: Any
    params: list
    optimizer: torch.optim.Optimizer
    t2d_index: torch.Tensor
    planned: int             # the steps of --epochs or --max-steps, before any time budget
    schedule: Schedule
    run_info: dict
    save_dtype: torch.dtype | None
    stop_requested: bool = False   # SIGTERM: stop at the next sequence with a checkpoint

    @property
    def log_path(self) -> Path:
        return self.out / "train_log.jsonl"

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoint"


# ---------------------------------------------------------------------------------------------- plan
def plan_run(cfg: BaseTrainConfig, method: TrainMethod, ranks: Ranks) -> Run:
    """Check the flags, join the ranks, load the target and the corpus, start (or read back) the head, its
    optimiser and the schedule, and write run_info.json."""
    from ..models.loader import load_target

    cfg.validate()
    save_dtype = _save_dtype(cfg.save_dtype)
    if ranks.world > cfg.batch_seqs:
        raise TrainError(f"--batch-seqs {cfg.batch_seqs} is the global batch and torchrun started {ranks.world} "
                         "ranks: every rank needs a sequence per step; raise --batch-seqs or start fewer ranks")
    out = Path(cfg.out)
    existing = find_checkpoint(out / "checkpoint")
    if existing is not None and not cfg.resume:
        raise TrainError(f"{out} already holds a checkpoint ({existing}); pass --resume to continue it, or choose "
                         "another --out")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rt = resolve_runtime(cfg, ranks, method)
    ranks.start(rt.device)

    t_setup = time.perf_counter()
    target = load_target(cfg.target, dtype=rt.dtype, device=str(rt.device))
    for p in target.model.parameters():
        p.requires_grad_(False)
    train_rows, heldout, vocab_rows = _split_corpus(cfg, target)
    eval_rows = heldout[: cfg.eval_rows]
    rt.features, features_info = feature_source(cfg, target, rt)
    if not train_rows:
        raise TrainError(f"no training rows left in {cfg.data} after the held-out split (--heldout-permille)")

    state = _read_state(existing, method, len(train_rows), cfg) if existing is not None else {}
    if state and state.get("world_size", 1) != ranks.world:
        # Nothing in the state depends on the ranks: the batch order, the per-sequence seeds and the optimiser
        # are global, so the run goes on as if the world size had never changed.
        logger.info("resuming a %d-rank run on %d rank(s): the same global batch of %d sequences",
                    state.get("world_size", 1), ranks.world, cfg.batch_seqs)
    head, vocab_info = _start_head(cfg, method, target, rt.device, existing, state, vocab_rows)
    head.train()
    params = [p for p in head.parameters() if p.requires_grad]
    ranks.broadcast_params(params)
    optimizer = make_optimizer(params, cfg.lr, cfg.weight_decay)
    planned = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(train_rows) / cfg.batch_seqs))
    if state:
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
    else:
        torch.manual_seed(cfg.seed)
    schedule = _schedule(cfg, state, planned)

    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    if ranks.main and state and log_path.is_file():
        # Steps logged after the checkpoint (a hard kill) are redone: drop them from the log.
        kept = [ln for ln in log_path.read_text(encoding="utf-8").splitlines() if _log_step(ln) <= schedule.step]
        log_path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")
    run_info = {"method": method.name, "target": target.name, "data": str(cfg.data), "train_rows": len(train_rows),
                "train_tokens": corpus_stats(train_rows), "heldout_rows": len(heldout), "eval_rows": len(eval_rows),
                **_runtime_info(cfg, rt, features_info), "world_size": ranks.world, "vocab": vocab_info,
                "config": asdict(cfg)}
    if ranks.main:
        logger.info("run: %s", json.dumps({k: v for k, v in run_info.items() if k != "config"}))
        (out / "run_info.json").write_text(json.dumps(run_info, indent=1) + "\n", encoding="utf-8")
    logger.info("setup took %.1f s", time.perf_counter() - t_setup)
    return Run(cfg=cfg, method=method, ranks=ranks, rt=rt, target=target, out=out, train_rows=train_rows,
               heldout=heldout, eval_rows=eval_rows, vocab_info=vocab_info, head=head, params=params,
               optimizer=optimizer, t2d_index=head.target_to_draft(), planned=planned, schedule=schedule,
               run_info=run_info, save_dtype=save_dtype)


def _runtime_info(cfg: BaseTrainConfig, rt: Runtime, features_info: dict) -> dict:
    """run_info's record of the machine, the runtime settings, the feature source and how the head started."""
    return {"device": str(rt.device), "cpu": cpu_description(), "target_dtype": dtype_name(rt.dtype), **rt.extra,
            "argmax": features_info.get("argmax", rt.argmax), "autocast_bf16": rt.autocast,
            "features": features_info,
            "init": {"head": cfg.init_head, "layer_from_target": cfg.init_layer_from_target,
                     "lm_head_from_target": cfg.init_lm_head_from_target and not cfg.init_head},
            "threads": torch.get_num_threads()}


def _split_corpus(cfg: BaseTrainConfig, target) -> tuple[list, list, list]:
    """(training rows, held-out rows, the rows the draft vocabulary counts): truncated, the stable held-out split,
    then a seeded --train-rows subset (the vocabulary still counts the whole training split)."""
    rows = load_distill_rows(cfg.data, vocab_size=target.vocab_size)
    rows = [truncate(r, cfg.max_seq_len) for r in rows]
    rows = [r for r in rows if len(r.response_ids) >= 2]
    train_rows, heldout = split_rows(rows, cfg.heldout_permille)
    vocab_rows = train_rows
    if cfg.train_rows is not None and cfg.train_rows < len(train_rows):
        pick = np.random.default_rng([cfg.seed, 7]).permutation(len(train_rows))[: cfg.train_rows]
        train_rows = [train_rows[i] for i in sorted(pick.tolist())]
    return train_rows, heldout, vocab_rows


#: Flags a resumed run may change: where and how it runs, how long, how it reports. Every other flag shapes what
#: is learned (data split, batch, optimiser, loss, vocabulary, start), so a resume must repeat it.
RESUME_MAY_CHANGE = frozenset({"out", "resume", "max_steps", "time_budget_min", "epochs", "threads", "device",
                               "checkpoint_minutes", "progress", "compare_with", "features", "save_dtype",
                               "eval_rows", "eval_prefixes", "data", "target"})


def _changed_settings(saved: dict[str, Any], cfg: BaseTrainConfig) -> list[str]:
    """``--flag was X, now Y`` for each learning setting of ``cfg`` that differs from the checkpoint's."""
    now = asdict(cfg)
    return [f"--{k.replace('_', '-')} was {saved[k]!r}, now {now[k]!r}" for k in sorted(now)
            if k not in RESUME_MAY_CHANGE and k in saved and saved[k] != now[k]]


def _read_state(existing: Path, method: TrainMethod, n_train_rows: int,
                cfg: BaseTrainConfig | None = None) -> dict[str, Any]:
    """The checkpoint's trainer state, refused when it belongs to another method, other data flags or other
    learning settings (``RESUME_MAY_CHANGE`` lists the flags a resume may change)."""
    state = load_trainer_state(existing / STATE_FILE)
    if state.get("method", "dart") != method.name:
        raise TrainError(f"the checkpoint in {existing} is a {state.get('method', 'dart')} run, not {method.name}; "
                         f"resume it with `python -m dart_core.train {state.get('method', 'dart')} ...`, or "
                         "choose another --out")
    if state.get("data_rows") != n_train_rows:
        raise TrainError(f"the checkpoint was trained on {state.get('data_rows')} rows but --data/--train-rows "
                         f"now give {n_train_rows}; resume with the same data flags")
    changed = _changed_settings(state.get("config") or {}, cfg) if cfg is not None else []
    if changed:
        raise TrainError(f"the checkpoint in {existing} was trained with other settings: {'; '.join(changed)}. "
                         "Resume with the same flags (only where and how long it runs may change: --max-steps, "
                         "--time-budget-min, --threads, --device, ...), or start another --out")
    return state


def _start_head(cfg: BaseTrainConfig, method: TrainMethod, target, device: torch.device, existing: Path | None,
                state: dict, vocab_rows: Sequence[DistillRow]) -> tuple[Any, dict]:
    """The head the run starts from, and its vocabulary record: the checkpoint's (resume), --init-head's
    (fine-tuning) or a new head over a draft vocabulary built from ``vocab_rows``."""
    if state:
        head = method.load_head(existing / "head", target, device, source=f"the checkpoint in {existing}")
        logger.info("resuming from %s at step %d of %d", existing, state["step"], state["total_steps"])
        return head, state["vocab"]
    if cfg.init_head:
        # Fine-tuning: the head's own weights and draft vocabulary (--draft-vocab-size does not apply), or with
        # --rebuild-vocab a vocabulary of this corpus's answers (new kinds of prompt bring tokens the head lacks).
        head = method.start_head(cfg.init_head, target, device)
        vocab_info = head_vocab_info(head, vocab_rows)
        if cfg.rebuild_vocab:
            from ..models.heads.layers import remap_vocab
            vocab = build_draft_vocab((r.response_ids for r in vocab_rows), target.vocab_size,
                                      head.config.draft_vocab_size, always_include=target.eos_token_ids)
            kept = remap_vocab(head, target, vocab.draft_ids)
            vocab_info = {"size": vocab.size, "coverage": round(vocab.coverage, 5),
                          "counted_tokens": vocab.counted_tokens, "from": vocab_info["from"], "rebuilt": True,
                          "kept": kept, "start_coverage": vocab_info["coverage"]}
            logger.info("draft vocabulary rebuilt from the corpus: %d tokens (%d of them the starting head's) cover "
                        "%.2f%% of %d training response tokens (the starting head's: %.2f%%)", vocab.size, kept,
                        100 * vocab.coverage, vocab.counted_tokens, 100 * vocab_info["start_coverage"])
            return head, vocab_info
        logger.info("starting from %s: its draft vocabulary of %d tokens covers %.2f%% of %d training response "
                    "tokens", cfg.init_head, vocab_info["size"], 100 * vocab_info["coverage"],
                    vocab_info["counted_tokens"])
        return head, vocab_info
    vocab = build_draft_vocab((r.response_ids for r in vocab_rows), target.vocab_size, cfg.draft_vocab_size,
                              always_include=target.eos_token_ids)
    vocab_info = {"size": vocab.size, "coverage": round(vocab.coverage, 5), "counted_tokens": vocab.counted_tokens}
    logger.info("draft vocabulary: %d tokens cover %.2f%% of %d training response tokens", vocab.size,
                100 * vocab.coverage, vocab.counted_tokens)
    return method.new_head(target, vocab.draft_ids), vocab_info


def _schedule(cfg: BaseTrainConfig, state: dict, planned: int) -> Schedule:
    """A fresh schedule of ``planned`` steps, or the checkpoint's (an explicit --max-steps on resume replaces
    its plan)."""
    if not state:
        return Schedule(step=0, total_steps=planned, warmup=max(1, int(cfg.warmup_frac * planned)), epoch=0,
                        cursor=0, elapsed0=0.0, history=[], budget_fitted=False)
    total_steps = state["total_steps"]
    if cfg.max_steps is not None:
        total_steps = max(state["step"], cfg.max_steps)
    return Schedule(step=state["step"], total_steps=total_steps,
                    warmup=state.get("warmup", max(1, int(cfg.warmup_frac * total_steps))), epoch=state["epoch"],
                    cursor=state["cursor"], elapsed0=state["elapsed_s"], history=state.get("history", []),
                    budget_fitted=bool(state.get("budget_fitted", False)), finished=bool(state.get("finished")))


def write_checkpoint(run: Run, finished: bool = False) -> None:
    """The head, optimiser, schedule and RNG states into out/checkpoint (atomically; rank 0 only)."""
    if not run.ranks.main:
        return
    s = run.schedule
    elapsed = s.elapsed()

    def write(tmp: Path) -> None:
        run.method.save_head(run.head, tmp / "head", None)
        torch.save({"step": s.step, "total_steps": s.total_steps, "warmup": s.warmup, "epoch": s.epoch,
                    "cursor": s.cursor, "elapsed_s": elapsed, "optimizer": run.optimizer.state_dict(),
                    "rng": rng_state(), "data_rows": len(run.train_rows), "vocab": run.vocab_info,
                    "history": s.history, "budget_fitted": s.budget_fitted, "finished": finished,
                    "method": run.method.name, "world_size": run.ranks.world, "config": asdict(run.cfg)},
                   tmp / STATE_FILE)
    save_checkpoint(run.ckpt_dir, write)
    logger.info("checkpoint at step %d -> %s", s.step, run.ckpt_dir)


# ---------------------------------------------------------------------------------------------- loop
def train_loop(run: Run) -> list[float]:
    """Optimizer steps until the schedule's total (refitted to the time budget as it goes), a line of
    train_log.jsonl each, a checkpoint every --checkpoint-minutes and on Ctrl-C / SIGTERM (then
    KeyboardInterrupt). Returns this process's step times."""
    from tqdm.auto import tqdm

    cfg, ranks, s = run.cfg, run.ranks, run.schedule
    budget = BudgetPlanner(cfg.time_budget_min * 60 if cfg.time_budget_min else None,
                           reserve_s=_eval_reserve_s(len(run.eval_rows)))
    ceiling = max(s.total_steps, run.planned)   # the budget may shorten the plan, never pass this

    # SIGTERM (a job scheduler; torchrun when a rank fails) becomes a clean stop with a checkpoint, like Ctrl-C.
    # It only sets a flag, read between sequences: raised at any bytecode it could land between the optimizer
    # step and the step count (a checkpoint one step off), or inside the checkpoint written after a lost rank.
    def on_term(signum, frame):
        run.stop_requested = True
    old_term = signal.signal(signal.SIGTERM, on_term) if ranks.main else None

    s.t_run = time.perf_counter()
    last_ckpt = s.t_run
    step_times: list[float] = []
    batches = iterate_batches(len(run.train_rows), cfg.batch_seqs, cfg.seed, s.epoch, s.cursor)
    bar = tqdm(total=s.total_steps, initial=s.step, desc=run.method.bar_desc, unit="step",
               disable=not (cfg.progress and ranks.main), file=sys.stderr, dynamic_ncols=True)
    interrupted = False
    try:
        while s.step < s.total_steps:
            if run.stop_requested:
                raise _Interrupted()
            t0 = time.perf_counter()
            epoch_b, cursor_b, idx = next(batches)
            lr = cosine_lr(s.step, s.total_steps, s.warmup, cfg.lr, cfg.min_lr_ratio)
            rec = _train_step(run, idx, lr)
            s.step += 1
            s.epoch, s.cursor = epoch_b, cursor_b
            dt = time.perf_counter() - t0
            step_times.append(dt)
            features_s = rec.pop("features_s")
            rec = {"step": s.step, "epoch": s.epoch, "lr": lr, **rec, "step_s": round(dt, 3),
                   "features_s": features_s, "elapsed_s": round(s.elapsed(), 1), "total_steps": s.total_steps}
            s.history.append({k: rec[k] for k in ("step", "loss")})
            if ranks.main:
                with run.log_path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(rec) + "\n")
                bar.update(1)
                h1 = rec["hit@1"]
                bar.set_postfix_str(f"loss {rec['loss']:.3f} h1@t1 {h1[0]:.2f} h1@t2 {h1[1] if len(h1) > 1 else 0:.2f} "
                                    f"{dt:.1f}s/step lr {lr:.2e}", refresh=False)
            _fit_budget(run, budget, ceiling, step_times, bar)
            if ranks.main and time.perf_counter() - last_ckpt >= cfg.checkpoint_minutes * 60 and s.step < s.total_steps:
                write_checkpoint(run)
                last_ckpt = time.perf_counter()
    except (KeyboardInterrupt, _Interrupted):
        interrupted = True
    except RankLost as exc:
        # A collective failed before this step's optimizer step or after its count: the head, optimiser and
        # schedule are one finished step's, so rank 0 checkpoints them.
        write_checkpoint(run)
        saved = f"the checkpoint holds step {s.step}; " if ranks.main else ""
        raise TrainError(f"{exc}: another rank stopped; {saved}rerun the same command with --resume (at any number "
                         "of ranks) to continue from the last checkpoint") from None
    finally:
        bar.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if interrupted:
        write_checkpoint(run)
        logger.warning("interrupted at step %d: checkpoint saved; continue with --resume", s.step)
        raise KeyboardInterrupt
    return step_times


def _train_step(run: Run, idx: list[int], lr: float) -> dict:
    """One optimizer step over the batch ``idx``: this rank's share of it (every world-th sequence), the
    gradients and statistics summed over the ranks, so the step and its log record are the one-rank run's
    (loss, grad norm, hit@1, sequences, tokens; the feature seconds are this rank's)."""
    cfg, ranks, rt = run.cfg, run.ranks, run.rt
    set_lr(run.optimizer, lr)
    run.optimizer.zero_grad(set_to_none=True)
    stats = LevelStats.zeros(run.method.levels)
    loss_sum, n_seq, t_feat, tokens = 0.0, 0, 0.0, 0
    for i in idx[ranks.rank::ranks.world]:
        if run.stop_requested:
            raise _Interrupted()
        row = run.train_rows[i]
        tf = time.perf_counter()
        feats = rt.features(row, run.head.draft_ids)
        t_feat += time.perf_counter() - tf
        g = torch.Generator().manual_seed(hash((cfg.seed, run.schedule.step, int(i))) & 0x7FFFFFFF)
        res = run.method.sequence_loss(run.head, feats, run.t2d_index, rt, g)
        if res is None:
            continue
        loss, st = res
        (loss / len(idx)).backward()
        stats.add(st)
        loss_sum += float(loss.detach())
        n_seq += 1
        tokens += len(row)
    if ranks.enabled:
        ranks.all_reduce_grads(run.params)
        totals = ranks.sum(torch.tensor([loss_sum, n_seq, tokens], dtype=torch.float64, device=rt.device))
        stats = LevelStats.from_vector(ranks.sum(stats.to_vector(rt.device)), run.method.levels)
        loss_sum, n_seq, tokens = float(totals[0]), int(totals[1]), int(totals[2])
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, cfg.clip))
    run.optimizer.step()
    return {"loss": round(loss_sum / max(n_seq, 1), 5), "grad_norm": round(grad_norm, 4),
            "hit@1": stats.summary()["hit@1"], "seqs": n_seq, "tokens": tokens, "features_s": round(t_feat, 3)}


def _fit_budget(run: Run, budget: BudgetPlanner, ceiling: int, step_times: list[float], bar) -> None:
    """Fit the schedule to the time budget at the recent pace (decided by rank 0, shared with every rank)."""
    s = run.schedule
    pace_s = budget.pace(step_times)
    new_total = budget.plan(s.total_steps, ceiling, s.step, s.elapsed(), pace_s)
    new_total = run.ranks.broadcast_int(new_total, run.rt.device)
    if new_total == s.total_steps:
        return
    if not s.budget_fitted:
        logger.info("time budget: %.1f s/step -> %d steps instead of %d", pace_s, new_total, s.total_steps)
        if s.step < s.warmup:   # the warmup is a share of the fitted run, not of the epochs plan
            s.warmup = max(1, int(run.cfg.warmup_frac * new_total))
    s.budget_fitted = True
    s.total_steps = new_total
    bar.total = s.total_steps


# ---------------------------------------------------------------------------------------------- finish
def finish_run(run: Run, step_times: list[float]) -> dict:
    """On rank 0: the held-out evaluation, the head in --save-dtype, eval.json, training_summary.json, the model
    card and a finished checkpoint; every rank waits for it. Returns the summary (empty on other ranks)."""
    cfg, s = run.cfg, run.schedule
    train_s = s.elapsed()
    summary: dict[str, Any] = {}
    if run.ranks.main:
        t_eval = time.perf_counter()
        evaluation = run.method.evaluate(run.head, run.target, run.eval_rows, run.rt) if run.eval_rows else {}
        eval_s = time.perf_counter() - t_eval
        run.method.save_head(run.head, run.out, run.save_dtype)
        summary = {**{k: v for k, v in run.run_info.items() if k != "config"}, "steps": s.step,
                   "planned_steps": run.planned, "batch_seqs": cfg.batch_seqs,
                   "sequences_seen": s.step * cfg.batch_seqs,
                   "epochs_seen": round(s.step * cfg.batch_seqs / len(run.train_rows), 3),
                   "train_wall_s": round(train_s, 1), "eval_wall_s": round(eval_s, 1),
                   "mean_step_s": round(float(np.mean(step_times)) if step_times else 0.0, 3),
                   "final_train_loss": s.history[-1]["loss"] if s.history else None, "eval": evaluation,
                   "sources": _source_counts(run.train_rows),
                   "head_bytes": (run.out / "model.safetensors").stat().st_size,
                   "lr_restarts": lr_restarts(run.log_path, s.warmup), "config": asdict(cfg)}
        if cfg.compare_with:
            summary["compare_with"] = compared_run(cfg.compare_with)
        (run.out / "eval.json").write_text(json.dumps(evaluation, indent=1) + "\n", encoding="utf-8")
        (run.out / "training_summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
        (run.out / "README.md").write_text(model_card(summary), encoding="utf-8")
        write_checkpoint(run, finished=True)
        logger.info("done: %d steps in %.0f s; held-out hit@1 per position %s", s.step, train_s,
                    evaluation.get("hit@1"))
    run.ranks.barrier()
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


