"""Regenerate the self-distillation corpus: the target's own greedy answers to training prompts.

    python -m dart_core.training.regenerate --target bundled \\
        --prompts PROMPTS.jsonl --out corpus/smollm2-135m-instruct.jsonl.gz \\
        --fraction 0.31 --seed 0 --dtype bfloat16 --threads 2

Each prompt (``{"id", "source", "category", "prompt"}`` per line) is rendered with the target's
chat template as one user turn; prompts longer than ``--max-prompt-tokens`` are skipped; the
answer is the target's greedy continuation (at most ``--max-new-tokens``, EOS included when
reached). Output lines: ``id, source, category, prompt_ids, response_ids, response`` (the format
``dart_core.train`` reads).

Greedy decoding goes through the engine with prompt-lookup drafting by default: lossless, so
the tokens are exactly the target's greedy answer, only faster on repetitive text
(``--drafter none`` for plain decoding).

Resumable: rows go to ``OUT.partial.jsonl`` as they finish (flushed per line); a rerun skips the
ids already there (a torn last line is dropped). When every prompt is done the partial file
becomes OUT (gzip-compressed when OUT ends in .gz) atomically. A rerun over a finished OUT (a larger
``--per-category`` pick, say) starts its partial file from OUT's rows, so it answers only the prompts
OUT lacks and the new OUT holds both.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see dart_core/training/cli.py

logger = logging.getLogger(__name__)


def read_prompts(path: str | Path) -> list[dict]:
    from .data import DataError, open_text
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prompt file {path} does not exist (--prompts)")
    rows = []
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                if not isinstance(d.get("prompt"), str) or not d["prompt"]:
                    raise KeyError("prompt")
            except (json.JSONDecodeError, KeyError, AttributeError) as exc:
                raise DataError(f"{path}:{lineno}: expected a JSON object with a non-empty 'prompt' ({exc})") from None
            d.setdefault("id", f"line{lineno}")
            rows.append(d)
    return rows


def select_prompts(rows: list[dict], fraction: float = 1.0, limit: int | None = None, seed: int = 0,
                   per_category: int | None = None) -> list[dict]:
    """A seeded random ``fraction`` of the prompts (in file order), then at most ``per_category`` of each
    category (a seeded random pick, kept in file order; so a small kind is not drowned by a large one), then the
    first ``limit``."""
    if fraction < 1.0:
        keep = np.random.default_rng(seed).random(len(rows)) < fraction
        rows = [r for r, k in zip(rows, keep) if k]
    if per_category is not None:
        by_kind: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by_kind.setdefault(str(r.get("category")), []).append(i)
        rng = np.random.default_rng([seed, 1])
        picked = set()
        for kind in sorted(by_kind):
            idx = by_kind[kind]
            picked.update(idx[j] for j in rng.permutation(len(idx))[:per_category].tolist())
        rows = [r for i, r in enumerate(rows) if i in picked]
    return rows[:limit] if limit is not None else rows


def _done_ids(partial: Path) -> set[str]:
    """Ids already in the partial file; a torn last line (interrupted write) is cut off."""
    if not partial.is_file():
        return set()
    data = partial.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut != len(data):
        with open(partial, "r+b") as f:
            f.truncate(cut)
        data = data[:cut]
    ids = set()
    for line in data.decode("utf-8").splitlines():
        if line.strip():
            ids.add(str(json.loads(line)["id"]))
    return ids


def regenerate(target, prompts: Sequence[dict], out: str | Path, *, max_prompt_tokens: int = 640,
               max_new_tokens: int = 384, drafter: str = "prompt_lookup", progress: bool = True) -> dict:
    """Answer ``prompts`` greedily with ``target`` (a TargetModel) into ``out`` (resumable, see module doc)."""
    from tqdm.auto import tqdm

    from ..config import GenerationConfig
    from ..methods import build_engine
    from ..models.templates import encode_chat, get_template
    from .data import open_text

    out = Path(out)
    partial = out.with_name(out.name + ".partial.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file() and not partial.exists():
        # A finished corpus extended by a larger pick: greedy answers do not change, so keep them.
        with open_text(out) as src, open(partial, "w", encoding="utf-8") as dst:
            shutil.copyfileobj(src, dst)
    done = _done_ids(partial)
    template = get_template(target.template_name)
    engine = build_engine(target, "prompt_lookup" if drafter == "prompt_lookup" else "vanilla")
    stats = {"prompts": len(prompts), "resumed": len(done), "written": 0, "skipped_long": 0}
    todo = [p for p in prompts if str(p["id"]) not in done]
    with open(partial, "a", encoding="utf-8") as f:
        for p in tqdm(todo, desc="regenerate", unit="prompt", disable=not progress, file=sys.stderr,
                      dynamic_ncols=True):
            ids = encode_chat(target.tokenizer, template, [{"role": "user", "content": p["prompt"]}])
            if len(ids) > max_prompt_tokens:
                stats["skipped_long"] += 1
                continue
            cfg = GenerationConfig(max_new_tokens=max_new_tokens, max_length=len(ids) + max_new_tokens + 1,
                                   temperature=0.0, profile_stages=False)
            res = engine.generate(ids, cfg)
            f.write(json.dumps({"id": p["id"], "source": p.get("source"), "category": p.get("category"),
                                "prompt_ids": ids, "response_ids": res.tokens, "response": res.text},
                               ensure_ascii=False) + "\n")
            f.flush()
            stats["written"] += 1
    # Every prompt is done (or skipped): publish the partial file as OUT, atomically.
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".gz":
        with open(partial, "rb") as src, gzip.open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        shutil.copyfile(partial, tmp)
    os.replace(tmp, out)
    partial.unlink()
    stats["out"] = str(out)
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dart_core.training.regenerate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target model (default: the bundled SmolLM2-135M-Instruct)")
    ap.add_argument("--prompts", required=True, help="JSONL prompts with id, source, category, prompt")
    ap.add_argument("--out", required=True, help="output .jsonl or .jsonl.gz")
    ap.add_argument("--fraction", type=float, default=1.0, help="seeded random share of the prompts to answer")
    ap.add_argument("--per-category", type=int, default=None,
                    help="at most this many prompts of each category (a seeded random pick, after --fraction)")
    ap.add_argument("--limit", type=int, default=None, help="at most this many prompts (after --per-category)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompt-tokens", type=int, default=640)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--dtype", default="bfloat16", help="target dtype (the shipped heads' corpus used bfloat16 on CPU)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--drafter", choices=("prompt_lookup", "none"), default="prompt_lookup",
                    help="lossless drafting used to speed up greedy decoding")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import torch

    from ..models.loader import ModelLoadError, load_target
    from .data import DataError
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        prompts = select_prompts(read_prompts(args.prompts), args.fraction, args.limit, args.seed,
                                 per_category=args.per_category)
        target = load_target(args.target, dtype=args.dtype, device=args.device)
        stats = regenerate(target, prompts, args.out, max_prompt_tokens=args.max_prompt_tokens,
                           max_new_tokens=args.max_new_tokens, drafter=args.drafter, progress=args.progress)
    except (DataError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished rows are kept; rerun the same command to continue", file=sys.stderr)
        return 130
    print(json.dumps(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
