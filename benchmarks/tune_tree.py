"""Tree-budget (and N-gram table) sweep: tau and tokens/s of DART per setting, on dev questions.

The published defaults (budget 60, beam 20, top-k 25) were chosen for 8B targets on GPUs, where a
61-node verify costs about as much as a 1-token step. On a CPU the verify cost grows with the
tree, so the best budget is smaller; this script measures where. It answers the same dev
questions (not the benchmark sets) with vanilla decoding and DART at each budget, interleaved
question by question so that machine noise hits every arm alike, and prints ratios from this run.

    python benchmarks/tune_tree.py --budgets 8,15,25,40,60 --limit 12 --max-new-tokens 128 \\
        --threads 2 --json runs/tune_dart.json --plot docs/tune_dart.png

Run it on a quiet machine (nothing else running); tau does not depend on noise, tokens/s does.
``--tables a.dngram,b.dngram,none`` compares N-gram tables (or none) at each budget: that choice
needs only tau, so it may run while the machine is busy.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEV_QUESTIONS = ROOT.parent / "shared" / "data" / "eval" / "alpaca.jsonl"


def parse_int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"budgets must be >= 1, got {text!r}")
    return values


def main(argv=None) -> int:
    from dart_core.api import is_bundled_target, load_head_and_ngram, open_ngram
    from dart_core.bench import EngineRunner, load_questions, run_benchmark
    from dart_core.config import GenerationConfig
    from dart_core.drafters.dart import DartDrafter
    from dart_core.models.loader import load_target
    from dart_core.pruning import PruningConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", default=str(DEV_QUESTIONS), help="Spec-Bench-format dev questions")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budgets", type=parse_int_list, default=parse_int_list("8,15,25,40,60"))
    p.add_argument("--beam-width", type=int, default=None, help="default: min(budget, 20)")
    p.add_argument("--tables", default=None,
                   help="comma-separated N-gram tables to compare ('none' = no N-gram term); default: the default table")
    p.add_argument("--base-model-name-or-path", default=None)
    p.add_argument("--dart-model-name-or-path", default=None)
    p.add_argument("--ngram-model-name-or-path", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--plot", default=None, help="PNG of tau and speedup vs budget (needs matplotlib)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)

    target = load_target(args.base_model_name_or_path, dtype=args.dtype)
    head, _ = load_head_and_ngram(target, args.base_model_name_or_path, args.dart_model_name_or_path, None,
                                  with_ngram=False)
    tables = args.tables.split(",") if args.tables else [None]
    stores = {t: open_ngram(t, target.tokenizer, bundled=is_bundled_target(args.base_model_name_or_path))
              for t in tables}
    runners = {"vanilla": EngineRunner("vanilla", target, None)}
    arms = {}   # runner name -> (budget, table)
    default = PruningConfig()
    for t in tables:
        for b in args.budgets:
            beam = args.beam_width or min(b, default.beam_width)
            cfg = PruningConfig(budget=b, beam_width=beam)
            name = f"dart@{b}" + (f"/{Path(t).stem}" if len(tables) > 1 else "")
            arms[name] = (b, t)
            runners[name] = EngineRunner(name, target, DartDrafter(head, stores[t], target.eos_token_ids, pruning=cfg))
    questions = load_questions(args.questions, args.limit)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, max_length=2048)
    records = run_benchmark(target, runners, questions, config)

    def rate(name):
        recs = records[name]
        new = sum(r.new_tokens for r in recs)
        wall = sum(r.wall_s for r in recs)
        steps = sum(r.steps for r in recs)
        committed = sum(r.new_tokens - 1 for r in recs if r.steps)
        stage = {k: sum(r.stage_s.get(k, 0.0) for r in recs) * 1e3 / max(steps, 1)
                 for k in ("draft_forward", "tree_build", "verify", "commit")}
        return {"tokens_per_s": new / wall, "tau": committed / max(steps, 1), "steps": steps,
                "ms_per_step": stage}

    base = rate("vanilla")
    # bf16 verify of a tree and a 1-token step round differently, so near-tied argmaxes may flip;
    # fp32 output is identical (tests/test_dart_head.py asserts it).
    bf16_note = ": bf16 near-ties" if target.dtype == torch.bfloat16 else "!"
    rows = []
    print("| arm | tau | tok/s | speedup | draft ms | tree ms | verify ms |\n|---|---|---|---|---|---|---|")
    print(f"| vanilla | 1.00 | {base['tokens_per_s']:.1f} | 1.00x | – | – | {base['ms_per_step']['verify']:.1f} |")
    for name, (b, t) in arms.items():
        r = rate(name)
        r["arm"], r["budget"], r["table"] = name, b, t or "default"
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"]
        identical = all(a.tokens == v.tokens for a, v in zip(records[name], records["vanilla"]))
        r["identical_to_vanilla"] = identical
        rows.append(r)
        ms = r["ms_per_step"]
        print(f"| {name} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {ms['draft_forward']:.1f} | "
              f"{ms['tree_build']:.1f} | {ms['verify']:.1f} |" + ("" if identical else f" (differs from vanilla{bf16_note})"))
    best = max(rows, key=lambda r: r["speedup"])
    print(f"\nfastest arm on this machine: {best['arm']} ({best['speedup']:.2f}x, tau {best['tau']:.2f}); "
          f"highest tau: {max(rows, key=lambda r: r['tau'])['arm']}")
    report = {"questions": args.questions, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "threads": torch.get_num_threads(), "dtype": str(target.dtype), "tables": args.tables,
              "vanilla": base, "sweep": rows, "best_budget": best["budget"],
              "command": ["python", "benchmarks/tune_tree.py", *(sys.argv[1:] if argv is None else argv)]}
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        if len(tables) > 1:
            raise SystemExit("--plot draws one table's budget curve: pass a single --tables entry")
        plot(report, args.plot)
    return 0


def plot(report: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    xs = [r["budget"] for r in report["sweep"]]
    fig, ax1 = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax1.plot(xs, [r["tau"] for r in report["sweep"]], "o-", color="#0072B2", label="tau (tokens per verify)")
    ax1.set_xlabel("tree budget (drafted nodes per step)")
    ax1.set_ylabel("tau")
    ax2 = ax1.twinx()
    ax2.plot(xs, [r["speedup"] for r in report["sweep"]], "s--", color="#E69F00", label="speedup vs vanilla")
    ax2.axhline(1.0, color="#999999", lw=0.8)
    ax2.set_ylabel("speedup vs vanilla (this run)")
    lines = ax1.get_lines() + ax2.get_lines()[:1]
    ax1.legend(lines, [ln.get_label() for ln in lines], loc="lower right", fontsize=8)
    ax1.set_title(f"DART tree budget, {report['limit']} dev questions, {report['max_new_tokens']} tokens", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


if __name__ == "__main__":
    raise SystemExit(main())
