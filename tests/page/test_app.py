"""The visualiser app: CLI, page handlers, a real server driven by gradio_client (tiny models and the bundled
defaults), step-once narration against what the engine did, figures from a recorded trace, and replay."""
from __future__ import annotations

import dataclasses

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import app  # noqa: E402
from dart_core.page.controls import EXAMPLES, FRAME_KEYS, SETTING_NAMES, SIZE_KNOBS  # noqa: E402
from dart_core.page.layout import PAGE_CSS  # noqa: E402
from dart_core.page.serve import launch_kwargs  # noqa: E402
from dart_core.page.tabs import TAB_TTL_S, TabState  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402
from dart_core.presets import KNOBS  # noqa: E402
from dart_core.ui import serving, viz, viz_steps, viz_tree  # noqa: E402
from dart_core.page.engines import EngineFactory  # noqa: E402
from dart_core.ui.narration import narrate_step  # noqa: E402
from dart_core.ui.record import EngineRun, RunRecord, lossless_check  # noqa: E402
from dart_core.ui.session import Comparison, RunSettings  # noqa: E402
from dart_core.config import ConfigError, GenerationConfig  # noqa: E402
from dart_core.engine.decoding import SpeculativeEngine  # noqa: E402
from dart_core.drafters.dart import DartDrafter  # noqa: E402
from dart_core.models.heads.dart import new_head_for_target  # noqa: E402
from dart_core.drafters.pruning import PruningConfig  # noqa: E402
from dart_core.engine.sampling import accept_greedy  # noqa: E402
from tiny_models import stand_in_drafter, tiny_app_argv  # noqa: E402
from gradio_server import launch_local  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = DATA / "recorded_run.json"
PROMPT = "Write a Python function."
# page values in SETTING_NAMES order: max_new, temperature, top_p, top_k, budget, beam, level_k, ngram_w,
# eagle3 total_token, depth, top_k (small trees keep the tiny tests fast)
VALUES = (12, 0.0, 1.0, 0, 16, 6, 6, 0.5, 0.0, 16, 3, 4, 0.0)




# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny_args(tiny_app_models):
    return app.parse_args(tiny_app_argv(*tiny_app_models[1:], max_new_tokens=32))


@pytest.fixture(scope="module")
def vis(tiny_app_models, tiny_args):
    return Visualiser(tiny_app_models[0], tiny_args)


def oracle_dart_engine(target, prompt_ids, cfg) -> SpeculativeEngine:
    """DART with a head that puts the target's own greedy continuation first at every level, so steps
    accept several drafts (the random head accepts almost nothing)."""
    truth = list(prompt_ids) + SpeculativeEngine(target).generate(prompt_ids, cfg).tokens
    head = new_head_for_target(target, draft_length=4, seed=0)
    to_draft = head.target_to_draft()

    def step(aux, next_ids, cache, levels=None):
        cache.length += int(next_ids.shape[0])
        logits = torch.randn(levels or head.config.draft_length + 1, head.config.draft_vocab_size,
                             generator=torch.Generator().manual_seed(cache.length))
        for level in range(logits.shape[0]):
            pos = cache.length + 1 + level
            if pos < len(truth):
                logits[level, to_draft[truth[pos]]] = 25.0
        return logits

    head.step = step
    return SpeculativeEngine(target, DartDrafter(head, None, target.eos_token_ids, PruningConfig(budget=12),
                                                   head_backend="torch"),
                             name="dart")


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_defaults_are_the_bundled_model():
    args = app.parse_args([])
    assert args.base_model_name_or_path is None and args.dart_model_name_or_path is None
    assert args.device == "auto" and args.dtype == "auto" and args.server_port == 7860 and not args.compare_eagle3
    assert launch_kwargs(args) == dict(css=PAGE_CSS, server_name="127.0.0.1", server_port=7860, share=False,
                                       ssr_mode=False, max_file_size=serving.LOCAL.max_upload_bytes, show_error=True)


def test_help_documents_every_flag(capsys):
    with pytest.raises(SystemExit):
        app.parse_args(["--help"])
    text = capsys.readouterr().out
    for flag in ("--base-model-name-or-path", "--dart-model-name-or-path", "--ngram-model-name-or-path",
                 "--small-ngram", "--use-small-ngram", "--eagle3-model-name-or-path", "--compare-eagle3", "--template-name",
                 "--device", "--dtype", "--tree", "--max-new-tokens", "--max-length", "--server-port", "--listen",
                 "--share"):
        assert flag in text, flag


def test_tree_flag(capsys):
    assert app.parse_args([]).tree == "auto" and app.parse_args(["--tree", "fixed"]).tree == "fixed"
    with pytest.raises(SystemExit):
        app.parse_args(["--tree", "big"])
    assert "invalid choice" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- tree size
def test_tree_control_reaches_run_settings(vis):
    """The last page value is the tree mode: fixed applies the size sliders, auto sends None for them (the
    chooser picks) and keeps every other knob; without it (an older API call) the page's default applies."""
    assert SETTING_NAMES[-1] == "tree" and vis.controls.inputs()[-1] is vis.controls.tree
    assert vis.default_tree == "auto" and vis.controls.tree.value == "auto"
    fixed = vis.handlers._settings(VALUES + ("fixed",))
    assert fixed.tree == "fixed" and (fixed.budget, fixed.eagle3_total_token, fixed.eagle3_depth,
                                      fixed.eagle3_top_k) == (16, 16, 3, 4)
    assert fixed.fixed_sizes("dart") is None
    for auto in (vis.handlers._settings(VALUES + ("auto",)), vis.handlers._settings(VALUES)):
        assert auto.tree == "auto"
        assert [getattr(auto, n) for n in SIZE_KNOBS] == [None] * 4, auto
        assert (auto.beam_width, auto.level_top_k, auto.ngram_weight) == (6, 6, 0.5)
        assert auto.fixed_sizes("dart") == {} and auto.fixed_sizes("eagle3") == {}
    with pytest.raises(ConfigError, match="EAGLE-3 depth"):   # auto still checks the sliders it does not apply
        vis.handlers._settings(VALUES[:10] + (2.5, 4, "auto"))
    # the control greys the size sliders out in auto mode and says why
    out = vis.tree_mode_changed("fixed")
    assert "sliders apply" in out[vis.tree_note] and out[vis.controls.budget].interactive is True
    out = vis.tree_mode_changed("auto")
    assert "not applied" in out[vis.tree_note] and out[vis.controls.eagle3_depth].interactive is False


