"""What automatic trees' chooser costs per step, in place: its decision, its learning and its per-step record.

    python benchmarks/chooser_cost.py --threads 2                                  # dart_context, 4+4 questions
    python benchmarks/chooser_cost.py --threads 2 --methods dart,eagle3 --questions context_dev --limit 2

Runs each method under automatic trees (the benchmark's runner, the bundled heads) on the same prompts and times,
with wall clocks around the AutoTree's own methods, what the chooser adds to a drafting step: ``choose`` (the
decision every few steps, its learning included), ``learn`` (the models' refresh from the steps seen, before a
decision or a regime change), ``step_done`` (each step's record), the regime check of drafters that read the live
context, and the drafter's ``propose`` it wraps; per step of the answers, in ms, beside the mean verify. A
measurement, not a test: the chooser never changes an answer.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dart_core  # noqa: E402,F401  (before torch: its idle OpenMP threads spin only briefly, dart_core/openmp.py)
import torch  # noqa: E402

from dart_core.bench import runners  # noqa: E402
from dart_core.bench.questions import load_question_sets, resolve_question_source  # noqa: E402
from dart_core.config import GenerationConfig  # noqa: E402
from dart_core.hardware import describe_machine  # noqa: E402
from dart_core.models.loader import load_target, resolve_dtype  # noqa: E402
from dart_core.models.templates import encode_chat, get_template  # noqa: E402
from dart_core.sizing import auto as auto_module  # noqa: E402

PARTS = ("choose", "learn", "step_done", "regime", "apply_choice", "inner propose", "propose (all)")


def _time(owner, attr: str, label: str, spent: Counter) -> None:
    """Wrap owner.attr so that its wall time adds up under ``label``."""
    inner = getattr(owner, attr)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t0
    setattr(owner, attr, timed)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="dart_context", help="comma-separated methods with automatic trees")
    p.add_argument("--questions", nargs="+", default=["gsm8k", "humaneval"], help="named sets or Spec-Bench files")
    p.add_argument("--data-dir", default=None, help="folder of the named sets (default: $DART_DATA_DIR)")
    p.add_argument("--limit", type=int, default=4, help="questions of each set")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(None, dtype=resolve_dtype("auto", torch.device("cpu")), device="cpu")
    questions = load_question_sets([resolve_question_source(q, args.data_dir) for q in args.questions], args.limit)
    template = get_template(target.template_name)
    prompts = [encode_chat(target.tokenizer, template, [{"role": "user", "content": q.turns[0]}]) for q in questions]
    machine = describe_machine(target.device, target.dtype)
    threads = args.threads or torch.get_num_threads()
    print(f"# chooser cost per step: {machine.get('cpu_model')}, path {machine.get('gemm_path')}, {threads} threads, "
          f"{len(prompts)} prompts, {args.max_new_tokens} new tokens")
    print("| method | steps | " + " | ".join(f"{p} ms" for p in PARTS) + " | verify ms |")
    print("|---|---:|" + "---:|" * (len(PARTS) + 1))
    for name in [m.strip() for m in args.methods.split(",") if m.strip()]:
        runner = runners.METHODS[name].factory(target, argparse.Namespace(tree="auto"))
        auto = runner.engine.drafter
        if not runners.is_auto(auto):
            raise SystemExit(f"{name} has no automatic trees")
        spent: Counter = Counter()
        for attr, label in (("choose", "choose"), ("learn", "learn"), ("step_done", "step_done"),
                            ("propose", "propose (all)")):
            _time(auto, attr, label, spent)
        _time(auto.inner, "propose", "inner propose", spent)
        if hasattr(auto.inner, "regime"):
            _time(auto.inner, "regime", "regime", spent)
        apply = auto_module.apply_choice
        _time(auto_module, "apply_choice", "apply_choice", spent)   # the module-level helper AutoTree calls
        try:
            runner.run(prompts[0], GenerationConfig(max_new_tokens=8))          # warm-up, not counted
            spent.clear()
            steps, verify = 0, 0.0
            for ids in prompts:
                out = runner.run(ids, GenerationConfig(max_new_tokens=args.max_new_tokens))
                steps += out.stats.steps
                verify += out.stats.stage_s["verify"]
        finally:
            auto_module.apply_choice = apply
        cells = " | ".join(f"{1e3 * spent[p] / steps:.3f}" for p in PARTS)
        print(f"| {name} | {steps} | {cells} | {1e3 * verify / steps:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
