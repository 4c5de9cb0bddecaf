"""The chooser's offline replay (dart_core/sizing/replay.py, python -m dart_core.bench.regret): the recorded answer is
vanilla's, a fixed tree's walk over the record takes exactly the steps a real run of that tree takes, the chooser's
walk emits every token once, and the CLI refuses what it cannot replay."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dart_core.config import GenerationConfig
from dart_core.drafters import PromptLookupDrafter
from dart_core.drafters.dart import DartDrafter
from dart_core.drafters.eagle3 import Eagle3Drafter, Eagle3TreeConfig
from dart_core.drafters.pruning import PruningConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.engine.tree import DraftTree
from dart_core.models.heads.dart import new_head_for_target
from dart_core.models.heads.eagle3 import new_eagle3_head_for_target
from dart_core.sizing.costs import CostModel, DraftCost, VerifyCurve
from dart_core.sizing.replay import FrozenCosts, follow, key_of, record, step_seconds, walk_chooser, walk_fixed
from dart_core.sizing.spaces import PLAIN, tree_space

PROMPTS = [[10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11], [5, 6, 7, 8, 9, 20, 21, 5, 6, 7], [3]]
MAX_NEW = 30


def dart(t, context_weight=0.0, budget=8):
    head = new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=5)
    return DartDrafter(head, None, t.eos_token_ids, PruningConfig(budget=budget, context_weight=context_weight),
                       name="dart_context" if context_weight else "dart")


def costs():
    c = CostModel(VerifyCurve([1, 2, 5, 9, 17, 33, 65], [10e-3, 10.5e-3, 11e-3, 12e-3, 14e-3, 18e-3, 26e-3]), 0.4e-3)
    for name in ("dart", "dart_context", "prompt_lookup"):
        d = c.draft_cost(name)
        for work, s in (((1, 4, 20), 1.2e-3), ((1, 12, 80), 1.8e-3), ((0, 0, 8), 0.1e-3), ((1, 30, 200), 3e-3)):
            d.add(work, s)
    return c


def test_follow_walks_the_answer_through_the_tree():
    tree = DraftTree.from_parents([7, 1, 2, 3, 4], [-1, 0, 0, 2, 3])
    assert follow(tree, [2, 3, 4, 9]) == [0, 2, 3, 4]
    assert follow(tree, [2, 3]) == [0, 2, 3]           # the answer ends inside the tree
    assert follow(tree, [1, 3]) == [0, 1]
    assert follow(tree, [5]) == [0]
    assert follow(tree, []) == [0]
    assert follow(DraftTree.root_only(7), [1, 2]) == [0]    # a root-only tree


@pytest.mark.parametrize("context_weight", [0.0, 1.0])
def test_a_fixed_trees_walk_is_the_real_run(tiny_llama, context_weight):
    """Over the record, each fixed budget takes the steps, with the accepted lengths, that the engine takes running
    that budget; the recorded answer is vanilla's."""
    t = tiny_llama
    budgets = (1, 3, 8)
    recorder = dart(t, context_weight)
    choices = [c for c in tree_space(recorder) if not c.plain and c.settings["budget"] in budgets]
    cfg = GenerationConfig(max_new_tokens=MAX_NEW, max_length=120)
    vanilla = SpeculativeEngine(t)
    cm = costs()
    for prompt in PROMPTS:
        log = record(t, {"d": recorder}, prompt, MAX_NEW, "k", choices={"d": choices})["d"]
        assert log.answer == vanilla.generate(prompt, cfg).tokens
        assert len(log.positions) == len(log.answer) - 1
        for c in choices:
            real = SpeculativeEngine(t, dart(t, context_weight, budget=c.settings["budget"])).generate(prompt, cfg)
            w = walk_fixed([log], c, cm, "dart")
            assert w.steps == real.stats.steps, (prompt, c.label)
            assert w.tokens == len(real.tokens) - 1 == log.decode_tokens
            lengths = [len(tr.accepted_nodes) for tr in real.traces]
            i = 0
            for n in lengths:     # the walk's path: each step's accepted length at its position
                d = log.positions[i].trees[key_of(c)]
                assert min(len(d.accepted), len(log.positions) - i) == n
                i += n
    assert recorder.tree_settings()["budget"] == 8       # the recorder's own settings come back


def eagle3(t, context_weight=0.0, **tree):
    tc = Eagle3TreeConfig(**{"total_token": 8, "depth": 2, "top_k": 2, "context_weight": context_weight, **tree})
    return Eagle3Drafter(new_eagle3_head_for_target(t, seed=2), tc,
                         name="eagle3_context" if context_weight else "eagle3")


