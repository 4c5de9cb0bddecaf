"""DART tree pruner: native vs pure-Python reference (hypothesis), and the rules of docs/ARCHITECTURE.md
section 5 on hand-written cases: weights, no N-gram term at level 0, the total-order
tie-break, EOS never expanded, budgets larger than the candidate space."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart_core.ngram import store as ngram
from dart_core.ngram.store import NgramStore
from dart_core.ngram.reference import ReferenceNgram
from dart_core.drafters.pruning import PruningConfig, TreeBuilder, prune_dart_tree, prune_dart_tree_reference
from dart_core.engine.trace import ScoredCandidates

native = ngram.require_native()
VOCAB = 6


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Native tables of orders 1..4 over a small vocabulary, so that hits, misses and
    P = 1 continuations all happen."""
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, VOCAB, size=int(rng.integers(3, 25))).tolist() for _ in range(12)] + [[0, 1, 2, 3] * 3]
    tmp = tmp_path_factory.mktemp("stores")
    out = {}
    for order in (1, 2, 3, 4):
        b = native.TableBuilder(order, VOCAB, str(tmp), 1 << 16)
        b.add_documents(np.array([t for d in docs for t in d]), np.array([len(d) for d in docs]), VOCAB)
        b.finish(str(tmp / f"o{order}.dngram"), 1, "fp", json.dumps({}))
        out[order] = NgramStore.open(tmp / f"o{order}.dngram")
    out["docs"] = docs
    return out


def assert_same(a, b) -> None:
    (tree_a, cand_a), (tree_b, cand_b) = a, b
    for field in ("token", "parent", "depth", "logit_term", "ngram_term", "score", "kept", "node"):
        assert cand_a.to_dict()[field] == cand_b.to_dict()[field], f"candidates.{field} differ"
    for field in ("tokens", "parents", "depths", "scores"):
        assert getattr(tree_a, field).tolist() == getattr(tree_b, field).tolist(), f"tree.{field} differs"


def check_invariants(tree, cands, config, eos) -> None:
    n = len(cands)
    assert len(tree) == min(config.budget, n) + 1
    assert sum(cands.kept) == len(tree) - 1
    for i in range(n):
        p = cands.parent[i]
        if p >= 0:
            assert cands.token[p] not in eos, "an EOS candidate was expanded"
            assert cands.depth[i] == cands.depth[p] + 1
            assert cands.score[i] <= cands.score[p], "a child outscored its parent"
            if cands.kept[i]:
                assert cands.kept[p], "a kept candidate's parent was pruned"
        else:
            assert cands.depth[i] == 1
        if cands.depth[i] == 1:
            assert cands.ngram_term[i] == 0.0, "no N-gram term at level 0"
        if cands.kept[i]:
            node = cands.node[i]
            assert tree.tokens[node] == cands.token[i] and tree.scores[node] == cands.score[i]
        else:
            assert cands.node[i] == -1


# A few distinct values make ties likely; -inf gives p = 0.
logit_values = st.sampled_from([0.0, 0.0, 1.0, 2.5, -3.0, 7.0, -math.inf])


