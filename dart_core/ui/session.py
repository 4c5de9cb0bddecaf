"""Side-by-side runs of several engines on one target, for the visualiser (no Gradio here).

    engines = {"dart": SpeculativeEngine(target, drafter, name="dart"),
               "vanilla": SpeculativeEngine(target, name="vanilla")}
    cmp = Comparison(engines, prompt_ids, config, decode=target.tokenizer)
    for name in cmp.run(stop=event.is_set):      # one engine step per item, fair clock
        print(cmp.record.metrics()[name])
    export = cmp.record.to_export()              # dart_core.ui.record: RunRecord.from_export(...) replays it
    print(narrate_step(cmp.record.runs["dart"].traces[0], target.tokenizer).text)  # dart_core.ui.narration

One generator advances the engines in turn, so their timings never overlap: each engine's
clock (``busy_s``) counts only the time spent inside its own ``next()`` (prefill included,
UI time excluded), and the next engine to advance is always the one with the least engine
time so far. The streamed answers therefore show what a race on one shared clock would look
like, and tokens/s, tau and the speedup over the vanilla baseline come from this very run.

Live runs and replays of exported files produce the same :class:`~dart_core.ui.record.RunRecord`, so
the app renders both through one code path. The page's step-once mode (dart_core.page.tabs.StepSession)
advances a comparison one round per click.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

from ..config import ConfigError, GenerationConfig
from ..engine.decoding import EngineBusyError, GenerationResult, SpeculativeEngine
from ..engine.trace import StepTrace
from ..hardware import OtherLoad
from ..methods import TREE_NAMES, tree_request
from ..presets import KNOBS, TREE_MODES, Limit
from ..sizing.auto import AutoTree
from .record import BASELINE, STOPPED, EngineRun, RunRecord

logger = logging.getLogger(__name__)

#: How the page's messages name each drafter's tree.

#: answer tokens per request; the server's own cap (--max-new-tokens) is checked in generation_config
MAX_NEW_TOKENS = Limit("Max new tokens", 1, None, True)


# ---------------------------------------------------------------------------------------------- settings
@dataclass
class RunSettings:
    """Every knob the page exposes: the fields are the knobs' names in dart_core.presets.KNOBS (plus
    max_new_tokens and seed); error messages use the knobs' labels.

    ``tree``: "auto" (the default) lets the measured cost and acceptance models choose every tree-size knob
    left None (dart_core.sizing; a size knob that is set stays fixed); "fixed" runs the tree settings as
    given, None for a tree knob meaning the engine's base tree config (the paper's / published one).
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
    context_weight: float | None = None
    eagle3_total_token: int | None = None
    eagle3_depth: int | None = None
    eagle3_top_k: int | None = None
    eagle3_context_weight: float | None = None
    tree: str = "auto"

    # (field, limit): the fields are the knobs of dart_core.presets (one name from slider to flag), whose ranges
    # the sliders, the tree configs and the CLI flags share
    _RULES = (("max_new_tokens", MAX_NEW_TOKENS),) + tuple((name, knob.limit) for name, knob in KNOBS.items())

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
        if values.get("tree") is not None:
            s.tree = values["tree"]
        s.validate()
        return s

    def validate(self) -> None:
        if self.tree not in TREE_MODES:
            raise ConfigError(f"tree must be one of {', '.join(TREE_MODES)}, got {self.tree!r}: 'auto' sizes each "
                              "tree from this machine's measured costs, 'fixed' uses the tree settings as given")
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

    def tree_overrides(self, kind: str) -> dict[str, Any]:
        """The tree fields this request sets for a drafter of ``kind`` ("dart" / "eagle3"): {config field: value},
        the knobs left unset (None) out (dart_core.methods.tree_request, as the flags and the API make them). A
        drafter takes them through ``set_tree`` (the drafter protocol)."""
        return dict(tree_request(kind, self).overrides)

    def tree_for(self, kind: str, base: Any) -> Any:
        """``base`` (a PruningConfig or an Eagle3TreeConfig) with this request's tree fields; a bad value is a
        ConfigError naming the field."""
        try:
            return replace(base, **self.tree_overrides(kind))
        except ValueError as exc:
            raise ConfigError(f"{TREE_NAMES[kind]} tree settings: {exc}") from None

    def fixed_sizes(self, engine: str) -> dict[str, int] | None:
        """With automatic trees, the size knobs of ``engine`` that are set (held fixed; the rest are chosen):
        {config field: value}. None with fixed trees."""
        if self.tree != "auto":
            return None
        return dict(tree_request(engine, self, "auto").held)

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


