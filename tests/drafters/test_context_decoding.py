"""DART + context, EAGLE-3 + context and the switching hybrid as a user runs them: greedy answers identical to
vanilla's (tiny targets in float32; the bundled model in float32 and bfloat16 on prompts that copy), the
sampling distribution unchanged with context candidates in the tree (chi-square), and the sources recorded."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dart_core.config import GenerationConfig
from dart_core.drafters import PromptLookupDrafter
from dart_core.drafters.dart import DartDrafter
from dart_core.drafters.eagle3 import Eagle3Drafter, Eagle3TreeConfig
from dart_core.drafters.hybrid import SwitchDrafter
from dart_core.drafters.pruning import CONTEXT_WEIGHT, PruningConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.engine.protocol import AcceptedStep
from dart_core.engine.trace import SOURCE_CONTEXT
from dart_core.models.heads.dart import new_head_for_target
from dart_core.models.heads.eagle3 import new_eagle3_head_for_target
from sampling_checks import chi_square_p, exact_marginals


# prompts whose answers the context can continue: the tiny targets repeat themselves, and so do the prompts
PROMPTS = [[10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11], [5, 6, 7, 8, 9, 20, 21, 5, 6, 7], [3, 4, 5, 3, 4]]


def drafters(t, budget=12):
    dart = DartDrafter(new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=5),
                       None, t.eos_token_ids, PruningConfig(budget=budget, context_weight=1.0), name="dart_context")
    eagle = Eagle3Drafter(new_eagle3_head_for_target(t, seed=2),
                          Eagle3TreeConfig(total_token=budget, depth=2, top_k=3, context_weight=CONTEXT_WEIGHT),
                          name="eagle3_context")
    plain = DartDrafter(new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=5),
                        None, t.eos_token_ids, PruningConfig(budget=budget))
    hybrid = SwitchDrafter(plain, PromptLookupDrafter(), vocab_size=t.vocab_size)
    return {"dart_context": dart, "eagle3_context": eagle, "hybrid": hybrid}


@pytest.mark.parametrize("model", ["llama", "qwen3"])
def test_greedy_output_identical_to_vanilla_with_context(tiny_llama_qwen3, model):
    """Every context method's answers equal vanilla's token for token. (A random tiny target never copies its
    prompt, so the context's candidates are drafted here but rarely accepted; the bundled model's test below has
    them accepted.)"""
    t = tiny_llama_qwen3[model]
    vanilla = SpeculativeEngine(t)
    cfg = GenerationConfig(max_new_tokens=40, max_length=120)
    for name, d in drafters(t).items():
        engine = SpeculativeEngine(t, d)
        context_nodes = 0
        for p in PROMPTS:
            a, b = engine.generate(p, cfg), vanilla.generate(p, cfg)
            assert a.tokens == b.tokens, f"{name} differs from vanilla on {p}"
            for tr in a.traces:
                if tr.candidates is not None and len(tr.candidates.source):
                    context_nodes += int((np.asarray(tr.candidates.source) & SOURCE_CONTEXT).astype(bool).sum())
        if name != "hybrid":     # the hybrid switches to lookup only after a 3-token match, which never comes here
            assert context_nodes > 0, f"{name} drafted nothing from the context on repeating prompts"
    # the page says where each drafted node came from (tree hover and score scatter)
    from dart_core.ui import viz_tree
    tr = next(tr for tr in a.traces if len(tr.tree) > 1 and tr.candidates is not None)
    d = viz_tree.node_details(tr, 1)
    assert d["source"] in ("head", "context", "corpus", "several")
    hover = " ".join(t.hovertext[0] for t in viz_tree.score_scatter(tr).data if t.hovertext)
    assert "from: " in hover


def test_the_head_sits_out_while_the_answer_copies(tiny_llama_qwen3):
    """With the committed text's last COPY_MATCH (3) tokens seen before, the context drafts alone and the head's features
    wait; at the next step without such a match the head catches up on every waiting position."""
    t = tiny_llama_qwen3["llama"]
    d = drafters(t)["dart_context"]
    width = d.head.fc.weight.shape[1]
    prompt = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4]
    d.begin(prompt, torch.zeros(len(prompt), width))
    p = d.propose(prompt + [5])                          # 2 3 4 5 occurred before: the answer is copying
    assert d.last_head_skipped and d.head_skipped == 1 and p.draft_forward_s < 1e-3
    assert d.waiting_positions == len(prompt)           # nothing went through the head
    kids = [int(p.tree.tokens[i]) for i in range(1, len(p.tree)) if p.tree.parents[i] == 0]
    assert kids == [6] and max(p.tree.depths) >= 2       # the copied continuation, past one level
    assert all(s & SOURCE_CONTEXT and not s & 1 for s in p.candidates.source)   # from the context alone
    d.observe(AcceptedStep([5], 8, torch.zeros(1, width)))
    q = d.propose(prompt + [5, 8])                       # 5 8 never occurred: the head drafts again
    assert not d.last_head_skipped and d.waiting_positions == 0 and len(q.tree) > 1


def test_sampling_with_context_candidates_keeps_the_target_distribution(bundled_fp32, monkeypatch):
    """Chi-square goodness of fit of answer tokens 1 and 2 on the bundled model, which copies the sentence it is
    asked to repeat, with DART + context drafting (p > 1e-3 per position; fixed seeds, reproducible)."""
    from dart_core.loading import bundled_head_dir, open_ngram
    from dart_core.models.heads.dart import load_dart_head
    from dart_core.models.templates import encode_chat, get_template

    t = bundled_fp32
    monkeypatch.setattr(t, "eos_token_ids", ())
    cfg = GenerationConfig(max_new_tokens=3, max_length=256, temperature=0.7, top_k=8)
    prompt = encode_chat(t.tokenizer, get_template(t.template_name), [{
        "role": "user", "content": "Repeat this sentence exactly:\nThe old lighthouse keeper painted the door blue."}])
    p1, p2 = exact_marginals(t, prompt, cfg)
    head = load_dart_head(bundled_head_dir(), t)
    d = DartDrafter(head, open_ngram(None, t.tokenizer), (), PruningConfig(budget=6, context_weight=CONTEXT_WEIGHT))
    engine = SpeculativeEngine(t, d)
    V = t.vocab_size
    c1, c2 = np.zeros(V), np.zeros(V)
    from_context = 0
    n = 600
    for seed in range(n):
        cfg.seed = seed
        out = engine.generate(prompt, cfg)
        c1[out.tokens[1]] += 1
        c2[out.tokens[2]] += 1
        tr = out.traces[0]
        from_context += any(tr.candidates.source_of_node(i) & SOURCE_CONTEXT for i in tr.accepted_nodes[1:])
    assert from_context > 0.05 * n, "context candidates should be accepted, or the test checks only the head's"
    assert chi_square_p(c1, p1) > 1e-3
    assert chi_square_p(c2, p2) > 1e-3


COPY_PROMPTS = [
    "Translate the following German text into English.\n\nEin Hund rennt durch den Park. Zwei Kinder spielen "
    "mit einem roten Ball am Strand.",
    "Read the passage and answer the question.\n\nThe Amazon River in South America is the largest river by "
    "discharge volume of water in the world. The river system originates in the Andes Mountains of Peru and "
    "travels through Ecuador, Colombia, Venezuela, Bolivia and Brazil before emptying into the Atlantic Ocean.\n\n"
    "Question: Which mountains does the Amazon river system originate in, and which countries does it travel "
    "through?",
]


@pytest.mark.bundled
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_context_methods_on_the_bundled_model_equal_vanilla_and_copy(dtype, bundled_fp32, bundled_bf16):
    from dart_core.loading import bundled_head_dir, open_ngram
    from dart_core.models.heads.dart import load_dart_head
    from dart_core.models.templates import encode_chat, get_template

    t = bundled_fp32 if dtype == "float32" else bundled_bf16
    head = load_dart_head(bundled_head_dir(), t)
    store = open_ngram(None, t.tokenizer)
    dart = DartDrafter(head, store, t.eos_token_ids, PruningConfig(budget=6, context_weight=CONTEXT_WEIGHT))
    engine, vanilla = SpeculativeEngine(t, dart), SpeculativeEngine(t)
    cfg = GenerationConfig(max_new_tokens=48, max_length=1024)
    template = get_template(t.template_name)
    copied = 0
    for p in COPY_PROMPTS:
        ids = encode_chat(t.tokenizer, template, [{"role": "user", "content": p}])
        a, b = engine.generate(ids, cfg), vanilla.generate(ids, cfg)
        assert a.tokens == b.tokens, f"DART + context differs from vanilla ({dtype}) on {p[:40]!r}"
        copied += sum(bool(tr.candidates.source_of_node(i) & SOURCE_CONTEXT)
                      for tr in a.traces if tr.candidates is not None for i in tr.accepted_nodes[1:])
    assert copied > 0, "the answers copy from their prompts, yet no accepted draft came from the context"
    # the other two context methods on the same prompts: EAGLE-3 + context and the switching hybrid
    from dart_core.models.heads.eagle3 import load_eagle3_for_target
    eagle = Eagle3Drafter(load_eagle3_for_target(t, None, None),
                          Eagle3TreeConfig(total_token=6, depth=2, top_k=2, context_weight=CONTEXT_WEIGHT))
    hybrid = SwitchDrafter(DartDrafter(head, store, t.eos_token_ids, PruningConfig(budget=4)),
                           PromptLookupDrafter(), vocab_size=int(store.vocab_size))
    for d in (eagle, hybrid):
        e = SpeculativeEngine(t, d)
        for p in COPY_PROMPTS:
            ids = encode_chat(t.tokenizer, template, [{"role": "user", "content": p}])
            assert e.generate(ids, cfg).tokens == vanilla.generate(ids, cfg).tokens, (type(d).__name__, dtype)
    assert hybrid.lookup_steps > 0 and hybrid.head_steps > 0


def test_automatic_trees_keep_a_choice_per_regime(tiny_llama_qwen3):
    """Under automatic trees DART + context's copy steps (the context drafts alone) and head steps each have their
    own acceptance model and tree choice; a copy step is priced without a head forward; answers equal vanilla's."""
    from dart_core.sizing.auto import AutoTree
    from dart_core.sizing.acceptance import AcceptanceModel
    from dart_core.sizing.costs import CostModel, VerifyCurve

    t = tiny_llama_qwen3["llama"]
    d = drafters(t)["dart_context"]
    costs = CostModel(VerifyCurve([1, 64], [0.001, 0.002]), 0.0)
    auto = AutoTree(d, costs, AcceptanceModel.for_head_dir(None))
    head_model = auto.acceptance
    width = d.head.fc.weight.shape[1]
    prompt = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4]
    auto.begin(prompt, torch.zeros(len(prompt), width))
    assert d.regime(prompt + [5]) == "copy" and d.regime(prompt + [8]) == "head"
    auto.propose(prompt + [5])                        # a copy step: the copy regime's own model and choice
    assert auto.regime_steps["copy"] == 1 and auto.acceptance is not head_model
    if not auto.last_used.plain:
        assert d.last_head_skipped
    d.observe(AcceptedStep([5], 8, torch.zeros(1, width)))
    auto.propose(prompt + [5, 8])                     # a head step: back to the head's
    assert auto.acceptance is head_model and auto.regime_steps["head"] == 1
    # end to end under automatic trees (a prompt the context can continue)
    cfg = GenerationConfig(max_new_tokens=30, max_length=160)
    engine = SpeculativeEngine(t, AutoTree(drafters(t)["dart_context"], costs, AcceptanceModel.for_head_dir(None)))
    for p in PROMPTS:
        assert engine.generate(p * 3, cfg).tokens == SpeculativeEngine(t).generate(p * 3, cfg).tokens