def test_auto_run_names_each_steps_tree_and_draws_the_cost_view(vis):
    final = list(vis.run(None, PROMPT, *VALUES, "auto"))[-1]
    assert final[vis.status].startswith("✓ **Done") and "chosen automatically" in final[vis.status]
    run = final[vis.tab].record.runs["dart"]
    assert len(run.tree_labels) == len(run.traces) and all(run.tree_labels)
    first = vis.show_step(final[vis.tab], 1)          # token 1: DART's first step
    assert f"Tree size (auto): **{run.tree_labels[0]}**," in first[vis.step_text["dart"]]
    assert f"(auto: {run.tree_labels[0]})" in first[vis.tree_plot["dart"]].layout.title.subtitle.text
    assert "identical to the baseline" in final[vis.metrics["dart"]]
    # the cost view: verify ms by nodes, DART's tokens/s by budget, and the sentence, from this run's AutoTrees
    assert vis.costs._autos["dart"].name == "dart" and final[vis.cost_verify_plot].data
    assert any(t.name == "expected tokens/s" for t in final[vis.cost_rate_plot].data)
    text = final[vis.cost_text]
    assert "verify of a 33-node tree" in text and "DART's chooser" in text and "EAGLE-3's chooser" in text
    assert vis.cost_view() is vis.costs._cost_view    # a page load shows the last drawing
    views = vis.show_step(final[vis.tab], 3)
    assert "Tree size (auto)" in views[vis.step_text["eagle3"]]


def test_each_step_is_labelled_with_the_setting_it_used():
    from types import SimpleNamespace
    from dart_core.sizing.acceptance import AcceptanceModel
    from dart_core.sizing.auto import AutoTree
    from dart_core.sizing.costs import CostModel, VerifyCurve
    from dart_core.sizing.spaces import PLAIN
    from dart_core.ui.session import auto_tree_label

    drafter = stand_in_drafter("dart", draft_length=4)
    auto = AutoTree(drafter, CostModel(VerifyCurve([1, 2], [1e-3, 1e-3]), 0.0), AcceptanceModel.generic())
    engine = SimpleNamespace(drafter=auto)
    tree = next(c for c in auto.space if not c.plain)
    auto.choice = auto._last = tree
    assert auto_tree_label(engine) == tree.label == "budget 1"
    auto.choice = auto._last = PLAIN
    assert auto_tree_label(engine) == "plain step"
    auto._last = tree                                  # plain steps chosen, but this one probes a tree
    assert auto_tree_label(engine).startswith("budget 1 (a probe")
    assert auto_tree_label(SimpleNamespace(drafter=drafter)) is None and auto_tree_label(object()) is None


def test_fixed_mode_runs_the_sliders(tiny_app_models):
    args = app.parse_args(tiny_app_argv(*tiny_app_models[1:], max_new_tokens=32) + ["--tree", "fixed"])
    v = Visualiser(tiny_app_models[0], args)
    assert v.default_tree == "fixed" and v.controls.tree.value == "fixed" and v.controls.budget.interactive is not False
    assert "sliders apply" in v.tree_note.value
    settings = v.handlers._settings(VALUES)           # no tree value: the page's default, fixed
    assert settings.tree == "fixed" and settings.budget == 16
    final = list(v.run(None, PROMPT, *VALUES))[-1]
    assert final[v.status].startswith("✓ **Done") and "automatically" not in final[v.status]
    run = final[v.tab].record.runs["dart"]
    assert run.tree_labels == [None] * len(run.traces) and "Tree size (auto)" not in final[v.step_text["dart"]]
    assert max(len(st.tree) for st in run.traces) <= 17     # budget 16 + the root
    assert "verify of a 33-node tree" in final[v.cost_text]   # the cost view shows what auto would pick


# ---------------------------------------------------------------------------------------------- handlers
def test_run_streams_every_engine_with_metrics(vis):
    assert vis.available == ["dart", "eagle3", "vanilla"] and vis.factory.unavailable == {}
    outs = list(vis.run(None, PROMPT, *VALUES))
    final = outs[-1]
    assert final[vis.status].startswith("✓ **Done"), final[vis.status]
    for s in ("dart", "eagle3", "vanilla"):
        text = final[vis.metrics[s]]
        assert "tok/s" in text and "τ" in text and "12 tokens" in text, text
        spans = final[vis.answer[s]]
        assert len(spans) == 12 and {lab for _, lab in spans} <= set(viz.SPAN_COLORS)
    assert "identical to the baseline" in final[vis.metrics["dart"]]
    assert "vs baseline" in final[vis.metrics["eagle3"]]
    assert final[vis.tree_plot["dart"]].data and final[vis.timing_plot].data
    tab = final[vis.tab]
    assert tab.record is not None and tab.record.done
    # the slider picks a token; each engine shows the step that produced it
    views = vis.show_step(tab, 5)
    assert "step" in views[vis.step_text["dart"]] and views[vis.tree_plot["eagle3"]].data
    assert "prefill" in vis.show_step(tab, 0)[vis.step_text["dart"]]


@pytest.mark.parametrize("prompt, values, expect", [
    ("   ", VALUES, "prompt is empty"),
    ("hi", (12, -1.0) + VALUES[2:], "Temperature"),
    ("hi", (12, float("nan")) + VALUES[2:], "Temperature must be a finite number"),
    ("hi", (12, 0.0, 0.0) + VALUES[3:], "Top-p"),
    ("hi", (999,) + VALUES[1:], "--max-new-tokens"),
    ("hi", VALUES[:5] + (0,) + VALUES[6:], "beam width"),
    ("hi", VALUES[:9] + (16, 3, 0.5), "EAGLE-3 top-k must be a whole number"),
    ("hi " * 400, VALUES, "--max-length"),
])
def test_bad_input_shows_a_message_and_the_server_keeps_serving(vis, prompt, values, expect):
    final = list(vis.run(None, prompt, *values))[-1]
    assert final[vis.status].startswith("⚠") and expect in final[vis.status], final[vis.status]
    again = list(vis.run(None, PROMPT, *VALUES))[-1]
    assert again[vis.status].startswith("✓ **Done")


