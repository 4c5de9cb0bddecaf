"""Benchmark CLI: decoding methods on Spec-Bench questions, one target load, JSON + Markdown out.

    python -m dart_core.bench --questions mt_bench.jsonl --methods hf_generate,vanilla,prompt_lookup \\
        --limit 10 --turns first --max-new-tokens 128 --dtype bfloat16 --threads 2 --json out.json

Questions are Spec-Bench lines: ``{"question_id": ..., "category": ..., "turns": [user turn, ...]}``.
With ``--turns all`` each later turn follows the method's *own* earlier answers, as
Spec-Bench does. Every method runs on the same prompts in this one process, sharing
one loaded target (each engine has its own KV cache); question by question the methods
take turns, so slow drifts of a shared machine's load hit them alike. Each method gets
a short warm-up generation before anything is timed.

Figures per method (definitions as in ``GenerationStats``):
  tokens_per_s        total new tokens / total wall time (request to last token, prefill included)
  speedup_vs_vanilla  tokens_per_s / vanilla's tokens_per_s in this run (null without vanilla)
  tau                 tokens committed by verify steps / verify steps (null without verify steps)
  stage_ms_per_step   mean ms per verify step of each stage in ``trace.STAGES``
  identical_to_vanilla greedy only: every answer token-for-token equal to vanilla's
  bandwidth_gbs       weight bytes x target forwards / s ("bandwidth achieved", as gpt-fast reports),
                      next to the machine's measured memory bandwidth

Methods come from ``METHODS``: a name -> factory(target, args) registry. A new method
(``dart``, ``eagle3``) is one ``register_method(MethodSpec(...))`` call; its factory
returns a ``MethodRunner`` (``run(prompt_ids, config) -> RunOutput``) and may add its
own command-line flags through ``add_arguments``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

import torch

from ..config import ConfigError, GenerationConfig
from ..engine.decoding import GenerationStats, SpeculativeEngine
from ..drafters import PromptLookupDrafter
from ..engine.trace import STAGES

logger = logging.getLogger(__name__)

BENCH_VERSION = 1
WARMUP_TOKENS = 8


class BenchInputError(ValueError):
    """A question file or a flag is wrong; the message names the file/line or the flag."""


# ---------------------------------------------------------------------------------------------- questions
@dataclass
class Question:
    question_id: str
    category: str
    turns: list[str]
    question_set: str = ""            # the question file's stem (mt_bench, humaneval, ...)


def load_questions(path: str | Path, limit: int | None = None) -> list[Question]:
    """Read a Spec-Bench question file (JSON lines); errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise BenchInputError(f"question file {path} does not exist (--questions)")
    questions: list[Question] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchInputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); each line "
                                      "must be one JSON object") from None
            if not isinstance(row, dict):
                raise BenchInputError(f"{where}: expected a JSON object with question_id, category and turns, "
                                      f"got {type(row).__name__}")
            missing = [k for k in ("question_id", "category", "turns") if k not in row]
            if missing:
                raise BenchInputError(f"{where}: missing field(s) {', '.join(missing)}; Spec-Bench lines look like "
                                      '{"question_id": 81, "category": "writing", "turns": ["..."]}')
            qid = row["question_id"]
            if isinstance(qid, bool) or not isinstance(qid, (str, int)):
                raise BenchInputError(f"{where}: question_id must be a string or an integer, got {qid!r}")
            qid = str(qid)
            if qid in seen:
                raise BenchInputError(f"{where}: question_id {qid!r} repeats line {seen[qid]}; ids must be unique")
            seen[qid] = lineno
            if not isinstance(row["category"], str):
                raise BenchInputError(f"{where}: category must be a string, got {row['category']!r}")
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise BenchInputError(f"{where}: turns must be a non-empty list of non-empty strings "
                                      "(the user turns)")
            questions.append(Question(qid, row["category"], list(turns), question_set=path.stem))
            if limit is not None and len(questions) >= limit:
                break
    if not questions:
        raise BenchInputError(f"question file {path} holds no questions")
    return questions


def load_question_sets(paths: Sequence[str | Path], limit: int | None = None) -> list[Question]:
    """Several question files in one run (``limit`` applies to each); ids must be unique across them."""
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for path in paths:
        for q in load_questions(path, limit):
            if q.question_id in seen:
                raise BenchInputError(f"question_id {q.question_id!r} of {path} is also in {seen[q.question_id]}; "
                                      "ids must be unique across the --questions files")
            seen[q.question_id] = str(path)
            questions.append(q)
    return questions


