"""DART tree pruning (docs/ARCHITECTURE.md section 5): from the drafter's per-level top-k logits to a
draft tree, scoring each candidate by its logit and N-gram log-probabilities.

For tree level l (row l of the inputs; level 0 = children of the root):

    p_l       = softmax over the row's level_top_k logits only
    w_lvl(l)  = (l + 1) ** -level_decay          w_logit(l) = logit_decay ** l
    logit_term = w_lvl(l) * (w_logit(l) * min(0, log(p_l(x) + eps)))
    ngram_term = w_lvl(l) * (ngram_weight * min(0, log(P_ng(x | ctx) + eps)))   (0 at level 0)
    score(c + x) = score(c) + (logit_term + ngram_term)

where ctx = the last (order - 1) tokens of context ++ c. Each level expands every beam
candidate by each of the row's tokens; the next beam is the best ``beam_width`` candidates
of the level that do not end in an EOS id (EOS nodes are never expanded). Every expansion
is recorded; the tree keeps the best ``budget`` of them (the root is extra) in the total
order (score desc, depth asc, insertion index asc). Terms are clamped at 0 so a child never
outscores its parent (in the original's float32, log(1 + 1e-10) rounds to 0 by itself);
with the depth tie-break every kept node's parent is kept too, even when scores tie.

Insertion index: candidates are numbered level by level; within a level by the parent's
rank in the beam, then by column (columns sorted by logit, ties in input order).

Two implementations compute exactly the same floating-point operations: the native one
(``native/src/pruner.cpp``, the default) and :func:`prune_dart_tree_reference` (pure Python,
for tests and reading).
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from ..ngram.live import mix_weight
from ..presets import LIMITS, PRUNING_FIELDS
from ..engine.trace import SOURCE_CONTEXT, SOURCE_CORPUS, SOURCE_HEAD, CandidatesOnRequest, ScoredCandidates
from ..engine.tree import DraftTree


#: The context weight "DART + context" runs with (the benchmark's ``dart_context``, the page's DART + context; the
#: paper's DART runs 0). Tuned on the dev sets (docs/benchmarks.md, "DART + context").
CONTEXT_WEIGHT = 0.5


@dataclass
class PruningConfig:
    """Every knob of the DART pruner; defaults are the paper's / original code's.

    level_top_k   tokens per level taken from each row (the row's best by logit)
    beam_width    candidates expanded per level
    budget        drafted nodes kept in the tree, root excluded (61 nodes verified at 60; 0 = draft nothing)
    level_decay   w_lvl(l) = (l + 1) ** -level_decay
    logit_decay   w_logit(l) = logit_decay ** l
    ngram_weight  weight of the N-gram log-probability (levels >= 1); 0 disables it
    eps           added to probabilities before the log
    context_weight  the live context's share of the N-gram probability (section 5a: its continuations join
                  the tree and P_ng interpolates the context and the table); 0 = the paper's pruner
    context_top_k continuations of the live context offered per expanded candidate
    """
    level_top_k: int = 25
    beam_width: int = 20
    budget: int = 60
    level_decay: float = 0.7
    logit_decay: float = 0.9
    ngram_weight: float = 0.5
    eps: float = 1e-10
    context_weight: float = 0.0
    context_top_k: int = 4

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the field to change."""
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"PruningConfig.{name}={getattr(self, name)!r}: {rule}")
        # budget, beam_width, level_top_k, ngram_weight: the low ends every entry point shares (dart_core.presets; the
        # page and the CLI flags also cap the high ends). budget 0 = draft nothing (each step is a plain target step)
        for name, key in PRUNING_FIELDS.items():
            why = LIMITS[key].problem(getattr(self, name), upper=False)
            if why is not None:
                raise bad(name, why + (" (a negative weight would let scores rise along a path)"
                                       if name == "ngram_weight" else ""))
        if not math.isfinite(self.level_decay):
            raise bad("level_decay", "must be finite")
        v = float(self.logit_decay)
        if not (math.isfinite(v) and v >= 0):
            raise bad("logit_decay", "must be finite and >= 0 (a negative weight would let scores rise along a path)")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise bad("eps", "must be finite and > 0")
        if float(self.context_weight) > 1.0:
            raise bad("context_weight", "must be at most 1 (it is the context's share of the N-gram probability)")
        if not isinstance(self.context_top_k, int) or isinstance(self.context_top_k, bool) or self.context_top_k < 0:
            raise bad("context_top_k", "must be a whole number >= 0")

    def level_weight(self, level: int) -> float:
        return (level + 1) ** -self.level_decay

    def logit_weight(self, level: int) -> float:
        return self.logit_decay ** level

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tail_length(store: Any, live: Any) -> int:
    """How many of the context's last tokens the pruner reads: order-1 for the table's queries, the live index's
    order for its own (at least one: the root)."""
    n = max(int(store.order) - 1, 1) if store is not None else 1
    return max(n, int(live.max_order)) if live is not None else n


