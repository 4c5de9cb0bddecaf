"""Method variants: one method under a fixed tree beside the same method under automatic trees, in one run.

    python -m dart_core.bench ... --methods vanilla,dart_context,dart_context@budget=6,eagle3@fixed

``NAME@fixed`` runs method NAME with its tree as the run's flags give it (``--tree fixed`` for this method
alone); ``NAME@KNOB=V[+KNOB=V...]`` also sets those tree knobs (dart_core.presets.KNOBS, the names of the tree
flags without the dashes: ``budget``, ``eagle3_total_token``, ...). The benchmark runs every method on a question
before the next question, so a variant and its automatic twin meet the same prompts minutes apart on the same
machine state: the comparison the chooser's end-to-end regret needs (separate runs drift by more than 5%).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ..presets import KNOBS
from .questions import BenchInputError

SEPARATOR = "@"


@dataclass(frozen=True)
class Variant:
    """A --methods entry: its method, and for a variant the knob values its fixed tree takes."""
    name: str                     # as written in --methods (the report's key)
    method: str                   # the registered method it runs
    fixed: bool = False           # a variant: a fixed tree whatever --tree says
    knobs: dict[str, Any] = field(default_factory=dict)


def parse_variant(entry: str, methods: dict) -> Variant:
    """The Variant an entry of --methods names; ``methods``: the registry (name -> MethodSpec). Raises
    BenchInputError naming the entry and what to write instead."""
    if SEPARATOR not in entry:
        return Variant(entry, entry)
    base, spec = entry.split(SEPARATOR, 1)
    if base not in methods:
        raise BenchInputError(f"{entry!r} in --methods: unknown method {base!r}; valid methods: {', '.join(methods)}")
    if not methods[base].auto_tree:
        raise BenchInputError(f"{entry!r} in --methods: {base} has no tree to fix; variants (NAME@fixed, "
                              f"NAME@KNOB=V) are for {', '.join(n for n, m in methods.items() if m.auto_tree)}")
    if spec == "fixed":
        return Variant(entry, base, fixed=True)
    from ..methods import method
    kind = method(base).kind
    allowed = [k for k, knob in KNOBS.items() if kind is not None and knob.engine == kind]
    knobs: dict[str, Any] = {}
    for part in spec.split("+"):
        key, eq, text = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in allowed:
            hint = (f"its tree knobs: {', '.join(allowed)}" if allowed else f"{base} has no tree knobs: "
                    f"write {base}@fixed")
            raise BenchInputError(f"{entry!r} in --methods: {part!r} is not KNOB=VALUE of {base}'s tree ({hint}); "
                                  f"e.g. {base}@fixed" + (f" or {base}@{allowed[0]}=4" if allowed else ""))
        limit = KNOBS[key].limit
        try:
            value = limit.arg_type("--" + key.replace("_", "-"))(text.strip())
        except Exception as exc:   # argparse's type functions raise ArgumentTypeError / ValueError
            raise BenchInputError(f"{entry!r} in --methods: {exc}") from None
        knobs[key] = value
    return Variant(entry, base, fixed=True, knobs=knobs)


def variant_args(args: Any, variant: Variant) -> Any:
    """The flags ``variant`` runs under: ``args`` itself for a plain method, else a copy with a fixed tree and its
    knobs set (the shared cost model stays shared: the copy is shallow)."""
    if not variant.fixed:
        return args
    mine = copy.copy(args)
    mine.tree = "fixed"
    for key, value in variant.knobs.items():
        setattr(mine, key, value)
    return mine
