"""DART drafting one chain (drafters/chain.py, DartDrafter(shape="chain"), the ``dart_chain`` method): the chain our
engine verifies is the one the vLLM plugin drafts from the same head rows, a path of ``budget`` tokens (cut after an
EOS), its greedy answers are vanilla's, and bad settings are refused before anything drafts."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dart_core.config import GenerationConfig
from dart_core.drafters.chain import best_chain, best_chains, chain_pruning, context_from_tail
from dart_core.drafters.dart import DartDrafter
from dart_core.drafters.pruning import PruningConfig, TreeBuilder
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.integrations.vllm_plugin import ChainDrafter
from dart_core.models.heads.dart import new_head_for_target

PROMPTS = ["Write a Python function that returns the sum", "The quick brown fox", "What is 12 times 7?"]


class Recorder:
    """A drafter's proposals as the engine asks for them (the tree and the head's rows of each step)."""

    def __init__(self, inner):
        self.inner, self.proposals = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, context):
        p = self.inner.propose(context)
        self.proposals.append((list(context), p))
        return p


def path_tokens(tree) -> list[int]:
    """A one-path tree's drafted tokens (every node the child of the one before)."""
    assert list(tree.parents) == list(range(-1, len(tree) - 1)), "not a chain"
    return [int(t) for t in tree.tokens[1:]]


@pytest.mark.parametrize("with_store", [False, True])
@pytest.mark.parametrize("budget", [1, 3, 5, 60])
def test_the_engines_chain_is_the_plugins_and_its_answer_is_vanillas(tiny_llama, tiny_store, with_store, budget):
    t, store = tiny_llama, (tiny_store if with_store else None)
    cfg = GenerationConfig(max_new_tokens=24, max_length=96)
    plugin = ChainDrafter(store, t.eos_token_ids, PruningConfig())
    steps = 0
    for seed, init in enumerate(({}, {"init_lm_head_from_target": True, "init_layer_from_target": True})):
        head = new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=seed, **init)
        levels = min(head.config.draft_length + 1, budget)
        for prompt in PROMPTS:
            ids = t.tokenizer.encode(prompt, add_special_tokens=False)
            want = SpeculativeEngine(t).generate(ids, cfg).tokens
            drafter = Recorder(DartDrafter(head, store, t.eos_token_ids, PruningConfig(budget=budget),
                                           shape="chain"))
            assert SpeculativeEngine(t, drafter).generate(ids, cfg).tokens == want
            for context, p in drafter.proposals:
                rows = p.head_rows
                assert rows["token"].shape[0] == levels
                chain = list(plugin.chain(rows["logit"], rows["token"], context))
                eos = [i for i, tok in enumerate(chain) if tok in t.eos_token_ids]
                assert path_tokens(p.tree) == (chain[:eos[0] + 1] if eos else chain)
                assert int(p.tree.tokens[0]) == context[-1]
                node = np.asarray(p.candidates.node)          # the chain's candidates kept, pointing into it
                kept = np.flatnonzero(node >= 0)
                assert list(np.asarray(p.candidates.kept)) == list(node >= 0)
                assert [int(np.asarray(p.candidates.token)[i]) for i in kept] == \
                    [int(p.tree.tokens[n]) for n in node[kept]]
                assert sorted(node[kept]) == list(range(1, len(kept) + 1))
                steps += 1
    assert steps > 20


def test_a_chain_ends_at_its_first_eos(tiny_llama):
    t = tiny_llama
    eos = t.eos_token_ids[0]
    head = new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=0)
    drafter = DartDrafter(head, None, t.eos_token_ids, PruningConfig(budget=4), shape="chain")
    others = [x for x in range(t.vocab_size) if x not in t.eos_token_ids][:3]
    vals = np.array([[3.0, 1.0, 0.0]] * 4, dtype=np.float32)
    tokens = np.array([[others[0], others[1], others[2]], [eos, others[1], others[2]],
                       [others[2], others[1], others[0]], [others[1], others[0], others[2]]], dtype=np.int64)
    tree, _ = drafter._chain(vals, tokens, [5, 6], drafter._tree_config)
    assert path_tokens(tree) == [others[0], eos]
    # without an EOS it runs all four levels, each level's best (no N-gram term: by logit)
    tokens[1, 0] = others[2]
    tree, _ = drafter._chain(vals, tokens, [5, 6], drafter._tree_config)
    assert path_tokens(tree) == [others[0], others[2], others[2], others[1]]


def test_best_chain_edge_sizes(tiny_llama, tiny_store):
    """One level, one candidate a level, and a level whose parents were all EOS (its row's best stands in)."""
    t = tiny_llama
    builder = TreeBuilder(tiny_store, t.eos_token_ids)
    eos = t.eos_token_ids[0]
    one = chain_pruning(PruningConfig(), levels=1, draft_vocab=1)
    out, picked, cands = best_chain(builder, np.array([[0.5]], np.float32), np.array([[7]]), [3, 4], one)
    assert list(out) == [7] and list(picked) == [0] and len(cands.token) == 1
    cfg = chain_pruning(PruningConfig(), levels=2, draft_vocab=1)
    out, picked, _ = best_chain(builder, np.array([[0.5], [0.2]], np.float32), np.array([[eos], [9]]), [3, 4], cfg)
    assert list(out) == [eos, 9] and list(picked) == [0, -1]


