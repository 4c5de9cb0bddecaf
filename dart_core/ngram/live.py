"""The live context: n-gram counts of one request's own tokens (its prompt and what has been committed since).

DART's corpus table knows the training corpus, not the passage, the names or the sentence to translate in front
of the model; a request's own text does. :class:`LiveContext` keeps a native ``ContextIndex`` of the committed
tokens, extended as they are committed (never rebuilt, and never fed anything from a step being verified), and
answers the table's two questions about it with the table's back-off (docs/ARCHITECTURE.md section 5a):

    live = LiveContext(vocab_size=len(tokenizer))
    live.begin(prompt_ids)                    # a new request
    live.sync(context)                        # each step: index the tokens committed since
    probs, matched = live.index.query(ctx, candidates)       # P(x | longest suffix seen), its length
    m, n, tokens, counts = live.index.continuations(ctx, 4)  # what followed that suffix, most frequent first

:class:`ReferenceContextIndex` is the pure-Python mirror the tests hold the native index to.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

#: Longest suffix the index counts (tokens before a continuation): a 6-token match is already near-certain
#: to continue as before, and each extra order costs one hash update per committed token.
CONTEXT_ORDER = 6


#: A suffix the context must have seen before it has a say: a single repeated token is no evidence of copying.
MIN_MATCH = 2


def mix_weight(matched: int, weight: float) -> float:
    """The context's share lam of a candidate's probabilities after a suffix of ``matched`` tokens seen before:
    ``weight * (1 - 2^(1 - matched))`` from MIN_MATCH tokens on, else 0 (what ``native/src/pruner.cpp`` computes
    for DART; EAGLE-3 + context reads it here)."""
    return float(weight) * (1.0 - 2.0 ** (1 - int(matched))) if int(matched) >= MIN_MATCH else 0.0


#: A committed suffix of this many tokens seen before in the request means the answer is copying: DART + context
#: drafts from the context alone and skips the head forward (docs/ARCHITECTURE.md section 5a), and the tree sizer
#: keeps a separate choice for such steps (the "copy" regime) for both heads. Chosen by the offline replay (python -m
#: dart_core.bench.regret's records, one cost model): at 3 DART + context's chooser's steps cost 1.1% less than at
#: 4, 1.5% less than at 6 and 4.5% less than never skipping, over 5 prompts of each of six kinds.
COPY_MATCH = 3


class LiveContext:
    """One request's live context index (native), kept in step with the committed tokens."""

    def __init__(self, vocab_size: int, max_order: int = CONTEXT_ORDER):
        from .store import require_native

        self.index = require_native().ContextIndex(int(max_order), int(vocab_size))

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """A new request: forget the last one's tokens and index the prompt."""
        self.index.reset()
        self.index.extend(np.asarray(prompt_ids, dtype=np.int64).reshape(-1))

    def sync(self, context: Sequence[int]) -> None:
        """Index the tokens committed since the last call (``context`` = prompt + committed answer; it only grows
        within a request)."""
        n = len(self.index)
        if len(context) < n:
            raise RuntimeError(f"the live context holds {n} tokens but the request's context has {len(context)}: "
                               "call begin() at the start of each request")
        if len(context) > n:
            self.index.extend(np.asarray(context[n:], dtype=np.int64))

    def match(self, context: Sequence[int]) -> int:
        """Tokens of the longest suffix of ``context`` (at most the index's order) that occurred before."""
        n = min(len(context), int(self.index.max_order))
        return int(self.index.continuations(np.asarray(context[len(context) - n:], dtype=np.int64), 0)[0])

    def copying(self, context: Sequence[int]) -> bool:
        """Whether the committed text's last COPY_MATCH tokens occurred before in the request (the answer is
        copying; ``context`` = prompt + committed answer, indexed first)."""
        self.sync(context)
        return self.match(context) >= COPY_MATCH

    def __len__(self) -> int:
        return len(self.index)


class ReferenceContextIndex:
    """Pure-Python ContextIndex: the same counts, back-off and continuation order as ``native/src/context_index.cpp``
    (exact n-gram keys instead of hashes)."""

    def __init__(self, max_order: int, vocab_size: int):
        if not 1 <= int(max_order) <= 64:
            raise ValueError("ContextIndex: max_order must be in [1, 64]")
        self.max_order, self.vocab_size = int(max_order), int(vocab_size)
        self.reset()

    def reset(self) -> None:
        self._seq: list[int] = []
        # suffix tuple -> [total, {token: [count, last position]}]
        self._counts: dict[tuple[int, ...], list] = {}

    def __len__(self) -> int:
        return len(self._seq)

    def tokens(self) -> np.ndarray:
        return np.asarray(self._seq, dtype=np.int64)

    def extend(self, tokens: Sequence[int]) -> None:
        toks = [int(t) for t in tokens]
        for i, t in enumerate(toks):
            if not 0 <= t < self.vocab_size:
                raise ValueError(f"ContextIndex.extend: token id {t} at index {i} is outside the vocabulary "
                                 f"[0, {self.vocab_size})")
        for x in toks:
            pos = len(self._seq)
            for n in range(1, min(self.max_order, pos) + 1):
                entry = self._counts.setdefault(tuple(self._seq[pos - n:]), [0, {}])
                entry[0] += 1
                child = entry[1].setdefault(x, [0, pos])
                child[0] += 1
                child[1] = pos
            self._seq.append(x)

    def query(self, context: Sequence[int], candidates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        ctx, cands = [int(t) for t in context], [int(t) for t in candidates]
        probs, matched = np.zeros(len(cands)), np.zeros(len(cands), dtype=np.int32)
        for n in range(min(self.max_order, len(ctx)), 0, -1):
            entry = self._counts.get(tuple(ctx[len(ctx) - n:]))
            if entry is None:
                continue
            for j, x in enumerate(cands):
                if matched[j] == 0 and x in entry[1]:
                    probs[j] = entry[1][x][0] / entry[0]
                    matched[j] = n
        return probs, matched

    def continuations(self, context: Sequence[int], max_children: int):
        ctx = [int(t) for t in context]
        for n in range(min(self.max_order, len(ctx)), 0, -1):
            entry = self._counts.get(tuple(ctx[len(ctx) - n:]))
            if entry is None:
                continue
            kids = sorted(entry[1].items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:max_children]
            return (n, entry[0], np.asarray([t for t, _ in kids], dtype=np.int64),
                    np.asarray([c[0] for _, c in kids], dtype=np.int64))
        return 0, 0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
