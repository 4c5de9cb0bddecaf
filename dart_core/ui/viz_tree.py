"""The draft tree of one step and the scores of every candidate its drafter weighed (plotly).

    fig = tree_figure(trace, tokenizer)                  # one step's pruned draft tree
    fig = score_scatter(trace)                           # N-gram term vs logit term of every candidate
    node_details(trace, 3, tokenizer)                    # what the trace knows about node 3 (its tooltip)

Colours, symbols and the page layout come from :mod:`dart_core.ui.viz`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ..engine.trace import StepTrace, source_label
from ..engine.trace_stats import (SCATTER_GROUPS, TraceLike, as_step, candidate_groups, candidate_nodes,
                                  node_states)
from .viz import (NODE_STATES, OKABE_ITO, PRUNED_OPACITY, SCORE_COLORSCALE, Decoder, as_decoder, as_floats,
                  as_ints, page_layout, token_hover, token_label)


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "\u2014"
    return f"{v:.{digits}f}" if math.isfinite(v) else str(v)


# ---------------------------------------------------------------------------------------------- layout
def tree_layout(parents: Sequence[int], scores: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Node-link layout of a rooted tree (or forest): x = depth, y = row, 0 at the top.

    Leaves take consecutive rows in the order of a depth-first walk that visits children
    best score first (ties: lower index first); a parent sits midway between its first and
    last child. Nodes at one depth are therefore at least one row apart.
    ``parents[i]`` is the parent's index, -1 for a root. Returns float arrays (x, y).
    """
    par = as_ints(parents)
    n = len(par)
    sc = [0.0] * n if scores is None else as_floats(scores)
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
    return st.candidates is not None and any(v != 0.0 for v in as_floats(st.candidates.ngram_term))


def score_name_of(st: StepTrace, score_label: str | None) -> str:
    if score_label:
        return score_label
    return "combined score" if _has_ngram(st) else "score"


def _optional_candidate_field(c: Any, *names: str) -> list[float] | None:
    # Fields some drafters may add later (e.g. a draft probability); shown only when present.
    for name in names:
        v = getattr(c, name, None)
        if v is not None and len(v):
            return as_floats(v)
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
        self.score_name = score_name_of(st, score_label)
        self.cand_of_node: dict[int, int] = {}
        c = st.candidates
        if c is not None:
            for ci, nd in enumerate(candidate_nodes(st)):
                if nd > 0:
                    self.cand_of_node.setdefault(nd, ci)
            self.logit, self.ngram = as_floats(c.logit_term), as_floats(c.ngram_term)
            self.draft_prob = _optional_candidate_field(c, "draft_prob", "draft_probability")
            self.cum_logprob = _optional_candidate_field(c, "cum_logprob", "cumulative_logprob")
            # Ranks by score, best first (ties: lower candidate index first): among all candidates and among
            # the candidates of the same parent (the root's children share parent -1).
            score, cpar = as_floats(c.score), as_ints(c.parent)
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
            "source": None,
        }
        ci = self.cand_of_node.get(node)
        if ci is not None:
            d["candidate"], d["rank"], d["candidates"] = ci, self.rank[ci], len(self.rank)
            d["sibling_rank"], d["siblings"] = self.sibling_rank[ci], self.siblings[ci]
            d["logit_term"] = self.logit[ci]
            d["ngram_term"] = self.ngram[ci] if self.has_ngram else None
            d["draft_prob"] = None if self.draft_prob is None else self.draft_prob[ci]
            d["cum_logprob"] = None if self.cum_logprob is None else self.cum_logprob[ci]
            d["source"] = candidate_source(st.candidates, ci)
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
    return _StepView(as_step(step), score_label).details(node, as_decoder(tokenizer))


