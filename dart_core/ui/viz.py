"""Plotly figures from StepTrace records: draft tree, candidate scores, stage timings, acceptance; and the cost
of a tree on this machine (from the cost model and an automatic-tree chooser).

Every function here is pure: it reads traces (a :class:`~dart_core.engine.trace.StepTrace`, its
``to_dict()`` form, or its JSON text) and returns figures. The analytics they draw (acceptance
statistics, token origins, node states) live in dart_core.engine.trace_stats; the answer's
highlighted spans in dart_core.ui.record. Live runs and replays render through the same code.

    fig = tree_figure(trace, tokenizer)                  # one step's pruned draft tree
    fig = score_scatter(trace)                           # N-gram term vs logit term of every candidate
    fig = timing_figure({"dart": traces, "eagle3": other})
    figs = acceptance_figures(traces)                    # per step, histogram, per depth
    fig = verify_cost_figure(costs)                      # verify ms by tree nodes (dart_core.sizing.CostModel)
    fig = budget_rate_figure(auto.rates())               # DART's expected tokens/s by budget (an AutoTree)
    text = tree_cost_text(costs, auto.rates())           # why this machine picks what it picks

Node states and colours (Okabe-Ito, colour-blind safe), each with a second cue (marker symbol):
accepted = blue circle, verified but rejected = orange diamond, pruned = grey triangle,
bonus (the target's own token) = purple star, root = black square.
"""
from __future__ import annotations

import html
import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..engine.trace import STAGES, StepTrace
from ..engine.trace_stats import (ACCEPTED_LABEL, BONUS_LABEL, PREFILL_LABEL, SCATTER_GROUPS, TraceLike,
                                  acceptance_metrics, as_step, as_steps, candidate_groups, candidate_nodes,
                                  node_states)

# ---------------------------------------------------------------------------------------------- palette
# Okabe & Ito (2008), "Color Universal Design".
OKABE_ITO = {
    "black": "#000000", "orange": "#E69F00", "sky_blue": "#56B4E9", "bluish_green": "#009E73",
    "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00", "reddish_purple": "#CC79A7",
    "grey": "#999999",
}

# state -> (legend label, colour, marker symbol); the symbol is the cue that survives without colour.
NODE_STATES: dict[str, tuple[str, str, str]] = {
    "root": ("root (last committed token)", OKABE_ITO["black"], "square"),
    "accepted": ("accepted by the target", OKABE_ITO["blue"], "circle"),
    "rejected": ("verified, rejected", OKABE_ITO["orange"], "diamond"),
    "pruned": ("pruned (never verified)", OKABE_ITO["grey"], "triangle-up"),
    "bonus": ("bonus: the target's own token", OKABE_ITO["reddish_purple"], "star"),
}

# Stage colours avoid the state colours' meanings where they can; each also gets a bar pattern.
STAGE_STYLE: dict[str, tuple[str, str]] = {
    "draft_forward": (OKABE_ITO["sky_blue"], ""),
    "tree_build": (OKABE_ITO["yellow"], "/"),
    "verify": (OKABE_ITO["vermillion"], "x"),
    "commit": (OKABE_ITO["bluish_green"], "."),
}

# Pruned candidates (never verified) are drawn faded, with grey labels.
PRUNED_OPACITY = 0.45

# Score colour scale: cividis is designed to read the same with colour-vision deficiencies.
SCORE_COLORSCALE = "Cividis"

# colour map for gr.HighlightedText(color_map=SPAN_COLORS)
SPAN_COLORS = {ACCEPTED_LABEL: OKABE_ITO["blue"], BONUS_LABEL: OKABE_ITO["reddish_purple"],
               PREFILL_LABEL: OKABE_ITO["reddish_purple"]}

Decoder = Union[Callable[[list[int]], str], Any, None]   # a callable, anything with .decode, or None


