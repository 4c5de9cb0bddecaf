"""One speculative round stage by stage, for teaching: five frames, each a figure and a sentence (plotly).

    frames = round_frames(trace, tokenizer, engine="dart")     # five RoundFrames: drafted, pruned, checked,
    for f in frames: print(f.title, f.sentence); f.figure      # accepted, committed
    expected_speedup(0.7, 4, 1.1, 0.1)                         # chain model: tokens per pass / cost of a pass
    fig = whatif_figure(measured=measured_point(traces, costs, label="DART on this CPU"))
    whatif_text(0.35, 2.2, 0.3, 4)                             # what it would take for speculation to pay

Every function is pure: it reads StepTraces (or their dict / JSON forms) and returns figures and text.
The round's sentences are computed from the trace; what the target decided along the accepted path is
taken from :func:`dart_core.ui.narration.narrate_step` (the engine's own acceptance rules), not re-derived.

Frames 1-2 share one layout (every scored candidate at its depth under its parent), frames 3-4 another
(the verified tree plus the bonus token), so clicking from one frame to the next keeps nodes in place.
Every figure puts its title at the top (``title.automargin``) and its legend below the plot area
(``legend.yref = "container"``, plotly.js >= 2.23), so the two never overlap at 640 px.
"""
from __future__ import annotations

import html
import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import plotly.graph_objects as go

from ..engine.trace import StepTrace
from ..engine.trace_stats import TraceLike, as_step, candidate_nodes
from .narration import narrate_step
from .record import label_of
from .viz import (NODE_STATES, OKABE_ITO, SCORE_COLORSCALE, as_decoder, as_floats, as_ints, panel_layout, token_hover,
                  token_label)
from .viz_tree import edge_lines, score_name_of, tree_layout

# ---------------------------------------------------------------------------------------------- constants
#: Frame keys, in the order a teacher clicks through them.
FRAME_KEYS = ("drafted", "pruned", "checked", "accepted", "committed")
#: Frame 1 draws at most this many scored candidates under one parent (best score first) ...
MAX_PER_PARENT = 8
#: ... and at most this many in all (kept candidates always drawn), so the figure stays readable.
MAX_DRAWN = 48


class RoundFrame(NamedTuple):
    """One stage of a speculative round: ``key`` (one of FRAME_KEYS), a short ``title``, one plain-words
    ``sentence`` computed from the trace (Markdown), and its plotly ``figure``."""
    key: str
    title: str
    sentence: str
    figure: go.Figure


# ---------------------------------------------------------------------------------------------- helpers
def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _plain(fig: go.Figure) -> str:
    """A figure's title as plain text (token labels in figures are HTML-escaped for plotly)."""
    return html.unescape(fig.layout.title.text or "")


def _text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """Sentence text: the tokenizer's text, or ``#id`` per token without one."""
    dec = as_decoder(tokenizer)
    return dec if dec is not None else (lambda ids: "".join(f"#{i}" for i in ids))


def _q(decode: Callable[[list[int]], str], toks: Sequence[int]) -> str:
    """A token (or tokens) quoted for a sentence, whitespace and newlines made visible."""
    s = decode([int(t) for t in toks]).replace("\n", "\u21b5").replace("`", "'")
    return f"`{s}`" if s.strip() else f"`{s!r}`"


def _root_node(tokens, xs, ys, decode) -> go.Scatter:
    """The root (the last committed token): a white square."""
    return _nodes([0], xs, ys, name=NODE_STATES["root"][0],
                  marker=dict(color="#FFFFFF", symbol="square", size=18, line=dict(color=OKABE_ITO["black"], width=3)),
                  text=[token_label(tokens[0], decode, limit=10)],
                  hover=[f"{token_hover(tokens[0], decode)}  root: the last committed token"],
                  customdata=[["node", 0]])