def test_eagle3_context_keeps_a_choice_per_regime(tiny_llama_qwen3):
    """EAGLE-3 + context's steps are "copy" or "head" by the same rule as DART + context's (its head drafts in both):
    the published tree has one regime, and under automatic trees each regime has its own acceptance model and
    choice; answers equal vanilla's."""
    from dart_core.sizing.auto import AutoTree
    from dart_core.sizing.acceptance import AcceptanceModel
    from dart_core.sizing.costs import CostModel, VerifyCurve

    t = tiny_llama_qwen3["llama"]
    d = drafters(t)["eagle3_context"]
    prompt = [1, 2, 3, 4, 5, 6, 7, 9, 2, 3, 4]
    d.live.begin(prompt)                              # what begin() does for the context (the head needs features)
    assert d.regime(prompt + [5]) == "copy" and d.regime(prompt + [5, 8]) == "head"
    published = Eagle3Drafter(new_eagle3_head_for_target(t, seed=2), Eagle3TreeConfig(total_token=12, depth=2, top_k=3))
    published.live.begin(prompt)
    assert published.regime(prompt + [5]) == "head"
    costs = CostModel(VerifyCurve([1, 64], [0.001, 0.002]), 0.0)
    cfg = GenerationConfig(max_new_tokens=30, max_length=160)
    auto = AutoTree(drafters(t)["eagle3_context"], costs, AcceptanceModel.for_head_dir(None))
    engine = SpeculativeEngine(t, auto)
    for p in PROMPTS:
        assert engine.generate(p * 3, cfg).tokens == SpeculativeEngine(t).generate(p * 3, cfg).tokens
    assert sum(auto.regime_steps.values()) > 0        # the chooser asked the drafter its regime at every step


