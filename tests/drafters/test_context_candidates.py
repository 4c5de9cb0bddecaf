"""The live context (docs/ARCHITECTURE.md section 5a): the native ContextIndex against its pure-Python mirror,
the pruner with context candidates (native = reference bit for bit, the paper's pruner unchanged at weight 0,
invariants, sources), edge sizes and bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart_core.drafters.pruning import PruningConfig, TreeBuilder, prune_dart_tree, prune_dart_tree_reference
from dart_core.engine.trace import SOURCE_CONTEXT, SOURCE_CORPUS, SOURCE_HEAD, ScoredCandidates, source_label
from dart_core.ngram import store as ngram
from dart_core.ngram.live import LiveContext, ReferenceContextIndex

from test_pruner import VOCAB, assert_same, logit_values, stores  # noqa: F401  (the tables fixture)

native = ngram.require_native()


def both(max_order: int, vocab: int, tokens) -> tuple:
    a, b = native.ContextIndex(max_order, vocab), ReferenceContextIndex(max_order, vocab)
    a.extend(np.asarray(tokens, dtype=np.int64))
    b.extend(tokens)
    return a, b


@settings(max_examples=200, deadline=None)
@given(seq=st.lists(st.integers(0, 4), max_size=60), order=st.integers(1, 7),
       ctx=st.lists(st.integers(0, 4), max_size=9), cands=st.lists(st.integers(0, 4), max_size=6),
       kids=st.integers(0, 6), split=st.integers(0, 60))
def test_native_index_matches_the_reference(seq, order, ctx, cands, kids, split):
    a, b = both(order, 5, seq[:split])
    a.extend(np.asarray(seq[split:], dtype=np.int64))     # extended in two calls: the same as in one
    b.extend(seq[split:])
    assert len(a) == len(b) == len(seq) and a.tokens().tolist() == seq
    pa, ma = a.query(np.asarray(ctx, dtype=np.int64), np.asarray(cands, dtype=np.int64))
    pb, mb = b.query(ctx, cands)
    assert pa.tolist() == pb.tolist() and ma.tolist() == mb.tolist()
    ca, cb = a.continuations(np.asarray(ctx, dtype=np.int64), kids), b.continuations(ctx, kids)
    assert ca[0] == cb[0] and ca[1] == cb[1] and ca[2].tolist() == cb[2].tolist() and ca[3].tolist() == cb[3].tolist()


def test_index_counts_and_orders_continuations():
    ix, _ = both(3, 10, [1, 2, 3, 1, 2, 4, 1, 2, 4, 7, 1, 2])
    matched, count, toks, counts = ix.continuations(np.array([9, 1, 2]), 5)
    assert (matched, count) == (2, 3) and toks.tolist() == [4, 3] and counts.tolist() == [2, 1]
    p, m = ix.query(np.array([1, 2]), np.array([4, 3, 7, 1]))
    assert p.tolist() == [2 / 3, 1 / 3, 0.0, 0.0] and m.tolist() == [2, 2, 0, 0]
    # ties go to the most recent continuation
    ix2, _ = both(2, 10, [5, 1, 5, 2, 5])
    assert ix2.continuations(np.array([5]), 2)[2].tolist() == [2, 1]
    # the current occurrence (the root's) has no continuation yet: a suffix seen once only is no match
    ix3, _ = both(4, 10, [1, 2, 3])
    assert ix3.continuations(np.array([2, 3]), 4)[0] == 0


@pytest.mark.parametrize("n", [0, 1, 2])
def test_index_edge_sizes(n):
    ix = native.ContextIndex(1, 3)
    ix.extend(np.arange(n, dtype=np.int64) % 3)
    assert len(ix) == n
    assert ix.continuations(np.zeros(0, dtype=np.int64), 3)[0] == 0
    p, m = ix.query(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert p.size == 0 and m.size == 0
    assert ix.continuations(np.array([0]), 0)[2].size == 0


def test_index_refuses_bad_input_and_stays_unchanged():
    with pytest.raises(ValueError, match="max_order"):
        native.ContextIndex(0, 10)
    with pytest.raises(ValueError, match="max_order"):
        native.ContextIndex(65, 10)
    with pytest.raises(ValueError, match="vocab_size"):
        native.ContextIndex(3, 0)
    with pytest.raises(ValueError, match="vocab_size"):
        native.ContextIndex(3, 2 ** 32)
    ix = native.ContextIndex(3, 10)
    ix.extend(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="token id 10 at index 1"):
        ix.extend(np.array([4, 10, 5]))
    with pytest.raises(ValueError, match="token id -1"):
        ix.extend(np.array([-1]))
    assert ix.tokens().tolist() == [1, 2, 3], "a refused extend must leave the index as it was"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ix.query(np.array([1]), np.array([11]))
    with pytest.raises(ValueError, match="1-D"):
        ix.extend(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="max_children"):
        ix.continuations(np.array([1]), -1)
    with pytest.raises(ValueError, match="max_order"):
        ReferenceContextIndex(0, 10)


def test_live_context_follows_the_request():
    live = LiveContext(vocab_size=50, max_order=3)
    live.begin([1, 2, 3])
    live.sync([1, 2, 3, 4, 5])
    assert live.index.tokens().tolist() == [1, 2, 3, 4, 5]
    live.sync([1, 2, 3, 4, 5])                       # nothing new: nothing added
    assert len(live) == 5
    with pytest.raises(RuntimeError, match="begin"):
        live.sync([1, 2])
    live.begin([7])                                  # a new request forgets the last one
    assert live.index.tokens().tolist() == [7]


@st.composite
def context_case(draw):
    rows = draw(st.integers(0, 4))
    k = draw(st.integers(1, 6))
    logits = np.array([[draw(logit_values) for _ in range(k)] for _ in range(rows)], dtype=np.float32).reshape(rows, k)
    for r in range(rows):
        if not np.isfinite(logits[r]).any():
            logits[r, 0] = 0.0
    tokens = np.array([[draw(st.integers(0, VOCAB - 1)) for _ in range(k)] for _ in range(rows)],
                      dtype=np.int64).reshape(rows, k)
    history = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40))   # prompt + committed, root last
    eos = draw(st.lists(st.integers(0, VOCAB - 1), max_size=1))
    config = PruningConfig(level_top_k=draw(st.integers(1, 6)), beam_width=draw(st.integers(1, 4)),
                           budget=draw(st.integers(0, 12)), ngram_weight=draw(st.sampled_from([0.5, 0.0, 2.0])),
                           context_weight=draw(st.sampled_from([0.0, 0.5, 1.0, 0.3])),
                           context_top_k=draw(st.integers(0, 3)))
    return logits, tokens, history, eos, config, draw(st.sampled_from([None, 2, 4])), draw(st.integers(1, 5))


def check_context_invariants(tree, cands, config, eos):
    n = len(cands)
    assert len(cands.source) == n
    assert len(tree) == min(config.budget, n) + 1
    for i in range(n):
        p = cands.parent[i]
        if p >= 0:
            assert cands.token[p] not in eos
            assert cands.depth[i] == cands.depth[p] + 1
            assert cands.score[i] <= cands.score[p], "a child outscored its parent"
            if cands.kept[i]:
                assert cands.kept[p], "a kept candidate's parent was pruned"
        assert 0 <= cands.source[i] <= 7
    # a context continuation never duplicates a sibling (it merges into the head's candidate; the test's random
    # rows may repeat a token among the head's own columns, which a real top-k never does)
    head = {(int(cands.parent[i]), int(cands.token[i])) for i in range(n) if cands.source[i] & SOURCE_HEAD}
    extra = [(int(cands.parent[i]), int(cands.token[i])) for i in range(n) if not cands.source[i] & SOURCE_HEAD]
    assert not set(extra) & head and len(set(extra)) == len(extra), "a duplicate sibling"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=context_case())
def test_context_pruner_native_matches_reference(stores, case):
    logits, tokens, history, eos, config, store_key, order = case
    store = None if store_key is None else stores[store_key]
    live_n, live_r = both(order, VOCAB, history)
    got = prune_dart_tree(logits, tokens, history, store, eos, config, live=live_n)
    want = prune_dart_tree_reference(logits, tokens, history, store, eos, config, live=live_r)
    assert_same(got, want)
    assert np.asarray(got[1].source).tolist() == list(want[1].source)
    check_context_invariants(*got, config, set(eos))
    if config.context_weight == 0 or config.context_top_k == 0:
        # the paper's pruner: the same tree and scores as without any index
        assert_same(got, prune_dart_tree(logits, tokens, history, store, eos, config))
    # the hot path (beam capped at the budget) builds the same tree; its full candidate list is read later,
    # after the index has grown, and is still the one of the step
    builder = TreeBuilder(store, eos)
    hot = builder.build(logits, tokens, history, config, live_n)
    live_n.extend(np.array([0, 1, 2]))
    assert_same(hot, got)


def test_context_candidates_reach_past_the_head_and_outside_its_top_k():
    """A passage the answer copies: the head knows none of its tokens, yet the context's continuation enters at
    every level and goes on past the head's two rows while the match continues."""
    passage = [40, 41, 42, 43, 44, 45, 46]
    history = [1, 2] + passage + [3, 4, 40, 41]          # the answer has started to copy: root = 41
    live = native.ContextIndex(4, 100)
    live.extend(np.asarray(history, dtype=np.int64))
    logits = np.array([[3.0, 1.0, 0.5], [2.0, 1.0, 0.0]], dtype=np.float32)
    tokens = np.array([[7, 8, 9], [7, 8, 9]], dtype=np.int64)      # the head's guesses, none from the passage
    cfg = PruningConfig(level_top_k=3, beam_width=4, budget=8, context_weight=1.0, context_top_k=2)
    tree, cands = prune_dart_tree(logits, tokens, history, None, [], cfg, live=live)
    chain, node = [], 0
    kids = {}
    for i in range(1, len(tree)):
        kids.setdefault(int(tree.parents[i]), []).append(i)
    # follow the context's path 42, 43, 44, ...
    for want in passage[2:]:
        nxt = [c for c in kids.get(node, []) if int(tree.tokens[c]) == want]
        if not nxt:
            break
        node = nxt[0]
        chain.append(want)
    assert chain[:4] == [42, 43, 44, 45], f"the copied continuation is not in the tree: {tree.tokens.tolist()}"
    depths = [int(d) for d in tree.depths]
    assert max(depths) > 2, "the context's path should go past the head's two rows"
    src = np.asarray(cands.source)
    kept_ctx = [int(cands.token[i]) for i in range(len(cands)) if cands.kept[i] and src[i] & SOURCE_CONTEXT]
    assert 42 in kept_ctx and all(src[i] & SOURCE_HEAD for i in range(len(cands)) if cands.token[i] in (7, 8, 9))
    # with the weight at 0 the tree is the head's alone (the paper's)
    tree0, cands0 = prune_dart_tree(logits, tokens, history, None, [], PruningConfig(
        level_top_k=3, beam_width=4, budget=8), live=live)
    assert set(int(t) for t in tree0.tokens[1:]) <= {7, 8, 9} and max(tree0.depths) <= 2