# ---------------------------------------------------------------------------------------------- methods
@dataclass
class RunOutput:
    """What one method produced for one prompt."""
    tokens: list[int]                 # answer tokens, cut after the first EOS (EOS kept, as the engine does)
    text: str                         # answer text before EOS: what --turns all feeds back as the reply
    stats: GenerationStats            # engine stats; for methods without verify steps only new_tokens/stop_reason
    target_forwards: int              # target forwards this answer took (prefill included)
    accept_lengths: list[int] = field(default_factory=list)   # tokens committed by each verify step (bonus incl.)


class MethodRunner(Protocol):
    name: str
    speculative: bool                 # True: has verify steps (tau and stage times are reported)

    def run(self, prompt_ids: list[int], config: GenerationConfig) -> RunOutput:
        ...


class EngineRunner:
    """A SpeculativeEngine on the shared target; ``drafter=None`` is vanilla decoding."""
    speculative = True

    def __init__(self, name: str, target, drafter=None):
        self.name = name
        self.engine = SpeculativeEngine(target, drafter, name=name)

    def run(self, prompt_ids: list[int], config: GenerationConfig) -> RunOutput:
        result = self.engine.generate(prompt_ids, config)
        return RunOutput(result.tokens, result.text, result.stats, target_forwards=result.stats.steps + 1,
                         accept_lengths=[len(t.emitted_tokens) for t in result.traces])


class HFGenerateRunner:
    """transformers' own ``generate()`` on the same model: the baseline users know.

    Greedy (``do_sample=False``) at temperature 0, else sampling with the same
    temperature / top-p / top-k. Every other logits processor is switched off so the
    model's generation_config cannot change the decoding rule.
    """
    name = "hf_generate"
    speculative = False

    def __init__(self, target):
        self.target = target
        gc = getattr(target.model, "generation_config", None)
        pad = getattr(gc, "pad_token_id", None) if gc is not None else None
        self.pad_token_id = pad if pad is not None else target.eos_token_ids[0]

    def run(self, prompt_ids: list[int], config: GenerationConfig) -> RunOutput:
        target = self.target
        max_new = min(config.max_new_tokens, config.max_length - len(prompt_ids))
        if max_new <= 0:
            raise ConfigError(f"the prompt has {len(prompt_ids)} tokens but max_length is {config.max_length}: "
                              "shorten the prompt or raise max_length (--max-length)")
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
        kwargs = dict(max_new_tokens=max_new, min_new_tokens=0, num_beams=1, repetition_penalty=1.0,
                      no_repeat_ngram_size=0, eos_token_id=list(target.eos_token_ids),
                      pad_token_id=self.pad_token_id)
        if config.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
            if config.seed is not None:
                torch.manual_seed(config.seed)
        with torch.inference_mode():
            out = target.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        tokens = out[0, len(prompt_ids):].tolist()
        eos = set(target.eos_token_ids)
        cut = next((i for i, t in enumerate(tokens) if t in eos), None)
        if cut is not None:
            tokens = tokens[: cut + 1]
        stop = "eos" if cut is not None else (
            "max_new_tokens" if len(tokens) >= config.max_new_tokens else "max_length")
        text = target.tokenizer.decode(tokens[:cut] if cut is not None else tokens, skip_special_tokens=True)
        stats = GenerationStats(new_tokens=len(tokens), stop_reason=stop)
        return RunOutput(tokens, text, stats, target_forwards=len(tokens))


@dataclass(frozen=True)
class MethodSpec:
    """One benchmarkable method.

    factory(target, args) -> MethodRunner, called once per run after the target is loaded.
    add_arguments(parser) adds the method's own flags (e.g. a draft-head path), or None.
    """
    name: str
    factory: Callable[..., MethodRunner]
    help: str = ""
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    if spec.name in METHODS:
        raise ValueError(f"benchmark method {spec.name!r} is registered twice")
    METHODS[spec.name] = spec
    return spec


register_method(MethodSpec("hf_generate", lambda target, args: HFGenerateRunner(target),
                           "transformers' generate() on the same model (greedy or the same sampling)"))
register_method(MethodSpec("vanilla", lambda target, args: EngineRunner("vanilla", target, None),
                           "our loop without a drafter: one token per target forward"))
register_method(MethodSpec("prompt_lookup",
                           lambda target, args: EngineRunner("prompt_lookup", target, PromptLookupDrafter()),
                           "our loop with prompt-lookup drafting (n-gram matches in the context)"))