@pytest.mark.parametrize("context_weight", [0.0, 1.0])
def test_eagle3_settings_are_replayed_from_one_head_state(tiny_llama, context_weight):
    """EAGLE-3 drafts every setting at a position from one expansion per top-k (the head rewound between them): each
    fixed setting's
    walk takes the steps, with the accepted lengths, that the engine takes running it, every tree is the one a fresh
    run drafts there, and the recorder is left as one proposal leaves it (its answer is vanilla's)."""
    t = tiny_llama
    recorder = eagle3(t, context_weight)
    space = [c for c in tree_space(recorder) if not c.plain]
    choices = [c for c in space if (c.settings["depth"], c.settings["top_k"]) in ((0, 1), (1, 2), (2, 3))][::3]
    assert len({(c.settings["depth"], c.settings["top_k"]) for c in choices}) == 3
    cfg = GenerationConfig(max_new_tokens=MAX_NEW, max_length=120)
    vanilla = SpeculativeEngine(t)
    for prompt in PROMPTS[:2]:
        log = record(t, {"e": recorder}, prompt, MAX_NEW, "k", choices={"e": choices})["e"]
        assert log.answer == vanilla.generate(prompt, cfg).tokens
        for c in choices:
            real = SpeculativeEngine(t, eagle3(t, context_weight, **c.settings)).generate(prompt, cfg)
            assert walk_fixed([log], c, costs(), "eagle3").steps == real.stats.steps, (prompt, c.label)
            i = 0
            for trace in real.traces:   # the recorded tree at each of the run's positions is the run's tree
                d = log.positions[i].trees[key_of(c)]
                if len(log.positions) - i > c.max_depth:    # (near the end the engine cuts its trees short)
                    assert d.tokens.tolist() == trace.tree.tokens.tolist(), (prompt, c.label, i)
                    assert d.parents.tolist() == trace.tree.parents.tolist()
                i += len(trace.accepted_nodes)
    assert recorder.tree_settings()["total_token"] == 8


def test_the_chooser_walk_emits_each_token_once_and_prices_its_steps(tiny_llama):
    t = tiny_llama
    d = dart(t, 1.0)
    logs = [record(t, {"d": d}, p, MAX_NEW, "k")["d"] for p in PROMPTS[:2]]
    cm = costs()
    total, per = walk_chooser(logs, d, cm)
    assert [w.tokens for w in per] == [log.decode_tokens for log in logs]
    assert total.tokens == sum(log.decode_tokens for log in logs)
    assert sum(total.chosen.values()) == total.steps
    plain = walk_fixed(logs, PLAIN, cm, d.name)
    assert plain.steps == plain.tokens == total.tokens
    assert plain.seconds == pytest.approx(plain.steps * (cm.verify_s(1) + cm.commit_s))
    # the walks read the cost model, never refresh it
    assert cm.verify_s(9) == pytest.approx(12e-3)
    assert FrozenCosts.of(cm).save() is False


def test_prompt_lookup_is_replayed_setting_by_setting(tiny_llama):
    t = tiny_llama
    log = record(t, {"pl": PromptLookupDrafter()}, PROMPTS[0], MAX_NEW, "k")["pl"]
    for c in tree_space(PromptLookupDrafter()):
        if c.plain:
            continue
        real = SpeculativeEngine(t, _lookup(c.settings["num_pred_tokens"])).generate(
            PROMPTS[0], GenerationConfig(max_new_tokens=MAX_NEW, max_length=120))
        assert walk_fixed([log], c, costs(), "prompt_lookup").steps == real.stats.steps, c.label


def _lookup(n):
    d = PromptLookupDrafter()
    d.set_tree(num_pred_tokens=n, max_tree_nodes=n + 1)
    return d


def test_step_price_and_bad_input(tiny_llama):
    cm = costs()
    assert step_seconds(cm, "dart", 1, (0, 0, 0)) == pytest.approx(cm.verify_s(1) + cm.commit_s)
    assert step_seconds(cm, "dart", 5, (1, 4, 20)) > step_seconds(cm, "dart", 5, (0, 0, 0))
    assert step_seconds(cm, "unknown", 5, (1, 4, 20)) == pytest.approx(cm.verify_s(5) + cm.commit_s)
    cm.verify.key_s, cm.verify.key_node_s = 1e-6, 0.5e-6        # a step is priced at the request's length
    assert step_seconds(cm, "dart", 5, (0, 0, 0), 2064) == pytest.approx(
        step_seconds(cm, "dart", 5, (0, 0, 0)) + 2000 * (1e-6 + 5 * 0.5e-6))
    d = dart(tiny_llama)
    with pytest.raises(ValueError, match="budgets >= 1"):
        d.propose_each([1, 2], [0, 2])
    with pytest.raises(ValueError, match="max_new_tokens"):
        record(tiny_llama, {"d": d}, [1, 2], 0)
    with pytest.raises(ValueError, match="empty"):
        record(tiny_llama, {"d": d}, [], 4)
    with pytest.raises(TypeError, match="no tree settings"):
        record(tiny_llama, {"x": object()}, [1, 2], 4)


def test_a_stateful_drafter_without_a_rewind_is_refused(tiny_llama):
    class NoRewind:
        needs_aux, tree_kind, name = True, "eagle3", "x"

    from dart_core.sizing.replay import _proposals
    with pytest.raises(TypeError, match="has no propose_each"):
        _proposals(NoRewind(), [1, 2], [])


def test_regret_cli_refuses_what_it_cannot_replay(capsys):
    from dart_core.bench.regret import main
    with pytest.raises(SystemExit) as e:
        main(["--questions", "x.jsonl", "--methods", "hybrid"])
    assert e.value.code == 2
    assert "not replayed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--questions", "x.jsonl", "--methods", "dart", "--max-new-tokens", "1"])
    assert "--max-new-tokens must be >= 2" in capsys.readouterr().err
