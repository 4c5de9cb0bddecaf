"""Side-by-side runs of several engines on one target, for the visualiser (no Gradio here).

    factory = EngineFactory.from_flags(target, dart_model_name_or_path=..., compare_eagle3=True)
    cmp = Comparison(factory.build(settings), prompt_ids, config, decode=target.tokenizer)
    for name in cmp.run(stop=event.is_set):      # one engine step per item, fair clock
        print(cmp.record.metrics()[name])
    export = cmp.record.to_export()              # JSON-able; RunRecord.from_export(...) replays it
    print(narrate_step(cmp.record.runs["dart"].traces[0], target.tokenizer).text)

One generator advances the engines in turn, so their timings never overlap: each engine's
clock (``busy_s``) counts only the time spent inside its own ``next()`` (prefill included,
UI time excluded), and the next engine to advance is always the one with the least engine
time so far. The streamed answers therefore show what a race on one shared clock would look
like, and tokens/s, tau and the speedup over the vanilla baseline come from this very run.

Live runs and replays of exported files produce the same :class:`RunRecord`, so the app renders
both through one code path.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

from . import viz
from ..config import ConfigError, GenerationConfig
from ..engine.decoding import GenerationResult, SpeculativeEngine
from .record_schema import EXPORT_FORMAT, EXPORT_VERSION, ReplayError, validate_export  # noqa: F401 (re-exported)
from ..presets import LIMITS, Limit
from ..drafters.pruning import PruningConfig
from ..engine.trace import StepTrace

logger = logging.getLogger(__name__)

BASELINE = "vanilla"
#: Column order and display names of the engines the app knows.
ENGINE_LABELS: dict[str, str] = {"dart": "DART", "eagle3": "EAGLE-3", "vanilla": "Vanilla (baseline)"}

Decode = Callable[[list[int]], str]
#: answer tokens per request; the server's own cap (--max-new-tokens) is checked in generation_config
MAX_NEW_TOKENS = Limit("Max new tokens", 1, None, True)


def label_of(name: str) -> str:
    return ENGINE_LABELS.get(name, name)


# ---------------------------------------------------------------------------------------------- settings
@dataclass
class RunSettings:
    """Every knob the page exposes, with the names the page shows in its error messages.

    None for a tree knob = the engine's own default (DART: ``default_pruning(target)``;
    EAGLE-3: the published total_token 60, depth 7, top_k 10).
    """
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    budget: int | None = None
    beam_width: int | None = None
    level_top_k: int | None = None
    ngram_weight: float | None = None
    eagle3_total_token: int | None = None
    eagle3_depth: int | None = None
    eagle3_top_k: int | None = None

    # (field, limit): the ranges live in dart_core.presets, shared with the sliders, the tree configs and CLI flags
    _RULES = (("max_new_tokens", MAX_NEW_TOKENS),) + tuple((name, LIMITS[name]) for name in (
        "temperature", "top_p", "top_k", "budget", "beam_width", "level_top_k", "ngram_weight",
        "eagle3_total_token", "eagle3_depth", "eagle3_top_k"))

    @classmethod
    def from_values(cls, **values: Any) -> "RunSettings":
        """Settings from loosely typed page values (floats from sliders, None from empty boxes), checked.
        Raises ConfigError naming the control to change."""
        s = cls()
        for name, limit in cls._RULES:
            if name not in values or values[name] is None:
                continue
            v = values[name]
            why = limit.problem(v)
            if why is not None:
                raise ConfigError(f"{limit.label} {why}: set the {limit.label} control")
            setattr(s, name, int(float(v)) if limit.integer else float(v))
        if "seed" in values and values["seed"] not in (None, ""):
            s.seed = int(values["seed"])
        s.validate()
        return s

    def validate(self) -> None:
        for name, limit in self._RULES:
            v = getattr(self, name)
            if v is None:
                continue
            why = limit.problem(v)
            if why is not None:
                raise ConfigError(f"{limit.label} {why}: set the {limit.label} control")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generation_config(self, max_length: int, *, max_new_tokens_limit: int | None = None) -> GenerationConfig:
        """The request's GenerationConfig; ``max_new_tokens_limit`` is the server's --max-new-tokens."""
        self.validate()
        if max_new_tokens_limit is not None and self.max_new_tokens > max_new_tokens_limit:
            raise ConfigError(f"Max new tokens is {self.max_new_tokens} but this server allows at most "
                              f"{max_new_tokens_limit}: lower the slider, or restart the app with a larger "
                              "--max-new-tokens")
        return GenerationConfig(max_new_tokens=int(self.max_new_tokens), max_length=int(max_length),
                                temperature=float(self.temperature), top_p=float(self.top_p),
                                top_k=int(self.top_k), seed=self.seed)

    def pruning(self, base: PruningConfig) -> PruningConfig:
        d = base.to_dict()
        for ours, theirs in (("budget", "budget"), ("beam_width", "beam_width"), ("level_top_k", "top_k"),
                             ("ngram_weight", "ngram_weight")):
            if getattr(self, ours) is not None:
                d[theirs] = getattr(self, ours)
        try:
            return PruningConfig(**d)
        except ValueError as exc:
            raise ConfigError(f"DART tree settings: {exc}") from None

    def eagle3_tree(self, base: Any):
        from ..drafters.eagle3 import Eagle3TreeConfig
        d = asdict(base)
        for ours, theirs in (("eagle3_total_token", "total_token"), ("eagle3_depth", "depth"),
                             ("eagle3_top_k", "top_k")):
            if getattr(self, ours) is not None:
                d[theirs] = int(getattr(self, ours))
        try:
            return Eagle3TreeConfig(**d)
        except ValueError as exc:
            raise ConfigError(f"EAGLE-3 tree settings: {exc}") from None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def check_prompt_length(n_prompt: int, max_length: int, max_new_tokens: int) -> str | None:
    """None if the prompt fits; else the message the page shows. A warning string is returned (not
    raised) when the prompt fits but leaves less room than max_new_tokens."""
    if n_prompt == 0:
        raise ConfigError("the prompt is empty: type a question first")
    if n_prompt + 1 >= max_length:
        raise ConfigError(f"the prompt is {n_prompt} tokens (with the chat template) but this server allows "
                          f"{max_length} tokens for prompt + answer: shorten the prompt, or restart the app with "
                          "a larger --max-length")
    room = max_length - n_prompt
    if room < max_new_tokens:
        return (f"the prompt leaves room for only {room} answer tokens (--max-length {max_length}); "
                "the answers will stop there")
    return None


# ---------------------------------------------------------------------------------------------- engines
class EngineFactory:
    """The drafters' loaded parts (heads, N-gram table) for one target, and engines built from them.

    ``unavailable`` maps an engine name to the reason the page shows when it cannot run.

    An engine (its KV cache and drafter state) belongs to one run at a time: ``checkout(settings)`` hands a run
    an :class:`EngineLease` of engines no other run holds, taking the idle ones of the same tree settings from
    the pool (so KV caches are reused across requests) and building the rest; ``lease.release()`` puts them
    back. Two runs at once therefore never share an engine, whatever serves them (and
    ``SpeculativeEngine.stream`` refuses a second open generation on one engine besides).
    """

    def __init__(self, target, *, dart_head=None, ngram=None, dart_pruning: PruningConfig | None = None,
                 eagle3_head=None, eagle3_tree=None, unavailable: Mapping[str, str] | None = None):
        from ..drafters.eagle3 import default_eagle3_tree
        from ..drafters.pruning import default_pruning
        self.target = target
        self.dart_head = dart_head
        self.ngram = ngram
        self.dart_pruning = dart_pruning or default_pruning(target.name)
        self.eagle3_head = eagle3_head
        self.eagle3_tree_base = eagle3_tree or default_eagle3_tree(target.name)
        self.unavailable: dict[str, str] = dict(unavailable or {})
        self._pool: dict[str, tuple[Any, SpeculativeEngine]] = {}   # idle engines, at most one per name
        self._pool_lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        """Engines this factory can build, in column order (the baseline last)."""
        out = []
        if self.dart_head is not None:
            out.append("dart")
        if self.eagle3_head is not None:
            out.append("eagle3")
        return out + [BASELINE]

    @classmethod
    def from_flags(cls, target, *, base_model_name_or_path: str | None = None,
                   dart_model_name_or_path: str | None = None, ngram_model_name_or_path: str | None = None,
                   use_small_ngram: bool = False, eagle3_model_name_or_path: str | None = None,
                   compare_eagle3: bool = False) -> "EngineFactory":
        """Load the heads the flags name. A head the user named explicitly must load (errors propagate,
        naming the flag); a missing *default* head only makes that engine unavailable, with the reason."""
        from ..api import load_head_and_ngram
        from ..models.bundled import is_bundled_target
        from ..models.heads.dart import DartHeadError

        unavailable: dict[str, str] = {}
        dart_head = store = None
        try:
            dart_head, store = load_head_and_ngram(target, base_model_name_or_path, dart_model_name_or_path,
                                                   ngram_model_name_or_path, is_small_ngram=use_small_ngram)
        except DartHeadError as exc:
            if dart_model_name_or_path is not None:
                raise
            unavailable["dart"] = (f"**DART is unavailable**: {exc}. Start the app with "
                                   "--dart-model-name-or-path DIR|HUB_ID to add it.")
            logger.warning("%s", unavailable["dart"])
        eagle3_head = None
        if compare_eagle3 or eagle3_model_name_or_path is not None:
            from ..models.heads.eagle3 import Eagle3HeadError, load_eagle3_for_target
            try:
                eagle3_head = load_eagle3_for_target(target, base_model_name_or_path, eagle3_model_name_or_path)
            except Eagle3HeadError as exc:
                if eagle3_model_name_or_path is not None:
                    raise
                bundled = "bundled" if is_bundled_target(base_model_name_or_path) else base_model_name_or_path
                msg = f"**EAGLE-3 is unavailable**: {exc}"
                if "dart_core.train eagle3" not in msg:  # always say how to get a head
                    msg += (f". To get a head: `python -m dart_core.train eagle3 --target {bundled} --data FILE "
                            "--out DIR`, then start the app with --eagle3-model-name-or-path DIR")
                unavailable["eagle3"] = msg + ". DART and the vanilla baseline run without it."
                logger.warning("%s", unavailable["eagle3"])
        return cls(target, dart_head=dart_head, ngram=store, eagle3_head=eagle3_head, unavailable=unavailable)

    def _make(self, name: str, settings: RunSettings) -> tuple[Any, SpeculativeEngine]:
        target = self.target
        if name == "dart":
            from ..drafters.dart import DartDrafter
            pruning = settings.pruning(self.dart_pruning)
            key = tuple(sorted(pruning.to_dict().items()))
            return key, SpeculativeEngine(target, DartDrafter(self.dart_head, self.ngram, target.eos_token_ids,
                                                              pruning=pruning), name="dart")
        if name == "eagle3":
            from ..drafters.eagle3 import Eagle3Drafter
            tree = settings.eagle3_tree(self.eagle3_tree_base)
            key = tuple(sorted(asdict(tree).items()))
            return key, SpeculativeEngine(target, Eagle3Drafter(self.eagle3_head, tree), name="eagle3")
        if name == BASELINE:
            return (), SpeculativeEngine(target, name=BASELINE)
        raise ConfigError(f"unknown engine {name!r}; this app runs {self.names}")

    def tree_key(self, name: str, settings: RunSettings) -> Any:
        if name == "dart":
            return tuple(sorted(settings.pruning(self.dart_pruning).to_dict().items()))
        if name == "eagle3":
            return tuple(sorted(asdict(settings.eagle3_tree(self.eagle3_tree_base)).items()))
        return ()

    def checkout(self, settings: RunSettings, *, fresh: bool = False) -> "EngineLease":
        """Engines for one run, owned by it until ``release()``: idle pooled engines of the same tree settings
        (none when ``fresh``), the rest built new. Tree settings are validated first, so a bad one fails
        before any engine work."""
        keys = {name: self.tree_key(name, settings) for name in self.names}
        engines: dict[str, SpeculativeEngine] = {}
        if not fresh:
            with self._pool_lock:
                for name, key in keys.items():
                    idle = self._pool.get(name)
                    if idle is not None and idle[0] == key and not idle[1].busy:
                        engines[name] = self._pool.pop(name)[1]
        for name in keys:
            if name not in engines:
                engines[name] = self._make(name, settings)[1]
        return EngineLease(self, {n: engines[n] for n in keys}, keys, fresh=fresh)

    def _check_in(self, lease: "EngineLease") -> None:
        """A run's engines back into the pool. A run's lease replaces the idle engine of its name (the latest
        settings are the likeliest next); a fresh lease (step-once) only fills an empty place. Engines still
        generating are dropped (their owner never closed them)."""
        with self._pool_lock:
            for name, engine in lease.engines.items():
                if engine.busy or (lease.fresh and name in self._pool):
                    continue
                self._pool[name] = (lease.keys[name], engine)

    def build(self, settings: RunSettings, *, fresh: bool = False) -> dict[str, SpeculativeEngine]:
        """Engines for single-threaded use (warm-up, scripts): with ``fresh`` new ones of their own, else the
        pooled ones, which stay in the pool for the next checkout. Anything that may run beside other runs
        (the app) takes its engines with :meth:`checkout`."""
        if fresh:
            return {name: self._make(name, settings)[1] for name in self.names}
        lease = self.checkout(settings)
        lease.release()
        return dict(lease.engines)


class EngineLease:
    """Engines checked out of an :class:`EngineFactory` by one run: its own until ``release()`` (idempotent,
    thread-safe) gives them back. Usable as a context manager."""

    def __init__(self, factory: EngineFactory, engines: dict[str, SpeculativeEngine], keys: dict[str, Any],
                 *, fresh: bool = False):
        self.factory = factory
        self.engines = engines
        self.keys = keys
        self.fresh = fresh
        self._released = False
        self._lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self._released

    def cache_nbytes(self) -> int:
        """Bytes in these engines' own caches while the lease is held (0 once released)."""
        return 0 if self._released else sum(e.cache_nbytes() for e in self.engines.values())

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self.factory._check_in(self)

    def __enter__(self) -> "EngineLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