# ---------------------------------------------------------------------------------------------- inputs
def _decoder(tokenizer: Decoder) -> Callable[[list[int]], str] | None:
    """Token labels keep special tokens' names (e.g. <|im_end|>)."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "decode"):
        return lambda ids: tokenizer.decode(list(ids))
    if callable(tokenizer):
        return lambda ids: tokenizer(list(ids))
    raise TypeError(f"tokenizer must be None, a callable list[int] -> str, or have .decode(); "
                    f"got {type(tokenizer).__name__}")


def _token_label(tok: int, decode: Callable[[list[int]], str] | None, limit: int = 12) -> str:
    """Short, visible form of one token for a node label (whitespace made visible)."""
    if decode is None:
        return f"#{tok}"
    text = decode([int(tok)])
    text = text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    if not text:
        return f"#{tok}"
    text = text if len(text) <= limit else text[: limit - 1] + "\u2026"
    return html.escape(text, quote=False)  # plotly reads labels as pseudo-HTML: "<|im_end|>" would vanish


def _token_hover(tok: int, decode: Callable[[list[int]], str] | None) -> str:
    if decode is None:
        return f"#{tok}"
    # repr keeps leading spaces and newlines visible in the tooltip
    return html.escape(f"{decode([int(tok)])!r} (#{tok})", quote=False)


def _floats(x: Any) -> list[float]:
    return [float(v) for v in np.asarray(x, dtype=np.float64).reshape(-1)]


def _ints(x: Any) -> list[int]:
    return [int(v) for v in np.asarray(x, dtype=np.int64).reshape(-1)]


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "\u2014"
    return f"{v:.{digits}f}" if math.isfinite(v) else str(v)


# ---------------------------------------------------------------------------------------------- page layout
#: Pixels above the plot area for a one-line title (the title pushes the margin further if it needs more).
TITLE_PX = 48


def page_layout(fig: go.Figure, title: str | Mapping[str, Any], *, top: int = TITLE_PX, left: int = 60,
                 right: int = 20, **layout: Any) -> go.Figure:
    """The one layout every figure here shares, safe at any width (gr.Plot sizes a figure to its container):

    * the title at the container's top left (``yref="container"``), in a top margin it can push
      (``automargin``) -- never over the plot, a subplot title or a legend;
    * the legend horizontal under the x-axis title, anchored to the container's bottom
      (``legend.yref="container"``): plotly.js grows the bottom margin by the legend's height, however many
      rows its entries wrap into at this width, so the legend never covers the plot, the axis titles or the
      title (a legend at y=1.02 above the plot wraps into the title on narrow pages).
    """
    title = dict(title) if isinstance(title, Mapping) else dict(text=title)
    title = dict(x=0, xanchor="left", xref="container", y=1, yanchor="top", yref="container",
                 pad=dict(t=12, l=12), automargin=True) | title
    fig.update_layout(title=title,
                      legend=dict(orientation="h", xref="container", x=0, xanchor="left", yref="container", y=0,
                                  yanchor="bottom"),
                      showlegend=True, margin=dict(l=left, r=right, t=top, b=12, autoexpand=True),
                      plot_bgcolor="#FFFFFF", **layout)
    return fig


# ---------------------------------------------------------------------------------------------- layout
def tree_layout(parents: Sequence[int], scores: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Node-link layout of a rooted tree (or forest): x = depth, y = row, 0 at the top.

    Leaves take consecutive rows in the order of a depth-first walk that visits children
    best score first (ties: lower index first); a parent sits midway between its first and
    last child. Nodes at one depth are therefore at least one row apart.
    ``parents[i]`` is the parent's index, -1 for a root. Returns float arrays (x, y).
    """
    par = _ints(parents)
    n = len(par)
    sc = [0.0] * n if scores is None else _floats(scores)
    if len(sc) != n:
        raise ValueError(f"scores has {len(sc)} entries but parents has {n}")
    kids: list[list[int]] = [[] for _ in range(n)]
    roots: list[int] = []
    for i, p in enumerate(par):
        if p == -1:
            roots.append(i)
        elif 0 <= p < n and p != i:
            kids[p].append(i)
        else:
            raise ValueError(f"node {i} has parent {p}; parents must be -1 or another node's index")
    for lst in kids:
        lst.sort(key=lambda j: (-sc[j], j))
    roots.sort()

    x = np.full(n, -1.0)
    y = np.zeros(n)
    next_row = 0
    for r in roots:
        # Iterative post-order walk: trees can be deeper than Python's recursion limit.
        x[r] = 0.0
        stack: list[tuple[int, bool]] = [(r, False)]
        while stack:
            node, done = stack.pop()
            if done:
                ch = kids[node]
                y[node] = 0.5 * (y[ch[0]] + y[ch[-1]])
                continue
            if not kids[node]:
                y[node] = float(next_row)
                next_row += 1
                continue
            stack.append((node, True))
            for c in reversed(kids[node]):  # pushed reversed so the best child is visited first
                x[c] = x[node] + 1.0
                stack.append((c, False))
    if (x < 0).any():
        bad = int(np.flatnonzero(x < 0)[0])
        raise ValueError(f"node {bad} is not reachable from a root (the parents form a cycle)")
    return x, y


