"""One name per knob, one table of knobs (dart_core.presets), and one dtype name (dart_core.config.dtype_name)."""
from __future__ import annotations

import pytest
import torch

from dart_core.config import dtype_name
from dart_core.models.loader import DTYPE_ALIASES, resolve_dtype


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "bfloat16"), (torch.float16, "float16"),
                                        (torch.float32, "float32"), ("bfloat16", "bfloat16")])
def test_dtype_name(dtype, name):
    assert dtype_name(dtype) == name


def test_dtype_names_round_trip_through_the_one_alias_table():
    for alias, dtype in DTYPE_ALIASES.items():
        assert DTYPE_ALIASES[dtype_name(dtype)] is dtype
        assert resolve_dtype(alias, torch.device("cpu")) is dtype
    from dart_core.training import runner
    assert runner._save_dtype("bf16") is torch.bfloat16


# ---------------------------------------------------------------------------------------------- the knob table
def test_run_settings_fields_are_the_knob_names():
    from dataclasses import fields

    from dart_core.presets import KNOBS
    from dart_core.ui.session import RunSettings
    names = [f.name for f in fields(RunSettings)]
    assert [n for n in names if n not in ("max_new_tokens", "seed", "tree")] == list(KNOBS)
    s = RunSettings()
    for name, knob in KNOBS.items():
        if knob.config_field is None:   # sampling knobs: one default, the page's and the settings API's
            assert getattr(s, name) == knob.default, name
        else:                           # tree knobs: None = chosen (auto trees) or the engine's tree config
            assert getattr(s, name) is None and knob.default is None, name
    assert s.tree == "auto" and s.fixed_sizes("dart") == {} and s.fixed_sizes("eagle3") == {}
    held = RunSettings(budget=4, eagle3_depth=2)
    assert held.fixed_sizes("dart") == {"budget": 4} and held.fixed_sizes("eagle3") == {"depth": 2}
    assert RunSettings(tree="fixed", budget=4).fixed_sizes("dart") is None


def test_tree_knobs_map_onto_their_configs_and_the_size_knobs_are_marked():
    from dataclasses import fields

    from dart_core.drafters.eagle3 import Eagle3TreeConfig
    from dart_core.drafters.pruning import PruningConfig
    from dart_core.presets import EAGLE3_FIELDS, KNOBS, PRUNING_FIELDS, SIZE_FIELDS
    assert set(PRUNING_FIELDS) <= {f.name for f in fields(PruningConfig)}
    assert set(EAGLE3_FIELDS) <= {f.name for f in fields(Eagle3TreeConfig)}
    assert PRUNING_FIELDS == {"budget": "budget", "beam_width": "beam_width", "level_top_k": "level_top_k",
                              "ngram_weight": "ngram_weight", "context_weight": "context_weight"}
    assert KNOBS["budget"].flag == "--budget" and KNOBS["level_top_k"].flag == "--level-top-k"
    # What automatic trees choose: the sizes, never the pruner's scoring knobs.
    assert SIZE_FIELDS == {"dart": {"budget": "budget"},
                           "eagle3": {"total_token": "eagle3_total_token", "depth": "eagle3_depth",
                                      "top_k": "eagle3_top_k"}}
    # No per-target constants: fixed trees default to the paper's / published settings everywhere.
    paper, published = PruningConfig(), Eagle3TreeConfig()
    assert (paper.budget, published.total_token, published.depth, published.top_k) == (60, 60, 7, 10)
    assert KNOBS["budget"].default_for(paper) == paper.budget and KNOBS["level_top_k"].default_for(paper) == paper.level_top_k
    with pytest.raises(ValueError, match="tree config"):
        KNOBS["budget"].default_for()


@pytest.fixture(scope="module")
def page(tiny_llama):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import app
    from dart_core.page.engines import EngineFactory
    from dart_core.page.visualiser import Visualiser
    from dart_core.models.heads.dart import new_head_for_target
    from dart_core.models.heads.eagle3 import new_eagle3_head_for_target
    target = tiny_llama
    factory = EngineFactory(target, dart_head=new_head_for_target(target, draft_length=4, seed=1),
                            eagle3_head=new_eagle3_head_for_target(target, seed=2))
    return app, Visualiser(target, app.parse_args(["--max-new-tokens", "24", "--max-length", "256"]), factory)


def test_every_slider_is_its_knob(page):
    """Each settings slider's label, step, range and default come from dart_core.presets.KNOBS (a tree knob's
    default from the target's own tree config), and the page sends its values under the knobs' names."""
    app, vis = page
    from dart_core.page.controls import SETTING_NAMES
    from dart_core.presets import KNOBS
    assert SETTING_NAMES == ("max_new_tokens",) + tuple(KNOBS) + ("tree",)   # the tree mode control last
    for name, knob in KNOBS.items():
        slider = getattr(vis.controls, name)
        base = vis.factory.base_trees.get(knob.engine)
        default = knob.default_for(base)
        lo, hi = knob.limit.slider_range
        assert slider.label == (knob.slider_label or knob.label), name
        assert slider.step == knob.step, name
        assert slider.minimum == lo and slider.maximum == max(hi, min(default, knob.limit.high or default)), name
        assert slider.value == max(min(default, knob.limit.high or default), lo), name
        assert knob.limit.problem(slider.minimum) is None and knob.limit.problem(slider.maximum) is None, name


def test_the_benchmarks_tree_flags_are_made_from_the_knobs():
    """Every tree knob is a flag of python -m dart_core.bench under its own name, with its help, its range and the
    default of the tree config the run starts from, as the page makes its sliders (presets.add_tree_flags)."""
    from dart_core.bench.cli import build_parser
    from dart_core.drafters.eagle3 import Eagle3TreeConfig
    from dart_core.drafters.pruning import PruningConfig
    from dart_core.presets import KNOBS
    parser = build_parser()
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    base = {"dart": PruningConfig(), "eagle3": Eagle3TreeConfig()}
    tree_knobs = [k for k in KNOBS.values() if k.engine is not None]
    assert len(tree_knobs) == 9
    for knob in tree_knobs:
        action = by_flag[knob.flag]
        assert action.dest == knob.name and action.default is None, knob.name
        assert action.help.startswith(knob.help) and str(knob.default_for(base[knob.engine])) in action.help, knob.name
        assert ("--tree auto" in action.help) == knob.sizes_tree, knob.name
        hi = knob.limit.high
        assert action.type(str(int(hi) if knob.limit.integer else hi)) == hi, knob.name
        with pytest.raises(Exception, match=knob.flag):
            action.type(str(hi * 2))