def _graft_exhaustive(drafter, context, tok, par, lp, depth, total_token):
    """Reference for Eagle3Drafter._graft_context: every expanded node's context children, and theirs, to the
    tree's depth (what the drafter did before it bounded the expansion); scores only."""
    from dart_core.ngram.live import mix_weight
    tc, index = drafter._tree_config, drafter.live.index
    max_depth = total_token - 1
    tok, par, depth, lp = list(map(int, tok)), list(map(int, par)), list(map(int, depth)), list(map(float, lp))
    kids = {}
    for c, p in enumerate(par):
        kids.setdefault(p, []).append(c)
    score = [0.0] * len(tok)
    tail = [int(t) for t in context[-index.max_order:]]
    todo = [-1] + [p for p in sorted(kids) if p >= 0]
    for p in todo:                                    # grows as the context's own children are added
        path, c = [], p
        while c >= 0:
            path.append(tok[c])
            c = par[c]
        ctx = np.asarray((tail + path[::-1])[-index.max_order:], dtype=np.int64)
        base = 0.0 if p < 0 else score[p]
        matched, _, conts, _ = index.continuations(ctx, tc.context_top_k)
        lam = mix_weight(int(matched), tc.context_weight)
        if lam == 0.0:
            for c in kids.get(p, []):
                score[c] = base + lp[c]
            continue
        d = (0 if p < 0 else depth[p]) + 1
        have = {tok[c] for c in kids.get(p, [])}
        for t in ([int(t) for t in conts.tolist() if int(t) not in have] if d <= max_depth else []):
            kids.setdefault(p, []).append(len(tok))
            tok.append(t); par.append(p); depth.append(d); lp.append(-np.inf); score.append(0.0)
            todo.append(len(tok) - 1)
        children = kids.get(p, [])
        p_ctx, _ = index.query(ctx, np.asarray([tok[c] for c in children], dtype=np.int64))
        for c, pc in zip(children, p_ctx.tolist()):
            head_p = float(np.exp(lp[c])) if lp[c] > -np.inf else 0.0
            score[c] = base + min(0.0, float(np.log((1.0 - lam) * head_p + lam * pc + 1e-30)))
    return np.asarray(score)