def test_a_failed_engine_is_named_in_the_status_never_done(vis, monkeypatch):
    # Issue 27: a failed engine (a damaged cost cache made every automatic DART run fail) still read "✓ Done.".
    def explode(*a, **k):
        raise RuntimeError("head exploded")
    assert list(vis.run(None, PROMPT, *VALUES))[-1][vis.status].startswith("✓ **Done")   # engines built, pooled
    monkeypatch.setattr(vis.factory._pool["dart"][1].drafter, "propose", explode)   # the pooled DART engine fails
    final = list(vis.run(None, PROMPT, *VALUES))[-1]
    status = final[vis.status]
    assert not status.startswith("✓") and "Done" not in status, status
    assert status.startswith("⚠ **DART (paper) failed** (DART (paper): RuntimeError: head exploded)"), status
    assert "other engines' answers are complete" in status and "press **Run** to try again" in status
    for name in ("eagle3", "vanilla"):                                  # the others ran to the end
        assert final[vis.tab].record.runs[name].done and not final[vis.tab].record.runs[name].error
    monkeypatch.undo()
    assert list(vis.run(None, PROMPT, *VALUES))[-1][vis.status].startswith("✓ **Done")


def test_stop_takes_effect_within_a_step(vis):
    gen = vis.run(None, PROMPT, 32, *VALUES[1:])
    first = next(gen)
    tab = first[vis.tab]
    assert vis.stop(tab).startswith("**Stopping")
    final = list(gen)[-1]
    assert final[vis.status].startswith("**Stopped"), final[vis.status]
    assert sum(len(r.tokens) for r in tab.record.runs.values()) < 3 * 32


def test_every_step_frame_says_what_it_will_show_before_a_run(vis):
    """Before a run (and after Clear) no plot frame is a blank box: each tree, score, parallel-logits, timing and
    acceptance frame holds a figure saying what it will show."""
    import json as _json

    frames = (list(vis.tree_plot.values()) + list(vis.scatter_plot.values()) + [vis.logits_plot, vis.timing_plot]
              + [p for ps in vis.acc_plots.values() for p in ps])
    assert len(frames) == 5 * len(vis.view_slots) + 2
    for frame in frames:
        assert frame.value is not None, frame.label
        text = " ".join(a["text"] for a in _json.loads(frame.value["plot"])["layout"]["annotations"])
        assert "Run a prompt" in text, (frame.label, text)
    assert "draft tree" in _json.dumps(vis.tree_plot["dart"].value) and "parallel logits" in _json.dumps(
        vis.logits_plot.value)
    cleared = vis.clear(None)   # Clear draws the same frames again
    for frame in frames:
        fig = cleared[frame]
        assert "Run a prompt" in " ".join(a.text for a in fig.layout.annotations), frame.label


def test_no_plot_frame_is_empty_when_the_page_arrives(vis):
    """The page as a browser first gets it (its config, before any run or load event) has no empty plot frame,
    which Gradio draws as a broken-image icon: every plot holds a figure whose one line says what it will show;
    the cost and why-this-speed frames, drawn by the page's load event, say what they will show until then."""
    import json as _json

    plots = [c for c in vis.demo.config["components"] if c["type"] in ("plot", "image")]
    assert len(plots) == 5 * len(vis.view_slots) + 2 + 3
    lines = {}
    for c in plots:
        value = c["props"].get("value")
        assert value is not None, c["props"].get("label")
        texts = [a["text"] for a in _json.loads(value["plot"])["layout"].get("annotations", [])]
        assert len(texts) == 1 and texts[0].strip(), (c["props"].get("label"), texts)
        lines[c["props"]["elem_id"]] = texts[0]
    assert lines["cost-verify"].startswith("Verify time by tree size") and "<br>" not in lines["cost-verify"]
    assert lines["cost-rate"].startswith("DART's expected tokens/s by budget") and "<br>" not in lines["cost-rate"]
    assert lines["why-plot"].startswith("Expected speedup by acceptance") and "<br>" not in lines["why-plot"]


def test_step_once_export_replay_and_clear(vis, tmp_path):
    out = vis.step_once(None, PROMPT, *VALUES)
    tab = out[vis.tab]
    assert "round 1" in out[vis.status] and tab.step_session is not None
    assert "DART, step 1" in out[vis.step_text["dart"]] and "EAGLE-3, step 1" in out[vis.step_text["eagle3"]]
    out = vis.step_once(tab, PROMPT, *VALUES)
    assert "round 2" in out[vis.status] and "step 2" in out[vis.step_text["dart"]]
    # its engines are its own: a full run in between does not disturb the stepped session
    list(vis.run(None, PROMPT, *VALUES))
    out = vis.step_once(tab, PROMPT, *VALUES)
    assert "round 3" in out[vis.status]
    runs = tab.record.runs
    ref = list(vis.run(None, PROMPT, *VALUES))[-1][vis.tab].record.runs
    for s in runs:
        assert runs[s].tokens == ref[s].tokens[:len(runs[s].tokens)]
    exported = vis.export(tab)
    path = Path(exported[vis.export_file])
    assert path.is_file() and "Exported" in exported[vis.status]
    replayed = vis.replay(TabState(), str(path))
    assert replayed[vis.status].startswith("**Replaying")
    assert replayed[vis.answer["dart"]] == out[vis.answer["dart"]]
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    assert "not a DART demo trace export" in vis.replay(None, str(bad))[vis.status]
    # a file's strings are shown as literal text: no code span broken, no image fetched, no link made
    data = json.loads(path.read_text(encoding="utf-8"))
    data["meta"]["target"] = "a`b <img src=http://example.invalid/x.png>"
    data["prompt"] = "look *here* <img src=http://example.invalid/y.png> [x](http://example.invalid)"
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(data), encoding="utf-8")
    status = vis.replay(TabState(), str(hostile))[vis.status]
    assert status.startswith("**Replaying") and "<img" not in status and "[x](" not in status
    assert "a\\`b &lt;img" in status and "\\*here\\*" in status
    data["engines"]["dart"]["variant"] = "<b>DART</b>"          # only the page's own method names are read
    hostile.write_text(json.dumps(data), encoding="utf-8")
    status = vis.replay(TabState(), str(hostile))[vis.status]
    assert "Cannot replay" in status and "must be one of" in status and "<b>" not in status
    cleared = vis.clear(tab)
    assert tab.step_session is None and tab.record is None and cleared[vis.prompt] == ""
    tab.release()
    assert tab.released and tab.export_dir is None and not path.exists()


