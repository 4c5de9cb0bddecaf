"""Rendering a RunRecord into the page's components, one path for live runs and replays: the answers and their
metrics, the step view (tree, candidate scores, narration, or one stage of the round), the stage timings and the
acceptance charts. :class:`Rendering` returns ``{component: value}`` updates of the layout's components
(``PageComponents``: ``answer``, ``tree_plot``, ...).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import gradio as gr

from ..engine.trace_stats import step_for_token
from ..ui import teaching_round, viz, viz_steps, viz_tree
from ..ui.narration import narrate_step
from ..ui.record import RunRecord, label_of
from ..ui.viz import md_text
from .controls import FRAME_KEYS
from .tabs import FRAME_ALL, TabState

if TYPE_CHECKING:
    from .components import PageComponents
    from .costs import CostViews


#: What each plot frame will show, said inside it until there is a step to draw (the page's first view, and after
#: Clear), so an empty frame is never a blank box. Lines short enough for the narrowest frame (380 px).
PLACEHOLDERS = {
    "tree": "{label}: the draft tree of the step<br>behind the chosen answer token<br>(kept, accepted and rejected "
            "nodes).<br>Run a prompt or step once.",
    "scores": "{label}: each candidate's scores<br>at that step, kept or pruned.<br>Run a prompt or step once.",
    "logits": "DART's parallel logits: each level's<br>top candidates from the step's one<br>head forward, "
              "before pruning.<br>Run a prompt or step once.",
    "timing": "Stage timings of every step: draft forward,<br>tree build, verify and commit.<br>Run a prompt.",
    "acc": "{label}: {what}.<br>Run a prompt.",
    # the cost and why frames: drawn when the page loads (costs.py), the first time on a server's first load
    "cost_verify": "Verify time by tree size on this machine: loading…",
    "cost_rate": "DART's expected tokens/s by budget: loading…",
    "why": "Expected speedup by acceptance and verify cost: loading…",
}


def placeholder(kind: str, label: str = "", what: str = ""):
    """The empty figure a plot frame starts with: what it will show (PLACEHOLDERS)."""
    return viz.empty_fig(PLACEHOLDERS[kind].format(label=label, what=what))


#: The acceptance frames of each engine, in the page's order (their labels and placeholders).
ACCEPTANCE_VIEWS = ("acceptance length per step", "histogram", "acceptance per depth")


def unavailable_text(slot: str) -> str:
    """What an unavailable engine's step frames and narration say."""
    return f"{label_of(slot)} is unavailable: see the note at the top of the page."


def unavailable_metrics(slot: str) -> str:
    """What an unavailable engine's metrics line says, under its empty answer."""
    return f"⚠ **{label_of(slot)} is unavailable** (see the note at the top of the page for how to add it)."


def step_placeholders(slot: str, unavailable: bool) -> dict:
    """An engine slot's tree, scores and logits frames before it has a step: what each will show, or why the
    engine is unavailable."""
    if unavailable:
        why = viz.empty_fig(unavailable_text(slot))
        return {"tree": why, "scores": why, "logits": why}
    return {"tree": placeholder("tree", label_of(slot)), "scores": placeholder("scores", label_of(slot)),
            "logits": placeholder("logits")}


#: How each stop reason reads after a run's figures (the engine's own endings, then the ones that cut a run short).
_ENDINGS = {"eos": "ended at the end-of-answer token", "max_new_tokens": "reached *Max new tokens*",
            "max_length": "reached the length limit", "stopped": "stopped by **Stop** (partial run)",
            "time limit": "stopped by the time limit (partial run)",
            "memory limit": "stopped by the memory limit (partial run)", "error": "failed"}


def _fmt_metrics(m, name: str, run, baseline: str) -> str:
    if run.error:
        return f"⚠ **{label_of(name)} failed:** {md_text(run.error)}"
    tps = f"**{m.tokens_per_s:.1f} tok/s**" if m.tokens_per_s else "— tok/s"
    tau = f"τ {m.tau:.2f}" if m.tau is not None else "τ —"
    if name == baseline:
        speed = "baseline (1.00×)"
    else:
        speed = f"**{m.speedup:.2f}×** vs baseline" if m.speedup else "speedup —"
    icon = {"identical": "✓", "same so far": "…", "differs": "⚠", "pending": "…"}.get(m.lossless, "–")
    state = "" if not run.done else f" · {_ENDINGS.get(run.stop_reason, f'ended ({run.stop_reason})')}"
    who = f"**{run.label}**: " if run.variant else ""      # which method ran (DART (paper) or DART + context)
    return (f"{who}{tps} · {tau} · {speed} · {m.tokens} tokens in {m.steps} step{'' if m.steps == 1 else 's'}{state}  \n"
            f"{icon} lossless check: {m.lossless_text}")


