"""The seeds' Python API: load a target + DART head + N-gram table in one call, generate in another.

    from dart_core import DartModel, dart_generate, TEMPLATE_REGISTRY

    model = DartModel.from_pretrained()                      # every argument optional: bundled defaults
    prompt = model.template.format(messages=[{"role": "user", "content": "Explain speculative decoding."}])
    out = dart_generate(model, prompt=prompt, max_new_token_num=256)
    print(out.text, out.stats.tau)

    for step in dart_generate_stream(model, prompt=prompt):  # one item per speculative step
        print(step.text, end="", flush=True)

``from_pretrained`` takes the published argument names (``base_model_name_or_path``,
``dart_model_name_or_path``, ``ngram_model_name_or_path``, ``torch_dtype``, ``device_map``,
``is_small_ngram``). Omitted = the bundled default (SmolLM2-135M-Instruct, its shipped head in
``assets/dart/`` and N-gram table in ``assets/ngram/``). A head is checked against the target
(hidden size, vocabulary, and for heads trained here the target's weight fingerprint). An
original DART ``.trie`` (e.g. the Hub repo ``fvliang/dart-qwen3-ngram``) is converted once into a
memory-mapped table in the dart-demo cache.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from .config import ConfigError, GenerationConfig
from .engine.decoding import GenerationStats
from .models.heads.dart import DartHead
from .drafters.pruning import PruningConfig
from .methods import Parts, TreeRequest, build_engine
from .loading import bundled_head_dir, load_head_and_ngram, open_ngram
from .models.detok import IncrementalDetokenizer
from .models.templates import TEMPLATE_REGISTRY, check_text, encode_chat, get_template
from .engine.trace import StepTrace

logger = logging.getLogger(__name__)

@dataclass
class DartOutput:
    """What ``dart_generate`` returns.

    tokens  answer token ids (EOS included when reached)
    text    the answer only, cut before EOS
    stats   GenerationStats: tau, steps, stage_s (seconds per stage), tokens_per_s, stop_reason, ...
    traces  one StepTrace per speculative step (trees, scored candidates, timings)
    """
    tokens: list[int]
    text: str
    stats: GenerationStats
    traces: list[StepTrace] = field(default_factory=list)


@dataclass
class DartStreamStep:
    """One speculative step of ``dart_generate_stream``.

    tokens  tokens this step added; text  their decoded text (a delta; join the deltas for the answer)
    answer_tokens  all answer tokens so far; trace  the step's StepTrace
    """
    tokens: list[int]
    text: str
    answer_tokens: list[int]
    trace: StepTrace


class DartModel:
    """A target model + DART head + N-gram table, ready to generate (batch size 1)."""

    def __init__(self, target, head: DartHead, store=None, pruning: PruningConfig | None = None,
                 template_name: str | None = None, tree: str = "auto"):
        """tree: "auto" sizes each tree (the budget) from this machine's measured costs and the head's acceptance
        (dart_core.sizing; the other pruning knobs come from ``pruning``); "fixed" runs ``pruning`` as given.
        pruning: the pruner's knobs (default: the paper's)."""
        from .presets import TREE_MODES
        if tree not in TREE_MODES:
            raise ConfigError(f"tree={tree!r}: use one of {', '.join(TREE_MODES)}")
        self.target = target
        self.head = head
        self.ngram_model = store
        self.pruning = pruning or PruningConfig()
        self.tree = tree
        self.template = get_template(template_name or target.template_name)
        self._build_engine()

    def _build_engine(self) -> None:
        # The pruning given whole over the paper's; with automatic trees the budget is chosen (nothing held).
        from dataclasses import asdict
        tree = TreeRequest(asdict(self.pruning), auto=self.tree == "auto")
        costs = None
        if tree.auto:
            from .sizing.costs import CostModel
            costs = CostModel.load_or_measure(self.target)
        self.engine = build_engine(self.target, "dart", Parts(dart_head=self.head, ngram=self.ngram_model), tree,
                                   costs=costs)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, base_model_name_or_path: str | None = None, dart_model_name_or_path: str | None = None,
                        ngram_model_name_or_path: str | None = None, torch_dtype: str | torch.dtype | None = None,
                        device_map: str | None = None, is_small_ngram: bool = False, *,
                        template_name: str | None = None, pruning: PruningConfig | None = None,
                        tree: str = "auto", check_fingerprint: bool = True, **kwargs: Any) -> "DartModel":
        """Load everything; omitted arguments use the bundled defaults.

        base_model_name_or_path   target: Hub id, local directory, .gguf file, or None (bundled SmolLM2-135M)
        dart_model_name_or_path   DART head: Hub id or directory (config.json + model.safetensors);
                                  None = the shipped head of the bundled target
        ngram_model_name_or_path  N-gram table: a .dngram file, a directory or Hub repo holding one
                                  (or an original full.trie / small.trie, converted once), "none" for
                                  no N-gram term; None = the bundled table for the bundled target
        torch_dtype               torch dtype or name ("auto", "bfloat16", "float32", ...); None = auto
        device_map                "auto" / None (GPU if present), "cpu", "cuda", "cuda:1" (one device only)
        is_small_ngram            pick small.* over full.* in a directory or Hub repo
        tree                      "auto" (trees sized by measurement) or "fixed" (``pruning`` as given)
        Extra keyword arguments of the original (low_cpu_mem_usage, ...) are accepted and ignored.
        """
        from .models.loader import load_target

        if kwargs:
            logger.info("DartModel.from_pretrained: ignoring %s", ", ".join(sorted(kwargs)))
        device = _device_from_map(device_map)
        target = load_target(base_model_name_or_path, dtype=torch_dtype or "auto", device=device,
                             template_name=template_name)
        head, store = load_head_and_ngram(target, base_model_name_or_path, dart_model_name_or_path,
                                          ngram_model_name_or_path, is_small_ngram=is_small_ngram,
                                          check_fingerprint=check_fingerprint)
        return cls(target, head, store, pruning=pruning, template_name=template_name, tree=tree)

    # ------------------------------------------------------------------ conveniences of the original
    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def base_model(self):
        return self.target.model

    @property
    def device(self) -> torch.device:
        return self.target.device

    def get_tokenizer(self):
        return self.target.tokenizer

    def eval(self) -> "DartModel":
        return self

    def to(self, device: str | torch.device) -> "DartModel":
        """Move target and head to ``device`` (the original's ``.to(device)``)."""
        dev = torch.device(device)
        if dev != self.target.device:
            self.target.model.to(dev)
            self.head.to(dev)
            self.head.attach_embedding(self.target.model.get_input_embeddings().weight)
            self._build_engine()
        return self

    def encode_prompt(self, prompt: str | None = None, messages: Sequence[dict] | None = None,
                      input_ids: Sequence[int] | torch.Tensor | None = None) -> list[int]:
        """Token ids from exactly one of: formatted prompt text, chat messages, or ids."""
        given = [x is not None for x in (prompt, messages, input_ids)]
        if sum(given) != 1:
            raise ConfigError("give exactly one of prompt= (formatted chat text), messages= (a list of "
                              "{'role', 'content'} dicts) or input_ids=")
        if input_ids is not None:
            if isinstance(input_ids, torch.Tensor):
                if input_ids.dim() == 2 and input_ids.shape[0] != 1:
                    raise ConfigError(f"batch size {input_ids.shape[0]} is not supported: pass one prompt at a time")
                return [int(t) for t in input_ids.reshape(-1).tolist()]
            return [int(t) for t in input_ids]
        if messages is not None:
            return encode_chat(self.tokenizer, self.template, list(messages))
        if not isinstance(prompt, str):
            raise ConfigError(f"prompt must be a string (formatted chat text), got {type(prompt).__name__}")
        return list(self.tokenizer.encode(check_text(prompt, "prompt="), add_special_tokens=False))


def _device_from_map(device_map) -> str:
    if device_map is None or device_map == "auto":
        return "auto"
    if isinstance(device_map, (str, torch.device)):
        return str(device_map)
    if isinstance(device_map, int):
        return f"cuda:{device_map}"
    raise ConfigError(f"device_map={device_map!r} is not supported: the target and the head run on one device; "
                      "use 'auto', 'cpu', 'cuda' or 'cuda:N'")


# ---------------------------------------------------------------------------------------------- generation
def _config(temperature, top_p, top_k, max_new_token_num, max_length, seed) -> GenerationConfig:
    top_p = 1.0 if top_p is None or top_p <= 0 else float(top_p)   # the original's 0.0 means "off"
    top_k = 0 if top_k is None else int(top_k)
    return GenerationConfig(max_new_tokens=int(max_new_token_num), max_length=int(max_length),
                            temperature=float(temperature or 0.0), top_p=top_p, top_k=top_k, seed=seed)


def dart_generate(model: DartModel, prompt: str | None = None, temperature: float = 0.0, top_p: float = 0.0,
                  top_k: int = 0, max_new_token_num: int = 512, max_length: int = 2048, *,
                  messages: Sequence[dict] | None = None, input_ids=None, seed: int | None = None) -> DartOutput:
    """Generate one answer with DART speculative decoding.

    prompt: the formatted chat text (``model.template.format(messages=...)``), or pass messages=
    or input_ids= instead. temperature 0 = greedy (identical to the target's own greedy output);
    > 0 = lossless speculative sampling with top_p / top_k warping (0 = off, as the original).
    Returns DartOutput(tokens, text, stats, traces).
    """
    ids = model.encode_prompt(prompt, messages, input_ids)
    res = model.engine.generate(ids, _config(temperature, top_p, top_k, max_new_token_num, max_length, seed))
    return DartOutput(tokens=res.tokens, text=res.text, stats=res.stats, traces=res.traces)


def dart_generate_stream(model: DartModel, prompt: str | None = None, temperature: float = 0.0,
                         top_p: float = 0.0, top_k: int = 0, max_new_token_num: int = 512,
                         max_length: int = 2048, *, messages: Sequence[dict] | None = None, input_ids=None,
                         seed: int | None = None) -> Iterator[DartStreamStep]:
    """Like :func:`dart_generate`, but yields a DartStreamStep per speculative step; the generator's
    return value (``StopIteration.value``) is the final DartOutput."""
    ids = model.encode_prompt(prompt, messages, input_ids)
    gen = model.engine.stream(ids, _config(temperature, top_p, top_k, max_new_token_num, max_length, seed))
    eos = set(model.target.eos_token_ids)
    tokenizer = model.tokenizer
    # The text stops at the first EOS; a character split across steps is held back until it is whole.
    detok = IncrementalDetokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    answer: list[int] = []
    first_emitted = ended = False
    while True:
        try:
            trace = next(gen)
        except StopIteration as done:
            res = done.value
            return DartOutput(tokens=res.tokens, text=res.text, stats=res.stats, traces=res.traces)
        new = list(trace.emitted_tokens)
        if not first_emitted:
            # The engine's first answer token comes from the prefill; it is the root of step 1's tree.
            new_in_answer = [int(trace.tree.tokens[0])] + new
            first_emitted = True
        else:
            new_in_answer = new
        answer.extend(new_in_answer)
        cut = next((i for i, t in enumerate(new_in_answer) if t in eos), None)
        delta = "" if ended else detok.push(new_in_answer if cut is None else new_in_answer[:cut])
        ended = ended or cut is not None
        step_tokens = ([answer[0]] if trace.step == 1 else []) + new
        yield DartStreamStep(tokens=step_tokens, text=delta, answer_tokens=list(answer), trace=trace)


__all__ = ["DartModel", "DartOutput", "DartStreamStep", "dart_generate", "dart_generate_stream",
           "TEMPLATE_REGISTRY", "open_ngram", "bundled_head_dir"]