def test_tab_state_is_released_on_unload_and_on_timeout(vis):
    from types import SimpleNamespace
    # a plain function: Gradio deep-copies the page config (which lists it) on every page load
    assert vis.tab.time_to_live == TAB_TTL_S and type(vis.tab.delete_callback).__name__ == "function"
    req = SimpleNamespace(session_hash="tab-1")
    out = vis.step_once(None, PROMPT, *VALUES, request=req)
    tab = out[vis.tab]
    assert vis.tabs.by_session["tab-1"] is tab and tab.step_session is not None
    vis.tabs.on_unload(req)                       # the browser tab closed
    assert tab.released and tab.step_session is None and "tab-1" not in vis.tabs.by_session
    other = vis.step_once(None, PROMPT, *VALUES, request=SimpleNamespace(session_hash="tab-2"))[vis.tab]
    vis.tab.delete_callback(other)            # Gradio's time-to-live expired
    assert other.released and other.record is None and "tab-2" not in vis.tabs.by_session


def test_a_missing_eagle3_head_is_explained_and_the_rest_runs(tiny_app_models):
    target, model_dir, dart_dir, _ = tiny_app_models
    factory = EngineFactory.from_flags(target, base_model_name_or_path=str(model_dir),
                                       dart_model_name_or_path=str(dart_dir), ngram_model_name_or_path="none",
                                       compare_eagle3=True)
    assert factory.names == ["dart", "vanilla"]
    assert "python -m dart_core.train eagle3" in factory.unavailable["eagle3"]
    args = app.parse_args(["--max-new-tokens", "16", "--compare-eagle3"])
    v = Visualiser(target, args, factory)
    final = list(v.run(None, PROMPT, *VALUES))[-1]
    assert final[v.status].startswith("✓ **Done")
    assert "EAGLE-3 is unavailable" in final[v.metrics["eagle3"]]
    assert "eagle3" not in v.tree_plot and final[v.tree_plot["dart"]].data


# ---------------------------------------------------------------------------------------------- compare module
def test_settings_name_the_control_to_change():
    s = RunSettings.from_values(max_new_tokens=8.0, temperature=0.5, budget=10.0)
    assert s.max_new_tokens == 8 and s.budget == 10 and not s.greedy
    assert s.tree_for("dart", PruningConfig()).budget == 10 and s.tree_overrides("dart")["budget"] == 10
    with pytest.raises(ConfigError, match="DART tree budget"):
        RunSettings.from_values(budget=-1)
    with pytest.raises(ConfigError, match="Top-k must be a whole number"):
        RunSettings.from_values(top_k=2.5)
    with pytest.raises(ConfigError, match="Max new tokens"):
        RunSettings(max_new_tokens=40).generation_config(100, max_new_tokens_limit=20)


def test_lossless_check_words():
    base = EngineRun("vanilla", tokens=[1, 2, 3], done=True)
    assert lossless_check(EngineRun("dart", tokens=[1, 2, 3], done=True), base, True)[0] == "identical"
    assert lossless_check(EngineRun("dart", tokens=[1, 2]), base, True)[0] == "same so far"
    state, text = lossless_check(EngineRun("dart", tokens=[1, 5, 3], done=True), base, True, "bfloat16")
    assert state == "differs" and "token 1" in text and "--dtype float32" in text
    assert lossless_check(EngineRun("dart", tokens=[1, 5]), base, False)[0] == "n/a"
    # two answers that ended by themselves at different lengths differ (one went on past an EOS)
    assert lossless_check(EngineRun("dart", tokens=[1, 2], done=True, stop_reason="eos"), base, True)[0] == "differs"


@pytest.mark.parametrize("reason", ["stopped", "time limit", "memory limit"])
def test_a_run_cut_short_is_compared_on_its_own_tokens(reason):
    """Stop (or a serving limit) mid-run: a prefix of the baseline's answer is no difference, whichever was cut."""
    base = EngineRun("vanilla", tokens=[1, 2, 3, 4], done=True, stop_reason="max_new_tokens")
    state, text = lossless_check(EngineRun("dart", tokens=[1, 2], done=True, stop_reason=reason), base, True)
    assert state == "same so far" and "for the 2 tokens before this run was stopped" in text and reason in text
    cut_base = EngineRun("vanilla", tokens=[1, 2], done=True, stop_reason=reason)
    full = EngineRun("dart", tokens=[1, 2, 3, 4], done=True, stop_reason="eos")
    state, text = lossless_check(full, cut_base, True)
    assert state == "same so far" and "before the baseline was stopped" in text
    # a real difference inside the produced tokens is still reported
    assert lossless_check(EngineRun("dart", tokens=[1, 7], done=True, stop_reason=reason), base, True)[0] == "differs"


def test_fair_clock_runs_the_engine_with_least_engine_time(tiny_app_models):
    target = tiny_app_models[0]
    engines = {"dart": oracle_dart_engine(target, target.tokenizer.encode(PROMPT), GenerationConfig(20, 256)),
               "vanilla": SpeculativeEngine(target)}
    cmp = Comparison(engines, target.tokenizer.encode(PROMPT), GenerationConfig(20, 256), decode=target.tokenizer)
    order = []
    for name in cmp.run():
        order.append(name)
        assert all(r.busy_s >= 0 for r in cmp.record.runs.values())
    runs = cmp.record.runs
    assert runs["dart"].tokens == runs["vanilla"].tokens and len(runs["dart"].tokens) == 20
    assert runs["dart"].tau > 2.0 and runs["vanilla"].tau == 1.0
    assert order.count("dart") == runs["dart"].steps + 1 or order.count("dart") == runs["dart"].steps
    m = cmp.record.metrics()
    assert m["dart"].lossless == "identical" and m["vanilla"].speedup == pytest.approx(1.0)


