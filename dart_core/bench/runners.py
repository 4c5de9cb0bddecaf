"""Benchmark methods and the loop that runs them.

Methods come from ``METHODS``: a name -> factory(target, args) registry. A new method is one
``register_method(MethodSpec(...))`` call; its factory returns a ``MethodRunner``
(``run(prompt_ids, config) -> RunOutput``) and may add its own command-line flags through
``add_arguments``. Built in here: ``hf_generate`` (transformers' ``generate()``), ``vanilla`` and
``prompt_lookup``; the methods backed by draft heads (``dart``, ``dart_no_ngram``, ``eagle3``) live in
``bench/methods.py`` with their flags and heavier imports, and register at the end of this module.

``run_benchmark`` has every method answer every question on the one loaded target (each engine has
its own KV cache); question by question the methods take turns, so slow drifts of a shared machine's
load hit them alike. Each method gets a short warm-up generation before anything is timed. With
``turns="all"`` each later turn follows the method's *own* earlier answers, as Spec-Bench does.

Trees: with ``--tree auto`` (``args.tree``; the CLI's default) the drafting methods (``MethodSpec.auto_tree``)
run their drafter under an AutoTree (dart_core.methods.build_drafter), every one of them pricing trees with the one
cost model of the target that :func:`tree_costs` measures (or reads from the cache) once per run; with ``fixed`` (or
args without ``tree``, e.g. a parser without the bench's flags) the drafters run their settings as given.
Every answer records the tree sizes its steps verified and, under automatic trees, the settings chosen.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import torch

from ..config import ConfigError, GenerationConfig
from ..drafters import TreeDrafter
from ..engine.decoding import GenerationStats, SpeculativeEngine
from .questions import BenchInputError, Question

logger = logging.getLogger(__name__)

WARMUP_TOKENS = 8


@dataclass
class RunOutput:
    """What one method produced for one prompt."""
    tokens: list[int]                 # answer tokens, cut after the first EOS (EOS kept, as the engine does)
    text: str                         # answer text before EOS: what --turns all feeds back as the reply
    stats: GenerationStats            # engine stats; for methods without verify steps only new_tokens/stop_reason
    target_forwards: int              # target forwards this answer took (prefill included)
    accept_lengths: list[int] = field(default_factory=list)   # tokens committed by each verify step (bonus incl.)
    tree_nodes: dict[str, int] = field(default_factory=dict)  # verify steps per tree size (nodes, root incl.)
    auto_tree: dict | None = None     # automatic trees: this answer's chosen settings and expected/achieved tau
    accepted_sources: dict[str, int] = field(default_factory=dict)  # accepted drafts by source (head, context, ...)
    # seconds of the generation alone, device synchronised (None: run_answer times the whole call); the report's
    # bookkeeping afterwards (tree sizes, sources) is no part of a method's speed
    wall_s: float | None = None


def accepted_sources(traces, drafter) -> dict[str, int]:
    """Accepted drafted tokens by where they came from: ``head``, ``context``, ``corpus`` or ``several``
    (engine.trace.source_label); a drafter that records no sources drafts from its ``draft_source``
    (prompt lookup: the context; a head's drafter: the head)."""
    from ..engine.trace import source_label

    inner = getattr(drafter, "inner", drafter)
    default = getattr(inner, "draft_source", "head")
    out: Counter = Counter()
    for t in traces:
        nodes = t.accepted_nodes[1:]
        if not nodes:
            continue
        c = t.candidates
        if c is None or len(c.source) == 0:
            out[default] += len(nodes)
        else:
            out.update(source_label(c.source_of_node(n)) for n in nodes)
    return dict(out)


def tree_mode(args) -> str:
    """``auto`` or ``fixed``: the run's ``--tree`` (``fixed`` for args without one)."""
    return getattr(args, "tree", None) or "fixed"


def tree_costs(target, args):
    """The target's cost model on this machine, shared by every method of the run: measured (or read from the
    user cache) at the first call, kept on ``args.tree_costs`` for the rest."""
    costs = getattr(args, "tree_costs", None)
    if costs is None:
        from ..sizing.costs import CostModel
        costs = CostModel.load_or_measure(target)
        args.tree_costs = costs
    return costs


def method_runner(name: str, target, args) -> "EngineRunner":
    """An EngineRunner of a method without parts (vanilla, prompt lookup), built by dart_core.methods; under
    ``--tree auto`` prompt lookup's draft length is chosen on the run's cost model."""
    from ..methods import TreeRequest, build_drafter
    tree = TreeRequest(auto=tree_mode(args) == "auto")
    return EngineRunner(name, target, build_drafter(target, name, None, tree, tree_costs(target, args) if tree.auto
                                                    else None))


def is_auto(drafter) -> bool:
    from ..sizing.auto import AutoTree
    return isinstance(drafter, AutoTree)


def tree_settings(drafter) -> dict | None:
    """The tree settings a drafter runs (None: no drafter, or one without tree settings): {"mode": "fixed",
    "settings": its ``tree_settings()`` (DART's pruning, EAGLE-3's tree, prompt lookup's draft length and node
    cap)}; for an AutoTree {"mode": "auto", "chosen_knobs": the knobs it chooses, "held": the size knobs held
    fixed, "settings": its other settings, "choices": settings weighed}."""
    if drafter is None:
        return None
    if is_auto(drafter):
        knobs = sorted({k for c in drafter.space for k, _ in c.params + c.implied} - set(drafter.fixed))
        inner = (tree_settings(drafter.inner) or {}).get("settings") or {}
        return {"mode": "auto", "chosen_knobs": knobs, "held": dict(drafter.fixed),
                "settings": {k: v for k, v in inner.items() if k not in knobs and k not in drafter.fixed},
                "choices": len(drafter.space)}
    if not isinstance(drafter, TreeDrafter):
        return None
    return {"mode": "fixed", "settings": dict(drafter.tree_settings())}


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

    @property
    def tree(self) -> dict | None:
        """The tree settings this method runs (see :func:`tree_settings`)."""
        return tree_settings(self.engine.drafter)

    def run(self, prompt_ids: list[int], config: GenerationConfig) -> RunOutput:
        drafter = self.engine.drafter
        auto = drafter if drafter is not None and is_auto(drafter) else None
        if auto is not None:   # the AutoTree counts over its life (warm-up included): keep this answer's share
            chosen0, n0 = Counter(auto.chosen), len(auto.expected_tau)
        device = self.engine.target.device
        _sync(device)
        t0 = time.perf_counter()
        result = self.engine.generate(prompt_ids, config)
        _sync(device)
        wall = time.perf_counter() - t0
        nodes = Counter(len(t.tree) for t in result.traces)
        out = RunOutput(result.tokens, result.text, result.stats, target_forwards=result.stats.steps + 1,
                        accept_lengths=[len(t.emitted_tokens) for t in result.traces],
                        tree_nodes={str(n): c for n, c in sorted(nodes.items())},
                        accepted_sources=accepted_sources(result.traces, drafter), wall_s=wall)
        if auto is not None:
            chosen = auto.chosen - chosen0
            out.auto_tree = {"chosen": dict(chosen.most_common()),
                             "expected_tau_sum": float(sum(auto.expected_tau[n0:])),
                             "achieved_tau_sum": float(sum(auto.achieved_tau[n0:])),
                             "drafting_steps": len(auto.expected_tau) - n0}
        return out


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
    auto_tree: its drafter is sized by automatic trees under ``--tree auto`` (dart_core.methods builds it so).
    """
    name: str
    factory: Callable[..., MethodRunner]
    help: str = ""
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    auto_tree: bool = False


METHODS: dict[str, MethodSpec] = {}


def register_method(spec: MethodSpec) -> MethodSpec:
    if spec.name in METHODS:
        raise ValueError(f"benchmark method {spec.name!r} is registered twice")
    METHODS[spec.name] = spec
    return spec


register_method(MethodSpec("hf_generate", lambda target, args: HFGenerateRunner(target),
                           "transformers' generate() on the same model (greedy or the same sampling)"))
register_method(MethodSpec("vanilla", lambda target, args: method_runner("vanilla", target, args),
                           "our loop without a drafter: one token per target forward"))
register_method(MethodSpec("prompt_lookup",
                           lambda target, args: method_runner("prompt_lookup", target, args),
                           "our loop with prompt-lookup drafting (n-gram matches in the context)", auto_tree=True))


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
    tree_nodes: dict[str, int] = field(default_factory=dict)  # verify steps per tree size (nodes, root incl.)
    auto_tree: dict | None = None      # automatic trees: chosen settings (steps each), expected/achieved tau sums
    prefill_s: float = 0.0             # request to first token (time to first token)
    accepted_sources: dict[str, int] = field(default_factory=dict)   # accepted drafts by source


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_answer(runner: MethodRunner, prompt_ids: list[int], config: GenerationConfig,
               device: torch.device) -> tuple[RunOutput, float]:
    """Run one request; wall time from the call to the last token (device synchronised): the runner's own timing of
    the generation where it gives one (RunOutput.wall_s), else the whole call."""
    _sync(device)
    t0 = time.perf_counter()
    out = runner.run(prompt_ids, config)
    _sync(device)
    wall = time.perf_counter() - t0
    return out, out.wall_s if out.wall_s is not None else wall


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
                        question_set=q.question_set, accept_lengths=list(out.accept_lengths),
                        tree_nodes=dict(getattr(out, "tree_nodes", None) or {}),
                        auto_tree=getattr(out, "auto_tree", None), prefill_s=float(out.stats.prefill_s),
                        accepted_sources=dict(getattr(out, "accepted_sources", None) or {})))
                    messages.append({"role": "assistant", "content": out.text})
                bar.update(1)
    finally:
        bar.close()
    return records


def _register_optional_methods() -> None:
    """Methods backed by draft heads (DART, EAGLE-3) register themselves from dart_core.bench.methods."""
    from .methods import register_all
    register_all(register_method, MethodSpec, EngineRunner, METHODS, costs=tree_costs)


_register_optional_methods()
