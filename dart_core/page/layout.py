"""The page's layout: every component in page order, then the events that connect them to the handlers. A mixin
of :class:`dart_core.page.visualiser.Visualiser`: the components it builds become the page's attributes
(``self.prompt``, ``self.answer[engine]``, ...), which the handlers and the rendering read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from ..config import dtype_name
from ..presets import KNOBS
from ..ui import viz
from ..ui.record import label_of
from .controls import (EXAMPLES, FRAMES, INTRO, LEGEND, PRESETS, SIZE_KNOBS, TREE_CHOICES, Controls,
                       knob_slider)
from .render import ACCEPTANCE_VIEWS, placeholder, step_placeholders
from .tabs import FRAME_ALL, TAB_TTL_S, TabState

#: The page's linking script (a gr.HTML's js_on_load, so it runs wherever the page is served): hovering a node of
#: a draft tree outlines the answer token it stands for (see link.js; Rendering._linked writes what it reads).
LINK_JS = (Path(__file__).parent / "link.js").read_text(encoding="utf-8")
#: The page's own CSS, given to launch() (page/serve.py): a gr.HTML's css_template is scoped to that component, so
#: the linked-token outline must be page-wide to reach the answers. A tree taller than the frame (the paper's
#: trees with pruned candidates) scrolls inside it; its depth axis and legend are drawn at its top
#: (ui/viz_tree.py TALL_TREE_PX).
TREE_FRAME_PX = 960
PAGE_CSS = (".token.dart-linked { outline: 3px solid #E69F00; outline-offset: 1px; }\n"
            ".token.dart-selected { outline: 3px solid #0072B2; outline-offset: 1px; }\n"
            f".tree-frame {{ max-height: {TREE_FRAME_PX}px; overflow-y: auto; }}")


class Layout:
    """The page's components and events (see the module docstring)."""

    def _build(self) -> gr.Blocks:
        t = self.target
        # delete_cache: Gradio's copies of exported and uploaded files are deleted once older than
        # limits.file_ttl_s (a tab's own export folder goes when the tab is released)
        with gr.Blocks(title="DART speculative decoding visualiser", analytics_enabled=False,
                       delete_cache=self.limits.gradio_delete_cache()) as demo:
            # gr.State lists its delete_callback in the page config, which Gradio deep-copies on every page load
            # and /config request. A bound method there would drag its object into each copy (the tab registry and
            # every tab's run; this Visualiser's target weights took 1-5 s per page on a 2-core CPU, longer than
            # launch()'s 3 s start-up probe waits). copy.deepcopy keeps a plain function as it is, so the callback
            # is one.
            on_state_deleted = self.tabs.on_state_deleted

            def release_state(tab: Any) -> None:
                on_state_deleted(tab)

            self.tab = gr.State(TabState, time_to_live=TAB_TTL_S, delete_callback=release_state)
            gr.Markdown(INTRO)
            if self.banner:
                gr.Markdown(f"⚠ **{self.banner}**", elem_id="fallback-banner")
            notes = [f"Target: `{t.name}` ({dtype_name(t.dtype)} on {t.device}). "
                     f"Engines: {', '.join(label_of(n) for n in self.available)}."]
            notes += [f"⚠ {why}" for why in self.factory.unavailable.values()]
            gr.Markdown("  \n".join(notes), elem_id="engine-notes")
            with gr.Row():
                with gr.Column(scale=3):
                    self.prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt",
                                             placeholder="Ask something, or pick an example…")
                    with gr.Row():
                        example_btns = [gr.Button(f"{kind} example", size="sm", elem_id=f"example-{kind.lower()}")
                                        for kind, _, _ in EXAMPLES]
                    self.guide = gr.Markdown("Pick a guided example (each comes with one question to try), or "
                                             "type your own prompt.", elem_id="guide")
                with gr.Column(scale=1, min_width=200):
                    run_btn = gr.Button("Run ▶", variant="primary", elem_id="run-btn")
                    step_btn = gr.Button("Step once", elem_id="step-btn")
                    with gr.Row():
                        stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                        clear_btn = gr.Button("Clear", elem_id="clear-btn")
            with gr.Row(visible=bool(self.view_slots), equal_height=False):
                preset_btns = {key: gr.Button(label, size="sm", elem_id=f"preset-{key}", scale=0, min_width=200)
                               for key, label in PRESETS.items()}
                self.preset_note = gr.Markdown(self.preset_text(), elem_id="preset-note")
            gr.Markdown("*Fastest on this machine* sizes each tree from what a verify costs here, so on a few CPU "
                        "cores the trees stay small. *Paper's trees* show the big pruned trees DART was designed "
                        "for, and what they cost on this machine.", elem_id="preset-help")
            with gr.Accordion("Settings", open=False):
                m = self.max_new_tokens    # --max-new-tokens, capped by the serving limits
                base_p, base_e = self.factory.base_trees["dart"], self.factory.base_trees["eagle3"]
                with gr.Row():
                    max_new = gr.Slider(1, m, value=min(96, m), step=1, label="Max new tokens")
                    # every slider comes from dart_core.presets.KNOBS: the ranges RunSettings checks
                    temperature = knob_slider("temperature")
                    top_p = knob_slider("top_p")
                    top_k = knob_slider("top_k")
                auto = self.default_tree == "auto"
                with gr.Row(visible=bool(self.view_slots)):
                    tree_mode = gr.Radio(TREE_CHOICES, value=self.default_tree, label="Tree size",
                                         elem_id="tree-mode", scale=1, min_width=240)
                    self.tree_note = gr.Markdown(self._tree_note(self.default_tree), elem_id="tree-note")
                with gr.Row(visible="dart" in self.available):
                    budget = knob_slider("budget", base_p, interactive=not auto)
                    beam = knob_slider("beam_width", base_p)
                    level_k = knob_slider("level_top_k", base_p)
                    ngram_w = knob_slider("ngram_weight", base_p)
                    context_w = knob_slider("context_weight", base_p)
                with gr.Row(visible="eagle3" in self.available):
                    e_total = knob_slider("eagle3_total_token", base_e, interactive=not auto)
                    e_depth = knob_slider("eagle3_depth", base_e, interactive=not auto)
                    e_topk = knob_slider("eagle3_top_k", base_e, interactive=not auto)
                    e_context_w = knob_slider("eagle3_context_weight", base_e)
            self.controls = Controls(self.prompt, max_new, temperature, top_p, top_k, budget, beam, level_k, ngram_w,
                                     context_w, e_total, e_depth, e_topk, e_context_w, tree_mode)
            self.status = gr.Markdown("Pick an example or type a prompt, then **Run** (or **Step once**).",
                                      elem_id="status")
            gr.Markdown(LEGEND)
            self.answer: dict[str, gr.HighlightedText] = {}
            self.metrics: dict[str, gr.Markdown] = {}
            with gr.Row(equal_height=False):
                for s in self.shown:
                    with gr.Column(min_width=260):
                        # one span per token (not combined): a click's index is the answer position
                        self.answer[s] = gr.HighlightedText(
                            label=label_of(s), visible=s in self.available, color_map=viz.SPAN_COLORS, show_legend=False,
                            show_inline_category=False, combine_adjacent=False, elem_id=f"answer-{s}")
                        self.metrics[s] = gr.Markdown(self._unavailable_text(s) if s in self.factory.unavailable
                                                      else "", elem_id=f"metrics-{s}")

            gr.Markdown("### Step view\nThe engines' steps cover different stretches of text, so the slider picks an "
                        "**answer token** (or click a token in any answer); each engine shows the step that produced "
                        "it. Hover over a node for its scores and the target's own choice: its token is outlined in "
                        "the answer.")
            self.slider = gr.Slider(0, 1, value=0, step=1, label="Answer token position", elem_id="step-slider")
            with gr.Row(equal_height=True):
                self.frame = gr.Radio(FRAMES, value=FRAME_ALL, label="The round, stage by stage", elem_id="frame",
                                      scale=4)
                next_btn = gr.Button("Next stage ▶", elem_id="next-frame", scale=1, min_width=140)
                self.show_pruned = gr.Checkbox(False, label="Show pruned candidates (faded, where they would hang)",
                                               elem_id="show-pruned", scale=2)
            gr.HTML("", js_on_load=LINK_JS, elem_id="link-script", container=False,
                    padding=False, apply_default_css=False)
            self.tree_plot: dict[str, gr.Plot] = {}
            self.logits_plot: gr.Plot | None = None
            self.scatter_plot: dict[str, gr.Plot] = {}
            self.step_text: dict[str, gr.Markdown] = {}
            with gr.Row(equal_height=False):
                for s in self.view_slots:
                    with gr.Column(min_width=420):   # narrower windows stack the engines
                        # plots show no Gradio label: the label's badge would cover the figure's own title;
                        # each frame says what it will show until there is a step to draw (render.PLACEHOLDERS)
                        empty = step_placeholders(s, s in self.factory.unavailable)
                        self.tree_plot[s] = gr.Plot(empty["tree"], show_label=False,
                                                    label=f"{label_of(s)}: draft tree",
                                                    elem_id=f"tree-{s}", elem_classes=["tree-frame"])
                        self.step_text[s] = gr.Markdown(elem_id=f"narration-{s}")
                        self.scatter_plot[s] = gr.Plot(empty["scores"], show_label=False,
                                                       label=f"{label_of(s)}: candidate scores",
                                                       elem_id=f"scores-{s}")
                        if s == "dart":    # DART's levels come from one head forward: its parallel logits
                            self.logits_plot = gr.Plot(empty["logits"], show_label=False,
                                                       label="DART: parallel logits",
                                                       elem_id="logits-dart")
            gr.Markdown("### Stage timings\nEngine work only (draft forward, tree build, verify, commit). "
                        "Acceptance is not speedup: compare tokens per step with the cost of each step.")
            self.timing_plot = gr.Plot(placeholder("timing"), show_label=False, label="Stage timings",
                                       elem_id="timing-plot")
            gr.Markdown("### Cost of a tree\nWhat verifying a tree costs on this machine (measured at start, refined "
                        "by every step) and what the automatic chooser expects each DART budget to earn: the "
                        "reason *auto* picks the tree sizes it picks. Drawn again after each run.")
            self.cost_text = gr.Markdown(elem_id="cost-text")
            with gr.Row(equal_height=False):
                self.cost_verify_plot = gr.Plot(show_label=False, label="Verify time by tree size",
                                                elem_id="cost-verify", min_width=420)
                self.cost_rate_plot = gr.Plot(show_label=False, label="DART: expected tokens/s by budget",
                                              elem_id="cost-rate", min_width=420,
                                              visible="dart" in self.available)
            gr.Markdown("### Why this speed?\nA step pays when the tokens it gains (τ, set by how often the target "
                        "agrees with the head) outweigh what it costs (the verify of the tree and the draft, in units "
                        "of one plain step). On a GPU the verify of a few dozen nodes costs about as much as one "
                        "token, so big trees pay and the paper reports 2-3×; on a few CPU cores each node costs "
                        "compute, so only small trees pay. Move the sliders to ask *what if*.")
            with gr.Row(equal_height=False):
                with gr.Column(scale=3, min_width=420):
                    self.why_plot = gr.Plot(show_label=False, label="Expected speedup by acceptance and verify cost",
                                            elem_id="why-plot")
                with gr.Column(scale=2, min_width=260):
                    self.why_text = gr.Markdown(elem_id="why-text")
                    why_alpha = gr.Slider(0.0, 0.95, value=0.5, step=0.05, label="What if: acceptance rate per token",
                                          elem_id="why-alpha")
                    why_ratio = gr.Slider(1.0, 4.0, value=1.5, step=0.05,
                                          label="What if: verify cost of the tree (× one token)", elem_id="why-ratio")
                    why_depth = gr.Slider(1, 8, value=4, step=1, label="What if: draft depth (tokens)",
                                          elem_id="why-depth")
            gr.Markdown("### Acceptance")
            self.acc_plots: dict[str, list[gr.Plot]] = {}
            for s in self.view_slots:
                with gr.Row():
                    self.acc_plots[s] = [gr.Plot(placeholder("acc", label_of(s), what), show_label=False,
                                                 label=f"{label_of(s)}: {what}",
                                                 elem_id=f"acc-{s}-{i}", min_width=380)
                                         for i, what in enumerate(ACCEPTANCE_VIEWS)]
            with gr.Accordion("Export and replay", open=False):
                with gr.Row():
                    export_btn = gr.Button("Export traces (JSON)", elem_id="export-btn")
                    self.export_file = gr.File(label="Exported traces", interactive=False, elem_id="export-file")
                    replay_file = gr.File(label="Replay an exported trace file", file_types=[".json"],
                                          type="filepath", elem_id="replay-file")

            self._wire(demo, run_btn=run_btn, step_btn=step_btn, stop_btn=stop_btn, clear_btn=clear_btn,
                       next_btn=next_btn, preset_btns=preset_btns, example_btns=example_btns,
                       whatif=(why_alpha, why_ratio, why_depth), export_btn=export_btn, replay_file=replay_file)
        return demo

    def _logits_out(self) -> list:
        """The parallel-logits plot among a handler's outputs (DART's column only)."""
        return [self.logits_plot] if self.logits_plot is not None else []

    def _wire(self, demo: gr.Blocks, *, run_btn: gr.Button, step_btn: gr.Button, stop_btn: gr.Button,
              clear_btn: gr.Button, next_btn: gr.Button, preset_btns: dict[str, gr.Button],
              example_btns: list[gr.Button], whatif: tuple[gr.Slider, ...], export_btn: gr.Button,
              replay_file: gr.File) -> None:
        """Connect the components to the handlers (inside ``demo``'s Blocks context); the buttons and the what-if
        sliders are ``_build``'s locals, the rest the page's attributes."""
        inputs = [self.tab] + self.controls.inputs()
        run_outputs = ([self.tab, self.status, self.slider, self.timing_plot]
                       + list(self.answer.values()) + list(self.metrics.values())
                       + list(self.tree_plot.values()) + list(self.scatter_plot.values()) + self._logits_out()
                       + list(self.step_text.values()) + [p for ps in self.acc_plots.values() for p in ps]
                       + [self.cost_text, self.cost_verify_plot, self.cost_rate_plot, self.preset_note]
                       + [self.frame, self.show_pruned, self.why_plot, self.why_text])
        view_outputs = list(self.tree_plot.values()) + list(self.scatter_plot.values()) + self._logits_out() + list(
            self.step_text.values()) + [self.timing_plot]
        # Runs and step-once share one queue slot: the engines share the target (each run leases its own
        # engines and caches, so the slot bounds the work, not correctness). While waiting, Gradio shows the
        # visitor their place in the queue on the outputs.
        run_evt = run_btn.click(self._run_ui, inputs, run_outputs, api_name="run", concurrency_id="engine",
                                concurrency_limit=1)
        self.prompt.submit(self._run_ui, inputs, run_outputs, api_name=False, concurrency_id="engine",
                           concurrency_limit=1)
        step_btn.click(self._step_ui, inputs, run_outputs, api_name="step_once", concurrency_id="engine",
                       concurrency_limit=1)
        # Stop skips the queue (it would wait behind the run it stops); a run checks between steps whether Stop
        # was pressed after it was queued, so a Stop pressed while it still waits is not lost either.
        stop_btn.click(self.stop, [self.tab], [self.status], api_name="stop", queue=False)
        clear_btn.click(self.clear, [self.tab], run_outputs + [self.prompt, self.export_file], api_name="clear",
                        queue=False)
        self.slider.input(self.show_step, [self.tab, self.slider], view_outputs, api_name="show_step",
                          trigger_mode="always_last", show_progress="hidden")
        self.slider.release(self.show_step, [self.tab, self.slider], view_outputs, api_name=False,
                            trigger_mode="always_last", show_progress="hidden")
        for s in self.shown:   # a click on an answer token selects its step in every engine
            self.answer[s].select(self._select_token_ui, [self.tab], view_outputs + [self.slider],
                                  api_name=False, show_progress="hidden")
        self.frame.input(self.view_changed, [self.tab, self.slider, self.frame, self.show_pruned], view_outputs,
                         api_name=False, show_progress="hidden")
        self.show_pruned.input(self.view_changed, [self.tab, self.slider, self.frame, self.show_pruned],
                               view_outputs, api_name=False, show_progress="hidden")
        next_btn.click(self.next_frame, [self.tab, self.slider, self.frame], view_outputs + [self.frame],
                       api_name=False, show_progress="hidden")
        preset_outputs = ([self.controls.tree, self.tree_note, self.preset_note]
                          + [getattr(self.controls, n) for n in KNOBS if KNOBS[n].engine])
        for key, btn in preset_btns.items():
            btn.click(lambda key=key: self.apply_preset(key), None, preset_outputs, api_name=False,
                      queue=False, show_progress="hidden")
        for (kind, prompt, question), btn in zip(EXAMPLES, example_btns):
            btn.click(lambda prompt=prompt, kind=kind, question=question:
                      {self.prompt: prompt, self.guide: f"**{kind} example. Try this:** {question}"},
                      None, [self.prompt, self.guide], api_name=False, queue=False, show_progress="hidden")
        for w in whatif:
            w.release(self.whatif_changed, [self.tab, *whatif],
                      [self.why_plot, self.why_text], api_name=False, show_progress="hidden")
        export_btn.click(self.export, [self.tab], [self.export_file, self.status], api_name="export")
        replay_file.upload(self._replay_ui, [self.tab, replay_file], run_outputs, api_name="replay")
        self.controls.tree.change(self.tree_mode_changed, [self.controls.tree],
                                  [self.tree_note] + [getattr(self.controls, n) for n in SIZE_KNOBS],
                                  api_name=False, queue=False, show_progress="hidden")
        demo.load(self.cost_view, None, [self.cost_text, self.cost_verify_plot, self.cost_rate_plot,
                                         self.preset_note], api_name=False, show_progress="hidden")
        demo.load(lambda: self.render_why(None), None, [self.why_plot, self.why_text], api_name=False,
                  show_progress="hidden")
        demo.unload(self._on_unload)
        self.run_event = run_evt

    def _on_unload(self, request: gr.Request) -> None:
        """The tab closed: release its state now. Gradio passes the request (which names the tab's session) to
        a handler whose parameter is annotated ``gr.Request``, hence this method over TabRegistry.on_unload."""
        self.tabs.on_unload(request)