def _context_tail(context: Sequence[int], store: Any, live: Any = None) -> np.ndarray:
    """The last tokens of the context the pruner needs (:func:`tail_length`)."""
    n = tail_length(store, live)
    tail = np.asarray(context[-n:] if len(context) >= n else context, dtype=np.int64).reshape(-1)
    if tail.size == 0:
        raise ValueError("context is empty: it must end with the tree root token")
    return tail


#: Ids the native pruner can hold (it keeps selected tokens as uint32, the N-gram store's id type).
MAX_TOKEN_IDS = 1 << 32


def _check_inputs(topk_logits: Any, topk_tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    logits = np.ascontiguousarray(topk_logits, dtype=np.float32)
    tokens = np.ascontiguousarray(topk_tokens, dtype=np.int64)
    if logits.ndim != 2 or logits.shape != tokens.shape:
        raise ValueError(f"topk_logits {logits.shape} and topk_tokens {tokens.shape} must both be [D+1, k]")
    if logits.shape[0] > 0 and logits.shape[1] == 0:
        raise ValueError(f"topk_logits has no columns: each of its {logits.shape[0]} rows needs at least one "
                         f"(logit, token) pair: take the top-k with k >= 1")
    return logits, tokens


def _check_token_ids(tokens: np.ndarray, context_tail: np.ndarray, store: Any, vocab_size: int | None) -> None:
    """The one id range check of both backends: every drafted token and context token must lie in
    [0, vocabulary), the vocabulary being the smallest of ``vocab_size``, the store's and what the
    native pruner can hold (2**32), so neither backend ever sees an id it would misread."""
    bounds = [(MAX_TOKEN_IDS, "the ids a token can have; pass vocab_size to check against the model's")]
    if vocab_size is not None:
        bounds.append((int(vocab_size), "the target's vocabulary"))
    store_vocab = getattr(store, "vocab_size", None) if store is not None else None
    if store_vocab is not None:
        bounds.append((int(store_vocab), "the N-gram table's vocabulary"))
    vocab, source = min(bounds, key=lambda x: x[0])
    for what, ids in (("topk_tokens", tokens), ("context", context_tail)):
        bad = (ids < 0) | (ids >= vocab)
        if bad.any():
            t = int(ids[bad][0])
            raise ValueError(f"{what} holds token id {t}, outside the vocabulary [0, {vocab}) ({source}); the "
                             f"drafter must propose target-vocabulary ids: check its draft-to-target id mapping "
                             f"(d2t) and that the N-gram table was built with the target's tokenizer")


def prune_dart_tree(topk_logits: np.ndarray, topk_tokens: np.ndarray, context: Sequence[int], store: Any,
                    eos_token_ids: Sequence[int], config: PruningConfig | None = None,
                    backend: str = "native", vocab_size: int | None = None,
                    live: Any = None) -> tuple[DraftTree, ScoredCandidates]:
    """Prune the drafter's top-k tokens into a DART draft tree.

    topk_logits    [D+1, k] float32  raw logits of each level's top-k tokens
    topk_tokens    [D+1, k] int64    their target-vocabulary token ids
    context        committed tokens; the last one is the tree root
    store          NgramStore (or None: no N-gram term); ``backend="python"`` also takes a
                   ReferenceNgram or anything with ``order`` and ``query(context, candidates)``
    eos_token_ids  ids that end a path (scored and kept, never expanded)
    vocab_size     the target's vocabulary size, if known: token ids must be below it (and below
                   the store's); ids outside raise ValueError in both backends
    live           the request's live context index (``ngram.live``: a native ``ContextIndex``, or for
                   ``backend="python"`` a ``ReferenceContextIndex``), read when ``config.context_weight`` > 0
    Returns the tree (node 0 = root, then kept candidates best first) and every scored
    candidate (kept or pruned) for the trace.
    """
    config = config or PruningConfig()
    if backend == "python":
        return prune_dart_tree_reference(topk_logits, topk_tokens, context, store, eos_token_ids, config,
                                         vocab_size=vocab_size, live=live)
    if backend != "native":
        raise ValueError(f"backend must be 'native' or 'python', got {backend!r}")
    from ..ngram.store import NgramStore, require_native

    native = require_native()
    if store is not None and not isinstance(store, NgramStore):
        raise TypeError(f"the native pruner needs an NgramStore, got {type(store).__name__}; use backend='python'")
    if live is not None and not isinstance(live, native.ContextIndex):
        raise TypeError(f"the native pruner needs a native ContextIndex, got {type(live).__name__}; use "
                        "backend='python'")
    config.validate()
    logits, tokens = _check_inputs(topk_logits, topk_tokens)
    ctx_tail = _context_tail(context, store, live)
    _check_token_ids(tokens, ctx_tail, store, vocab_size)
    r = native.prune_dart_tree(logits, tokens, ctx_tail,
                               None if store is None else store.native,
                               np.asarray(list(eos_token_ids), dtype=np.int64), config, live)
    tree = DraftTree(tokens=r["tree_tokens"], parents=r["tree_parents"], depths=r["tree_depths"],
                     scores=r["tree_scores"])
    # Arrays go into the trace as they are; they become lists only when a trace is exported.
    return tree, _candidates(r)


def _clamped_log(x: float, eps: float) -> float:
    v = math.log(x + eps)
    return 0.0 if v > 0.0 else v


def prune_dart_tree_reference(topk_logits: np.ndarray, topk_tokens: np.ndarray, context: Sequence[int],
                              store: Any, eos_token_ids: Sequence[int],
                              config: PruningConfig | None = None,
                              vocab_size: int | None = None, live: Any = None) -> tuple[DraftTree, ScoredCandidates]:
    """Pure-Python DART pruner: the same operations, in the same order, as the native one."""
    config = config or PruningConfig()
    config.validate()
    logits, tokens = _check_inputs(topk_logits, topk_tokens)
    ctx_tail_array = _context_tail(context, store, live)
    _check_token_ids(tokens, ctx_tail_array, store, vocab_size)
    ctx_tail = [int(t) for t in ctx_tail_array]
    rows, k = logits.shape
    kk = min(k, int(config.level_top_k))
    eos = {int(t) for t in eos_token_ids}
    use_ngram = store is not None and config.ngram_weight != 0.0
    use_live = live is not None and config.context_weight > 0.0 and config.context_top_k > 0

    # Per row: the kk best columns (stable), their tokens and clamped log-softmax terms.
    sel_tokens: list[list[int]] = []
    sel_lp: list[list[float]] = []
    sel_p: list[list[float]] = []
    for r in range(rows):
        row = [float(x) for x in logits[r]]
        if any(math.isnan(x) or x == math.inf for x in row):
            raise ValueError(f"topk_logits[{r}] holds NaN or +inf")
        cols = sorted(range(k), key=lambda j: -row[j])  # Python's sort is stable
        m = row[cols[0]]
        if m == -math.inf:
            raise ValueError(f"topk_logits[{r}] is all -inf")
        e = [math.exp(row[cols[j]] - m) for j in range(kk)]
        s = 0.0
        for v in e:
            s += v
        sel_tokens.append([int(tokens[r, cols[j]]) for j in range(kk)])
        sel_p.append([v / s for v in e])
        sel_lp.append([_clamped_log(p, config.eps) for p in sel_p[-1]])

    cands = ScoredCandidates(source=[])
    ctx_len = max(int(store.order), 2) - 1 if use_ngram else 0
    tail_len = max(ctx_len, int(live.max_order) if use_live else 0)
    # past the head's rows the tree goes on while the live context continues a path (at most budget levels deep)
    levels = max(rows, int(config.budget)) if use_live else rows
    beam: list[int] = [-1]          # candidate indices; -1 = the root
    beam_score: list[float] = [0.0]
    for level in range(levels):
        if not beam:
            break
        w_lvl = (level + 1) ** -config.level_decay
        w_logit = config.logit_decay ** level
        ngram_here = use_ngram and level > 0
        level_begin = len(cands)
        for b, parent in enumerate(beam):
            path = []
            c = parent
            while c >= 0:
                path.append(cands.token[c])
                c = cands.parent[c]
            query_ctx = (ctx_tail + path[::-1])[-tail_len:] if tail_len else []
            cand_tok = list(sel_tokens[level]) if level < rows else []
            cand_lp = list(sel_lp[level]) if level < rows else []
            cand_p = list(sel_p[level]) if level < rows else []
            n_head = len(cand_tok)
            lam = 0.0
            if use_live:
                matched_len, _, conts, _ = live.continuations(query_ctx, int(config.context_top_k))
                lam = mix_weight(int(matched_len), config.context_weight)
                for t in conts.tolist():
                    if lam > 0.0 and t not in cand_tok[:n_head]:
                        cand_tok.append(int(t))
                        cand_lp.append(0.0)
                        cand_p.append(0.0)
            if not cand_tok:
                continue
            if ngram_here:
                probs, _ = store.query(query_ctx[len(query_ctx) - min(len(query_ctx), ctx_len):], cand_tok)
            if lam > 0.0:
                live_probs, _ = live.query(query_ctx, cand_tok)
            for j, tok in enumerate(cand_tok):
                nt = 0.0
                src = SOURCE_HEAD if j < n_head else 0
                if ngram_here and float(probs[j]) > 0.0:
                    src |= SOURCE_CORPUS
                if lam > 0.0:
                    pc = float(live_probs[j])
                    p_corpus = float(probs[j]) if ngram_here else 1.0
                    lt = w_lvl * (w_logit * _clamped_log((1.0 - lam) * cand_p[j] + lam * pc, config.eps))
                    if config.ngram_weight != 0.0:
                        nt = w_lvl * (config.ngram_weight * _clamped_log((1.0 - lam) * p_corpus + lam * pc,
                                                                         config.eps))
                    if pc > 0.0:
                        src |= SOURCE_CONTEXT
                else:
                    lt = w_lvl * (w_logit * cand_lp[j])
                    if ngram_here:
                        nt = w_lvl * (config.ngram_weight * _clamped_log(float(probs[j]), config.eps))
                cands.append(token=tok, parent=parent, depth=level + 1, logit_term=lt,
                             ngram_term=nt, score=beam_score[b] + (lt + nt), kept=False, node=-1, source=src)
        level_ids = [c for c in range(level_begin, len(cands)) if cands.token[c] not in eos]
        level_ids.sort(key=lambda c: (-cands.score[c], c))
        beam = level_ids[:int(config.beam_width)]
        beam_score = [cands.score[c] for c in beam]

    order = sorted(range(len(cands)), key=lambda c: (-cands.score[c], cands.depth[c], c))
    keep = order[:int(config.budget)]
    tokens_out, parents_out, depths_out, scores_out = [ctx_tail[-1]], [-1], [0], [0.0]
    for rank, c in enumerate(keep):
        cands.kept[c] = True
        cands.node[c] = rank + 1
        p = cands.parent[c]
        parent_node = 0 if p < 0 else cands.node[p]
        assert parent_node >= 0, "a kept candidate's parent was pruned"
        tokens_out.append(cands.token[c])
        parents_out.append(parent_node)
        depths_out.append(cands.depth[c])
        scores_out.append(cands.score[c])
    tree = DraftTree(tokens=tokens_out, parents=parents_out, depths=depths_out, scores=scores_out)
    return tree, cands


class TreeBuilder:
    """DART's tree build on the drafting hot path: one native pruner call and nothing the tree does not need.

    * The beam is capped at the budget. The tree is the same: a candidate with ``budget`` candidates of its own
      level ahead of it (score desc, index asc) has them ahead of every descendant too (scores never rise along a
      path, and the shallower wins a tie), so neither it nor its descendants can be among the ``budget`` best;
      by induction over the levels every kept candidate is still expanded and the rest still rank behind the
      last kept one (tests/drafters/test_pruner.py checks it against the full beam). The trace's candidate list, which
      the page shows with the pruned candidates, is the full beam's: a :class:`CandidatesOnRequest` that runs
      the pruner again with ``beam_width`` when first read.
    * The config is validated when it changes, not every step (the tree sizer changes ``budget`` in place);
      ids are not checked again in Python: the native step's ids come from a ``d2t`` checked when its kernel
      was built, and the binding checks them against the N-gram table's vocabulary.
    * The tree comes from the pruner's arrays as they are (``DraftTree.trusted``).

    ``backend="python"`` (the reference) runs :func:`prune_dart_tree` as it is.
    """

    def __init__(self, store: Any, eos_token_ids: Sequence[int], backend: str = "native"):
        if backend not in ("native", "python"):
            raise ValueError(f"backend must be 'native' or 'python', got {backend!r}")
        self.store, self.backend = store, backend
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self._eos = np.asarray(self.eos_token_ids, dtype=np.int64)
        self._native = self._native_store = None
        if backend == "native":
            from ..ngram.store import NgramStore, require_native
            if store is not None and not isinstance(store, NgramStore):
                raise TypeError(f"the native pruner needs an NgramStore, got {type(store).__name__}; "
                                "use backend='python'")
            self._native = require_native()
            self._native_store = None if store is None else store.native
        self._key: tuple | None = None
        self._hot: dict[str, Any] = {}

    def build(self, topk_logits: np.ndarray, topk_tokens: np.ndarray, context: Sequence[int],
              config: PruningConfig, live: Any = None) -> tuple[DraftTree, ScoredCandidates]:
        """The tree and the step's scored candidates, as :func:`prune_dart_tree` returns them. ``live``: the
        request's live context index (read when ``config.context_weight`` > 0)."""
        if self.backend == "python":
            return prune_dart_tree(topk_logits, topk_tokens, context, self.store, self.eos_token_ids, config,
                                   backend="python", live=live)
        self._hot_params(config)
        if config.context_weight == 0:
            live = None
        tail = np.asarray(context[-tail_length(self.store, live):], dtype=np.int64)
        if tail.size == 0:
            raise ValueError("context is empty: it must end with the tree root token")
        r = self._native.prune_dart_tree(topk_logits, topk_tokens, tail, self._native_store, self._eos, self._hot,
                                         live)
        tree = DraftTree.trusted(r["tree_tokens"], r["tree_parents"], r["tree_depths"], r["tree_scores"])
        if self._hot["beam_width"] == int(config.beam_width):
            return tree, _candidates(r)
        snapshot = copy.copy(config)   # the sizer may change the budget before someone reads (copy: no re-validation)
        # the index grows with every commit (and restarts with the next request): keep the tokens it held now
        live_tokens = None if live is None else live.tokens()

        def full_beam() -> ScoredCandidates:
            then = None
            if live_tokens is not None:
                then = self._native.ContextIndex(int(live.max_order), int(live.vocab_size))
                then.extend(live_tokens)
            full_tree, cands = prune_dart_tree(topk_logits, topk_tokens, tail, self.store, self.eos_token_ids,
                                               snapshot, live=then)
            if not np.array_equal(full_tree.tokens, tree.tokens) or not np.array_equal(full_tree.parents,
                                                                                       tree.parents):
                raise RuntimeError("the full beam pruned another tree than the capped one (a pruner bug)")
            return cands
        return tree, CandidatesOnRequest(full_beam)

    def _hot_params(self, config: PruningConfig) -> dict:
        """The native pruner's knobs for ``config`` (``self._hot``), validated and rebuilt only when a value changed
        (the tree sizer changes ``budget`` in place; a step's config is otherwise the last one)."""
        key = (config.level_top_k, config.beam_width, config.budget, config.level_decay, config.logit_decay,
               config.ngram_weight, config.eps, config.context_weight, config.context_top_k)
        if key != self._key:
            config.validate()
            self._hot = dict(config.to_dict(), beam_width=min(int(config.beam_width), max(int(config.budget), 1)))
            self._key = key
        return self._hot

    def chains(self, topk_logits: np.ndarray, topk_tokens: np.ndarray, tails: np.ndarray,
               config: PruningConfig) -> np.ndarray:
        """The native pruner's chain search for a batch of requests in one call (``drafters/chain.py``:
        ``best_chains``): [B, L, k] rows, [B, T] tails (root last, -1 where unknown) -> [B, L] int64."""
        if self.backend != "native":
            raise ValueError("TreeBuilder.chains is the native pruner's batch call; the python backend goes "
                             "request by request (drafters/chain.py: best_chains)")
        return self._native.prune_dart_chains(np.ascontiguousarray(topk_logits, dtype=np.float32),
                                              np.ascontiguousarray(topk_tokens, dtype=np.int64),
                                              np.ascontiguousarray(tails, dtype=np.int64), self._native_store,
                                              self._eos, self._hot_params(config))


def _candidates(r: dict) -> ScoredCandidates:
    return ScoredCandidates(token=r["token"], parent=r["parent"], depth=r["depth"], logit_term=r["logit_term"],
                            ngram_term=r["ngram_term"], score=r["score"], kept=r["kept"].astype(bool),
                            node=r["node"], source=r["source"])
