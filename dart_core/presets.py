"""Every decoding-tree knob and sampling knob, defined once: name, label, range, default, help (``KNOBS``).

A knob has one name: the RunSettings field, the page's control, the settings API's keyword and (dashed)
the command-line flag (``budget`` / ``--budget``, ``level_top_k`` / ``--level-top-k``, ...). Every entry
point reads its range from here: the app's sliders, ``RunSettings`` (the page and
its API), the tree flags of ``dart_core.bench`` (made by :func:`add_tree_flags`, as the page makes its sliders)
and ``benchmarks/tune_tree.py``, and the configs
``PruningConfig`` / ``Eagle3TreeConfig`` (the Python API). A value inside a range always runs; a
value outside is refused where it enters, with a message that names the setting.

The low end is where the engine stops working, so every entry enforces it, the configs included.
The high end bounds the cost of one request: the page, its settings API and the CLI flags enforce
it, while the configs take larger values from Python (the drafters size their trees by the
candidates they can actually produce, so a huge budget or beam costs no memory by itself).

    LIMITS["budget"].check(0, "--budget")     # -> 0 (DART drafts nothing: a plain target step)
    LIMITS["budget"].check(-1, "--budget")    # ValueError: --budget must be between 0 and 1024, got -1
    KNOBS["budget"].default_for(PruningConfig())   # the page's default: the paper's 60

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


@dataclass(frozen=True)
class Knob:
    """One knob, named once: its name is the RunSettings field, the page's control, the keyword of the
    settings API and (dashed) the command-line flag.

    limit         its range and its label (the name the page's messages use)
    step          the page slider's step
    help          one line: the flag's help (:func:`add_tree_flags`)
    default       the page's default; None for a tree knob: the value in the engine's tree config, the
                  paper's / published one unless the app was started with other values (:meth:`default_for`)
    engine        "dart" / "eagle3" for a tree knob (None: a sampling knob every engine shares)
    config_field  its field in that engine's tree config (PruningConfig / Eagle3TreeConfig)
    sizes_tree    a tree-size knob: with automatic trees (``--tree auto``) the measured cost and acceptance
                  models choose it each few steps unless it is set (dart_core.sizing)
    slider_label  the slider's label where it says more than ``limit.label`` (e.g. what 0 means)
    """
    name: str
    limit: Limit
    step: float
    help: str
    default: float | None = None
    engine: str | None = None
    config_field: str | None = None
    slider_label: str | None = None
    sizes_tree: bool = False

    @property
    def label(self) -> str:
        return self.limit.label

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def default_for(self, tree_config: Any = None) -> float:
        """The page's default: ``default``, or for a tree knob the value in ``tree_config`` (the engine's
        PruningConfig / Eagle3TreeConfig)."""
        if self.config_field is None:
            return self.default
        if tree_config is None:
            raise ValueError(f"{self.name} takes its default from a tree config: pass its {self.engine} tree config")
        return getattr(tree_config, self.config_field)


#: Every knob the page, the settings API and the tree flags share, in the page's order.
KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("temperature", Limit("Temperature", 0.0, None, False, slider_high=2.0), 0.05,
         "sampling temperature (0 = greedy)", default=0.0, slider_label="Temperature (0 = greedy)"),
    Knob("top_p", Limit("Top-p", 0.0, 1.0, False, slider_low=0.05, low_open=True), 0.05,
         "nucleus sampling: keep the smallest set of tokens with this much probability (1 = off)", default=1.0,
         slider_label="Top-p (1 = off)"),
    Knob("top_k", Limit("Top-k", 0, None, True, slider_high=200), 1,
         "sample among the k likeliest tokens (0 = off)", default=0, slider_label="Top-k (0 = off)"),
    # DART pruning (dart_core.drafters.pruning.PruningConfig: budget, beam_width, level_top_k, ngram_weight,
    # context_weight)
    Knob("budget", Limit("DART tree budget", 0, 1024, True, slider_high=256), 1,
         "DART tree budget: drafted nodes kept per step, root excluded (0 = no draft)",
         engine="dart", config_field="budget", slider_label="DART tree budget (nodes; 0 = no draft)",
         sizes_tree=True),
    Knob("beam_width", Limit("DART beam width", 1, 256, True, slider_high=64), 1,
         "DART beam width: candidates expanded per level", engine="dart", config_field="beam_width"),
    Knob("level_top_k", Limit("DART per-level top-k", 1, 256, True, slider_high=64), 1,
         "DART per-level top-k: tokens per level taken from each row (its best by logit)", engine="dart", config_field="level_top_k"),
    Knob("ngram_weight", Limit("DART N-gram weight", 0.0, 100.0, False, slider_high=2.0), 0.05,
         "DART N-gram weight: weight of the N-gram log-probability in a candidate's score (0 = logits only)",
         engine="dart", config_field="ngram_weight"),
    Knob("context_weight", Limit("DART context weight", 0.0, 1.0, False), 0.05,
         "DART context weight: the request's own text as a source of candidates and its share of the N-gram "
         "probability (0 = the paper's DART: the corpus table only)",
         engine="dart", config_field="context_weight", slider_label="DART context weight (0 = the paper's)"),
    # EAGLE-3 dynamic tree (dart_core.drafters.eagle3.Eagle3TreeConfig: total_token, depth, top_k, context_weight)
    Knob("eagle3_total_token", Limit("EAGLE-3 total tokens", 1, 1024, True, slider_high=256), 1,
         "EAGLE-3 total tokens: nodes verified per step, root included (1 = no draft)",
         engine="eagle3", config_field="total_token", sizes_tree=True),
    Knob("eagle3_depth", Limit("EAGLE-3 depth", 0, 64, True, slider_high=16), 1,
         "EAGLE-3 depth: tree forwards after the first one; drafted depth is at most depth + 1", engine="eagle3",
         config_field="depth", sizes_tree=True,
         # EAGLE's own convention (depth 0 still drafts one level): the slider says so where it is set
         slider_label="EAGLE-3 depth (forwards after the first: levels drawn = depth + 1)"),
    Knob("eagle3_top_k", Limit("EAGLE-3 top-k", 1, 256, True, slider_high=32), 1,
         "EAGLE-3 top-k: children scored per expanded node, and the frontier width", engine="eagle3",
         config_field="top_k", sizes_tree=True),
    Knob("eagle3_context_weight", Limit("EAGLE-3 context weight", 0.0, 1.0, False), 0.05,
         "EAGLE-3 context weight: the request's own text as a source of candidates in EAGLE-3's tree, by DART's "
         "rule (0 = the published tree: the head alone)",
         engine="eagle3", config_field="context_weight", slider_label="EAGLE-3 context weight (0 = the published tree)"),
)}

#: Each knob's range (keys: RunSettings' fields), for the entries that only check values.
LIMITS: dict[str, Limit] = {name: k.limit for name, k in KNOBS.items()}

#: The knobs of each tree config, by config field: PruningConfig / Eagle3TreeConfig field -> knob name.
PRUNING_FIELDS = {k.config_field: k.name for k in KNOBS.values() if k.engine == "dart"}
EAGLE3_FIELDS = {k.config_field: k.name for k in KNOBS.values() if k.engine == "eagle3"}
#: The tree-size knobs of each engine that automatic trees choose unless set: engine -> {config field: knob name}.
SIZE_FIELDS = {engine: {k.config_field: k.name for k in KNOBS.values() if k.engine == engine and k.sizes_tree}
               for engine in ("dart", "eagle3")}
#: ``--tree``: "auto" sizes each tree from this machine's measured costs and the drafter's acceptance (the
#: default); "fixed" uses the tree settings as given (the paper's / published ones unless set).
TREE_MODES = ("auto", "fixed")


def add_tree_flags(group: Any, engine: str, base: Any) -> None:
    """One command-line flag per tree knob of ``engine`` ("dart" / "eagle3"), made as the page makes its sliders:
    the knob's name dashed (its argparse dest is the knob's name), its range checked at parse time (before any
    model load), its help, and its default read from ``base`` (the tree config the run starts from). A flag left
    unset is None: the run keeps ``base``'s value, and with ``--tree auto`` a size knob is chosen every few steps
    (a size given is held)."""
    for knob in KNOBS.values():
        if knob.engine != engine:
            continue
        default = knob.default_for(base)
        when = (f"chosen every few steps with --tree auto, {default} with --tree fixed; a value given is held "
                "fixed under --tree auto too" if knob.sizes_tree else str(default))
        group.add_argument(knob.flag, type=knob.limit.arg_type(knob.flag), default=None,
                           metavar="N" if knob.limit.integer else "X", help=f"{knob.help} (default: {when})")
