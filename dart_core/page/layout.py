"""The page's layout: every component in page order, returned as one :class:`PageComponents`. The parts that
read and write them (handlers.py, render.py, costs.py, trees.py) get that object in their constructors, and
:class:`dart_core.page.visualiser.Visualiser` connects the events.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr

from ..config import dtype_name
from ..ui import viz
from ..ui.record import label_of
from .components import PageComponents
from .controls import EXAMPLES, FRAMES, INTRO, LEGEND, PRESETS, TREE_CHOICES, Controls, knob_slider
from .render import ACCEPTANCE_VIEWS, placeholder, step_placeholders, unavailable_metrics
from .tabs import FRAME_ALL, TAB_TTL_S, TabRegistry, TabState
from .trees import preset_text, tree_note

if TYPE_CHECKING:
    from .engines import EngineFactory

#: The page's linking script (a gr.HTML's js_on_load, so it runs wherever the page is served): hovering a node of
#: a draft tree outlines the answer token it stands for (see link.js; render.Rendering writes what it reads).
LINK_JS = (Path(__file__).parent / "link.js").read_text(encoding="utf-8")
#: The page's own CSS, given to launch() (page/serve.py): a gr.HTML's css_template is scoped to that component, so
#: the linked-token outline must be page-wide to reach the answers. A tree taller than the frame (the paper's
#: trees with pruned candidates) scrolls inside it; its depth axis and legend are drawn at its top
#: (ui/viz_tree.py TALL_TREE_PX).
TREE_FRAME_PX = 960
PAGE_CSS = (".token.dart-linked { outline: 3px solid #E69F00; outline-offset: 1px; }\n"
            ".token.dart-selected { outline: 3px solid #0072B2; outline-offset: 1px; }\n"
            f".tree-frame {{ max-height: {TREE_FRAME_PX}px; overflow-y: auto; }}")


def build_page(target, factory: EngineFactory, tabs: TabRegistry, *, shown: list[str], view_slots: list[str],
               max_new_tokens: int, default_tree: str, banner: str | None = None) -> PageComponents:
    """Every component of the page for ``target`` and ``factory``'s engines, in page order, inside the caller's
    open ``gr.Blocks``. ``shown``: the answer columns; ``view_slots``: the engines with trees to draw;
    ``max_new_tokens``: the slider's top (the serving limits' cap); ``default_tree``: the tree mode it starts in;
    ``tabs``: told when Gradio drops a tab's state."""
    available = factory.names
    # gr.State lists its delete_callback in the page config, which Gradio deep-copies on every page load and
    # /config request. A bound method there would drag its object into each copy (the tab registry and every
    # tab's run; the target's weights took 1-5 s per page on a 2-core CPU, longer than launch()'s 3 s start-up
    # probe waits). copy.deepcopy keeps a plain function as it is, so the callback is one.
    on_state_deleted = tabs.on_state_deleted

    def release_state(tab: Any) -> None:
        on_state_deleted(tab)

    tab = gr.State(TabState, time_to_live=TAB_TTL_S, delete_callback=release_state)
    gr.Markdown(INTRO)
    if banner:
        gr.Markdown(f"⚠ **{banner}**", elem_id="fallback-banner")
    notes = [f"Target: `{target.name}` ({dtype_name(target.dtype)} on {target.device}). "
             f"Engines: {', '.join(label_of(n) for n in available)}."]
    notes += [f"⚠ {why}" for why in factory.unavailable.values()]
    gr.Markdown("  \n".join(notes), elem_id="engine-notes")
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt",
                                placeholder="Ask something, or pick an example…")
            with gr.Row():
                example_btns = [gr.Button(f"{kind} example", size="sm", elem_id=f"example-{kind.lower()}")
                                for kind, _, _ in EXAMPLES]
            guide = gr.Markdown("Pick a guided example (each comes with one question to try), or "
                                "type your own prompt.", elem_id="guide")
        with gr.Column(scale=1, min_width=200):
            run_btn = gr.Button("Run ▶", variant="primary", elem_id="run-btn")
            step_btn = gr.Button("Step once", elem_id="step-btn")
            with gr.Row():
                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                clear_btn = gr.Button("Clear", elem_id="clear-btn")
    with gr.Row(visible=bool(view_slots), equal_height=False):
        preset_btns = {key: gr.Button(label, size="sm", elem_id=f"preset-{key}", scale=0, min_width=200)
                       for key, label in PRESETS.items()}
        preset_note = gr.Markdown(preset_text({}), elem_id="preset-note")
    gr.Markdown("*Fastest on this machine* sizes each tree from what a verify costs here, so on a few CPU "
                "cores the trees stay small. *Paper's trees* show the big pruned trees DART was designed "
                "for, and what they cost on this machine.", elem_id="preset-help")
    with gr.Accordion("Settings", open=False):
        m = max_new_tokens    # --max-new-tokens, capped by the serving limits
        base_p, base_e = factory.base_trees["dart"], factory.base_trees["eagle3"]
        with gr.Row():
            max_new = gr.Slider(1, m, value=min(96, m), step=1, label="Max new tokens")
            # every slider comes from dart_core.presets.KNOBS: the ranges RunSettings checks
            temperature = knob_slider("temperature")
            top_p = knob_slider("top_p")
            top_k = knob_slider("top_k")
        auto = default_tree == "auto"
        with gr.Row(visible=bool(view_slots)):
            tree_mode = gr.Radio(TREE_CHOICES, value=default_tree, label="Tree size",
                                 elem_id="tree-mode", scale=1, min_width=240)
            tree_note_md = gr.Markdown(tree_note(default_tree, factory), elem_id="tree-note")
        with gr.Row(visible="dart" in available):
            budget = knob_slider("budget", base_p, interactive=not auto)
            beam = knob_slider("beam_width", base_p)
            level_k = knob_slider("level_top_k", base_p)
            ngram_w = knob_slider("ngram_weight", base_p)
            context_w = knob_slider("context_weight", base_p)
        with gr.Row(visible="eagle3" in available):
            e_total = knob_slider("eagle3_total_token", base_e, interactive=not auto)
            e_depth = knob_slider("eagle3_depth", base_e, interactive=not auto)
            e_topk = knob_slider("eagle3_top_k", base_e, interactive=not auto)
            e_context_w = knob_slider("eagle3_context_weight", base_e)
    controls = Controls(prompt, max_new, temperature, top_p, top_k, budget, beam, level_k, ngram_w,
                        context_w, e_total, e_depth, e_topk, e_context_w, tree_mode)
    status = gr.Markdown("Pick an example or type a prompt, then **Run** (or **Step once**).", elem_id="status")
    gr.Markdown(LEGEND)
    answer: dict[str, gr.HighlightedText] = {}
    metrics: dict[str, gr.Markdown] = {}
    with gr.Row(equal_height=False):
        for s in shown:
            with gr.Column(min_width=260):
                # one span per token (not combined): a click's index is the answer position
                answer[s] = gr.HighlightedText(
                    label=label_of(s), visible=s in available, color_map=viz.SPAN_COLORS, show_legend=False,
                    show_inline_category=False, combine_adjacent=False, elem_id=f"answer-{s}")
                metrics[s] = gr.Markdown(unavailable_metrics(s) if s in factory.unavailable else "",
                                         elem_id=f"metrics-{s}")

    gr.Markdown("### Step view\nThe engines' steps cover different stretches of text, so the slider picks an "
                "**answer token** (or click a token in any answer); each engine shows the step that produced "
                "it. Hover over a node for its scores and the target's own choice: its token is outlined in "
                "the answer.")
    slider = gr.Slider(0, 1, value=0, step=1, label="Answer token position", elem_id="step-slider")
    with gr.Row(equal_height=True):
        frame = gr.Radio(FRAMES, value=FRAME_ALL, label="The round, stage by stage", elem_id="frame", scale=4)
        next_btn = gr.Button("Next stage ▶", elem_id="next-frame", scale=1, min_width=140)
        show_pruned = gr.Checkbox(False, label="Show pruned candidates (faded, where they would hang)",
                                  elem_id="show-pruned", scale=2)
    gr.HTML("", js_on_load=LINK_JS, elem_id="link-script", container=False, padding=False, apply_default_css=False)
    tree_plot: dict[str, gr.Plot] = {}
    logits_plot: gr.Plot | None = None
    scatter_plot: dict[str, gr.Plot] = {}
    step_text: dict[str, gr.Markdown] = {}
    with gr.Row(equal_height=False):
        for s in view_slots:
            with gr.Column(min_width=420):   # narrower windows stack the engines
                # plots show no Gradio label: the label's badge would cover the figure's own title;
                # each frame says what it will show until there is a step to draw (render.PLACEHOLDERS)
                empty = step_placeholders(s, s in factory.unavailable)
                tree_plot[s] = gr.Plot(empty["tree"], show_label=False, label=f"{label_of(s)}: draft tree",
                                       elem_id=f"tree-{s}", elem_classes=["tree-frame"])
                step_text[s] = gr.Markdown(elem_id=f"narration-{s}")
                scatter_plot[s] = gr.Plot(empty["scores"], show_label=False,
                                          label=f"{label_of(s)}: candidate scores", elem_id=f"scores-{s}")
                if s == "dart":    # DART's levels come from one head forward: its parallel logits
                    logits_plot = gr.Plot(empty["logits"], show_label=False, label="DART: parallel logits",
                                          elem_id="logits-dart")
    gr.Markdown("### Stage timings\nEngine work only (draft forward, tree build, verify, commit). "
                "Acceptance is not speedup: compare tokens per step with the cost of each step.")
    timing_plot = gr.Plot(placeholder("timing"), show_label=False, label="Stage timings", elem_id="timing-plot")
    gr.Markdown("### Cost of a tree\nWhat verifying a tree costs on this machine (measured at start, refined "
                "by every step) and what the automatic chooser expects each DART budget to earn: the "
                "reason *auto* picks the tree sizes it picks. Drawn again after each run.")
    cost_text = gr.Markdown(elem_id="cost-text")
    # the cost and why frames are drawn when the page loads (Visualiser wires demo.load): until then each says what
    # it will show, as every other frame does before a run
    with gr.Row(equal_height=False):
        cost_verify_plot = gr.Plot(placeholder("cost_verify"), show_label=False, label="Verify time by tree size",
                                   elem_id="cost-verify", min_width=420)
        cost_rate_plot = gr.Plot(placeholder("cost_rate"), show_label=False,
                                 label="DART: expected tokens/s by budget", elem_id="cost-rate", min_width=420,
                                 visible="dart" in available)
    gr.Markdown("### Why this speed?\nA step pays when the tokens it gains (τ, set by how often the target "
                "agrees with the head) outweigh what it costs (the verify of the tree and the draft, in units "
                "of one plain step). On a GPU the verify of a few dozen nodes costs about as much as one "
                "token, so big trees pay and the paper reports 2-3×; on a few CPU cores each node costs "
                "compute, so only small trees pay. Move the sliders to ask *what if*.")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=420):
            why_plot = gr.Plot(placeholder("why"), show_label=False,
                               label="Expected speedup by acceptance and verify cost", elem_id="why-plot")
        with gr.Column(scale=2, min_width=260):
            why_text = gr.Markdown(elem_id="why-text")
            why_alpha = gr.Slider(0.0, 0.95, value=0.5, step=0.05, label="What if: acceptance rate per token",
                                  elem_id="why-alpha")
            why_ratio = gr.Slider(1.0, 4.0, value=1.5, step=0.05,
                                  label="What if: verify cost of the tree (× one token)", elem_id="why-ratio")
            why_depth = gr.Slider(1, 8, value=4, step=1, label="What if: draft depth (tokens)", elem_id="why-depth")
    gr.Markdown("### Acceptance")
    acc_plots: dict[str, list[gr.Plot]] = {}
    for s in view_slots:
        with gr.Row():
            acc_plots[s] = [gr.Plot(placeholder("acc", label_of(s), what), show_label=False,
                                    label=f"{label_of(s)}: {what}", elem_id=f"acc-{s}-{i}", min_width=380)
                            for i, what in enumerate(ACCEPTANCE_VIEWS)]
    with gr.Accordion("Export and replay", open=False):
        with gr.Row():
            export_btn = gr.Button("Export traces (JSON)", elem_id="export-btn")
            export_file = gr.File(label="Exported traces", interactive=False, elem_id="export-file")
            replay_file = gr.File(label="Replay an exported trace file", file_types=[".json"], type="filepath",
                                  elem_id="replay-file")
    return PageComponents(
        tab=tab, prompt=prompt, guide=guide, example_btns=example_btns, run_btn=run_btn, step_btn=step_btn,
        stop_btn=stop_btn, clear_btn=clear_btn, preset_btns=preset_btns, preset_note=preset_note,
        tree_note=tree_note_md, controls=controls, status=status, answer=answer, metrics=metrics, slider=slider,
        frame=frame, next_btn=next_btn, show_pruned=show_pruned, tree_plot=tree_plot, step_text=step_text,
        scatter_plot=scatter_plot, logits_plot=logits_plot, timing_plot=timing_plot, cost_text=cost_text,
        cost_verify_plot=cost_verify_plot, cost_rate_plot=cost_rate_plot, why_plot=why_plot, why_text=why_text,
        whatif=(why_alpha, why_ratio, why_depth), acc_plots=acc_plots, export_btn=export_btn,
        export_file=export_file, replay_file=replay_file)
