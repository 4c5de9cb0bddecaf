"""One way to build a method's engine: the table of methods, the parts each needs, and the tree it runs.

    parts = Parts(dart_head=head, ngram=store, eagle3_head=e3)          # loaded once per target (dart_core.loading)
    tree = tree_request("dart", settings, mode="auto")                    # from knob-named values (page, flags, API)
    engine = build_engine(target, "dart_context", parts, tree, costs=costs)

Every caller that turns a method name into a drafter goes through here: the page's engine pool
(``page/engines.py``), the API (``api.py``), the benchmark (``bench/``), the benchmark scripts, the answers'
regeneration (``training/regenerate.py``) and the vLLM check. A new method (a new head, a new candidate source) is
one row of :data:`METHODS` and one maker function.

Tree requests: a drafter of kind "dart" runs a :class:`~dart_core.drafters.pruning.PruningConfig`, of kind
"eagle3" an :class:`~dart_core.drafters.eagle3.Eagle3TreeConfig`, prompt lookup its own draft length. Each method
has a base tree (the paper's pruning; the published EAGLE-3 tree; the ``*_context`` methods with the live context
at ``CONTEXT_WEIGHT``); a request's set knobs go over it, and with automatic trees (``auto``) the drafter runs under
an AutoTree (dart_core.sizing) that chooses the size knobs not held.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from .config import ConfigError
from .presets import EAGLE3_FIELDS, KNOBS, PRUNING_FIELDS, SIZE_FIELDS, TREE_MODES

# The tree fields each kind of drafter takes ({config field: knob name}, dart_core.presets.KNOBS).
TREE_FIELDS: dict[str, Mapping[str, str]] = {"dart": PRUNING_FIELDS, "eagle3": EAGLE3_FIELDS}
TREE_NAMES = {"dart": "DART", "eagle3": "EAGLE-3"}


@dataclass
class Parts:
    """What the drafters are made of, loaded once per target and shared by every engine built from them: the DART
    head and its N-gram table (None: no corpus term), the EAGLE-3 head."""
    dart_head: Any = None
    ngram: Any = None
    eagle3_head: Any = None


@dataclass(frozen=True)
class TreeRequest:
    """A drafter's tree: ``overrides`` ({config field: value}) over the method's base tree; with ``auto`` an AutoTree
    chooses the size knobs, except those in ``held`` ({config field: value}, kept as given)."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    auto: bool = False
    held: Mapping[str, int] = field(default_factory=dict)


def tree_request(kind: str | None, values: Any, mode: str = "fixed") -> TreeRequest:
    """The tree request a set of knob values makes for a drafter of ``kind`` ("dart", "eagle3"; None: prompt lookup,
    which has no tree knobs): ``values`` has the knobs as attributes (argparse's namespace, the page's RunSettings)
    or keys, None or missing for unset. A count is taken as an int (a slider sends floats), a weight as it is.
    ``mode``: "fixed" or "auto" (dart_core.presets.TREE_MODES)."""
    if mode not in TREE_MODES:
        raise ConfigError(f"tree mode {mode!r}: use one of {', '.join(TREE_MODES)}")
    get = values.get if isinstance(values, Mapping) else (lambda k, d=None: getattr(values, k, d))
    overrides: dict[str, Any] = {}
    for config_field, knob in TREE_FIELDS.get(kind, {}).items():
        v = get(knob, None)
        if v is not None:
            overrides[config_field] = int(v) if KNOBS[knob].limit.integer else v
    held: dict[str, int] = {}
    if mode == "auto" and kind:
        held = {config_field: int(get(knob)) for config_field, knob in SIZE_FIELDS[kind].items()
                if get(knob, None) is not None}
    return TreeRequest(overrides, auto=mode == "auto", held=held)


@dataclass(frozen=True)
class Method:
    """One row of the table: its name, its drafter's tree kind (None: vanilla or prompt lookup), the parts it needs
    (attribute names of :class:`Parts`), what the report and errors call it, and ``make(target, parts, tree,
    head_backend)``: the drafter for a base-tree-plus-overrides config (None for vanilla)."""
    name: str
    kind: str | None
    needs: tuple[str, ...]
    label: str
    make: Callable[[Any, Parts, Any, str], Any] | None     # None: built by build_drafter (the hybrid)
    base: Callable[[], Any] | None = None     # the method's base tree config (None: no tree knobs)


def _pruning(context: bool):
    from .drafters.pruning import CONTEXT_WEIGHT, PruningConfig
    return (lambda: PruningConfig(context_weight=CONTEXT_WEIGHT)) if context else PruningConfig


def _eagle3_tree(context: bool):
    from .drafters.eagle3 import Eagle3TreeConfig
    from .drafters.pruning import CONTEXT_WEIGHT
    return (lambda: Eagle3TreeConfig(context_weight=CONTEXT_WEIGHT)) if context else Eagle3TreeConfig