def test_chain_refusals(tiny_llama):
    t = tiny_llama
    head = new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=0)
    with pytest.raises(ValueError, match="shape must be one of tree, chain"):
        DartDrafter(head, None, t.eos_token_ids, shape="path")
    with pytest.raises(ValueError, match="context_weight to 0"):
        DartDrafter(head, None, t.eos_token_ids, PruningConfig(budget=3, context_weight=0.5), shape="chain")
    # set later (the page's sliders call set_tree): refused at the next draft, before the head runs
    drafter = DartDrafter(head, None, t.eos_token_ids, PruningConfig(budget=3), shape="chain")
    drafter.set_tree(context_weight=0.5)
    ids = t.tokenizer.encode("The quick brown fox", add_special_tokens=False)
    with pytest.raises(ValueError, match="context_weight to 0"):
        SpeculativeEngine(t, drafter).generate(ids, GenerationConfig(max_new_tokens=4, max_length=64))


def random_batch(t, rng, B, L, k, T, eos_level=None):
    logits = (rng.normal(size=(B, L, k)) * 3).astype(np.float32)
    tokens = np.array([[rng.choice(t.vocab_size, k, replace=False) for _ in range(L)] for _ in range(B)],
                      dtype=np.int64).reshape(B, L, k)
    if eos_level is not None:     # a level whose every candidate is an EOS: nothing below it expands
        tokens[:, eos_level, :] = t.eos_token_ids[0]
    tails = rng.integers(0, t.vocab_size, (B, T))
    return logits, tokens, tails


@pytest.mark.parametrize("with_store", [False, True])
@pytest.mark.parametrize("B,L,k", [(0, 3, 25), (1, 1, 1), (1, 3, 25), (7, 4, 25), (5, 2, 3)])
def test_one_native_call_for_the_batch_is_the_reference_request_by_request(tiny_llama, tiny_store, with_store, B, L,
                                                                           k):
    t, store = tiny_llama, (tiny_store if with_store else None)
    rng = np.random.default_rng(B * 100 + L * 10 + k)
    T = 3
    native, python = TreeBuilder(store, t.eos_token_ids), TreeBuilder(store, t.eos_token_ids, "python")
    config = chain_pruning(PruningConfig(), L, k)
    for eos_level in (None, 0) if L > 1 else (None,):
        logits, tokens, tails = random_batch(t, rng, B, L, min(k, t.vocab_size), T, eos_level)
        if B > 1:
            tails[0, :-1] = -1          # the root only
            tails[1, 0] = -1            # the known tokens after the unknown one
        got = best_chains(native, logits, tokens, tails, config)
        assert got.shape == (B, L) and got.dtype == np.int64
        assert np.array_equal(got, best_chains(python, logits, tokens, tails, config))
        for b in range(B):               # and each row is best_chain of that request on the native pruner
            want = best_chain(native, logits[b], tokens[b], context_from_tail(tails[b]), config)[0]
            assert list(got[b]) == list(want)
        if eos_level == 0 and B:          # level 1 has no candidates: its row's best stands in
            assert list(got[:, 1]) == [int(tokens[b, 1, np.argmax(logits[b, 1])]) for b in range(B)]


def test_the_batch_call_refuses_bad_input_naming_it(tiny_llama, tiny_store):
    t = tiny_llama
    native = TreeBuilder(tiny_store, t.eos_token_ids)
    config = chain_pruning(PruningConfig(), 2, 4)
    logits, tokens, tails = random_batch(t, np.random.default_rng(0), 3, 2, 4, 3)
    bad_tail = tails.copy()
    bad_tail[2, -1] = -1
    with pytest.raises(ValueError, match="request 2's tail ends with an unknown token"):
        best_chains(native, logits, tokens, bad_tail, config)
    with pytest.raises(ValueError, match=r"tails must be \[B, T\]"):
        best_chains(native, logits, tokens, tails[:2], config)
    with pytest.raises(ValueError, match=r"\[B, L, k\]"):
        best_chains(native, logits[:, :, :3], tokens, tails, config)
    with pytest.raises(ValueError, match=r"\[B, L, k\]"):
        best_chains(native, logits[:, :0], tokens[:, :0], tails, config)
    far = tails.copy()
    far[1, 0] = int(tiny_store.vocab_size)
    with pytest.raises(ValueError, match="outside the table's vocabulary"):
        best_chains(native, logits, tokens, far, config)
    with pytest.raises(ValueError, match="python backend goes request by request"):
        TreeBuilder(None, t.eos_token_ids, "python").chains(logits, tokens, tails, config)