def _shown_step(run, position: int, latest: bool) -> int | None:
    """Index of the step of ``run`` the step view shows: the one that produced answer token ``position``, or
    with ``latest`` the last one (step-once mode); None when no step did (the prefill's token, or past the end)."""
    return len(run.traces) - 1 if latest else step_for_token(run.traces, position)


class Rendering:
    """The page's rendering (see the module docstring): into ``page``'s answers and metrics (``shown`` slots), step
    views and acceptance charts (``view_slots``); ``unavailable``: engine -> why it cannot run (its frames say so);
    ``costs`` draws the *Why this speed?* panel every full render updates."""

    def __init__(self, page: PageComponents, *, shown: list[str], view_slots: list[str],
                 unavailable: Mapping[str, str], costs: CostViews):
        self.page = page
        self.shown = shown
        self.view_slots = view_slots
        self.unavailable = unavailable
        self.costs = costs

    def render_answers(self, record: RunRecord | None) -> dict:
        out: dict = {}
        metrics = record.metrics() if record is not None else {}
        for s in self.shown:
            if record is None or s not in record.runs:
                out[self.page.answer[s]] = []
                out[self.page.metrics[s]] = unavailable_metrics(s) if s in self.unavailable else ""
                continue
            run = record.runs[s]
            out[self.page.answer[s]] = record.spans(s)
            out[self.page.metrics[s]] = _fmt_metrics(metrics[s], s, run, record.baseline)
        return out

    def render_step_views(self, record: RunRecord | None, position: float | int | None,
                          latest: bool = False, frame: str = FRAME_ALL, show_pruned: bool = False) -> dict:
        """Tree, score scatter and narration per speculative engine for the step that produced answer
        token ``position`` (``latest``: each engine's last step, for step-once mode). ``frame``: the whole step,
        or one stage of the round (FRAMES: drafted, pruned, checked, accepted, committed) with its sentence;
        ``show_pruned``: the tree also draws the candidates the pruner dropped, faded, where they would hang."""
        out: dict = {}
        for s in self.view_slots:
            run = record.runs.get(s) if record is not None else None
            if run is None or not run.traces:
                why = (unavailable_text(s) if s in self.unavailable
                       else "Run a prompt (or step once) to see its steps.")
                empty = step_placeholders(s, s in self.unavailable)
                out[self.page.tree_plot[s]] = empty["tree"]
                out[self.page.scatter_plot[s]] = empty["scores"]
                self._logits(out, s, empty["logits"])
                out[self.page.step_text[s]] = why
                continue
            pos = int(position or 0)
            k = _shown_step(run, pos, latest)
            if k is None:
                if pos == 0:
                    msg = f"Token 0 came from the prefill (the target's first token), before any {run.label} step."
                else:
                    msg = f"{run.label} produced only {len(run.tokens)} tokens; token {pos} is past its answer."
                out[self.page.tree_plot[s]] = viz.empty_fig(msg)
                out[self.page.scatter_plot[s]] = viz.empty_fig(msg)
                self._logits(out, s, viz.empty_fig(msg))
                out[self.page.step_text[s]] = msg
                continue
            st = run.traces[k]
            chosen = run.tree_label(k)   # the automatic tree's setting for this step (None: a fixed tree)
            auto = f" (auto: {chosen})" if chosen else ""
            score_label = "combined score" if s == "dart" else ("cumulative log-prob" if s == "eagle3" else None)
            text = narrate_step(st, record.decode, s).text
            if chosen:
                text = (f"*Tree size (auto): **{chosen}**, the setting with the most expected tokens per second "
                        f"by this machine's costs and the head's acceptance so far.*\n\n{text}")
            if frame in FRAME_KEYS and frame != FRAME_ALL:
                frames = teaching_round.round_frames(st, record.decode, engine=s, score_label=score_label)
                i = next((j for j, f in enumerate(frames) if f.key == frame), 0)
                fig = frames[i].figure
                text = (f"**Stage {i + 1} of {len(frames)}: {frames[i].title}.** {frames[i].sentence}\n\n"
                        f"<details><summary>The whole step in words</summary>\n\n{text}\n</details>")
            else:
                # short lines: a tree column is a third of an 800 px window
                sub = f"{st.accepted_drafts} of {st.tree.num_drafted} drafts accepted + 1 target token"
                fig = viz_tree.tree_figure(st, record.decode, score_label=score_label, show_pruned=show_pruned,
                                           title=dict(text=f"{run.label} step {st.step}",
                                                      subtitle=dict(text=sub + (f"<br>tree{auto}" if chosen else ""))))
            out[self.page.tree_plot[s]] = self._linked(fig, s, record, st)
            out[self.page.scatter_plot[s]] = viz_tree.score_scatter(
                st, record.decode, score_label=score_label, title=f"{run.label} step {st.step}: every scored candidate")
            self._logits(out, s, lambda: viz_tree.parallel_logits(
                st, record.decode, title=f"{run.label} step {st.step}: parallel logits, before pruning"))
            out[self.page.step_text[s]] = text
        return out

    def _logits(self, out: dict, slot: str, fig) -> None:
        """DART's parallel-logits plot (``fig``, or a function that draws it) into ``out`` when ``slot`` is DART's."""
        if slot == "dart" and self.page.logits_plot is not None:
            out[self.page.logits_plot] = fig() if callable(fig) else fig

    def _linked(self, fig, engine: str, record: RunRecord, st) -> Any:
        """Tell the page's hover script (link.js) which answer token each tree node stands for: the figure's
        ``layout.meta`` maps answer positions near this step to the index of their first element in the
        answer box (the box draws a token as one element per non-empty line, none for a bare newline)."""
        spans = record.spans(engine)
        first, elements = {}, 0
        hi = int(st.position) + int(max(st.tree.depths, default=0)) + 2
        for i, (text, _) in enumerate(spans[:hi]):
            n = sum(1 for piece in str(text).split("\n") if piece)
            if i >= int(st.position) - 1 and n:
                first[str(i)] = elements
            elements += n
        fig.update_layout(meta={"engine": engine, "token_elements": first})
        return fig

    def render_timing(self, record: RunRecord | None, marks: dict[str, int] | None = None):
        """The stage-timing chart; ``marks``: engine label -> the step the step view shows (marked)."""
        if record is None or not any(r.traces for r in record.runs.values()):
            return viz.empty_fig("run a prompt to see stage timings")
        return viz_steps.timing_figure({r.label: r.traces for r in record.runs.values() if r.traces},
                                       mark=marks or None)

    def marks(self, record: RunRecord | None, position: float | int | None, latest: bool = False) -> dict[str, int]:
        """Engine label -> the step number the step view shows for answer token ``position``."""
        marks: dict[str, int] = {}
        if record is None:
            return marks
        for s in self.view_slots:
            run = record.runs.get(s)
            if run is None or not run.traces:
                continue
            k = _shown_step(run, int(position or 0), latest)
            if k is not None:
                marks[run.label] = int(run.traces[k].step)
        return marks

    def render_summary(self, record: RunRecord | None, position: int | None = None, latest: bool = False) -> dict:
        out: dict = {}
        if record is None or not any(r.traces for r in record.runs.values()):
            out[self.page.timing_plot] = placeholder("timing")
            for s in self.view_slots:
                    for p, what in zip(self.page.acc_plots[s], ACCEPTANCE_VIEWS):
                        out[p] = placeholder("acc", label_of(s), what)
            out[self.page.slider] = gr.Slider(minimum=0, maximum=1, value=0)
            return out
        out[self.page.timing_plot] = self.render_timing(record, self.marks(record, position, latest))
        for s in self.view_slots:
            run = record.runs.get(s)
            if run is None or not run.traces:
                for p in self.page.acc_plots[s]:
                    out[p] = viz.empty_fig(f"{label_of(s)}: no steps")
                continue
            figs = viz_steps.acceptance_figures(run.traces, name=run.label)
            for p, f in zip(self.page.acc_plots[s], figs):
                out[p] = f
        top = max(record.max_position(), 1)
        out[self.page.slider] = gr.Slider(minimum=0, maximum=top, value=min(self._default_position(record)
                                                                       if position is None else position, top))
        return out

    @staticmethod
    def _default_position(record: RunRecord) -> int:
        """First token of the first speculative engine's longest step: an interesting step to start on."""
        for s in record.speculative:
            tr = record.runs[s].traces
            if tr:
                best = max(tr, key=lambda st: (st.acceptance_length, -st.step))
                return int(best.position)
        return 1

    def render_all(self, record: RunRecord | None, position: int | None = None, latest: bool = False,
                   tab: TabState | None = None) -> dict:
        out = self.render_answers(record)
        pos = position
        if pos is None and record is not None:
            pos = self._default_position(record)
        out.update(self.render_summary(record, pos, latest))
        frame, pruned = (tab.frame, tab.show_pruned) if tab is not None else (FRAME_ALL, False)
        out.update(self.render_step_views(record, pos, latest=latest, frame=frame, show_pruned=pruned))
        out[self.page.frame] = frame
        out[self.page.show_pruned] = pruned
        out.update(self.costs.render_why(record))
        return out