# ---------------------------------------------------------------------------------------------- runs
@dataclass
class EngineRun:
    """What one engine has produced so far in a comparison (live) or a recorded run (replay).

    tokens   answer tokens (the first comes from the prefill; EOS included when reached)
    busy_s   seconds spent inside this engine's own work (prefill + steps), never UI or other engines
    spans    recorded (text, label) spans; None = computed from the traces with the decoder
    """
    name: str
    tokens: list[int] = field(default_factory=list)
    traces: list[StepTrace] = field(default_factory=list)
    busy_s: float = 0.0
    done: bool = False
    stop_reason: str | None = None
    error: str | None = None
    spans: list[tuple[str, str]] | None = None

    @property
    def label(self) -> str:
        return label_of(self.name)

    @property
    def steps(self) -> int:
        return len(self.traces)

    @property
    def tau(self) -> float | None:
        """Tokens per verify step, bonus included (prefill token excluded), as GenerationStats."""
        return (len(self.tokens) - 1) / len(self.traces) if self.traces else None

    @property
    def tokens_per_s(self) -> float | None:
        return len(self.tokens) / self.busy_s if self.busy_s > 0 and self.tokens else None

    def add_step(self, trace: StepTrace) -> None:
        if not self.traces:
            self.tokens.append(int(trace.tree.tokens[0]))  # the prefill's token is step 1's root
        self.traces.append(trace)
        self.tokens.extend(int(t) for t in trace.emitted_tokens)


