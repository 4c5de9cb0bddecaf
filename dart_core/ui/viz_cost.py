"""The cost of a tree on this machine (plotly and Markdown): verify time by tree size from the cost model, and
DART's expected tokens/s by budget from an automatic-tree chooser; why this machine picks what it picks.

    fig = verify_cost_figure(costs)                      # verify ms by tree nodes (dart_core.sizing.CostModel)
    fig = budget_rate_figure(auto.rates())               # DART's expected tokens/s by budget (an AutoTree)
    text = tree_cost_text(costs, auto.rates())           # why this machine picks what it picks
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import plotly.graph_objects as go

from .viz import OKABE_ITO, page_layout


#: The paper's DART tree budget (drafted nodes, root excluded), marked on the tokens/s curve.
PAPER_BUDGET = 60
#: verify(33 nodes) / verify(1 node) below this: the verify is memory-bound (big trees are almost free);
#: above COMPUTE_BOUND_RATIO: compute-bound (every drafted node costs time, small trees win).
MEMORY_BOUND_RATIO = 1.5
COMPUTE_BOUND_RATIO = 2.5
#: The tree size the sentence compares with one token (the paper's trees hold a few dozen nodes).
RATIO_NODES = 33


def verify_ratio(costs: Any, nodes: int = RATIO_NODES) -> float:
    """verify(``nodes``) / verify(1) of a cost model (dart_core.sizing.costs.CostModel): how much more a
    ``nodes``-node tree costs to verify than a plain one-token step."""
    return float(costs.verify_s(nodes)) / max(float(costs.verify_s(1)), 1e-12)


def verify_cost_figure(costs: Any, *, max_nodes: int = 64, title: str | None = None) -> go.Figure:
    """Milliseconds of one verify against the tree's node count (root included) on this machine: the cost
    model's measured points and the piecewise-linear curve it interpolates between them (1..``max_nodes``)."""
    xs = list(range(1, max_nodes + 1))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=[1e3 * float(costs.verify_s(n)) for n in xs], mode="lines",
                             name="interpolated", line=dict(color=OKABE_ITO["vermillion"]),
                             hovertemplate="%{x} nodes: %{y:.2f} ms<extra>interpolated</extra>"))
    sizes = [int(n) for n in costs.verify.sizes]
    secs = [float(t) for t in costs.verify.seconds]
    fig.add_trace(go.Scatter(x=sizes, y=[1e3 * t for t in secs], mode="markers", name="measured",
                             marker=dict(color=OKABE_ITO["black"], symbol="diamond", size=9),
                             hovertemplate="%{x} nodes: %{y:.2f} ms<extra>measured</extra>"))
    ratio = verify_ratio(costs)
    page_layout(fig, dict(text=title or "verify ms by tree size here", font=dict(size=15),
                          subtitle=dict(text=f"{RATIO_NODES} nodes: {ratio:.1f}\u00d7 one token")),
                 xaxis=dict(title="tree nodes verified (root included)"),
                 yaxis=dict(title="ms per verify", rangemode="tozero"), height=360)
    return fig


def budget_rows(rates: Sequence[Mapping[str, Any]]) -> tuple[list[tuple[int, Mapping[str, Any]]], Mapping | None]:
    """(budget, row) of the drafting rows, by budget, and the plain-step row (None if absent)."""
    rows, plain = [], None
    for r in rates:
        choice = r.get("choice")
        if choice is not None and getattr(choice, "plain", False):
            plain = r
            continue
        settings = getattr(choice, "settings", None) or {}
        if "budget" in settings:
            rows.append((int(settings["budget"]), r))
    rows.sort(key=lambda br: br[0])
    return rows, plain


def budget_rate_figure(rates: Sequence[Mapping[str, Any]], *, paper_budget: int = PAPER_BUDGET,
                       title: str | None = None) -> go.Figure:
    """Expected tokens/s against DART's tree budget, from an AutoTree's ``rates()`` (best first): the curve,
    the plain target step's rate as a horizontal reference, the best budget (what the chooser picks) and the
    paper's budget marked."""
    rows, plain = budget_rows(rates)
    best = rates[0] if rates else None
    fig = go.Figure()
    if rows:
        fig.add_trace(go.Scatter(
            x=[b for b, _ in rows], y=[float(r["tokens_per_s"]) for _, r in rows], mode="lines+markers",
            name="expected tokens/s", line=dict(color=OKABE_ITO["blue"]),
            marker=dict(symbol="circle", size=6, color=OKABE_ITO["blue"]),
            customdata=[[float(r["tau"]), 1e3 * float(r["step_s"]), int(r["nodes"])] for _, r in rows],
            hovertemplate=("budget %{x}: %{y:.1f} tokens/s<br>expected \u03c4 %{customdata[0]:.2f}, step "
                           "%{customdata[1]:.1f} ms, %{customdata[2]} nodes<extra></extra>")))
    if plain is not None:
        y = float(plain["tokens_per_s"])
        fig.add_trace(go.Scatter(x=[0, max([b for b, _ in rows] + [paper_budget])], y=[y, y], mode="lines",
                                 name=f"plain target step ({y:.1f} tokens/s)",
                                 line=dict(color=OKABE_ITO["reddish_purple"], dash="dot"),
                                 hovertemplate="plain step: %{y:.1f} tokens/s<extra></extra>"))
    paper = next((r for b, r in rows if b == paper_budget), None)
    if paper is not None:
        fig.add_trace(go.Scatter(x=[paper_budget], y=[float(paper["tokens_per_s"])], mode="markers",
                                 name=f"the paper's budget {paper_budget}",
                                 marker=dict(symbol="square-open", size=14, color=OKABE_ITO["grey"],
                                             line=dict(width=2)),
                                 hovertemplate=f"paper's budget {paper_budget}: %{{y:.1f}} tokens/s<extra></extra>"))
    fig.add_vline(x=paper_budget, line=dict(color=OKABE_ITO["grey"], dash="dash"))
    if best is not None:
        bchoice = best.get("choice")
        if bchoice is not None and getattr(bchoice, "plain", False):
            bx, name = 0, "chosen: plain steps (no tree pays here)"
        else:
            bx = int((getattr(bchoice, "settings", None) or {}).get("budget", best["nodes"] - 1))
            name = f"chosen: budget {bx}"
        fig.add_trace(go.Scatter(x=[bx], y=[float(best["tokens_per_s"])], mode="markers", name=name,
                                 marker=dict(symbol="star", size=16, color=OKABE_ITO["orange"],
                                             line=dict(color=OKABE_ITO["black"], width=1)),
                                 hovertemplate=f"{name}: %{{y:.1f}} tokens/s<extra></extra>"))
    page_layout(fig, dict(text=title or "DART: expected tokens/s by budget", font=dict(size=15),
                          subtitle=dict(text="from this machine's costs")),
                 xaxis=dict(title="budget (drafted nodes, root excluded)", rangemode="tozero"),
                 yaxis=dict(title="expected tokens/s", rangemode="tozero"), height=400)
    return fig


