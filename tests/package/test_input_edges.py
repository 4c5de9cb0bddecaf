"""Inputs at the edges of what every entry offers: each tree knob at both ends of its range (dart_core.presets:
the sliders, RunSettings, the configs, the CLI flags), DART budget 0 (no draft), tiny temperatures (the
greedy limit) and prompts that are not valid Unicode text. Tiny random models only."""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import app  # noqa: E402
from dart_core.page.controls import SETTING_NAMES  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402
from dart_core.api import DartModel, dart_generate  # noqa: E402
from dart_core.page.engines import EngineFactory  # noqa: E402
from dart_core.ui.session import RunSettings  # noqa: E402
from dart_core.presets import KNOBS  # noqa: E402
from dart_core.config import ConfigError, GenerationConfig  # noqa: E402
from dart_core.engine.decoding import SpeculativeEngine  # noqa: E402
from dart_core.drafters import PromptLookupDrafter  # noqa: E402
from dart_core.drafters.dart import DartDrafter  # noqa: E402
from dart_core.drafters.eagle3 import Eagle3Drafter, Eagle3TreeConfig  # noqa: E402
from dart_core.presets import LIMITS  # noqa: E402
from dart_core.models.heads.dart import new_head_for_target  # noqa: E402
from dart_core.models.heads.eagle3 import new_eagle3_head_for_target  # noqa: E402
from dart_core.drafters.pruning import PruningConfig  # noqa: E402
from dart_core.engine.sampling import warp_probs  # noqa: E402
from dart_core.models.templates import encode_chat, get_template  # noqa: E402

PROMPT = "Write a Python function."
TREE_KNOBS = tuple(name for name, knob in KNOBS.items() if knob.engine)   # every tree knob of both engines


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    target = tiny_llama
    dart = new_head_for_target(target, draft_length=4, seed=1)
    eagle = new_eagle3_head_for_target(target, seed=2)
    ids = encode_chat(target.tokenizer, get_template(target.template_name), [{"role": "user", "content": PROMPT}])
    return target, dart, eagle, ids


@pytest.fixture(scope="module")
def vis(tiny):
    target, dart, eagle, _ = tiny
    factory = EngineFactory(target, dart_head=dart, eagle3_head=eagle)
    return Visualiser(target, app.parse_args(["--max-new-tokens", "24", "--max-length", "256"]), factory)


def engines_for(tiny, settings: RunSettings, factory: EngineFactory) -> dict[str, SpeculativeEngine]:
    """The three engines a page request with ``settings`` runs (RunSettings -> configs -> drafters)."""
    target, dart, eagle, _ = tiny
    return {"dart": SpeculativeEngine(target, DartDrafter(dart, None, target.eos_token_ids,
                                                          settings.tree_for("dart", factory.base_trees["dart"]))),
            "eagle3": SpeculativeEngine(target, Eagle3Drafter(eagle, settings.tree_for("eagle3", factory.base_trees["eagle3"]))),
            "vanilla": SpeculativeEngine(target)}


def page_values(vis, **changes) -> tuple:
    """The page's control values in SETTING_NAMES order: each slider's default, with ``changes`` applied."""
    values = {name: getattr(vis.controls, name).value for name in SETTING_NAMES}
    values["max_new_tokens"] = 6
    values.update(changes)
    return tuple(values[name] for name in SETTING_NAMES)


def finished(vis, prompt: str, values: tuple) -> str:
    return list(vis.run(None, prompt, *values))[-1][vis.status]


