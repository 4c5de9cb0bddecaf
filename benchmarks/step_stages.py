"""Where a speculative step's time goes, in place: each stage's median per step for fixed trees.

    python benchmarks/step_stages.py --threads 2                          # 6 built-in prompts, one per category
    python benchmarks/step_stages.py --threads 2 --questions mt_bench gsm8k --limit 3 --max-new-tokens 96
    python benchmarks/step_stages.py --threads 2 --budgets 1,2,4,8 --eagle3-trees 2/0/1,3/1/2 --json stages.json
    python benchmarks/step_stages.py --threads 2 --context-weights 0,0.5 --questions context_dev --limit-per-category 2

Runs vanilla decoding, DART at each fixed ``--budgets`` (for each ``--context-weights``: 0 is the paper's DART, above
0 DART + context; docs/ARCHITECTURE.md section 5a) and EAGLE-3 at each fixed ``--eagle3-trees``
(total/depth/top_k) on the same prompts, every method on a prompt before the next prompt (so load drifts
hit all alike), greedy. For every method it prints the median per step of each stage as the engine timed it
(draft forward, tree build, verify), the verify as a multiple of vanilla's step, the draft (forward + build) as
a multiple of vanilla's step, tokens per step, and tokens/s against vanilla (answer tokens over the sum of the
methods' wall times). It checks that every answer equals vanilla's. A measurement, not a test.

The built-in prompts are not in the heads' training data (one each: writing, math, QA, RAG, summary,
translation); ``--questions`` takes Spec-Bench files or named sets instead (first turns).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dart_core  # noqa: E402,F401  (before torch: its idle OpenMP threads spin only briefly, dart_core/openmp.py)
import torch  # noqa: E402

from dart_core.config import GenerationConfig, dtype_name  # noqa: E402
from dart_core.engine.decoding import SpeculativeEngine  # noqa: E402
from dart_core.hardware import describe_machine  # noqa: E402
from dart_core.loading import bundled_head_dir, open_ngram  # noqa: E402
from dart_core.methods import Parts, TreeRequest, build_engine  # noqa: E402
from dart_core.models.heads.dart import load_dart_head  # noqa: E402
from dart_core.models.heads.eagle3 import load_eagle3_for_target  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from dart_core.models.templates import encode_chat, get_template  # noqa: E402

PROMPTS = [
    "Write a short note to a neighbour asking them to water my plants while I am away for a week.",
    "A shop sells pencils at 3 for 45 cents. How much do 14 pencils cost? Explain each step.",
    "Why does ice float on water? Answer in a few sentences.",
    "Using the text below, say when the bridge opened and how long it is.\n\nThe Harbour Bridge was opened in 1932 "
    "after eight years of construction. Its main span is 503 metres long, and it carries rail, road and foot "
    "traffic between the city centre and the north shore.",
    "Summarise in two sentences: Regular exercise improves heart health, helps control weight, lifts mood through "
    "the release of endorphins and improves sleep quality. Experts recommend at least 150 minutes of moderate "
    "activity each week, spread over several days.",
    "Translate into French: The library opens at nine in the morning and closes at six in the evening.",
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--budgets", default="1,2,4,8", help="DART budgets, comma-separated (default 1,2,4,8)")
    p.add_argument("--context-weights", default="0",
                   help="DART's context weights, comma-separated (default 0: the paper's DART only; 0,0.5 adds "
                        "DART + context at each budget)")
    p.add_argument("--eagle3-trees", default="2/0/1,3/1/2",
                   help="EAGLE-3 total/depth/top_k settings, comma-separated (default 2/0/1,3/1/2)")
    p.add_argument("--questions", nargs="*", help="Spec-Bench files or named sets (first turns) instead of the "
                                                   "built-in prompts")
    p.add_argument("--limit", type=int, default=None, help="questions per set")
    p.add_argument("--limit-per-category", type=int, default=None, help="questions per category of each set")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target = load_target(None, dtype=args.dtype, device="cpu")
    store = open_ngram(None, target.tokenizer)
    template = get_template(target.template_name)
    if args.questions:
        from dart_core.bench.questions import load_question_sets
        texts = [q.turns[0] for q in load_question_sets(args.questions, args.limit, args.data_dir,
                                                                   per_category=args.limit_per_category)]
    else:
        texts = PROMPTS[: args.limit] if args.limit else PROMPTS
    prompts = [encode_chat(target.tokenizer, template, [{"role": "user", "content": t}]) for t in texts]
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0,
                           max_length=max(len(x) for x in prompts) + args.max_new_tokens + 80)

    engines: dict[str, SpeculativeEngine] = {"vanilla": build_engine(target, "vanilla")}
    parts = Parts(dart_head=load_dart_head(bundled_head_dir(), target), ngram=store,
                  eagle3_head=load_eagle3_for_target(target, None, None))
    weights = [float(x) for x in args.context_weights.split(",") if x]
    for w in weights:
        for b in (int(x) for x in args.budgets.split(",") if x):
            name = f"DART budget {b}" if w == 0 else f"DART + context {w:g}, budget {b}"
            engines[name] = build_engine(target, "dart", parts, TreeRequest({"budget": b, "context_weight": w}))
    for setting in (s for s in args.eagle3_trees.split(",") if s):
        total, depth, top_k = (int(x) for x in setting.split("/"))
        engines[f"EAGLE-3 {setting}"] = build_engine(
            target, "eagle3", parts, TreeRequest({"total_token": total, "depth": depth, "top_k": top_k}))
    for e in engines.values():   # one warm-up answer each (caches, first-call costs)
        e.generate(prompts[0], GenerationConfig(max_new_tokens=8, max_length=cfg.max_length))

    steps: dict[str, list] = {name: [] for name in engines}
    wall = {name: 0.0 for name in engines}
    tokens = {name: 0 for name in engines}
    mismatches = {name: 0 for name in engines}
    for ids in prompts:
        truth = None
        for name, e in engines.items():
            res = e.generate(ids, cfg)
            truth = res.tokens if truth is None else truth
            mismatches[name] += res.tokens != truth
            steps[name] += res.traces
            wall[name] += res.stats.wall_s
            tokens[name] += len(res.tokens)

    def med(name: str, stage: str) -> float:
        return 1000 * statistics.median(tr.timings.get(stage, 0.0) for tr in steps[name])

    machine = describe_machine("cpu")
    plain = med("vanilla", "verify")
    base_tps = tokens["vanilla"] / wall["vanilla"]
    print(f"# stages per step, in place: {machine['cpu_model']}, {machine['torch_threads']} threads, GEMM path "
          f"{machine.get('gemm_path', '?')}, dtype {dtype_name(target.dtype)}, {len(prompts)} prompts x "
          f"{args.max_new_tokens} tokens, medians per step (ms)")
    print("| method | draft forward | tree build | verify | verify x plain | draft x plain | tokens per step "
          "| tok/s vs vanilla | answers = vanilla |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    rows = {}
    for name in engines:
        fwd, build, verify = med(name, "draft_forward"), med(name, "tree_build"), med(name, "verify")
        per_step = tokens[name] / max(len(steps[name]), 1)
        speed = tokens[name] / wall[name] / base_tps
        same = "yes" if mismatches[name] == 0 else f"NO ({mismatches[name]} differ)"
        rows[name] = {"draft_forward_ms": fwd, "tree_build_ms": build, "verify_ms": verify,
                      "verify_x_plain": verify / plain, "draft_x_plain": (fwd + build) / plain,
                      "tokens_per_step": per_step, "speed_vs_vanilla": speed, "answers_equal": mismatches[name] == 0}
        print(f"| {name} | {fwd:.2f} | {build:.2f} | {verify:.2f} | {verify / plain:.2f} | {(fwd + build) / plain:.3f} "
              f"| {per_step:.2f} | {speed:.2f}x | {same} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "prompts": len(prompts),
                                               "max_new_tokens": args.max_new_tokens, "rows": rows}, indent=2))
    return 0 if all(m == 0 for m in mismatches.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
