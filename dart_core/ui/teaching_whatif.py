"""Why a CPU differs from a GPU: the expected speedup of speculation by acceptance and verify cost (a chain model),
this run's measured point on that map, and what would have to change for speculation to pay.

    expected_speedup(0.7, 4, 1.1, 0.1)                         # chain model: tokens per pass / cost of a pass
    fig = whatif_figure(measured=measured_point(traces, costs, label="DART on this CPU"))
    whatif_text(0.35, 2.2, 0.3, 4)                             # what it would take for speculation to pay
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ..engine.trace_stats import TraceLike, acceptance_metrics, as_steps
from .viz import OKABE_ITO, as_ints, panel_layout


#: The GPU regime the paper's setting sits in (a *regime*, not a measurement of this demo):
#: on a data-centre GPU the target's forward over a few dozen tree nodes is memory-bound (the weights are
#: read once whatever the node count), so a verify costs about as much as one plain token: verify ratio
#: ~1.0-1.3 (compare viz_cost.MEMORY_BOUND_RATIO, and the flat GPU verify curve the sizing tests use). With
#: the per-token acceptance of trained draft heads on such models in ~0.6-0.8, the chain model below gives
#: tau ~2.3-3.4 at depth 4, i.e. the 2-3x speedups the DART paper (arXiv 2601.19278) reports on GPU.
GPU_ALPHA_RANGE = (0.6, 0.8)
GPU_VERIFY_RATIO_RANGE = (1.0, 1.3)
#: The what-if figure's axes: per-token acceptance alpha on x, verify cost on y (units of one plain step).
WHATIF_ALPHA_RANGE = (0.0, 0.95)
WHATIF_VERIFY_RANGE = (1.0, 4.0)
#: Tree sizes (nodes, root included) whose verify ratio ``whatif_figure(verify_curve=...)`` marks.
WHATIF_CURVE_NODES = (9, 33)


# ---------------------------------------------------------------------------------------------- what-if: the model
def expected_tau(alpha: Any, depth: Any) -> Any:
    """Expected tokens per target pass of a chain draft of ``depth`` tokens whose tokens are each accepted
    with probability ``alpha`` (independently, given the previous one was): 1 + alpha + ... + alpha**depth
    = (1 - alpha**(depth+1)) / (1 - alpha), and depth + 1 at alpha = 1. Vectorised (numpy broadcasting)."""
    a = np.asarray(alpha, dtype=np.float64)
    d = np.asarray(depth, dtype=np.float64)
    one = a == 1.0
    safe = np.where(one, 0.5, a)
    with np.errstate(divide="ignore"):   # alpha = 0: log1p(-1) = -inf, expm1(-inf) = -1, tau = 1
        # (1 - a**(d+1)) / (1 - a) through expm1/log1p: no cancellation as alpha approaches 1
        tau = np.where(one, d + 1.0, -np.expm1((d + 1.0) * np.log1p(safe - 1.0)) / (1.0 - safe))
    return float(tau) if tau.ndim == 0 else tau


def expected_speedup(alpha: Any, depth: Any, verify_ratio: Any, draft_ratio: Any = 0.0) -> Any:
    """Expected speedup over plain decoding of chain speculation, in a deliberately simple model.

    Model: the drafter proposes a *chain* of ``depth`` tokens; each is accepted with probability ``alpha``
    independently of the others (given its predecessor was accepted), and the target adds one token of its
    own, so a step yields tau = (1 - alpha**(depth+1)) / (1 - alpha) tokens (depth + 1 at alpha = 1; 1 at
    alpha = 0). Costs are in units of one plain one-token target step: the verify costs ``verify_ratio``
    (>= 1 on any machine: verify(depth+1 nodes) / verify(1 node)) and drafting ``draft_ratio``. Speedup =
    tau / (verify_ratio + draft_ratio). Trees (several guesses per position) and the commit are left out;
    a tree's better acceptance shows up as a higher effective alpha, its size as a higher verify_ratio.
    Vectorised over numpy arrays (broadcasting); a float for scalar inputs.
    """
    cost = np.asarray(verify_ratio, dtype=np.float64) + np.asarray(draft_ratio, dtype=np.float64)
    out = np.asarray(expected_tau(alpha, depth), dtype=np.float64) / cost
    return float(out) if out.ndim == 0 else out


def break_even_alpha(verify_ratio: float, draft_ratio: float = 0.0, depth: int = 4, *,
                     target: float = 1.0) -> float | None:
    """The smallest per-token acceptance alpha in [0, 1] at which ``expected_speedup`` reaches ``target``
    (1.0: speculation breaks even). 0.0 when even alpha = 0 reaches it; None when no alpha can (the step
    costs more than depth + 1 plain steps). Bisection on tau(alpha), which increases with alpha."""
    need = float(target) * (float(verify_ratio) + float(draft_ratio))   # tokens per pass needed
    if expected_tau(0.0, depth) >= need:
        return 0.0
    if expected_tau(1.0, depth) < need - 1e-12:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if expected_tau(mid, depth) >= need:
            hi = mid
        else:
            lo = mid
    return hi


def break_even_verify_ratio(alpha: Any, depth: Any, draft_ratio: Any = 0.0) -> Any:
    """The verify ratio at which speculation breaks even (speedup 1.0) for this alpha: tau - draft_ratio;
    speculation pays below it. Vectorised."""
    out = np.asarray(expected_tau(alpha, depth)) - np.asarray(draft_ratio, dtype=np.float64)
    return float(out) if np.ndim(out) == 0 else out


# ---------------------------------------------------------------------------------------------- what-if: a run
def measured_point(traces: Sequence[TraceLike], costs: Any, *, depth: int | None = None,
                   label: str = "this run") -> dict[str, Any]:
    """Where a run sits in the what-if model, from its StepTraces and a cost model (anything with
    ``verify_s(nodes)``, e.g. dart_core.sizing.CostModel).

    alpha         per-position acceptance along the accepted path, pooled over depths: accepted drafts /
                  (accepted drafts + steps whose path stopped at a rejection, i.e. whose last accepted node
                  had drafted children). It is the chain model's maximum-likelihood alpha; steps that drafted
                  nothing or stopped at a leaf add no rejection. (trace_stats' ``draft_acceptance_rate`` =
                  accepted / every drafted node is returned too as ``draft_acceptance_rate``; it counts every
                  sibling in a tree as a failure, so it understates a chain's alpha.)
    depth         ``depth`` if given, else the mean deepest node of the drafting steps, rounded (>= 1)
    verify_ratio  costs.verify_s(mean tree nodes, root included) / costs.verify_s(1)
    draft_ratio   mean (draft_forward + tree_build) seconds per step / costs.verify_s(1)
    tau           acceptance_metrics' tau: tokens emitted per step, bonus included
    speedup       the run's measured rate against a plain step priced at verify_s(1): tau * verify_s(1) /
                  mean step seconds (all four stages)
    expected_speedup  the chain model's speedup at (alpha, depth, verify_ratio, draft_ratio)
    label, steps, mean_nodes
    """
    sts = as_steps(traces)
    if not sts:
        raise ValueError("measured_point needs at least one step trace")
    m = acceptance_metrics(sts)
    accepted = rejections = 0
    for st in sts:
        accepted += st.accepted_drafts
        last = int(st.accepted_nodes[-1])
        if st.tree.num_drafted and any(int(p) == last for p in as_ints(st.tree.parents)[1:]):
            rejections += 1
    alpha = accepted / (accepted + rejections) if accepted + rejections else 0.0
    drafting = [st for st in sts if st.tree.num_drafted]
    if depth is None:
        depth = max(1, int(round(float(np.mean([st.tree.max_depth for st in drafting]))))) if drafting else 1
    mean_nodes = float(np.mean([len(st.tree) for st in sts]))
    one = max(float(costs.verify_s(1)), 1e-12)
    verify_ratio = float(costs.verify_s(mean_nodes)) / one
    draft_s = float(np.mean([float(st.timings.get("draft_forward", 0.0)) + float(st.timings.get("tree_build", 0.0))
                             for st in sts]))
    step_s = float(np.mean([sum(float(v) for v in st.timings.values()) for st in sts]))
    draft_ratio = draft_s / one
    return {
        "label": label, "alpha": alpha, "depth": int(depth), "verify_ratio": verify_ratio,
        "draft_ratio": draft_ratio, "tau": float(m["tau"]),
        "speedup": float(m["tau"]) * one / step_s if step_s > 0 else float("nan"),
        "expected_speedup": float(expected_speedup(alpha, depth, verify_ratio, draft_ratio)),
        "draft_acceptance_rate": float(m["draft_acceptance_rate"]), "steps": len(sts), "mean_nodes": mean_nodes,
    }


# ---------------------------------------------------------------------------------------------- what-if: figure
def _diverging_scale(zmin: float, zmax: float) -> list:
    """Vermillion below 1.0x, white at 1.0x, blue above (Okabe-Ito ends, colour-blind safe), on a log axis."""
    lo, hi = math.log(zmin), math.log(zmax)
    mid = (0.0 - lo) / (hi - lo) if hi > lo else 0.5
    mid = min(max(mid, 0.0), 1.0)
    return [[0.0, OKABE_ITO["vermillion"]], [mid, "#FFFFFF"], [1.0, OKABE_ITO["blue"]]]


def whatif_figure(*, measured: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None, depth: int = 4,
                  draft_ratio: float = 0.1, verify_curve: Callable[[int], float] | None = None,
                  title: str | None = None) -> go.Figure:
    """Expected speedup of chain speculation (``expected_speedup``) over per-token acceptance alpha (x) and
    verify cost in plain steps (y), at ``depth`` and ``draft_ratio``: a heatmap (log colour, white at 1.0x),
    the 1.0x break-even line emphasised (speculation pays below it, slows down above), the paper's GPU regime
    as a box (GPU_ALPHA_RANGE x GPU_VERIFY_RATIO_RANGE), and ``measured`` points (a dict or a list of dicts
    with alpha, verify_ratio and optionally speedup, label: e.g. ``measured_point``'s). ``verify_curve``:
    optional nodes -> verify ratio of this machine (e.g. ``lambda n: costs.verify_s(n) / costs.verify_s(1)``);
    its ratios for a depth+1 chain and WHATIF_CURVE_NODES trees are drawn as dotted horizontal lines.
    """
    points = [] if measured is None else ([dict(measured)] if isinstance(measured, Mapping)
                                          else [dict(p) for p in measured])
    curve_lines: list[tuple[int, float]] = []
    if verify_curve is not None:
        for nodes in sorted({depth + 1, *WHATIF_CURVE_NODES}):
            curve_lines.append((nodes, float(verify_curve(nodes))))
    y_hi = max([WHATIF_VERIFY_RANGE[1]] + [1.08 * float(p["verify_ratio"]) for p in points]
               + [1.08 * r for _, r in curve_lines])
    y_hi = min(y_hi, 3 * WHATIF_VERIFY_RANGE[1])
    # the axes reach past every marker (a head at alpha 0.96, a verify of about one token), never cutting one
    a_hi = min(1.0, max([WHATIF_ALPHA_RANGE[1]] + [float(p["alpha"]) + 0.02 for p in points]))
    y_lo = min([WHATIF_VERIFY_RANGE[0]] + [float(p["verify_ratio"]) - 0.04 * (y_hi - 1.0) for p in points])
    alphas = np.linspace(WHATIF_ALPHA_RANGE[0], a_hi, 96)
    ratios = np.linspace(y_lo, y_hi, 90)
    z = expected_speedup(alphas[None, :], depth, ratios[:, None], draft_ratio)
    zmin, zmax = float(z.min()), float(z.max())
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        x=alphas, y=ratios, z=np.log(z), zmin=math.log(zmin), zmax=math.log(zmax), name="expected speedup",
        colorscale=_diverging_scale(zmin, zmax), customdata=z, showscale=True, showlegend=False,
        colorbar=dict(title=dict(text="speedup", side="right"), thickness=12, len=0.8,
                      tickvals=[math.log(v) for v in (0.25, 0.5, 1, 2, 3, 4) if zmin <= v <= zmax],
                      ticktext=[f"{v:g}\u00d7" for v in (0.25, 0.5, 1, 2, 3, 4) if zmin <= v <= zmax]),
        hovertemplate="alpha %{x:.2f}, verify %{y:.2f}\u00d7 a token: %{customdata:.2f}\u00d7<extra></extra>"))
    # The break-even line: verify ratio = tau(alpha) - draft_ratio.
    be = break_even_verify_ratio(alphas, depth, draft_ratio)
    ok = (be >= ratios[0]) & (be <= ratios[-1])
    fig.add_trace(go.Scatter(x=alphas[ok], y=be[ok], mode="lines", name="1.0\u00d7: break-even",
                             line=dict(color=OKABE_ITO["black"], width=4),
                             hovertemplate="break-even: alpha %{x:.2f} at verify %{y:.2f}\u00d7<extra></extra>"))
    a0, a1 = GPU_ALPHA_RANGE
    v0, v1 = GPU_VERIFY_RATIO_RANGE
    fig.add_trace(go.Scatter(x=[a0, a1, a1, a0, a0], y=[v0, v0, v1, v1, v0], mode="lines", fill="toself",
                             name="the paper's GPU regime", fillcolor="rgba(0,158,115,0.25)",
                             line=dict(color=OKABE_ITO["bluish_green"], width=3, dash="dash"),
                             hovertemplate=(f"GPU regime (not measured here): alpha {a0}-{a1}, verify "
                                            f"{v0}-{v1}\u00d7 a token<extra></extra>")))
    palette = [OKABE_ITO[c] for c in ("orange", "reddish_purple", "sky_blue", "yellow", "vermillion")]
    symbols = ["star", "diamond", "circle", "square", "triangle-up"]
    for i, p in enumerate(points):
        name = str(p.get("label") or "this run")
        if p.get("depth") is not None and int(p["depth"]) != depth:   # its own chain is not the map's
            name += f", its {int(p['depth'])}-token chain"
        sp = p.get("speedup")
        hover = [f"{name}: alpha {float(p['alpha']):.2f}, verify {float(p['verify_ratio']):.2f}\u00d7 a token"
                 + ("" if sp is None else f", measured {float(sp):.2f}\u00d7")]
        fig.add_trace(go.Scatter(x=[float(p["alpha"])], y=[float(p["verify_ratio"])], mode="markers",
                                 name=name + ("" if sp is None else f" ({float(sp):.2f}\u00d7)"),
                                 marker=dict(color=palette[i % len(palette)], symbol=symbols[i % len(symbols)],
                                             size=18, line=dict(color=OKABE_ITO["black"], width=1.5)),
                                 hovertext=hover, hoverinfo="text"))
    for nodes, r in curve_lines:
        fig.add_trace(go.Scatter(x=[alphas[0], alphas[-1]], y=[r, r], mode="lines+text",
                                 text=["", f"{nodes} nodes here"], textposition="top left",
                                 textfont=dict(size=10, color="#555555"),
                                 name=f"this machine: {nodes} nodes", showlegend=True,
                                 line=dict(color=OKABE_ITO["grey"], width=1.5, dash="dot"),
                                 hovertemplate=f"verify of {nodes} nodes here: {r:.2f}\u00d7 a token<extra></extra>"))
    # Region labels, each where the model puts it (a corner can fall on the other side for odd settings).
    box = dict(showarrow=False, bgcolor="rgba(255,255,255,0.8)", font=dict(color=OKABE_ITO["black"], size=12))
    # "pays" sits right, above the GPU box, halfway up to the break-even line at alpha 0.75
    y_pays = max(GPU_VERIFY_RATIO_RANGE[1] + 0.06 * (y_hi - 1.0),
                 1.0 + 0.5 * (min(break_even_verify_ratio(0.75, depth, draft_ratio), y_hi) - 1.0))
    if expected_speedup(0.72, depth, y_pays, draft_ratio) > 1.0:
        fig.add_annotation(x=alphas[-1] - 0.01, y=y_pays, text="speculation pays", xanchor="right",
                           yanchor="bottom", **box)
    if expected_speedup(alphas[0], depth, ratios[-1], draft_ratio) < 1.0:
        fig.add_annotation(x=alphas[0] + 0.02, y=ratios[-1] - 0.03 * (y_hi - 1.0), text="slower than plain decoding",
                           xanchor="left", yanchor="top", **box)
    xaxis = dict(title=dict(text="alpha: per-token acceptance", standoff=4), range=[WHATIF_ALPHA_RANGE[0], a_hi])
    yaxis = dict(title=dict(text="verify cost (\u00d7 one token)"), range=[ratios[0], ratios[-1]])
    return panel_layout(fig, title or f"Expected speedup, {depth}-token chain", height=360, xaxis=xaxis, yaxis=yaxis,
                  legend_rows=2 + (len(points) + len(curve_lines)) // 3)


def whatif_text(alpha: float, verify_ratio: float, draft_ratio: float, depth: int) -> str:
    """One or two Markdown sentences: the expected tau and speedup at these values, and what would have to
    change for speculation to pay (the break-even alpha at this cost, or the verify cost at this alpha)."""
    tau = float(expected_tau(alpha, depth))
    sp = float(expected_speedup(alpha, depth, verify_ratio, draft_ratio))
    first = (f"A {depth}-token chain accepted at alpha = {alpha:.2f} gives \u03c4 \u2248 {tau:.2f} tokens per target "
             f"pass; at a step cost of {verify_ratio:.2f} (verify) + {draft_ratio:.2f} (draft) plain steps that is "
             f"an expected **{sp:.2f}\u00d7** plain decoding.")
    need_alpha = break_even_alpha(verify_ratio, draft_ratio, depth)
    max_verify = break_even_verify_ratio(alpha, depth, draft_ratio)
    if sp >= 1.0:
        second = (f"Speculation pays here; it would stop paying if the verify cost rose above {max_verify:.2f}\u00d7 "
                  f"a token" + (f" or alpha fell below {need_alpha:.2f}" if need_alpha else "") + ".")
    elif need_alpha is None:
        second = (f"At this verify cost no head could make it pay at depth {depth} (even alpha = 1 gives only "
                  f"{depth + 1} tokens per pass); the verify would have to cost at most {max_verify:.2f}\u00d7 a "
                  "token, as on a GPU.")
    else:
        second = (f"For speculation to pay at this verify cost the head would need alpha \u2265 {need_alpha:.2f}; "
                  + (f"at this alpha the verify would have to cost at most {max_verify:.2f}\u00d7 a token, as on a "
                     "GPU." if max_verify >= 1.0 else "at this alpha no verify cost is low enough."))
    return f"{first} {second}"