def candidate_source(cands, i: int) -> str | None:
    """Where candidate ``i`` came from ("head", "context", "corpus" or "several": engine.trace.source_label), or
    None when the drafter recorded no sources."""
    source = getattr(cands, "source", None) if cands is not None else None
    if source is None or len(source) == 0:
        return None
    return source_label(int(cands.source[i]))


# The optional per-node figures of a hover, in the order shown (absent ones are skipped).
_HOVER_TERMS = (("logit_term", "logit term"), ("ngram_term", "N-gram term"), ("draft_prob", "draft probability"),
                ("cum_logprob", "cumulative log-prob"), ("target_prob", "target probability"))


def _node_hover(d: dict[str, Any], decode) -> str:
    lines = [f"<b>{token_hover(d['token'], decode)}</b>  node {d['node']}, depth {d['depth']}",
             f"state: {NODE_STATES[d['state']][0]}"]
    if d["state"] != "root":
        lines.append(f"{d['score_name']}: {_fmt(d['score'])}")
        if d["rank"] is not None:
            lines += _rank_lines(d["rank"], d["candidates"], d["sibling_rank"], d["siblings"], d["score_name"])
        lines += [f"{label}: {_fmt(d[key])}" for key, label in _HOVER_TERMS if d[key] is not None]
        if d.get("source") is not None:
            lines.append(f"from: {d['source']}")
        if d["target_choice"] is not None:
            same = " (this token)" if d["matches_target"] else ""
            lines.append(f"target's own choice here: {token_hover(d['target_choice'], decode)}{same}")
    if d["bonus_token"] is not None:
        lines.append(f"target's next token (bonus): {token_hover(d['bonus_token'], decode)}")
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


#: Pruned candidates drawn at most in one tree: the paper's 60-node trees would otherwise add up to 300 rows
#: (a figure ~8,000 px tall). The accepted path's pruned siblings come first, then the best-scored others.
MAX_PRUNED_SHOWN = 24
#: Pixels per sibling row: a label above a node (chains) fits between two rows.
ROW_PX = 28
#: A tree figure taller than this puts its depth axis and legend at the top, where the page's scroll frame
#: (dart_core/page/layout.py TREE_FRAME_CSS) shows them first.
TALL_TREE_PX = 900
#: Top margin of a tall tree: the title (TITLE_ROOM_PX), up to three rows of legend, the depth axis's ticks and
#: title.
TITLE_ROOM_PX = 44
SUBTITLE_PX = 24
TALL_TOP_PX = 200


