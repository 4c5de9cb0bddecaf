"""The page's components by name (:class:`PageComponents`), which ``layout.build_page`` creates and every part of the
page (trees, costs, render, handlers, the Visualiser) is given: kept apart from the layout so that the parts need
not import the module that builds them."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from .controls import Controls


@dataclass
class PageComponents:
    """The page's components by name: what the handlers read and every output they update, and the buttons the
    Visualiser wires. Per-engine components are dicts by engine slot, in page order."""

    tab: gr.State                           # the tab's TabState
    prompt: gr.Textbox
    guide: gr.Markdown                      # the guided example's question
    example_btns: list[gr.Button]           # in EXAMPLES order
    run_btn: gr.Button
    step_btn: gr.Button
    stop_btn: gr.Button
    clear_btn: gr.Button
    preset_btns: dict[str, gr.Button]       # by PRESETS key
    preset_note: gr.Markdown
    tree_note: gr.Markdown
    controls: Controls                      # the settings: the run's inputs after the tab
    status: gr.Markdown
    answer: dict[str, gr.HighlightedText]   # by shown slot
    metrics: dict[str, gr.Markdown]         # by shown slot
    slider: gr.Slider                       # the answer token the step view shows
    frame: gr.Radio                         # the whole step or one stage of the round
    next_btn: gr.Button
    show_pruned: gr.Checkbox
    tree_plot: dict[str, gr.Plot]           # by view slot (engines with trees)
    step_text: dict[str, gr.Markdown]
    scatter_plot: dict[str, gr.Plot]
    logits_plot: gr.Plot | None             # DART's column only
    timing_plot: gr.Plot
    cost_text: gr.Markdown
    cost_verify_plot: gr.Plot
    cost_rate_plot: gr.Plot
    why_plot: gr.Plot
    why_text: gr.Markdown
    whatif: tuple[gr.Slider, gr.Slider, gr.Slider]   # acceptance, verify cost, depth
    acc_plots: dict[str, list[gr.Plot]]     # by view slot, in ACCEPTANCE_VIEWS order
    export_btn: gr.Button
    export_file: gr.File
    replay_file: gr.File

    def logits_out(self) -> list:
        """The parallel-logits plot among a handler's outputs (DART's column only)."""
        return [self.logits_plot] if self.logits_plot is not None else []

    def step_outputs(self) -> list:
        """What the step view's events update: each engine's tree, scores, logits and narration, the timings."""
        return (list(self.tree_plot.values()) + list(self.scatter_plot.values()) + self.logits_out()
                + list(self.step_text.values()) + [self.timing_plot])

    def run_outputs(self) -> list:
        """What a run, a step, a replay and Clear update: everything a record draws."""
        return ([self.tab, self.status, self.slider, self.timing_plot]
                + list(self.answer.values()) + list(self.metrics.values())
                + list(self.tree_plot.values()) + list(self.scatter_plot.values()) + self.logits_out()
                + list(self.step_text.values()) + [p for ps in self.acc_plots.values() for p in ps]
                + [self.cost_text, self.cost_verify_plot, self.cost_rate_plot, self.preset_note]
                + [self.frame, self.show_pruned, self.why_plot, self.why_text])