# ---------------------------------------------------------------------------------------------- comparison
def auto_tree_label(engine: Any) -> str | None:
    """The tree setting an engine's automatic-tree drafter (dart_core.sizing.AutoTree) used for the step it just
    made, e.g. "budget 3" or "plain step" (read between steps: the engine reports each step to the drafter
    before it yields the trace); None for a drafter with a fixed tree."""
    drafter = getattr(engine, "drafter", None)
    if not isinstance(drafter, AutoTree):
        return None
    used = drafter.last_used                                  # a probe step differs from the current choice
    if drafter.choice.plain and not used.plain:
        return f"{used.label} (a probe: plain steps pay more here, a tree now and then keeps it learning)"
    return used.label


def engine_variant(engine: Any) -> str | None:
    """Which method a DART or EAGLE-3 engine runs: "+ context" when its tree takes the request's own text
    (context_weight > 0); else "paper" for DART (the paper's pruner: the corpus table only) and None for EAGLE-3
    (the published tree) and for engines without such a drafter (vanilla, prompt lookup)."""
    drafter = getattr(engine, "drafter", None)
    drafter = getattr(drafter, "inner", drafter)              # an AutoTree's drafter
    settings = getattr(drafter, "tree_settings", None)
    if settings is None or getattr(drafter, "tree_kind", None) not in ("dart", "eagle3"):
        return None
    if float(settings().get("context_weight", 0.0)) > 0:
        return "+ context"
    return "paper" if drafter.tree_kind == "dart" else None


class Comparison:
    """Several engines on one prompt, advanced one step at a time by one generator (fair clock).

    ``lease``: where the engines came from (anything with ``release()``, e.g. the page's engine pool's lease);
    it is released as soon as every engine is done (finished, failed, stopped or closed), so the engines serve
    the next run only once this one let go."""

    def __init__(self, engines: Mapping[str, SpeculativeEngine], prompt_ids: Sequence[int],
                 config: GenerationConfig, *, decode: Any, prompt: str = "", baseline: str = BASELINE,
                 meta: Mapping[str, Any] | None = None, lease: Any = None):
        self.config = config
        self.engines = dict(engines)
        self.lease = lease
        for engine in self.engines.values():   # caches allocated before the clocks start (see reserve)
            try:
                engine.reserve(config)
            except EngineBusyError:             # its first step says so, in its own column
                pass
        self.other_load = OtherLoad()   # what other programs took from the CPUs while the engines' clocks ran
        self._gens: dict[str, Generator[StepTrace, None, GenerationResult]] = {
            name: engine.stream(list(prompt_ids), config) for name, engine in self.engines.items()}
        self.record = RunRecord(runs={n: EngineRun(n, variant=engine_variant(e)) for n, e in self.engines.items()},
                                decode=decode, prompt=prompt,
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
        self.other_load.start()
        t0 = time.perf_counter()
        try:
            trace = next(self._gens[name])
        except StopIteration as finished:
            self._clock(run, t0)
            result: GenerationResult = finished.value
            run.tokens = list(result.tokens)  # the engine's own answer is the truth (covers prefill-only runs)
            run.done, run.stop_reason = True, result.stats.stop_reason
            self._release_if_done()
            return None
        except ConfigError as exc:
            self._clock(run, t0)
            run.done, run.stop_reason, run.error = True, "error", str(exc)
            self._release_if_done()
            return None
        except Exception as exc:  # noqa: BLE001 - one engine's failure must not take the page down
            self._clock(run, t0)
            logger.exception("engine %s failed", name)
            run.done, run.stop_reason, run.error = True, "error", f"{type(exc).__name__}: {exc}"
            self._release_if_done()
            return None
        self._clock(run, t0)
        run.add_step(trace, auto_tree_label(self.engines[name]))
        if trace.stop_reason is not None:  # finish now: the generator's epilogue is bookkeeping only
            self.advance(name)
        return trace

    def _clock(self, run: EngineRun, t0: float) -> None:
        run.busy_s += time.perf_counter() - t0
        self.other_load.stop()

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
                self.stop(why if isinstance(why, str) else STOPPED)
                return
            name = self.next_engine()
            self.advance(name)
            yield name

    def stop(self, reason: str = STOPPED) -> None:
        for name, run in self.record.runs.items():
            if not run.done:
                self._gens[name].close()
                run.done, run.stop_reason = True, reason
        self._release_if_done()

    close = stop

    def _release_if_done(self) -> None:
        if self.lease is not None and self.done:
            self.lease.release()