@dataclass
class EngineMetrics:
    tokens: int
    steps: int
    tau: float | None
    tokens_per_s: float | None
    speedup: float | None           # tokens/s over the baseline's, both from this run
    lossless: str                   # "identical", "same so far", "differs", "n/a", "pending"
    lossless_text: str              # one line for the page


def lossless_check(run: EngineRun, base: EngineRun, greedy: bool, dtype: str | None = None) -> tuple[str, str]:
    """Whether ``run``'s answer equals the baseline's (greedy decoding only)."""
    if run.name == base.name:
        return "n/a", "this is the baseline"
    if not greedy:
        return "n/a", ("sampling (temperature > 0): answers differ by design; speculative sampling is "
                       "lossless in distribution, not token by token")
    a, b = run.tokens, base.tokens
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    if first is None and run.done and base.done and len(a) != len(b):
        first = n
    if first is not None:
        hint = ""
        if dtype and "float32" not in str(dtype):
            hint = (f" ({dtype}: differently shaped matmuls can flip a near-tie argmax; start with --dtype "
                    "float32 for exact equality)")
        return "differs", f"differs from the baseline at token {first}{hint}"
    if run.done and base.done:
        return "identical", f"identical to the baseline ({len(a)} tokens)"
    if n == 0:
        return "pending", "waiting for tokens"
    return "same so far", f"same as the baseline so far ({n} tokens)"