# ---------------------------------------------------------------------------------------------- item 5: budget 0
def test_dart_budget_zero_drafts_nothing_and_equals_vanilla(tiny, vis):
    target, dart, _, ids = tiny
    drafter = DartDrafter(dart, None, target.eos_token_ids, PruningConfig(budget=0))
    assert drafter.max_tree_nodes == 1
    cfg = GenerationConfig(max_new_tokens=12, max_length=256)
    out = SpeculativeEngine(target, drafter).generate(ids, cfg)
    assert out.tokens == SpeculativeEngine(target).generate(ids, cfg).tokens
    assert out.traces and all(len(st.tree) == 1 and st.candidates is None for st in out.traces)
    # the same DART drafter decodes again with a budget afterwards (its head cache is reset per request)
    again = SpeculativeEngine(target, DartDrafter(dart, None, target.eos_token_ids, PruningConfig(budget=4)))
    assert again.generate(ids, cfg).tokens == out.tokens
    # on the page: the slider's lowest value runs (fixed trees: with automatic ones the chooser sets the budget,
    # and whether it drafts depends on this machine's timings), the answer is the baseline's, the narration says why
    final = list(vis.run(None, PROMPT, *page_values(vis, budget=0, tree="fixed")))[-1]
    assert final[vis.status].startswith("✓ **Done"), final[vis.status]
    assert "identical to the baseline" in final[vis.metrics["dart"]]
    assert "proposed no draft" in vis.show_step(final[vis.tab], 2)[vis.step_text["dart"]]


def test_sliders_span_only_allowed_values_and_both_ends_run(vis):
    for name in ("temperature", "top_p", "top_k") + TREE_KNOBS:
        slider, limit = getattr(vis.controls, name), LIMITS[name]
        assert limit.problem(slider.minimum) is None and limit.problem(slider.maximum) is None, name
        for end in (slider.minimum, slider.maximum):
            status = finished(vis, PROMPT, page_values(vis, **{name: end}))
            assert status.startswith("✓ **Done") and "⚠" not in status, (name, end, status)
    lo, hi = vis.controls.max_new_tokens.minimum, vis.controls.max_new_tokens.maximum
    for end in (lo, hi):
        status = finished(vis, PROMPT, page_values(vis, max_new_tokens=end))
        assert status.startswith("✓ **Done") and "⚠" not in status, (end, status)


@pytest.mark.parametrize("name", TREE_KNOBS)
def test_every_tree_knob_runs_losslessly_at_both_ends_of_its_range(tiny, vis, name):
    """The settings API takes [low, high] of each knob: both ends build engines that run, and greedy output
    equals the baseline's (so no value an entry accepts fails later in the engine)."""
    _, _, _, ids = tiny
    limit = LIMITS[name]
    cfg = GenerationConfig(max_new_tokens=3, max_length=256)
    for end in (limit.low, limit.high):
        engines = engines_for(tiny, RunSettings.from_values(**{name: end}), vis.factory)
        outs = {k: e.generate(ids, cfg).tokens for k, e in engines.items()}
        assert outs["dart"] == outs["vanilla"] and outs["eagle3"] == outs["vanilla"], (name, end)
    for bad in (limit.low - 1, (limit.high or 0) + 1, 2.5, float("nan")):
        if bad == 2.5 and not limit.integer:
            continue
        with pytest.raises(ConfigError, match=limit.label):
            RunSettings.from_values(**{name: bad})


def test_the_configs_refuse_what_cannot_run_and_bound_their_trees(tiny):
    target, dart, eagle, _ = tiny
    for kw in ({"budget": -1}, {"beam_width": 0}, {"level_top_k": 0}, {"ngram_weight": -1.0}, {"budget": 2.5}):
        with pytest.raises(ValueError, match=f"PruningConfig.{next(iter(kw))}"):
            PruningConfig(**kw)
    for kw in ({"total_token": 0}, {"depth": -1}, {"top_k": 0}, {"depth": 1.0}):
        with pytest.raises(ValueError, match=f"Eagle3TreeConfig.{next(iter(kw))}"):
            Eagle3TreeConfig(**kw)
    # the Python API may ask for more than the page allows; the drafters size their trees (and so the KV
    # cache) by the candidates they can produce, not by the request
    huge = DartDrafter(dart, None, target.eos_token_ids, PruningConfig(budget=10**9, beam_width=10**12, level_top_k=3))
    assert huge.max_tree_nodes == 1 + 3 + 9 + 27 + 81 + 243   # 5 head rows, top-3 each, every beam full
    assert Eagle3Drafter(eagle, Eagle3TreeConfig(total_token=10**9, depth=2, top_k=3)).max_tree_nodes == 1 + 3 + 18


