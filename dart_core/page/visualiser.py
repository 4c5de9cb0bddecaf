"""The page for one loaded target: :class:`Visualiser` puts together its layout (layout.py), event handlers
(handlers.py), rendering (render.py), the cost and why-this-speed views (costs.py) and the tree controls
(trees.py), over the engine pool (engines.py) and the tabs' state (tabs.py). Its methods are plain methods, so
tests call the handlers directly.

    vis = Visualiser(target, args)         # args: app.py's flags
    serve(vis.queued(), args)              # dart_core.page.serve
"""
from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

import gradio as gr

from .. import space
from ..models.templates import get_template
from ..ui.serving import ServingLimits, serving_limits
from .controls import SLOTS, SPEC_SLOTS
from .costs import CostViews
from .engines import EngineFactory
from .handlers import Handlers
from .layout import Layout
from .render import Rendering
from .tabs import TabRegistry
from .trees import TreeControls

logger = logging.getLogger("dart_app")


class Visualiser(Layout, Handlers, Rendering, CostViews, TreeControls):
    """Builds the Blocks page for one loaded target and its engines; handlers are plain methods."""

    def __init__(self, target, args: argparse.Namespace, factory: EngineFactory | None = None,
                 banner: str | None = None, limits: ServingLimits | None = None):
        self.target = target
        self.args = args
        self.banner = banner     # shown atop the page (e.g. why a Space without a GPU runs the CPU models)
        # what one visitor may cost this server (dart_core.ui.serving): hosted (Space, --listen, --share) or local
        self.limits = limits or serving_limits(listen=getattr(args, "listen", False),
                                               share=getattr(args, "share", False))
        self.max_new_tokens = self.limits.cap_new_tokens(args.max_new_tokens)
        if self.max_new_tokens < args.max_new_tokens:
            logger.warning("--max-new-tokens %d is capped at %d on a %s server (max_new_tokens, dart_core/ui/serving.py)",
                           args.max_new_tokens, self.max_new_tokens, self.limits.name)
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
        # the automatic-tree drafters (dart_core.sizing.AutoTree) the *Cost of a tree* view reads, by engine: the
        # latest run's (they learn from every step), else ones of its own; and that view, as last drawn
        self._autos: dict[str, Any] = {}
        self._cost_view: dict | None = None
        self._dart_rates: Any = None                 # DART's AutoTree rates() as last drawn (the presets' note)
        self._preset_runs: dict[str, dict] = {}      # preset -> its latest run's speeds on this server
        self._cost_lock = threading.Lock()
        self.tabs = TabRegistry()                # the tabs' state and its memory budget
        gpu = space.gpu_decorator()  # spaces.GPU on a Space with ZeroGPU's package: the handlers that run engines
        self._run_ui, self._step_ui = gpu(self._run_ui), gpu(self._step_ui)
        self.demo = self._build()

    def queued(self) -> gr.Blocks:
        """The page with its queue: one engine request at a time (runs and steps share the engine slot), at most
        ``limits.queue_max_size`` waiting (Gradio refuses more, and shows each waiting visitor their place)."""
        return self.demo.queue(default_concurrency_limit=1, max_size=self.limits.queue_max_size)