# ---------------------------------------------------------------------------------------------- running
@dataclass
class AnswerRecord:
    question_id: str
    category: str
    turn: int                          # 1-based
    prompt_tokens: int
    new_tokens: int
    wall_s: float
    steps: int                         # verify steps (0 for methods without them)
    target_forwards: int
    stage_s: dict[str, float]
    stop_reason: str
    text: str
    tokens: list[int] = field(default_factory=list)
    question_set: str = ""
    accept_lengths: list[int] = field(default_factory=list)   # per verify step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_answer(runner: MethodRunner, prompt_ids: list[int], config: GenerationConfig,
               device: torch.device) -> tuple[RunOutput, float]:
    """Run one request; wall time from the call to the last token (device synchronised)."""
    _sync(device)
    t0 = time.perf_counter()
    out = runner.run(prompt_ids, config)
    _sync(device)
    return out, time.perf_counter() - t0


def run_benchmark(target, runners: dict[str, MethodRunner], questions: Sequence[Question], config: GenerationConfig,
                  turns: str = "first", progress: bool = True) -> dict[str, list[AnswerRecord]]:
    """Every method answers every question (all turns with ``turns="all"``); returns records per method."""
    from tqdm.auto import tqdm

    from ..models.templates import encode_chat, get_template

    template = get_template(target.template_name)
    device = target.device
    first_prompt = encode_chat(target.tokenizer, template, [{"role": "user", "content": questions[0].turns[0]}])
    warm = GenerationConfig(max_new_tokens=min(WARMUP_TOKENS, config.max_new_tokens), max_length=config.max_length,
                            temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                            seed=config.seed, profile_stages=config.profile_stages)
    for name, runner in runners.items():
        logger.info("warm-up: %s", name)
        try:
            run_answer(runner, first_prompt, warm, device)
        except ConfigError as exc:
            raise BenchInputError(f"question {questions[0].question_id} turn 1 (warm-up, {name}): {exc}") from None

    records: dict[str, list[AnswerRecord]] = {name: [] for name in runners}
    bar = tqdm(total=len(questions) * len(runners), desc="bench", unit="answer", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    try:
        for q in questions:
            q_turns = q.turns if turns == "all" else q.turns[:1]
            for name, runner in runners.items():
                bar.set_postfix_str(f"{q.question_id} {name}", refresh=False)
                messages: list[dict] = []  # each method continues its own conversation
                for t, user_turn in enumerate(q_turns, 1):
                    messages.append({"role": "user", "content": user_turn})
                    prompt = encode_chat(target.tokenizer, template, messages)
                    try:
                        out, wall = run_answer(runner, prompt, config, device)
                    except ConfigError as exc:
                        raise BenchInputError(f"question {q.question_id} turn {t} ({name}): {exc}") from None
                    records[name].append(AnswerRecord(
                        question_id=q.question_id, category=q.category, turn=t, prompt_tokens=len(prompt),
                        new_tokens=len(out.tokens), wall_s=wall, steps=out.stats.steps,
                        target_forwards=out.target_forwards, stage_s=dict(out.stats.stage_s),
                        stop_reason=out.stats.stop_reason, text=out.text, tokens=list(out.tokens),
                        question_set=q.question_set, accept_lengths=list(out.accept_lengths)))
                    messages.append({"role": "assistant", "content": out.text})
                bar.update(1)
    finally:
        bar.close()
    return records


# ---------------------------------------------------------------------------------------------- summaries
def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _rates(recs: Sequence[AnswerRecord], speculative: bool) -> dict:
    new = sum(r.new_tokens for r in recs)
    wall = sum(r.wall_s for r in recs)
    steps = sum(r.steps for r in recs)
    # tau as GenerationStats defines it: the first answer token comes from the prefill, not a verify step.
    committed = sum(r.new_tokens - 1 for r in recs if r.steps)
    return {
        "answers": len(recs),
        "new_tokens": new,
        "wall_s": wall,
        "tokens_per_s": new / wall if wall > 0 else None,
        "steps": steps if speculative else None,
        "tau": committed / steps if speculative and steps else None,
    }


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first position where two answers differ (None when equal)."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def summarize(records: dict[str, list[AnswerRecord]], runners: dict[str, MethodRunner], weight_bytes: int,
              machine_bandwidth_gbs: float | None, greedy: bool) -> dict[str, dict]:
    """Per-method figures (see the module docstring) from the answer records."""
    base = records.get("vanilla")
    base_by_key = {(r.question_id, r.turn): r for r in base} if base is not None else {}
    base_rates = _rates(base, True) if base is not None else None

    out: dict[str, dict] = {}
    for name, recs in records.items():
        spec = runners[name].speculative
        rates = _rates(recs, spec)
        steps = sum(r.steps for r in recs)
        stage_ms = {s: (1000 * sum(r.stage_s.get(s, 0.0) for r in recs) / steps if spec and steps else None)
                    for s in STAGES}
        forwards = sum(r.target_forwards for r in recs)
        fps = forwards / rates["wall_s"] if rates["wall_s"] > 0 else None
        bw = weight_bytes * fps / 1e9 if fps is not None else None
        summary = {
            **rates,
            "speedup_vs_vanilla": _ratio(rates["tokens_per_s"], base_rates["tokens_per_s"]) if base_rates else None,
            "stage_ms_per_step": stage_ms,
            "ms_per_step": sum(stage_ms.values()) if spec and steps else None,
            "target_forwards": forwards,
            "target_forwards_per_s": fps,
            "bandwidth_gbs": bw,
            "bandwidth_fraction": _ratio(bw, machine_bandwidth_gbs),
            "stop_reasons": {k: sum(r.stop_reason == k for r in recs) for k in sorted({r.stop_reason for r in recs})},
            "identical_to_vanilla": None,
            "n_divergent": None,
            "divergences": [],
        }
        if greedy and base is not None:
            divs = []
            for r in recs:
                ref = base_by_key.get((r.question_id, r.turn))
                pos = first_divergence(r.tokens, ref.tokens) if ref is not None else 0
                if pos is not None:
                    divs.append({"question_id": r.question_id, "turn": r.turn, "position": pos,
                                 "token": r.tokens[pos] if pos < len(r.tokens) else None,
                                 "vanilla_token": ref.tokens[pos] if ref is not None and pos < len(ref.tokens)
                                 else None})
            summary.update(identical_to_vanilla=not divs, n_divergent=len(divs), divergences=divs)
        summary["per_category"] = _grouped(recs, base, spec, lambda r: r.category)
        summary["per_set"] = _grouped(recs, base, spec, lambda r: r.question_set)
        lengths = [n for r in recs for n in r.accept_lengths]
        summary["accept_length_hist"] = ({str(n): lengths.count(n) for n in range(1, max(lengths) + 1)}
                                         if spec and lengths else None)
        out[name] = summary
    return out


