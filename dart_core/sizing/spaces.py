"""The tree settings each drafter can be given, what each costs in work and how deep and wide it drafts.

A :class:`TreeChoice` is one setting: the drafter knobs it sets, the nodes it verifies (root included), the
shape limits the acceptance model needs (depth, children per node, nodes expanded per depth) and the
drafter's *work* (head forwards, rows through the head, candidates scored) that the cost model prices.
``plain`` (no draft, one target forward) is always a choice.

    space = tree_space(drafter, fixed={"top_k": 4})   # every setting, with the knobs in ``fixed`` held
    apply_choice(drafter, space[3])                   # set the drafter's knobs (drafter.set_tree)

A drafter is read and set through its tree settings (``engine.protocol.TreeDrafter``: ``tree_kind``,
``tree_settings()``, ``set_tree(**settings)``); the knobs are its tree config's field names.

DART's one size knob is its budget (how many levels it drafts follows: at most ``budget``); EAGLE-3's
are total_token / depth / top_k; prompt lookup's is its draft length. Knobs the user set stay fixed.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping

from ..engine.protocol import TreeDrafter

#: DART budgets (drafted nodes, root excluded) the chooser weighs.
DART_BUDGETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 60)
#: EAGLE-3 depths (tree forwards after the first) and top-k (frontier width) it weighs; total_token runs
#: over TOTALS within what a (depth, top_k) pair can draft.
EAGLE3_DEPTHS = (0, 1, 2, 3, 4, 5, 7)
EAGLE3_TOPKS = (1, 2, 3, 4, 6, 8)
TOTALS = (2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 60)
#: prompt lookup draft lengths
LOOKUP_LENGTHS = (1, 2, 3, 4, 6, 8, 10, 12, 16)


@dataclass(frozen=True)
class TreeChoice:
    """One tree setting of one drafter (``params`` empty and ``plain`` True: a plain target step)."""
    params: tuple[tuple[str, int], ...] = ()    # (knob, value) pairs: hashable, in the knobs' order
    nodes: int = 1                       # verified per step, root included
    max_depth: int = 0
    width: int = 1                       # children per node
    beam: int | None = None              # nodes expanded per depth (None: all)
    work: tuple[int, int, int] = (0, 0, 0)   # head forwards, rows, candidates scored
    plain: bool = False
    # settings that go with the knobs but are not chosen (prompt lookup's node cap: one chain, the tree the
    # acceptance model counts); set with them, not part of the label
    implied: tuple[tuple[str, int], ...] = ()

    @property
    def settings(self) -> dict[str, int]:
        return dict(self.params)

    @functools.cached_property
    def label(self) -> str:
        if self.plain:
            return "plain step"
        return ", ".join(f"{k} {v}" for k, v in self.params)


PLAIN = TreeChoice(plain=True)


def drafter_kind(drafter: Any) -> str:
    """``dart``, ``eagle3`` or ``prompt_lookup``: the drafter's ``tree_kind`` (names may differ, e.g.
    ``dart_no_ngram``)."""
    kind = drafter.tree_kind if isinstance(drafter, TreeDrafter) else None
    if kind not in _SPACES:
        raise TypeError(f"no tree space for drafter {type(drafter).__name__}: it is no TreeDrafter of the DART, "
                        "EAGLE-3 or prompt-lookup kind (tree_kind, tree_settings(), set_tree())")
    return kind


def _dart_space(drafter, fixed: Mapping[str, int], max_nodes: int) -> list[TreeChoice]:
    p = drafter.tree_settings()
    rows = int(drafter.head.config.draft_length) + 1
    k, beam = int(p["level_top_k"]), int(p["beam_width"])
    budgets = [int(fixed["budget"])] if "budget" in fixed else [b for b in DART_BUDGETS if b + 1 <= max_nodes]
    out = []
    for b in budgets:
        if b == 0:
            out.append(PLAIN)
            continue
        levels = min(rows, b)
        expanded = min(beam, b)   # the drafting step caps its beam at the budget (pruning.TreeBuilder)
        candidates, width = 0, 1
        for level in range(levels):
            width = k if level == 0 else min(width, expanded) * k
            candidates += width
        out.append(TreeChoice((("budget", b),), nodes=b + 1, max_depth=levels, width=k, beam=beam,
                              work=(1, levels, candidates)))
    return out


def _eagle3_space(drafter, fixed: Mapping[str, int], max_nodes: int) -> list[TreeChoice]:
    vocab = int(drafter.head.config.draft_vocab_size)
    depths = [int(fixed["depth"])] if "depth" in fixed else list(EAGLE3_DEPTHS)
    topks = [int(fixed["top_k"])] if "top_k" in fixed else list(EAGLE3_TOPKS)
    out = []
    for depth in depths:
        for top_k in topks:
            k = min(top_k, vocab)
            most = 1 + k + depth * k * k                       # root + every candidate
            totals = ([int(fixed["total_token"])] if "total_token" in fixed
                      else sorted({min(t, most) for t in TOTALS if t <= max_nodes}))
            for total in totals:
                if total <= 1:
                    out.append(PLAIN)
                    continue
                out.append(TreeChoice((("total_token", total), ("depth", depth), ("top_k", top_k)),
                                      nodes=min(total, most), max_depth=depth + 1, width=k, beam=k,
                                      work=(1 + depth, 1 + depth * k, k + depth * k * k)))
    return out


def _lookup_space(drafter, fixed: Mapping[str, int], max_nodes: int) -> list[TreeChoice]:
    lengths = ([int(fixed["num_pred_tokens"])] if "num_pred_tokens" in fixed
               else [n for n in LOOKUP_LENGTHS if n + 1 <= max_nodes])
    # one chain (the most recent match); further matches add branches the model does not count
    return [TreeChoice((("num_pred_tokens", n),), nodes=n + 1, max_depth=n, width=1, work=(0, 0, n),
                       implied=(("max_tree_nodes", n + 1),)) for n in lengths]


_SPACES = {"dart": _dart_space, "eagle3": _eagle3_space, "prompt_lookup": _lookup_space}


def tree_space(drafter: Any, fixed: Mapping[str, int] | None = None, max_nodes: int = 65) -> list[TreeChoice]:
    """Every setting the chooser weighs for ``drafter`` (plain step first, duplicates dropped), the knobs in
    ``fixed`` held at their values, no tree above ``max_nodes`` nodes."""
    build = _SPACES[drafter_kind(drafter)]
    out, seen = [PLAIN], {PLAIN}
    for c in build(drafter, dict(fixed or {}), max_nodes):
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def apply_choice(drafter: Any, choice: TreeChoice) -> None:
    """Set the drafter's knobs to ``choice`` (a plain step sets nothing: the caller skips the draft)."""
    if not choice.plain:
        drafter.set_tree(**choice.settings, **dict(choice.implied))


__all__ = ["PLAIN", "TreeChoice", "apply_choice", "drafter_kind", "tree_space"]