@st.composite
def pruning_case(draw):
    rows = draw(st.integers(1, 5))
    k = draw(st.integers(1, 7))
    logits = np.array([[draw(logit_values) for _ in range(k)] for _ in range(rows)], dtype=np.float32)
    for r in range(rows):  # a row must have a finite maximum
        if not np.isfinite(logits[r]).any():
            logits[r, draw(st.integers(0, k - 1))] = draw(st.sampled_from([0.0, 1.0]))
    tokens = np.array([[draw(st.integers(0, VOCAB - 1)) for _ in range(k)] for _ in range(rows)], dtype=np.int64)
    context = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5))
    eos = draw(st.lists(st.integers(0, VOCAB - 1), max_size=2))
    config = PruningConfig(level_top_k=draw(st.integers(1, 8)), beam_width=draw(st.integers(1, 5)),
                           budget=draw(st.integers(0, 60)),
                           level_decay=draw(st.sampled_from([0.7, 0.0, 1.3])),
                           logit_decay=draw(st.sampled_from([0.9, 1.0, 0.0])),
                           ngram_weight=draw(st.sampled_from([0.5, 0.0, 2.0])),
                           eps=draw(st.sampled_from([1e-10, 1e-3])))
    store_key = draw(st.sampled_from([None, 1, 2, 3, 4]))
    return logits, tokens, context, eos, config, store_key


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=pruning_case())
def test_native_matches_reference(stores, case):
    logits, tokens, context, eos, config, store_key = case
    store = None if store_key is None else stores[store_key]
    got = prune_dart_tree(logits, tokens, context, store, eos, config)
    want = prune_dart_tree_reference(logits, tokens, context, store, eos, config)
    assert_same(got, want)
    check_invariants(*got, config, set(eos))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=pruning_case(), budget=st.integers(0, 7), beam=st.integers(1, 9))
def test_the_hot_path_with_its_beam_capped_at_the_budget_builds_the_same_tree(stores, case, budget, beam):
    """TreeBuilder expands at most `budget` candidates a level: the tree (nodes, order, scores) equals the full
    beam's, and the candidates it hands the trace, computed when first read, are the full beam's."""
    logits, tokens, context, eos, config, store_key = case
    config.budget, config.beam_width = budget, beam
    store = None if store_key is None else stores[store_key]
    want = prune_dart_tree(logits, tokens, context, store, eos, config)
    builder = TreeBuilder(store, eos)
    got = builder.build(logits, tokens, context, config)
    config.budget = budget + 3          # the sizer may change the budget before the trace is read
    assert_same(got, want)
    assert len(builder.build(logits, tokens, context, config)[0]) == len(prune_dart_tree(
        logits, tokens, context, store, eos, config)[0]), "a changed config must be read again"


def test_the_hot_path_refuses_what_the_reference_refuses(stores):
    builder = TreeBuilder(stores[3], [])
    with pytest.raises(ValueError, match="beam_width"):
        builder.build(np.zeros((1, 2), np.float32), np.array([[1, 2]]), [1], _bad_beam())
    with pytest.raises(ValueError, match="outside the table's vocabulary"):
        builder.build(np.zeros((1, 2), np.float32), np.array([[1, VOCAB]]), [1], PruningConfig())
    with pytest.raises(ValueError, match="context is empty"):
        builder.build(np.zeros((1, 2), np.float32), np.array([[1, 2]]), [], PruningConfig())
    with pytest.raises(ValueError, match="NaN"):
        builder.build(np.full((1, 2), np.nan, np.float32), np.array([[1, 2]]), [1], PruningConfig())
    with pytest.raises(TypeError, match="needs an NgramStore"):
        TreeBuilder(ReferenceNgram.from_sequences(stores["docs"], 2, vocab_size=VOCAB), [])
    with pytest.raises(ValueError, match="backend must be"):
        TreeBuilder(None, [], backend="cuda")


def _bad_beam() -> PruningConfig:
    config = PruningConfig()
    config.beam_width = 0           # changed after construction: the builder validates what it is given
    return config


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=pruning_case())
def test_reference_store_gives_the_same_tree(stores, case):
    # The Python pruner on the Python store == the Python pruner on the native store.
    logits, tokens, context, eos, config, store_key = case
    if store_key is None:
        return
    ref_store = ReferenceNgram.from_sequences(stores["docs"], store_key, vocab_size=VOCAB)
    assert_same(prune_dart_tree_reference(logits, tokens, context, ref_store, eos, config),
                prune_dart_tree_reference(logits, tokens, context, stores[store_key], eos, config))


def test_defaults_are_the_papers():
    c = PruningConfig()
    assert (c.level_top_k, c.beam_width, c.budget, c.level_decay, c.logit_decay, c.ngram_weight, c.eps) == \
        (25, 20, 60, 0.7, 0.9, 0.5, 1e-10)
    assert c.context_weight == 0.0, "the paper's DART reads no live context"
    assert c.level_weight(0) == 1.0 and c.level_weight(1) == 2 ** -0.7 and c.logit_weight(2) == 0.81