#: How the kernels' path was chosen (models/kernel_path.py's sources), as the cost view says it.
_TIMED = ", the fastest of every path this CPU runs, timed on this model's weights at its first load here"
KERNEL_SOURCES = {
    "measured": _TIMED,
    "cached": _TIMED,      # the same timing, read back by a later process
    "DART_GEMM_PATH": ", as DART_GEMM_PATH sets it",
    "the only vector path": ", the only vector path this CPU runs",
}


def tree_cost_text(costs: Any, rates: Sequence[Mapping[str, Any]] | None = None, *,
                   paper_budget: int = PAPER_BUDGET, others: Mapping[str, str] | None = None,
                   kernel: str | None = None, kernel_source: str | None = None,
                   kernel_split: int | None = None) -> str:
    """Why this machine picks the trees it picks, from the measured verify curve: verify(33)/verify(1) near 1
    means the verify is memory-bound (as on a GPU) and big trees are almost free; well above 1, compute-bound
    (a few CPU cores) and small trees win. With DART's ``rates()``: what it picks and at what expected rate;
    ``others``: other engines' chosen settings by label (e.g. {"EAGLE-3": "total_token 8, depth 2, top_k 3"});
    ``kernel``: the CPU kernels' path every engine ran (``hardware.gemm_paths()``), named so a figure says what ran;
    ``kernel_source``: how it was chosen (``models.kernel_path``'s sources), said in words; ``kernel_split``: how
    each call's rows were cut among the threads (``hardware.gemm_paths()["gemm_split"]``: 0 chunks, k ranges)."""
    v1, vn = 1e3 * float(costs.verify_s(1)), 1e3 * float(costs.verify_s(RATIO_NODES))
    ratio = vn / max(v1, 1e-9)
    if ratio < MEMORY_BOUND_RATIO:
        why = ("near 1, so the verify is memory-bound (as on a GPU): a big tree costs almost nothing more than "
               "one token, and big trees win")
    elif ratio > COMPUTE_BOUND_RATIO:
        why = ("well above 1, so the verify is compute-bound (as on a few CPU cores): every drafted node costs "
               "time, and small trees win")
    else:
        why = ("between the two, so each drafted node costs a little: mid-sized trees win where the head is "
               "good enough")
    text = (f"On this machine one verify of a {RATIO_NODES}-node tree takes {vn:.1f} ms against {v1:.1f} ms for "
            f"one token ({ratio:.1f}\u00d7): {why}.")
    if rates:
        best = rates[0]
        rows, plain = budget_rows(rates)
        if getattr(best.get("choice"), "plain", False):
            text += (f" DART's chooser takes **plain steps** ({float(best['tokens_per_s']):.1f} tokens/s): no tree is "
                     "expected to pay for its draft and verify here, so it drafts only now and then to keep learning.")
        else:
            text += (f" DART's chooser picks **{best['label']}**: expected \u03c4 {float(best['tau']):.2f} at "
                     f"{float(best['tokens_per_s']):.1f} tokens/s")
            if plain is not None:
                text += f", against {float(plain['tokens_per_s']):.1f} for a plain target step"
            paper = next((r for b, r in rows if b == paper_budget), None)
            if paper is not None and best is not paper:
                text += f" and {float(paper['tokens_per_s']):.1f} at the paper's budget {paper_budget}"
            text += "."
    for name, label in (others or {}).items():
        text += f" {name}'s chooser picks **{'plain steps' if label == 'plain step' else label}**."
    if kernel:
        how = KERNEL_SOURCES.get(kernel_source or "", "")
        text += (f" Every engine here runs the CPU kernels' *{kernel}* path{how} (vanilla included, so their answers "
                 "stay comparable token for token)")
        if kernel_split is not None:
            cut = ("chunks of ~48 KiB" if kernel_split == 0
                   else f"{kernel_split} long range{'s' if kernel_split > 1 else ''} a thread")
            text += f", each call's weight rows cut among the threads in {cut} (timed here at load too)"
        text += "."
    return text
