"""Held-out accuracy of trained heads, per kind of prompt: ``python -m dart_core.train eval``.

    python -m dart_core.train eval --data runs/mixed.jsonl.gz --heldout-permille 150 \\
        --head assets/dart/smollm2-135m-instruct --head runs/dart_ctx --threads 2

reads the corpus, takes the rows the trainer holds out at that ``--heldout-permille`` (the same hash split, so a
head trained on this corpus at this setting never saw them; ``--heldout-permille 1000`` takes every row), groups
them by their ``category`` (else their ``source``) and scores each head on each group with its trainer's own
evaluation (DART: hit@1 per future position over sampled prefixes; EAGLE-3: per unrolled step). A head's method
is read from its config.json. Features come from the trainers' cache when one matches the corpus, else the
target runs on the fly; the argmax is the target's full-vocabulary one either way.
"""
from __future__ import annotations

import json
import logging
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

logger = logging.getLogger(__name__)

#: config.json architecture -> trainer name (cli.TRAINERS)
_ARCHITECTURES = {"LlamaForCausalLMDart": "dart", "LlamaForCausalLMEagle3": "eagle3"}


@dataclass
class HeadScore:
    head: str
    method: str
    group: str
    rows: int
    hit1: list[float]
    mean_top1_chain: float | None


def head_method(path: str | Path) -> str:
    """'dart' or 'eagle3', from the head directory's config.json."""
    from .run_config import TrainError

    cfg_path = Path(path) / "config.json"
    try:
        arch = json.loads(cfg_path.read_text(encoding="utf-8")).get("architectures") or []
    except FileNotFoundError:
        raise TrainError(f"--head {path}: no config.json there; give a head directory (e.g. "
                         "assets/dart/smollm2-135m-instruct or a training run's --out)") from None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise TrainError(f"--head {path}: config.json is not a JSON object ({exc})") from None
    for a in arch if isinstance(arch, list) else []:
        if a in _ARCHITECTURES:
            return _ARCHITECTURES[a]
    raise TrainError(f"--head {path}: architectures {arch!r} is neither a DART head ({'LlamaForCausalLMDart'}) "
                     "nor an EAGLE-3 head (LlamaForCausalLMEagle3)")


def row_groups(data: str | Path, heldout_permille: int, max_rows: int | None = None,
               vocab_size: int | None = None, kinds: Sequence[str] | None = None) -> dict[str, list]:
    """The held-out rows of ``data`` (the trainers' split) by kind: category, else source, else '-';
    at most ``max_rows`` per kind (the first in file order); only ``kinds`` when given."""
    from .data import load_distill_rows, open_text, resolve_data, split_rows

    rows = load_distill_rows(data, vocab_size=vocab_size)
    wanted = set(kinds) if kinds else None
    kind_of: dict[str, str] = {}
    with open_text(resolve_data(data)) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                d = json.loads(line)
                kind_of[str(d.get("id", f"line{lineno}"))] = str(d.get("category") or d.get("source") or "-")
    _, heldout = split_rows(rows, heldout_permille) if heldout_permille < 1000 else ([], rows)
    groups: dict[str, list] = defaultdict(list)
    for r in heldout:
        kind = kind_of.get(r.id, "-")
        if wanted is not None and kind not in wanted:
            continue
        g = groups[kind]
        if max_rows is None or len(g) < max_rows:
            g.append(r)
    return dict(sorted(groups.items()))