def test_prompt_lookup_lengths_run_from_their_lowest_value_and_refuse_below(tiny):
    target, _, _, ids = tiny
    cfg = GenerationConfig(max_new_tokens=10, max_length=256)
    ref = SpeculativeEngine(target).generate(ids, cfg).tokens
    low = PromptLookupDrafter(max_ngram=1, min_ngram=1, num_pred_tokens=1, max_matches=1, max_tree_nodes=2)
    assert SpeculativeEngine(target, low).generate(ids, cfg).tokens == ref
    for kw in ({"num_pred_tokens": 0}, {"num_pred_tokens": 2.5}, {"max_matches": 0}, {"max_tree_nodes": 1},
               {"min_ngram": 0}, {"max_ngram": True}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            PromptLookupDrafter(**kw)
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def test_cli_tree_flags_share_the_ranges_and_fail_before_loading(capsys):
    from dart_core.bench.cli import build_parser

    parser = build_parser()
    ok = parser.parse_args(["--questions", "q.jsonl", "--budget", "0", "--eagle3-depth", "0",
                            "--eagle3-total-token", "1024", "--ngram-weight", "0"])
    assert ok.budget == 0 and ok.eagle3_depth == 0 and ok.eagle3_total_token == 1024
    for flag, value in (("--budget", "-1"), ("--budget", "1025"), ("--beam-width", "0"),
                        ("--level-top-k", "2.5"), ("--ngram-weight", "nan"), ("--eagle3-total-token", "0"),
                        ("--eagle3-depth", "65"), ("--eagle3-top-k", "x")):
        with pytest.raises(SystemExit):
            parser.parse_args(["--questions", "q.jsonl", flag, value])
        assert flag in capsys.readouterr().err

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tune_tree.py"
    spec = importlib.util.spec_from_file_location("tune_tree_edges", path)
    tune_tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tune_tree)
    assert tune_tree.build_parser().parse_args(["--budget", "0", "2", "1024"]).budget == [0, 2, 1024]
    for bad in ("-1", "1025"):
        with pytest.raises(argparse.ArgumentTypeError, match="between 0 and 1024"):
            tune_tree.parse_budget(bad)
        with pytest.raises(SystemExit):
            tune_tree.build_parser().parse_args(["--budget", "8", bad])
        assert "--budget" in capsys.readouterr().err
    with pytest.raises(argparse.ArgumentTypeError, match="EAGLE-3 depth"):
        tune_tree.parse_eagle3_trees("60/65/10")
    with pytest.raises(SystemExit):   # refused before the model load (which would take seconds)
        tune_tree.main(["--budget", "0", "--max-new-tokens", "0", "--base-model-name-or-path", "/nonexistent"])
    assert "--max-new-tokens" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- item 6: temperature
TINY_TEMPERATURES = (1e-320, 1e-45, 1e-39, 1e-8)


def test_warp_probs_is_a_distribution_at_every_temperature():
    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 5
    logits[0, 7] = float("-inf")                         # a masked token stays impossible
    for t in TINY_TEMPERATURES + (0.05, 0.7, 1.0, 2.0, 1e6):
        for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.5), (20, 0.9)):
            p = warp_probs(logits, t, top_k, top_p)
            assert torch.isfinite(p).all() and (p >= 0).all(), (t, top_k, top_p)
            assert torch.allclose(p.sum(-1), torch.ones(4), atol=1e-5) and p[0, 7] == 0
            if t in TINY_TEMPERATURES:                       # the limit: all mass on the argmax
                assert torch.equal(p.argmax(-1), logits.argmax(-1)) and (p.max(-1).values == 1).all()
    with pytest.raises(ValueError, match="temperature > 0"):
        warp_probs(logits, 0.0)
    with pytest.raises(ConfigError, match="temperature"):
        GenerationConfig(temperature=float("inf"))