def _tree_axes(xs: Sequence[float], ys: Sequence[float]) -> tuple[dict, dict]:
    max_x = max(xs) if len(xs) else 1.0
    xaxis = dict(title=dict(text="depth (position after the root)", standoff=4), tickmode="linear", tick0=0,
                 dtick=1, range=[-0.4, max_x + 1.0], zeroline=False, showgrid=False)
    yaxis = dict(autorange="reversed", showticklabels=False, zeroline=False, showgrid=False, title=None)
    return xaxis, yaxis


def _tree_height(ys: Sequence[float], per_row: int = 26) -> int:
    rows = (max(ys) + 1) if len(ys) else 1
    return int(max(260, 90 + per_row * rows))


def _nodes(idx: Sequence[int], xs, ys, *, name: str, marker: dict, text: Sequence[str] | None = None,
           hover: Sequence[str] | None = None, legend: bool = True, text_color: str | None = None,
           opacity: float = 1.0, customdata: Sequence | None = None, group: str | None = None) -> go.Scatter:
    return go.Scatter(
        x=[float(xs[i]) for i in idx], y=[float(ys[i]) for i in idx],
        mode="markers+text" if text is not None else "markers", name=name, legendgroup=group or name,
        marker=marker, opacity=opacity, showlegend=legend,
        text=list(text) if text is not None else None, textposition="middle right",
        textfont=dict(size=11, color=text_color) if text_color else dict(size=11),
        hovertext=list(hover) if hover is not None else None, hoverinfo="text" if hover is not None else "skip",
        customdata=list(customdata) if customdata is not None else None)


def _marker(state: str, size: int = 14, fill: Any = None, **extra) -> dict:
    _, color, symbol = NODE_STATES[state]
    m = dict(color=color if fill is None else fill, symbol=symbol, size=size, line=dict(color=color, width=2.5))
    m.update(extra)
    return m


# ---------------------------------------------------------------------------------------------- frame 1-2 layout
class _CandidateView:
    """The scored candidates drawn in frames 1-2: which ones, where, and how they map to tree nodes.

    Display index 0 is the root; display i >= 1 is candidate ``drawn[i - 1]``. Candidates are taken in
    depth order, best score first, when their parent is drawn and their parent has fewer than
    MAX_PER_PARENT drawn children (and fewer than MAX_DRAWN are drawn); kept candidates are always drawn.
    """

    def __init__(self, st: StepTrace):
        c = st.candidates
        self.total = len(c)
        tok, par, dep = as_ints(c.token), as_ints(c.parent), as_ints(c.depth)
        score, kept = as_floats(c.score), [bool(k) for k in c.kept]
        node = candidate_nodes(st)
        kept = [kept[i] and node[i] > 0 for i in range(self.total)]
        order = sorted(range(self.total), key=lambda i: (dep[i], not kept[i], -score[i], i))
        disp: dict[int, int] = {-1: 0}
        per_parent: dict[int, int] = {}
        drawn: list[int] = []
        for i in order:
            p = par[i] if 0 <= par[i] < self.total else -1
            if p not in disp:
                continue
            if not kept[i] and (per_parent.get(p, 0) >= MAX_PER_PARENT or len(drawn) >= MAX_DRAWN):
                continue
            per_parent[p] = per_parent.get(p, 0) + 1
            drawn.append(i)
            disp[i] = len(drawn)
        self.drawn = drawn
        self.tok = [int(st.tree.tokens[0])] + [tok[i] for i in drawn]
        self.parents = [-1] + [disp[par[i] if 0 <= par[i] < self.total else -1] for i in drawn]
        self.score = [0.0] + [score[i] for i in drawn]
        self.kept = [True] + [kept[i] for i in drawn]
        self.cand = [-1] + drawn
        self.xs, self.ys = tree_layout(self.parents, [math.inf] + self.score[1:])
        self.n_kept = sum(kept)
        self.max_depth = max(dep) if dep else 0
        self.logit, self.ngram = as_floats(c.logit_term), as_floats(c.ngram_term)
        self.has_ngram = any(v != 0.0 for v in self.ngram)


