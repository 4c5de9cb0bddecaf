"""Every figure of dart_core.ui.viz_tree, viz_steps and viz_cost, drawn by plotly.js in chromium at the widths
the app shows them (a half and a whole 1280 px page, 800 and 1600 px; the acceptance figures also at a third,
420 px), has
no title, legend, axis title, colorbar title or annotation (subplot titles, bar labels) overlapping
another, and none cut off by the figure's edges (tests/plot_layout.py). The figures are checked as viz
returns them, changed only as gr.Plot changes every layout: the app adds no layout of its own.
Skipped without playwright or chromium, failed under CI=true."""
from __future__ import annotations

import numpy as np
import pytest

from dart_core.engine.trace import STAGES, ScoredCandidates, StepTrace
from dart_core.engine.tree import DraftTree
from dart_core.ui import viz_cost, viz_steps, viz_tree
from plot_layout import CHROMIUM, browser_or_skip, render_figures, text_overlaps, texts_outside

WIDTHS = (640, 800, 1280, 1600)


def synthetic_step(step: int = 3, position: int = 7, n_cands: int = 500, budget: int = 60, seed: int = 0,
                   accept: int = 3) -> StepTrace:
    """A DART-like step: ``n_cands`` scored candidates (a few dozen roots, children of earlier ones, up to
    depth 5), the best ``budget`` kept as the tree (a parent is always kept before its children), the target
    accepting ``accept`` nodes down the best branch and adding its bonus token."""
    rng = np.random.default_rng(seed)
    parent, depth, logit, ngram, score = [], [], [], [], []
    for i in range(n_cands):
        p = -1 if i < 25 else int(rng.integers(0, i))
        while p >= 0 and depth[p] >= 5:
            p = parent[p]
        lt, nt = float(-rng.exponential(1.0)), float(-rng.exponential(0.5))
        parent.append(p)
        depth.append(1 if p < 0 else depth[p] + 1)
        logit.append(lt)
        ngram.append(nt)
        score.append((0.0 if p < 0 else score[p]) + lt + nt)
    node = [-1] * n_cands
    kept_order = []
    for i in sorted(range(n_cands), key=lambda j: -score[j]):
        if len(kept_order) >= budget:
            break
        if parent[i] < 0 or node[parent[i]] >= 0:
            node[i] = 0  # placeholder, numbered below in candidate order (parents precede children)
            kept_order.append(i)
    kept = sorted(kept_order)
    for k, i in enumerate(kept, start=1):
        node[i] = k
    tokens = [100] + [1000 + i for i in kept]
    parents = [-1] + [0 if parent[i] < 0 else node[parent[i]] for i in kept]
    scores = [0.0] + [score[i] for i in kept]
    tree = DraftTree.from_parents(tokens, parents, scores)
    path = [0]
    for _ in range(accept):
        kids = [j for j in range(len(tree)) if parents[j] == path[-1]]
        if not kids:
            break
        path.append(max(kids, key=lambda j: scores[j]))
    cands = ScoredCandidates()
    for i in range(n_cands):
        cands.append(token=1000 + i, parent=parent[i], depth=depth[i], logit_term=logit[i], ngram_term=ngram[i],
                     score=score[i], kept=node[i] >= 0, node=node[i])
    n = len(tree)
    return StepTrace(step=step, position=position, tree=tree, accepted_nodes=path,
                     emitted_tokens=[tokens[j] for j in path[1:]] + [7], bonus_token=7,
                     node_target_prob=[1.0] + [float(v) for v in rng.uniform(0, 1, n - 1)],
                     node_target_argmax=[int(v) for v in rng.integers(0, 50, n)],
                     timings={s: float(rng.uniform(0.001, 0.02)) for s in STAGES}, candidates=cands)


def synthetic_run(steps: int = 12, seed: int = 0) -> list[StepTrace]:
    """Consecutive steps with positions that follow each other (as the engine yields them)."""
    rng = np.random.default_rng(seed)
    out, pos = [], 1
    for k in range(1, steps + 1):
        st = synthetic_step(step=k, position=pos, n_cands=80, budget=20, seed=seed * 100 + k,
                            accept=int(rng.integers(0, 5)))
        out.append(st)
        pos += len(st.emitted_tokens)
    return out