# ---------------------------------------------------------------------------------------------- node mapping
def _has_ngram(st: StepTrace) -> bool:
    return st.candidates is not None and any(v != 0.0 for v in _floats(st.candidates.ngram_term))


def _score_name(st: StepTrace, score_label: str | None) -> str:
    if score_label:
        return score_label
    return "combined score" if _has_ngram(st) else "score"


def _optional_candidate_field(c: Any, *names: str) -> list[float] | None:
    # Fields some drafters may add later (e.g. a draft probability); shown only when present.
    for name in names:
        v = getattr(c, name, None)
        if v is not None and len(v):
            return _floats(v)
    return None


def _rank_lines(rank: int, of: int, sibling_rank: int, siblings: int, score_name: str) -> list[str]:
    """A scored candidate's rank by score among all candidates and among its parent's, as hover lines."""
    return [f"rank {rank} of {of} by {score_name}", f"rank {sibling_rank} of {siblings} among its parent's candidates"]


class _StepView:
    """Per-step values that every node's details share, computed once per figure."""

    def __init__(self, st: StepTrace, score_label: str | None):
        self.st = st
        self.states = node_states(st)
        self.has_ngram = _has_ngram(st)
        self.score_name = _score_name(st, score_label)
        self.cand_of_node: dict[int, int] = {}
        c = st.candidates
        if c is not None:
            for ci, nd in enumerate(candidate_nodes(st)):
                if nd > 0:
                    self.cand_of_node.setdefault(nd, ci)
            self.logit, self.ngram = _floats(c.logit_term), _floats(c.ngram_term)
            self.draft_prob = _optional_candidate_field(c, "draft_prob", "draft_probability")
            self.cum_logprob = _optional_candidate_field(c, "cum_logprob", "cumulative_logprob")
            # Ranks by score, best first (ties: lower candidate index first): among all candidates and among
            # the candidates of the same parent (the root's children share parent -1).
            score, cpar = _floats(c.score), _ints(c.parent)
            order = sorted(range(len(score)), key=lambda j: (-score[j], j))
            self.rank = [0] * len(score)
            self.sibling_rank = [0] * len(score)
            self.siblings = [0] * len(score)
            by_parent: dict[int, list[int]] = {}
            for r, j in enumerate(order, start=1):
                self.rank[j] = r
                by_parent.setdefault(cpar[j], []).append(j)
            for group in by_parent.values():
                for r, j in enumerate(group, start=1):
                    self.sibling_rank[j], self.siblings[j] = r, len(group)

    def answer_position(self, state: str, depth: int) -> int:
        """Index in the engine's answer of the token a node stands for (-1: none). ``st.position`` counts the
        answer tokens emitted before this step, so it is the index of the step's first emitted token: an
        accepted node at depth d is answer token position + d - 1, the bonus position + accepted drafts (if
        emitted); a rejected or pruned node at depth d competed for position + d - 1; the root gives -1 (its
        token, the last committed one, is answer token position - 1, emitted by an earlier step)."""
        st = self.st
        if state == "root":
            return -1
        if state == "bonus":
            return st.position + st.accepted_drafts if len(st.emitted_tokens) > st.accepted_drafts else -1
        if state == "accepted" and depth > len(st.emitted_tokens):
            return -1   # defensive: an accepted draft the engine did not emit
        return st.position + depth - 1

    def rank_lines(self, ci: int | None) -> list[str]:
        """Hover lines with candidate ``ci``'s rank among all candidates and among its parent's."""
        if ci is None or self.st.candidates is None:
            return []
        return _rank_lines(self.rank[ci], len(self.rank), self.sibling_rank[ci], self.siblings[ci], self.score_name)

    def details(self, node: int, decode: Callable[[list[int]], str] | None) -> dict[str, Any]:
        st, tree = self.st, self.st.tree
        node = int(node)
        if not 0 <= node < len(tree):
            raise IndexError(f"node {node} is outside the tree (0..{len(tree) - 1})")
        tok = int(tree.tokens[node])
        parent = int(tree.parents[node])
        d: dict[str, Any] = {
            "node": node, "token": tok, "text": None if decode is None else decode([tok]),
            "depth": int(tree.depths[node]), "state": self.states[node],
            "score": float(tree.scores[node]), "score_name": self.score_name,
            "logit_term": None, "ngram_term": None, "draft_prob": None, "cum_logprob": None,
            "target_prob": float(st.node_target_prob[node]) if node < len(st.node_target_prob) else None,
            "target_choice": None, "target_choice_text": None, "matches_target": None, "bonus_token": None,
            "answer_position": self.answer_position(self.states[node], int(tree.depths[node])),
            "candidate": None, "rank": None, "candidates": None, "sibling_rank": None, "siblings": None,
        }
        ci = self.cand_of_node.get(node)
        if ci is not None:
            d["candidate"], d["rank"], d["candidates"] = ci, self.rank[ci], len(self.rank)
            d["sibling_rank"], d["siblings"] = self.sibling_rank[ci], self.siblings[ci]
            d["logit_term"] = self.logit[ci]
            d["ngram_term"] = self.ngram[ci] if self.has_ngram else None
            d["draft_prob"] = None if self.draft_prob is None else self.draft_prob[ci]
            d["cum_logprob"] = None if self.cum_logprob is None else self.cum_logprob[ci]
        if 0 <= parent < len(st.node_target_argmax):
            choice = int(st.node_target_argmax[parent])
            d["target_choice"] = choice
            d["target_choice_text"] = None if decode is None else decode([choice])
            d["matches_target"] = choice == tok
        if node == int(st.accepted_nodes[-1]):
            d["bonus_token"] = int(st.bonus_token)
        return d


