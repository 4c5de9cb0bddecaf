"""Charts over a run's steps (plotly): the time of each stage per step and per engine, and how many drafted
tokens the target accepted (per step, as a histogram, per depth).

    fig = timing_figure({"dart": traces, "eagle3": other})
    figs = acceptance_figures(traces)                    # per step, histogram, per depth

Colours and the page layout come from :mod:`dart_core.ui.viz`.
"""
from __future__ import annotations

import html
from typing import Mapping, NamedTuple, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..engine.trace import STAGES, StepTrace
from ..engine.trace_stats import ACCEPTED_LABEL, BONUS_LABEL, TraceLike, acceptance_metrics, as_steps
from .viz import OKABE_ITO, STAGE_STYLE, TITLE_PX, page_layout


# ---------------------------------------------------------------------------------------------- timings
def _stage_ms(st: StepTrace, stage: str) -> float:
    return 1000.0 * float(st.timings.get(stage, 0.0))


#: Timing figure rows, in pixels: each row's plot, the gap between rows (tick labels, the axis title and the
#: next row's two-line subplot title) and what is kept under the last row for its axis title and the legend.
TIMING_ROW_PX, TIMING_GAP_PX, TIMING_SUBTITLE_PX, TIMING_BOTTOM_PX = 200, 110, 40, 140


