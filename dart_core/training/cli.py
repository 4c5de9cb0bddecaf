"""Train draft heads: ``python -m dart_core.train {dart,eagle3} --target MODEL --data FILE --out DIR [--resume]``.

FILE is the distillation corpus (e.g. regenerate it with ``python -m dart_core.training.regenerate``).

    python -m dart_core.train dart --target bundled \\
        --data corpus/smollm2-135m-instruct.jsonl.gz --out runs/dart-smollm2 \\
        --time-budget-min 110 --threads 2

Writes DIR/config.json + DIR/model.safetensors (the head, published fvliang/DART layout),
DIR/eval.json (hit@1 / hit@10 per future position on held-out rows), DIR/README.md (model card),
DIR/train_log.jsonl and DIR/checkpoint/ (every --checkpoint-minutes; --resume continues it).
Several ranks: ``torchrun --nproc-per-node N -m dart_core.train dart ...`` (NCCL on GPUs, gloo on
CPUs); --batch-seqs stays the global batch, so N ranks take the steps one rank would, and a run
resumes at any number of ranks. ``torchrun ... -m dart_core.train features ...`` builds the feature
cache in shards, one per rank (docs/training.md).

    python -m dart_core.train eagle3 --target bundled \\
        --data corpus/smollm2-135m-instruct.jsonl.gz --out runs/eagle3-smollm2 \\
        --time-budget-min 110 --threads 2 --compare-with runs/dart-smollm2

trains the EAGLE-3 baseline (training-time test, published EAGLE-3 layout) on the same corpus,
draft vocabulary rule, schedule and outputs; DIR/eval.json then holds hit@1 / hit@10 per
unrolled step (step k = future position t+k+1, as in the DART table).

    python -m dart_core.train dart --target bundled --data FILE --out runs/dart-tuned \\
        --init-head assets/dart/smollm2-135m-instruct

fine-tunes an existing head (its weights and draft vocabulary; a head made for another target is
refused); ``--init-layer-from-target`` instead starts a new head's decoder layer from the target's
last layer. Both are recorded in DIR/run_info.json and the model card.

    python -m dart_core.train features --target bundled \\
        --data corpus/smollm2-135m-instruct.jsonl.gz --threads 2

runs the target once over the corpus and caches its features (training/feature_cache.py); both
trainers then find the cache by fingerprint (or take ``--features DIR``) instead of running the
target at every step. Rerun the same command after a kill: it resumes.

    python -m dart_core.train mix corpus/old.jsonl.gz=1200 corpus/context.jsonl.gz --out corpus/mixed.jsonl.gz
    python -m dart_core.train eval --data corpus/mixed.jsonl.gz --heldout-permille 150 \\
        --head assets/dart/smollm2-135m-instruct --head runs/dart-tuned

joins corpora (a seeded sample of each) for a fine-tune on new kinds of prompt, and scores heads per kind
(category, else source) on the rows a run at that --heldout-permille held out (training/evaluate.py).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

# On a shared machine OpenMP threads that spin while waiting for a busy core make every
# elementwise op crawl (measured: a 400-token forward of the bundled model took 8.7 s with
# 2 spinning threads, 0.5 s with passive waiting). Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _add_common(p, d) -> None:
    """The flags every head trainer shares (defaults from its config ``d``)."""
    p.add_argument("--target", default=None, help="target model: Hub id, local dir, .gguf, or 'bundled' (default)")
    p.add_argument("--data", required=True,
                   help="distillation corpus (.jsonl[.gz] with prompt_ids, response_ids): a local file, or a Hub "
                        "dataset id owner/name[:file] (read from the Hugging Face cache; downloaded when online)")
    p.add_argument("--out", required=True, help="output directory (head, logs, checkpoint)")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps (default: --epochs over the data)")
    p.add_argument("--time-budget-min", type=float, default=None,
                   help="wall-time budget in minutes (training + final evaluation); the schedule is fitted to it")
    p.add_argument("--epochs", type=float, default=d.epochs)
    p.add_argument("--batch-seqs", type=int, default=d.batch_seqs, help="sequences per optimizer step")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW, cosine with warmup)")
    p.add_argument("--min-lr-ratio", type=float, default=d.min_lr_ratio, help="final lr / peak lr")
    p.add_argument("--warmup-frac", type=float, default=d.warmup_frac)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--clip", type=float, default=d.clip, help="gradient clipping (max norm)")


def _add_common_tail(p, d) -> None:
    p.add_argument("--draft-vocab-size", type=int, default=d.draft_vocab_size)
    p.add_argument("--max-seq-len", type=int, default=d.max_seq_len, help="tokens per sequence at most")
    p.add_argument("--train-rows", type=int, default=None, help="use a random subset of this many training rows")
    p.add_argument("--heldout-permille", type=int, default=d.heldout_permille,
                   help="rows held out for evaluation, per thousand (stable split by row id)")
    p.add_argument("--eval-rows", type=int, default=d.eval_rows, help="held-out rows in the final evaluation")


def _add_runtime(p, d) -> None:
    p.add_argument("--device", default=d.device, help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default=d.dtype, help="target dtype: auto, bfloat16, float32")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def _add_run_tail(p, d) -> None:
    p.add_argument("--argmax", default=d.argmax, choices=["auto", "full", "data"],
                   help="target argmax for masking positions outside the draft vocabulary")
    p.add_argument("--no-autocast", dest="autocast", action="store_false", help="train in float32 throughout")
    p.add_argument("--checkpoint-minutes", type=float, default=d.checkpoint_minutes)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--save-dtype", default=d.save_dtype, help="dtype of the final head's weights")
    p.add_argument("--no-init-lm-head-from-target", dest="init_lm_head_from_target", action="store_false",
                   help="start lm_head at random instead of the target's output embedding rows")
    p.add_argument("--rebuild-vocab", action="store_true",
                   help="with --init-head: build the draft vocabulary from this corpus (--draft-vocab-size tokens); "
                        "tokens the head had keep their LM-head rows, new ones start from the target's")
    p.add_argument("--init-layer-from-target", action="store_true",
                   help="start the head's decoder layer from the target's last layer (attention, MLP, norms)")
    p.add_argument("--init-head", default=None, metavar="DIR|HUB_ID",
                   help="fine-tune an existing head of this method for this target (e.g. the shipped "
                        "assets/dart/smollm2-135m-instruct): start from its weights and its draft vocabulary "
                        "(--draft-vocab-size does not apply); a head made for another target is refused")
    p.add_argument("--compare-with", default=None, metavar="RUN_DIR",
                   help="a finished run of the other head for this target: its budget goes into the model card")
    p.add_argument("--features", default=d.features, metavar="auto|none|DIR",
                   help="target features: a cache directory (`train features`), auto = the cache of this target "
                        "and corpus if one was built, none = run the target at every step")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def _dart_flags(p, d) -> None:
    p.add_argument("--gamma", type=float, default=d.gamma, help="loss weight gamma**(t-1) of future position t")
    p.add_argument("--draft-length", type=int, default=d.draft_length, help="mask slots D (D+1 positions)")
    p.add_argument("--prefixes", type=int, default=None,
                   help="prefixes (mask blocks) per sequence; 0 = all (default: all on GPU, 64 on CPU)")
    p.add_argument("--eval-prefixes", type=int, default=d.eval_prefixes, help="prefixes per held-out row (0 = all)")
    p.add_argument("--attention", default=d.attention, choices=["auto", "sdpa", "flex"],
                   help="block-mask attention: sdpa (CPU), flex (flex_attention, GPU)")


def _eagle3_flags(p, d) -> None:
    p.add_argument("--gamma", type=float, default=d.gamma, help="loss weight gamma**k of unrolled step k")
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps, help="training-time-test steps unrolled")


#: method -> (help, config class path, its own flags, what the report's per-level numbers are)
TRAINERS = {
    "dart": ("train a DART head (prefix-shared masked training)", ".dart_trainer:DartTrainConfig", _dart_flags,
             "future position"),
    "eagle3": ("train an EAGLE-3 head (training-time test, the published layout)",
               ".eagle3_trainer:Eagle3TrainConfig", _eagle3_flags, "unrolled step (future position)"),
}


def _config_class(method: str):
    import importlib

    module, name = TRAINERS[method][1].split(":")
    return getattr(importlib.import_module(module, __package__), name)


def _add_trainer(sub, method: str) -> None:
    """One trainer's subcommand: the shared flags, then the method's own (defaults from its config)."""
    help_, _, own_flags, _ = TRAINERS[method]
    d = _config_class(method)(data="", out="")
    p = sub.add_parser(method, help=help_, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    _add_common(p, d)
    own_flags(p, d)
    _add_common_tail(p, d)
    _add_runtime(p, d)
    _add_run_tail(p, d)
    p.set_defaults(func=_run_trainer)


def _add_features(sub) -> None:
    from .feature_cache import DEFAULT_CHUNK_ROWS, DEFAULT_TOP_K
    p = sub.add_parser("features", help="cache the target's features over a corpus for the trainers (resumable)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default=None, help="target model: Hub id, local dir, .gguf, or 'bundled' (default)")
    p.add_argument("--data", required=True, help="distillation corpus (.jsonl[.gz] with prompt_ids, response_ids)")
    p.add_argument("--features", default=None, metavar="DIR",
                   help="cache directory (default: <user cache>/dart-demo/features/<fingerprint>)")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K,
                   help="next-token candidates kept per answer position (with their log-probabilities)")
    p.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS,
                   help="rows per checkpointed chunk (a kill loses at most one)")
    p.add_argument("--limit", type=int, default=None, help="only the first N rows (for a quick try)")
    _add_runtime(p, argparse.Namespace(device="auto", dtype="auto"))
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=_run_features)


def _run_features(args: argparse.Namespace) -> int:
    import torch

    from ..models.loader import ModelLoadError, load_target, resolve_device, resolve_dtype
    from .data import DataError
    from .feature_cache import FeatureCacheError, build_feature_cache, cache_status
    from .ranks import RankLost, Ranks

    if args.threads:
        torch.set_num_threads(args.threads)
    ranks = Ranks()   # under torchrun the ranks build the cache in shards
    try:
        device = resolve_device(args.device)
        if ranks.enabled and device.type == "cuda":
            device = torch.device(f"cuda:{ranks.local_rank}")
            torch.cuda.set_device(device)
        ranks.start(device)
        # The trainers' dtype rule, so that a trainer with the same --dtype finds this cache.
        target = load_target(args.target, dtype=resolve_dtype(args.dtype, device, inference=False),
                             device=str(device))
        path = build_feature_cache(target, args.data, args.features, top_k=args.top_k, chunk_rows=args.chunk_rows,
                                   limit=args.limit, progress=args.progress, rank=ranks.rank, world=ranks.world,
                                   barrier=ranks.barrier if ranks.enabled else None)
    except (FeatureCacheError, DataError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RankLost as exc:
        print(f"error: {exc}: another rank stopped; rerun the same command (at any number of ranks) to resume",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        ranks.close()
    if not ranks.main:
        return 0
    st = cache_status(path)
    print(f"feature cache {path}: {st.rows} rows, top-{args.top_k} keeps {st.kept_mass:.4f} of the target's "
          f"probability mass on average, built in {st.elapsed_s:.0f} s")
    return 0


def _add_mix(sub) -> None:
    p = sub.add_parser("mix", help="join corpora into one (a seeded sample of each), e.g. new prompts with the old "
                                   "corpus for fine-tuning", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("parts", nargs="+", metavar="FILE[=ROWS]",
                   help="a corpus file, with the number of its rows to keep (a seeded random pick; default all)")
    p.add_argument("--out", required=True, help="output .jsonl or .jsonl.gz")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run_mix)


def _run_mix(args: argparse.Namespace) -> int:
    from .data import DataError, mix_corpora

    try:
        counts = mix_corpora(args.parts, args.out, seed=args.seed)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: " + ", ".join(f"{n} rows of {name}" for name, n in counts))
    return 0


def _report(args: argparse.Namespace, summary: dict, what: str) -> int:
    if os.environ.get("RANK", "0") != "0":
        return 0
    if summary.get("eval"):
        ev = summary["eval"]
        print(f"held-out hit@1 per {what}:", " ".join(f"{x:.3f}" for x in ev["hit@1"]))
        print(f"held-out hit@10 per {what}:", " ".join(f"{x:.3f}" for x in ev["hit@10"]))
    print(f"head written to {args.out}")
    return 0


def _run_trainer(args: argparse.Namespace) -> int:
    from ..models.heads.files import HeadError
    from ..models.loader import ModelLoadError
    from .data import DataError
    from .ranks import RankLost
    from .runner import TrainError, train

    fields = {k: v for k, v in vars(args).items() if k not in ("func", "method", "verbose")}
    try:
        summary = train(_config_class(args.method)(**fields))
    except (TrainError, DataError, HeadError, ModelLoadError, RankLost) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: checkpoint saved; rerun the same command with --resume to continue", file=sys.stderr)
        return 130
    return _report(args, summary, TRAINERS[args.method][3])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dart_core.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="method", required=True)
    for method in TRAINERS:
        _add_trainer(sub, method)
    _add_features(sub)
    _add_mix(sub)
    from .evaluate import add_eval_parser
    add_eval_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)
