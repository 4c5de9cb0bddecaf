"""Held-out hit@k per future position of several trained heads, side by side (a Markdown table).

    python benchmarks/compare_heads.py runs/gamma-0.6 runs/gamma-0.8

Each argument is a training output directory (its eval.json and training_summary.json, written by
``python -m dart_core.train``). Used for the ablations, whose arms share one training budget.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def load_run(path: Path) -> dict:
    try:
        summary = json.loads((path / "training_summary.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SystemExit(f"{path} has no training_summary.json: is it a finished `dart_core.train` run?") from None
    if not summary.get("eval"):
        raise SystemExit(f"{path}: the run has no held-out evaluation (it was trained with --eval-rows 0)")
    return summary


def render(runs: dict[str, dict], ks=(1, 10)) -> str:
    positions = next(iter(runs.values()))["eval"]["positions"]
    head = "| run | gamma | steps | metric | " + " | ".join(positions) + " | mean chain |"
    lines = [head, "|" + "---|" * (len(positions) + 5)]
    for name, s in runs.items():
        ev = s["eval"]
        for k in ks:
            vals = " | ".join(f"{x:.3f}" for x in ev[f"hit@{k}"])
            chain = f"{ev['mean_top1_chain']:.3f}" if k == 1 else ""
            lines.append(f"| {name} | {s['config']['gamma']} | {s['steps']} | hit@{k} | {vals} | {chain} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    args = p.parse_args(argv)
    runs = {r.name: load_run(r) for r in args.runs}
    steps = {s["steps"] for s in runs.values()}
    if len(steps) > 1:
        print(f"note: the runs trained for different numbers of steps ({sorted(steps)}): not a same-budget ablation")
    print(render(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