def test_corpus_and_context_interpolate(stores):
    """Both probabilities mix with the context's: p = (1 - lam) * p_source + lam * P_ctx, with
    lam = w * (1 - 2^(1 - M)) and M the longest suffix of the path the context has seen."""
    store = stores[2]
    history = [0, 1, 2, 3, 0, 1]
    live = native.ContextIndex(4, VOCAB)
    live.extend(np.asarray(history, dtype=np.int64))
    logits = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    tokens = np.array([[2, 4], [3, 5]], dtype=np.int64)
    cfg = PruningConfig(level_top_k=2, beam_width=2, budget=6, context_weight=0.5, context_top_k=2)
    _, cands = prune_dart_tree(logits, tokens, history, store, [], cfg, live=live)
    # level 1, the path root(1) -> 2: the context saw [0, 1, 2] (M = 3) followed by 3
    i = next(i for i in range(len(cands)) if cands.depth[i] == 2 and cands.token[i] == 3
             and cands.token[cands.parent[i]] == 2)
    p_corpus = float(store.query([2], [3])[0][0])
    lam = 0.5 * (1 - 2 ** -2)
    p_head = math.e / (math.e + 1)
    w_lvl = 2 ** -cfg.level_decay
    assert cands.logit_term[i] == pytest.approx(
        w_lvl * cfg.logit_decay * min(0.0, math.log((1 - lam) * p_head + lam + cfg.eps)))
    assert cands.ngram_term[i] == pytest.approx(
        w_lvl * cfg.ngram_weight * min(0.0, math.log((1 - lam) * p_corpus + lam + cfg.eps)))
    assert cands.source[i] & SOURCE_CONTEXT and cands.source[i] & SOURCE_HEAD
    assert bool(cands.source[i] & SOURCE_CORPUS) == (p_corpus > 0)
    # the root's expansion (the context saw [0, 1] -> 2, M = 2): at level 0 the table has no say (1), so a head
    # token the context contradicts pays log(1 - lam) there, and the one it supports pays nothing
    lam0 = 0.5 * (1 - 2 ** -1)
    k2 = next(i for i in range(len(cands)) if cands.depth[i] == 1 and cands.token[i] == 2)
    k4 = next(i for i in range(len(cands)) if cands.depth[i] == 1 and cands.token[i] == 4)
    assert cands.ngram_term[k2] == 0.0 and cands.source[k2] == SOURCE_HEAD | SOURCE_CONTEXT
    assert cands.ngram_term[k4] == pytest.approx(cfg.ngram_weight * math.log(1 - lam0 + cfg.eps))
    assert cands.source[k4] == SOURCE_HEAD
    # a single repeated token is no evidence: with the root seen once before, the paper's terms
    _, c1 = prune_dart_tree(logits, tokens, [3, 1, 2, 5, 1], store, [], cfg, live=_index([3, 1, 2, 5, 1]))
    assert all(c1.ngram_term[i] == 0.0 for i in range(len(c1)) if c1.depth[i] == 1)