def _candidate_hover(view: _CandidateView, j: int, decode, score_name: str) -> str:
    ci = view.cand[j]
    lines = [f"<b>{token_hover(view.tok[j], decode)}</b>  candidate {ci}, depth {int(view.xs[j])}",
             f"{score_name}: {view.score[j]:.3f}", f"logit term: {view.logit[ci]:.3f}"]
    if view.has_ngram:
        lines.append(f"N-gram term: {view.ngram[ci]:.3f}")
    lines.append("kept for the target" if view.kept[j] else "pruned: never shown to the target")
    return "<br>".join(lines)


def _candidate_figure(st: StepTrace, view: _CandidateView, decode, score_name: str, title: str,
                      pruned_stage: bool) -> go.Figure:
    xs, ys = view.xs, view.ys
    n = len(view.tok)
    fig = go.Figure()
    kept_edges = [(view.parents[j], j) for j in range(1, n) if view.kept[j]]
    other_edges = [(view.parents[j], j) for j in range(1, n) if not view.kept[j]]
    scores = view.score[1:]
    cmin, cmax = (min(scores), max(scores)) if scores else (-1.0, 0.0)
    if cmax - cmin < 1e-9:
        cmin = cmax - 1.0
    root_marker = dict(color="#FFFFFF", symbol="square", size=18, line=dict(color=OKABE_ITO["black"], width=3))
    labels = [token_label(t, decode, limit=10) for t in view.tok]
    hovers = [""] + [_candidate_hover(view, j, decode, score_name) for j in range(1, n)]
    if not pruned_stage:
        fig.add_trace(edge_lines(kept_edges + other_edges, xs, ys, name="drafted edge", color="#BBBBBB", width=1.2))
        idx = list(range(1, n))
        fig.add_trace(_nodes(idx, xs, ys, name=f"scored candidate (fill = {score_name})",
                             marker=dict(color=[view.score[j] for j in idx], coloraxis="coloraxis",
                                         symbol="circle", size=12, line=dict(color="#444444", width=1.5)),
                             text=[labels[j] for j in idx], hover=[hovers[j] for j in idx],
                             customdata=[["candidate", view.cand[j]] for j in idx]))
    else:
        fig.add_trace(edge_lines(other_edges, xs, ys, name="pruned edge", color=OKABE_ITO["grey"], width=1.0,
                             dash="dot", opacity=0.35))
        fig.add_trace(edge_lines(kept_edges, xs, ys, name="kept edge", color=OKABE_ITO["black"], width=2.0))
        pr = [j for j in range(1, n) if not view.kept[j]]
        kp = [j for j in range(1, n) if view.kept[j]]
        if pr:
            fig.add_trace(_nodes(pr, xs, ys, name=NODE_STATES["pruned"][0],
                                 marker=_marker("pruned", 10, OKABE_ITO["grey"]), opacity=0.3,
                                 text=[labels[j] for j in pr], text_color=OKABE_ITO["grey"],
                                 hover=[hovers[j] for j in pr], customdata=[["candidate", view.cand[j]] for j in pr]))
        fig.add_trace(_nodes(kp, xs, ys, name=f"kept: goes to the target (fill = {score_name})",
                             marker=dict(color=[view.score[j] for j in kp], coloraxis="coloraxis", symbol="circle",
                                         size=14, line=dict(color=OKABE_ITO["black"], width=2.5)),
                             text=[labels[j] for j in kp], hover=[hovers[j] for j in kp],
                             customdata=[["candidate", view.cand[j]] for j in kp]))
    fig.add_trace(_nodes([0], xs, ys, name=NODE_STATES["root"][0], marker=root_marker, text=[labels[0]],
                         hover=[f"<b>{token_hover(view.tok[0], decode)}</b>  root: the last committed token"],
                         customdata=[["node", 0]]))
    fig.update_layout(coloraxis=dict(colorscale=SCORE_COLORSCALE, cmin=cmin, cmax=cmax,
                                     colorbar=dict(title=dict(text=score_name, side="right"), thickness=12, len=0.8)))
    xaxis, yaxis = _tree_axes(xs, ys)
    return panel_layout(fig, title, height=_tree_height(ys, 24), xaxis=xaxis, yaxis=yaxis, legend_rows=2)