def _grouped(recs: Sequence[AnswerRecord], base: Sequence[AnswerRecord] | None, speculative: bool,
             key: Callable[[AnswerRecord], str]) -> dict[str, dict]:
    """tokens/s, tau and speedup vs vanilla per group (category or question set)."""
    out = {}
    for group in sorted({key(r) for r in recs}):
        c = _rates([r for r in recs if key(r) == group], speculative)
        b = _rates([r for r in base if key(r) == group], True) if base is not None else None
        out[group] = {"answers": c["answers"], "new_tokens": c["new_tokens"], "tokens_per_s": c["tokens_per_s"],
                      "tau": c["tau"],
                      "speedup_vs_vanilla": _ratio(c["tokens_per_s"], b["tokens_per_s"]) if b and b["answers"]
                      else None}
    return out


# ---------------------------------------------------------------------------------------------- Markdown
def _f(x: float | None, fmt: str = "{:.2f}", none: str = "–") -> str:
    return none if x is None else fmt.format(x)


def render_markdown(report: dict) -> str:
    from .report import question_files  # lazy: the report module pulls in plotly

    s, m, t = report["settings"], report["machine"], report["target"]
    bw = m.get("memory_bandwidth_gbs") or {}
    load = m.get("load_average")
    lines = [
        f"### dart_core.bench: {t['name']} ({t['dtype']}, {t['device']})",
        "",
        f"{s['n_questions']} questions from {', '.join(f'`{Path(q).name}`' for q in question_files(s))} "
        f"(turns: {s['turns']}), "
        f"max_new_tokens {s['max_new_tokens']}, temperature {s['temperature']}"
        + (f", seed {s['seed']}" if s["temperature"] > 0 else " (greedy)") + ".  ",
        f"Machine: {m['cpu_model']}" + (f", GPU {m['gpu']}" if m.get("gpu") else "")
        + f", {m['torch_threads']} torch threads, load average at start "
        + (", ".join(f"{x:.2f}" for x in load) if load else "n/a")
        + f", memory bandwidth measured {_f(bw.get('read'), '{:.1f}')} GB/s (read), "
          f"{_f(bw.get('copy'), '{:.1f}')} GB/s (copy); weights {t['weight_bytes'] / 1e6:.1f} MB.",
        "",
    ]
    head = ["method", "tok/s", "speedup", "tau"] + [f"{st} ms/step" for st in STAGES] + \
        ["GB/s achieved (of measured)", "identical to vanilla"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + [":---:"]) + "|"]
    for name, r in report["methods"].items():
        if name == "vanilla":
            ident = "(reference)"
        elif r["identical_to_vanilla"] is None:
            ident = "n/a"
        elif r["identical_to_vanilla"]:
            ident = "yes"
        else:
            ident = f"no ({r['n_divergent']}/{r['answers']} differ)"
        bw_cell = _f(r["bandwidth_gbs"], "{:.1f}")
        if r["bandwidth_fraction"] is not None:
            bw_cell += f" ({100 * r['bandwidth_fraction']:.0f}%)"
        row = [name, _f(r["tokens_per_s"], "{:.1f}"), _f(r["speedup_vs_vanilla"], "{:.2f}x"), _f(r["tau"])]
        row += [_f(r["stage_ms_per_step"][st], "{:.2f}") for st in STAGES]
        row += [bw_cell, ident]
        lines.append("| " + " | ".join(row) + " |")
    lines += _group_table(report, "per_set", "Per question set")
    lines += _group_table(report, "per_category", "Per category")
    if report.get("busy_warning"):
        lines += ["", f"**Warning: {report['busy_warning']}**"]
    return "\n".join(lines) + "\n"