def node_details(step: TraceLike, node: int, tokenizer: Decoder = None,
                 score_label: str | None = None) -> dict[str, Any]:
    """Everything the trace knows about one tree node, for tooltips and the app's node panel.

    Keys: node, token, text, depth, state, score (+ score_name), logit_term, ngram_term,
    draft_prob, cum_logprob (None when the trace lacks them), target_prob (the target's
    probability of this token at the parent), target_choice (the target's own next token at
    the parent) and its text, matches_target, and for the last accepted node ``bonus_token``;
    answer_position (the index in the engine's answer of the token the node stands for, -1 for the root:
    see the tree figure's ``customdata``); for nodes the drafter scored as candidates: candidate (its
    index), rank of candidates by score (1 = best) and sibling_rank of siblings (the candidates sharing its
    parent), else None.
    """
    return _StepView(as_step(step), score_label).details(node, _decoder(tokenizer))


# The optional per-node figures of a hover, in the order shown (absent ones are skipped).
_HOVER_TERMS = (("logit_term", "logit term"), ("ngram_term", "N-gram term"), ("draft_prob", "draft probability"),
                ("cum_logprob", "cumulative log-prob"), ("target_prob", "target probability"))


def _node_hover(d: dict[str, Any], decode) -> str:
    lines = [f"<b>{_token_hover(d['token'], decode)}</b>  node {d['node']}, depth {d['depth']}",
             f"state: {NODE_STATES[d['state']][0]}"]
    if d["state"] != "root":
        lines.append(f"{d['score_name']}: {_fmt(d['score'])}")
        if d["rank"] is not None:
            lines += _rank_lines(d["rank"], d["candidates"], d["sibling_rank"], d["siblings"], d["score_name"])
        lines += [f"{label}: {_fmt(d[key])}" for key, label in _HOVER_TERMS if d[key] is not None]
        if d["target_choice"] is not None:
            same = " (this token)" if d["matches_target"] else ""
            lines.append(f"target's own choice here: {_token_hover(d['target_choice'], decode)}{same}")
    if d["bonus_token"] is not None:
        lines.append(f"target's next token (bonus): {_token_hover(d['bonus_token'], decode)}")
    return "<br>".join(lines)