# ---------------------------------------------------------------------------------------------- frames 3-4 layout
def _tree_view(st: StepTrace) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Parents of the verified tree plus one node for the bonus token (index len(tree)), and the layout."""
    parents = as_ints(st.tree.parents) + [int(st.accepted_nodes[-1])]
    scores = as_floats(st.tree.scores) + [math.inf]    # the bonus sits on top of its siblings
    xs, ys = tree_layout(parents, scores)
    return parents, xs, ys


def _checked_figure(st: StepTrace, decode, title: str) -> go.Figure:
    tree = st.tree
    n = len(tree)
    parents, xs, ys = _tree_view(st)
    argmax = as_ints(st.node_target_argmax)
    tokens = as_ints(tree.tokens)
    fig = go.Figure()
    fig.add_trace(edge_lines([(parents[i], i) for i in range(1, n)], xs, ys, name="draft tree edge", color="#BBBBBB",
                         width=1.4))

    def label(i: int) -> str:
        own = token_label(tokens[i], decode, limit=9)
        if i < len(argmax):
            return f"{own}<br><span style='font-size:10px'>\u2192 {token_label(argmax[i], decode, limit=9)}</span>"
        return own

    def hover(i: int) -> str:
        lines = [f"<b>{token_hover(tokens[i], decode)}</b>  node {i}, depth {int(tree.depths[i])}"]
        if i > 0 and parents[i] < len(argmax):
            want = argmax[parents[i]]
            lines.append(f"target's choice at the parent: {token_hover(want, decode)}"
                         + (" (this token)" if want == tokens[i] else ""))
        if i < len(argmax):
            lines.append(f"target's own next token after this node: {token_hover(argmax[i], decode)}")
        return "<br>".join(lines)

    match = [i for i in range(1, n) if parents[i] < len(argmax) and argmax[parents[i]] == tokens[i]]
    differ = [i for i in range(1, n) if i not in set(match)]
    if match:
        fig.add_trace(_nodes(match, xs, ys, name="matches the target's choice at its parent",
                             marker=_marker("accepted", 15), text=[label(i) for i in match],
                             hover=[hover(i) for i in match], customdata=[["node", i] for i in match]))
    if differ:
        fig.add_trace(_nodes(differ, xs, ys, name="differs from the target's choice",
                             marker=_marker("rejected", 13, "#FFFFFF"), text=[label(i) for i in differ],
                             hover=[hover(i) for i in differ], customdata=[["node", i] for i in differ]))
    fig.add_trace(_nodes([0], xs, ys, name=NODE_STATES["root"][0],
                         marker=dict(color="#FFFFFF", symbol="square", size=18,
                                     line=dict(color=OKABE_ITO["black"], width=3)),
                         text=[label(0)], hover=[hover(0)], customdata=[["node", 0]]))
    # A legend entry that explains the "-> x" under every label.
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="\u2192 x: the target's own next token there",
                             marker=dict(color="rgba(0,0,0,0)", size=1), hoverinfo="skip", showlegend=True))
    xaxis, yaxis = _tree_axes(xs[:n], ys[:n])
    return panel_layout(fig, title, height=_tree_height(ys[:n], 36), xaxis=xaxis, yaxis=yaxis, legend_rows=2)


def _accepted_figure(st: StepTrace, decode, title: str) -> go.Figure:
    tree = st.tree
    n = len(tree)
    parents, xs, ys = _tree_view(st)
    tokens = as_ints(tree.tokens)
    path = [int(a) for a in st.accepted_nodes]
    on_path = set(path)
    fig = go.Figure()
    fig.add_trace(edge_lines([(parents[i], i) for i in range(1, n) if i not in on_path], xs, ys,
                         name="rejected branch", color="#CCCCCC", width=1.2))
    fig.add_trace(edge_lines(list(zip(path[:-1], path[1:])), xs, ys, name="accepted path", color=OKABE_ITO["blue"],
                         width=6.0, legend=True))
    fig.add_trace(edge_lines([(path[-1], n)], xs, ys, name="bonus: the target's own token", width=3.0,
                         color=NODE_STATES["bonus"][1], dash="dash"))
    rej = [i for i in range(1, n) if i not in on_path]
    if rej:
        fig.add_trace(_nodes(rej, xs, ys, name="rejected: its KV entries are discarded",
                             marker=_marker("rejected", 11, "#FFFFFF"), opacity=0.45,
                             text=[token_label(tokens[i], decode, limit=9) for i in rej], text_color="#999999",
                             hover=[f"{token_hover(tokens[i], decode)}  node {i}: rejected" for i in rej],
                             customdata=[["node", i] for i in rej]))
    acc = path[1:]
    if acc:
        fig.add_trace(_nodes(acc, xs, ys, name=NODE_STATES["accepted"][0], marker=_marker("accepted", 18),
                             text=[f"<b>{token_label(tokens[i], decode, limit=10)}</b>" for i in acc],
                             hover=[f"{token_hover(tokens[i], decode)}  node {i}: accepted" for i in acc],
                             customdata=[["node", i] for i in acc]))
    fig.add_trace(_root_node(tokens, xs, ys, decode))
    label, color, symbol = NODE_STATES["bonus"]
    fig.add_trace(_nodes([n], xs, ys, name=label,
                         marker=dict(color=color, symbol=symbol, size=20, line=dict(color="#000000", width=1.5)),
                         text=[f"<b>{token_label(int(st.bonus_token), decode, limit=10)}</b>"], text_color=color,
                         hover=[f"{token_hover(int(st.bonus_token), decode)}  the target's own next token"],
                         customdata=[["bonus", -1]]))
    xaxis, yaxis = _tree_axes(xs, ys)
    return panel_layout(fig, title, height=_tree_height(ys, 28), xaxis=xaxis, yaxis=yaxis, legend_rows=2)


def _committed_figure(st: StepTrace, decode, title: str) -> go.Figure:
    """A token strip: the root (already in the answer), then this step's emitted tokens."""
    k_acc = st.accepted_drafts
    emitted = as_ints(st.emitted_tokens)
    kinds = [("root", int(st.tree.tokens[0]))] + [("accepted" if i < k_acc else "bonus", t)
                                                   for i, t in enumerate(emitted)]
    names = {"root": "already in the answer", "accepted": "accepted draft (committed)",
             "bonus": "the target's own token (committed)"}
    fig = go.Figure()
    for kind in ("root", "accepted", "bonus"):
        idx = [i for i, (k, _) in enumerate(kinds) if k == kind]
        if not idx:
            continue
        _, color, symbol = NODE_STATES[kind]
        fill = "#FFFFFF" if kind == "root" else color
        fig.add_trace(go.Scatter(
            x=idx, y=[0.0] * len(idx), mode="markers+text", name=names[kind], legendgroup=kind,
            marker=dict(color=fill, symbol=symbol, size=22, line=dict(color=color if kind != "bonus" else "#000000",
                                                                     width=2)),
            text=[token_label(kinds[i][1], decode, limit=12) for i in idx], textposition="top center",
            textfont=dict(size=12), hovertext=[token_hover(kinds[i][1], decode) for i in idx], hoverinfo="text",
            customdata=[[kind, i] for i in idx]))
    fig.add_trace(go.Scatter(x=[0.5, len(kinds) - 0.5], y=[-0.5, -0.5], mode="lines",
                             name="one target forward pass", line=dict(color=OKABE_ITO["vermillion"], width=3),
                             hoverinfo="skip"))
    xaxis = dict(title=dict(text="answer position", standoff=4), tickmode="array",
                 tickvals=list(range(len(kinds))), ticktext=[str(st.position - 1 + i) for i in range(len(kinds))],
                 range=[-0.6, max(len(kinds), 4) - 0.4], zeroline=False, showgrid=False)
    yaxis = dict(range=[-0.9, 0.9], showticklabels=False, zeroline=False, showgrid=False, title=None)
    return panel_layout(fig, title, height=170, xaxis=xaxis, yaxis=yaxis, legend_rows=2)


