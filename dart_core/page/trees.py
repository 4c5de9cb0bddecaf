"""The page's tree-size controls: the tree mode (auto: sized by this machine's costs, or fixed: the sliders) and
the two presets (*Fastest on this machine*, *Paper's trees*) with each one's measured and expected speed here.
:class:`TreeControls` answers their events and keeps the presets' speeds (the latest run's per preset, DART's
expected rates as the cost view last drew them); the layout's first texts come from the plain functions.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import gradio as gr

from ..presets import KNOBS, TREE_MODES
from ..ui import viz_cost
from ..ui.record import RunRecord
from ..ui.session import RunSettings
from .controls import PRESETS, SIZE_KNOBS

if TYPE_CHECKING:
    from .components import PageComponents
    from .engines import EngineFactory


def _expected_dart(rates: Any, preset: str) -> str:
    """DART's expected speed under a preset, from its AutoTree's ``rates()`` (expected tokens/s per setting,
    best first, the plain step included): the best setting ("fastest") or budget 60 ("paper") over a plain step."""
    if not rates:
        return ""
    rows, plain = viz_cost.budget_rows(rates)
    row = rates[0] if preset == "fastest" else next((r for b, r in rows if b == viz_cost.PAPER_BUDGET), None)
    if plain is None or row is None or not float(plain["tokens_per_s"]):
        return ""
    return (f"DART expected {float(row['tokens_per_s']) / float(plain['tokens_per_s']):.2f}× "
            f"({row['label']}) by this machine's cost model")


def tree_note(mode: str, factory: EngineFactory) -> str:
    """What the tree-size control's ``mode`` means for ``factory``'s engines."""
    d, e = factory.base_trees["dart"], factory.base_trees["eagle3"]
    available = factory.names
    engines = ["DART's budget" if "dart" in available else None,
               "EAGLE-3's total tokens, depth and top-k" if "eagle3" in available else None]
    sizes = " and ".join(x for x in engines if x) or "the tree sizes"
    if mode == "auto":
        return (f"**Tree size: auto.** {sizes[0].upper() + sizes[1:]} are chosen every few steps from this "
                "machine's measured verify cost and the head's expected acceptance (see *Cost of a tree* "
                "below), so **the size sliders are not applied** (greyed out); the other tree settings are.")
    return (f"**Tree size: fixed.** The sliders apply as set (by default the paper's trees: DART budget "
            f"{d.budget}, EAGLE-3 {e.total_token} total tokens, depth {e.depth}, "
            f"top-k {e.top_k}).")


def preset_text(preset_runs: dict[str, dict], selected: str | None = None, rates: Any = None) -> str:
    """Each preset's speed on this machine: measured by the latest run on this server with that preset
    (``preset_runs``, vs the vanilla baseline of the same run), and DART's expected speed by the cost and
    acceptance models (``rates``: its AutoTree's ``rates()``); ``selected`` is marked."""
    lines = []
    for key, label in PRESETS.items():
        mark = "▶ " if key == selected else ""
        run = preset_runs.get(key)
        if run:
            speeds = ", ".join(f"{name} **{sp:.2f}×** (τ {tau:.2f})" if tau is not None else
                               f"{name} **{sp:.2f}×**" for name, (sp, tau) in run["speeds"].items())
            measured = f"measured here: {speeds} vs vanilla ({run['tokens']} tokens, last run)"
        else:
            measured = "not run on this server yet: press **Run** to measure it"
        expected = _expected_dart(rates, key)
        lines.append(f"{mark}**{label}**: {measured}{'; ' + expected if expected else ''}.")
    return "  \n".join(lines)


class TreeControls:
    """Tree mode and presets (see the module docstring): the page's ``tree_note``, ``preset_note`` and
    ``controls`` (the tree-size control and the tree sliders), for ``factory``'s engines; ``default_tree`` is the
    mode a request without one runs."""

    def __init__(self, page: PageComponents, factory: EngineFactory, default_tree: str):
        self.page = page
        self.factory = factory
        self.default_tree = default_tree
        self._preset_runs: dict[str, dict] = {}      # preset -> its latest run's speeds on this server
        self._dart_rates: Any = None                 # DART's AutoTree rates() as the cost view last drew them

    def note_rates(self, rates: Any) -> None:
        """DART's expected rates as the cost view (costs.py) just drew them: the presets' note quotes them."""
        self._dart_rates = rates

    def tree_mode_changed(self, mode: str) -> dict:
        """The tree-mode control moved: say what applies, and grey out the size sliders in auto mode."""
        mode = mode if mode in TREE_MODES else self.default_tree
        out: dict = {self.page.tree_note: tree_note(mode, self.factory)}
        for name in SIZE_KNOBS:
            out[getattr(self.page.controls, name)] = gr.Slider(interactive=mode != "auto")
        return out

    def _paper_values(self) -> dict[str, float]:
        """The paper's trees: every tree knob at its base config value (DART budget 60, EAGLE-3 60 / 7 / 10)."""
        base = self.factory.base_trees
        return {name: knob.default_for(base[knob.engine]) for name, knob in KNOBS.items() if knob.engine}

    def preset_of(self, settings: RunSettings) -> str | None:
        """Which preset ``settings`` is: "fastest" (automatic trees), "paper" (fixed at the paper's trees), else
        None (custom sliders)."""
        if settings.tree == "auto":
            return "fastest"
        paper = self._paper_values()
        same = all(getattr(settings, name, None) in (None, value) for name, value in paper.items())
        return "paper" if same else None

    def apply_preset(self, name: str) -> dict:
        """A preset button: set the tree-size control and the tree sliders, and say what it does here."""
        mode = "fixed" if name == "paper" else "auto"
        out = {self.page.controls.tree: mode, **self.tree_mode_changed(mode)}
        if name == "paper":
            for knob, value in self._paper_values().items():
                out[getattr(self.page.controls, knob)] = gr.Slider(value=value, interactive=True)
        out[self.page.preset_note] = self.preset_text(selected=name)
        return out

    def note_preset_run(self, settings: RunSettings, record: RunRecord) -> None:
        """Remember a finished run's speed under its preset, for the presets' note. A run cut short (Stop, a
        serving limit, an error) measured its first tokens only (prefill-heavy): it leaves the note as it was."""
        preset = self.preset_of(settings)
        if preset is None or not all(r.finished for r in record.runs.values()):
            return
        metrics = record.metrics()
        speeds = {record.runs[s].label: (metrics[s].speedup, metrics[s].tau) for s in record.speculative
                  if s in metrics and metrics[s].speedup and not record.runs[s].error}
        if speeds:
            self._preset_runs[preset] = {"speeds": speeds, "tokens": max(m.tokens for m in metrics.values())}

    def preset_text(self, selected: str | None = None, rates: Any = None) -> str:
        """The presets' note (module ``preset_text``) from this server's runs, and DART's expected rates as last
        drawn unless ``rates`` are given."""
        return preset_text(self._preset_runs, selected, rates if rates is not None else self._dart_rates)