@pytest.mark.parametrize("temperature", [0.0, 0.3])
def test_narration_matches_what_the_engine_did(tiny_app_models, temperature):
    target = tiny_app_models[0]
    ids = target.tokenizer.encode(PROMPT)
    cfg = GenerationConfig(max_new_tokens=24, max_length=256, temperature=temperature, seed=3)
    engine = oracle_dart_engine(target, ids, GenerationConfig(24, 256))
    res = engine.generate(ids, cfg)
    accepted_somewhere = False
    for st in res.traces:
        n = narrate_step(st, target.tokenizer, "dart")
        assert n.accepted_path == [int(a) for a in st.accepted_nodes] and n.bonus_token == st.bonus_token
        children = st.tree.children()
        for d, nxt in zip(n.decisions, list(st.accepted_nodes[1:]) + [None]):
            assert d.accepted == nxt
            tried = [c for c, _, _, _ in d.tried]
            if nxt is not None:  # the accepted child is the last one tried, earlier siblings were rejected
                assert tried[-1] == nxt and tried == children[d.node][:len(tried)]
                accepted_somewhere = True
            else:               # the path stopped: every child was tried (or there were none)
                assert tried == children[d.node]
            if temperature == 0.0:
                # greedy: accepted exactly when the token is the target's argmax at the parent
                if nxt is not None:
                    assert int(st.tree.tokens[nxt]) == d.target_choice
                assert all(t != d.target_choice for c, t, _, _ in d.tried if c != nxt)
            else:
                left = 1.0
                for c, _, p, pa in d.tried:
                    assert pa == pytest.approx(p / left)
                    left -= p
        if temperature == 0.0:
            ref = accept_greedy(st.tree, st.node_target_argmax, children)
            assert ref.accepted_nodes == n.accepted_path and ref.bonus_token == n.bonus_token
            assert st.bonus_token == n.decisions[-1].target_choice
        bonus_text = target.tokenizer.decode([int(st.bonus_token)]).replace("\n", "\u21b5")
        assert f"{len(st.accepted_nodes) - 1} drafted token" in n.text
        assert bonus_text in n.text or not bonus_text.strip()  # blank tokens are shown by their repr
        if st.tree.num_drafted:
            assert ("exactly the target's top choice" in n.text) == (temperature == 0.0)
    assert accepted_somewhere


# ---------------------------------------------------------------------------------------------- recorded trace
def test_figures_from_the_recorded_trace():
    record = RunRecord.from_export(RECORDED)
    assert record.meta["target"] and set(record.runs) >= {"dart", "vanilla"}
    dart = record.runs["dart"]
    assert dart.traces and dart.tokens
    st = dart.traces[0]
    x, y = viz_tree.tree_layout(st.tree.parents, st.tree.scores)
    assert x[0] == 0 and all(x[i] == x[int(st.tree.parents[i])] + 1 for i in range(1, len(st.tree)))
    tree = viz_tree.tree_figure(st, record.decode)
    names = {t.name for t in tree.data}
    assert "accepted path" in names and tree.layout.xaxis.title.text and tree.layout.yaxis.title.text
    scatter = viz_tree.score_scatter(st, record.decode)
    assert sum(len(t.x) for t in scatter.data if t.x is not None) == len(st.candidates)
    timing = viz_steps.timing_figure({r.label: r.traces for r in record.runs.values()})
    assert timing.layout.showlegend and any(t.name == "verify" for t in timing.data)
    for fig in viz_steps.acceptance_figures(dart.traces):
        assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
    # the recorded spans rebuild the recorded answer and label tokens from the trace
    spans = record.spans("dart")
    assert len(spans) == len(dart.tokens) and record.text("dart") == "".join(t for t, _ in spans)
    assert record.metrics()["dart"].lossless == "identical"
    n = narrate_step(st, record.decode, "dart")
    assert n.accepted_path == list(st.accepted_nodes)



def test_comparison_allocates_the_caches_before_the_clocks_start(tiny_app_models, monkeypatch):
    """A fresh engine's KV cache (max_length positions a layer, zeroed) is allocated when the comparison is set up,
    not inside its first timed step: the page once timed it as DART's prefill (0.8x instead of 1.5x vanilla)."""
    target = tiny_app_models[0]
    cfg = GenerationConfig(8, 256)
    engines = {"dart": oracle_dart_engine(target, target.tokenizer.encode(PROMPT), cfg),
               "vanilla": SpeculativeEngine(target)}
    cmp = Comparison(engines, target.tokenizer.encode(PROMPT), cfg, decode=target.tokenizer)
    sessions = {n: e._session for n, e in engines.items()}
    assert all(s is not None and s.capacity >= 256 for s in sessions.values())
    made = []
    real = type(target).new_session
    monkeypatch.setattr(type(target), "new_session", lambda self, cap: made.append(cap) or real(self, cap))
    for _ in cmp.run():
        pass
    assert made == [], "a cache was allocated inside the timed steps"
    assert {n: e._session for n, e in engines.items()} == sessions
    assert cmp.record.runs["dart"].tokens == cmp.record.runs["vanilla"].tokens


def test_a_busy_engine_fails_in_its_own_column_not_the_comparison(tiny_app_models):
    target = tiny_app_models[0]
    busy = SpeculativeEngine(target)
    gen = busy.stream(target.tokenizer.encode(PROMPT), GenerationConfig(4, 256))
    next(gen)
    try:
        cmp = Comparison({"vanilla": busy, "other": SpeculativeEngine(target)}, target.tokenizer.encode(PROMPT),
                         GenerationConfig(4, 256), decode=target.tokenizer)
        for _ in cmp.run():
            pass
        runs = cmp.record.runs
        assert runs["vanilla"].error and "already running" in runs["vanilla"].error
        assert runs["other"].error is None and len(runs["other"].tokens) == 4
    finally:
        gen.close()