def _index(tokens):
    ix = native.ContextIndex(4, VOCAB)
    ix.extend(np.asarray(tokens, dtype=np.int64))
    return ix


def test_source_labels_and_export():
    assert [source_label(b) for b in (1, 2, 4, 3, 6, 0)] == ["head", "context", "corpus", "several", "several",
                                                              "head"]
    c = ScoredCandidates()
    c.append(token=1, parent=-1, depth=1, logit_term=0.0, ngram_term=0.0, score=0.0, kept=True, node=1)
    assert "source" not in c.to_dict() and c.source_of_node(1) == SOURCE_HEAD
    c2 = ScoredCandidates(source=[])
    c2.append(token=1, parent=-1, depth=1, logit_term=0.0, ngram_term=0.0, score=0.0, kept=True, node=1,
              source=SOURCE_CONTEXT)
    assert c2.to_dict()["source"] == [SOURCE_CONTEXT] and c2.source_of_node(1) == SOURCE_CONTEXT


def test_config_and_binding_refuse_bad_context_settings(stores):
    with pytest.raises(ValueError, match="context_weight"):
        PruningConfig(context_weight=-0.1)
    with pytest.raises(ValueError, match="context_top_k"):
        PruningConfig(context_top_k=-1)
    logits, tokens = np.zeros((1, 2), np.float32), np.array([[1, 2]])
    with pytest.raises(TypeError, match="native ContextIndex"):
        prune_dart_tree(logits, tokens, [1], None, [], PruningConfig(context_weight=0.5),
                        live=ReferenceContextIndex(2, VOCAB))
    big = native.ContextIndex(2, VOCAB + 5)
    with pytest.raises(ValueError, match="larger than the N-gram table"):
        prune_dart_tree(logits, tokens, [1], stores[2], [], PruningConfig(context_weight=0.5), live=big)
    small = native.ContextIndex(2, 2)
    with pytest.raises(ValueError, match="token id 2"):
        prune_dart_tree(logits, tokens, [1], None, [], PruningConfig(context_weight=0.5), live=small)
