"""The simple hybrid baseline: prompt lookup while the context match is long, the head's drafter otherwise.

    hybrid = SwitchDrafter(head_drafter, lookup_drafter, min_match=3, vocab_size=V)

Each step it looks up the longest suffix of the committed tokens that occurred before in the request (the same
live context index DART's context candidates read, ``ngram.live``): at ``min_match`` tokens or more the lookup
drafter proposes (the head does not run: its features wait, as after a plain step, ``FeatureDrafter.skip``);
below, the head's drafter does. It exists to measure what DART's integrated tree (section 5a: the context's
continuations inside the head's tree, one score, one budget) adds over switching between two drafters.

Both drafters may be automatic-tree wrappers (``sizing.AutoTree``); each learns only from the steps it drafted.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..engine.protocol import AcceptedStep, Proposal
from ..ngram.live import LiveContext

#: Suffix length (tokens) from which the hybrid trusts the context: a single repeated token is no evidence.
SWITCH_MIN_MATCH = 3


def _skip(drafter: Any, context: Sequence[int]) -> None:
    """Let a feature drafter (or an AutoTree around one) sit a step out: its features wait for its next draft."""
    inner = getattr(drafter, "inner", drafter)
    skip = getattr(inner, "skip", None)
    if skip is not None:
        skip(context)


class SwitchDrafter:
    """Prompt lookup while the live context's match is at least ``min_match`` tokens, else the head's drafter."""

    def __init__(self, head_drafter: Any, lookup_drafter: Any, *, min_match: int = SWITCH_MIN_MATCH,
                 vocab_size: int, name: str = "hybrid"):
        if not isinstance(min_match, int) or isinstance(min_match, bool) or min_match < 1:
            raise ValueError(f"SwitchDrafter min_match must be a whole number >= 1, got {min_match!r}")
        self.head, self.lookup, self.min_match, self.name = head_drafter, lookup_drafter, min_match, name
        self.needs_aux = bool(head_drafter.needs_aux)
        self.max_tree_nodes = max(int(head_drafter.max_tree_nodes), int(lookup_drafter.max_tree_nodes))
        self.live = LiveContext(vocab_size, max_order=max(min_match, 1))
        self._last: Any = None
        self.lookup_steps = self.head_steps = 0

    def begin(self, prompt_ids: Sequence[int], prefill_aux) -> None:
        self.head.begin(prompt_ids, prefill_aux)
        self.lookup.begin(prompt_ids, None)
        self.live.begin(prompt_ids)

    def propose(self, context: Sequence[int]) -> Proposal:
        self.live.sync(context)
        if self.live.match(context) >= self.min_match:
            _skip(self.head, context)
            self._last = self.lookup
            self.lookup_steps += 1
        else:
            self._last = self.head
            self.head_steps += 1
        return self._last.propose(context)

    def observe(self, step: AcceptedStep) -> None:
        self.head.observe(step)
        self.lookup.observe(step)

    def step_done(self, trace) -> None:
        done = getattr(self._last, "step_done", None)
        if done is not None:
            done(trace)

    def cache_nbytes(self) -> int:
        nbytes = getattr(self.head, "cache_nbytes", None)
        return int(nbytes()) if nbytes is not None else 0