def test_reserve_refuses_a_busy_engine_and_skips_a_bad_config(tiny_app_models):
    from dart_core.engine.decoding import EngineBusyError
    target = tiny_app_models[0]
    engine = SpeculativeEngine(target)
    bad = GenerationConfig(8, 256)
    bad.max_length = 0
    engine.reserve(bad)            # stream reports the bad config itself; nothing is allocated for it
    assert engine._session is None
    gen = engine.stream(target.tokenizer.encode(PROMPT), GenerationConfig(4, 256))
    next(gen)
    with pytest.raises(EngineBusyError, match="running a generation"):
        engine.reserve(GenerationConfig(4, 512))
    gen.close()
    engine.reserve(GenerationConfig(4, 512))   # free again: the cache grows to the new length
    assert engine._session.capacity >= 512

def test_replay_of_the_recorded_trace_renders_every_view(vis):
    replayed = vis.replay(None, str(RECORDED))
    assert replayed[vis.status].startswith("**Replaying"), replayed[vis.status]
    assert "tok/s" in replayed[vis.metrics["dart"]] and replayed[vis.tree_plot["dart"]].data
    assert replayed[vis.timing_plot].data and all(replayed[p].data for p in vis.acc_plots["dart"])
    tab = replayed[vis.tab]
    views = vis.show_step(tab, 3)
    assert views[vis.tree_plot["dart"]].data
    # exported again it round-trips
    again = RunRecord.from_export(json.dumps(tab.record.to_export()))
    assert {s: r.tokens for s, r in again.runs.items()} == {s: r.tokens for s, r in tab.record.runs.items()}


def test_replay_refuses_bad_files(tmp_path):
    for content, expect in ((b"\xff\xfe", "not UTF-8"), (b"{", "not valid JSON"),
                            (b'{"format": "dart-demo-run", "version": 99}', "version 99")):
        p = tmp_path / "f.json"
        p.write_bytes(content)
        with pytest.raises(ValueError, match=expect):
            RunRecord.from_export(p)


# ---------------------------------------------------------------------------------------------- a real server


def _launch(vis) -> str:
    return launch_local(vis.demo)


def _client_run(client, values, prompt=PROMPT, *, streamed: list | None = None) -> list:
    job = client.submit(prompt, *values, api_name="/run")
    outputs = list(job) or job.outputs()
    if streamed is not None:
        streamed.extend(outputs)
    return outputs[-1]


def test_gradio_client_streams_every_engine(vis):
    gradio_client = pytest.importorskip("gradio_client")
    url = _launch(vis)
    try:
        client = gradio_client.Client(url, verbose=False, download_files=False)
        streamed: list = []
        final = _client_run(client, VALUES, streamed=streamed)
        assert len(streamed) >= 2 and "Running" in json.dumps(streamed[0], ensure_ascii=False, default=str)
        text = json.dumps(final, ensure_ascii=False, default=str)
        assert "Done.**" in text and text.count("tok/s") == 3 and "identical to the baseline" in text
        # a value the page's own check refuses, and one outside a slider's range (Gradio refuses it)
        bad = _client_run(client, VALUES[:10] + (2.5, 4), "hi")
        assert "EAGLE-3 depth must be a whole number" in json.dumps(bad, ensure_ascii=False, default=str)
        long = _client_run(client, VALUES, "hi " * 400)
        assert "--max-length" in json.dumps(long, ensure_ascii=False, default=str)
        with pytest.raises(Exception, match="less than minimum"):
            client.predict(PROMPT, 12, -1.0, *VALUES[2:], api_name="/run")
        # the server keeps serving another tab (another client session) after the error
        other = gradio_client.Client(url, verbose=False, download_files=False)
        assert "Done.**" in json.dumps(_client_run(other, VALUES), ensure_ascii=False, default=str)
        step = client.predict(PROMPT, *VALUES, api_name="/step_once")
        assert "round 1" in json.dumps(step, ensure_ascii=False, default=str)
        assert "Stopping" in json.dumps(client.predict(api_name="/stop"), ensure_ascii=False)
        # several tabs at once: the queue runs them one after the other, each gets its own answer
        jobs = [c.submit(PROMPT, *VALUES, api_name="/run") for c in (client, other)]
        for job in jobs:
            assert "Done.**" in json.dumps(job.result(timeout=120), ensure_ascii=False, default=str)
    finally:
        vis.demo.close()


@pytest.mark.bundled
def test_gradio_client_on_the_bundled_defaults(bundled_fp32):
    """The app as `python app.py --compare-eagle3` builds it (bundled target, head and N-gram table)."""
    gradio_client = pytest.importorskip("gradio_client")
    args = app.parse_args(["--compare-eagle3", "--max-new-tokens", "16"])
    v = Visualiser(bundled_fp32, args)
    assert v.available == ["dart", "eagle3", "vanilla"]   # the bundled EAGLE-3 head ships in assets/eagle3
    url = _launch(v)
    try:
        client = gradio_client.Client(url, verbose=False, download_files=False)
        streamed: list = []
        final = _client_run(client, (8,) + VALUES[1:], "What is 2 + 3?", streamed=streamed)
        assert len(streamed) >= 2
        text = json.dumps(final, ensure_ascii=False, default=str)
        assert "Done.**" in text and text.count("tok/s") == len(v.available), text[:2000]
        if "dart" in v.available:
            assert "identical to the baseline" in text
    finally:
        v.demo.close()