# ---------------------------------------------------------------------------------------------- sentences
def _drafted_sentence(st: StepTrace, engine: str, view: _CandidateView | None, label: str, dec) -> str:
    n = st.tree.num_drafted
    if view is not None:
        shown = ("" if len(view.drawn) == view.total else
                 f" (drawn: {len(view.drawn)} of them, at most {MAX_PER_PARENT} under each parent)")
        if engine == "eagle3":
            passes = _plural(view.max_depth, "forward pass", "forward passes")
            return (f"The EAGLE-3 head ran once per tree level, {passes} "
                    f"for {_plural(view.max_depth, 'level')}, and proposed {_plural(view.total, 'scored candidate')}"
                    f"{shown}.")
        if engine == "dart":
            return (f"The DART head ran **one** forward pass that proposed all {_plural(view.max_depth, 'depth')} at "
                    f"once and scored {_plural(view.total, 'candidate')} in it{shown}.")
        return f"The {label} drafter proposed {_plural(view.total, 'scored candidate')}{shown}."
    if n == 0:
        if engine == "vanilla":
            return "Plain decoding drafts nothing: the target alone will produce the next token."
        return (f"The {label} drafter proposed nothing this step (a plain step): the target alone will produce "
                "the next token.")
    if engine == "prompt_lookup":
        return (f"Prompt lookup runs no model and scores no candidates: it copied {_plural(n, 'token')} that followed "
                f"earlier occurrences of the latest words in the prompt, starting with "
                f"{_q(dec, [st.tree.tokens[st.tree.children()[0][0]]])}.")
    return f"The {label} drafter proposed {_plural(n, 'token')} and recorded no scored candidates."