# ---------------------------------------------------------------------------------------------- tree figure
def edge_lines(pairs: Sequence[tuple[int, int]], xs, ys, *, name: str, color: str, width: float,
               dash: str = "solid", legend: bool = False, opacity: float = 1.0) -> go.Scatter:
    """One line trace for the tree edges ``pairs`` (parent, child) at layout positions ``xs``, ``ys``."""
    ex: list[float | None] = []
    ey: list[float | None] = []
    for a, b in pairs:
        ex += [float(xs[a]), float(xs[b]), None]
        ey += [float(ys[a]), float(ys[b]), None]
    return go.Scatter(x=ex, y=ey, mode="lines", name=name, line=dict(color=color, width=width, dash=dash),
                      opacity=opacity, hoverinfo="skip", showlegend=legend)


def _legend_proxy(state: str, group: str | None = None) -> go.Scatter:
    label, color, symbol = NODE_STATES[state]
    return go.Scatter(x=[None], y=[None], mode="markers", name=label, legendgroup=group or state,
                      marker=dict(color=color, symbol=symbol, size=12, line=dict(color=color, width=2)),
                      hoverinfo="skip", showlegend=True)


def tree_figure(step: TraceLike, tokenizer: Decoder = None, *, show_pruned: bool = False,
                max_pruned_per_node: int = 5, score_label: str | None = None,
                title: str | Mapping[str, Any] | None = None) -> go.Figure:
    """The verified draft tree of one step, x = depth, best siblings on top. ``title``: its text, or a plotly
    title dict (e.g. with a ``subtitle``).

    Node fill = the drafter's score (colour bar); border colour and marker symbol = state.
    The accepted path is drawn thick blue, ending in the target's bonus token (purple star).
    ``show_pruned`` adds up to ``max_pruned_per_node`` best pruned candidates under each tree
    node (faded, grey labels, at their own depth). ``tokenizer``: None (token ids), a callable ids -> text,
    or a tokenizer. Hovers give each scored node's rank by score among all candidates and among its
    parent's candidates.

    Every marker's ``customdata`` is ``[kind, index, answer_position]``: kind and index are ("node", tree
    index), ("bonus", -1) or ("candidate", candidate index); answer_position is the index in the engine's
    answer of the token the marker stands for, from ``st.position`` (the number of answer tokens emitted
    before this step, so the index of the step's first emitted token): an accepted node at depth d (root
    depth 0) is ``st.position + d - 1``, the bonus token ``st.position + st.accepted_drafts`` (-1 if it was
    not emitted), a rejected or pruned node at depth d the position it competed for,
    ``st.position + d - 1``, and the root -1.
    """
    st = as_step(step)
    decode = _decoder(tokenizer)
    tree = st.tree
    n = len(tree)
    states = node_states(st)
    parents = _ints(tree.parents)
    rank_scores = _floats(tree.scores)
    accepted = [int(a) for a in st.accepted_nodes]

    # Extra nodes for the layout: the bonus token, then (optionally) pruned candidates.
    last = accepted[-1]
    bonus_idx = n
    parents.append(last)
    rank_scores.append(math.inf)  # the bonus sits on top of its rejected siblings
    pruned: list[int] = []
    if show_pruned and st.candidates is not None and max_pruned_per_node > 0:
        c = st.candidates
        cn = candidate_nodes(st)
        cpar, ckept, cscore = _ints(c.parent), [bool(k) for k in c.kept], _floats(c.score)
        by_parent: dict[int, list[int]] = {}
        for ci in range(len(cn)):
            if ckept[ci] and cn[ci] >= 0:
                continue
            pnode = 0 if cpar[ci] < 0 else cn[cpar[ci]]
            if pnode >= 0:  # only pruned children of nodes that are drawn
                by_parent.setdefault(pnode, []).append(ci)
        for pnode in sorted(by_parent):
            best = sorted(by_parent[pnode], key=lambda j: (-cscore[j], j))[:max_pruned_per_node]
            for ci in best:
                pruned.append(ci)
                parents.append(pnode)
                rank_scores.append(cscore[ci])
    xs, ys = tree_layout(parents, rank_scores)

    score_name = _score_name(st, score_label)
    drafted_scores = _floats(tree.scores[1:])
    if pruned:
        all_scores = _floats(st.candidates.score)
        drafted_scores += [all_scores[ci] for ci in pruned]
    cmin = min(drafted_scores) if drafted_scores else -1.0
    cmax = max(drafted_scores) if drafted_scores else 0.0
    if cmax - cmin < 1e-9:
        cmin = cmax - 1.0

    fig = go.Figure()

    # Edges: plain, pruned, accepted path, bonus (drawn under the nodes).
    on_path = set(zip(accepted[:-1], accepted[1:]))
    plain = [(parents[i], i) for i in range(1, n) if (parents[i], i) not in on_path]
    fig.add_trace(edge_lines(plain, xs, ys, name="draft tree edge", color="#BBBBBB", width=1.2))
    if pruned:
        fig.add_trace(edge_lines([(parents[n + 1 + k], n + 1 + k) for k in range(len(pruned))], xs, ys,
                                 name="pruned edge", color=OKABE_ITO["grey"], width=1.0, dash="dot"))
    fig.add_trace(edge_lines(sorted(on_path), xs, ys, name="accepted path", color=OKABE_ITO["blue"], width=5.0,
                             legend=True))
    fig.add_trace(edge_lines([(last, bonus_idx)], xs, ys, name="target's own token (bonus)",
                             color=OKABE_ITO["reddish_purple"], width=3.0, dash="dash", legend=True))

    coloraxis_used = False
    view = _StepView(st, score_label)
    for state in ("rejected", "accepted", "root"):
        idx = [i for i in range(n) if states[i] == state]
        if not idx and state != "accepted":
            continue
        label, color, symbol = NODE_STATES[state]
        details = [view.details(i, decode) for i in idx]
        if state == "root":
            marker = dict(color="#FFFFFF", symbol=symbol, size=18, line=dict(color=color, width=3))
        else:
            marker = dict(color=[float(tree.scores[i]) for i in idx], coloraxis="coloraxis", symbol=symbol,
                          size=18 if state == "accepted" else 14,
                          line=dict(color=color, width=4 if state == "accepted" else 2.5))
            coloraxis_used = True
        fig.add_trace(go.Scatter(
            x=[float(xs[i]) for i in idx], y=[float(ys[i]) for i in idx], mode="markers+text",
            name=label, legendgroup=state, showlegend=False, marker=marker,
            text=[_token_label(int(tree.tokens[i]), decode) for i in idx], textposition="middle right",
            textfont=dict(size=11), hovertext=[_node_hover(d, decode) for d in details], hoverinfo="text",
            customdata=[["node", i, d["answer_position"]] for i, d in zip(idx, details)]))

    if pruned:
        c = st.candidates
        ctok, cdepth, cscore = _ints(c.token), _ints(c.depth), _floats(c.score)
        clogit, cng = _floats(c.logit_term), _floats(c.ngram_term)
        has_ng = _has_ngram(st)
        hovers = []
        for ci in pruned:
            lines = [f"<b>{_token_hover(ctok[ci], decode)}</b>  candidate {ci}, depth {cdepth[ci]}",
                     f"state: {NODE_STATES['pruned'][0]}", f"{score_name}: {_fmt(cscore[ci])}",
                     *view.rank_lines(ci), f"logit term: {_fmt(clogit[ci])}"]
            if has_ng:
                lines.append(f"N-gram term: {_fmt(cng[ci])}")
            hovers.append("<br>".join(lines))
        label, color, symbol = NODE_STATES["pruned"]
        fig.add_trace(go.Scatter(
            x=[float(xs[n + 1 + k]) for k in range(len(pruned))], y=[float(ys[n + 1 + k]) for k in range(len(pruned))],
            mode="markers+text", name=label, legendgroup="pruned", showlegend=False,
            marker=dict(color=[cscore[ci] for ci in pruned], coloraxis="coloraxis", symbol=symbol, size=10,
                        opacity=PRUNED_OPACITY, line=dict(color=color, width=1.5)),
            text=[_token_label(ctok[ci], decode) for ci in pruned], textposition="middle right",
            textfont=dict(size=9, color=OKABE_ITO["grey"]), hovertext=hovers, hoverinfo="text",
            customdata=[["candidate", ci, view.answer_position("pruned", cdepth[ci])] for ci in pruned]))
        coloraxis_used = True

    # The bonus token: the target's own choice where the accepted path stopped.
    emitted_bonus = len(st.emitted_tokens) > st.accepted_drafts
    how = "its argmax" if st.mode == "greedy" else "sampled from what the rejections left"
    bonus_hover = "<br>".join([
        f"<b>{_token_hover(int(st.bonus_token), decode)}</b>  bonus token, depth {int(tree.depths[last]) + 1}",
        f"the target's own next token after node {last} ({how})",
        "emitted" if emitted_bonus else "not emitted: generation stopped before it"])
    label, color, symbol = NODE_STATES["bonus"]
    fig.add_trace(go.Scatter(
        x=[float(xs[bonus_idx])], y=[float(ys[bonus_idx])], mode="markers+text", name=label,
        legendgroup="bonus", showlegend=False,
        marker=dict(color=color, symbol=symbol, size=20, line=dict(color="#000000", width=1.5)),
        text=[_token_label(int(st.bonus_token), decode)], textposition="middle right",
        textfont=dict(size=11, color=color), hovertext=[bonus_hover], hoverinfo="text",
        customdata=[["bonus", -1, view.answer_position("bonus", int(tree.depths[last]) + 1)]]))

    # Legend entries: one per state, coloured by state (the plotted fill is the score).
    for state in ("root", "accepted", "rejected") + (("pruned",) if pruned else ()) + ("bonus",):
        fig.add_trace(_legend_proxy(state))

    max_x = int(max(xs)) if len(xs) else 1
    rows = float(max(ys)) + 1 if len(ys) else 1
    # Height: the rows, plus the title and (under the plot) the legend, up to five rows of entries when narrow.
    page_layout(
        fig, title or (f"Step {st.step}: {st.accepted_drafts} of {tree.num_drafted} drafted tokens accepted "
                       f"+ 1 from the target ({st.mode})"),
        left=50, xaxis=dict(title="depth after the root", tickmode="linear", tick0=0, dtick=1,
                            range=[-0.4, max_x + 0.9], zeroline=False),
        yaxis=dict(title="siblings, best on top", autorange="reversed", showticklabels=False,
                   zeroline=False, showgrid=False),
        height=int(max(440, 260 + 26 * rows)), hovermode="closest")
    if coloraxis_used:
        fig.update_layout(coloraxis=dict(colorscale=SCORE_COLORSCALE, cmin=cmin, cmax=cmax,
                                         colorbar=dict(title=dict(text=score_name), thickness=14)))
    return fig