# ---------------------------------------------------------------------------------------------- teaching
def test_tree_presets_set_the_controls_and_report_each_measured_speed(vis, monkeypatch):
    paper = vis.apply_preset("paper")
    assert paper[vis.controls.tree] == "fixed" and "sliders apply" in paper[vis.tree_note]
    assert paper[vis.controls.budget].value == vis.factory.base_trees["dart"].budget == 60
    e = vis.factory.base_trees["eagle3"]
    assert (paper[vis.controls.eagle3_total_token].value, paper[vis.controls.eagle3_depth].value,
            paper[vis.controls.eagle3_top_k].value) == (e.total_token, e.depth, e.top_k) == (60, 7, 10)
    fastest = vis.apply_preset("fastest")
    assert fastest[vis.controls.tree] == "auto" and fastest[vis.controls.budget].interactive is False
    # which preset a run's settings are: auto trees, the paper's fixed trees, or neither (custom sliders)
    paper_values = tuple(paper[getattr(vis.controls, n)].value if n in KNOBS and KNOBS[n].engine else v
                         for n, v in zip(SETTING_NAMES, VALUES))
    assert vis.preset_of(vis.handlers._settings(paper_values + ("fixed",))) == "paper"
    assert vis.preset_of(vis.handlers._settings(VALUES + ("auto",))) == "fastest"
    assert vis.preset_of(vis.handlers._settings(VALUES + ("fixed",))) is None
    vis.trees._preset_runs.clear()
    assert vis.preset_text().count("not run on this server yet") == 2
    # a run under a preset is measured against the same run's vanilla and shown beside that preset
    final = list(vis.run(None, PROMPT, *paper_values, "fixed"))[-1]
    assert final[vis.status].startswith("✓ **Done")
    text = final[vis.preset_note]
    paper_line = next(line for line in text.split("\n") if "Paper's trees" in line)
    # the paper's trees run the paper's DART (no context), and the page names it so
    assert "measured here: DART (paper) **" in paper_line and "EAGLE-3 **" in paper_line, paper_line
    speed = final[vis.tab].record.metrics()["dart"].speedup
    assert f"DART (paper) **{speed:.2f}×**" in paper_line
    assert "not run on this server yet" in next(line for line in text.split("\n") if "Fastest" in line)
    # a run cut short (here by the time limit; Stop alike) measured its first tokens only: the preset keeps the
    # finished run's figure, and the run's own line says it is partial
    monkeypatch.setattr(vis, "limits", dataclasses.replace(vis.limits, run_time_limit_s=1e-9))
    cut = list(vis.run(None, PROMPT, *paper_values, "fixed"))[-1]
    assert cut[vis.status].startswith("⏱")
    assert "(partial run)" in cut[vis.metrics["dart"]] and "⚠" not in cut[vis.metrics["dart"]]
    assert f"DART (paper) **{speed:.2f}×**" in vis.preset_text()


def test_the_page_names_the_dart_method_that_ran(vis):
    """Context weight 0 runs the paper's DART, above 0 DART + context (issue 38): the metrics line, the step
    titles and an exported record all name which; EAGLE-3 without context keeps its plain name, and its own
    context slider makes it EAGLE-3 + context."""
    i = SETTING_NAMES.index("context_weight")
    for w, label in ((0.0, "DART (paper)"), (0.5, "DART + context")):
        vals = list(VALUES)
        vals[i] = w
        final = list(vis.run(None, PROMPT, *vals, "fixed"))[-1]    # fixed trees: every DART step drafts
        assert final[vis.metrics["dart"]].startswith(f"**{label}**:"), final[vis.metrics["dart"]]
        rec = final[vis.tab].record
        assert rec.runs["dart"].label == label and rec.runs["eagle3"].label == "EAGLE-3"
        assert final[vis.tree_plot["dart"]].layout.title.text.startswith(f"{label} step")
        assert RunRecord.from_export(json.loads(json.dumps(rec.to_export()))).runs["dart"].label == label
        if w:   # EAGLE-3's own slider: the same context candidates in its tree, and the page names that too
            vals[SETTING_NAMES.index("eagle3_context_weight")] = w
            both = list(vis.run(None, PROMPT, *vals, "fixed"))[-1]
            assert both[vis.metrics["eagle3"]].startswith("**EAGLE-3 + context**:"), both[vis.metrics["eagle3"]]
            assert both[vis.tab].record.runs["eagle3"].label == "EAGLE-3 + context"
            assert both[vis.tree_plot["eagle3"]].layout.title.text.startswith("EAGLE-3 + context step")
        # DART's parallel logits: the levels of the selected step's one head forward, before pruning
        st = next(t for t in rec.runs["dart"].traces if t.head_rows is not None)
        fig = vis.select_token(final[vis.tab], st.position)[vis.logits_plot]
        assert fig.data[0].type == "heatmap" and len(fig.data[0].y) == len(st.head_rows["token"])
        assert fig.layout.title.text.startswith(f"{label} step {st.step}: parallel logits")


def test_clicking_an_answer_token_selects_its_step_in_every_engine(vis):
    from dart_core.engine.trace_stats import step_for_token
    tab = list(vis.run(None, PROMPT, *VALUES))[-1][vis.tab]
    for pos in (1, 5, 11):
        out = vis.select_token(tab, pos)
        assert out[vis.slider].value == pos
        for s in ("dart", "eagle3"):
            traces = tab.record.runs[s].traces
            st = traces[step_for_token(traces, pos)]
            assert out[vis.tree_plot[s]].layout.title.text.endswith(f"step {st.step}")
        # the timing chart marks the selected steps
        assert out[vis.timing_plot].layout.shapes or any("selected" in (a.text or "")
                                                         for a in out[vis.timing_plot].layout.annotations)
    assert vis.select_token(tab, 10_000)[vis.slider].value == tab.record.max_position()   # clamped, not an error
    assert "prefill" in vis.select_token(tab, -3)[vis.step_text["dart"]]


def test_tree_nodes_name_the_answer_token_they_stand_for(vis):
    """The page's hover script outlines a node's token in the answer: each marker's customdata ends with its
    answer position, and the figure's meta maps that position to the answer box's element."""
    tab = list(vis.run(None, PROMPT, *VALUES))[-1][vis.tab]
    run = tab.record.runs["dart"]
    st = next(t for t in run.traces if t.accepted_drafts >= 1) if any(t.accepted_drafts for t in run.traces) \
        else run.traces[0]
    fig = vis.show_step(tab, int(st.position))[vis.tree_plot["dart"]]
    meta = fig.layout.meta
    assert meta["engine"] == "dart" and str(int(st.position)) in meta["token_elements"]
    spans = tab.record.spans("dart")
    # element index = the answer box's non-empty lines before that token (a bare newline draws nothing)
    for pos, first in meta["token_elements"].items():
        assert first == sum(sum(1 for piece in text.split("\n") if piece) for text, _ in spans[:int(pos)])
    bonus = [d for t in fig.data for d in (t.customdata or []) if d is not None and d[0] == "bonus"]
    assert bonus and bonus[0][2] == st.position + st.accepted_drafts


