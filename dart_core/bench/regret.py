"""The tree chooser's regret against the best fixed tree, per method and kind of question, offline.

    python -m dart_core.bench.regret --questions context_dev --group category --limit-per-category 10 \\
        --max-new-tokens 128 --threads 2 --methods dart,dart_context,prompt_lookup [--json OUT.json]

One greedy pass per question records, at every position, the tree each method would draft at every setting of
its space (dart_core/sizing/replay.py); each fixed setting's run and the chooser's (the same AutoTree the benchmark
runs, fed the recorded trees and their accepted paths) are then walked over the record and priced by one cost model
(the target's verify curve and commit, measured or cached, and each drafter's draft cost, timed at start). Regret =
the chooser's seconds / the best fixed setting's seconds over a kind's questions - 1. Greedy only (a sampled answer
depends on the tree).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from ..config import ConfigError
from .questions import BenchInputError, load_question_sets, resolve_question_source
from .runners import METHODS, tree_costs

logger = logging.getLogger(__name__)

#: Methods whose every setting can be drafted at one position (sizing/replay.py): DART's budgets from one head
#: forward, EAGLE-3's settings one after another from the same head state (rewound between them), prompt lookup's
#: lengths from the context alone. The hybrid switches drafters by the context match and is not replayed.
REPLAYABLE = ("dart", "dart_context", "dart_no_ngram", "eagle3", "eagle3_context", "prompt_lookup")
GROUPS = ("set", "category")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dart_core.bench.regret",
                                description="The tree chooser's offline regret against the best fixed tree.")
    p.add_argument("--questions", required=True, nargs="+", metavar="NAME|FILE.jsonl",
                   help="question sets or files, as python -m dart_core.bench takes them")
    p.add_argument("--data-dir", default=None, metavar="DIR")
    p.add_argument("--methods", default="dart,dart_context,prompt_lookup",
                   help=f"comma-separated, of {', '.join(REPLAYABLE)}")
    p.add_argument("--group", choices=GROUPS, default="set",
                   help="a kind is a question set (default) or a category (context_dev's translation, ...)")
    p.add_argument("--limit", type=int, default=None, metavar="K")
    p.add_argument("--limit-per-category", type=int, default=None, metavar="K")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    p.add_argument("--base-model-name-or-path", default=None, metavar="M")
    p.add_argument("--threads", type=int, default=None, metavar="N")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT.json")
    p.add_argument("--save-logs", default=None, metavar="LOGS.pkl",
                   help="keep the recorded answers (every setting's tree at every position) for walks without the "
                        "target: dart_core.sizing.replay.load_logs")
    for add in dict.fromkeys(METHODS[name].add_arguments for name in REPLAYABLE):   # each group once
        if add is not None:
            add(p)
    return p


def parse_methods(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in REPLAYABLE]
    if not names or bad:
        raise BenchInputError(f"--methods {text!r}: choose among {', '.join(REPLAYABLE)} (the hybrid is not "
                              "replayed: it switches drafters by the context match)")
    return list(dict.fromkeys(names))


def regret_table(logs_by_method: dict, drafters: dict, costs) -> list[dict]:
    """Per method and kind: the best fixed setting, the chooser, their ms per token and tau, the regret."""
    from ..sizing.replay import walk_chooser, walk_fixed
    from ..sizing.spaces import tree_space

    rows = []
    for name, logs in logs_by_method.items():
        drafter = drafters[name]
        space = tree_space(drafter)
        _, per_answer = walk_chooser(logs, drafter, costs)       # one engine over every answer, in order
        kinds = sorted({log.kind for log in logs})
        for kind in kinds + (["all"] if len(kinds) > 1 else []):
            idx = [i for i, log in enumerate(logs) if kind in ("all", log.kind)]
            mine = [logs[i] for i in idx]
            fixed = {c: walk_fixed(mine, c, costs, drafter.name) for c in space}
            best_choice, best = min(fixed.items(), key=lambda kv: (kv[1].seconds, kv[0].nodes))
            plain = fixed[space[0]]
            chooser = per_answer[idx[0]]
            for i in idx[1:]:
                chooser = chooser.add(per_answer[i])
            rows.append({
                "method": name, "kind": kind, "answers": len(mine), "tokens": chooser.tokens,
                "best_fixed": best_choice.label, "best_ms_per_token": round(best.ms_per_token, 4),
                "best_tau": round(best.tau, 3), "chooser_ms_per_token": round(chooser.ms_per_token, 4),
                "chooser_tau": round(chooser.tau, 3), "regret": round(chooser.seconds / best.seconds - 1.0, 4),
                "plain_ms_per_token": round(plain.ms_per_token, 4),
                "chooser_speedup_vs_plain": round(plain.seconds / chooser.seconds, 4),
                "best_speedup_vs_plain": round(plain.seconds / best.seconds, 4),
                "chooser_plain_share": round(chooser.plain_steps / max(chooser.steps, 1), 4),
                "chooser_settings": dict(sorted(chooser.chosen.items(), key=lambda kv: -kv[1])[:4]),
                "fixed": {c.label: round(w.ms_per_token, 4) for c, w in fixed.items()}})
    return rows


def render(rows: list[dict]) -> str:
    out = ["| method | kind | answers | best fixed | its ms/token (tau) | chooser ms/token (tau) | regret | "
           "chooser vs plain | plain steps |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['method']} | {r['kind']} | {r['answers']} | {r['best_fixed']} | "
                   f"{r['best_ms_per_token']:.2f} ({r['best_tau']:.2f}) | {r['chooser_ms_per_token']:.2f} "
                   f"({r['chooser_tau']:.2f}) | {100 * r['regret']:+.1f}% | {r['chooser_speedup_vs_plain']:.2f}x | "
                   f"{100 * r['chooser_plain_share']:.0f}% |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from ..models.loader import ModelLoadError, load_target, resolve_device, resolve_dtype
    from ..models.templates import encode_chat, get_template
    from ..sizing.auto import make_auto
    from ..sizing.replay import record

    try:
        methods = parse_methods(args.methods)
        if args.max_new_tokens < 2:
            raise BenchInputError(f"--max-new-tokens must be >= 2 (a step needs a token after the root), got "
                                  f"{args.max_new_tokens}")
        for flag in ("limit", "limit_per_category", "threads"):
            v = getattr(args, flag)
            if v is not None and v <= 0:
                raise BenchInputError(f"--{flag.replace('_', '-')} must be positive, got {v}")
        questions = load_question_sets([resolve_question_source(q, args.data_dir) for q in args.questions],
                                       args.limit, per_category=args.limit_per_category)
        device = resolve_device("cpu")
        dtype = resolve_dtype(args.dtype, device)
    except (BenchInputError, ConfigError, ValueError) as exc:
        parser.error(str(exc))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        target = load_target(args.base_model_name_or_path, dtype=dtype, device=str(device))
    except ModelLoadError as exc:
        parser.error(str(exc))
    args.tree = "fixed"                       # the factories hand back the drafters themselves
    drafters = {name: METHODS[name].factory(target, args).engine.drafter for name in methods}
    costs = tree_costs(target, args)
    for d in drafters.values():               # each drafter's draft cost, timed once (as the benchmark's start)
        make_auto(d, costs)
    template = get_template(target.template_name)
    logs = {name: [] for name in methods}
    t0 = time.perf_counter()
    for n, q in enumerate(questions, 1):
        prompt = encode_chat(target.tokenizer, template, [{"role": "user", "content": q.turns[0]}])
        kind = q.question_set if args.group == "set" else q.category
        for name, log in record(target, drafters, prompt, args.max_new_tokens, kind).items():
            logs[name].append(log)
        if n % 5 == 0 or n == len(questions):
            logger.info("recorded %d/%d answers (%.0f s)", n, len(questions), time.perf_counter() - t0)
    if args.save_logs:
        from ..sizing.replay import save_logs
        save_logs(args.save_logs, logs, costs)
    rows = regret_table(logs, drafters, costs)
    text = render(rows)
    sys.stdout.write(text)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps({
            "command": ["python", "-m", "dart_core.bench.regret", *(sys.argv[1:] if argv is None else argv)],
            "cost_model": costs.describe(), "rows": rows}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
