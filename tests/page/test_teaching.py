"""Teaching views (dart_core.ui.teaching_round, teaching_whatif): one round in five frames on hand-made traces (DART with scored
candidates, sampling, prompt lookup without candidates, a plain 1-node step), the chain speedup model, its
break-even solver, a run's measured point and the what-if figure. No model is loaded."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from dart_core.engine.trace import STAGES, ScoredCandidates, StepTrace
from dart_core.engine.tree import DraftTree
from dart_core.ui import teaching_round
from dart_core.ui.teaching_round import FRAME_KEYS, round_frames
from dart_core.ui.teaching_whatif import (GPU_ALPHA_RANGE, GPU_VERIFY_RATIO_RANGE, break_even_alpha, expected_speedup,
                                          expected_tau, measured_point, whatif_figure, whatif_text)


# ---------------------------------------------------------------------------------------------- traces
from test_viz import hand_trace  # noqa: E402  (the hand-made trace both figure tests draw)


def lookup_trace() -> StepTrace:
    """Prompt lookup: a 3-token chain 21, 22, 23 after root 20, no candidates; the target takes 21, wants 30."""
    tree = DraftTree.from_parents([20, 21, 22, 23], [-1, 0, 1, 2], [0.0, 0.0, 0.0, 0.0])
    return StepTrace(step=4, position=9, tree=tree, accepted_nodes=[0, 1], emitted_tokens=[21, 30], bonus_token=30,
                     node_target_prob=[1.0, 0.7, 0.1, 0.1], node_target_argmax=[21, 30, 5, 6],
                     timings={"draft_forward": 0.0, "tree_build": 0.0002, "verify": 0.004, "commit": 0.0005})


def plain_trace() -> StepTrace:
    return StepTrace(step=2, position=3, tree=DraftTree.root_only(10), accepted_nodes=[0], emitted_tokens=[11],
                     bonus_token=11, node_target_prob=[1.0], node_target_argmax=[11],
                     timings={s: 0.001 for s in STAGES})


def decode_fn(ids):
    return "".join(f"<{i}>" for i in ids)


def check_layout(fig):
    """Title on top with automargin, short; legend below the plot (container-anchored), with named entries."""
    title = fig.layout.title
    assert title.text and len(title.text) < 60 and title.automargin is True
    lg = fig.layout.legend
    assert lg.orientation == "h" and lg.yref == "container" and lg.y == 0 and lg.yanchor == "bottom"
    assert fig.layout.margin.autoexpand is not False   # plotly.js grows the bottom margin by the legend's height
    assert any(t.showlegend is not False and t.name for t in fig.data)
    json.loads(fig.to_json())


def named(fig, name):
    return [t for t in fig.data if t.name == name]


# ---------------------------------------------------------------------------------------------- the model
def test_tau_and_speedup_formula_ends():
    assert expected_tau(0.0, 4) == pytest.approx(1.0)
    assert expected_tau(1.0, 4) == pytest.approx(5.0)
    assert expected_tau(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_speedup(0.0, 4, 1.0) == pytest.approx(1.0)
    assert expected_speedup(1.0, 4, 1.0) == pytest.approx(5.0)
    assert expected_speedup(1.0, 3, 1.5, 0.5) == pytest.approx(4 / 2.0)
    assert isinstance(expected_speedup(0.3, 4, 2.0), float)


def test_speedup_is_vectorised_monotone_in_alpha_and_falls_with_verify_cost():
    a = np.linspace(0, 1, 101)
    s = expected_speedup(a, 4, 1.2, 0.1)
    assert s.shape == a.shape and (np.diff(s) > 0).all()
    assert s[-1] == pytest.approx(5 / 1.3)                    # alpha = 1 is the limit, not a NaN
    v = np.linspace(1, 4, 31)
    s = expected_speedup(0.6, 4, v, 0.1)
    assert (np.diff(s) < 0).all()
    grid = expected_speedup(a[None, :], 4, v[:, None])
    assert grid.shape == (31, 101) and np.isfinite(grid).all()


def test_break_even_alpha():
    # verify 2x: need tau = 2; depth 1: 1 + a = 2 -> a = 1
    assert break_even_alpha(2.0, 0.0, 1) == pytest.approx(1.0)
    a = break_even_alpha(2.2, 0.3, 4)
    assert a is not None and 0 < a < 1
    assert expected_speedup(a, 4, 2.2, 0.3) == pytest.approx(1.0, abs=1e-9)
    assert expected_speedup(a - 1e-3, 4, 2.2, 0.3) < 1.0
    assert break_even_alpha(0.9, 0.0, 4) == 0.0               # cheaper than a plain step: always pays
    assert break_even_alpha(6.0, 0.0, 4) is None              # more than depth + 1 steps: never pays
    assert break_even_alpha(1.0, 0.1, 4) < break_even_alpha(2.0, 0.1, 4)


def test_whatif_text_names_tau_speedup_and_what_it_would_take():
    t = whatif_text(0.35, 2.2, 0.3, 4)
    tau = expected_tau(0.35, 4)
    assert f"{tau:.2f}" in t and f"{expected_speedup(0.35, 4, 2.2, 0.3):.2f}" in t
    assert f"alpha \u2265 {break_even_alpha(2.2, 0.3, 4):.2f}" in t
    assert f"{tau - 0.3:.2f}" in t                            # the verify cost this alpha could afford
    good = whatif_text(0.7, 1.1, 0.1, 4)
    assert "pays" in good and "fell below" in good
    hopeless = whatif_text(0.5, 7.0, 0.5, 4)
    assert "no head" in hopeless


# ---------------------------------------------------------------------------------------------- frames
def test_frames_of_a_dart_trace_with_candidates():
    frames = round_frames(hand_trace(), decode_fn, engine="dart")
    assert [f.key for f in frames] == list(FRAME_KEYS)
    for f in frames:
        check_layout(f.figure)
        assert f.sentence and "&lt;" not in f.title          # plain text; the figure's title is plotly's HTML
        assert f.title == f.figure.layout.title.text.replace("&lt;", "<").replace("&gt;", ">")
    drafted, pruned, checked, accepted, committed = frames
    assert "7 candidates" in drafted.sentence and "one" in drafted.sentence and "3 depths" in drafted.sentence
    # all 7 candidates drawn, as candidates, plus the root
    cand_pts = [c for t in drafted.figure.data if t.customdata is not None for c in t.customdata
                if c[0] == "candidate"]
    assert sorted(c[1] for c in cand_pts) == list(range(7))
    assert "kept 5 of 7" in pruned.sentence and "N-gram" in pruned.sentence and "dropped 2" in pruned.sentence
    faded = named(pruned.figure, "pruned (never verified)")
    assert faded and faded[0].opacity < 0.5 and len(faded[0].x) == 2
    # checked: one forward over 6 nodes; 11 and 13 match the target's choice at their parent, 12/14/15 do not
    assert "6 nodes" in checked.sentence and "2 of the 5" in checked.sentence and "<11>" in checked.sentence
    match = named(checked.figure, "matches the target's choice at its parent")[0]
    assert sorted(c[1] for c in match.customdata) == [1, 3]
    assert any("\u2192 &lt;13&gt;" in s for s in match.text)   # node 11's label shows the target's next token 13
    # accepted: the path 11, 13, stopped at a leaf, bonus 99
    assert "longest path" in accepted.sentence and accepted.title.endswith("bonus <99>")
    assert "`<11><13>`" in accepted.sentence and "`<99>`" in accepted.sentence and "leaf" in accepted.sentence
    path = named(accepted.figure, "accepted path")[0]
    assert path.line.width >= 5
    bonus = [t for t in accepted.figure.data if t.customdata is not None and list(t.customdata[0]) == ["bonus", -1]]
    assert bonus and "99" in bonus[0].text[0]
    # committed: three tokens, 3 rejected nodes' KV discarded
    assert "3 tokens" in committed.sentence and "`<11><13><99>`" in committed.sentence
    assert "3 rejected nodes" in committed.sentence
    strip = {t.legendgroup: len(t.x) for t in committed.figure.data if t.legendgroup}
    assert strip == {"root": 1, "accepted": 2, "bonus": 1}


def test_frames_of_a_rejection_say_what_the_target_wanted():
    st = hand_trace()
    st.accepted_nodes = [0, 2]            # the target took 12, then wanted 9 where the draft offered 15
    st.node_target_argmax = [12, 13, 9, 99, 5, 6]
    st.emitted_tokens, st.bonus_token = [12, 9], 9
    acc = round_frames(st, decode_fn)[3]
    assert "`<12>`" in acc.sentence and "wanted `<9>`" in acc.sentence and "`<15>`" in acc.sentence


def test_frames_of_a_sampling_trace():
    frames = round_frames(hand_trace("sample"), decode_fn, engine="dart")
    acc = frames[3].sentence
    assert "p/q" in acc and "probability" in acc and "`<99>`" in acc
    assert "top choice" not in acc
    assert "by probability" in frames[2].sentence
    assert "3 tokens" in frames[4].sentence


def test_frames_of_an_eagle3_trace_count_one_forward_per_level():
    frames = round_frames(hand_trace(), decode_fn, engine="eagle3")
    assert "once per tree level" in frames[0].sentence and "3 forward passes" in frames[0].sentence
    assert "cumulative log-probability" in frames[1].sentence
    assert "3 head forwards" in frames[0].title


def test_frames_of_a_prompt_lookup_trace_without_candidates():
    frames = round_frames(lookup_trace(), decode_fn, engine="prompt_lookup")
    assert [f.key for f in frames] == list(FRAME_KEYS)
    for f in frames:
        check_layout(f.figure)
    assert "scores no candidates" in frames[0].sentence and "3 tokens" in frames[0].sentence
    assert "copied from the prompt" in frames[0].title
    assert "Nothing to prune" in frames[1].sentence
    assert "4 nodes" in frames[2].sentence and "1 of the 3 drafted tokens equals" in frames[2].sentence
    assert "wanted `<30>`" in frames[3].sentence and "`<22>`" in frames[3].sentence
    assert "2 tokens" in frames[4].sentence and "2 rejected nodes" in frames[4].sentence


def test_frames_of_a_plain_one_node_step():
    frames = round_frames(plain_trace(), decode_fn, engine="dart")
    assert [f.key for f in frames] == list(FRAME_KEYS)
    for f in frames:
        check_layout(f.figure)
    assert "nothing" in frames[0].sentence and "plain step" in frames[0].sentence
    assert "single root node" in frames[2].sentence and "`<11>`" in frames[2].sentence
    assert "no draft" in frames[3].title
    assert "nothing to accept" in frames[3].sentence and "`<11>`" in frames[3].sentence
    assert "1 token" in frames[4].sentence and "no KV-cache entry" in frames[4].sentence
    assert "Vanilla" not in frames[0].sentence
    assert "Plain decoding" in round_frames(plain_trace(), engine="vanilla")[0].sentence


def test_frames_accept_dicts_json_and_no_tokenizer():
    st = hand_trace()
    a = round_frames(st.to_dict())
    b = round_frames(st.to_json())
    assert [f.sentence for f in a] == [f.sentence for f in b]
    assert "#99" in a[3].sentence


def test_many_candidates_are_capped_per_parent_and_the_sentence_says_how_many():
    tree = DraftTree.from_parents([1, 2, 3], [-1, 0, 1], [0.0, -0.1, -0.2])
    c = ScoredCandidates()
    c.append(token=2, parent=-1, depth=1, logit_term=-0.1, ngram_term=0.0, score=-0.1, kept=True, node=1)
    for j in range(20):
        c.append(token=100 + j, parent=-1, depth=1, logit_term=-1 - j, ngram_term=0.0, score=-1 - j, kept=False,
                 node=-1)
    c.append(token=3, parent=0, depth=2, logit_term=-0.1, ngram_term=0.0, score=-0.2, kept=True, node=2)
    st = StepTrace(step=1, position=1, tree=tree, accepted_nodes=[0, 1, 2], emitted_tokens=[2, 3, 4],
                   bonus_token=4, node_target_prob=[1, 1, 1], node_target_argmax=[2, 3, 4],
                   timings={s: 0.001 for s in STAGES}, candidates=c)
    f = round_frames(st)[0]
    assert "22 candidates" in f.sentence and f"drawn: {teaching_round.MAX_PER_PARENT + 1} of them" in f.sentence
    pts = [x for t in f.figure.data if t.customdata is not None for x in t.customdata if x[0] == "candidate"]
    assert len(pts) == teaching_round.MAX_PER_PARENT + 1   # 8 under the root (kept one first) + the kept depth-2 one


# ---------------------------------------------------------------------------------------------- measured point
def fake_costs(ms_per_node: float = 1.0, base_ms: float = 10.0):
    return SimpleNamespace(verify_s=lambda n: (base_ms + ms_per_node * (float(n) - 1)) / 1e3)


def test_measured_point_from_traces_and_a_fake_cost_model():
    sts = [hand_trace(), lookup_trace(), plain_trace()]
    p = measured_point(sts, fake_costs(), label="DART on this CPU")
    # accepted drafts 2 + 1 + 0; rejections: hand stopped at a leaf (none), lookup stopped at a rejection (1)
    assert p["alpha"] == pytest.approx(3 / 4)
    assert p["draft_acceptance_rate"] == pytest.approx(3 / 8)
    assert p["tau"] == pytest.approx((3 + 2 + 1) / 3)
    assert p["depth"] == round((2 + 3) / 2)
    mean_nodes = (6 + 4 + 1) / 3
    assert p["mean_nodes"] == pytest.approx(mean_nodes)
    assert p["verify_ratio"] == pytest.approx((10 + mean_nodes - 1) / 10)
    draft_s = np.mean([0.003, 0.0002, 0.002])
    assert p["draft_ratio"] == pytest.approx(draft_s / 0.010)
    step_s = np.mean([0.0075, 0.0047, 0.004])
    assert p["speedup"] == pytest.approx(p["tau"] * 0.010 / step_s)
    assert p["expected_speedup"] == pytest.approx(
        expected_speedup(p["alpha"], p["depth"], p["verify_ratio"], p["draft_ratio"]))
    assert p["label"] == "DART on this CPU" and p["steps"] == 3
    assert measured_point([hand_trace()], fake_costs(), depth=6)["depth"] == 6
    with pytest.raises(ValueError):
        measured_point([], fake_costs())


# ---------------------------------------------------------------------------------------------- what-if figure
def test_whatif_figure_marks_the_measured_points_break_even_and_gpu_regime():
    cpu = {"alpha": 0.35, "verify_ratio": 2.2, "speedup": 0.8, "label": "DART on this CPU"}
    other = {"alpha": 0.5, "verify_ratio": 5.5, "label": "EAGLE-3 on this CPU"}
    fig = whatif_figure(measured=[cpu, other], depth=4, draft_ratio=0.1,
                        verify_curve=lambda n: 1 + 0.1 * (n - 1))
    check_layout(fig)
    pts = named(fig, "DART on this CPU (0.80\u00d7)")
    assert pts and list(pts[0].x) == [0.35] and list(pts[0].y) == [2.2]
    assert named(fig, "EAGLE-3 on this CPU")
    assert fig.layout.yaxis.range[1] >= 5.5                     # the axis grows to show every point
    box = named(fig, "the paper's GPU regime")[0]
    assert min(box.x) == GPU_ALPHA_RANGE[0] and max(box.x) == GPU_ALPHA_RANGE[1]
    assert min(box.y) == GPU_VERIFY_RATIO_RANGE[0] and max(box.y) == GPU_VERIFY_RATIO_RANGE[1]
    line = named(fig, "1.0\u00d7: break-even")[0]
    for a, v in zip(line.x, line.y):
        assert expected_speedup(a, 4, v, 0.1) == pytest.approx(1.0)
    assert named(fig, "this machine: 33 nodes") and named(fig, "this machine: 5 nodes")
    heat = [t for t in fig.data if t.type == "heatmap"][0]
    assert np.allclose(np.exp(np.asarray(heat.z)), np.asarray(heat.customdata))
    assert min(heat.x) == 0.0 and max(heat.x) == pytest.approx(0.95) and min(heat.y) == 1.0
    # the GPU regime pays, this CPU point does not
    assert expected_speedup(np.mean(GPU_ALPHA_RANGE), 4, np.mean(GPU_VERIFY_RATIO_RANGE), 0.1) > 2.0
    assert expected_speedup(0.35, 4, 2.2, 0.1) < 1.0
    single = whatif_figure(measured=measured_point([hand_trace()], fake_costs(), label="run"))
    assert [t.name for t in single.data if t.name and t.name.startswith("run")]
    assert math.isfinite(whatif_figure().layout.yaxis.range[1])
    notes = [a.text for a in fig.layout.annotations]
    assert notes == ["speculation pays", "slower than plain decoding"]