def _dart(name: str, *, corpus: bool = True, shape: str = "tree"):
    def make(target, parts: Parts, tree, head_backend: str):
        from .drafters.dart import DartDrafter
        return DartDrafter(parts.dart_head, parts.ngram if corpus else None, target.eos_token_ids, pruning=tree,
                           name=name, head_backend=head_backend, shape=shape)
    return make


def _eagle3(name: str):
    def make(target, parts: Parts, tree, head_backend: str):
        from .drafters.eagle3 import Eagle3Drafter
        return Eagle3Drafter(parts.eagle3_head, tree, name=name, head_backend=head_backend)
    return make


def _prompt_lookup(target, parts: Parts, tree, head_backend: str):
    from .drafters.prompt_lookup import PromptLookupDrafter
    return PromptLookupDrafter()


def _vanilla(target, parts: Parts, tree, head_backend: str):
    return None


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("vanilla", None, (), "vanilla", _vanilla),
    Method("prompt_lookup", None, (), "prompt lookup", _prompt_lookup),
    Method("dart", "dart", ("dart_head",), "DART", _dart("dart"), _pruning(False)),
    Method("dart_context", "dart", ("dart_head",), "DART + context", _dart("dart_context"),
           _pruning(True)),
    Method("dart_no_ngram", "dart", ("dart_head",), "DART without the N-gram term",
           _dart("dart_no_ngram", corpus=False), _pruning(False)),
    # the paper's DART drafting one chain of `budget` tokens, as vLLM verifies it (drafters/chain.py)
    Method("dart_chain", "dart", ("dart_head",), "DART, one chain", _dart("dart_chain", shape="chain"),
           _pruning(False)),
    Method("eagle3", "eagle3", ("eagle3_head",), "EAGLE-3", _eagle3("eagle3"), _eagle3_tree(False)),
    Method("eagle3_context", "eagle3", ("eagle3_head",), "EAGLE-3 + context", _eagle3("eagle3_context"),
           _eagle3_tree(True)),
    # hybrid: built from the two above (build_drafter); its tree request is the DART drafter's
    Method("hybrid", "dart", ("dart_head",), "hybrid (prompt lookup or DART)", None, _pruning(False)),
)}


def method(name: str) -> Method:
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def tree_config(name: str, tree: TreeRequest | None = None) -> Any:
    """The tree config a method's drafter runs: its base with the request's overrides (None for methods without tree
    knobs); a bad value is a ConfigError naming the field."""
    m = method(name)
    if m.base is None:
        return None
    try:
        return replace(m.base(), **dict(tree.overrides if tree else {}))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{TREE_NAMES[m.kind]} tree settings: {exc}") from None


def make_drafter(target, name: str, parts: Parts | None, tree: TreeRequest | None = None, *,
                 head_backend: str = "auto") -> Any:
    """The drafter of method ``name`` with the request's tree settings, as given (no automatic trees); None for
    vanilla. A part the method needs and ``parts`` lacks is a ConfigError naming it. head_backend: how a head runs
    (dart_core.models.heads.native_step.HEAD_BACKENDS; "auto": one native call a step on a CPU)."""
    m = method(name)
    parts = parts or Parts()
    missing = [p for p in m.needs if getattr(parts, p) is None]
    if missing:
        raise ConfigError(f"{m.label} needs {', '.join(missing)}, which was not loaded for this target")
    if m.make is None:
        raise ConfigError(f"{name} is two drafters under a switch: build it with build_drafter")
    return m.make(target, parts, tree_config(name, tree), head_backend)


def _sized(drafter, tree: TreeRequest | None, costs):
    if drafter is None or tree is None or not tree.auto:
        return drafter
    from .sizing.auto import make_auto
    return make_auto(drafter, costs, dict(tree.held))


def build_drafter(target, name: str, parts: Parts | None, tree: TreeRequest | None = None, costs=None) -> Any:
    """:func:`make_drafter`, under an AutoTree when ``tree.auto`` (``costs``: the target's CostModel on this
    machine, needed then). ``hybrid``: the paper's DART and prompt lookup, each sized alike, under the switch."""
    if tree is not None and tree.auto and costs is None:
        raise ConfigError("automatic trees need the target's cost model (dart_core.sizing.costs.CostModel)")
    parts = parts or Parts()
    if name == "hybrid":
        from .drafters.hybrid import SwitchDrafter
        dart = _sized(make_drafter(target, "dart", parts, tree), tree, costs)
        lookup = _sized(make_drafter(target, "prompt_lookup", parts),
                        TreeRequest(auto=bool(tree and tree.auto)), costs)
        inner = getattr(dart, "inner", dart)
        return SwitchDrafter(dart, lookup, vocab_size=int(inner.live.index.vocab_size))
    return _sized(make_drafter(target, name, parts, tree), tree, costs)


def build_engine(target, name: str, parts: Parts | None = None, tree: TreeRequest | None = None, costs=None):
    """A SpeculativeEngine running method ``name`` on ``target`` (``vanilla``: no drafter), named after it."""
    from .engine.decoding import SpeculativeEngine
    drafter = build_drafter(target, name, parts or Parts(), tree, costs)
    return SpeculativeEngine(target, drafter, name=name)
