"""The page for one loaded target: :class:`Visualiser` builds the layout (layout.py: one ``PageComponents``), then
the parts that use it, each told what it needs in its constructor: the tree controls (trees.py), the cost and
why-this-speed views (costs.py), the rendering (render.py) and the event handlers (handlers.py), over the engine
pool (engines.py) and the tabs' state (tabs.py); and it connects the components' events to them. The handlers
are plain methods, so tests call them directly (``vis.run``, ``vis.handlers.run``: the same method).

    vis = Visualiser(target, args)         # args: app.py's flags
    serve(vis.queued(), args)              # dart_core.page.serve
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import fields

import gradio as gr

from .. import space
from ..models.templates import get_template
from ..presets import KNOBS
from ..ui.serving import ServingLimits, serving_limits
from .components import PageComponents
from .controls import EXAMPLES, SIZE_KNOBS, SLOTS, SPEC_SLOTS
from .costs import CostViews
from .engines import EngineFactory
from .handlers import Handlers
from .layout import build_page
from .render import Rendering
from .tabs import TabRegistry
from .trees import TreeControls

logger = logging.getLogger("dart_app")


class Visualiser:
    """Builds the Blocks page for one loaded target and its engines, and holds its parts: ``components`` (the
    layout's), ``trees``, ``costs``, ``rendering`` and ``handlers``. The names app.py and the tests use are also
    read-only attributes of the page (``FORWARDED``: ``vis.status`` is ``vis.components.status``)."""

    def __init__(self, target, args: argparse.Namespace, factory: EngineFactory | None = None,
                 banner: str | None = None, limits: ServingLimits | None = None):
        self.target = target
        self.args = args
        self.banner = banner     # shown atop the page (e.g. why a Space without a GPU runs the CPU models)
        # what one visitor may cost this server (dart_core.ui.serving): hosted (Space, --listen, --share) or local
        limits = limits or serving_limits(listen=getattr(args, "listen", False), share=getattr(args, "share", False))
        self.max_new_tokens = limits.cap_new_tokens(args.max_new_tokens)
        if self.max_new_tokens < args.max_new_tokens:
            logger.warning("--max-new-tokens %d is capped at %d on a %s server (max_new_tokens, dart_core/ui/serving.py)",
                           args.max_new_tokens, self.max_new_tokens, limits.name)
        self.factory = factory or EngineFactory.from_flags(
            target, base_model_name_or_path=args.base_model_name_or_path,
            dart_model_name_or_path=args.dart_model_name_or_path,
            ngram_model_name_or_path=args.ngram_model_name_or_path, is_small_ngram=args.is_small_ngram,
            eagle3_model_name_or_path=args.eagle3_model_name_or_path, compare_eagle3=args.compare_eagle3)
        self.template = get_template(args.template_name or target.template_name)
        self.available = self.factory.names
        self.shown = [s for s in SLOTS if s in self.available or s in self.factory.unavailable]
        self.view_slots = [s for s in SPEC_SLOTS if s in self.available]   # engines with trees to draw
        self.default_tree = getattr(args, "tree", None) or "auto"   # --tree: the page's default tree mode
        self.tabs = TabRegistry()                # the tabs' state and its memory budget
        # delete_cache: Gradio's copies of exported and uploaded files are deleted once older than
        # limits.file_ttl_s (a tab's own export folder goes when the tab is released)
        with gr.Blocks(title="DART speculative decoding visualiser", analytics_enabled=False,
                       delete_cache=limits.gradio_delete_cache()) as demo:
            page = self.components = build_page(
                target, self.factory, self.tabs, shown=self.shown, view_slots=self.view_slots,
                max_new_tokens=self.max_new_tokens, default_tree=self.default_tree, banner=banner)
            self.trees = TreeControls(page, self.factory, self.default_tree)
            self.costs = CostViews(page, self.factory, self.view_slots, self.trees)
            self.rendering = Rendering(page, shown=self.shown, view_slots=self.view_slots,
                                       unavailable=self.factory.unavailable, costs=self.costs)
            self.handlers = Handlers(
                page, demo, target=target, template=self.template, factory=self.factory, tabs=self.tabs,
                limits=limits, max_length=args.max_length, max_new_tokens=self.max_new_tokens,
                default_tree=self.default_tree, shown=self.shown, view_slots=self.view_slots,
                rendering=self.rendering, costs=self.costs, trees=self.trees)
            self._wire(demo)
        self.demo = demo

    @property
    def limits(self) -> ServingLimits:
        """What one visitor may cost this server. The handlers enforce them and hold them: setting them here (as
        tests do) changes what the next request is allowed."""
        return self.handlers.limits

    @limits.setter
    def limits(self, limits: ServingLimits) -> None:
        self.handlers.limits = limits

    def queued(self) -> gr.Blocks:
        """The page with its queue: one engine request at a time (runs and steps share the engine slot), at most
        ``limits.queue_max_size`` waiting (Gradio refuses more, and shows each waiting visitor their place)."""
        return self.demo.queue(default_concurrency_limit=1, max_size=self.limits.queue_max_size)

    def _wire(self, demo: gr.Blocks) -> None:
        """Connect the components to the parts (inside ``demo``'s Blocks context)."""
        c, h, costs, trees = self.components, self.handlers, self.costs, self.trees
        inputs = [c.tab] + c.controls.inputs()
        run_outputs, view_outputs = c.run_outputs(), c.step_outputs()
        gpu = space.gpu_decorator()  # spaces.GPU on a Space with ZeroGPU's package: the handlers that run engines
        run_ui, step_ui = gpu(h.run_ui), gpu(h.step_ui)
        # Runs and step-once share one queue slot: the engines share the target (each run leases its own
        # engines and caches, so the slot bounds the work, not correctness). While waiting, Gradio shows the
        # visitor their place in the queue on the outputs.
        c.run_btn.click(run_ui, inputs, run_outputs, api_name="run", concurrency_id="engine", concurrency_limit=1)
        c.prompt.submit(run_ui, inputs, run_outputs, api_name=False, concurrency_id="engine", concurrency_limit=1)
        c.step_btn.click(step_ui, inputs, run_outputs, api_name="step_once", concurrency_id="engine",
                         concurrency_limit=1)
        # Stop skips the queue (it would wait behind the run it stops); a run checks between steps whether Stop
        # was pressed after it was queued, so a Stop pressed while it still waits is not lost either.
        c.stop_btn.click(h.stop, [c.tab], [c.status], api_name="stop", queue=False)
        c.clear_btn.click(h.clear, [c.tab], run_outputs + [c.prompt, c.export_file], api_name="clear", queue=False)
        c.slider.input(h.show_step, [c.tab, c.slider], view_outputs, api_name="show_step",
                       trigger_mode="always_last", show_progress="hidden")
        c.slider.release(h.show_step, [c.tab, c.slider], view_outputs, api_name=False,
                         trigger_mode="always_last", show_progress="hidden")
        for s in self.shown:   # a click on an answer token selects its step in every engine
            c.answer[s].select(h.select_token_ui, [c.tab], view_outputs + [c.slider], api_name=False,
                               show_progress="hidden")
        c.frame.input(h.view_changed, [c.tab, c.slider, c.frame, c.show_pruned], view_outputs, api_name=False,
                      show_progress="hidden")
        c.show_pruned.input(h.view_changed, [c.tab, c.slider, c.frame, c.show_pruned], view_outputs,
                            api_name=False, show_progress="hidden")
        c.next_btn.click(h.next_frame, [c.tab, c.slider, c.frame], view_outputs + [c.frame], api_name=False,
                         show_progress="hidden")
        preset_outputs = ([c.controls.tree, c.tree_note, c.preset_note]
                          + [getattr(c.controls, n) for n in KNOBS if KNOBS[n].engine])
        for key, btn in c.preset_btns.items():
            btn.click(lambda key=key: trees.apply_preset(key), None, preset_outputs, api_name=False,
                      queue=False, show_progress="hidden")
        for (kind, prompt, question), btn in zip(EXAMPLES, c.example_btns):
            btn.click(lambda prompt=prompt, kind=kind, question=question:
                      {c.prompt: prompt, c.guide: f"**{kind} example. Try this:** {question}"},
                      None, [c.prompt, c.guide], api_name=False, queue=False, show_progress="hidden")
        for w in c.whatif:
            w.release(costs.whatif_changed, [c.tab, *c.whatif], [c.why_plot, c.why_text], api_name=False,
                      show_progress="hidden")
        c.export_btn.click(h.export, [c.tab], [c.export_file, c.status], api_name="export")
        c.replay_file.upload(h.replay_ui, [c.tab, c.replay_file], run_outputs, api_name="replay")
        c.controls.tree.change(trees.tree_mode_changed, [c.controls.tree],
                               [c.tree_note] + [getattr(c.controls, n) for n in SIZE_KNOBS],
                               api_name=False, queue=False, show_progress="hidden")
        demo.load(costs.cost_view, None, [c.cost_text, c.cost_verify_plot, c.cost_rate_plot, c.preset_note],
                  api_name=False, show_progress="hidden")
        demo.load(lambda: costs.render_why(None), None, [c.why_plot, c.why_text], api_name=False,
                  show_progress="hidden")
        demo.unload(self._on_unload)

    def _on_unload(self, request: gr.Request) -> None:
        """The tab closed: release its state now. Gradio passes the request (which names the tab's session) to
        a handler whose parameter is annotated ``gr.Request``, hence this method over TabRegistry.on_unload."""
        self.tabs.on_unload(request)


#: The names app.py and the tests use on the page, by the part that owns each (``vis.status`` is
#: ``vis.components.status``, ``vis.run`` is ``vis.handlers.run``): read-only views, the parts hold the state.
FORWARDED = {
    "components": tuple(f.name for f in fields(PageComponents)),
    "handlers": ("run", "step_once", "show_step", "select_token", "view_changed", "next_frame", "stop", "clear",
                 "export", "replay"),
    "rendering": ("render_all", "render_step_views"),
    "costs": ("note_engines", "cost_view", "render_why", "whatif_changed"),
    "trees": ("preset_of", "preset_text", "apply_preset", "tree_mode_changed"),
}


def _forwarded(part: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, part), name), doc=f"``self.{part}.{name}``")


for _part, _names in FORWARDED.items():
    for _name in _names:
        assert not hasattr(Visualiser, _name), _name   # a part's name never hides the page's own
        setattr(Visualiser, _name, _forwarded(_part, _name))