@pytest.mark.parametrize("temperature", (0.0,) + TINY_TEMPERATURES)
def test_tiny_temperatures_decode_as_greedy_in_every_engine(tiny, vis, temperature):
    _, _, _, ids = tiny
    greedy = GenerationConfig(max_new_tokens=10, max_length=256)
    cfg = GenerationConfig(max_new_tokens=10, max_length=256, temperature=temperature, seed=1)
    settings = RunSettings.from_values(budget=6, eagle3_total_token=8, eagle3_depth=2, eagle3_top_k=3)
    for name, engine in engines_for(tiny, settings, vis.factory).items():
        want = SpeculativeEngine(engine.target).generate(ids, greedy).tokens
        assert engine.generate(ids, cfg).tokens == want, (name, temperature)


def test_normal_temperatures_give_valid_answers_and_the_page_runs_tiny_ones(tiny, vis):
    target, _, _, ids = tiny
    for t in (0.05, 0.7, 2.0):
        cfg = GenerationConfig(max_new_tokens=10, max_length=256, temperature=t, top_p=0.9, top_k=50, seed=3)
        for name, engine in engines_for(tiny, RunSettings.from_values(budget=6), vis.factory).items():
            out = engine.generate(ids, cfg)
            assert 1 <= len(out.tokens) <= 10 and all(0 <= x < target.vocab_size for x in out.tokens), (name, t)
    for t in (1e-39, 1e-45):
        final = list(vis.run(None, PROMPT, *page_values(vis, temperature=t)))[-1]
        assert final[vis.status].startswith("✓ **Done") and "⚠" not in final[vis.status], final[vis.status]
        runs = final[vis.tab].record.runs
        assert runs["dart"].tokens == runs["vanilla"].tokens == runs["eagle3"].tokens


# ---------------------------------------------------------------------------------------------- item 7: bad text
BAD_TEXT = ("\ud800", "question \udfff?", "a\ud83d")   # lone surrogates (the last: half of an emoji's pair)


@pytest.mark.parametrize("prompt", BAD_TEXT)
def test_a_prompt_that_is_not_unicode_text_is_a_clear_error_in_the_page(vis, prompt):
    final = list(vis.run(None, prompt, *page_values(vis)))[-1]
    status = final[vis.status]
    assert status.startswith("⚠ **Cannot run:** the prompt is not valid Unicode text") and "lone surrogate" in status
    assert "remove it" in status
    stepped = vis.step_once(None, prompt, *page_values(vis))[vis.status]
    assert stepped.startswith("⚠ **Cannot step:** the prompt is not valid Unicode text"), stepped
    assert finished(vis, "emoji 😀 and é are fine", page_values(vis)).startswith("✓ **Done")


def test_a_prompt_that_is_not_unicode_text_is_a_clear_error_in_the_python_api(tiny):
    target, dart, _, _ = tiny
    model = DartModel(target, dart, None, pruning=PruningConfig(budget=4))
    for text in BAD_TEXT:
        with pytest.raises(ValueError, match="not valid Unicode text.*lone surrogate"):
            dart_generate(model, prompt=text, max_new_token_num=4)
        with pytest.raises(ValueError, match="not valid Unicode text"):
            dart_generate(model, messages=[{"role": "user", "content": text}], max_new_token_num=4)
        with pytest.raises(ConfigError, match="message 2's content is not valid"):
            encode_chat(target.tokenizer, model.template, [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": text}])
    assert dart_generate(model, messages=[{"role": "user", "content": "😀"}], max_new_token_num=3).tokens
