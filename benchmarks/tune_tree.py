"""Tree-size sweep: tau and tokens/s of DART and EAGLE-3 per tree setting, on dev questions, against
automatic trees.

The published defaults (DART budget 60, beam 20, top-k 25; EAGLE-3 total_token 60, depth 7,
top_k 10) were chosen for 8B targets on GPUs, where a 61-node verify costs about as much as a
1-token step. On a CPU the verify cost grows with the tree, so the best tree is smaller; this
script measures where, and how close automatic trees (``--tree auto`` of the benchmark and the app:
the size chosen every few steps from a cost model measured at start, dart_core.sizing) get to the
best fixed tree. It answers the same dev questions (not the benchmark sets) with vanilla decoding
and every arm, interleaved question by question so that machine noise hits every arm alike, and
prints ratios from this run.

    python benchmarks/tune_tree.py --methods dart,eagle3 --budget 1 2 3 4 6 8 12 16 \
        --eagle3-trees 2/1/1,3/2/1,4/2/2,6/3/2,8/3/3,12/4/4 --limit 12 --max-new-tokens 128 \
        --threads 2 --json runs/tune_trees.json --plot docs/tune_trees.png

DART arms are tree budgets (``--budget``: drafted nodes, root excluded); EAGLE-3 arms are
total_token/depth/top_k triples (total_token counts the root); these sweep arms run fixed trees.
Each method also gets an ``auto`` arm (``dart@auto``, ``eagle3@auto``; ``--no-auto`` drops them):
its drafter under automatic trees, every auto arm pricing trees with one cost model of the target
measured once. Per method the script prints auto's speedup over vanilla next to the best fixed
arm's and their ratio (auto / best fixed), and the JSON keeps the trees auto chose. The plot puts
the sweep on one axis, nodes verified per step, with auto's speedup as a horizontal line. Run it on
a quiet machine (nothing else running); tau does not depend on noise, tokens/s does.
``--tables a.dngram,b.dngram,none`` compares N-gram tables (or none) at each DART budget: that
choice needs only tau, so it may run while the machine is busy.

``--questions`` takes a file or a named set (default ``alpaca``), resolved as ``python -m dart_core.bench``
does: ``--data-dir`` / ``DART_DATA_DIR``, then the Hugging Face cache, then (online) the Hub.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
import logging
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import dart_core  # noqa: E402,F401  (before torch: its idle OpenMP threads spin only briefly, dart_core/openmp.py)
import torch  # noqa: E402
from dart_core.config import dtype_name  # noqa: E402
from dart_core.presets import LIMITS  # noqa: E402

DEV_QUESTIONS = "alpaca"   # a named set (dart_core.bench.questions.QUESTION_SETS)
DEFAULT_BUDGETS = [1, 2, 3, 4, 6, 8, 12, 16]
DEFAULT_EAGLE3_TREES = "2/1/1,3/2/1,4/2/2,6/3/2,8/3/3,12/4/4"
#: --budget: each DART tree budget in the range of presets.LIMITS["budget"] (0 = no draft)
parse_budget = LIMITS["budget"].arg_type("--budget")


def parse_eagle3_trees(text: str) -> list[tuple[int, int, int]]:
    trees = []
    for item in (x for x in text.split(",") if x.strip()):
        try:
            total, depth, top_k = (int(v) for v in item.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"EAGLE-3 trees are total_token/depth/top_k triples such as 60/7/10, "
                                             f"got {item!r}") from None
        for key, v in zip(("eagle3_total_token", "eagle3_depth", "eagle3_top_k"), (total, depth, top_k)):
            why = LIMITS[key].problem(v)
            if why is not None:
                raise argparse.ArgumentTypeError(f"--eagle3-trees {item}: {LIMITS[key].label} {why}")
        trees.append((total, depth, top_k))
    if not trees:
        raise argparse.ArgumentTypeError("--eagle3-trees is empty")
    return trees


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in methods if m not in ("dart", "eagle3")]
    if bad or not methods:
        raise argparse.ArgumentTypeError(f"--methods takes dart and/or eagle3, got {text!r}")
    return methods


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", type=parse_methods, default=["dart"], help="dart, eagle3 or dart,eagle3")
    p.add_argument("--questions", default=DEV_QUESTIONS, metavar="NAME|FILE.jsonl",
                   help="Spec-Bench-format dev questions: a file or a named set (default: alpaca)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="folder holding the named sets' files (alpaca.jsonl, ...); default: $DART_DATA_DIR")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--budget", type=parse_budget, nargs="+", default=DEFAULT_BUDGETS, metavar="N",
                   help=f"{LIMITS['budget'].label}s to sweep (drafted nodes, root excluded; "
                        f"{LIMITS['budget'].describe()}), e.g. --budget 8 15 30")
    p.add_argument("--beam-width", type=LIMITS["beam_width"].arg_type("--beam-width"), default=None,
                   help="DART beam; default: min(budget, 20), at least 1")
    p.add_argument("--tables", default=None,
                   help="comma-separated N-gram tables to compare ('none' = no N-gram term); default: the default table")
    p.add_argument("--eagle3-trees", type=parse_eagle3_trees, default=parse_eagle3_trees(DEFAULT_EAGLE3_TREES),
                   help=f"EAGLE-3 arms as total_token/depth/top_k triples (default {DEFAULT_EAGLE3_TREES})")
    p.add_argument("--auto", action=argparse.BooleanOptionalAction, default=True,
                   help="an automatic-tree arm per method (<method>@auto) next to the fixed sweep arms "
                        "(default: on; --no-auto drops it)")
    p.add_argument("--base-model-name-or-path", default=None)
    p.add_argument("--dart-model-name-or-path", default=None)
    p.add_argument("--ngram-model-name-or-path", default=None)
    p.add_argument("--eagle3-model-name-or-path", default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--plot", default=None, help="PNG of tau and speedup vs tree size (needs matplotlib)")
    return p


def main(argv=None) -> int:
    from dart_core.api import load_head_and_ngram, open_ngram
    from dart_core.models.bundled import is_bundled_target
    from dart_core.bench.questions import BenchInputError, load_questions, resolve_question_source
    from dart_core.bench.runners import EngineRunner, run_benchmark
    from dart_core.bench.cli import cost_model_summary
    from dart_core.bench.report import chosen_text
    from dart_core.bench.summary import auto_tree_summary
    from dart_core.config import GenerationConfig
    from dart_core.drafters.eagle3 import Eagle3TreeConfig
    from dart_core.methods import Parts, TreeRequest, build_drafter
    from dart_core.models.heads.eagle3 import load_eagle3_for_target
    from dart_core.models.loader import load_target
    from dart_core.drafters.pruning import PruningConfig
    from dart_core.sizing.costs import CostModel

    p = build_parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    tables = args.tables.split(",") if args.tables else [None]
    if args.plot and len(tables) > 1:
        p.error("--plot draws one table's budget curve: pass a single --tables entry")
    try:  # bad tree settings fail before the model load
        e3_trees = [Eagle3TreeConfig(total_token=t, depth=d, top_k=k) for t, d, k in args.eagle3_trees]
    except ValueError as e:
        p.error(f"--eagle3-trees: {e}")
    try:
        default = PruningConfig()
        # budget 0 (no draft) still needs a beam of 1
        dart_cfgs = {b: PruningConfig(budget=b, beam_width=args.beam_width or max(1, min(b, default.beam_width)))
                     for b in args.budget}
    except ValueError as e:
        p.error(f"--budget/--beam-width: {e}")
    try:
        config = GenerationConfig(max_new_tokens=args.max_new_tokens, max_length=2048)
    except ValueError as e:
        p.error(f"--max-new-tokens: {e}")
    try:
        source = resolve_question_source(args.questions, args.data_dir)
        questions = load_questions(source.path, args.limit, question_set=source.name,
                                   prompt_category=source.prompt_category)
    except BenchInputError as e:
        p.error(str(e))

    target = load_target(args.base_model_name_or_path, dtype=args.dtype)
    costs = cost_model = None
    if args.auto:   # one cost model of the target for every auto arm, measured (or read from the cache) once
        costs = CostModel.load_or_measure(target)
        cost_model = cost_model_summary(costs)      # as measured: the run's steps refresh the model itself
        print(f"automatic trees: {cost_model['describe']}", file=sys.stderr)
    runners = {"vanilla": EngineRunner("vanilla", target, None)}
    arms = {}   # runner name -> {"method", "nodes" (verified per step, root included), settings...}
    auto_arms = {}   # runner name -> {"method", "table"}: automatic trees
    if "dart" in args.methods:
        head, _ = load_head_and_ngram(target, args.base_model_name_or_path, args.dart_model_name_or_path, None,
                                      with_ngram=False)
        stores = {t: open_ngram(t, target.tokenizer, bundled=is_bundled_target(args.base_model_name_or_path))
                  for t in tables}
        for t in tables:
            for b in args.budget:
                cfg = dart_cfgs[b]
                name = f"dart@{b}" + (f"/{Path(t).stem}" if len(tables) > 1 else "")
                arms[name] = {"method": "dart", "nodes": b + 1, "budget": b, "table": t or "default"}
                runners[name] = EngineRunner(name, target, build_drafter(target, "dart", Parts(head, stores[t]),
                                                                         TreeRequest(asdict(cfg))))
            if args.auto:   # the paper's pruning (beam as --beam-width) with the budget chosen step by step
                name = "dart@auto" + (f"/{Path(t).stem}" if len(tables) > 1 else "")
                base = TreeRequest({"beam_width": args.beam_width or default.beam_width}, auto=True)
                auto_arms[name] = {"method": "dart", "table": t or "default"}
                runners[name] = EngineRunner(name, target, build_drafter(target, "dart", Parts(head, stores[t]),
                                                                         base, costs))
    if "eagle3" in args.methods:
        e3_head = load_eagle3_for_target(target, args.base_model_name_or_path, args.eagle3_model_name_or_path)
        for tree in e3_trees:
            name = f"eagle3@{tree.total_token}/{tree.depth}/{tree.top_k}"
            arms[name] = {"method": "eagle3", "nodes": tree.total_token, "total_token": tree.total_token,
                          "depth": tree.depth, "top_k": tree.top_k}
            # each arm its own drafter (its own head cache); the head's weights are shared
            runners[name] = EngineRunner(name, target, build_drafter(target, "eagle3", Parts(eagle3_head=e3_head),
                                                                     TreeRequest(asdict(tree))))
        if args.auto:
            auto_arms["eagle3@auto"] = {"method": "eagle3"}
            runners["eagle3@auto"] = EngineRunner("eagle3@auto", target, build_drafter(
                target, "eagle3", Parts(eagle3_head=e3_head), TreeRequest(auto=True), costs))
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
    # fp32 output is identical (tests/models/test_dart_head.py and tests/models/test_eagle3.py assert it).
    bf16_note = ": bf16 near-ties" if target.dtype == torch.bfloat16 else "!"
    rows = []
    print("| arm | nodes | tau | tok/s | speedup | draft ms | tree ms | verify ms |\n|---|---|---|---|---|---|---|---|")
    print(f"| vanilla | 1 | 1.00 | {base['tokens_per_s']:.1f} | 1.00x | – | – | {base['ms_per_step']['verify']:.1f} |")
    for name, arm in arms.items():
        r = rate(name)
        r.update(arm, arm=name, speedup=r["tokens_per_s"] / base["tokens_per_s"])
        identical = all(a.tokens == v.tokens for a, v in zip(records[name], records["vanilla"]))
        r["identical_to_vanilla"] = identical
        rows.append(r)
        ms = r["ms_per_step"]
        print(f"| {name} | {arm['nodes']} | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
              f"{ms['draft_forward']:.1f} | {ms['tree_build']:.1f} | {ms['verify']:.1f} |"
              + ("" if identical else f" (differs from vanilla{bf16_note})"))
    autos = []
    for name, arm in auto_arms.items():
        r = rate(name)
        tree = auto_tree_summary(records[name])
        nodes = sum(sum(int(n) * c for n, c in rec.tree_nodes.items()) for rec in records[name])
        r.update(arm, arm=name, auto=True, speedup=r["tokens_per_s"] / base["tokens_per_s"],
                 nodes=nodes / max(r["steps"], 1), chosen=tree["chosen"] if tree else {},
                 expected_tau=tree["expected_tau"] if tree else None,
                 achieved_tau=tree["achieved_tau"] if tree else None,
                 identical_to_vanilla=all(a.tokens == v.tokens for a, v in zip(records[name], records["vanilla"])))
        autos.append(r)
        ms = r["ms_per_step"]
        print(f"| {name} | {r['nodes']:.1f} (mean) | {r['tau']:.2f} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
              f"{ms['draft_forward']:.1f} | {ms['tree_build']:.1f} | {ms['verify']:.1f} |"
              + ("" if r["identical_to_vanilla"] else f" (differs from vanilla{bf16_note})"))
    best, comparison = {}, {}
    for method in args.methods:
        mine = [r for r in rows if r["method"] == method]
        if mine:
            b = best[method] = max(mine, key=lambda r: r["speedup"])
            print(f"\n{method}: fastest fixed arm on this machine {b['arm']} ({b['speedup']:.2f}x, tau {b['tau']:.2f}); "
                  f"highest tau {max(mine, key=lambda r: r['tau'])['arm']}")
        for a in (r for r in autos if r["method"] == method):
            b = best.get(method)
            comparison[a["arm"]] = {"auto_speedup": a["speedup"], "best_fixed_arm": b["arm"] if b else None,
                                    "best_fixed_speedup": b["speedup"] if b else None,
                                    "auto_over_best_fixed": a["speedup"] / b["speedup"] if b else None}
            print(f"{a['arm']}: {a['speedup']:.2f}x vanilla (tau {a['tau']:.2f}; expected "
                  f"{_fmt(a['expected_tau'])}, achieved {_fmt(a['achieved_tau'])} on its full trees)"
                  + (f" against the best fixed arm {b['arm']} {b['speedup']:.2f}x: auto / best fixed "
                     f"{a['speedup'] / b['speedup']:.2f}" if b else "")
                  + f"; trees chosen: {chosen_text(a['chosen'])}")
    report = {"questions": args.questions, "question_source": str(source.path), "limit": args.limit, "max_new_tokens": args.max_new_tokens,
              "threads": torch.get_num_threads(), "dtype": str(target.dtype), "tables": args.tables,
              "vanilla": base, "sweep": rows, "best": {m: r["arm"] for m, r in best.items()},
              "best_budget": best["dart"]["budget"] if "dart" in best else None,
              "auto": autos, "auto_vs_best_fixed": comparison,
              "cost_model": cost_model,
              "command": ["python", "benchmarks/tune_tree.py", *(sys.argv[1:] if argv is None else argv)]}
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(report, args.plot)
    return 0


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.2f}"


SERIES_STYLE = {"dart": ("#0072B2", "o"), "eagle3": ("#D55E00", "s")}   # Okabe-Ito blue / vermillion


def plot(report: dict, path: str) -> None:
    """tau (left) and speedup over vanilla (right) against nodes verified per step, one line per method;
    EAGLE-3 points are labelled with their depth/top_k."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib (or the project's bench extra)") from None
    series: dict[str, list[dict]] = {}
    for r in report["sweep"]:
        series.setdefault(r.get("method", "dart"), []).append(r)
    labels = {"dart": "DART (tree budget + root)", "eagle3": "EAGLE-3 (total_token; depth/top_k marked)"}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    for method, rs in series.items():
        rs = sorted(rs, key=lambda r: r.get("nodes", r.get("budget", 0) + 1))
        color, marker = SERIES_STYLE[method]
        xs = [r.get("nodes", r.get("budget", 0) + 1) for r in rs]
        for ax, key in ((ax1, "tau"), (ax2, "speedup")):
            ys = [r[key] for r in rs]
            ax.plot(xs, ys, marker=marker, linestyle="-" if method == "dart" else "--", color=color,
                    label=labels.get(method, method))
            if method == "eagle3":
                for x, y, r in zip(xs, ys, rs):
                    ax.annotate(f"{r['depth']}/{r['top_k']}", (x, y), textcoords="offset points", xytext=(4, -10),
                                fontsize=7, color=color)
    for r in report.get("auto") or []:   # automatic trees: no one size, so a level line per method
        color, _ = SERIES_STYLE.get(r["method"], ("#009E73", "^"))
        for ax, key in ((ax1, "tau"), (ax2, "speedup")):
            ax.axhline(r[key], color=color, lw=1.0, linestyle=":", label=f"{r['arm']} (automatic trees)")
    ax2.axhline(1.0, color="#999999", lw=0.8, label="vanilla")
    for ax, ylabel in ((ax1, "tau (tokens per target forward)"), (ax2, "speedup vs vanilla (this run)")):
        ax.set_xlabel("nodes verified per step (root included)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    fig.suptitle(f"Tree size sweep: {report['limit']} dev questions x {report['max_new_tokens']} tokens, "
                 f"{dtype_name(report['dtype'])}, {report['threads']} threads", fontsize=9)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


if __name__ == "__main__":
    raise SystemExit(main())
