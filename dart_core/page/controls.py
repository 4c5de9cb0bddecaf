"""The page's controls and copy: which engines get a column, the settings controls (one slider per knob of
dart_core.presets.KNOBS), the tree presets, the stages of the step view, the guided examples and the texts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from ..presets import KNOBS
from ..ui import teaching_round, viz
from ..ui.record import BASELINE
from .tabs import FRAME_ALL

SLOTS = ("dart", "eagle3", BASELINE)     # answer columns, in page order
SPEC_SLOTS = ("dart", "eagle3")          # engines with a draft tree to show

#: Guided examples: (kind, prompt, one question for a class to try with it).
EXAMPLES = [
    ("Chat", "Give three tips for staying healthy.",
     "Set the **DART N-gram weight** to 0 (Settings, *Paper's trees*): what happens to τ, and to the shape of "
     "the pruned tree?"),
    ("Code", "Write a Python function that checks whether a string is a palindrome.",
     "Code repeats names from the prompt: compare DART's and EAGLE-3's τ here with the chat example's. "
     "Which engine gains more, and why?"),
    ("Math", "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
             "How many clips did Natalia sell altogether in April and May?",
     "Run it with *Fastest on this machine*, then with *Paper's trees*: the paper's trees accept more tokens "
     "per step, but are they faster here, and what does *Why this speed?* say about it?"),
]

INTRO = """\
## Speculative decoding, step by step: DART vs EAGLE-3
A small **draft head** guesses several tokens ahead as a **tree**; the big **target** model checks the whole
tree in **one** forward pass and keeps the longest guessed path it agrees with, plus one token of its own.
**DART** drafts all levels of the tree in a single head forward and prunes it with an N-gram model;
**EAGLE-3** runs its head once per tree level. The **vanilla** baseline makes one token per target pass.
Engines run in turn on one clock (only engine time is counted), so the answers race fairly."""

LEGEND = (f"**Token colours:** <span style='color:{viz.OKABE_ITO['blue']}'>■ accepted draft</span> "
          f"(guessed by the head, confirmed by the target) · <span style='color:{viz.OKABE_ITO['reddish_purple']}'>"
          "■ target token</span> (the target's own token: the bonus after each step, or the first token). "
          "τ (a.k.a. compression ratio) = tokens per target forward pass.")


@dataclass
class Controls:
    prompt: gr.Textbox
    max_new_tokens: gr.Slider
    temperature: gr.Slider
    top_p: gr.Slider
    top_k: gr.Slider
    budget: gr.Slider
    beam_width: gr.Slider
    level_top_k: gr.Slider
    ngram_weight: gr.Slider
    context_weight: gr.Slider
    eagle3_total_token: gr.Slider
    eagle3_depth: gr.Slider
    eagle3_top_k: gr.Slider
    eagle3_context_weight: gr.Slider
    tree: gr.Radio

    def inputs(self) -> list[gr.components.Component]:
        return [getattr(self, f) for f in self.__dataclass_fields__]


#: the settings controls in page order: RunSettings' field names, which are the knobs' names (dart_core.presets),
#: and last the tree mode (last, so an API call without it still fits and gets the page's default)
SETTING_NAMES = ("max_new_tokens",) + tuple(KNOBS) + ("tree",)
#: the tree-size knobs: with automatic trees the chooser sets them and their sliders are not applied
SIZE_KNOBS = tuple(name for name, knob in KNOBS.items() if knob.sizes_tree)
#: the tree-mode control's choices: (shown, value)
TREE_CHOICES = [("auto (measured on this machine)", "auto"), ("fixed (sliders)", "fixed")]
#: the two tree presets: "fastest" = automatic trees (sized by this machine's measured costs), "paper" = the
#: paper's fixed trees (DART budget 60, EAGLE-3 60 / 7 / 10: the engines' base tree configs)
PRESETS = {"fastest": "Fastest on this machine", "paper": "Paper's trees"}
#: the step view: the whole step, or one stage of the round (dart_core.ui.teaching_round.round_frames keys)
FRAMES = [("Whole step", FRAME_ALL)] + [(f"{i} · {key}", key) for i, key in enumerate(teaching_round.FRAME_KEYS, 1)]
FRAME_KEYS = [k for _, k in FRAMES]
#: the what-if's draft cost (x one plain step) before a run has measured one
WHATIF_DRAFT_RATIO = 0.1


def knob_slider(name: str, tree_config: Any = None, *, interactive: bool | None = None) -> gr.Slider:
    """The settings slider of KNOBS[name] (dart_core.presets: its label, step, slider span and default; a tree
    knob's default is the target's own ``tree_config``). A default past the span widens it, up to the limit's
    high end (a default beyond the limit is shown at the limit, the most a request may ask for)."""
    knob = KNOBS[name]
    limit = knob.limit
    value = knob.default_for(tree_config)
    lo, hi = limit.slider_range
    if limit.high is not None:
        value = min(value, limit.high)
    return gr.Slider(lo, max(hi, value), value=max(value, lo), step=knob.step,
                     label=knob.slider_label or knob.label, interactive=interactive)
