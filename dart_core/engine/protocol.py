"""The Drafter protocol: the only seam between drafting and verification.

The decoding loop calls, per request::

    drafter.begin(prompt_ids, prefill_aux)       # once, after the target's prefill
    loop:
        proposal = drafter.propose(context)      # context[-1] is the tree root
        ... target verifies proposal.tree, accepts a path ...
        drafter.observe(AcceptedStep(...))        # what was accepted, with target features

The verifier never branches on the drafter's type; everything it needs is in the
Proposal (tree, scored candidates for the trace, and the drafter's own stage times).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import torch

from .trace import ScoredCandidates
from .tree import DraftTree


@dataclass
class Proposal:
    tree: DraftTree                              # root = context[-1]
    candidates: ScoredCandidates | None = None   # every candidate scored (kept or pruned), for the trace
    draft_forward_s: float = 0.0                 # all head forwards of this step
    tree_build_s: float = 0.0                    # top-k, pruning / reranking, tree assembly
    head_rows: dict | None = None                # DART: the head's top-k per level before pruning (StepTrace)


@dataclass
class AcceptedStep:
    tokens: list[int]                 # accepted tree nodes' tokens, root first (all now in the target's cache)
    bonus_token: int                  # the target's own next token: the next tree's root
    aux: torch.Tensor | None          # [len(tokens), 3H] target aux features of those nodes (if needs_aux)


@runtime_checkable
class Drafter(Protocol):
    name: str
    needs_aux: bool       # whether begin/observe need the target's aux features
    max_tree_nodes: int   # upper bound on len(proposal.tree), root included: sizes the KV cache

    def begin(self, prompt_ids: Sequence[int], prefill_aux: torch.Tensor | None) -> None:
        """Start a request. prefill_aux: [T, 3H] features of the prompt positions (if needs_aux)."""

    def propose(self, context: Sequence[int]) -> Proposal:
        """Draft a tree whose root is ``context[-1]`` (prompt + answer so far)."""

    def observe(self, step: AcceptedStep) -> None:
        """Learn what the target accepted (update drafter caches/state)."""

    # Optional: ``step_done(trace: StepTrace) -> None``, called with each step's whole trace (tree, accepted
    # path, stage times) after the commit; dart_core.sizing.AutoTree sizes its trees from these.
    # Optional: ``cache_nbytes() -> int``, the bytes of the drafter's own caches (a head's KV cache), which
    # SpeculativeEngine.cache_nbytes counts with the target's.


@runtime_checkable
class TreeDrafter(Protocol):
    """A drafter whose tree has settings (DART, EAGLE-3, prompt lookup): the one way to read and set them, so
    nothing above the drafters (automatic trees, the benchmark) needs to know where a drafter keeps them.

    tree_kind        which settings it takes: "dart" (``PruningConfig``'s fields), "eagle3"
                     (``Eagle3TreeConfig``'s) or "prompt_lookup" (``LookupTreeConfig``'s); the names are the tree
                     configs' fields, which ``dart_core.presets`` maps to the knobs (``PRUNING_FIELDS``, ...)
    tree_settings()  the settings it runs, field -> value (read-only)
    set_tree(**s)    run with these fields changed; a bad value raises ValueError naming the field, an unknown
                     field TypeError, and the drafter keeps its settings
    """
    tree_kind: str

    def tree_settings(self) -> Mapping[str, Any]:
        ...

    def set_tree(self, **settings: Any) -> None:
        ...


class TreeHolder:
    """:class:`TreeDrafter` for a drafter that keeps its tree settings in one config dataclass (``_tree_config``) whose
    construction validates them: read as a read-only mapping, set by replacing the config."""
    tree_kind: str
    _tree_config: Any

    def tree_settings(self) -> Mapping[str, Any]:
        return MappingProxyType(dataclasses.asdict(self._tree_config))

    def set_tree(self, **settings: Any) -> None:
        self._tree_config = dataclasses.replace(self._tree_config, **settings)


class FeatureDrafter:
    """The opening, begin and observe of drafters that run a head on the target's aux features (DART,
    EAGLE-3): the features of newly committed positions wait in ``_pending`` until the next drafting
    ``propose``, which takes them with :meth:`take_pending`; ``_cache`` is the head's own KV cache
    (``head.new_cache()``, with ``reset()``). :meth:`skip` proposes a plain target step without running the
    head: the step's features join the waiting ones, so the head catches up at the next drafting step."""
    needs_aux = True
    _pending: torch.Tensor | None = None

    def __init__(self, head, name: str, *, loader: str, prepare: Callable[[Any], tuple[str, Any]] | None = None):
        """head: a draft head with the target's embedding attached, on the target's device and dtype
        (``head.kind`` names it in errors). loader: the load function the error recommends.
        prepare: applied once to the head in eval mode, returns (how the head runs, its native step or None);
        the drafters pass ``models.heads.native_step.prepare_head``. A native step brings its own head cache."""
        if head.embedding is None:
            raise ValueError(f"the {head.kind} head has no token embedding: load it with {loader}(path, target) "
                             "or call head.attach_embedding(target embedding)")
        self.head = head.eval()
        self.head_backend, self._step = prepare(self.head) if prepare is not None else ("torch", None)
        self.name = name
        self._cache = self._step.new_cache() if self._step is not None else head.new_cache()
        self._pending = None      # [n, 3H] features of positions not yet in the head cache
        self._proposed = False    # a proposal awaits its observe()

    def begin(self, prompt_ids: Sequence[int], prefill_aux: torch.Tensor | None) -> None:
        if prefill_aux is None:
            raise ValueError(f"{type(self).__name__} needs the target's aux features (needs_aux=True)")
        if prefill_aux.shape[0] != len(prompt_ids):
            raise ValueError(f"prefill_aux has {prefill_aux.shape[0]} rows for a prompt of {len(prompt_ids)} tokens")
        self._cache.reset()
        self._pending = prefill_aux
        self._proposed = False

    def observe(self, step: AcceptedStep) -> None:
        if step.aux is None:
            raise ValueError(f"{type(self).__name__} needs the aux features of the accepted nodes (needs_aux=True)")
        if step.aux.shape[0] != len(step.tokens):
            raise ValueError(f"AcceptedStep has {len(step.tokens)} tokens but {step.aux.shape[0]} aux rows")
        self._pending = step.aux if self._pending is None else torch.cat([self._pending, step.aux])
        self._proposed = False

    def cache_nbytes(self) -> int:
        """Bytes of the head's KV cache (the weights are shared and not counted)."""
        return self._cache.nbytes

    @property
    def waiting_positions(self) -> int:
        """Committed positions whose features wait for the head's next run (many after plain steps)."""
        return 0 if self._pending is None else int(self._pending.shape[0])

    def take_pending(self, context: Sequence[int]) -> torch.Tensor:
        """The waiting features (then none wait), checked against the context: positions cached + waiting
        + the root make the context."""
        if self._proposed or self._pending is None:
            raise RuntimeError(f"{type(self).__name__}.propose() called twice without observe(): the engine "
                               "must report every verify step through observe()")
        pending, n, start = self._pending, int(self._pending.shape[0]), self._cache.length
        if start + n + 1 != len(context):
            raise RuntimeError(f"{type(self).__name__} is out of step: {start} positions cached + {n} new features "
                               f"+ the root should make the context, which has {len(context)} tokens")
        self._pending = None
        self._proposed = True
        return pending

    def mark(self) -> tuple:
        """The head's state before a proposal (positions cached, features waiting): :meth:`rewind` returns to it, so
        one position can be drafted at several tree settings (the chooser's offline replay, sizing/replay.py). A
        proposal after a rewind writes the waiting features' K/V into the same slots again, with the same values."""
        return self._cache.length, self._pending, self._proposed

    def rewind(self, mark: tuple) -> None:
        self._cache.length, self._pending, self._proposed = mark

    def skip(self, context: Sequence[int]) -> Proposal:
        """A plain target step (the root only): the head does not run; its features wait for the next draft."""
        if self._proposed or self._pending is None:
            raise RuntimeError(f"{type(self).__name__}.skip() called twice without observe()")
        self._proposed = True
        return Proposal(tree=DraftTree.root_only(int(context[-1])))
