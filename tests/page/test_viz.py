"""Visualiser figures (dart_core.ui.viz_tree, viz_steps, viz_cost over the style of dart_core.ui.viz) and trace analytics (dart_core.engine.trace_stats): layout, node/candidate/bar counts, the accepted path, JSON replay,
token positions and token spans, on real traces from the engine (prompt lookup, DART with a random
head and a tiny N-gram table, DART with an oracle head) and on a hand-made trace."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dart_core.engine import trace_stats
from dart_core.ui import viz, viz_cost, viz_steps, viz_tree
from dart_core.ui.record import token_spans
from dart_core.config import GenerationConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.drafters import PromptLookupDrafter
from dart_core.drafters.dart import DartDrafter
from dart_core.models.heads.dart import new_head_for_target
from dart_core.drafters.pruning import PruningConfig
from dart_core.engine.trace import STAGES, ScoredCandidates, StepTrace
from dart_core.engine.tree import DraftTree
from tiny_models import stand_in_drafter

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def prompt_ids(tiny_llama):
    return tiny_llama.tokenizer.encode(PROMPT, add_special_tokens=False)


@pytest.fixture(scope="module")
def lookup_run(tiny_llama, prompt_ids):
    return SpeculativeEngine(tiny_llama, PromptLookupDrafter()).generate(
        prompt_ids, GenerationConfig(max_new_tokens=40, max_length=200))


@pytest.fixture(scope="module")
def dart_run(tiny_llama, tiny_store, prompt_ids):
    head = new_head_for_target(tiny_llama, draft_ids=torch.arange(1, tiny_llama.vocab_size, 3), draft_length=4, seed=5)
    drafter = DartDrafter(head, tiny_store, tiny_llama.eos_token_ids, PruningConfig(budget=24))
    return SpeculativeEngine(tiny_llama, drafter).generate(prompt_ids,
                                                          GenerationConfig(max_new_tokens=24, max_length=200))


@pytest.fixture(scope="module")
def oracle_run(tiny_llama, prompt_ids):
    """DART with a head that always ranks the target's own next tokens first: long accepted paths,
    and (max_new_tokens not a multiple of the step length) a last tree cut by the engine."""
    cfg = GenerationConfig(max_new_tokens=23, max_length=200)
    truth = SpeculativeEngine(tiny_llama).generate(prompt_ids, cfg).tokens
    head = new_head_for_target(tiny_llama, draft_length=4, seed=0)
    to_draft = head.target_to_draft()
    full = list(prompt_ids) + truth

    def oracle_step(aux, next_ids, cache, levels=None):
        cache.length += int(next_ids.shape[0])
        logits = torch.randn(levels or head.config.draft_length + 1, head.config.draft_vocab_size,
                             generator=torch.Generator().manual_seed(cache.length))
        for level in range(logits.shape[0]):
            if cache.length + 1 + level < len(full):
                logits[level, to_draft[full[cache.length + 1 + level]]] = 20.0
        return logits
    head.step = oracle_step
    res = SpeculativeEngine(tiny_llama, DartDrafter(head, None, tiny_llama.eos_token_ids, PruningConfig(budget=30),
                                                        head_backend="torch")).generate(
        prompt_ids, cfg)
    assert res.tokens == truth
    return res


@pytest.fixture(scope="module")
def all_runs(lookup_run, dart_run, oracle_run):
    return {"prompt_lookup": lookup_run, "dart": dart_run, "oracle": oracle_run}


def hand_trace(mode: str = "greedy") -> StepTrace:
    """Root 10 -> {11 -> {13, 14}, 12 -> {15}}; the target accepts 11, 13, then says 99 (bonus).
    Candidates add two pruned ones: 16 under the root and 17 under 13. (tests/page/test_teaching.py uses it too.)"""
    tree = DraftTree.from_parents([10, 11, 12, 13, 14, 15], [-1, 0, 0, 1, 1, 2],
                                  [0.0, -0.1, -0.5, -0.3, -0.9, -0.8])
    cands = ScoredCandidates()
    rows = [  # token, parent, depth, logit, ngram, kept, node
        (11, -1, 1, -0.1, 0.0, True, 1), (12, -1, 1, -0.5, 0.0, True, 2), (16, -1, 1, -2.0, 0.0, False, -1),
        (13, 0, 2, -0.1, -0.1, True, 3), (14, 0, 2, -0.5, -0.3, True, 4), (15, 1, 2, -0.1, -0.2, True, 5),
        (17, 3, 3, -0.6, -0.6, False, -1)]
    score: dict[int, float] = {}
    for i, (tok, par, dep, lt, nt, kept, node) in enumerate(rows):
        score[i] = (0.0 if par < 0 else score[par]) + lt + nt
        cands.append(token=tok, parent=par, depth=dep, logit_term=lt, ngram_term=nt, score=score[i],
                     kept=kept, node=node)
    return StepTrace(step=1, position=1, tree=tree, accepted_nodes=[0, 1, 3], emitted_tokens=[11, 13, 99],
                     bonus_token=99, node_target_prob=[1.0, 0.9, 0.2, 0.8, 0.1, 0.3],
                     node_target_argmax=[11, 13, 7, 99, 5, 6],
                     timings={"draft_forward": 0.001, "tree_build": 0.002, "verify": 0.004, "commit": 0.0005},
                     candidates=cands, mode=mode)


def decode_fn(ids):
    return "".join(f"<{i}>" for i in ids)


def check_chart(fig) -> None:
    """Every chart: a visible legend with named entries, and a title on every axis."""
    assert fig.layout.showlegend is True
    assert any(t.showlegend is not False and t.name for t in fig.data)
    axes = [k for k in fig.layout.to_plotly_json() if k.startswith(("xaxis", "yaxis"))]
    assert axes
    for k in axes:
        ax = fig.layout[k]
        assert ax.title.text, f"{k} has no title"


def node_points(fig) -> dict[str, list]:
    """customdata kind -> list of (index, x, y) over all marker traces."""
    out: dict[str, list] = {}
    for t in fig.data:
        if t.customdata is None or t.mode is None or "markers" not in t.mode:
            continue
        for cd, x, y in zip(t.customdata, t.x, t.y):
            out.setdefault(cd[0], []).append((int(cd[1]), x, y))
    return out


def trace_named(fig, name):
    matches = [t for t in fig.data if t.name == name and list(t.x) != [None]]  # legend proxies have no points
    assert len(matches) == 1, [t.name for t in fig.data]
    return matches[0]


def edges_of(trace) -> set[tuple[tuple[float, float], tuple[float, float]]]:
    xs, ys = list(trace.x), list(trace.y)
    return {((xs[i], ys[i]), (xs[i + 1], ys[i + 1])) for i in range(0, len(xs), 3)}


# ---------------------------------------------------------------------------------------------- layout
def test_layout_of_a_small_tree_is_exact():
    x, y = viz_tree.tree_layout([-1, 0, 0, 1, 1, 2], [0.0, -0.1, -0.5, -0.3, -0.9, -0.8])
    assert x.tolist() == [0, 1, 1, 2, 2, 2]
    assert y.tolist() == [1.25, 0.5, 2.0, 0.0, 1.0, 2.0]
    # children are ranked by score: swapping the two children's scores swaps their rows
    x2, y2 = viz_tree.tree_layout([-1, 0, 0, 1, 1, 2], [0.0, -0.5, -0.1, -0.3, -0.9, -0.8])
    assert y2[2] < y2[1]


def check_layout(parents, scores, depths=None) -> None:
    x, y = viz_tree.tree_layout(parents, scores)
    again = viz_tree.tree_layout(list(parents), list(scores))
    assert x.tolist() == again[0].tolist() and y.tolist() == again[1].tolist()      # deterministic
    parents = [int(p) for p in parents]
    if depths is not None:
        assert x.tolist() == [float(d) for d in depths]                             # x = depth
    for i, p in enumerate(parents):
        if p >= 0:
            assert x[i] == x[p] + 1
    kids = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    for p, ch in kids.items():
        if p >= 0:  # a parent sits within its children's rows
            assert min(y[ch]) <= y[p] <= max(y[ch])
    for d in set(x.tolist()):                                                        # no overlaps
        rows = np.sort(y[x == d])
        assert (np.diff(rows) >= 1.0 - 1e-12).all()


def test_layout_of_random_trees_has_no_overlaps():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 30, 200):
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
        scores = rng.normal(size=n).round(1)  # rounded: ties must be broken deterministically
        tree = DraftTree.from_parents(list(range(n)), parents, scores)
        check_layout(parents, scores, tree.depths)


def test_layout_of_engine_trees(all_runs):
    for res in all_runs.values():
        for tr in res.traces:
            check_layout(tr.tree.parents, tr.tree.scores, tr.tree.depths)


def test_layout_rejects_bad_parents():
    with pytest.raises(ValueError, match="cycle"):
        viz_tree.tree_layout([-1, 2, 1])
    with pytest.raises(ValueError, match="parent"):
        viz_tree.tree_layout([-1, 5])


# ---------------------------------------------------------------------------------------------- tree figure
def test_tree_figure_of_the_hand_trace():
    st = hand_trace()
    fig = viz_tree.tree_figure(st, decode_fn)
    check_chart(fig)
    pts = node_points(fig)
    assert sorted(i for i, _, _ in pts["node"]) == list(range(len(st.tree)))
    assert "candidate" not in pts
    (bonus,) = pts["bonus"]
    assert bonus[1] == 3.0                                                   # one past the last accepted node
    accepted = trace_named(fig, viz.NODE_STATES["accepted"][0])
    assert [cd[1] for cd in accepted.customdata] == [1, 3]
    assert list(accepted.text) == ["&lt;11&gt;", "&lt;13&gt;"]                # escaped: plotly labels are HTML
    # the accepted path edge trace joins root -> 1 -> 3
    pos = {i: (x, y) for i, x, y in pts["node"]}
    assert edges_of(trace_named(fig, "accepted path")) == {(pos[0], pos[1]), (pos[1], pos[3])}
    assert edges_of(trace_named(fig, "target's own token (bonus)")) == {(pos[3], (bonus[1], bonus[2]))}
    assert fig.layout.coloraxis.colorbar.title.text == "combined score"
    hover = " ".join(accepted.hovertext)
    assert "logit term: -0.100" in hover and "N-gram term: -0.100" in hover and "combined score: -0.300" in hover
    assert "target's own choice here" in hover
    legend = [t.name for t in fig.data if t.showlegend]
    for state in ("root", "accepted", "rejected", "bonus"):
        assert viz.NODE_STATES[state][0] in legend


def test_tree_figure_shows_pruned_candidates_on_request():
    st = hand_trace()
    fig = viz_tree.tree_figure(st, show_pruned=True)
    pts = node_points(fig)
    assert sorted(i for i, _, _ in pts["candidate"]) == [2, 6]             # 16 under the root, 17 under 13
    assert viz.NODE_STATES["pruned"][0] in [t.name for t in fig.data if t.showlegend]
    pos = {("node", i): (x, y) for i, x, y in pts["node"]} | {("c", i): (x, y) for i, x, y in pts["candidate"]}
    assert pos[("c", 6)][0] == pos[("node", 3)][0] + 1
    # nothing overlaps, pruned nodes and bonus included
    all_xy = [(x, y) for v in pts.values() for _, x, y in v]
    assert len(set(all_xy)) == len(all_xy)
    assert len(viz_tree.tree_figure(st, show_pruned=True, max_pruned_per_node=0).data) == len(viz_tree.tree_figure(st).data)


def test_tree_figure_caps_pruned_candidates_best_first_and_says_so():
    st = hand_trace()
    fig = viz_tree.tree_figure(st, show_pruned=True, max_pruned=1)
    assert [i for i, _, _ in node_points(fig)["candidate"]] == [6]        # -1.5 beats 16's -2.0
    assert f"{viz.NODE_STATES['pruned'][0]} (best 1 of 2 shown)" in [t.name for t in fig.data if t.showlegend]
    full = viz_tree.tree_figure(st, show_pruned=True)
    assert not any("shown)" in (t.name or "") for t in full.data)
    assert "candidate" not in node_points(viz_tree.tree_figure(st, show_pruned=True, max_pruned=0))


def test_tree_labels_sit_above_a_node_whose_child_is_on_its_row():
    st = hand_trace()
    fig = viz_tree.tree_figure(st, decode_fn)
    where = {}
    for t in fig.data:
        if t.customdata is not None and t.textposition is not None:
            positions = [t.textposition] * len(t.customdata) if isinstance(t.textposition, str) else t.textposition
            where.update({(cd[0], int(cd[1])): p for cd, p in zip(t.customdata, positions)})
    # node 2's one child (5) and node 3's bonus token are drawn on their rows: the edge would cross the label
    assert where[("node", 2)] == where[("node", 3)] == "top center"
    assert where[("node", 1)] == where[("node", 4)] == "middle right"     # 1 sits between its two children
    bonus = trace_named(fig, viz.NODE_STATES["bonus"][0])
    assert bonus.textfont.size > 11 and "<b>" in bonus.text[0]


def test_a_tall_tree_puts_its_depth_axis_and_legend_on_top():
    n = 41
    tree = DraftTree.from_parents(list(range(100, 100 + n)), [-1] + [0] * (n - 1), [0.0] + [-0.1 * i for i in range(1, n)])
    st = StepTrace(step=1, position=0, tree=tree, accepted_nodes=[0, 1], emitted_tokens=[101, 99], bonus_token=99,
                   node_target_prob=[1.0] * n, node_target_argmax=[101] + [99] * (n - 1),
                   timings={"draft_forward": 0.001, "tree_build": 0.001, "verify": 0.002, "commit": 0.0}, mode="greedy")
    tall = viz_tree.tree_figure(st)
    assert tall.layout.height > viz_tree.TALL_TREE_PX
    assert tall.layout.xaxis.side == "top" and tall.layout.legend.yanchor == "top" and tall.layout.legend.y > 0.9
    small = viz_tree.tree_figure(hand_trace())
    assert small.layout.height <= viz_tree.TALL_TREE_PX and small.layout.xaxis.side == "bottom"


def test_node_details_of_the_hand_trace():
    d = viz_tree.node_details(hand_trace(), 3, decode_fn)
    assert d["state"] == "accepted" and d["depth"] == 2 and d["text"] == "<13>"
    assert d["logit_term"] == pytest.approx(-0.1) and d["ngram_term"] == pytest.approx(-0.1)
    assert d["score"] == pytest.approx(-0.3) and d["target_prob"] == 0.8
    assert d["target_choice"] == 13 and d["matches_target"] and d["bonus_token"] == 99
    r = viz_tree.node_details(hand_trace(), 4)
    assert r["state"] == "rejected" and r["target_choice"] == 13 and not r["matches_target"]
    with pytest.raises(IndexError):
        viz_tree.node_details(hand_trace(), 6)


def test_tree_hovers_rank_every_scored_node_and_pruned_candidate():
    """Hand trace scores, best first: c0 -0.1, c3 -0.3, c1 -0.5, c5 -0.8, c4 -0.9, c6 -1.5 (17), c2 -2.0 (16)."""
    st = hand_trace()
    fig = viz_tree.tree_figure(st, decode_fn, show_pruned=True)
    pruned = trace_named(fig, viz.NODE_STATES["pruned"][0])
    hover = dict(zip([cd[1] for cd in pruned.customdata], pruned.hovertext))
    assert "rank 7 of 7 by combined score" in hover[2] and "rank 3 of 3 among its parent's candidates" in hover[2]
    assert "rank 6 of 7 by combined score" in hover[6] and "rank 1 of 1 among its parent's candidates" in hover[6]
    for ci in (2, 6):  # the terms stay
        assert "logit term" in hover[ci] and "N-gram term" in hover[ci] and "combined score:" in hover[ci]
    accepted = trace_named(fig, viz.NODE_STATES["accepted"][0])
    node_hover = dict(zip([cd[1] for cd in accepted.customdata], accepted.hovertext))
    assert "rank 2 of 7 by combined score" in node_hover[3]
    assert "rank 1 of 2 among its parent's candidates" in node_hover[3]
    rejected = trace_named(fig, viz.NODE_STATES["rejected"][0])
    node_hover = dict(zip([cd[1] for cd in rejected.customdata], rejected.hovertext))
    assert "rank 5 of 7 by combined score" in node_hover[4] and "rank 2 of 2 among its parent's" in node_hover[4]
    root = trace_named(fig, viz.NODE_STATES["root"][0])
    assert "rank" not in root.hovertext[0]
    d = viz_tree.node_details(st, 5)
    assert (d["candidate"], d["rank"], d["candidates"], d["sibling_rank"], d["siblings"]) == (5, 4, 7, 1, 1)
    assert viz_tree.node_details(st, 0)["rank"] is None
    # faded, grey labels, each at its own depth (x = the candidate's depth)
    assert pruned.marker.opacity == pytest.approx(0.45) and pruned.textfont.color == viz.OKABE_ITO["grey"]
    assert [x for x in pruned.x] == [float(st.candidates.depth[cd[1]]) for cd in pruned.customdata]
    # a trace without candidates (prompt lookup) has no rank lines
    plain = StepTrace(**{**st.__dict__, "candidates": None})
    assert not any("rank" in h for t in viz_tree.tree_figure(plain).data if t.hovertext for h in t.hovertext)


def test_tree_customdata_gives_each_marker_its_answer_position():
    st = hand_trace()   # position 1: emits 11 (pos 1), 13 (pos 2) and the bonus 99 (pos 3)
    fig = viz_tree.tree_figure(st, show_pruned=True)
    pos = {}
    for t in fig.data:
        if t.customdata is not None and t.mode and "markers" in t.mode:
            for cd in t.customdata:
                assert len(cd) == 3
                pos[(cd[0], int(cd[1]))] = int(cd[2])
    assert pos == {("node", 0): -1, ("node", 1): 1, ("node", 3): 2,              # root, accepted path
                   ("node", 2): 1, ("node", 4): 2, ("node", 5): 2,               # rejected: the slot they competed for
                   ("bonus", -1): 3, ("candidate", 2): 1, ("candidate", 6): 3}   # bonus, pruned 16 (d1), 17 (d3)
    assert viz_tree.node_details(st, 3)["answer_position"] == 2 and viz_tree.node_details(st, 0)["answer_position"] == -1
    # a bonus the engine did not emit (generation stopped at the last accepted draft) has no position
    cut = StepTrace(**{**st.__dict__, "emitted_tokens": [11, 13], "stop_reason": "max_new_tokens"})
    bonus = next(t for t in viz_tree.tree_figure(cut).data if t.customdata is not None and t.customdata[0][0] == "bonus")
    assert list(bonus.customdata[0]) == ["bonus", -1, -1]


def test_answer_positions_match_the_answer_of_engine_runs(all_runs):
    """Accepted nodes and emitted bonus tokens point at their own token in the answer (token_origins lists the
    answer from position 0, the prefill's token); every step's positions agree with step_for_token."""
    for res in all_runs.values():
        tokens, _ = trace_stats.token_origins(res.traces)
        for k, st in enumerate(res.traces):
            fig = viz_tree.tree_figure(st, show_pruned=True)
            for t in fig.data:
                if t.customdata is None or not t.mode or "markers" not in t.mode:
                    continue
                for cd in t.customdata:
                    kind, idx, p = cd[0], int(cd[1]), int(cd[2])
                    if kind == "bonus":
                        assert p == -1 or (tokens[p] == st.bonus_token and trace_stats.step_for_token(
                            res.traces, p) == k)
                    elif kind == "node" and idx == 0:
                        assert p == -1
                    elif kind == "node" and idx in st.accepted_nodes:
                        assert tokens[p] == int(st.tree.tokens[idx]) and trace_stats.step_for_token(res.traces, p) == k
                    else:
                        depth = int(st.tree.depths[idx]) if kind == "node" else int(st.candidates.depth[idx])
                        assert p == st.position + depth - 1


def test_timing_figure_marks_the_selected_step_of_an_engine(dart_run, lookup_run):
    runs = {"a": dart_run.traces, "b": lookup_run.traces}
    plain = viz_steps.timing_figure(runs)
    assert not plain.layout.shapes and not [a for a in plain.layout.annotations if a.text == "selected step"]
    step = lookup_run.traces[2].step
    fig = viz_steps.timing_figure(runs, mark={"b": step, "missing engine": 1})
    (shape,) = fig.layout.shapes
    sub = fig.get_subplot(2, 1)                       # engine "b": row 2, its "time per step by stage" plot
    xref = sub.xaxis.plotly_name.replace("axis", "")
    assert shape.name == "selected step: b" and shape.xref == xref and shape.x0 < step < shape.x1
    assert shape.x1 - shape.x0 == pytest.approx(1.0) and shape.opacity < 1
    (label,) = [a for a in fig.layout.annotations if a.text == "selected step"]
    assert label.xref == xref and label.x == step
    check_chart(fig)
    # a step the engine does not have is not marked
    assert not viz_steps.timing_figure(runs, mark={"a": 10_000}).layout.shapes


def test_scores_without_ngram_term_are_labelled_plainly():
    """EAGLE-3-like trace: cumulative log-prob scores, no N-gram term."""
    st = hand_trace()
    st.candidates.ngram_term = [0.0] * len(st.candidates)
    fig = viz_tree.tree_figure(st)
    hover = " ".join(h for t in fig.data if t.hovertext is not None for h in t.hovertext)
    assert "N-gram term" not in hover and "score: " in hover
    assert fig.layout.coloraxis.colorbar.title.text == "score"
    labelled = viz_tree.tree_figure(st, score_label="cumulative log-prob")
    assert labelled.layout.coloraxis.colorbar.title.text == "cumulative log-prob"
    assert any("no N-gram term" in a.text for a in viz_tree.score_scatter(st).layout.annotations)


def test_tree_figures_of_engine_traces(all_runs, tiny_llama):
    for name, res in all_runs.items():
        for st in res.traces:
            fig = viz_tree.tree_figure(st, tiny_llama.tokenizer, show_pruned=True)
            pts = node_points(fig)
            assert sorted(i for i, _, _ in pts["node"]) == list(range(len(st.tree)))
            assert len(pts["bonus"]) == 1
            accepted = trace_named(fig, viz.NODE_STATES["accepted"][0])
            assert [cd[1] for cd in accepted.customdata] == st.accepted_nodes[1:]
            assert len(edges_of(trace_named(fig, "accepted path"))) == st.accepted_drafts
            xy = [(x, y) for v in pts.values() for _, x, y in v]
            assert len(set(xy)) == len(xy)
            if st.candidates is None:
                assert "candidate" not in pts


def test_oracle_trace_highlights_the_accepted_path(oracle_run):
    full = [st for st in oracle_run.traces if st.stop_reason is None]
    assert full and all(st.accepted_drafts == 5 for st in full)            # D + 1 = 5 levels, all accepted
    fig = viz_tree.tree_figure(full[0])
    accepted = trace_named(fig, viz.NODE_STATES["accepted"][0])
    assert list(accepted.x) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert accepted.marker.line.color == viz.NODE_STATES["accepted"][1]


# ---------------------------------------------------------------------------------------------- mapping and scatter
def test_candidate_nodes_follow_the_tree_even_when_the_engine_cuts_it(dart_run, oracle_run):
    """The engine cuts trees deeper than the tokens still allowed; the trace's candidates must
    then point into the verified (cut) tree, with the cut ones marked pruned."""
    for res in (dart_run, oracle_run):
        for st in res.traces:
            c = st.candidates
            nodes = trace_stats.candidate_nodes(st)
            kept = [i for i in range(len(c)) if c.kept[i]]
            assert sorted(nodes[i] for i in kept) == list(range(1, len(st.tree)))
            assert all(nodes[i] == -1 for i in range(len(c)) if not c.kept[i])
            for i in kept:
                assert st.tree.tokens[nodes[i]] == c.token[i]
                parent_node = 0 if c.parent[i] < 0 else nodes[c.parent[i]]
                assert st.tree.parents[nodes[i]] == parent_node


def test_score_scatter_counts(dart_run, oracle_run):
    for st in dart_run.traces + oracle_run.traces:
        fig = viz_tree.score_scatter(st)
        check_chart(fig)
        counts = {t.legendgroup: len(t.x) for t in fig.data}
        assert sum(counts.values()) == len(st.candidates)
        assert counts["accepted"] == st.accepted_drafts
        assert counts["kept"] + counts["accepted"] == len(st.tree) - 1 or st.stop_reason is not None
        assert counts["pruned"] == sum(not bool(k) for k in st.candidates.kept)
    # the N-gram table made some N-gram terms non-zero
    assert any(y != 0 for st in dart_run.traces for t in viz_tree.score_scatter(st).data for y in t.y)
    # the root's children sit at N-gram term 0 by DART's rule, and their hovers say so (issue 42 item 7)
    st = next(st for st in dart_run.traces if any(v != 0 for v in st.candidates.ngram_term))
    for t in viz_tree.score_scatter(st).data:
        for i, y, text in zip(t.customdata, t.y, t.hovertext):
            assert ("depth 1: no N-gram term" in text) == (int(st.candidates.depth[i]) == 1)
            if int(st.candidates.depth[i]) == 1:
                assert y == 0


def test_score_scatter_without_candidates(lookup_run):
    fig = viz_tree.score_scatter(lookup_run.traces[0])
    check_chart(fig)
    assert sum(len(t.x) for t in fig.data) == 0
    assert any("no candidates scored" in a.text for a in fig.layout.annotations)


# ---------------------------------------------------------------------------------------------- timings, acceptance
def test_timing_figure_has_a_bar_per_step_and_stage(all_runs):
    runs = {k: v.traces for k, v in all_runs.items()}
    fig = viz_steps.timing_figure(runs)
    check_chart(fig)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == len(STAGES) * (len(runs) + 1)
    per_step = bars[: len(STAGES) * len(runs)]
    for k, (name, steps) in enumerate(runs.items()):
        for j, stage in enumerate(STAGES):
            b = per_step[k * len(STAGES) + j]
            assert b.name == stage and len(b.x) == len(steps)
            assert list(b.y) == pytest.approx([1000 * st.timings[stage] for st in steps])
    totals = bars[len(STAGES) * len(runs):]
    assert all(list(t.x) == list(runs) for t in totals)
    assert sum(totals[j].y[0] for j in range(len(STAGES))) == pytest.approx(
        1000 * sum(st.timings[s] for st in runs["prompt_lookup"] for s in STAGES))
    lines = [t for t in fig.data if t.type == "scatter"]
    assert len(lines) == 2 * len(runs)
    assert list(lines[0].y) == [len(st.tree) for st in runs["prompt_lookup"]]
    assert list(lines[1].y) == [st.acceptance_length for st in runs["prompt_lookup"]]


def test_acceptance_metrics_match_the_engine(all_runs):
    for res in all_runs.values():
        m = trace_stats.acceptance_metrics(res.traces)
        assert m["tau"] == pytest.approx(res.stats.tau)
        assert m["steps"] == len(res.traces) and sum(m["histogram"].values()) == m["steps"]
        assert m["tokens"] == len(res.tokens) - 1
        assert all(0.0 <= r <= g <= 1.0 for r, g in zip(m["per_depth"], m["per_depth_given_drafted"]))
    m = trace_stats.acceptance_metrics(all_runs["oracle"].traces)
    # the oracle's every drafted level is accepted; its last tree was cut to 3 levels
    assert m["per_depth_given_drafted"] == [1.0] * 5
    assert m["per_depth"] == [1.0, 1.0, 1.0, 0.75, 0.75] and m["histogram"] == {4: 1, 6: 3}


def test_acceptance_figures(all_runs):
    steps = all_runs["oracle"].traces
    figs = viz_steps.acceptance_figures(steps, name="dart")
    for fig in figs:
        check_chart(fig)
    drafts, bonus = figs.per_step.data[0], figs.per_step.data[1]
    assert [a + b for a, b in zip(drafts.y, bonus.y)] == [st.acceptance_length for st in steps]
    assert sum(figs.histogram.data[0].y) == len(steps)
    assert len(figs.per_depth.data[0].x) == max(st.tree.max_depth for st in steps)
    hand = trace_stats.acceptance_metrics([hand_trace()])
    assert hand["tau"] == 3 and hand["per_depth"] == [1.0, 1.0] and hand["draft_acceptance_rate"] == 2 / 5


# ---------------------------------------------------------------------------------------------- JSON replay
def figures_of(steps, tokenizer) -> list[str]:
    out = [viz_steps.timing_figure({"a": steps}).to_json()]
    out += [f.to_json() for f in viz_steps.acceptance_figures(steps)]
    for st in steps[:4] + steps[-1:]:
        out.append(viz_tree.tree_figure(st, tokenizer, show_pruned=True).to_json())
        out.append(viz_tree.score_scatter(st, tokenizer).to_json())
    return out


def test_figures_are_identical_from_json(all_runs, tiny_llama):
    for res in list(all_runs.values()):
        steps = res.traces
        as_dicts = [json.loads(st.to_json()) for st in steps]
        as_json = json.dumps([st.to_dict() for st in steps])
        live = figures_of(steps, tiny_llama.tokenizer)
        assert live == figures_of(as_dicts, tiny_llama.tokenizer)
        assert live == figures_of(trace_stats.as_steps(as_json), tiny_llama.tokenizer)
        assert token_spans(steps, tiny_llama.tokenizer) == token_spans(as_dicts, tiny_llama.tokenizer)
    st = hand_trace()
    assert viz_tree.tree_figure(st).to_json() == viz_tree.tree_figure(st.to_json()).to_json()


# ---------------------------------------------------------------------------------------------- tokens
def test_step_for_token(all_runs):
    for res in all_runs.values():
        steps = res.traces
        assert trace_stats.step_for_token(steps, 0) is None                     # chosen by the prefill
        for pos in range(1, len(res.tokens)):
            k = trace_stats.step_for_token(steps, pos)
            st = steps[k]
            assert st.emitted_tokens[pos - st.position] == res.tokens[pos]
        assert trace_stats.step_for_token(steps, len(res.tokens)) is None
    st = hand_trace()
    assert [trace_stats.step_for_token([st.to_dict()], p) for p in range(5)] == [None, 0, 0, 0, None]


def test_token_spans_cover_exactly_the_generated_tokens(all_runs, tiny_llama):
    for res in all_runs.values():
        tokens, labels = trace_stats.token_origins(res.traces)
        assert tokens == res.tokens
        spans = token_spans(res.traces, tiny_llama.tokenizer)
        assert len(spans) == len(res.tokens)
        assert "".join(t for t, _ in spans) == tiny_llama.tokenizer.decode(res.tokens, skip_special_tokens=True)
        assert spans[0][1] == trace_stats.PREFILL_LABEL
        n_acc = sum(min(st.accepted_drafts, len(st.emitted_tokens)) for st in res.traces)
        assert sum(lab == trace_stats.ACCEPTED_LABEL for _, lab in spans) == n_acc
        assert sum(lab == trace_stats.BONUS_LABEL for _, lab in spans) == len(res.tokens) - 1 - n_acc
        assert set(lab for _, lab in spans) <= set(viz.SPAN_COLORS)
    assert sum(lab == trace_stats.ACCEPTED_LABEL for _, lab in token_spans(all_runs["oracle"].traces,
                                                                        tiny_llama.tokenizer)) > 0
    assert token_spans([hand_trace()], decode_fn) == [
        ("<10>", trace_stats.PREFILL_LABEL), ("<11>", trace_stats.ACCEPTED_LABEL), ("<13>", trace_stats.ACCEPTED_LABEL),
        ("<99>", trace_stats.BONUS_LABEL)]


def test_token_spans_keep_split_characters_whole():
    """A character whose UTF-8 bytes span two tokens goes whole to the token that completes it."""
    vocab = {10: b"a", 11: "\u00e9".encode()[:1], 13: "\u00e9".encode()[1:], 99: b"!"}

    def decode(ids):
        return b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")
    spans = token_spans([hand_trace()], decode)
    assert [t for t, _ in spans] == ["a", "", "\u00e9", "!"]
    assert "".join(t for t, _ in spans) == decode([10, 11, 13, 99])


def test_empty_and_root_only_inputs_render():
    """The app renders before the first step and for vanilla decoding (root-only trees, no candidates)."""
    check_chart(viz_steps.timing_figure({}))
    for fig in viz_steps.acceptance_figures([]):
        check_chart(fig)
    assert token_spans([], decode_fn) == [] and trace_stats.step_for_token([], 3) is None
    st = StepTrace(step=1, position=1, tree=DraftTree.root_only(10), accepted_nodes=[0], emitted_tokens=[11],
                   bonus_token=11, node_target_prob=[1.0], node_target_argmax=[11],
                   timings={s: 0.001 for s in STAGES})
    fig = viz_tree.tree_figure(st, decode_fn)
    check_chart(fig)
    pts = node_points(fig)
    assert [p[0] for p in pts["node"]] == [0] and pts["bonus"][0][1:] == (1.0, pts["node"][0][2])
    check_chart(viz_tree.score_scatter(st))
    check_chart(viz_steps.timing_figure({"vanilla": [st, st.to_dict()]}))
    assert token_spans([st], decode_fn) == [("<10>", trace_stats.PREFILL_LABEL), ("<11>", trace_stats.BONUS_LABEL)]


# ---------------------------------------------------------------------------------------------- cost of a tree
def _costs(ms_by_nodes: dict[int, float]):
    """A CostModel measured nowhere: verify ms at a few tree sizes, commit 0.1 ms."""
    from dart_core.sizing.costs import CostModel, VerifyCurve
    sizes = sorted(ms_by_nodes)
    return CostModel(VerifyCurve(sizes, [ms_by_nodes[n] / 1e3 for n in sizes]), 1e-4, source="synthetic")


def _dart_auto(costs):
    """An AutoTree over a stand-in DART drafter (its tree knobs only) with the generic acceptance prior."""
    from dart_core.sizing.acceptance import AcceptanceModel
    from dart_core.sizing.auto import AutoTree
    return AutoTree(stand_in_drafter("dart", draft_length=4), costs, AcceptanceModel.generic())


FLAT = {1: 10.0, 3: 10.1, 9: 10.2, 17: 10.4, 33: 10.8, 64: 11.5}      # a GPU: big trees almost free
STEEP = {1: 5.0, 3: 7.0, 9: 13.0, 17: 21.0, 33: 37.0, 64: 68.0}       # a few CPU cores: every node costs


@pytest.mark.parametrize("curve, words, small", [(FLAT, "memory-bound", False), (STEEP, "compute-bound", True)])
def test_tree_cost_sentence_follows_the_measured_curve(curve, words, small):
    costs = _costs(curve)
    auto = _dart_auto(costs)
    rates = auto.rates()
    text = viz_cost.tree_cost_text(costs, rates, others={"EAGLE-3": "total_token 8, depth 2, top_k 3"})
    assert words in text and ("small trees win" in text) == small and ("big trees win" in text) == (not small)
    assert f"{costs.verify_s(33) * 1e3:.1f} ms" in text and "DART's chooser picks" in text
    assert f"**{rates[0]['label']}**" in text and "EAGLE-3's chooser picks **total_token 8" in text
    best = rates[0]["choice"].settings.get("budget", 0)
    assert (best <= 8) if small else (best >= 20), rates[0]
    # the sentence alone (no AutoTree yet) still explains the machine
    assert words in viz_cost.tree_cost_text(costs) and "chooser" not in viz_cost.tree_cost_text(costs)
    # the kernels' path, when given, is named (a figure says what ran)
    assert "*avx2* path" in viz_cost.tree_cost_text(costs, kernel="avx2") and "path" not in viz_cost.tree_cost_text(costs)
    # and how it was chosen: timed here, or fixed by the variable
    assert "timed on this model's weights" in viz_cost.tree_cost_text(costs, kernel="amx", kernel_source="cached")
    assert "as DART_GEMM_PATH sets it" in viz_cost.tree_cost_text(costs, kernel="avx2", kernel_source="DART_GEMM_PATH")
    assert "*avx2* path (vanilla" in viz_cost.tree_cost_text(costs, kernel="avx2", kernel_source="set by the caller")
    assert "cut among the threads in 2 long ranges a thread" in viz_cost.tree_cost_text(costs, kernel="avx2",
                                                                                        kernel_split=2)
    assert "in chunks of ~48 KiB" in viz_cost.tree_cost_text(costs, kernel="avx2", kernel_split=0)
    assert "cut among" not in viz_cost.tree_cost_text(costs, kernel="avx2")


def test_verify_cost_figure_shows_measured_points_and_the_curve():
    costs = _costs(STEEP)
    fig = viz_cost.verify_cost_figure(costs)
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["measured"].x) == sorted(STEEP) and by_name["measured"].y[-1] == pytest.approx(68.0)
    curve = by_name["interpolated"]
    assert list(curve.x) == list(range(1, 65)) and curve.y[1] == pytest.approx(6.0)   # 2 nodes: between 1 and 3
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text and "7.4" in fig.layout.title.subtitle.text


def test_budget_rate_figure_marks_the_choice_the_plain_step_and_the_papers_budget():
    costs = _costs(STEEP)
    rates = _dart_auto(costs).rates()
    fig = viz_cost.budget_rate_figure(rates)
    names = [t.name for t in fig.data]
    curve = fig.data[0]
    assert curve.name == "expected tokens/s" and list(curve.x) == sorted(curve.x) and 60 in list(curve.x)
    plain = next(r for r in rates if r["choice"].plain)
    ref = next(t for t in fig.data if t.name.startswith("plain target step"))
    assert list(ref.y) == [pytest.approx(plain["tokens_per_s"])] * 2
    chosen = next(t for t in fig.data if t.name.startswith("chosen"))
    assert chosen.y[0] == pytest.approx(rates[0]["tokens_per_s"]) and chosen.y[0] == max(curve.y + ref.y)
    assert "the paper's budget 60" in names and any(s.x0 == 60 for s in fig.layout.shapes)
    # a machine where no tree pays: the plain step is the choice
    slow_draft = _costs(STEEP)
    slow_draft.draft_cost("dart").add((1, 1, 1), 1.0)          # a 1 s head forward
    rates = _dart_auto(slow_draft).rates()
    assert rates[0]["choice"].plain
    fig = viz_cost.budget_rate_figure(rates)
    assert any(t.name.startswith("chosen: plain steps") for t in fig.data)
    assert "plain steps" in viz_cost.tree_cost_text(slow_draft, rates)
