"""StepTrace: what one speculative step did, recorded for the app, the benchmark and tests.

The trace is the only thing the UI and the benchmark read from the engine. It is a
plain dataclass that round-trips through JSON (``to_dict`` / ``from_dict``), so a run
recorded on a GPU can be replayed elsewhere. ``TRACE_VERSION`` is bumped whenever a
field changes meaning; readers refuse versions they do not know.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .tree import DraftTree

TRACE_VERSION = 1

# The four stages, named the same in traces, the benchmark and the app.
STAGES = ("draft_forward", "tree_build", "verify", "commit")


class OnRequest(Sequence):
    """A per-node list whose values are computed when first read, in one call of ``compute(nodes) -> values``
    for all the missing ones (a reader that reads one node usually reads the rest: the page's tree view).
    ``at(i)`` computes node i alone: the acceptance walk reads the nodes it visits that way (``per_node()``), so
    the engine's LM head runs for the other nodes only if someone reads them."""

    def __init__(self, n: int, compute: Callable[[list[int]], Sequence], holds_nbytes: int = 0):
        self._n = n
        self._compute = compute
        self._values: dict[int, Any] = {}
        self._holds = holds_nbytes   # what ``compute`` keeps alive (e.g. the nodes' hidden states)

    @property
    def nbytes(self) -> int:
        """Estimated bytes held: a boxed value per node and what the computation keeps alive."""
        return 56 + 36 * self._n + self._holds

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.tolist()[i]
        i = int(i)
        i = self._node(i + self._n if i < 0 else i)
        if i not in self._values:
            self.tolist()
        return self._values[i]

    def at(self, i: int):
        """Node i's value, computing that node alone when it is missing."""
        i = self._node(i)
        if i not in self._values:
            self._values[i] = self._compute([i])[0]
        return self._values[i]

    def _node(self, i) -> int:
        i = int(i)
        if not 0 <= i < self._n:
            raise IndexError(f"node {i} is not in a tree of {self._n} nodes")
        return i

    def per_node(self) -> "_PerNode":
        """A view whose ``[i]`` computes node i alone (for a walk that visits a few nodes)."""
        return _PerNode(self)

    def tolist(self) -> list:
        missing = [i for i in range(self._n) if i not in self._values]
        if missing:
            self._values.update(zip(missing, self._compute(missing)))
        return [self._values[i] for i in range(self._n)]

    def __iter__(self):
        return iter(self.tolist())

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.tolist(), dtype=dtype)

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, tuple, Sequence)) and self.tolist() == list(other)

    def __repr__(self) -> str:
        return f"OnRequest({self._n} nodes, {len(self._values)} computed)"


class _PerNode:
    def __init__(self, values: OnRequest):
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i: int):
        return self._values.at(i)


# Where a candidate came from (bits of ScoredCandidates.source): the draft head ranked it, the request's live
# context continued its path with it, the corpus N-gram table has seen it there.
SOURCE_HEAD, SOURCE_CONTEXT, SOURCE_CORPUS = 1, 2, 4
SOURCE_NAMES = {SOURCE_HEAD: "head", SOURCE_CONTEXT: "context", SOURCE_CORPUS: "corpus"}


def source_label(bits: int) -> str:
    """"head", "context", "corpus" or "several" (a candidate more than one source proposed or supported)."""
    names = [name for bit, name in SOURCE_NAMES.items() if int(bits) & bit]
    return names[0] if len(names) == 1 else ("several" if names else "head")


@dataclass
class ScoredCandidates:
    """Every candidate a drafter scored in one step, kept or pruned (struct of arrays).

    ``parent`` indexes into this same candidate list (-1 = the tree root), so a pruned
    candidate's ancestry stays visible. ``logit_term`` and ``ngram_term`` are the
    weighted contributions to ``score`` (DART); drafters without an N-gram term leave
    it at 0. ``node`` is the candidate's index in the DraftTree, or -1 when pruned.
    ``source`` holds each candidate's SOURCE_* bits where the drafter records them (DART); empty means every
    candidate came from the head. Fields may hold lists or 1-D numpy arrays (the native pruner hands over
    arrays, which costs nothing per step); ``to_dict`` turns either into plain lists.
    """
    token: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    logit_term: list[float] = field(default_factory=list)
    ngram_term: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)
    node: list[int] = field(default_factory=list)
    source: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token)

    def to_dict(self) -> dict[str, list]:
        d = {name: np.asarray(getattr(self, name)).tolist() for name in self.__dataclass_fields__}
        if not d["source"]:
            del d["source"]        # all from the head: files stay as they were before sources were recorded
        return d

    def source_of_node(self, node: int) -> int:
        """The SOURCE_* bits of the candidate that became tree node ``node`` (the head's when none recorded)."""
        if len(self.source) == 0:
            return SOURCE_HEAD
        hit = np.flatnonzero(np.asarray(self.node) == int(node))
        return int(np.asarray(self.source)[hit[0]]) if hit.size else SOURCE_HEAD

    def with_nodes_remapped(self, new_index: np.ndarray) -> "ScoredCandidates":
        """A copy for a tree cut by ``DraftTree.truncated_with_index``: nodes renumbered, cut ones
        marked pruned (node -1, kept False), so ``node`` keeps pointing into the verified tree."""
        node = np.asarray(self.node, dtype=np.int64)
        new_node = np.where(node >= 0, new_index[np.maximum(node, 0)], -1)
        return ScoredCandidates(token=self.token, parent=self.parent, depth=self.depth, logit_term=self.logit_term,
                                ngram_term=self.ngram_term, score=self.score, kept=new_node >= 0, node=new_node,
                                source=self.source)

    def append(self, *, token: int, parent: int, depth: int, logit_term: float, ngram_term: float,
               score: float, kept: bool, node: int, source: int | None = None) -> None:
        self.token.append(int(token)); self.parent.append(int(parent)); self.depth.append(int(depth))
        self.logit_term.append(float(logit_term)); self.ngram_term.append(float(ngram_term))
        self.score.append(float(score)); self.kept.append(bool(kept)); self.node.append(int(node))
        if source is not None:
            self.source.append(int(source))


