"""Benchmark CLI: decoding methods on Spec-Bench questions, one target load, JSON + Markdown out.

    python -m dart_core.bench --questions mt_bench.jsonl --methods hf_generate,vanilla,prompt_lookup \\
        --limit 10 --turns first --max-new-tokens 128 --dtype bfloat16 --threads 2 --json out.json
    python -m dart_core.bench --questions mt_bench humaneval gsm8k alpaca --data-dir DIR ...   # named sets
    python -m dart_core.bench ... --methods vanilla,dart,eagle3 --tree fixed --budget 8   # trees as given
    python -m dart_core.bench ... --methods vanilla,dart_context,dart_context@budget=6   # auto vs fixed, one run

``--tree auto`` (the default) sizes the trees of dart, dart_no_ngram, eagle3 and prompt_lookup every few
steps from one cost model of the target measured at start (its verify-time curve is printed and kept in
the report) and each drafter's acceptance; size flags given (``--budget``, ``--eagle3-*``) are held.
``--tree fixed`` runs the tree settings as given (the paper's / published ones unless set).

The pieces: ``questions`` (question files and the named sets), ``runners`` (the method registry and
the loop that runs every method on the same prompts), ``methods`` (the methods backed by draft heads),
``summary`` (the figures and the Markdown table), ``report`` (the HTML page). This module parses the
flags, checks everything a user can get wrong before the (slow) model load, and writes the outputs.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from ..config import ConfigError, GenerationConfig
from ..data_sources import ENV_DATA_DIR
from ..presets import TREE_MODES
from .questions import QUESTION_SETS, BenchInputError, load_question_sets, resolve_question_source
from .runners import METHODS, WARMUP_TOKENS, run_benchmark, tree_costs
from .summary import render_markdown, summarize
from .variants import parse_variant, variant_args

logger = logging.getLogger(__name__)

BENCH_VERSION = 1


def parse_tree_mode(text: str) -> str:
    """argparse type of ``--tree``: one of presets.TREE_MODES, else a message saying what each means."""
    if text not in TREE_MODES:
        raise argparse.ArgumentTypeError(
            f"--tree must be one of {', '.join(TREE_MODES)}, got {text!r} (auto: each drafter's tree is sized "
            "from this machine's measured costs; fixed: the tree settings as given)")
    return text


def cost_model_summary(costs) -> dict:
    """What the report keeps of the run's cost model: its source, its one-line description, the verify ms at
    each measured tree size (nodes, root included) and the commit ms."""
    return {"source": costs.source, "describe": costs.describe(),
            "verify_ms": {str(n): round(1e3 * costs.verify_s(n), 4) for n in costs.verify.sizes},
            "commit_ms": round(1e3 * costs.commit_s, 4), "key": dict(costs.key)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dart_core.bench",
        description="Benchmark decoding methods on Spec-Bench questions (one target load; JSON + Markdown).")
    p.add_argument("--questions", required=True, nargs="+", metavar="NAME|FILE.jsonl",
                   help="Spec-Bench question files (one {question_id, category, turns} object per line) or named "
                        f"sets ({', '.join(QUESTION_SETS)}), resolved from --data-dir / {ENV_DATA_DIR}, then the "
                        "Hugging Face cache, then (online) the Hub")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help=f"folder holding the named sets' files (mt_bench.jsonl, humaneval.jsonl, gsm8k_test.jsonl, "
                        f"alpaca.jsonl); default: ${ENV_DATA_DIR}")
    p.add_argument("--methods", default="hf_generate,vanilla,prompt_lookup",
                   help=f"comma-separated methods, run in this order; known: {', '.join(METHODS)}; NAME@fixed runs "
                        "NAME's tree as the flags give it and NAME@KNOB=V[+KNOB=V] also sets tree knobs (e.g. "
                        "dart_context@budget=6 beside dart_context: a fixed tree against the automatic one, same run)")
    p.add_argument("--tree", type=parse_tree_mode, default="auto", metavar="|".join(TREE_MODES),
                   help="auto (default): dart, dart_no_ngram, eagle3 and prompt_lookup size their trees every few "
                        "steps from one cost model of the target measured at start and their acceptance, holding "
                        "the size flags given (--budget, --eagle3-total-token/--eagle3-depth/--eagle3-top-k); "
                        "fixed: the tree settings as given (the paper's / published ones unless set)")
    p.add_argument("--limit", type=int, default=None, metavar="K", help="only the first K questions")
    p.add_argument("--limit-per-category", type=int, default=None, metavar="K",
                   help="only the first K questions of each category (of each question set)")
    p.add_argument("--turns", choices=("first", "all"), default="first",
                   help="first turn only, or every turn (later turns follow each method's own answers)")
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    p.add_argument("--max-length", type=int, default=2048, metavar="N",
                   help="prompt + answer tokens at most (sizes the KV caches)")
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"),
                   help="target precision (auto: bf16 on GPUs and on CPUs with native bf16 or AVX2 (the native kernel), else fp32)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 = sampling")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (each request is seeded with it)")
    p.add_argument("--base-model-name-or-path", default=None, metavar="M",
                   help="target: Hub id, local directory or .gguf (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--template-name", default=None, metavar="NAME",
                   help="chat template (default: guessed from the model type)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    p.add_argument("--bandwidth-mib", type=int, default=None, metavar="MIB",
                   help="buffer size of the memory-bandwidth probe (default 256 on CPU, 1024 on GPU; 0 = skip)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT.json", help="write the full report here")
    p.add_argument("--markdown", dest="markdown_out", default=None, metavar="OUT.md",
                   help="also write the Markdown table here")
    p.add_argument("--report", dest="report_dir", default=None, metavar="DIR",
                   help="write DIR/report.json, DIR/report.md and DIR/report.html (standalone Plotly charts)")
    p.add_argument("--sweep", default=None, metavar="TUNE.json",
                   help="a benchmarks/tune_tree.py --json output to chart in the HTML report (tau and speed vs tree size)")
    p.add_argument("--max-busy", type=float, default=0.2, metavar="FRACTION",
                   help="refuse to start when other processes use more than this share of the CPU (default 0.2; "
                        "1 = do not check)")
    p.add_argument("--allow-busy", action="store_true",
                   help="run on a busy machine anyway; the report carries a warning that its timings are unreliable")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    for spec in METHODS.values():
        if spec.add_arguments is not None:
            spec.add_arguments(p)
    return p


def parse_methods(text: str) -> list[str]:
    """The entries of --methods: registered methods, or variants of them (NAME@fixed, NAME@KNOB=V: bench.variants)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise BenchInputError(f"--methods is empty; choose from {', '.join(METHODS)}")
    # a malformed variant raises here, naming the entry
    unknown = [n for n in names if parse_variant(n, METHODS).method not in METHODS]
    if unknown:
        raise BenchInputError(f"unknown method(s) {', '.join(unknown)} in --methods; valid methods: "
                              f"{', '.join(METHODS)}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BenchInputError(f"--methods lists {', '.join(dup)} more than once")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)

    from ..models.loader import ModelLoadError, load_target, resolve_device, resolve_dtype
    from ..models.templates import get_template
    from ..hardware import busy_machine_reason, describe_machine, measure_memory_bandwidth_gbs

    # Everything a user can get wrong is checked before the (slow) model load.
    try:
        methods = parse_methods(args.methods)
        if args.limit is not None and args.limit <= 0:
            raise BenchInputError(f"--limit must be a positive number of questions, got {args.limit}")
        if args.limit_per_category is not None and args.limit_per_category <= 0:
            raise BenchInputError(f"--limit-per-category must be a positive number of questions, got "
                                  f"{args.limit_per_category}")
        if args.threads is not None and args.threads <= 0:
            raise BenchInputError(f"--threads must be >= 1, got {args.threads}")
        if args.bandwidth_mib is not None and args.bandwidth_mib < 0:
            raise BenchInputError(f"--bandwidth-mib must be >= 0, got {args.bandwidth_mib}")
        config = GenerationConfig(max_new_tokens=args.max_new_tokens, max_length=args.max_length,
                                  temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
        if args.template_name is not None:
            get_template(args.template_name)
        device = resolve_device(args.device)
        dtype = resolve_dtype(args.dtype, device)
        if args.data_dir is not None and not Path(args.data_dir).expanduser().is_dir():
            raise BenchInputError(f"--data-dir {args.data_dir} is not a folder")
        resolved = [resolve_question_source(q, args.data_dir) for q in args.questions]
        questions = load_question_sets(resolved, args.limit, per_category=args.limit_per_category)
        sources = [str(src.path) for src in resolved]
        sweep = None
        if args.sweep is not None:
            from .report import load_sweep
            sweep = load_sweep(args.sweep)
        if not 0.0 <= args.max_busy <= 1.0:
            raise BenchInputError(f"--max-busy is a share of the CPU between 0 and 1, got {args.max_busy}")
    except ConfigError as exc:  # GenerationConfig's message starts with the setting; name its flag too
        setting = str(exc).split(" ", 1)[0]
        flag = f"--{setting.replace('_', '-')}"
        parser.error(f"{exc} ({flag})" if flag in parser._option_string_actions else str(exc))
    except (BenchInputError, ModelLoadError, ValueError) as exc:
        parser.error(str(exc))

    # A GPU's timings do not suffer from a busy host CPU the same way; --max-busy 1 skips the check.
    busy = busy_machine_reason(args.max_busy) if device.type == "cpu" and args.max_busy < 1 else None
    if busy and not args.allow_busy:
        parser.exit(3, f"{parser.prog}: error: {busy}. Stop the other work and run again, or pass --allow-busy to "
                       "run anyway (the report then says its timings are unreliable).\n")
    if busy:
        logger.warning("!!! %s; running anyway (--allow-busy): treat tokens/s and speedups as unreliable", busy)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    machine = describe_machine(device, dtype)  # load average before our own work starts
    bandwidth = {"read": None, "copy": None}
    if args.bandwidth_mib != 0:
        bandwidth = {k: measure_memory_bandwidth_gbs(args.bandwidth_mib, device=device, kind=k)
                     for k in ("read", "copy")}
    machine["memory_bandwidth_gbs"] = bandwidth

    try:
        target = load_target(args.base_model_name_or_path, dtype=dtype, device=str(device),
                             template_name=args.template_name)
    except ModelLoadError as exc:
        parser.error(str(exc))
    cost_model = None
    variants = [parse_variant(name, METHODS) for name in methods]
    if args.tree == "auto" and any(METHODS[v.method].auto_tree and not v.fixed for v in variants):
        costs = tree_costs(target, args)      # one cost model for every method, measured (or read) once
        cost_model = cost_model_summary(costs)
        sys.stderr.write(f"automatic trees: {cost_model['describe']}\n")
        sys.stderr.flush()
    runners = {v.name: METHODS[v.method].factory(target, variant_args(args, v)) for v in variants}

    t0 = time.perf_counter()
    try:
        records = run_benchmark(target, runners, questions, config, turns=args.turns,
                                progress=not args.no_progress)
    except BenchInputError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    elapsed = time.perf_counter() - t0

    report = {
        "bench_version": BENCH_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": ["python", "-m", "dart_core.bench", *(sys.argv[1:] if argv is None else argv)],
        "settings": {
            "questions": [str(q) for q in args.questions], "question_sources": sources,
            "n_questions": len(questions), "turns": args.turns,
            "methods": methods, "max_new_tokens": config.max_new_tokens, "max_length": config.max_length,
            "temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k, "seed": config.seed,
            "greedy": config.greedy, "warmup_tokens": WARMUP_TOKENS, "elapsed_s": elapsed, "tree": args.tree,
        },
        # the cost model as measured at start (the trees' prices), and its verify curve after the run's refreshes
        "tree": {"mode": args.tree, "cost_model": cost_model,
                 "verify_ms_after": ({str(n): round(1e3 * args.tree_costs.verify_s(n), 4)
                                      for n in args.tree_costs.verify.sizes} if cost_model else None)},
        "machine": machine,
        "target": {"name": target.name, "template": target.template_name, "dtype": str(target.dtype).replace(
            "torch.", ""), "device": str(target.device), "num_layers": target.num_layers,
            "hidden_size": target.hidden_size, "vocab_size": target.vocab_size, "weight_bytes": target.weight_bytes,
            "weight_pages": target.fast.weight_pages.describe() if target.fast is not None else None,
            # how the CPU kernels' path was chosen (timed at load, cached, or fixed), with each path's times
            "gemm_path_choice": target.fast.gemm_path.describe() if target.fast is not None else None,
            # and how each call's rows were cut among the threads (models/gemm_split.py)
            "gemm_split_choice": target.fast.gemm_split.describe() if target.fast is not None else None},
        "methods": summarize(records, runners, target.weight_bytes, bandwidth["read"], config.greedy),
        "answers": {name: [asdict(r) for r in recs] for name, recs in records.items()},
        "busy_warning": busy,
    }
    markdown = render_markdown(report)
    sys.stdout.write(markdown)
    sys.stdout.flush()
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        logger.info("wrote %s", args.json_out)
    if args.markdown_out:
        Path(args.markdown_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown_out).write_text(markdown, encoding="utf-8")
        logger.info("wrote %s", args.markdown_out)
    if args.report_dir:
        from .report import write_report
        for path in write_report(report, markdown, args.report_dir, sweep=sweep):
            logger.info("wrote %s", path)
    return 0