def _group_table(report: dict, key: str, title: str) -> list[str]:
    """A Markdown table of tok/s (speedup, tau) per group, when there is more than one group."""
    groups = sorted({g for r in report["methods"].values() for g in r.get(key) or {}})
    if len(groups) < 2:
        return []
    names = list(report["methods"])
    lines = ["", f"{title}: tok/s (speedup vs vanilla, tau)", "",
             f"| {key.removeprefix('per_')} | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for group in groups:
        cells = []
        for name in names:
            c = (report["methods"][name].get(key) or {}).get(group)
            if c is None:
                cells.append("–")
                continue
            extra = [x for x in (_f(c["speedup_vs_vanilla"], "{:.2f}x", ""), _f(c["tau"], "tau {:.2f}", "")) if x]
            cells.append(_f(c["tokens_per_s"], "{:.1f}") + (f" ({', '.join(extra)})" if extra else ""))
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dart_core.bench",
        description="Benchmark decoding methods on Spec-Bench questions (one target load; JSON + Markdown).")
    p.add_argument("--questions", required=True, nargs="+", metavar="FILE.jsonl",
                   help="Spec-Bench question file: one {question_id, category, turns} object per line")
    p.add_argument("--methods", default="hf_generate,vanilla,prompt_lookup",
                   help=f"comma-separated methods, run in this order; known: {', '.join(METHODS)}")
    p.add_argument("--limit", type=int, default=None, metavar="K", help="only the first K questions")
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
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise BenchInputError(f"--methods is empty; choose from {', '.join(METHODS)}")
    unknown = [n for n in names if n not in METHODS]
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
        questions = load_question_sets(args.questions, args.limit)
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
    runners = {name: METHODS[name].factory(target, args) for name in methods}

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
            "questions": [str(q) for q in args.questions], "n_questions": len(questions), "turns": args.turns,
            "methods": methods, "max_new_tokens": config.max_new_tokens, "max_length": config.max_length,
            "temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k, "seed": config.seed,
            "greedy": config.greedy, "warmup_tokens": WARMUP_TOKENS, "elapsed_s": elapsed,
        },
        "machine": machine,
        "target": {"name": target.name, "template": target.template_name, "dtype": str(target.dtype).replace(
            "torch.", ""), "device": str(target.device), "num_layers": target.num_layers,
            "hidden_size": target.hidden_size, "vocab_size": target.vocab_size, "weight_bytes": target.weight_bytes},
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


def _register_optional_methods() -> None:
    """Methods with heavier imports (DART) register themselves from dart_core.bench.methods."""
    from .methods import register_all
    register_all(register_method, MethodSpec, EngineRunner, METHODS)


_register_optional_methods()