def _pruned_sentence(st: StepTrace, engine: str, view: _CandidateView | None) -> str:
    n = st.tree.num_drafted
    if view is None:
        if n == 0:
            return "Nothing to prune: there is no draft this step."
        return f"Nothing to prune: all {_plural(n, 'drafted token')} go to the target as they are."
    dropped = view.total - n
    if engine == "eagle3":
        how = ("its cumulative log-probability (the top-k children of the best nodes at each level, then the best "
               "overall up to the node budget)")
    elif engine == "dart":
        how = ("its score = logit term + N-gram term" + ("" if view.has_ngram else " (zero here: no N-gram table)")
               + ", best first until the node budget is spent")
    else:
        how = "the drafter's score, up to its node budget"
    return (f"The pruner kept {n} of {_plural(view.total, 'candidate')} (dropped {dropped}) by {how}; only the "
            "kept ones go to the target.")


def _checked_sentence(st: StepTrace, dec) -> str:
    tree = st.tree
    n = len(tree)
    argmax = as_ints(st.node_target_argmax)
    tokens = as_ints(tree.tokens)
    parents = as_ints(tree.parents)
    root = f"after the root {_q(dec, [tokens[0]])} it would say {_q(dec, [argmax[0]])}"
    if n == 1:
        return (f"The target ran **one** forward pass over the single root node: {root}, so it can commit "
                "exactly that one token.")
    match = sum(argmax[parents[i]] == tokens[i] for i in range(1, n) if parents[i] < len(argmax))
    verb = "equals" if match == 1 else "equal"
    sampling = "" if st.mode == "greedy" else " (sampling then accepts by probability, not only top choices)"
    return (f"The target ran **one** forward pass over all {n} nodes (the root + {_plural(n - 1, 'draft')}) and "
            f"computed its own next token at each one ({root}); {match} of the {n - 1} drafted tokens {verb} the "
            f"target's choice at their parent{sampling}.")