# ---------------------------------------------------------------------------------------------- scores
def score_scatter(step: TraceLike, tokenizer: Decoder = None, *, score_label: str | None = None,
                  title: str | None = None) -> go.Figure:
    """N-gram term vs logit term of every candidate the drafter scored: pruned, kept, accepted.

    ``customdata`` of each point is its candidate index. A trace without scored candidates
    (e.g. prompt lookup) gives empty groups and a note.
    """
    st = as_step(step)
    decode = _decoder(tokenizer)
    fig = go.Figure()
    groups = candidate_groups(st)
    style = {"pruned": ("pruned (never verified)", "pruned", 7, 0.45),
             "kept": ("kept (verified, not accepted)", "rejected", 9, 0.85),
             "accepted": ("accepted by the target", "accepted", 13, 1.0)}
    score_name = _score_name(st, score_label)
    c = st.candidates
    if c is not None:
        tok, depth, score = _ints(c.token), _ints(c.depth), _floats(c.score)
        logit, ng = _floats(c.logit_term), _floats(c.ngram_term)
    for g in SCATTER_GROUPS:
        label, state, size, opacity = style[g]
        _, color, symbol = NODE_STATES[state]
        idx = [i for i, gi in enumerate(groups) if gi == g]
        hovers = [f"<b>{_token_hover(tok[i], decode)}</b>  candidate {i}, depth {depth[i]}<br>"
                  f"logit term: {_fmt(logit[i])}<br>N-gram term: {_fmt(ng[i])}<br>{score_name}: {_fmt(score[i])}"
                  for i in idx]
        fig.add_trace(go.Scatter(
            x=[logit[i] for i in idx], y=[ng[i] for i in idx], mode="markers", name=f"{label} ({len(idx)})",
            marker=dict(color=color, symbol=symbol, size=size, opacity=opacity,
                        line=dict(color="#000000" if g == "accepted" else color, width=1)),
            hovertext=hovers, hoverinfo="text", customdata=idx, legendgroup=g))
    note = None
    if c is None:
        note = "no candidates scored in this step<br>(a plain step, or prompt lookup)"
    elif not _has_ngram(st):
        note = "no N-gram term in this trace:<br>every candidate sits at 0"
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                           font=dict(color="#555555"))
    page_layout(fig, title or f"Step {st.step}: candidate scores ({len(groups)} scored)",
                 xaxis=dict(title="logit term (weighted log draft probability)"),
                 yaxis=dict(title="N-gram term (weighted log N-gram prob.)"), height=480, hovermode="closest")
    return fig


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
                                subtitle=dict(text=f"{m['steps']} steps")), top=ACCEPTANCE_TOP,
                 xaxis=dict(title="tokens per step (bonus included)", dtick=1),
                 yaxis=dict(title="steps"), height=ACCEPTANCE_HEIGHT)

    depth = go.Figure()
    dx = list(range(1, len(m["per_depth"]) + 1))
    depth.add_trace(go.Bar(x=dx, y=m["per_depth"], name="of all steps (vLLM)", marker=dict(color=OKABE_ITO["blue"]),
                           hovertemplate="depth %{x}: %{y:.1%} of steps<extra></extra>"))
    depth.add_trace(go.Bar(x=dx, y=m["per_depth_given_drafted"], name="of steps whose tree reached that depth",
                           marker=dict(color=OKABE_ITO["sky_blue"], pattern=dict(shape="/")),
                           hovertemplate="depth %{x}: %{y:.1%} of steps that drafted it<extra></extra>"))
    page_layout(depth, dict(text=f"{prefix}acceptance rate per depth", subtitle=dict(
                     text=f"draft acceptance rate {m['draft_acceptance_rate']:.1%}")), top=ACCEPTANCE_TOP, barmode="group",
                 xaxis=dict(title="tree depth", dtick=1),
                 yaxis=dict(title="steps reaching the depth", range=[0, 1.05], tickformat=".0%"),
                 height=ACCEPTANCE_HEIGHT)
    return AcceptanceFigures(per_step, hist, depth)


# ---------------------------------------------------------------------------------------------- cost of a tree
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


def tree_cost_text(costs: Any, rates: Sequence[Mapping[str, Any]] | None = None, *,
                   paper_budget: int = PAPER_BUDGET, others: Mapping[str, str] | None = None,
                   kernel: str | None = None) -> str:
    """Why this machine picks the trees it picks, from the measured verify curve: verify(33)/verify(1) near 1
    means the verify is memory-bound (as on a GPU) and big trees are almost free; well above 1, compute-bound
    (a few CPU cores) and small trees win. With DART's ``rates()``: what it picks and at what expected rate;
    ``others``: other engines' chosen settings by label (e.g. {"EAGLE-3": "total_token 8, depth 2, top_k 3"});
    ``kernel``: the CPU kernels' path every engine ran (``hardware.gemm_paths()``), named so a figure says what ran."""
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
        text += (f" Every engine here runs the CPU kernels' *{kernel}* path (vanilla included, so their answers stay "
                 "comparable token for token).")
    return text