@pytest.mark.parametrize("field,value", [("level_top_k", 0), ("beam_width", 0), ("budget", -1), ("eps", 0.0),
                                         ("ngram_weight", -0.1), ("logit_decay", float("nan"))])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"PruningConfig.{field}"):
        PruningConfig(**{field: value})


def test_hand_computed_scores_without_ngram():
    # Two levels, two tokens each; no store. Level 0: p = softmax(0, ln 3) = (1/4, 3/4),
    # columns sorted by logit: token 11 (3/4) first. Level 1 weights: w_lvl = 2^-0.7, w_logit = 0.9.
    logits = np.array([[0.0, math.log(3)], [math.log(4), 0.0]], dtype=np.float32)
    tokens = np.array([[10, 11], [20, 21]])
    cfg = PruningConfig(beam_width=1, budget=10)
    tree, c = prune_dart_tree(logits, tokens, [5], None, [], cfg)
    c = ScoredCandidates(**c.to_dict())  # plain lists, compared element-wise below
    l3, l4 = float(np.float32(math.log(3))), float(np.float32(math.log(4)))  # the float32 inputs
    e = [1.0, math.exp(0.0 - l3)]                 # exp(logit - max), best column first
    assert c.token[:2] == [11, 10]
    assert c.score[0] == math.log(e[0] / (e[0] + e[1]) + 1e-10)   # level 0: w_lvl = w_logit = 1
    # Only the best level-0 candidate (11) is expanded (beam 1): two level-1 children.
    assert c.parent[2:] == [0, 0] and c.token[2:] == [20, 21]
    e = [1.0, math.exp(0.0 - l4)]
    assert c.logit_term[2] == 2 ** -0.7 * (0.9 * math.log(e[0] / (e[0] + e[1]) + 1e-10))
    assert c.score[2] == c.score[0] + (c.logit_term[2] + 0.0)
    assert tree.tokens.tolist()[0] == 5 and len(tree) == 5  # budget 10 > 4 candidates: all kept


def test_ties_keep_parents_and_follow_the_total_order(stores):
    # Every logit equal and P_ng = 1 everywhere along 0 -> 1 -> 2 -> 3 ("0 1 2 3" repeats in
    # the corpus): many candidates tie; the tie-break is depth first, then insertion index.
    k = 3
    logits = np.zeros((4, k), dtype=np.float32)
    tokens = np.array([[1, 4, 5], [2, 4, 5], [3, 4, 5], [0, 4, 5]])
    cfg = PruningConfig(budget=4, beam_width=2)
    tree, c = prune_dart_tree(logits, tokens, [0], stores[4], [], cfg)
    assert_same((tree, c), prune_dart_tree_reference(logits, tokens, [0], stores[4], [], cfg))
    # Level 0 has no N-gram term: its three candidates tie at log(1/3); they come first (depth asc),
    # in insertion order, then the best level-1 candidate.
    assert tree.tokens.tolist()[:4] == [0, 1, 4, 5]
    assert tree.parents.tolist()[:4] == [-1, 0, 0, 0]
    check_invariants(tree, c, cfg, set())