def evaluate_heads(heads: Sequence[str], data: str, *, target: str | None = None, heldout_permille: int = 20,
                   max_rows: int | None = None, max_seq_len: int = 1024, features: str = "auto",
                   dtype: str = "auto", device: str = "auto", progress: bool = False,
                   kinds: Sequence[str] | None = None) -> list[HeadScore]:
    """Every head scored on every kind of ``data``'s held-out rows (see the module doc)."""
    from ..models.loader import load_target
    from .dart_trainer import DartTrainConfig
    from .data import truncate
    from .eagle3_trainer import Eagle3TrainConfig
    from .ranks import Ranks
    from .run_config import TrainError
    from .runner import feature_source, resolve_runtime

    if not heads:
        raise TrainError("give at least one --head")
    if not 0 <= heldout_permille <= 1000:
        raise TrainError(f"--heldout-permille must be in [0, 1000], got {heldout_permille}")
    methods = [head_method(h) for h in heads]
    scores: list[HeadScore] = []
    target_model = None
    groups = None
    features_fn = None
    for head_dir, method_name in zip(heads, methods):
        config_class = DartTrainConfig if method_name == "dart" else Eagle3TrainConfig
        cfg = config_class(data=str(data), out="", target=target, features=features, dtype=dtype,
                                         device=device, argmax="full", progress=progress,
                                         heldout_permille=min(heldout_permille, 999))
        method = cfg.method(cfg)
        rt = resolve_runtime(cfg, Ranks({}), method)
        if target_model is None:
            target_model = load_target(target, dtype=rt.dtype, device=str(rt.device))
            groups = row_groups(data, heldout_permille, max_rows, vocab_size=target_model.vocab_size, kinds=kinds)
            groups = {k: [truncate(r, max_seq_len) for r in v] for k, v in groups.items()}
            if not any(groups.values()):
                raise TrainError(f"{data} holds no held-out rows at --heldout-permille {heldout_permille}")
        if features_fn is None:   # one lookup (it hashes the corpus and every target weight) for all heads
            features_fn, _ = feature_source(cfg, target_model, rt)
        rt.features = features_fn
        head = method.load_head(head_dir, target_model, rt.device, source=f"--head {head_dir}")
        if method_name == "dart":
            cfg.draft_length = head.config.draft_length
        for kind, rows in groups.items():
            ev = method.evaluate(head, target_model, [r for r in rows if len(r.response_ids) >= 2], rt)
            scores.append(HeadScore(head=str(head_dir), method=method_name, group=kind, rows=len(rows),
                                    hit1=[round(float(x), 4) for x in ev["hit@1"]],
                                    mean_top1_chain=ev.get("mean_top1_chain")))
    return scores


def format_scores(scores: Sequence[HeadScore], positions: int = 3) -> str:
    """A Markdown table: one line per head and kind, hit@1 at t+1..t+positions and the mean top-1 chain."""
    cols = " | ".join(f"t+{i + 1}" for i in range(positions))
    lines = [f"| head | method | kind | rows | {cols} | mean top-1 chain |",
             "|---|---|---|---:|" + "---:|" * positions + "---:|"]
    for s in scores:
        hits = " | ".join(f"{x:.3f}" for x in s.hit1[:positions])
        chain = f"{s.mean_top1_chain:.3f}" if s.mean_top1_chain is not None else "-"
        lines.append(f"| {s.head} | {s.method} | {s.group} | {s.rows} | {hits} | {chain} |")
    return "\n".join(lines)


def add_eval_parser(sub) -> None:
    import argparse

    p = sub.add_parser("eval", help="score heads per kind of prompt on a corpus's held-out rows",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--head", action="append", required=True, metavar="DIR",
                   help="a DART or EAGLE-3 head directory (repeat to compare heads on the same rows)")
    p.add_argument("--data", required=True, help="distillation corpus (.jsonl[.gz] with prompt_ids, response_ids)")
    p.add_argument("--target", default=None, help="target model: Hub id, local dir, .gguf, or 'bundled' (default)")
    p.add_argument("--heldout-permille", type=int, default=20,
                   help="the trainer's held-out split to score (1000: every row)")
    p.add_argument("--max-rows", type=int, default=None, help="at most this many rows of each kind")
    p.add_argument("--kinds", default=None, metavar="A,B", help="only these kinds (categories, else sources)")
    p.add_argument("--max-seq-len", type=int, default=1024, help="tokens per row at most (the trainers' cut)")
    p.add_argument("--features", default="auto", metavar="auto|none|DIR")
    p.add_argument("--positions", type=int, default=3, help="future positions shown in the table")
    p.add_argument("--json", dest="json_out", default=None, metavar="FILE", help="also write the scores as JSON")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.set_defaults(func=run_eval)


def run_eval(args) -> int:
    import torch

    from ..models.heads.files import HeadError
    from ..models.loader import ModelLoadError
    from .data import DataError
    from .run_config import TrainError

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        scores = evaluate_heads(args.head, args.data, target=args.target, heldout_permille=args.heldout_permille,
                                max_rows=args.max_rows, max_seq_len=args.max_seq_len, features=args.features,
                                dtype=args.dtype, device=args.device, progress=args.progress,
                                kinds=args.kinds.split(",") if args.kinds else None)
    except (TrainError, DataError, HeadError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_scores(scores, args.positions))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([s.__dict__ for s in scores], indent=1) + "\n", encoding="utf-8")
    return 0