def test_step_once_walks_the_round_stage_by_stage(vis):
    out = vis.step_once(None, PROMPT, *VALUES, "fixed")   # a fixed budget of 16: the pruner drops candidates
    tab = out[vis.tab]
    assert out[vis.frame] == "drafted" and out[vis.step_text["dart"]].startswith("**Stage 1 of 5")
    assert "Next stage" in out[vis.status]
    seen = []
    frame = "drafted"
    for _ in range(5):
        nxt = vis.next_frame(tab, out[vis.slider].value, frame)
        frame = nxt[vis.frame]
        seen.append(frame)
        if frame != "all":
            assert nxt[vis.step_text["dart"]].startswith(f"**Stage {FRAME_KEYS.index(frame)} of 5")
            assert nxt[vis.tree_plot["dart"]].data
    assert seen == ["pruned", "checked", "accepted", "committed", "all"]
    # the whole step again, with the candidates the pruner dropped drawn faded where they would hang
    whole = vis.view_changed(tab, out[vis.slider].value, "all", True)
    kinds = {d[0] for t in whole[vis.tree_plot["dart"]].data for d in (t.customdata or []) if d is not None}
    assert "candidate" in kinds and tab.show_pruned
    plain = vis.view_changed(tab, out[vis.slider].value, "all", False)
    assert "candidate" not in {d[0] for t in plain[vis.tree_plot["dart"]].data for d in (t.customdata or [])
                               if d is not None}
    assert vis.view_changed(tab, 1, "no such stage", False)[vis.tree_plot["dart"]].data   # the whole step
    assert tab.frame == "all"


def test_why_panel_places_this_run_on_the_speedup_map(vis):
    empty = vis.render_why(None)
    assert "Run a prompt" in empty[vis.why_text] and empty[vis.why_plot].data
    final = list(vis.run(None, PROMPT, *VALUES))[-1]
    text, fig = final[vis.why_text], final[vis.why_plot]
    assert text.startswith("**DART (paper), this run:**") and "τ" in text, text
    names = " ".join(t.name or "" for t in fig.data)
    assert "DART (paper), this run" in names and "EAGLE-3, this run" in names
    what = vis.whatif_changed(final[vis.tab], 0.8, 1.1, 4)
    assert "your what-if" in " ".join(t.name or "" for t in what[vis.why_plot].data)
    assert what[vis.why_text]
    # the map follows the depth slider (issue 42 item 3) and keeps every marker inside its axes (item 4)
    maps = {}
    for depth in (2, 6):
        what = vis.whatif_changed(final[vis.tab], 0.97, 1.0, depth)
        fig = what[vis.why_plot]
        assert fig.layout.title.text.startswith(f"Expected speedup, {depth}-token chain")
        assert f"A {depth}-token chain" in what[vis.why_text]
        maps[depth] = fig.data[0].customdata
        xr, yr = fig.layout.xaxis.range, fig.layout.yaxis.range
        for t in fig.data:
            if getattr(t, "mode", None) == "markers":
                assert xr[0] <= t.x[0] < xr[1] and yr[0] < t.y[0] < yr[1], (t.name, t.x, t.y, xr, yr)
    assert maps[2].max() < maps[6].max()


def test_guided_examples_each_ask_one_question():
    assert [k for k, _, _ in EXAMPLES] == ["Chat", "Code", "Math"]
    for _, prompt, question in EXAMPLES:
        assert prompt.strip() and question.rstrip().endswith("?") and len(question) < 240


def test_other_load_counts_other_processes_not_this_one():
    """The page's busy-machine note rests on OtherLoad: a busy-looping child process is counted, this process's
    own spinning is not."""
    import subprocess
    import time as _time
    from dart_core.hardware import OtherLoad, _cpu_times
    if _cpu_times() is None:
        pytest.skip("no /proc/stat on this platform")
    own = OtherLoad()
    own.start()
    t = _time.perf_counter()
    while _time.perf_counter() - t < 0.6:
        pass
    own.stop()
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 30: pass"])
    try:
        _time.sleep(0.3)   # the child is running
        other = OtherLoad()
        other.start()
        _time.sleep(0.6)
        other.stop()
    finally:
        hog.kill()
        hog.wait()
    assert other.cpus is not None and other.cpus > 0.6, other.cpus
    assert own.cpus is not None and own.cpus < other.cpus - 0.4, (own.cpus, other.cpus)
    assert OtherLoad().cpus is None   # no interval yet
    short = OtherLoad()
    short.start()
    short.stop()
    assert short.cpus is None         # too short to measure


def test_busy_machine_note_names_the_load_only_above_the_threshold():
    from dart_core.page.handlers import BUSY_CPUS, load_note
    assert load_note(None) == "" and load_note(BUSY_CPUS) == "" and load_note(0.0) == ""
    note = load_note(0.93, cpus=2)
    assert "0.9 of its 2 CPUs" in note and "browser" in note and "python -m dart_core.bench" in note


def test_a_run_on_the_page_records_the_other_programs_load(vis, monkeypatch):
    """The run's status names what other programs took from the CPUs while the engines ran, and its export keeps it;
    a run too short to measure (the tiny engines take hundredths of a second) says nothing."""
    from dart_core.hardware import OtherLoad
    tab = TabState()
    values = [KNOBS[n].default if n in KNOBS else None for n in SETTING_NAMES]
    values[SETTING_NAMES.index("max_new_tokens")] = 6

    def run():
        out = None
        for out in vis.run(tab, PROMPT, *values):
            pass
        return out[vis.status]

    status = run()
    assert "busy" not in status and "other_cpus" not in tab.record.meta
    monkeypatch.setattr(OtherLoad, "cpus", property(lambda self: 0.93))
    status = run()
    assert "This machine was busy" in status and "0.9 of its" in status
    assert tab.record.meta["other_cpus"] == 0.93
    again = RunRecord.from_export(json.loads(json.dumps(tab.record.to_export())))
    assert again.meta["other_cpus"] == 0.93