def timing_figure(steps_by_engine: Mapping[str, Sequence[TraceLike]], *, title: str | None = None,
                  mark: Mapping[str, int] | None = None) -> go.Figure:
    """Per engine: stacked stage times per step (ms) beside tokens verified vs accepted per step;
    a last row compares total stage time per engine. Acceptance is not speedup: a big tree
    can accept more tokens and still cost more per token.

    ``mark``: engine name -> step number to mark in that engine's "time per step by stage" plot (a
    translucent band over the step's bar labelled "selected step", a layout shape named
    ``"selected step: <engine>"``); engines or steps not in the figure are ignored.
    """
    engines = {name: as_steps(steps) for name, steps in steps_by_engine.items()}
    names = list(engines)
    rows = len(names) + 1
    titles: list[str] = []
    for name in names:
        label = html.escape(name, quote=False)
        titles += [f"<b>{label}</b><br>time per step by stage", f"<b>{label}</b><br>tokens verified vs accepted"]
    titles.append("total time by stage, per engine")
    specs = [[{}, {}] for _ in range(len(names))] + [[{"colspan": 2}, None]]
    # Sized in pixels, so the gaps between rows hold their labels however many engines there are.
    plot_px = rows * TIMING_ROW_PX + (rows - 1) * TIMING_GAP_PX
    fig = make_subplots(rows=rows, cols=2, specs=specs, subplot_titles=titles, column_widths=[0.6, 0.4],
                        vertical_spacing=TIMING_GAP_PX / plot_px, horizontal_spacing=0.1)
    fig.update_annotations(font=dict(size=13))   # the subplot titles (the only annotations so far)
    for r, name in enumerate(names, start=1):
        steps = engines[name]
        xs = [st.step for st in steps]
        for stage in STAGES:
            color, pattern = STAGE_STYLE[stage]
            fig.add_trace(go.Bar(x=xs, y=[_stage_ms(st, stage) for st in steps], name=stage,
                                 legendgroup=stage, showlegend=r == 1, marker=dict(color=color,
                                 pattern=dict(shape=pattern)),
                                 hovertemplate=f"{name}, step %{{x}}<br>{stage}: %{{y:.3f}} ms<extra></extra>"),
                          row=r, col=1)
        verified = [len(st.tree) for st in steps]
        accepted = [st.acceptance_length for st in steps]
        fig.add_trace(go.Scatter(x=xs, y=verified, mode="lines+markers", name="tokens verified (tree nodes)",
                                 legendgroup="verified", showlegend=r == 1,
                                 line=dict(color=OKABE_ITO["orange"], dash="dash"),
                                 marker=dict(symbol="diamond", size=8, color=OKABE_ITO["orange"]),
                                 hovertemplate=f"{name}, step %{{x}}<br>verified: %{{y}}<extra></extra>"),
                      row=r, col=2)
        fig.add_trace(go.Scatter(x=xs, y=accepted, mode="lines+markers", name="tokens accepted (incl. bonus)",
                                 legendgroup="accepted", showlegend=r == 1,
                                 line=dict(color=OKABE_ITO["blue"]),
                                 marker=dict(symbol="circle", size=8, color=OKABE_ITO["blue"]),
                                 hovertemplate=f"{name}, step %{{x}}<br>accepted: %{{y}}<extra></extra>"),
                      row=r, col=2)
        fig.update_xaxes(title_text="step", row=r, col=1)
        fig.update_xaxes(title_text="step", row=r, col=2)
        fig.update_yaxes(title_text="ms", row=r, col=1)
        fig.update_yaxes(title_text="tokens", rangemode="tozero", row=r, col=2)
        if mark is not None and name in mark and int(mark[name]) in xs:
            s = int(mark[name])
            fig.add_vrect(x0=s - 0.5, x1=s + 0.5, row=r, col=1, name=f"selected step: {name}", layer="above",
                          fillcolor=OKABE_ITO["black"], opacity=0.12,
                          line=dict(color=OKABE_ITO["black"], width=1.5, dash="dot"))
            fig.add_annotation(x=s, y=1, yref="y domain", row=r, col=1, text="selected step", showarrow=False,
                               xanchor="center", yanchor="top", font=dict(size=10, color=OKABE_ITO["black"]),
                               bgcolor="rgba(255,255,255,0.85)", name=f"selected step: {name}")

    last = len(names) + 1
    top_total = 0.0
    for stage in STAGES:
        color, pattern = STAGE_STYLE[stage]
        totals = [sum(_stage_ms(st, stage) for st in engines[name]) for name in names]
        fig.add_trace(go.Bar(x=names, y=totals, name=stage, legendgroup=stage, showlegend=not names,
                             marker=dict(color=color, pattern=dict(shape=pattern)),
                             hovertemplate=f"%{{x}}<br>{stage}: %{{y:.2f}} ms total<extra></extra>"),
                      row=last, col=1)
    for name in names:
        steps = engines[name]
        total = sum(_stage_ms(st, s) for st in steps for s in STAGES)
        top_total = max(top_total, total)
        toks = sum(st.acceptance_length for st in steps)
        per_tok = f"<br>{total / toks:.2f} ms/token" if toks else ""
        fig.add_annotation(x=name, y=total, text=f"{total:.1f} ms<br>{toks} tokens{per_tok}", showarrow=False,
                           yanchor="bottom", yshift=2, font=dict(size=11), row=last, col=1)
    fig.update_xaxes(title_text="engine", row=last, col=1)
    # headroom for the three-line labels over the bars, so they stay inside the plot
    fig.update_yaxes(title_text="ms (all steps)", row=last, col=1,
                     range=[0, 1.45 * top_total] if top_total > 0 else None)
    top = TITLE_PX + (TIMING_SUBTITLE_PX if names else TIMING_SUBTITLE_PX // 2)
    page_layout(fig, title or "Stage times (engine work only) and tokens per step", top=top, barmode="stack",
                 height=top + plot_px + TIMING_BOTTOM_PX)
    return fig


# ---------------------------------------------------------------------------------------------- acceptance
#: Height of each acceptance figure (title, plot, and a legend under it that may wrap into rows) and the room
#: for its two-line title (the figure, the statistic): the app shows the three side by side, ~420 px wide each.
ACCEPTANCE_HEIGHT, ACCEPTANCE_TOP = 440, 72


class AcceptanceFigures(NamedTuple):
    per_step: go.Figure
    histogram: go.Figure
    per_depth: go.Figure


def acceptance_figures(steps: Sequence[TraceLike], *, name: str | None = None) -> AcceptanceFigures:
    """Acceptance length per step (drafts + bonus, with tau), its histogram, acceptance rate per depth.
    Titles take two lines (what the figure shows; its statistic as the subtitle) to fit a third of a page."""
    sts = as_steps(steps)
    m = acceptance_metrics(sts)
    prefix = f"{name}: " if name else ""
    tau = m["tau"]
    xs = [st.step for st in sts]
    drafts = [min(st.accepted_drafts, st.acceptance_length) for st in sts]
    bonus = [st.acceptance_length - dr for st, dr in zip(sts, drafts)]

    per_step = go.Figure()
    per_step.add_trace(go.Bar(x=xs, y=drafts, name=ACCEPTED_LABEL + "s", marker=dict(color=OKABE_ITO["blue"]),
                              hovertemplate="step %{x}: %{y} accepted drafts<extra></extra>"))
    per_step.add_trace(go.Bar(x=xs, y=bonus, name=BONUS_LABEL, marker=dict(color=OKABE_ITO["reddish_purple"],
                              pattern=dict(shape="/")),
                              hovertemplate="step %{x}: %{y} bonus token<extra></extra>"))
    if xs:
        per_step.add_trace(go.Scatter(x=[xs[0] - 0.5, xs[-1] + 0.5], y=[tau, tau], mode="lines",
                                      name=f"\u03c4 = {tau:.2f} (mean acceptance length)",
                                      line=dict(color=OKABE_ITO["black"], dash="dash"), hoverinfo="skip"))
    page_layout(per_step, dict(text=f"{prefix}acceptance length per step",
                                    subtitle=dict(text=f"\u03c4 = {tau:.2f} (mean tokens per step)")), top=ACCEPTANCE_TOP,
                 barmode="stack",
                 xaxis=dict(title="step"), yaxis=dict(title="tokens (accepted + bonus)"), height=ACCEPTANCE_HEIGHT)

    hist = go.Figure()
    hx = list(m["histogram"].keys())
    hist.add_trace(go.Bar(x=hx, y=[m["histogram"][k] for k in hx], name="steps",
                          marker=dict(color=OKABE_ITO["blue"]),
                          hovertemplate="%{y} steps emitted %{x} tokens<extra></extra>"))
    page_layout(hist, dict(text=f"{prefix}acceptance length histogram",
                                subtitle=dict(text=f"{m['steps']} step{'' if m['steps'] == 1 else 's'}")),
                 top=ACCEPTANCE_TOP,
                 xaxis=dict(title="tokens per step (bonus included)", dtick=1),
                 yaxis=dict(title="steps"), height=ACCEPTANCE_HEIGHT)

    depth = go.Figure()
    dx = list(range(1, len(m["per_depth"]) + 1))
    depth.add_trace(go.Bar(x=dx, y=m["per_depth"], name="of all steps (vLLM's per-position rate)", marker=dict(color=OKABE_ITO["blue"]),
                           hovertemplate="depth %{x}: %{y:.1%} of steps<extra></extra>"))
    depth.add_trace(go.Bar(x=dx, y=m["per_depth_given_drafted"], name="of steps whose tree reached that depth",
                           marker=dict(color=OKABE_ITO["sky_blue"], pattern=dict(shape="/")),
                           hovertemplate="depth %{x}: %{y:.1%} of steps that drafted it<extra></extra>"))
    page_layout(depth, dict(text=f"{prefix}acceptance rate per depth", subtitle=dict(
                     # every drafted node counts here, siblings too; the α of *Why this speed?* is per position
                     text=f"{m['draft_acceptance_rate']:.1%} of drafted nodes accepted (siblings count; "
                          "α does not)")), top=ACCEPTANCE_TOP, barmode="group",
                 xaxis=dict(title="tree depth", dtick=1),
                 yaxis=dict(title="steps reaching the depth", range=[0, 1.05], tickformat=".0%"),
                 height=ACCEPTANCE_HEIGHT)
    return AcceptanceFigures(per_step, hist, depth)