def _accepted_sentence(st: StepTrace, narration, dec) -> str:
    tree = st.tree
    tokens = as_ints(tree.tokens)
    path = narration.accepted_path
    acc = len(path) - 1
    greedy = st.mode == "greedy"
    bonus = _q(dec, [st.bonus_token])
    if tree.num_drafted == 0:
        return (f"With no draft there is nothing to accept: the target's own token {bonus} is the step's one new "
                "token.")
    last = narration.decisions[-1]
    at = _q(dec, [tokens[last.node]])
    if not last.tried:
        why = f"nothing was drafted after {at} (a leaf of the tree)"
    elif greedy:
        why = (f"after {at} the target wanted {_q(dec, [last.target_choice])} but the draft offered only "
               + ", ".join(_q(dec, [t]) for _, t, _, _ in last.tried))
    else:
        why = (f"after {at} each of the {_plural(len(last.tried), 'drafted child', 'drafted children')} was rejected "
               f"(chance {', '.join(f'{pa:.2f}' for _, _, _, pa in last.tried)})")
    if acc:
        agreed = (f"The longest path the target agrees with holds {_plural(acc, 'drafted token')}, "
                  f"{_q(dec, [tokens[i] for i in path[1:]])}"
                  + ("" if greedy else " (sampling: p/q rule with the draft a fixed token, so each was accepted "
                                       "with the target's probability p, renormalised after earlier rejections)"))
    else:
        agreed = "The target accepts none of the drafted tokens" + (
            "" if greedy else " (sampling: each tried with the target's probability p, the p/q rule for fixed drafts)")
    bonus_how = ("its own top choice there" if greedy else
                 "drawn from what the rejections left" if last.tried else "drawn from its distribution there")
    return f"{agreed}; the path stops because {why}; the target adds the bonus token {bonus} ({bonus_how})."


def _committed_sentence(st: StepTrace, dec) -> str:
    emitted = as_ints(st.emitted_tokens)
    k = len(emitted)
    rejected = st.tree.num_drafted - st.accepted_drafts
    text = _q(dec, emitted) if emitted else "nothing"
    kv = (f"the KV-cache entries of the {_plural(rejected, 'rejected node')} are discarded" if rejected else
          "no node was rejected, so no KV-cache entry is discarded")
    cut = "" if k >= st.accepted_drafts + 1 else (f" (generation stopped: {st.stop_reason or 'end of answer'}, "
                                                  f"so only {k} of {st.accepted_drafts + 1} were kept)")
    return (f"{_plural(k, 'token')} ({text}) {'is' if k == 1 else 'are'} committed to the answer for one target "
            f"forward pass{cut}; {kv}.")