def long_decode(ids):
    """Token texts as long as real ones can get (the tree shortens labels itself)."""
    return "".join(f" token_{i}_with_a_long_text" for i in ids)


def all_figures() -> dict[str, object]:
    from test_viz import FLAT, _costs, _dart_auto
    big = synthetic_step()
    dart, eagle, lookup = synthetic_run(seed=1), synthetic_run(seed=2), synthetic_run(seed=3)
    costs = _costs(FLAT)
    figs = {
        "tree": viz_tree.tree_figure(big, long_decode),
        "tree_pruned": viz_tree.tree_figure(big, long_decode, show_pruned=True),
        "tree_small": viz_tree.tree_figure(synthetic_step(n_cands=12, budget=4, accept=1), show_pruned=True),
        "scatter": viz_tree.score_scatter(big, long_decode),
        "timing": viz_steps.timing_figure({"DART": dart, "EAGLE-3": eagle, "prompt lookup": lookup},
                                    mark={"DART": 4, "EAGLE-3": 2}),
        "timing_one": viz_steps.timing_figure({"DART": dart}),
        "timing_empty": viz_steps.timing_figure({}),
        "verify": viz_cost.verify_cost_figure(costs),
        "budget": viz_cost.budget_rate_figure(_dart_auto(costs).rates()),
    }
    for name, fig in zip(("per_step", "histogram", "per_depth"), viz_steps.acceptance_figures(eagle, name="EAGLE-3")):
        figs[f"acceptance_{name}"] = fig
    return figs


@pytest.fixture(scope="module")
def page():
    sync_playwright = browser_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser.new_page()
        finally:
            browser.close()


@pytest.mark.parametrize("width, gradio", [(w, True) for w in WIDTHS] + [(640, False)])
def test_no_text_overlaps_in_any_figure(page, width, gradio):
    """As gr.Plot shows them (it sets a top margin of 100 px on titled figures), and as plotly.js alone does."""
    figs = all_figures()
    render_figures(page, figs, width, gradio=gradio)
    assert page.locator(".js-plotly-plot").count() == len(figs)
    assert text_overlaps(page, "body") == []
    assert texts_outside(page, "body") == []


def test_acceptance_figures_fit_a_third_of_the_page(page):
    """The app shows the three acceptance figures side by side: about 420 px each on a 1280 px page."""
    figs = viz_steps.acceptance_figures(synthetic_run(seed=4), name="prompt lookup")
    render_figures(page, dict(zip(figs._fields, figs)), 420)
    assert text_overlaps(page, "body") == [] and texts_outside(page, "body") == []


def test_the_checker_sees_overlaps_and_cut_text(page):
    """The checks are not vacuous: a legend on top of the title, a bar label on a subplot title, a title
    wider than its plot."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    bad = go.Figure(go.Scatter(x=[1, 2], y=[1, 2], name="a long legend entry that sits on the title"))
    bad.update_layout(title=dict(text="a title with a legend on it", x=0, xanchor="left", y=0.97),
                      showlegend=True, legend=dict(orientation="h", yref="container", y=1, yanchor="top", x=0),
                      xaxis_title="x axis", yaxis_title="y axis", height=300)
    sub = make_subplots(rows=2, cols=1, subplot_titles=["top plot", "bottom plot"])
    sub.add_trace(go.Bar(x=[1], y=[1]), row=2, col=1)
    sub.add_annotation(x=1, y=1, yref="y2 domain", yanchor="bottom", text="a label over the bar", showarrow=False,
                       row=2, col=1)
    sub.update_layout(showlegend=False, height=400)
    wide = go.Figure(go.Scatter(x=[1], y=[1]))
    wide.update_layout(title="a title much wider than the 300 px its plot is given on this page", height=250)
    render_figures(page, {"bad": bad, "sub": sub, "wide": wide}, 300, gradio=False)
    found = text_overlaps(page, "#bad")
    assert len(found) == 1 and "title" in found[0] and "legend" in found[0], found
    found = text_overlaps(page, "#sub")
    assert len(found) == 1 and '"bottom plot"' in found[0] and '"a label over the bar"' in found[0], found
    assert text_overlaps(page, "#wide") == []
    found = texts_outside(page, "#wide")
    assert len(found) == 1 and found[0].startswith("wide: title"), found
    assert texts_outside(page, "#bad") == []