def test_eos_is_scored_and_kept_but_never_expanded():
    logits = np.array([[5.0, 0.0], [1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    tokens = np.array([[2, 7], [2, 8], [9, 8]])   # 2 is EOS and is the best token at level 0
    tree, c = prune_dart_tree(logits, tokens, [1], None, [2], PruningConfig(budget=100))
    assert c.token[0] == 2 and c.kept[0] and c.node[0] == 1   # EOS is kept (it is the best guess)
    assert 0 not in c.parent                                   # ... but nothing grows from it
    assert all(c.token[c.parent[i]] != 2 for i in range(len(c)) if c.parent[i] >= 0)


def test_all_eos_stops_the_search():
    logits = np.zeros((3, 2), dtype=np.float32)
    tokens = np.array([[2, 3], [4, 5], [4, 5]])
    tree, c = prune_dart_tree(logits, tokens, [1], None, [2, 3], PruningConfig())
    assert len(c) == 2 and len(tree) == 3


def test_budget_zero_and_empty_rows():
    logits = np.zeros((2, 3), dtype=np.float32)
    tokens = np.arange(6).reshape(2, 3)
    tree, c = prune_dart_tree(logits, tokens, [9], None, [], PruningConfig(budget=0))
    assert len(tree) == 1 and tree.tokens.tolist() == [9] and not any(c.kept)
    tree, c = prune_dart_tree(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int64), [9], None, [])
    assert len(tree) == 1 and len(c) == 0


def test_bad_inputs_raise(stores):
    z = np.zeros((2, 3), dtype=np.float32)
    t = np.arange(6).reshape(2, 3)
    for backend in ("native", "python"):
        with pytest.raises(ValueError, match="root"):
            prune_dart_tree(z, t, [], None, [], backend=backend)
        with pytest.raises(ValueError, match="NaN"):
            prune_dart_tree(np.full((2, 3), np.nan, np.float32), t, [1], None, [], backend=backend)
        with pytest.raises(ValueError, match=r"\[D\+1, k\]"):
            prune_dart_tree(z, t[:1], [1], None, [], backend=backend)
        with pytest.raises(ValueError, match="vocabulary"):
            prune_dart_tree(z, t + 100, [1], stores[3], [], backend=backend)
    with pytest.raises(TypeError, match="backend='python'"):
        prune_dart_tree(z, t, [1], ReferenceNgram.from_sequences([[1]], 2), [])


def test_default_sized_tree(stores):
    # D+1 = 9 rows of 25 at the defaults: 25 + 8 * 20 * 25 candidates, 61 nodes.
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(9, 25)).astype(np.float32) * 3
    tokens = rng.integers(0, VOCAB, size=(9, 25))
    tree, c = prune_dart_tree(logits, tokens, [0, 1, 2], stores[4], [2])
    assert len(c) == 25 + 8 * 20 * 25  # every level has more than 20 non-EOS candidates here
    assert len(tree) == 61
    check_invariants(tree, c, PruningConfig(), {2})
    assert_same((tree, c), prune_dart_tree_reference(logits, tokens, [0, 1, 2], stores[4], [2]))


# ---------------------------------------------------------------------------- edge sizes and ids
@pytest.mark.parametrize("rows", [0, 1, 2, 64, 65])
@pytest.mark.parametrize("k", [1, 7, 64, 65])
@pytest.mark.parametrize("store_key", [None, 3])
def test_edge_sizes_match_the_reference_and_leave_inputs_alone(stores, rows, k, store_key):
    # 0/1 levels, the 64/65 boundary in levels and in columns, odd k; the inputs are never written.
    rng = np.random.default_rng(rows * 100 + k)
    logits = (rng.normal(size=(rows, k)) * 2).astype(np.float32)
    tokens = rng.integers(0, VOCAB, size=(rows, k))
    logits_in, tokens_in = logits.copy(), tokens.copy()
    store = None if store_key is None else stores[store_key]
    cfg = PruningConfig(level_top_k=64, beam_width=3, budget=70)
    got = prune_dart_tree(logits, tokens, [0, 1], store, [2], cfg)
    assert_same(got, prune_dart_tree_reference(logits, tokens, [0, 1], store, [2], cfg))
    check_invariants(*got, cfg, {2})
    assert np.array_equal(logits, logits_in) and np.array_equal(tokens, tokens_in)


@pytest.mark.parametrize("backend", ["native", "python"])
def test_rows_without_columns_raise_the_same_error(backend):
    with pytest.raises(ValueError, match="no columns"):
        prune_dart_tree(np.zeros((2, 0), np.float32), np.zeros((2, 0), np.int64), [1], None, [], backend=backend)
    tree, c = prune_dart_tree(np.zeros((0, 0), np.float32), np.zeros((0, 0), np.int64), [1], None, [],
                              backend=backend)
    assert len(tree) == 1 and len(c) == 0


@pytest.mark.parametrize("backend", ["native", "python"])
def test_a_huge_beam_width_is_bounded_by_the_candidates(backend):
    # The beam never holds more than a level's candidates: a huge beam_width must not reserve for itself.
    logits = np.zeros((3, 4), np.float32)
    tokens = np.arange(12).reshape(3, 4)
    for beam_width in (10**9, 10**12, 2**62):
        tree, c = prune_dart_tree(logits, tokens, [1], None, [], PruningConfig(beam_width=beam_width, budget=10**9),
                                  backend=backend)
        assert len(c) == 4 + 16 + 64 and len(tree) == len(c) + 1


BAD_IDS = [-1, VOCAB, 2**32, 2**32 + 5, 2**63 - 1]


@pytest.mark.parametrize("backend", ["native", "python"])
@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("store_key", [None, 3])
def test_ids_outside_the_vocabulary_are_refused_by_both_backends(stores, backend, bad, store_key):
    # Without a table the native pruner once truncated ids to 32 bits (2**32 + 5 became 5).
    logits = np.zeros((2, 3), np.float32)
    tokens = np.array([[0, 1, 2], [3, bad, 4]])
    store = None if store_key is None else stores[store_key]
    vocab = VOCAB if store is None else None   # the table knows its vocabulary
    if bad == VOCAB and store is None:
        prune_dart_tree(logits, tokens, [1], store, [], backend=backend)   # no limit known: any uint32 id
    with pytest.raises(ValueError, match=rf"topk_tokens holds token id {bad}, outside the vocabulary \[0, {VOCAB}\)"):
        prune_dart_tree(logits, tokens, [1], store, [], vocab_size=vocab, backend=backend)
    if bad < 0 or bad >= 2**32:   # outside what any vocabulary can hold: refused even with no limit given
        with pytest.raises(ValueError, match=rf"token id {bad}, "):
            prune_dart_tree(logits, tokens, [1], store, [], backend=backend)
    with pytest.raises(ValueError, match=rf"context holds token id {bad}, "):
        prune_dart_tree(logits, np.zeros((2, 3), np.int64), [1, bad], store, [], vocab_size=vocab, backend=backend)


def test_the_native_binding_refuses_ids_it_cannot_hold():
    # Callers of the extension itself get the same refusal (never a truncated id).
    for bad in (-1, 2**32 + 5):
        with pytest.raises(ValueError, match="token id"):
            native.prune_dart_tree(np.zeros((1, 2), np.float32), np.array([[1, bad]]), np.array([1]), None,
                                   np.array([], np.int64), PruningConfig())


def test_the_native_binding_reads_the_pruning_config_whole():
    # The binding takes the PruningConfig itself (or a dict of its fields); the defaults live there only.
    from dataclasses import asdict

    rng = np.random.default_rng(3)
    logits = np.sort(rng.normal(size=(4, 6)).astype(np.float32), axis=1)[:, ::-1].copy()
    tokens = np.tile(np.arange(VOCAB, dtype=np.int64), (4, 1))
    cfg = PruningConfig(budget=5, beam_width=3, level_top_k=4)
    args = (logits, tokens, np.array([1]), None, np.array([], np.int64))
    by_object = native.prune_dart_tree(*args, cfg)
    by_dict = native.prune_dart_tree(*args, asdict(cfg))
    assert len(by_object["tree_tokens"]) == 6
    for key in by_object:
        assert np.array_equal(by_object[key], by_dict[key]), key
    partial = {k: v for k, v in asdict(cfg).items() if k != "budget"}
    with pytest.raises(ValueError, match="no field 'budget'"):
        native.prune_dart_tree(*args, partial)
