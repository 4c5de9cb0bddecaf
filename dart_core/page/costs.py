"""The page's explanations of speed: the *Cost of a tree* view (what a verify costs here and what the
automatic chooser expects each DART budget to earn) and the *Why this speed?* panel (expected speedup by
acceptance and verify cost, this run's measured point, the visitor's what-if), in :class:`CostViews`. The cost
view is drawn again after each run and shared by every tab (its last drawing, under a lock).
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from .. import space
from ..hardware import gemm_paths
from ..models import kernel_path
from ..ui import teaching_whatif, viz, viz_cost
from ..ui.record import RunRecord, label_of
from ..ui.session import RunSettings
from .controls import SPEC_SLOTS, WHATIF_DRAFT_RATIO
from .tabs import TabState

if TYPE_CHECKING:
    from .components import PageComponents
    from .engines import EngineFactory
    from .trees import TreeControls

logger = logging.getLogger("dart_app")


class CostViews:
    """The cost-of-a-tree view and the why-this-speed panel (see the module docstring): the page's ``cost_text``,
    ``cost_verify_plot``, ``cost_rate_plot``, ``why_plot`` and ``why_text``, from ``factory``'s cost model and the
    AutoTrees of the engines in ``view_slots``; ``trees`` gets DART's expected rates and writes the presets' note
    (``preset_note``) the cost view updates."""

    def __init__(self, page: PageComponents, factory: EngineFactory, view_slots: list[str], trees: TreeControls):
        self.page = page
        self.factory = factory
        self.view_slots = view_slots
        self.trees = trees
        # the automatic-tree drafters (dart_core.sizing.AutoTree) the *Cost of a tree* view reads, by engine: the
        # latest run's (they learn from every step), else ones of its own; and that view, as last drawn
        self._autos: dict[str, Any] = {}
        self._cost_view: dict | None = None
        self._cost_lock = threading.Lock()

    def note_engines(self, engines: dict[str, Any]) -> None:
        """Remember the automatic-tree drafters of ``engines`` (a run's, or the warmed-up pool's) for the
        *Cost of a tree* view."""
        for name, engine in engines.items():
            drafter = getattr(engine, "drafter", None)
            if name in SPEC_SLOTS and callable(getattr(drafter, "rates", None)):
                self._autos[name] = drafter

    def _view_autos(self) -> dict[str, Any]:
        """An AutoTree per speculative engine: the latest run's, else fresh ones (built once, not pooled)."""
        missing = [s for s in self.view_slots if s not in self._autos]
        if missing:
            fresh = self.factory.build(RunSettings(tree="auto"), fresh=True)
            for s in missing:
                drafter = getattr(fresh.get(s), "drafter", None)
                if callable(getattr(drafter, "rates", None)):
                    self._autos[s] = drafter
        return self._autos

    def render_costs(self) -> dict:
        """The *Cost of a tree* view from the target's cost model and the engines' AutoTrees: verify ms by tree
        size, DART's expected tokens/s by budget, and why this machine picks what it picks. Drawn again after
        each run (the models learn from every step); a page load shows the last drawing."""
        with self._cost_lock:
            try:
                costs = self.factory.costs
                autos = self._view_autos()
                rates = autos["dart"].rates() if "dart" in autos else None
                self.trees.note_rates(rates)
                others = {label_of(s): autos[s].rates()[0]["label"] for s in self.view_slots
                          if s != "dart" and s in autos}
                choice, kernels = kernel_path.chosen(), gemm_paths()
                out = {self.page.cost_text: viz_cost.tree_cost_text(costs, rates, others=others,
                                                               kernel=kernels["gemm_path"],
                                                               kernel_source=choice.source if choice else None,
                                                               kernel_split=kernels["gemm_split"]),
                       self.page.cost_verify_plot: viz_cost.verify_cost_figure(costs),
                       self.page.cost_rate_plot: (viz_cost.budget_rate_figure(rates) if rates
                                             else viz.empty_fig("DART is not loaded: no budget to weigh")),
                       self.page.preset_note: self.trees.preset_text(rates=rates)}
            except Exception as exc:  # noqa: BLE001 - the rest of the page works without this view
                logger.exception("the cost-of-a-tree view failed")
                why = f"{type(exc).__name__}: {exc}"
                out = {self.page.cost_text: f"⚠ The cost view could not be drawn ({why}; details in the server log).",
                       self.page.cost_verify_plot: viz.empty_fig("no cost model"),
                       self.page.cost_rate_plot: viz.empty_fig("no cost model"),
                       self.page.preset_note: self.trees.preset_text()}
            self._cost_view = out
        return out

    def cost_view(self) -> dict:
        """The last drawing of the *Cost of a tree* view (drawn now if there is none yet): for page loads. On
        ZeroGPU a GPU is attached only while a request runs, so there the first run draws it."""
        view = self._cost_view
        if view is None and space.on_zerogpu():
            return {self.page.cost_text: "The cost of a tree on this machine is measured at the first run.",
                    self.page.cost_verify_plot: viz.empty_fig("run a prompt to measure the cost of a tree"),
                    self.page.cost_rate_plot: viz.empty_fig("run a prompt to measure the cost of a tree"),
                    self.page.preset_note: self.trees.preset_text()}
        return view if view is not None else self.render_costs()

    # ------------------------------------------------------------------ why this speed
    def _measured_points(self, record: RunRecord | None) -> list[dict]:
        """This run's point per speculative engine for the what-if: acceptance, verify and draft cost."""
        points = []
        if record is None:
            return points
        costs = self.factory.costs
        metrics = record.metrics()
        for s in self.view_slots:
            run = record.runs.get(s)
            if run is None or not run.traces:
                continue
            point = teaching_whatif.measured_point(run.traces, costs)
            point["label"] = f"{run.label}, this run"
            if s in metrics and metrics[s].speedup:
                point["speedup"] = float(metrics[s].speedup)
            points.append(point)
        return points

    def render_why(self, record: RunRecord | None, whatif: dict | None = None) -> dict:
        """The *Why this speed?* panel: expected speedup against acceptance and verify cost, this run's measured
        points on it, the GPU regime the paper reports marked, and ``whatif`` (the sliders' alpha, verify_ratio
        and depth) explained, at the draft cost this run measured (DART's, else EAGLE-3's; WHATIF_DRAFT_RATIO
        before any run)."""
        try:
            try:
                points = self._measured_points(record)
            except Exception:  # noqa: BLE001 - no cost model: a what-if still answers, at the default draft cost
                if whatif is None:
                    raise
                logger.debug("no measured points for the what-if", exc_info=True)
                points = []
            shown = list(points)
            if whatif is not None:
                whatif = {"draft_ratio": float(points[0]["draft_ratio"]) if points else WHATIF_DRAFT_RATIO,
                          **whatif, "label": "your what-if"}
                shown.append(whatif)
            # the map is drawn for the chain the sentence below speaks of: the what-if's depth, else the run's
            lead = whatif if whatif is not None else (points[0] if points else {})
            depth = int(lead.get("depth", 4))
            draft = float(lead.get("draft_ratio", WHATIF_DRAFT_RATIO))
            fig = teaching_whatif.whatif_figure(measured=shown or None, depth=depth, draft_ratio=draft)
            if whatif is not None:
                text = teaching_whatif.whatif_text(whatif["alpha"], whatif["verify_ratio"],
                                                   whatif["draft_ratio"], whatif["depth"])
            elif points:
                p0 = points[0]
                text = (f"**{p0['label']}:** " + teaching_whatif.whatif_text(
                    p0["alpha"], p0["verify_ratio"], p0["draft_ratio"], p0.get("depth", 4)))
            else:
                text = "Run a prompt to place this machine's measured point on the map."
        except Exception as exc:  # noqa: BLE001 - the rest of the page works without this panel
            logger.exception("the why panel failed")
            fig = viz.empty_fig("no cost model")
            text = f"⚠ This panel could not be drawn ({type(exc).__name__}: {exc})."
        return {self.page.why_plot: fig, self.page.why_text: text}

    def whatif_changed(self, tab: TabState | None, alpha: float, verify_ratio: float, depth: float) -> dict:
        """The what-if sliders moved: place that point on the map."""
        record = tab.record if isinstance(tab, TabState) else None
        return self.render_why(record, {"alpha": float(alpha), "verify_ratio": float(verify_ratio),
                                        "depth": int(depth)})