def _decoder_fn(decode: Any) -> Decode:
    if decode is None:
        return lambda ids: " ".join(f"#{i}" for i in ids)
    if hasattr(decode, "decode"):
        return lambda ids: decode.decode(list(ids), skip_special_tokens=True)
    return decode


_TRACE_OVERHEAD = 2048    # bytes of one StepTrace besides its arrays (objects, dicts, small lists)


def _seq_nbytes(x: Any) -> int:
    """Estimated bytes of an array or list of numbers: numpy's own count, else a pointer plus a boxed number
    (about 36 bytes) per element."""
    if x is None:
        return 0
    nbytes = getattr(x, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    return 56 + 36 * len(x)


@dataclass
class RunRecord:
    """A comparison's runs plus what is needed to render them: the page renders only this.

    decode   a tokenizer or a callable ids -> text (replays use the recorded token texts)
    """
    runs: dict[str, EngineRun]
    decode: Any
    prompt: str = ""
    greedy: bool = True
    baseline: str = BASELINE
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def speculative(self) -> list[str]:
        return [n for n in self.runs if n != self.baseline]

    @property
    def done(self) -> bool:
        return all(r.done for r in self.runs.values())

    def text(self, name: str) -> str:
        run = self.runs[name]
        return "".join(t for t, _ in self.spans(name)) if run.spans is not None else \
            _decoder_fn(self.decode)(run.tokens)

    def spans(self, name: str) -> list[tuple[str, str]]:
        """(text, label) per answer token, labelled from the trace (accepted draft vs target token)."""
        run = self.runs[name]
        if run.spans is not None:
            return list(run.spans)
        if run.traces:
            return viz.token_spans(run.traces, self.decode)
        if run.tokens:  # stopped right after the prefill
            return [(_decoder_fn(self.decode)(run.tokens), viz.PREFILL_LABEL)]
        return []

    def metrics(self) -> dict[str, EngineMetrics]:
        base = self.runs.get(self.baseline)
        base_tps = base.tokens_per_s if base is not None else None
        out = {}
        for name, run in self.runs.items():
            tps = run.tokens_per_s
            speedup = tps / base_tps if tps and base_tps else None
            if base is None:
                state, text = "n/a", "no baseline in this run"
            else:
                state, text = lossless_check(run, base, self.greedy, self.meta.get("dtype"))
            out[name] = EngineMetrics(tokens=len(run.tokens), steps=run.steps, tau=run.tau, tokens_per_s=tps,
                                      speedup=speedup, lossless=state, lossless_text=text)
        return out

    def nbytes(self) -> int:
        """Estimated bytes this record holds (its traces dominate: every scored candidate is kept)."""
        total = 0
        for run in self.runs.values():
            total += _seq_nbytes(run.tokens) + (150 * len(run.spans) if run.spans is not None else 0)
            for st in run.traces:
                total += _TRACE_OVERHEAD + sum(_seq_nbytes(x) for x in (
                    st.tree.tokens, st.tree.parents, st.tree.depths, st.tree.scores, st.accepted_nodes,
                    st.emitted_tokens, st.node_target_prob, st.node_target_argmax))
                if st.candidates is not None:
                    total += sum(_seq_nbytes(getattr(st.candidates, f)) for f in st.candidates.__dataclass_fields__)
        return total

    def max_position(self) -> int:
        """Highest answer-token position any engine reached (0 when nothing was produced)."""
        return max((len(r.tokens) - 1 for r in self.runs.values()), default=0) if self.runs else 0

    # ------------------------------------------------------------------ export / replay
    def to_export(self) -> dict[str, Any]:
        """A JSON-able dict of the whole run. Token texts are stored (spans per answer, and the text of
        every token the traces mention) so a replay needs neither the model nor its tokenizer."""
        decode = _decoder_fn(self.decode)
        seen: set[int] = set()
        engines = {}
        for name, run in self.runs.items():
            seen.update(run.tokens)
            for st in run.traces:
                seen.update(int(t) for t in st.tree.tokens)
                seen.add(int(st.bonus_token))
                seen.update(int(t) for t in st.node_target_argmax)
                if st.candidates is not None:
                    seen.update(int(t) for t in st.candidates.token)
            engines[name] = {"tokens": list(run.tokens), "busy_s": run.busy_s, "done": run.done,
                             "stop_reason": run.stop_reason, "error": run.error,
                             "spans": [list(s) for s in self.spans(name)],
                             "traces": [st.to_dict() for st in run.traces]}
        # Single-token texts label tree nodes; special tokens keep their names there (e.g. <|im_end|>).
        raw = (self.decode.decode if hasattr(self.decode, "decode") else decode)
        token_text = {str(t): raw([t]) for t in sorted(seen)}
        return {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "prompt": self.prompt, "greedy": self.greedy,
                "baseline": self.baseline, "meta": dict(self.meta), "token_text": token_text, "engines": engines}

    def to_json(self) -> str:
        return json.dumps(self.to_export(), ensure_ascii=False)

    @classmethod
    def from_export(cls, data: Mapping[str, Any] | str | bytes | Path) -> "RunRecord":
        """Read an exported run (a dict, JSON text/bytes, or a file path). The whole record is checked once
        here (dart_core.ui.record_schema), so a record that loads renders every step. Raises ReplayError (a
        ValueError) that says where the file is wrong and what to do; OSError when a path cannot be read."""
        if isinstance(data, Path):
            data = data.read_bytes()
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ReplayError(f"byte {exc.start}", "the trace file is not UTF-8 JSON: choose a file saved with "
                                  "\"Export traces\"") from None
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as exc:
                raise ReplayError(f"line {exc.lineno}, column {exc.colno}", f"the trace file is not valid JSON "
                                  f"({exc.msg}): choose a file saved with \"Export traces\"") from None
            except RecursionError:
                raise ReplayError("the file", "the JSON is nested too deeply to be a trace export: choose a file "
                                  "saved with \"Export traces\"") from None
            except ValueError as exc:  # e.g. an integer with more digits than Python converts
                raise ReplayError("the file", f"the trace file is not a usable JSON document ({exc}): choose a "
                                  "file saved with \"Export traces\"") from None
        try:
            run = validate_export(data)
        except RecursionError:  # a nested dict handed in directly (files are caught above)
            raise ReplayError("the record", "it is nested too deeply to be a trace export") from None
        runs: dict[str, EngineRun] = {}
        for name, e in run["engines"].items():
            traces = [StepTrace.from_dict(t) for t in e["traces"]]
            runs[name] = EngineRun(name=name, tokens=list(e["tokens"]), traces=traces, busy_s=e["busy_s"],
                                   done=e["done"], stop_reason=e["stop_reason"], error=e["error"], spans=e["spans"])
        return cls(runs=runs, decode=TokenTextDecoder(run["token_text"]), prompt=run["prompt"],
                   greedy=run["greedy"], baseline=run["baseline"], meta=run["meta"])


class TokenTextDecoder:
    """Decodes ids with a recorded {id: text} table (replays run without the tokenizer)."""

    def __init__(self, texts: Mapping[int, str]):
        self.texts = dict(texts)

    def __call__(self, ids: Sequence[int]) -> str:
        return "".join(self.texts.get(int(i), f"#{int(i)}") for i in ids)


# ---------------------------------------------------------------------------------------------- comparison
class Comparison:
    """Several engines on one prompt, advanced one step at a time by one generator (fair clock).

    ``lease``: the :class:`EngineLease` the engines came from; it is released as soon as every engine is done
    (finished, failed, stopped or closed), so the engines serve the next run only once this one let go."""

    def __init__(self, engines: Mapping[str, SpeculativeEngine], prompt_ids: Sequence[int],
                 config: GenerationConfig, *, decode: Any, prompt: str = "", baseline: str = BASELINE,
                 meta: Mapping[str, Any] | None = None, lease: EngineLease | None = None):
        self.config = config
        self.engines = dict(engines)
        self.lease = lease
        self._gens: dict[str, Generator[StepTrace, None, GenerationResult]] = {
            name: engine.stream(list(prompt_ids), config) for name, engine in self.engines.items()}
        self.record = RunRecord(runs={n: EngineRun(n) for n in self.engines}, decode=decode, prompt=prompt,
                                greedy=config.greedy, baseline=baseline, meta=dict(meta or {}))

    @property
    def done(self) -> bool:
        return self.record.done

    def next_engine(self) -> str | None:
        """The unfinished engine with the least engine time so far (ties: column order)."""
        live = [r for r in self.record.runs.values() if not r.done]
        return min(live, key=lambda r: r.busy_s).name if live else None

    def advance(self, name: str | None = None) -> StepTrace | None:
        """One step of ``name`` (default: :meth:`next_engine`); returns its trace, or None when the engine
        finished without a new step. An engine error ends that engine only, with the message kept."""
        name = name or self.next_engine()
        if name is None:
            return None
        run = self.record.runs[name]
        if run.done:
            return None
        t0 = time.perf_counter()
        try:
            trace = next(self._gens[name])
        except StopIteration as finished:
            run.busy_s += time.perf_counter() - t0
            result: GenerationResult = finished.value
            run.tokens = list(result.tokens)  # the engine's own answer is the truth (covers prefill-only runs)
            run.done, run.stop_reason = True, result.stats.stop_reason
            self._release_if_done()
            return None
        except ConfigError as exc:
            run.busy_s += time.perf_counter() - t0
            run.done, run.stop_reason, run.error = True, "error", str(exc)
            self._release_if_done()
            return None
        except Exception as exc:  # noqa: BLE001 - one engine's failure must not take the page down
            run.busy_s += time.perf_counter() - t0
            logger.exception("engine %s failed", name)
            run.done, run.stop_reason, run.error = True, "error", f"{type(exc).__name__}: {exc}"
            self._release_if_done()
            return None
        run.busy_s += time.perf_counter() - t0
        run.add_step(trace)
        if trace.stop_reason is not None:  # finish now: the generator's epilogue is bookkeeping only
            self.advance(name)
        return trace

    def round(self) -> dict[str, StepTrace | None]:
        """One step of every unfinished engine (step-once mode)."""
        return {name: self.advance(name) for name, run in self.record.runs.items() if not run.done}

    def run(self, stop: Callable[[], bool | str | None] = lambda: False) -> Iterator[str]:
        """Advance until every engine is done or ``stop()`` is truthy (checked between steps, so a stop
        takes effect within one step); a string from ``stop()`` is the stop reason the unfinished engines
        record (else "stopped"). Yields the name of the engine that just advanced."""
        while not self.done:
            why = stop()
            if why:
                self.stop(why if isinstance(why, str) else "stopped")
                return
            name = self.next_engine()
            self.advance(name)
            yield name

    def stop(self, reason: str = "stopped") -> None:
        for name, run in self.record.runs.items():
            if not run.done:
                self._gens[name].close()
                run.done, run.stop_reason = True, reason
        self._release_if_done()

    close = stop

    def _release_if_done(self) -> None:
        if self.lease is not None and self.done:
            self.lease.release()


# ---------------------------------------------------------------------------------------------- narration
@dataclass
class Decision:
    """What happened at one node of the accepted path.

    node          the tree node where the target chose the next token
    target_choice the target's most likely token there
    tried         children compared / tried, in draft-rank order: (node, token, p_target, p_accept);
                  p_accept is the chance sampling gave it after earlier siblings were rejected (greedy: None)
    accepted      the child that was accepted (None: the path stopped here)
    """
    node: int
    target_choice: int
    tried: list[tuple[int, int, float, float | None]]
    accepted: int | None


@dataclass
class Narration:
    engine: str
    step: int
    mode: str
    decisions: list[Decision]
    accepted_path: list[int]       # tree nodes, root first (as the decisions imply)
    bonus_token: int
    text: str                      # Markdown for the page


def _q(decode: Decode, tok: int) -> str:
    s = decode([int(tok)])
    s = s.replace("\n", "\u21b5").replace("`", "'")
    return f"`{s}`" if s.strip() else f"`{s!r}`"


def narrate_step(trace: StepTrace, decode: Any, engine: str = "dart") -> Narration:
    """Explain one speculative round in plain words, from its trace: what was drafted, what the target
    checked, why the accepted path stopped, and where the bonus token came from.

    The decisions are derived from the tree and the accepted path with the engine's own rules
    (dart_core.engine.sampling): greedy follows the child equal to the target's argmax; sampling tries
    children in draft-rank order and accepts child x with p(x) renormalised over what earlier
    rejections left. ``decode``: a tokenizer or a callable ids -> text.
    """
    raw = decode.decode if hasattr(decode, "decode") else _decoder_fn(decode)
    dec: Decode = lambda ids: raw(list(ids))  # noqa: E731
    st = trace
    tree = st.tree
    children = tree.children()
    path = [int(n) for n in st.accepted_nodes]
    greedy = st.mode == "greedy"
    decisions: list[Decision] = []
    for i, node in enumerate(path):
        nxt = path[i + 1] if i + 1 < len(path) else None
        kids = children[node]
        tried_nodes = kids[: kids.index(nxt) + 1] if nxt is not None and nxt in kids else list(kids)
        tried: list[tuple[int, int, float, float | None]] = []
        rejected_mass = 0.0
        for c in tried_nodes:
            p = float(st.node_target_prob[c]) if c < len(st.node_target_prob) else float("nan")
            if greedy:
                tried.append((c, int(tree.tokens[c]), p, None))
            else:
                left = 1.0 - rejected_mass
                tried.append((c, int(tree.tokens[c]), p, (p / left) if left > 0 else 0.0))
                if c != nxt:
                    rejected_mass += p
        decisions.append(Decision(node=node, target_choice=int(st.node_target_argmax[node]), tried=tried,
                                  accepted=nxt))

    label = label_of(engine)
    n_drafted = tree.num_drafted
    lines: list[str] = []
    start, n_emit = st.position, len(st.emitted_tokens)
    lines.append(f"**{label}, step {st.step}** (answer tokens {start}\u2013{start + n_emit - 1}, "
                 f"{'greedy' if greedy else 'sampling'})")
    if n_drafted == 0:
        why = (f"{label} decoding proposes no draft" if engine == "vanilla" else
               "the tree was cut to its root (only one more answer token was allowed, so drafts could not be used)"
               if st.stop_reason is not None else "the drafter proposed no draft this step")
        lines.append(f"- **Drafted:** nothing: {why}, so the target's one forward pass gives exactly one token, "
                     f"{_q(dec, st.bonus_token)}.")
        lines.append("- **Result:** 0 drafted tokens accepted + 1 from the target = 1 token for one target "
                     "forward pass.")
        return Narration(engine, st.step, st.mode, decisions, path, int(st.bonus_token), "\n".join(lines))
    cands = st.candidates
    if engine == "dart":
        how = "the DART head ran **once** and scored"
        if cands is not None:
            n_pruned = int(len(cands) - sum(bool(k) for k in cands.kept))
            how += (f" {len(cands)} candidate continuations (logit term + N-gram term); the pruner kept the best "
                    f"{n_drafted} and dropped {n_pruned}")
    elif engine == "eagle3":
        how = "the EAGLE-3 head ran **once per tree level** (depth by depth) and kept the best-ranked"
        if cands is not None:
            how += f" {n_drafted} of {len(cands)} candidates by cumulative log-probability"
    else:
        how = f"the drafter proposed {n_drafted} tokens"
    best = [int(n) for n in tree.children()[0][:1]]
    lines.append(f"- **Drafted:** {how}, a tree of {n_drafted} tokens up to {tree.max_depth} deep after the "
                 f"root {_q(dec, tree.tokens[0])} (the last committed token)."
                 + (f" Its top first guess was {_q(dec, tree.tokens[best[0]])}." if best else ""))
    lines.append(f"- **Checked:** the target ran **one forward pass** over all {len(tree)} nodes at once and "
                 "computed, after every node, which token it would choose itself.")
    rule = ("greedy: a drafted token is accepted when it is exactly the target's top choice"
            if greedy else
            "sampling: each drafted child x is tried in draft order and accepted with probability p(x) (the "
            "target's probability after temperature / top-k / top-p, renormalised over what earlier "
            "rejections left); since drafts are fixed tokens this keeps the output distribution exactly the "
            "target's")
    lines.append(f"- **Rule** ({rule}):")
    for d in decisions:
        at = _q(dec, tree.tokens[d.node])
        if greedy:
            want = _q(dec, d.target_choice)
            offered = ", ".join(_q(dec, t) for _, t, _, _ in d.tried)
            if d.accepted is not None:
                lines.append(f"  - after {at} the target's top choice is {want}; the draft offered {offered} "
                             f"\u2192 {_q(dec, tree.tokens[d.accepted])} matches: **accepted**.")
            elif not d.tried:
                lines.append(f"  - after {at} nothing was drafted (a leaf of the tree), so the path stops here.")
            else:
                lines.append(f"  - after {at} the target's top choice is {want}, but the draft offered only "
                             f"{offered} \u2192 no match: **the path stops here**.")
        else:
            parts = []
            for c, t, p, pa in d.tried:
                verdict = "accepted" if c == d.accepted else "rejected"
                parts.append(f"{_q(dec, t)} (p = {p:.3f}, chance {pa:.3f}: {verdict})")
            if d.accepted is not None:
                lines.append(f"  - after {at}: tried " + ", then ".join(parts) + ".")
            elif not d.tried:
                lines.append(f"  - after {at} nothing was drafted (a leaf of the tree), so the path stops here.")
            else:
                lines.append(f"  - after {at}: tried " + ", then ".join(parts) +
                             " \u2192 every child rejected: **the path stops here**.")
    last = decisions[-1]
    if greedy:
        bonus_how = "its own top choice there"
    elif last.tried:
        bonus_how = "drawn from its distribution there with the rejected tokens removed and renormalised"
    else:
        bonus_how = "drawn from its full distribution there"
    lines.append(f"- **Bonus:** the target adds its own token {_q(dec, st.bonus_token)} ({bonus_how}).")
    acc = len(path) - 1
    result = (f"- **Result:** {acc} drafted token{'s' if acc != 1 else ''} accepted + 1 from the target = "
              f"{acc + 1} token{'s' if acc else ''} for one target forward pass")
    if n_emit < acc + 1:
        result += (f"; generation stopped ({st.stop_reason or 'end of answer'}), so only {n_emit} of them "
                   "were kept")
    lines.append(result + ".")
    return Narration(engine, st.step, st.mode, decisions, path, int(st.bonus_token), "\n".join(lines))


# ---------------------------------------------------------------------------------------------- step-once
class StepSession:
    """Step-once teaching mode: a comparison with its own engines (own KV caches, so other tabs' runs
    cannot disturb it), advanced one round per call. ``close()`` gives the engines back."""

    def __init__(self, factory: EngineFactory, settings: RunSettings, prompt_ids: Sequence[int],
                 config: GenerationConfig, *, prompt: str = "", meta: Mapping[str, Any] | None = None):
        # A cache just big enough for this request: per-tab sessions should stay small.
        need = len(prompt_ids) + config.max_new_tokens + 1
        if need < config.max_length:
            config = GenerationConfig(**{**asdict(config), "max_length": need})
        self.key = (tuple(prompt_ids), repr(settings.to_dict()))
        self.lease = factory.checkout(settings, fresh=True)
        self.comparison = Comparison(self.lease.engines, prompt_ids, config, decode=factory.target.tokenizer,
                                     prompt=prompt, meta=meta, lease=self.lease)
        self.rounds = 0
        self.last: dict[str, StepTrace | None] = {}

    @property
    def done(self) -> bool:
        return self.comparison.done

    def step(self) -> dict[str, StepTrace | None]:
        """One speculative round of every unfinished engine; returns each engine's new trace."""
        self.last = self.comparison.round()
        self.rounds += 1
        return self.last

    def nbytes(self) -> int:
        """Estimated memory this session holds: its record's traces and, until it finishes, its engines' caches."""
        return self.comparison.record.nbytes() + self.lease.cache_nbytes()

    def close(self) -> None:
        self.comparison.stop("closed")
        self.comparison.engines.clear()


def save_export(record: RunRecord, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(record.to_json(), encoding="utf-8")
    return path
