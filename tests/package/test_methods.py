"""dart_core.methods, the one engine builder: every method it knows builds an engine whose greedy answer is vanilla's,
the knob values of the page, the flags and the API become one tree request, and what cannot be built says why."""
import argparse
from types import SimpleNamespace

import pytest
import torch

from dart_core.config import ConfigError, GenerationConfig
from dart_core.drafters.eagle3 import Eagle3TreeConfig
from dart_core.drafters.pruning import CONTEXT_WEIGHT, PruningConfig
from dart_core.methods import (METHODS, Parts, TreeRequest, build_drafter, build_engine, make_drafter, tree_config,
                               tree_request)
from dart_core.models.heads.dart import new_head_for_target
from dart_core.models.heads.eagle3 import new_eagle3_head_for_target
from dart_core.sizing.auto import AutoTree
from dart_core.sizing.costs import CostModel, VerifyCurve
from dart_core.ui.session import RunSettings

PROMPT = "The cat sat on the mat. The cat sat on the"


@pytest.fixture(scope="module")
def parts(tiny_llama):
    draft_ids = torch.arange(0, tiny_llama.vocab_size, 2)
    return Parts(dart_head=new_head_for_target(tiny_llama, draft_ids=draft_ids, draft_length=4, seed=3),
                 eagle3_head=new_eagle3_head_for_target(tiny_llama, draft_ids=draft_ids, seed=3))


def costs():
    return CostModel(VerifyCurve([1, 2, 9, 65], [1e-3, 1.05e-3, 1.3e-3, 3e-3]), 0.0)


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("auto", [False, True])
def test_every_method_builds_an_engine_whose_greedy_answer_is_vanillas(tiny_llama, parts, name, auto):
    ids = tiny_llama.tokenizer.encode(PROMPT, add_special_tokens=False)
    cfg = GenerationConfig(max_new_tokens=16, max_length=96)
    want = build_engine(tiny_llama, "vanilla").generate(ids, cfg).tokens
    request = TreeRequest({} if METHODS[name].kind is None else
                          {"top_k" if METHODS[name].kind == "eagle3" else "budget": 4}, auto=auto)
    engine = build_engine(tiny_llama, name, parts, request, costs=costs())
    assert engine.name == name
    assert engine.generate(ids, cfg).tokens == want
    drafter = engine.drafter
    if name == "vanilla":
        assert drafter is None
    elif auto and name != "hybrid":
        assert isinstance(drafter, AutoTree)


def test_the_methods_base_trees(tiny_llama, parts):
    """The paper's pruning and the published EAGLE-3 tree; the *_context methods with the live context at
    CONTEXT_WEIGHT; a request's fields go over the base, unset ones keep it."""
    assert tree_config("dart") == PruningConfig()
    assert tree_config("dart_context") == PruningConfig(context_weight=CONTEXT_WEIGHT)
    assert tree_config("eagle3") == Eagle3TreeConfig()
    assert tree_config("eagle3_context").context_weight == CONTEXT_WEIGHT
    assert tree_config("prompt_lookup") is None and tree_config("vanilla") is None
    assert tree_config("dart_context", TreeRequest({"budget": 7})) == PruningConfig(budget=7,
                                                                                   context_weight=CONTEXT_WEIGHT)
    drafter = make_drafter(tiny_llama, "dart_no_ngram", Parts(dart_head=parts.dart_head, ngram=object()))
    assert drafter.store is None       # the ablation never reads a table, even one that was loaded


def test_one_translation_from_knob_values_to_a_tree_request():
    """The page's RunSettings, argparse's namespace and a plain mapping give the same request."""
    values = dict(budget=5.0, beam_width=None, context_weight=0.25, eagle3_total_token=9, eagle3_depth=None)
    page = RunSettings(tree="auto", budget=5, context_weight=0.25, eagle3_total_token=9)
    for source in (values, SimpleNamespace(**values), page):
        dart = tree_request("dart", source, "auto")
        assert dart.overrides == {"budget": 5, "context_weight": 0.25} and dart.auto
        assert isinstance(dart.overrides["budget"], int)     # a slider's float count becomes an int
        assert dart.held == {"budget": 5}                   # a size knob that is set is held
        e3 = tree_request("eagle3", source, "fixed")
        assert e3.overrides == {"total_token": 9} and not e3.auto and e3.held == {}
    assert page.tree_overrides("dart") == {"budget": 5, "context_weight": 0.25}
    assert page.fixed_sizes("eagle3") == {"total_token": 9}
    assert tree_request(None, values, "auto") == TreeRequest(auto=True)
    with pytest.raises(ConfigError, match="tree mode 'sometimes'"):
        tree_request("dart", values, "sometimes")


def test_what_cannot_be_built_says_why(tiny_llama, parts):
    with pytest.raises(ConfigError, match="unknown method 'medusa'.*dart_context"):
        build_engine(tiny_llama, "medusa", parts)
    with pytest.raises(ConfigError, match="EAGLE-3 needs eagle3_head, which was not loaded"):
        build_engine(tiny_llama, "eagle3", Parts(dart_head=parts.dart_head))
    with pytest.raises(ConfigError, match="DART tree settings: .*budget"):
        build_engine(tiny_llama, "dart", parts, TreeRequest({"budget": -1}))
    with pytest.raises(ConfigError, match="EAGLE-3 tree settings"):
        build_engine(tiny_llama, "eagle3", parts, TreeRequest({"no_such_field": 1}))
    with pytest.raises(ConfigError, match="automatic trees need the target's cost model"):
        build_engine(tiny_llama, "dart", parts, TreeRequest(auto=True))
    with pytest.raises(ConfigError, match="build_drafter"):
        make_drafter(tiny_llama, "hybrid", parts)


def test_the_benchmark_keeps_its_context_weight_rule():
    """--context-weight is DART + context's: the paper's DART (and the hybrid's) never take it; EAGLE-3 + context takes
    it when --eagle3-context-weight is unset, so both heads read the live context alike."""
    from dart_core.bench.methods import _tree
    args = argparse.Namespace(context_weight=0.3, eagle3_context_weight=None, budget=None, tree="fixed")
    assert "context_weight" not in _tree("dart", args).overrides
    assert "context_weight" not in _tree("hybrid", args).overrides
    assert _tree("dart_context", args).overrides["context_weight"] == 0.3
    assert _tree("eagle3_context", args).overrides["context_weight"] == 0.3
    args.eagle3_context_weight = 0.8
    assert _tree("eagle3_context", args).overrides["context_weight"] == 0.8