def tree_figure(step: TraceLike, tokenizer: Decoder = None, *, show_pruned: bool = False,
                max_pruned_per_node: int = 5, max_pruned: int = MAX_PRUNED_SHOWN, score_label: str | None = None,
                title: str | Mapping[str, Any] | None = None) -> go.Figure:
    """The verified draft tree of one step, x = depth, best siblings on top. ``title``: its text, or a plotly
    title dict (e.g. with a ``subtitle``).

    Node fill = the drafter's score (colour bar); border colour and marker symbol = state.
    The accepted path is drawn thick blue, ending in the target's bonus token (purple star).
    ``show_pruned`` adds up to ``max_pruned_per_node`` best pruned candidates under each tree
    node (faded, grey labels, at their own depth), ``max_pruned`` in all (the accepted path's first). ``tokenizer``: None (token ids), a callable ids -> text,
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
    decode = as_decoder(tokenizer)
    tree = st.tree
    n = len(tree)
    states = node_states(st)
    parents = as_ints(tree.parents)
    rank_scores = as_floats(tree.scores)
    accepted = [int(a) for a in st.accepted_nodes]

    # Extra nodes for the layout: the bonus token, then (optionally) pruned candidates.
    last = accepted[-1]
    bonus_idx = n
    parents.append(last)
    rank_scores.append(math.inf)  # the bonus sits on top of its rejected siblings
    pruned: list[int] = []
    pruned_offered = 0
    if show_pruned and st.candidates is not None and max_pruned_per_node > 0:
        c = st.candidates
        cn = candidate_nodes(st)
        cpar, ckept, cscore = as_ints(c.parent), [bool(k) for k in c.kept], as_floats(c.score)
        by_parent: dict[int, list[int]] = {}
        for ci in range(len(cn)):
            if ckept[ci] and cn[ci] >= 0:
                continue
            pnode = 0 if cpar[ci] < 0 else cn[cpar[ci]]
            if pnode >= 0:  # only pruned children of nodes that are drawn
                by_parent.setdefault(pnode, []).append(ci)
        on_path_nodes = set(accepted)
        offered = [(pnode, ci) for pnode in sorted(by_parent)
                   for ci in sorted(by_parent[pnode], key=lambda j: (-cscore[j], j))[:max_pruned_per_node]]
        offered.sort(key=lambda pc: (pc[0] not in on_path_nodes, -cscore[pc[1]], pc[1]))
        pruned_offered = len(offered)
        for pnode, ci in sorted(offered[:max(max_pruned, 0)], key=lambda pc: (pc[0], -cscore[pc[1]], pc[1])):
            pruned.append(ci)
            parents.append(pnode)
            rank_scores.append(cscore[ci])
    xs, ys = tree_layout(parents, rank_scores)

    score_name = score_name_of(st, score_label)
    drafted_scores = as_floats(tree.scores[1:])
    if pruned:
        all_scores = as_floats(st.candidates.score)
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

    # A label right of a node would sit on the edge to a child drawn on the same row (every link of a chain):
    # such a node's label goes above it.
    same_row_child = {parents[i] for i in range(1, len(parents)) if parents[i] >= 0 and ys[i] == ys[parents[i]]}

    def label_position(i: int) -> str:
        return "top center" if i in same_row_child else "middle right"

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
            text=[token_label(int(tree.tokens[i]), decode) for i in idx],
            textposition=[label_position(i) for i in idx],
            textfont=dict(size=11), hovertext=[_node_hover(d, decode) for d in details], hoverinfo="text",
            customdata=[["node", i, d["answer_position"]] for i, d in zip(idx, details)]))

    if pruned:
        c = st.candidates
        ctok, cdepth, cscore = as_ints(c.token), as_ints(c.depth), as_floats(c.score)
        clogit, cng = as_floats(c.logit_term), as_floats(c.ngram_term)
        has_ng = _has_ngram(st)
        hovers = []
        for ci in pruned:
            lines = [f"<b>{token_hover(ctok[ci], decode)}</b>  candidate {ci}, depth {cdepth[ci]}",
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
            text=[token_label(ctok[ci], decode) for ci in pruned],
            textposition=[label_position(n + 1 + k) for k in range(len(pruned))],
            textfont=dict(size=9, color=OKABE_ITO["grey"]), hovertext=hovers, hoverinfo="text",
            customdata=[["candidate", ci, view.answer_position("pruned", cdepth[ci])] for ci in pruned]))
        coloraxis_used = True

    # The bonus token: the target's own choice where the accepted path stopped.
    emitted_bonus = len(st.emitted_tokens) > st.accepted_drafts
    how = "its argmax" if st.mode == "greedy" else "sampled from what the rejections left"
    bonus_hover = "<br>".join([
        f"<b>{token_hover(int(st.bonus_token), decode)}</b>  bonus token, depth {int(tree.depths[last]) + 1}",
        f"the target's own next token after node {last} ({how})",
        "emitted" if emitted_bonus else "not emitted: generation stopped before it"])
    label, color, symbol = NODE_STATES["bonus"]
    fig.add_trace(go.Scatter(
        x=[float(xs[bonus_idx])], y=[float(ys[bonus_idx])], mode="markers+text", name=label,
        legendgroup="bonus", showlegend=False,
        marker=dict(color=color, symbol=symbol, size=20, line=dict(color="#000000", width=1.5)),
        text=[f"<b>{token_label(int(st.bonus_token), decode)}</b>"], textposition="middle right",
        textfont=dict(size=13, color=color), hovertext=[bonus_hover], hoverinfo="text",
        customdata=[["bonus", -1, view.answer_position("bonus", int(tree.depths[last]) + 1)]]))

    # Legend entries: one per state, coloured by state (the plotted fill is the score).
    for state in ("root", "accepted", "rejected") + (("pruned",) if pruned else ()) + ("bonus",):
        fig.add_trace(_legend_proxy(state))
    if len(pruned) < pruned_offered:
        fig.data[-2].name += f" (best {len(pruned)} of {pruned_offered} shown)"

    max_x = int(max(xs)) if len(xs) else 1
    rows = float(max(ys)) + 1 if len(ys) else 1
    # Height: the rows, plus the title and (under the plot) the legend, up to five rows of entries when narrow.
    height = int(max(440, 260 + ROW_PX * rows))
    tall = height > TALL_TREE_PX
    page_layout(
        fig, title or (f"Step {st.step}: {st.accepted_drafts} of {tree.num_drafted} drafted tokens accepted "
                       f"+ 1 from the target ({st.mode})"),
        left=50, xaxis=dict(title="depth after the root", tickmode="linear", tick0=0, dtick=1,
                            range=[-0.4, max_x + 0.9], zeroline=False, side="top" if tall else "bottom"),
        yaxis=dict(title="siblings, best on top", autorange="reversed", showticklabels=False,
                   zeroline=False, showgrid=False),
        height=height, hovermode="closest")
    if tall:
        # Seen through the page's scroll frame: the depth axis and the legend at the top, under the title.
        title_px = TITLE_ROOM_PX + (SUBTITLE_PX if isinstance(title, Mapping) and title.get("subtitle") else 0)
        fig.update_layout(legend=dict(yref="container", y=1 - title_px / height, yanchor="top"),
                          margin=dict(t=TALL_TOP_PX + title_px - TITLE_ROOM_PX))
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
    decode = as_decoder(tokenizer)
    fig = go.Figure()
    groups = candidate_groups(st)
    style = {"pruned": ("pruned (never verified)", "pruned", 7, 0.45),
             "kept": ("kept (verified, not accepted)", "rejected", 9, 0.85),
             "accepted": ("accepted by the target", "accepted", 13, 1.0)}
    score_name = score_name_of(st, score_label)
    ng_on = _has_ngram(st)
    c = st.candidates
    if c is not None:
        tok, depth, score = as_ints(c.token), as_ints(c.depth), as_floats(c.score)
        logit, ng = as_floats(c.logit_term), as_floats(c.ngram_term)
    for g in SCATTER_GROUPS:
        label, state, size, opacity = style[g]
        _, color, symbol = NODE_STATES[state]
        idx = [i for i, gi in enumerate(groups) if gi == g]
        hovers = [f"<b>{token_hover(tok[i], decode)}</b>  candidate {i}, depth {depth[i]}<br>"
                  f"logit term: {_fmt(logit[i])}<br>N-gram term: {_fmt(ng[i])}<br>{score_name}: {_fmt(score[i])}"
                  + (f"<br>from: {candidate_source(c, i)}" if candidate_source(c, i) else "")
                  # DART's pruner gives the root's children no N-gram term (the paper's rule): they all sit at 0
                  + ("<br>(depth 1: no N-gram term, by DART's rule)" if depth[i] == 1 and ng_on else "")
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


#: Ranks of each level the parallel-logits view shows (the paper's level top-k is 25: too many to read).
PARALLEL_RANKS = 10


def parallel_logits(step: TraceLike, tokenizer: Decoder = None, *, title: str | None = None,
                    ranks: int = PARALLEL_RANKS) -> go.Figure:
    """DART's parallel logits: the step's one head forward gives a row of logits per tree level at once (level 1
    from the last committed position, level l from its mask slot l-1); each row's best tokens, before pruning.
    Colour = probability relative to the row's best token (exp(logit - best)); outlined: the tokens the tree kept
    at that level (orange) and the accepted ones (blue); a cross: the target's own token where the accepted path
    ended, when the head had it in its top ranks."""
    st = as_step(step)
    decode = as_decoder(tokenizer)
    rows = st.head_rows
    fig = go.Figure()
    if rows is None or not len(rows["token"]):
        fig.add_annotation(text="no head forward in this step<br>(a plain step, a drafter without levels, or the "
                                "context drafting alone)", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False, font=dict(color="#555555"))
        return page_layout(fig, title or f"Step {st.step}: parallel logits", height=240)
    tokens = np.asarray(rows["token"], dtype=np.int64)
    logits = np.asarray(rows["logit"], dtype=np.float64)
    levels, k = tokens.shape
    shown = min(int(ranks), k)
    rel = np.exp(logits[:, :shown] - logits.max(axis=1, keepdims=True))
    tree_tokens, depths = as_ints(st.tree.tokens), as_ints(st.tree.depths)
    in_tree = {(int(d), int(t)) for t, d in zip(tree_tokens[1:], depths[1:])}
    path = [int(tree_tokens[n]) for n in st.accepted_nodes]          # path[l]: the accepted token at depth l
    target_depth = len(path)                                          # where the target's own token went
    text, hover = [], []
    marks: dict[str, tuple[list[int], list[int]]] = {"kept": ([], []), "accepted": ([], []), "target": ([], [])}
    for lv in range(levels):
        depth = lv + 1
        text.append([token_label(int(t), decode, limit=8) for t in tokens[lv, :shown]])
        row_hover = []
        for r in range(shown):
            t = int(tokens[lv, r])
            kept, accepted = (depth, t) in in_tree, depth < len(path) and path[depth] == t
            target = depth == target_depth and t == int(st.bonus_token)
            state = ("accepted by the target" if accepted else "kept in the tree (verified)" if kept
                     else "not in the tree (pruned, or past the budget)")
            if target:
                state += "<br>the target's own token here: the path ended one level above it"
            row_hover.append(f"<b>{token_hover(t, decode)}</b><br>level {depth}, rank {r + 1} of {k}<br>"
                             f"logit {logits[lv, r]:.2f} ({rel[lv, r]:.2f} of the level's best)<br>{state}")
            for key, on in (("kept", kept and not accepted), ("accepted", accepted), ("target", target)):
                if on:
                    marks[key][0].append(r + 1)
                    marks[key][1].append(depth)
        hover.append(row_hover)
    fig.add_trace(go.Heatmap(
        z=rel, x=list(range(1, shown + 1)), y=list(range(1, levels + 1)), text=text, texttemplate="%{text}",
        hovertext=hover, hoverinfo="text", colorscale="Blues", zmin=0.0, zmax=1.0, showscale=False, xgap=2, ygap=2,
        name="head's top tokens"))
    style = {"kept": ("kept in the tree", NODE_STATES["rejected"][1], "square-open", 3),
             "accepted": ("accepted by the target", NODE_STATES["accepted"][1], "square-open", 4),
             "target": ("the target's own token", OKABE_ITO["vermillion"], "x-thin-open", 3)}
    for key, (label, color, symbol, width) in style.items():
        xs, ys = marks[key]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=f"{label} ({len(xs)})", hoverinfo="skip",
                                 marker=dict(symbol=symbol, size=30 if key != "target" else 14, color=color,
                                             line=dict(color=color, width=width))))
    page_layout(fig, title or f"Step {st.step}: parallel logits (one head forward, before pruning)",
                xaxis=dict(title=f"rank in its level (top {shown} of {k})", dtick=1),
                yaxis=dict(title="tree level", dtick=1, autorange="reversed"),
                height=150 + 44 * levels, hovermode="closest")
    return fig
