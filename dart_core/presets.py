"""The allowed range of every decoding-tree knob and sampling knob, defined once.

Every entry point reads its range from here: the app's sliders, ``RunSettings`` (the page and
its API), the tree flags of ``dart_core.bench`` and ``benchmarks/tune_tree.py``, and the configs
``PruningConfig`` / ``Eagle3TreeConfig`` (the Python API). A value inside a range always runs; a
value outside is refused where it enters, with a message that names the setting.

The low end is where the engine stops working, so every entry enforces it, the configs included.
The high end bounds the cost of one request: the page, its settings API and the CLI flags enforce
it, while the configs take larger values from Python (the drafters size their trees by the
candidates they can actually produce, so a huge budget or beam costs no memory by itself).

    LIMITS["budget"].check(0, "--tree-budget")     # -> 0 (DART drafts nothing: a plain target step)
    LIMITS["budget"].check(-1, "--tree-budget")    # ValueError: --tree-budget must be between 0 and 1024, got -1

Edge values mean:

    budget 0             DART drafts nothing: each step is one target forward (output = vanilla)
    eagle3_total_token 1 EAGLE-3 keeps only the root: the same
    eagle3_depth 0       EAGLE-3 runs its head once (one tree level)
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limit:
    """One knob's range.

    label        the setting's name on the page
    low, high    allowed values (high None = no upper end); ``low_open``: low itself is excluded
    integer      whole numbers only
    slider_low, slider_high  the page slider's span (inside [low, high]): the usual values; the API
                 takes anything in [low, high]
    """
    label: str
    low: float
    high: float | None
    integer: bool
    slider_low: float | None = None
    slider_high: float | None = None
    low_open: bool = False

    def describe_low(self) -> str:
        return f"{'>' if self.low_open else '>='} {self.low}"

    def describe(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.low_open:
            return f"in ({self.low}, {self.high}]"
        return f"between {self.low} and {self.high}"

    def problem(self, value: Any, *, upper: bool = True) -> str | None:
        """None when ``value`` is allowed, else what is wrong with it (without the setting's name).
        ``upper=False`` checks the type and the low end only (the configs: see the module docstring)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                return f"must be a number, got {value!r}"
        v = float(value)
        if not math.isfinite(v):
            return f"must be a finite number, got {value!r}"
        if self.integer and v != int(v):
            return f"must be a whole number, got {value!r}"
        below = v <= self.low if self.low_open else v < self.low
        if below or (upper and self.high is not None and v > self.high):
            return f"must be {self.describe() if upper else self.describe_low()}, got {value!r}"
        return None

    def check(self, value: Any, name: str | None = None) -> Any:
        """``value`` as an int (integer knobs) or float; ValueError naming ``name`` (default: the label)."""
        why = self.problem(value)
        if why is not None:
            raise ValueError(f"{name or self.label} {why}")
        return int(float(value)) if self.integer else float(value)

    @property
    def slider_range(self) -> tuple[float, float]:
        lo = self.low if self.slider_low is None else self.slider_low
        hi = self.slider_high if self.slider_high is not None else self.high
        return lo, hi

    def arg_type(self, flag: str):
        """An argparse ``type=`` that refuses values outside the range at parse time (before any model load)."""
        def parse(text: str):
            try:
                number = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None
            try:
                return self.check(number, flag)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"{exc} ({self.label})") from None
        parse.__name__ = "int" if self.integer else "float"
        return parse


#: Every knob the page, the API and the benchmark flags share (keys: RunSettings' fields).
LIMITS: dict[str, Limit] = {
    "temperature": Limit("Temperature", 0.0, None, False, slider_high=2.0),
    "top_p": Limit("Top-p", 0.0, 1.0, False, slider_low=0.05, low_open=True),
    "top_k": Limit("Top-k", 0, None, True, slider_high=200),
    # DART pruning (dart_core.drafters.pruning.PruningConfig: budget, beam_width, top_k, ngram_weight)
    "budget": Limit("DART tree budget", 0, 1024, True, slider_high=256),
    "beam_width": Limit("DART beam width", 1, 256, True, slider_high=64),
    "level_top_k": Limit("DART per-level top-k", 1, 256, True, slider_high=64),
    "ngram_weight": Limit("DART N-gram weight", 0.0, 100.0, False, slider_high=2.0),
    # EAGLE-3 dynamic tree (dart_core.drafters.eagle3.Eagle3TreeConfig: total_token, depth, top_k)
    "eagle3_total_token": Limit("EAGLE-3 total tokens", 1, 1024, True, slider_high=256),
    "eagle3_depth": Limit("EAGLE-3 depth", 0, 64, True, slider_high=16),
    "eagle3_top_k": Limit("EAGLE-3 top-k", 1, 256, True, slider_high=32),
}

#: PruningConfig / Eagle3TreeConfig field -> LIMITS key.
PRUNING_FIELDS = {"budget": "budget", "beam_width": "beam_width", "top_k": "level_top_k",
                  "ngram_weight": "ngram_weight"}
EAGLE3_FIELDS = {"total_token": "eagle3_total_token", "depth": "eagle3_depth", "top_k": "eagle3_top_k"}