# ---------------------------------------------------------------------------------------------- round frames
def round_frames(step: TraceLike, tokenizer: Any = None, *, engine: str = "dart",
                 score_label: str | None = None) -> list[RoundFrame]:
    """One speculative round as five frames a teacher can click through, from its StepTrace.

    drafted    every candidate the drafter scored, at its depth under its parent (at most MAX_PER_PARENT per
               parent and MAX_DRAWN in all, kept ones always; the sentence says how many exist); drafters that
               score none (prompt lookup) and plain steps: the tree as drafted
    pruned     the same layout, the kept tree in black, the pruned candidates faded
    checked    the verified tree; under each node "-> x", the target's own next token there; nodes equal to
               the target's choice at their parent drawn as matching (blue circles)
    accepted   the accepted path bold, rejected branches faded, the bonus token (purple star)
    committed  a token strip: the root, then the committed tokens (accepted drafts, the bonus)

    ``engine``: "dart", "eagle3", "prompt_lookup", "vanilla" (words only: how the draft was made).
    ``tokenizer``: None (token ids), a callable ids -> text, or a tokenizer.
    """
    st = as_step(step)
    decode = as_decoder(tokenizer)
    dec = _text_decoder(tokenizer)
    label = label_of(engine)
    tree = st.tree
    n = tree.num_drafted
    narration = narrate_step(st, tokenizer if tokenizer is not None else dec, engine)
    view = _CandidateView(st) if st.candidates is not None and len(st.candidates) else None
    score_name = score_name_of(st, score_label)

    # 1. drafted
    if view is not None:
        fwd = "1 head forward" if engine == "dart" else (
            f"{_plural(view.max_depth, 'head forward')}" if engine == "eagle3" else "")
        t1 = f"1 \u00b7 Drafted: {_plural(view.total, 'candidate')}" + (f", {fwd}" if fwd else "")
        f1 = _candidate_figure(st, view, decode, score_name, t1, pruned_stage=False)
        t2 = f"2 \u00b7 Pruned: kept {n} of {view.total}"
        f2 = _candidate_figure(st, view, decode, score_name, t2, pruned_stage=True)
    else:
        t1 = (f"1 \u00b7 Drafted: {_plural(n, 'token')}" + (" copied from the prompt" if engine == "prompt_lookup"
                                                           and n else "") if n else "1 \u00b7 Drafted: nothing")
        f1 = _plain_tree_figure(st, decode, t1)
        t2 = "2 \u00b7 Pruned: nothing to prune"
        f2 = _plain_tree_figure(st, decode, t2)
    frames = [RoundFrame("drafted", _plain(f1), _drafted_sentence(st, engine, view, label, dec), f1),
              RoundFrame("pruned", _plain(f2), _pruned_sentence(st, engine, view), f2)]

    # 3. checked
    t3 = f"3 \u00b7 Checked: 1 target forward over {_plural(len(tree), 'node')}"
    f3 = _checked_figure(st, decode, t3)
    frames.append(RoundFrame("checked", _plain(f3), _checked_sentence(st, dec), f3))

    # 4. accepted
    bonus_label = token_label(int(st.bonus_token), decode, limit=10)
    t4 = (f"4 \u00b7 Accepted: {st.accepted_drafts} of {n} drafts + bonus {bonus_label}" if n else
          f"4 \u00b7 Accepted: no draft; the target's token {bonus_label}")
    f4 = _accepted_figure(st, decode, t4)
    frames.append(RoundFrame("accepted", _plain(f4), _accepted_sentence(st, narration, dec), f4))

    # 5. committed
    k = len(st.emitted_tokens)
    t5 = f"5 \u00b7 Committed: {_plural(k, 'token')} in one target pass"
    f5 = _committed_figure(st, decode, t5)
    frames.append(RoundFrame("committed", _plain(f5), _committed_sentence(st, dec), f5))
    return frames


def _plain_tree_figure(st: StepTrace, decode, title: str) -> go.Figure:
    """The drafted tree as it is (no scored candidates): drafts in sky blue, the root a square."""
    tree = st.tree
    n = len(tree)
    parents = as_ints(tree.parents)
    xs, ys = tree_layout(parents, as_floats(tree.scores))
    tokens = as_ints(tree.tokens)
    fig = go.Figure()
    fig.add_trace(edge_lines([(parents[i], i) for i in range(1, n)], xs, ys, name="draft edge", color="#BBBBBB",
                         width=1.4))
    if n > 1:
        idx = list(range(1, n))
        fig.add_trace(_nodes(idx, xs, ys, name="drafted token",
                             marker=dict(color=OKABE_ITO["sky_blue"], symbol="circle", size=13,
                                         line=dict(color="#444444", width=1.5)),
                             text=[token_label(tokens[i], decode, limit=10) for i in idx],
                             hover=[f"{token_hover(tokens[i], decode)}  node {i}, depth {int(tree.depths[i])}"
                                    for i in idx], customdata=[["node", i] for i in idx]))
    fig.add_trace(_root_node(tokens, xs, ys, decode))
    xaxis, yaxis = _tree_axes(xs, ys)
    return panel_layout(fig, title, height=_tree_height(ys), xaxis=xaxis, yaxis=yaxis, legend_rows=1)