@pytest.mark.parametrize("total_token", [1, 2, 5, 9, 60])
def test_eagle3_context_graft_is_bounded_and_keeps_the_best_candidates(tiny_llama_qwen3, total_token):
    """On text where every suffix the index keeps was followed by each of three tokens, the context's own children
    are expanded only while they could be kept: the pool stays within the head's candidates plus top_k per kept
    node, where expanding all of them to the tree's depth grows as 3 ** depth (2,625 candidates at 9 nodes, 11
    million at 17); and the kept candidates' scores are the best total_token - 1 of that exhaustive expansion."""
    t = tiny_llama_qwen3["llama"]
    rng = np.random.default_rng(0)
    context = [int(x) for x in rng.integers(10, 13, size=6000)]    # 3 tokens in random order: every suffix branches
    d = Eagle3Drafter(new_eagle3_head_for_target(t, seed=2),
                      Eagle3TreeConfig(total_token=max(total_token, 2), depth=2, top_k=2, context_weight=1.0,
                                       context_top_k=4), name="eagle3_context")
    d.live.begin(context)
    d.live.sync(context)
    # the head's candidates: two at depth 1, two under the first (log-probs of a plausible head)
    tok, par = np.array([10, 11, 12, 13]), np.array([-1, -1, 0, 0])
    lp, depth = np.log(np.array([0.5, 0.2, 0.4, 0.3])), np.array([1, 1, 2, 2])
    got = d._graft_context(context, tok, par, lp, depth, total_token)
    keep = total_token - 1
    assert len(got[0]) <= len(tok) + 4 * (keep + 3)
    if total_token > 9:
        return                                       # the reference would not finish
    ref = _graft_exhaustive(d, context, tok, par, lp, depth, total_token)
    assert sorted(got[3].tolist(), reverse=True)[:keep] == pytest.approx(sorted(ref.tolist(), reverse=True)[:keep])
    tree, _ = d._keep(context + [int(context[-1])], got, total_token)
    assert len(tree) == min(total_token, len(got[0]) + 1)
