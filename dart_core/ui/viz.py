"""The figures' shared style: the Okabe-Ito palette (colour-blind safe), node states and stage colours, token
labels for nodes and tooltips, and the one page layout every figure uses. The figures themselves are drawn by
``viz_tree`` (draft tree, candidate scores), ``viz_steps`` (stage timings, acceptance), ``viz_cost`` (the cost
of a tree), ``teaching_round`` (one round in five frames) and ``teaching_whatif`` (the expected-speedup map).

Every figure function is pure: it reads traces (a :class:`~dart_core.engine.trace.StepTrace`, its ``to_dict()``
form, or its JSON text) and returns figures. The analytics they draw (acceptance statistics, token origins,
node states) live in dart_core.engine.trace_stats; the answer's highlighted spans in dart_core.ui.record. Live
runs and replays render through the same code.

Node states and colours (Okabe-Ito), each with a second cue (marker symbol):
accepted = blue circle, verified but rejected = orange diamond, pruned = grey triangle,
bonus (the target's own token) = purple star, root = black square.
"""
from __future__ import annotations

import html
import re
from typing import Any, Callable, Mapping, Union

import numpy as np
import plotly.graph_objects as go

from ..engine.trace_stats import ACCEPTED_LABEL, BONUS_LABEL, PREFILL_LABEL

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
def as_decoder(tokenizer: Decoder) -> Callable[[list[int]], str] | None:
    """Token labels keep special tokens' names (e.g. <|im_end|>)."""
    if tokenizer is None:
        return None
    if hasattr(tokenizer, "decode"):
        return lambda ids: tokenizer.decode(list(ids))
    if callable(tokenizer):
        return lambda ids: tokenizer(list(ids))
    raise TypeError(f"tokenizer must be None, a callable list[int] -> str, or have .decode(); "
                    f"got {type(tokenizer).__name__}")


def token_label(tok: int, decode: Callable[[list[int]], str] | None, limit: int = 12) -> str:
    """Short, visible form of one token for a node label (whitespace made visible)."""
    if decode is None:
        return f"#{tok}"
    text = decode([int(tok)])
    text = text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
    if not text:
        return f"#{tok}"
    text = text if len(text) <= limit else text[: limit - 1] + "\u2026"
    return html.escape(text, quote=False)  # plotly reads labels as pseudo-HTML: "<|im_end|>" would vanish


#: What can make structure mid-line in Markdown: code spans, emphasis, links and images, strike-through, table
#: cells, a backslash (intraword underscores, dots and parentheses cannot, and stay readable in tests and logs).
_MD_SPECIAL = re.compile(r"([\\`*\[\]~|])")


def md_text(text: Any, limit: int | None = None) -> str:
    """``text`` as literal Markdown text (a replayed file's strings, an error message): HTML escaped, Markdown's
    punctuation backslash-escaped, line breaks as spaces; at most ``limit`` characters of it."""
    text = str(text)
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 0)] + "\u2026"
    text = html.escape(text.replace("\r", " ").replace("\n", " "), quote=False)
    return _MD_SPECIAL.sub(r"\\\1", text)


def token_hover(tok: int, decode: Callable[[list[int]], str] | None) -> str:
    if decode is None:
        return f"#{tok}"
    # repr keeps leading spaces and newlines visible in the tooltip
    return html.escape(f"{decode([int(tok)])!r} (#{tok})", quote=False)


def as_floats(x: Any) -> list[float]:
    return [float(v) for v in np.asarray(x, dtype=np.float64).reshape(-1)]


def as_ints(x: Any) -> list[int]:
    return [int(v) for v in np.asarray(x, dtype=np.int64).reshape(-1)]


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


#: Titles of the teaching panels are cut to this many characters so they never run into the legend or each other
#: at 640 px.
TITLE_CHARS = 58


def short_title(text: str) -> str:
    return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "\u2026"


def panel_layout(fig: go.Figure, title: str, *, height: int, xaxis: dict | None = None, yaxis: dict | None = None,
           legend_rows: int = 1) -> go.Figure:
    """viz's page layout (title at the container's top, legend under the x-axis title), ``height`` px of plot
    plus room for ``legend_rows`` legend rows."""
    layout: dict = dict(height=int(height + 60 + 26 * max(legend_rows, 1)), hovermode="closest")
    if xaxis is not None:
        layout["xaxis"] = xaxis
    if yaxis is not None:
        layout["yaxis"] = yaxis
    return page_layout(fig, short_title(title), left=40, **layout)


def empty_fig(message: str) -> go.Figure:
    """A blank figure that says ``message`` (what the page shows before there is anything to draw)."""
    fig = go.Figure()
    fig.add_annotation(text=message, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font=dict(color="#555555"))
    fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False), height=220, plot_bgcolor="#FFFFFF",
                      margin=dict(l=20, r=20, t=30, b=20))
    return fig