class CandidatesOnRequest(ScoredCandidates):
    """Scored candidates computed when first read: ``compute() -> ScoredCandidates`` runs on the first access
    to any field (a reader of one field reads the others). A drafter whose tree needs fewer candidates than the
    page shows (DART's beam capped at the budget on the hot path) hands this over, so the full list costs only
    when someone reads it."""

    def __init__(self, compute: Callable[[], ScoredCandidates]):   # the fields are filled on first read
        self._compute = compute

    def __getattr__(self, name: str):
        if name not in ScoredCandidates.__dataclass_fields__ or "_compute" not in self.__dict__:
            raise AttributeError(name)
        full = self.__dict__.pop("_compute")()
        for f in ScoredCandidates.__dataclass_fields__:
            setattr(self, f, getattr(full, f))
        return getattr(self, name)


@dataclass
class StepTrace:
    """One draft -> verify -> accept -> commit round.

    position          number of answer tokens emitted before this step
    tree              the verified draft tree (node 0 = root, already emitted)
    candidates        every candidate the drafter scored (None for drafters that score none)
    accepted_nodes    tree node indices on the accepted path, root first
    emitted_tokens    tokens this step added to the answer: accepted drafts, then the bonus token
    bonus_token       the target's own token after the accepted path (sampled or argmax)
    stop_reason       None while decoding continues; "eos", "max_new_tokens" or "max_length" on the last step
    node_target_prob  per node: the target's (warped) probability of the node's token at its parent (root: 1)
    node_target_argmax per node: the target's most likely next token after the node
                      (both may be :class:`OnRequest` lists from the engine: computed when first read)
    timings           seconds per stage (keys = STAGES)
    head_rows         DART's parallel logits: {"token": [levels][k] target ids, "logit": [levels][k] raw logits},
                      each level's top-k from the step's one head forward, before pruning (None: no head forward,
                      or a drafter without levels)
    """
    step: int
    position: int
    tree: DraftTree
    accepted_nodes: list[int]
    emitted_tokens: list[int]
    bonus_token: int
    node_target_prob: list[float]
    node_target_argmax: list[int]
    timings: dict[str, float]
    candidates: ScoredCandidates | None = None
    mode: str = "greedy"
    stop_reason: str | None = None
    version: int = TRACE_VERSION
    head_rows: dict | None = None

    @property
    def accepted_drafts(self) -> int:
        """Drafted tokens accepted this step (root and bonus excluded)."""
        return len(self.accepted_nodes) - 1

    @property
    def acceptance_length(self) -> int:
        """Tokens this verify step added (accepted drafts + bonus): the per-step tau."""
        return len(self.emitted_tokens)

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d["tree"] = self.tree.to_dict()
        d["candidates"] = None if self.candidates is None else self.candidates.to_dict()
        d["timings"] = dict(self.timings)
        d["node_target_prob"] = [float(p) for p in self.node_target_prob]
        d["node_target_argmax"] = [int(t) for t in self.node_target_argmax]
        if self.head_rows is None:
            del d["head_rows"]          # files without parallel logits stay as they were
        else:
            d["head_rows"] = {"token": np.asarray(self.head_rows["token"]).astype(int).tolist(),
                              "logit": np.asarray(self.head_rows["logit"]).astype(float).tolist()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StepTrace":
        version = d.get("version")
        if version != TRACE_VERSION:
            raise ValueError(f"trace version {version!r} is not supported (this build reads version "
                             f"{TRACE_VERSION}); re-export the trace with this version of dart_core")
        d = dict(d)
        d["tree"] = DraftTree.from_dict(d["tree"])
        if d.get("candidates") is not None:
            d["candidates"] = ScoredCandidates(**d["candidates"])
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: str) -> "StepTrace":
        return cls.from_dict(json.loads(s))
