"""Gradio app: DART, EAGLE-3 and a vanilla baseline side by side on one target, step by step.

UI and CLI only. The engines (dart_core) decode; dart_core.loading builds them, dart_core.ui.session
advances them in turn, ui.record records their StepTraces and exports / replays runs, ui.narration
narrates steps; dart_core.ui.viz draws the
figures. This file builds engines from flags and renders RunRecords (live or replayed).

    python app.py                                   # bundled SmolLM2-135M + DART head, http://127.0.0.1:7860
    python app.py --compare-eagle3                  # also EAGLE-3 (the bundled head, or --eagle3-model-name-or-path)
    python app.py --tree fixed                      # trees as the sliders set them (default: sized by measurement)
    python app.py --help
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no request leaves the machine

from dart_core import space  # noqa: E402  (light: no torch, no native extension)

# On a Hugging Face Space only: build the C++ extension if missing, before any module imports it (Spaces installs
# requirements.txt before copying the repository, so `.` cannot be a requirement). A no-op elsewhere.
try:
    space.bootstrap_native()
except space.NativeBuildError as _exc:
    raise SystemExit(f"error: {_exc}") from None
space.zerogpu_module()  # ZeroGPU wants `spaces` imported before torch touches CUDA (None elsewhere)

import gradio as gr  # noqa: E402

from dart_core.engine.trace_stats import step_for_token  # noqa: E402
from dart_core.hardware import gemm_paths  # noqa: E402
from dart_core.loading import BASELINE, EngineFactory  # noqa: E402
from dart_core.ui import teaching_round, teaching_whatif, viz, viz_cost, viz_steps, viz_tree  # noqa: E402
from dart_core.ui.narration import narrate_step  # noqa: E402
from dart_core.ui.record import RunRecord, label_of, save_export  # noqa: E402
from dart_core.ui.session import Comparison, RunSettings, StepSession, check_prompt_length  # noqa: E402
from dart_core.config import ConfigError, dtype_name  # noqa: E402
from dart_core.presets import KNOBS, TREE_MODES  # noqa: E402
from dart_core.ui.serving import ServingLimits, serving_limits  # noqa: E402
from dart_core.models.templates import encode_chat, get_template  # noqa: E402

logger = logging.getLogger("dart_app")

SLOTS = ("dart", "eagle3", BASELINE)     # answer columns, in page order
SPEC_SLOTS = ("dart", "eagle3")          # engines with a draft tree to show
TAB_TTL_S = 30 * 60                      # per-tab state (step-once caches, last run) lives this long idle
UI_INTERVAL_S = 0.2                      # streaming: redraw the answers at most this often
MEMORY_CHECK_S = 0.5                     # a run checks the tabs' memory budget at most this often
TIME_LIMIT, MEMORY_LIMIT = "time limit", "memory limit"   # stop reasons of runs a serving limit ended
STOPPED_IN_QUEUE = ("**Stopped** before it started: **Stop** was pressed while this {what} waited in the queue, "
                    "so no engine ran. Press the button again to start it.")

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


# ---------------------------------------------------------------------------------------------- CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DART vs EAGLE-3 speculative decoding visualiser (Gradio). "
                                            "No flags: the bundled SmolLM2-135M target, DART head and N-gram "
                                            "table (CPU unless a GPU is present).")
    p.add_argument("--base-model-name-or-path", default=None,
                   help="target LLM: Hub id, local directory or .gguf file (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dart-model-name-or-path", default=None,
                   help="DART head: directory or Hub id (default: the bundled head, for the bundled target)")
    p.add_argument("--ngram-model-name-or-path", default=None,
                   help="N-gram table: .dngram / original .trie file, directory, Hub repo or 'none' (default: bundled)")
    p.add_argument("--small-ngram", "--use-small-ngram", dest="is_small_ngram", action="store_true",
                   help="in an N-gram directory or Hub repo, pick the small table (small.*) over full.* "
                        "(the API's is_small_ngram=True; --use-small-ngram is the older spelling)")
    p.add_argument("--eagle3-model-name-or-path", default=None,
                   help="EAGLE-3 head: directory or Hub id (implies --compare-eagle3)")
    p.add_argument("--compare-eagle3", action="store_true",
                   help="also run EAGLE-3 (the bundled head when none is given; the page says how to get one)")
    p.add_argument("--template-name", default=None,
                   help="chat template from TEMPLATE_REGISTRY (default: guessed from the model type)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: CUDA if present, else CPU)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bf16 where the hardware has it), bfloat16, float16, float32 (exact lossless check)")
    p.add_argument("--tree", choices=TREE_MODES, default="auto",
                   help="the page's default tree size: auto (chosen every few steps from this machine's measured "
                        "verify cost and the head's expected acceptance; the size sliders are not applied) or fixed "
                        "(the sliders, the paper's trees by default); the page can switch (default: auto)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer tokens at most per request (slider max)")
    p.add_argument("--max-length", type=int, default=2048, help="prompt + answer tokens at most (sizes the KV cache)")
    p.add_argument("--server-port", type=int, default=7860, help="port to serve on")
    p.add_argument("--listen", action="store_true", help="serve on 0.0.0.0 instead of 127.0.0.1")
    p.add_argument("--share", action="store_true", help="create a public Gradio share link (leaves the machine)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if args.max_length < 2:
        p.error("--max-length must be >= 2")
    return args


# ---------------------------------------------------------------------------------------------- per-tab state
class TabState:
    """What one browser tab holds: when it last pressed Stop, the run on screen and its step-once session.
    Released by ``release()`` when the tab closes or its state times out (gr.State delete_callback), and its
    run and session by ``drop()`` when the server needs the memory (the least recently used tab first).

    Stop is a time, not a flag: a request stops when Stop was pressed after it was *queued*, so a Stop pressed
    while the request still waits in the queue is not lost when it starts (see ``Visualiser._queued_at``)."""

    def __init__(self) -> None:
        self.stopped_at = float("-inf")    # time.monotonic() of the last Stop (Clear, replay and release stop too)
        self.record: RunRecord | None = None
        self.step_session: StepSession | None = None
        self.export_dir: str | None = None
        self.released = False
        self.dropped: str | None = None    # why the server released this tab's run (shown on the next request)
        self.last_used = time.monotonic()
        self.active = 0                    # requests of this tab in progress (never dropped meanwhile)
        self.frame = FRAME_ALL             # the step view: the whole step, or one stage of the round (FRAMES)
        self.show_pruned = False           # the tree view also draws the candidates the pruner dropped

    def __deepcopy__(self, memo: dict) -> "TabState":
        return self  # gr.State deep-copies initial values; each tab's instance is built fresh by TabState()

    def request_stop(self) -> None:
        self.stopped_at = time.monotonic()

    def stop_requested_since(self, t: float) -> bool:
        """True when Stop was pressed at or after monotonic time ``t`` (a request's queue time)."""
        return self.stopped_at >= t

    def nbytes(self) -> int:
        """Estimated memory this tab holds between requests: its run's traces and its step-once engines."""
        n = self.step_session.nbytes() if self.step_session is not None else 0
        if self.record is not None and (self.step_session is None or self.record is not
                                        self.step_session.comparison.record):
            n += self.record.nbytes()
        return n

    def close_step_session(self) -> None:
        if self.step_session is not None:
            self.step_session.close()
            self.step_session = None

    def drop(self, reason: str) -> None:
        """Free the run and the step-once session (the tab stays usable); ``reason`` is shown next time."""
        self.request_stop()
        self.close_step_session()
        self.record = None
        self.dropped = reason

    def release(self) -> None:
        self.request_stop()
        self.close_step_session()
        self.record = None
        if self.export_dir:
            shutil.rmtree(self.export_dir, ignore_errors=True)
            self.export_dir = None
        self.released = True


def _release_tab(tab: Any) -> None:
    if isinstance(tab, TabState):
        tab.release()


# ---------------------------------------------------------------------------------------------- the page
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
    eagle3_total_token: gr.Slider
    eagle3_depth: gr.Slider
    eagle3_top_k: gr.Slider
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
#: the step view: the whole step, or one stage of the round (dart_core.ui.teaching.round_frames keys)
FRAME_ALL = "all"
FRAMES = [("Whole step", FRAME_ALL)] + [(f"{i} · {key}", key) for i, key in enumerate(teaching_round.FRAME_KEYS, 1)]
FRAME_KEYS = [k for _, k in FRAMES]
#: the what-if's draft cost (x one plain step) before a run has measured one
WHATIF_DRAFT_RATIO = 0.1


def _fmt_metrics(m, name: str, run, baseline: str) -> str:
    if run.error:
        return f"⚠ **{label_of(name)} failed:** {run.error}"
    tps = f"**{m.tokens_per_s:.1f} tok/s**" if m.tokens_per_s else "— tok/s"
    tau = f"τ {m.tau:.2f}" if m.tau is not None else "τ —"
    if name == baseline:
        speed = "baseline (1.00×)"
    else:
        speed = f"**{m.speedup:.2f}×** vs baseline" if m.speedup else "speedup —"
    icon = {"identical": "✓", "same so far": "…", "differs": "⚠", "pending": "…"}.get(m.lossless, "–")
    state = "" if not run.done else f" · stopped by {run.stop_reason}"
    return (f"{tps} · {tau} · {speed} · {m.tokens} tokens in {m.steps} steps{state}  \n"
            f"{icon} lossless check: {m.lossless_text}")


def _slider(name: str, tree_config: Any = None, *, interactive: bool | None = None) -> gr.Slider:
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


def _fmt_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} GiB"


def _empty_fig(message: str):
    import plotly.graph_objects as go
    fig = go.Figure()
    fig.add_annotation(text=message, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                       font=dict(color="#555555"))
    fig.update_layout(xaxis=dict(visible=False), yaxis=dict(visible=False), height=220, plot_bgcolor="#FFFFFF",
                      margin=dict(l=20, r=20, t=30, b=20))
    return fig


def _shown_step(run, position: int, latest: bool) -> int | None:
    """Index of the step of ``run`` the step view shows: the one that produced answer token ``position``, or
    with ``latest`` the last one (step-once mode); None when no step did (the prefill's token, or past the end)."""
    return len(run.traces) - 1 if latest else step_for_token(run.traces, position)


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


#: The page's linking script (a gr.HTML's js_on_load, so it runs wherever the page is served): hovering a node of
#: a draft tree outlines the answer token it stands for. A tree figure's layout.meta says which answer element
#: each answer position starts at (Visualiser._linked); its markers' customdata is [kind, index, position].
LINK_JS = """
const bound = new WeakSet();
function tokenEls(engine) { return document.querySelectorAll('#answer-' + engine + ' .token'); }
function clear() { document.querySelectorAll('.token.dart-linked').forEach(e => e.classList.remove('dart-linked')); }
function bind(gd) {
  if (bound.has(gd) || typeof gd.on !== 'function') return;
  bound.add(gd);
  gd.on('plotly_hover', ev => {
    clear();
    const meta = (gd.layout && gd.layout.meta) || {};
    const pt = ev && ev.points && ev.points[0];
    const cd = pt && pt.customdata;
    if (!meta.engine || !Array.isArray(cd) || cd.length < 3) return;
    const first = (meta.token_elements || {})[String(cd[2])];
    const el = first === undefined ? null : tokenEls(meta.engine)[first];
    if (el) { el.classList.add('dart-linked'); el.scrollIntoView({block: 'nearest'}); }
  });
  gd.on('plotly_unhover', clear);
}
function scan() { document.querySelectorAll('[id^="tree-"] .js-plotly-plot').forEach(bind); }
new MutationObserver(scan).observe(document.body, {childList: true, subtree: true});
scan();
"""
LINK_CSS = ".token.dart-linked { outline: 3px solid #E69F00; outline-offset: 1px; }"


class Visualiser:
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
        self._tabs: dict[str, TabState] = {}     # session hash -> tab, so an unload can release it at once
        self._held: dict[int, TabState] = {}     # tabs that may hold memory, least recently used first
        self._tabs_lock = threading.Lock()
        gpu = space.gpu_decorator()  # spaces.GPU on a Space with ZeroGPU's package: the handlers that run engines
        self._run_ui, self._step_ui = gpu(self._run_ui), gpu(self._step_ui)
        self.demo = self._build()

    # ------------------------------------------------------------------ helpers
    def _remember(self, tab: TabState, request: gr.Request | None) -> None:
        sid = getattr(request, "session_hash", None) if request is not None else None
        if sid:
            with self._tabs_lock:
                self._tabs[sid] = tab

    def _on_unload(self, request: gr.Request) -> None:
        """The tab closed: free its caches now (Gradio itself keeps closed tabs' state for an hour)."""
        with self._tabs_lock:
            tab = self._tabs.pop(getattr(request, "session_hash", None) or "", None)
            if tab is not None:
                self._held.pop(id(tab), None)
        if tab is not None:
            tab.release()

    def _on_state_deleted(self, tab: Any) -> None:
        """gr.State's delete callback (time-to-live expired or session evicted)."""
        _release_tab(tab)
        with self._tabs_lock:
            for sid in [k for k, v in self._tabs.items() if v is tab]:
                del self._tabs[sid]
            self._held.pop(id(tab), None)

    def _touch(self, tab: TabState) -> None:
        """``tab`` was just used: last in the least-recently-used order of the memory budget."""
        tab.last_used = time.monotonic()
        tab.dropped = None
        with self._tabs_lock:
            self._held.pop(id(tab), None)
            self._held[id(tab)] = tab

    def _fit_memory(self, current: TabState | None = None) -> int:
        """Keep the tabs' memory within ``limits.session_memory_bytes``: drop the runs and step-once sessions
        of the least recently used tabs (never ``current``, never one with a request in progress) until the
        total fits. Returns the estimated bytes all tabs hold afterwards."""
        budget = self.limits.session_memory_bytes
        with self._tabs_lock:
            tabs = list(self._held.values())
        sizes = {id(t): t.nbytes() for t in tabs}
        total = sum(sizes.values())
        for t in tabs:
            if total <= budget:
                break
            if t is current or t.active or not sizes[id(t)]:
                continue
            t.drop(f"this tab's run was released to keep the server within its memory budget for open tabs "
                   f"({_fmt_bytes(budget)}, `session_memory_bytes`; the least recently used tab goes first)")
            total -= sizes[id(t)]
            with self._tabs_lock:
                self._held.pop(id(t), None)
        with self._tabs_lock:
            for t in tabs:
                if not sizes[id(t)] and t is not current and not t.active:
                    self._held.pop(id(t), None)   # holds nothing: no need to track it
        return total

    def _queued_at(self) -> float:
        """time.monotonic() when the request being handled entered Gradio's queue (now when it did not go
        through the queue, e.g. a direct call). A Stop pressed after this moment stops the request, even
        one pressed while it still waited in the queue."""
        try:
            from gradio.context import LocalContext
            event_id = LocalContext.event_id.get(None)
            queue = getattr(self.demo, "_queue", None)
            event = queue.event_ids_to_events.get(event_id) if event_id and queue is not None else None
            if event is not None:
                return float(event.enqueue_time)
        except Exception:  # noqa: BLE001 - Gradio internals changed: fall back to the request's start
            logger.debug("no queue time for this request", exc_info=True)
        return time.monotonic()

    def _settings(self, values: tuple) -> RunSettings:
        """RunSettings from the page's values (SETTING_NAMES order; without the tree mode: the page's default).
        With automatic trees the size sliders are checked but not applied: the chooser sets those knobs."""
        named = dict(zip(SETTING_NAMES, values))
        if named.get("tree") in (None, ""):
            named["tree"] = self.default_tree
        settings = RunSettings.from_values(**named)
        if settings.tree == "auto":
            for name in SIZE_KNOBS:
                setattr(settings, name, None)
        return settings

    # ------------------------------------------------------------------ cost of a tree
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
                self._dart_rates = rates
                others = {label_of(s): autos[s].rates()[0]["label"] for s in self.view_slots
                          if s != "dart" and s in autos}
                out = {self.cost_text: viz_cost.tree_cost_text(costs, rates, others=others,
                                                          kernel=gemm_paths()["gemm_path"]),
                       self.cost_verify_plot: viz_cost.verify_cost_figure(costs),
                       self.cost_rate_plot: (viz_cost.budget_rate_figure(rates) if rates
                                             else _empty_fig("DART is not loaded: no budget to weigh")),
                       self.preset_note: self.preset_text(rates=rates)}
            except Exception as exc:  # noqa: BLE001 - the rest of the page works without this view
                logger.exception("the cost-of-a-tree view failed")
                why = f"{type(exc).__name__}: {exc}"
                out = {self.cost_text: f"⚠ The cost view could not be drawn ({why}; details in the server log).",
                       self.cost_verify_plot: _empty_fig("no cost model"),
                       self.cost_rate_plot: _empty_fig("no cost model"),
                       self.preset_note: self.preset_text()}
            self._cost_view = out
        return out

    def cost_view(self) -> dict:
        """The last drawing of the *Cost of a tree* view (drawn now if there is none yet): for page loads. On
        ZeroGPU a GPU is attached only while a request runs, so there the first run draws it."""
        view = self._cost_view
        if view is None and space.on_zerogpu():
            return {self.cost_text: "The cost of a tree on this machine is measured at the first run.",
                    self.cost_verify_plot: _empty_fig("run a prompt to measure the cost of a tree"),
                    self.cost_rate_plot: _empty_fig("run a prompt to measure the cost of a tree"),
                    self.preset_note: self.preset_text()}
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
            point["label"] = f"{run.label} (this run)"
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
            fig = teaching_whatif.whatif_figure(measured=shown or None)
            if whatif is not None:
                text = teaching_whatif.whatif_text(whatif["alpha"], whatif["verify_ratio"], whatif["draft_ratio"],
                                            whatif["depth"])
            elif points:
                p0 = points[0]
                text = (f"**{p0['label']}:** " + teaching_whatif.whatif_text(p0["alpha"], p0["verify_ratio"],
                                                                        p0["draft_ratio"], p0.get("depth", 4)))
            else:
                text = "Run a prompt to place this machine's measured point on the map."
        except Exception as exc:  # noqa: BLE001 - the rest of the page works without this panel
            logger.exception("the why panel failed")
            fig, text = _empty_fig("no cost model"), f"⚠ This panel could not be drawn ({type(exc).__name__}: {exc})."
        return {self.why_plot: fig, self.why_text: text}

    def whatif_changed(self, tab: TabState | None, alpha: float, verify_ratio: float, depth: float) -> dict:
        """The what-if sliders moved: place that point on the map."""
        record = tab.record if isinstance(tab, TabState) else None
        return self.render_why(record, {"alpha": float(alpha), "verify_ratio": float(verify_ratio),
                                        "depth": int(depth)})

    def _tree_note(self, mode: str) -> str:
        e = self.factory.eagle3_tree_base
        engines = ["DART's budget" if "dart" in self.available else None,
                   "EAGLE-3's total tokens, depth and top-k" if "eagle3" in self.available else None]
        sizes = " and ".join(x for x in engines if x) or "the tree sizes"
        if mode == "auto":
            return (f"**Tree size: auto.** {sizes[0].upper() + sizes[1:]} are chosen every few steps from this "
                    "machine's measured verify cost and the head's expected acceptance (see *Cost of a tree* "
                    "below), so **the size sliders are not applied** (greyed out); the other tree settings are.")
        return (f"**Tree size: fixed.** The sliders apply as set (by default the paper's trees: DART budget "
                f"{self.factory.dart_pruning.budget}, EAGLE-3 {e.total_token} total tokens, depth {e.depth}, "
                f"top-k {e.top_k}).")

    def tree_mode_changed(self, mode: str) -> dict:
        """The tree-mode control moved: say what applies, and grey out the size sliders in auto mode."""
        mode = mode if mode in TREE_MODES else self.default_tree
        out: dict = {self.tree_note: self._tree_note(mode)}
        for name in SIZE_KNOBS:
            out[getattr(self.controls, name)] = gr.Slider(interactive=mode != "auto")
        return out

    def _encode(self, prompt: str, settings: RunSettings) -> tuple[list[int], str | None]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("the prompt is empty: type a question or pick an example")
        ids = encode_chat(self.target.tokenizer, self.template, [{"role": "user", "content": prompt}])
        warn = check_prompt_length(len(ids), self.args.max_length, settings.max_new_tokens)
        return ids, warn

    def _config(self, settings: RunSettings):
        return settings.generation_config(self.args.max_length, max_new_tokens_limit=self.max_new_tokens)

    def _meta(self, settings: RunSettings) -> dict[str, Any]:
        return {"target": self.target.name, "dtype": dtype_name(self.target.dtype),
                "device": str(self.target.device), "settings": settings.to_dict(),
                "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    # ------------------------------------------------------------------ rendering (one path: live and replay)
    def render_answers(self, record: RunRecord | None) -> dict:
        out: dict = {}
        metrics = record.metrics() if record is not None else {}
        for s in self.shown:
            if record is None or s not in record.runs:
                out[self.answer[s]] = []
                out[self.metrics[s]] = self._unavailable_text(s) if s in self.factory.unavailable else ""
                continue
            run = record.runs[s]
            out[self.answer[s]] = record.spans(s)
            out[self.metrics[s]] = _fmt_metrics(metrics[s], s, run, record.baseline)
        return out

    def _unavailable_text(self, slot: str) -> str:
        return f"⚠ **{label_of(slot)} is unavailable** (see the note at the top of the page for how to add it)."

    def render_step_views(self, record: RunRecord | None, position: float | int | None,
                          latest: bool = False, frame: str = FRAME_ALL, show_pruned: bool = False) -> dict:
        """Tree, score scatter and narration per speculative engine for the step that produced answer
        token ``position`` (``latest``: each engine's last step, for step-once mode). ``frame``: the whole step,
        or one stage of the round (FRAMES: drafted, pruned, checked, accepted, committed) with its sentence;
        ``show_pruned``: the tree also draws the candidates the pruner dropped, faded, where they would hang."""
        out: dict = {}
        for s in self.view_slots:
            run = record.runs.get(s) if record is not None else None
            if run is None or not run.traces:
                why = (f"{label_of(s)} is unavailable: see the note at the top of the page."
                       if s in self.factory.unavailable else "Run a prompt (or step once) to see its steps.")
                out[self.tree_plot[s]] = _empty_fig(why)
                out[self.scatter_plot[s]] = _empty_fig("no step yet")
                out[self.step_text[s]] = why
                continue
            pos = int(position or 0)
            k = _shown_step(run, pos, latest)
            if k is None:
                if pos == 0:
                    msg = f"Token 0 came from the prefill (the target's first token), before any {run.label} step."
                else:
                    msg = f"{run.label} produced only {len(run.tokens)} tokens; token {pos} is past its answer."
                out[self.tree_plot[s]] = _empty_fig(msg)
                out[self.scatter_plot[s]] = _empty_fig(msg)
                out[self.step_text[s]] = msg
                continue
            st = run.traces[k]
            chosen = run.tree_label(k)   # the automatic tree's setting for this step (None: a fixed tree)
            auto = f" (auto: {chosen})" if chosen else ""
            score_label = "combined score" if s == "dart" else ("cumulative log-prob" if s == "eagle3" else None)
            text = narrate_step(st, record.decode, s).text
            if chosen:
                text = (f"*Tree size (auto): **{chosen}**, the setting with the most expected tokens per second "
                        f"by this machine's costs and the head's acceptance so far.*\n\n{text}")
            if frame in FRAME_KEYS and frame != FRAME_ALL:
                frames = teaching_round.round_frames(st, record.decode, engine=s, score_label=score_label)
                i = next((j for j, f in enumerate(frames) if f.key == frame), 0)
                fig = frames[i].figure
                text = (f"**Stage {i + 1} of {len(frames)}: {frames[i].title}.** {frames[i].sentence}\n\n"
                        f"<details><summary>The whole step in words</summary>\n\n{text}\n</details>")
            else:
                # short lines: a tree column is a third of an 800 px window
                sub = f"{st.accepted_drafts} of {st.tree.num_drafted} drafts accepted + 1 target token"
                fig = viz_tree.tree_figure(st, record.decode, score_label=score_label, show_pruned=show_pruned,
                                      title=dict(text=f"{run.label} step {st.step}",
                                                 subtitle=dict(text=sub + (f"<br>tree{auto}" if chosen else ""))))
            out[self.tree_plot[s]] = self._linked(fig, s, record, st)
            out[self.scatter_plot[s]] = viz_tree.score_scatter(st, record.decode, score_label=score_label,
                                                          title=f"{run.label} step {st.step}: every scored candidate")
            out[self.step_text[s]] = text
        return out

    def _linked(self, fig, engine: str, record: RunRecord, st) -> Any:
        """Tell the page's hover script (LINK_JS) which answer token each tree node stands for: the figure's
        ``layout.meta`` maps answer positions near this step to the index of their first element in the
        answer box (the box draws a token as one element per non-empty line, none for a bare newline)."""
        spans = record.spans(engine)
        first, elements = {}, 0
        hi = int(st.position) + int(max(st.tree.depths, default=0)) + 2
        for i, (text, _) in enumerate(spans[:hi]):
            n = sum(1 for piece in str(text).split("\n") if piece)
            if i >= int(st.position) - 1 and n:
                first[str(i)] = elements
            elements += n
        fig.update_layout(meta={"engine": engine, "token_elements": first})
        return fig

    def render_timing(self, record: RunRecord | None, marks: dict[str, int] | None = None):
        """The stage-timing chart; ``marks``: engine label -> the step the step view shows (marked)."""
        if record is None or not any(r.traces for r in record.runs.values()):
            return _empty_fig("run a prompt to see stage timings")
        return viz_steps.timing_figure({r.label: r.traces for r in record.runs.values() if r.traces}, mark=marks or None)

    def _marks(self, record: RunRecord | None, position: float | int | None, latest: bool = False) -> dict[str, int]:
        """Engine label -> the step number the step view shows for answer token ``position``."""
        marks: dict[str, int] = {}
        if record is None:
            return marks
        for s in self.view_slots:
            run = record.runs.get(s)
            if run is None or not run.traces:
                continue
            k = _shown_step(run, int(position or 0), latest)
            if k is not None:
                marks[run.label] = int(run.traces[k].step)
        return marks

    def render_summary(self, record: RunRecord | None, position: int | None = None, latest: bool = False) -> dict:
        out: dict = {}
        if record is None or not any(r.traces for r in record.runs.values()):
            out[self.timing_plot] = _empty_fig("run a prompt to see stage timings")
            for s in self.view_slots:
                    for p in self.acc_plots[s]:
                        out[p] = _empty_fig("run a prompt to see acceptance")
            out[self.slider] = gr.Slider(minimum=0, maximum=1, value=0)
            return out
        out[self.timing_plot] = self.render_timing(record, self._marks(record, position, latest))
        for s in self.view_slots:
            run = record.runs.get(s)
            if run is None or not run.traces:
                for p in self.acc_plots[s]:
                    out[p] = _empty_fig(f"{label_of(s)}: no steps")
                continue
            figs = viz_steps.acceptance_figures(run.traces, name=run.label)
            for p, f in zip(self.acc_plots[s], figs):
                out[p] = f
        top = max(record.max_position(), 1)
        out[self.slider] = gr.Slider(minimum=0, maximum=top, value=min(self._default_position(record)
                                                                       if position is None else position, top))
        return out

    @staticmethod
    def _default_position(record: RunRecord) -> int:
        """First token of the first speculative engine's longest step: an interesting step to start on."""
        for s in record.speculative:
            tr = record.runs[s].traces
            if tr:
                best = max(tr, key=lambda st: (st.acceptance_length, -st.step))
                return int(best.position)
        return 1

    def render_all(self, record: RunRecord | None, position: int | None = None, latest: bool = False,
                   tab: TabState | None = None) -> dict:
        out = self.render_answers(record)
        pos = position
        if pos is None and record is not None:
            pos = self._default_position(record)
        out.update(self.render_summary(record, pos, latest))
        frame, pruned = (tab.frame, tab.show_pruned) if tab is not None else (FRAME_ALL, False)
        out.update(self.render_step_views(record, pos, latest=latest, frame=frame, show_pruned=pruned))
        out[self.frame] = frame
        out[self.show_pruned] = pruned
        out.update(self.render_why(record))
        return out

    # ------------------------------------------------------------------ handlers
    def run(self, tab: TabState | None, prompt: str, *values, request: gr.Request | None = None) -> Iterator[dict]:
        """Stream all engines side by side; redraw the answers while running, everything at the end.

        The run stops within one step when Stop is pressed (one pressed while the run still waited in the queue
        stops it before any engine work), when it reaches ``limits.run_time_limit_s``, or when its traces alone
        outgrow ``limits.session_memory_bytes``; the page names the limit that stopped it."""
        queued_at = self._queued_at()
        tab = tab if isinstance(tab, TabState) else TabState()
        self._remember(tab, request)
        if tab.stop_requested_since(queued_at):
            yield {self.tab: tab, self.status: STOPPED_IN_QUEUE.format(what="run")}
            return
        tab.active += 1
        try:
            yield from self._run(tab, prompt, values, queued_at)
        finally:
            tab.active -= 1

    def _run(self, tab: TabState, prompt: str, values: tuple, queued_at: float) -> Iterator[dict]:
        self._touch(tab)
        tab.close_step_session()  # a full run replaces a half-stepped one
        tab.frame = FRAME_ALL     # a run shows whole steps; step once shows a round stage by stage
        try:
            settings = self._settings(values)
            config = self._config(settings)
            ids, warn = self._encode(prompt, settings)
            lease = self.factory.checkout(settings)   # engines no other run holds (item: one run per engine)
        except ConfigError as exc:
            yield {self.tab: tab, self.status: f"⚠ **Cannot run:** {exc}"}
            return
        cmp = Comparison(lease.engines, ids, config, decode=self.target.tokenizer, prompt=prompt,
                         meta=self._meta(settings), lease=lease)
        tab.record = cmp.record
        limit_s = self.limits.run_time_limit_s
        started = time.monotonic()
        checked = [float("-inf")]

        def why_stop() -> str | None:
            if tab.stop_requested_since(queued_at):
                return "stopped"
            now = time.monotonic()
            if limit_s is not None and now - started >= limit_s:
                return TIME_LIMIT
            if now - checked[0] >= MEMORY_CHECK_S:
                checked[0] = now
                if self._fit_memory(tab) > self.limits.session_memory_bytes:
                    return MEMORY_LIMIT
            return None

        note = f" ({warn})" if warn else ""
        cap = f" Runs on this server stop after {limit_s:g} s." if limit_s is not None else ""
        running = (f"Running {', '.join(label_of(n) for n in cmp.engines)} in turn on one clock "
                   f"(prompt: {len(ids)} tokens){note}. **Stop** takes effect within one step.{cap}")
        try:
            yield {self.tab: tab, self.status: running, **self.render_answers(cmp.record)}
            last = time.perf_counter()
            try:
                for _ in cmp.run(stop=why_stop):
                    if time.perf_counter() - last >= UI_INTERVAL_S:
                        yield {self.status: running, **self.render_answers(cmp.record)}
                        last = time.perf_counter()
            except Exception as exc:  # noqa: BLE001 - show it in the page; the server keeps serving
                logger.exception("run failed")
                cmp.stop("error")
                yield {self.tab: tab, self.status: f"⚠ **Internal error:** {type(exc).__name__}: {exc} "
                                                   "(details in the server log)",
                       **self.render_all(cmp.record, tab=tab)}
                return
        finally:
            cmp.close()   # a run closed early (the visitor left) gives its engines back too
        self._fit_memory(tab)
        reasons = {r.stop_reason for r in cmp.record.runs.values()}
        busy = sum(r.busy_s for r in cmp.record.runs.values())
        failed = [r for r in cmp.record.runs.values() if r.error]
        if TIME_LIMIT in reasons:
            head = (f"⏱ **Stopped by the time limit:** a run on this server may take {limit_s:g} s "
                    "(`run_time_limit_s`); lower *Max new tokens* or the tree sizes for a complete answer.")
        elif MEMORY_LIMIT in reasons:
            head = (f"**Stopped by the memory limit:** this run's traces outgrew the "
                    f"{_fmt_bytes(self.limits.session_memory_bytes)} this server keeps for open tabs "
                    "(`session_memory_bytes`; every scored candidate is kept); lower *Max new tokens* or the "
                    "tree sizes.")
        elif "stopped" in reasons:
            head = "**Stopped.**"
        else:
            head = "✓ **Done.**"
        if failed:   # never "Done" over a failed engine: name it and say what the visitor can do
            names = " and ".join(r.label for r in failed)
            rest = ("no engine finished; " if len(failed) == len(cmp.record.runs)
                    else "the other engines' answers are complete; " if head == "✓ **Done.**" else "")
            fail = (f"⚠ **{names} failed** ({'; '.join(f'{r.label}: {r.error}' for r in failed)}): {rest}"
                    "press **Run** to try again; if it fails again, try other settings (a fixed tree size, fewer "
                    "new tokens); the server log has the details.")
            head = fail if head == "✓ **Done.**" else f"{head} {fail}"
        status = head + f" Engine time {busy:.2f} s in all.{note}"
        status += " Move the **answer token position** slider to inspect the step that produced each token."
        if settings.tree == "auto" and self.view_slots:
            status += " Tree sizes were chosen automatically (see *Cost of a tree*)."
        self.note_engines(cmp.engines)   # their AutoTrees learned from this run: the cost view shows them
        self._note_preset_run(settings, cmp.record)
        yield {self.tab: tab, self.status: status, **self.render_all(cmp.record, tab=tab), **self.render_costs()}

    def step_once(self, tab: TabState | None, prompt: str, *values, request: gr.Request | None = None) -> dict:
        """Advance every engine by one speculative round and narrate it; starts a new session when the
        prompt or settings changed or the last one finished. A Stop pressed while the step waited in the
        queue cancels it."""
        queued_at = self._queued_at()
        tab = tab if isinstance(tab, TabState) else TabState()
        self._remember(tab, request)
        if tab.stop_requested_since(queued_at):
            return {self.tab: tab, self.status: STOPPED_IN_QUEUE.format(what="step")}
        tab.active += 1
        try:
            return self._step_once(tab, prompt, values)
        finally:
            tab.active -= 1

    def _step_once(self, tab: TabState, prompt: str, values: tuple) -> dict:
        self._touch(tab)
        try:
            settings = self._settings(values)
            config = self._config(settings)
            ids, warn = self._encode(prompt, settings)
            key = (tuple(ids), repr(settings.to_dict()))
            sess = tab.step_session
            fresh = sess is None or sess.key != key or sess.done
            if fresh:
                tab.close_step_session()
                sess = tab.step_session = StepSession(self.factory, settings, ids, config, prompt=prompt,
                                                      meta=self._meta(settings))
        except ConfigError as exc:
            return {self.tab: tab, self.status: f"⚠ **Cannot step:** {exc}"}
        sess.step()
        tab.record = sess.comparison.record
        tab.frame = FRAME_KEYS[1]   # each round starts at its first stage: the drafted candidates
        self._fit_memory(tab)
        done = (" All engines finished; the next click starts over." if sess.done else
                " Before the next click, predict: how many of the head's drafted tokens will the target accept?")
        status = (f"**Step-once mode**, round {sess.rounds}: each engine made one speculative step "
                  f"(the first round includes the prefill).{done} Click **Next stage ▶** under the step view to "
                  "walk through the round: drafted, pruned, checked, accepted, committed.")
        if warn:
            status += f" ({warn})"
        out = {self.tab: tab, self.status: status, **self.render_all(sess.comparison.record, latest=True, tab=tab),
               **self.render_costs()}
        latest = [sess.comparison.record.runs[s].traces[-1].position for s in self.view_slots
                  if s in sess.comparison.record.runs and sess.comparison.record.runs[s].traces]
        if latest:
            out[self.slider] = gr.Slider(minimum=0, maximum=max(sess.comparison.record.max_position(), 1),
                                         value=latest[0])
        return out

    def show_step(self, tab: TabState | None, position: float) -> dict:
        record = tab.record if isinstance(tab, TabState) else None
        if record is not None:
            self._touch(tab)    # a tab being looked at is not the least recently used one
        frame, pruned = (tab.frame, tab.show_pruned) if isinstance(tab, TabState) else (FRAME_ALL, False)
        out = self.render_step_views(record, position, frame=frame, show_pruned=pruned)
        out[self.timing_plot] = self.render_timing(record, self._marks(record, position))
        if record is None and isinstance(tab, TabState) and tab.dropped:
            for s in self.view_slots:
                out[self.step_text[s]] = f"⚠ {tab.dropped[0].upper()}{tab.dropped[1:]}. Run the prompt again."
        return out

    def select_token(self, tab: TabState | None, position: int) -> dict:
        """A token of an answer was clicked: every engine shows the step that produced answer token
        ``position`` (the slider moves there too)."""
        record = tab.record if isinstance(tab, TabState) else None
        top = max(record.max_position(), 1) if record is not None else 1
        pos = min(max(int(position), 0), top)
        return {self.slider: gr.Slider(minimum=0, maximum=top, value=pos), **self.show_step(tab, pos)}

    def _select_token_ui(self, tab: TabState | None, evt: gr.SelectData) -> dict:
        index = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        return self.select_token(tab, int(index or 0))

    def view_changed(self, tab: TabState | None, position: float, frame: str, show_pruned: bool) -> dict:
        """The step view's stage or its *show pruned candidates* box changed: redraw the step views."""
        if isinstance(tab, TabState):
            tab.frame = frame if frame in FRAME_KEYS else FRAME_ALL
            tab.show_pruned = bool(show_pruned)
        return self.show_step(tab, position)

    def next_frame(self, tab: TabState | None, position: float, frame: str) -> dict:
        """*Next stage*: the round's next stage (after the last, the whole step; from the whole step, stage 1)."""
        i = FRAME_KEYS.index(frame) if frame in FRAME_KEYS else 0
        nxt = FRAME_KEYS[(i + 1) % len(FRAME_KEYS)]
        show_pruned = tab.show_pruned if isinstance(tab, TabState) else False
        return {self.frame: nxt, **self.view_changed(tab, position, nxt, show_pruned)}

    # ------------------------------------------------------------------ tree presets
    def _paper_values(self) -> dict[str, float]:
        """The paper's trees: every tree knob at its base config value (DART budget 60, EAGLE-3 60 / 7 / 10)."""
        base = {"dart": self.factory.dart_pruning, "eagle3": self.factory.eagle3_tree_base}
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
        out = {self.controls.tree: mode, **self.tree_mode_changed(mode)}
        if name == "paper":
            for knob, value in self._paper_values().items():
                out[getattr(self.controls, knob)] = gr.Slider(value=value, interactive=True)
        out[self.preset_note] = self.preset_text(selected=name)
        return out

    def _note_preset_run(self, settings: RunSettings, record: RunRecord) -> None:
        """Remember a finished run's speed under its preset, for the presets' note."""
        preset = self.preset_of(settings)
        if preset is None:
            return
        metrics = record.metrics()
        speeds = {record.runs[s].label: (metrics[s].speedup, metrics[s].tau) for s in record.speculative
                  if s in metrics and metrics[s].speedup and not record.runs[s].error}
        if speeds:
            self._preset_runs[preset] = {"speeds": speeds, "tokens": max(m.tokens for m in metrics.values())}

    def preset_text(self, selected: str | None = None, rates: Any = None) -> str:
        """Each preset's speed on this machine: measured by the latest run on this server with that preset (vs
        the vanilla baseline of the same run), and DART's expected speed by the cost and acceptance models."""
        rates = rates if rates is not None else self._dart_rates
        lines = []
        for key, label in PRESETS.items():
            mark = "▶ " if key == selected else ""
            run = self._preset_runs.get(key)
            if run:
                speeds = ", ".join(f"{name} **{sp:.2f}×** (τ {tau:.2f})" if tau is not None else
                                   f"{name} **{sp:.2f}×**" for name, (sp, tau) in run["speeds"].items())
                measured = f"measured here: {speeds} vs vanilla ({run['tokens']} tokens, last run)"
            else:
                measured = "not run on this server yet: press **Run** to measure it"
            expected = _expected_dart(rates, key)
            lines.append(f"{mark}**{label}**: {measured}{'; ' + expected if expected else ''}.")
        return "  \n".join(lines)

    def stop(self, tab: TabState | None) -> str:
        if isinstance(tab, TabState):
            tab.request_stop()
            return ("**Stopping:** a running run stops after its current step; a run or step still waiting in "
                    "the queue will not start.")
        return "Nothing is running."

    def clear(self, tab: TabState | None) -> dict:
        if isinstance(tab, TabState):
            tab.request_stop()
            tab.close_step_session()
            tab.record = None
        out = {self.prompt: "", self.status: "Cleared.", self.export_file: None, **self.render_all(None)}
        return out

    def export(self, tab: TabState | None) -> dict:
        record = tab.record if isinstance(tab, TabState) else None
        if record is None or not any(r.tokens for r in record.runs.values()):
            return {self.status: "⚠ Nothing to export yet: run a prompt (or step once) first.",
                    self.export_file: None}
        if tab.export_dir is None:
            tab.export_dir = tempfile.mkdtemp(prefix="dart-demo-export-")
        for old in Path(tab.export_dir).glob("*.json"):   # a tab keeps only its latest export
            old.unlink(missing_ok=True)
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        path = save_export(record, Path(tab.export_dir) / f"dart-run-{stamp}.json")
        size = path.stat().st_size
        status = (f"Exported {sum(len(r.traces) for r in record.runs.values())} steps ({size / 1e6:.1f} MB). "
                  "Load the file under *Replay* on any machine, no model needed.")
        too_big = self.limits.replay_problem(record)
        if size > self.limits.max_upload_bytes:
            too_big = (f"the file is larger than the {_fmt_bytes(self.limits.max_upload_bytes)} this server "
                       "accepts under *Replay* (`max_upload_bytes`)")
        if too_big:
            status += f" ⚠ It will not replay here: {too_big}."
        return {self.export_file: str(path), self.status: status}

    def replay(self, tab: TabState | None, file: Any, request: gr.Request | None = None) -> dict:
        tab = tab if isinstance(tab, TabState) else TabState()
        self._remember(tab, request)
        if file is None:
            return {self.tab: tab, self.status: "Choose an exported trace file (.json) to replay."}
        path = Path(getattr(file, "name", file))
        try:
            record = RunRecord.from_export(path)
        except (OSError, ValueError) as exc:
            return {self.tab: tab, self.status: f"⚠ **Cannot replay {path.name}:** {exc}"}
        too_big = self.limits.replay_problem(record)
        if too_big:
            return {self.tab: tab, self.status: f"⚠ **Cannot replay {path.name}:** {too_big}."}
        tab.request_stop()
        tab.close_step_session()
        tab.record = record
        self._touch(tab)
        self._fit_memory(tab)
        meta = record.meta
        status = (f"**Replaying** a recorded run: target `{meta.get('target', '?')}` ({meta.get('dtype', '?')} on "
                  f"{meta.get('device', '?')}), recorded {meta.get('recorded_at', '?')}. Prompt: "
                  f"*{record.prompt[:200]}*")
        missing = [label_of(s) for s in record.runs if s not in self.shown]
        if missing:
            status += f" (engines this page has no column for: {', '.join(missing)})"
        return {self.tab: tab, self.status: status, **self.render_all(record, tab=tab)}

    # Gradio injects gr.Request only into positional parameters, so the wired handlers take it first.
    def _run_ui(self, request: gr.Request, tab: TabState | None, prompt: str, *values) -> Iterator[dict]:
        yield from self.run(tab, prompt, *values, request=request)

    def _step_ui(self, request: gr.Request, tab: TabState | None, prompt: str, *values) -> dict:
        return self.step_once(tab, prompt, *values, request=request)

    def _replay_ui(self, request: gr.Request, tab: TabState | None, file: Any) -> dict:
        return self.replay(tab, file, request=request)

    def queued(self) -> gr.Blocks:
        """The page with its queue: one engine request at a time (runs and steps share the engine slot), at most
        ``limits.queue_max_size`` waiting (Gradio refuses more, and shows each waiting visitor their place)."""
        return self.demo.queue(default_concurrency_limit=1, max_size=self.limits.queue_max_size)

    # ------------------------------------------------------------------ layout
    def _build(self) -> gr.Blocks:
        t = self.target
        # delete_cache: Gradio's copies of exported and uploaded files are deleted once older than
        # limits.file_ttl_s (a tab's own export folder goes when the tab is released)
        with gr.Blocks(title="DART speculative decoding visualiser", analytics_enabled=False,
                       delete_cache=self.limits.gradio_delete_cache()) as demo:
            # gr.State lists its delete_callback in the page config, which Gradio deep-copies on every page load
            # and /config request. A bound method there would drag this Visualiser (target weights, tokenizer)
            # into each copy: 1-5 s per page on a 2-core CPU, longer than launch()'s 3 s start-up probe waits.
            # copy.deepcopy keeps a plain function as it is, so the callback is one.
            on_state_deleted = self._on_state_deleted

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
                base_p = self.factory.dart_pruning
                base_e = self.factory.eagle3_tree_base
                with gr.Row():
                    max_new = gr.Slider(1, m, value=min(96, m), step=1, label="Max new tokens")
                    # every slider comes from dart_core.presets.KNOBS: the ranges RunSettings checks
                    temperature = _slider("temperature")
                    top_p = _slider("top_p")
                    top_k = _slider("top_k")
                auto = self.default_tree == "auto"
                with gr.Row(visible=bool(self.view_slots)):
                    tree_mode = gr.Radio(TREE_CHOICES, value=self.default_tree, label="Tree size",
                                         elem_id="tree-mode", scale=1, min_width=240)
                    self.tree_note = gr.Markdown(self._tree_note(self.default_tree), elem_id="tree-note")
                with gr.Row(visible="dart" in self.available):
                    budget = _slider("budget", base_p, interactive=not auto)
                    beam = _slider("beam_width", base_p)
                    level_k = _slider("level_top_k", base_p)
                    ngram_w = _slider("ngram_weight", base_p)
                with gr.Row(visible="eagle3" in self.available):
                    e_total = _slider("eagle3_total_token", base_e, interactive=not auto)
                    e_depth = _slider("eagle3_depth", base_e, interactive=not auto)
                    e_topk = _slider("eagle3_top_k", base_e, interactive=not auto)
            self.controls = Controls(self.prompt, max_new, temperature, top_p, top_k, budget, beam, level_k, ngram_w,
                                     e_total, e_depth, e_topk, tree_mode)
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
            gr.HTML("", js_on_load=LINK_JS, css_template=LINK_CSS, elem_id="link-script", container=False,
                    padding=False, apply_default_css=False)
            self.tree_plot: dict[str, gr.Plot] = {}
            self.scatter_plot: dict[str, gr.Plot] = {}
            self.step_text: dict[str, gr.Markdown] = {}
            with gr.Row(equal_height=False):
                for s in self.view_slots:
                    with gr.Column(min_width=420):   # narrower windows stack the engines
                        # plots show no Gradio label: the label's badge would cover the figure's own title
                        self.tree_plot[s] = gr.Plot(show_label=False, label=f"{label_of(s)}: draft tree",
                                                    elem_id=f"tree-{s}")
                        self.step_text[s] = gr.Markdown(elem_id=f"narration-{s}")
                        self.scatter_plot[s] = gr.Plot(show_label=False, label=f"{label_of(s)}: candidate scores",
                                                       elem_id=f"scores-{s}")
            gr.Markdown("### Stage timings\nEngine work only (draft forward, tree build, verify, commit). "
                        "Acceptance is not speedup: compare tokens per step with the cost of each step.")
            self.timing_plot = gr.Plot(show_label=False, label="Stage timings", elem_id="timing-plot")
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
                    self.acc_plots[s] = [gr.Plot(show_label=False, label=f"{label_of(s)}: {what}",
                                                 elem_id=f"acc-{s}-{i}", min_width=380)
                                         for i, what in enumerate(("acceptance length per step", "histogram",
                                                                   "acceptance per depth"))]
            with gr.Accordion("Export and replay", open=False):
                with gr.Row():
                    export_btn = gr.Button("Export traces (JSON)", elem_id="export-btn")
                    self.export_file = gr.File(label="Exported traces", interactive=False, elem_id="export-file")
                    replay_file = gr.File(label="Replay an exported trace file", file_types=[".json"],
                                          type="filepath", elem_id="replay-file")

            inputs = [self.tab] + self.controls.inputs()
            run_outputs = ([self.tab, self.status, self.slider, self.timing_plot]
                           + list(self.answer.values()) + list(self.metrics.values())
                           + list(self.tree_plot.values()) + list(self.scatter_plot.values())
                           + list(self.step_text.values()) + [p for ps in self.acc_plots.values() for p in ps]
                           + [self.cost_text, self.cost_verify_plot, self.cost_rate_plot, self.preset_note]
                           + [self.frame, self.show_pruned, self.why_plot, self.why_text])
            view_outputs = list(self.tree_plot.values()) + list(self.scatter_plot.values()) + list(
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
            for w in (why_alpha, why_ratio, why_depth):
                w.release(self.whatif_changed, [self.tab, why_alpha, why_ratio, why_depth],
                          [self.why_plot, self.why_text], api_name=False, show_progress="hidden")
            export_btn.click(self.export, [self.tab], [self.export_file, self.status], api_name="export")
            replay_file.upload(self._replay_ui, [self.tab, replay_file], run_outputs, api_name="replay")
            tree_mode.change(self.tree_mode_changed, [tree_mode],
                             [self.tree_note] + [getattr(self.controls, n) for n in SIZE_KNOBS], api_name=False,
                             queue=False, show_progress="hidden")
            demo.load(self.cost_view, None, [self.cost_text, self.cost_verify_plot, self.cost_rate_plot,
                                             self.preset_note], api_name=False, show_progress="hidden")
            demo.load(lambda: self.render_why(None), None, [self.why_plot, self.why_text], api_name=False,
                      show_progress="hidden")
            demo.unload(self._on_unload)
            self.run_event = run_evt
        return demo


def build_demo(target, args: argparse.Namespace, factory: EngineFactory | None = None,
               banner: str | None = None) -> gr.Blocks:
    """The page for a loaded target (engines from the flags in ``args``, or from ``factory``)."""
    return Visualiser(target, args, factory, banner).demo


def launch_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """launch() options: local only unless asked, SSR off (no Node server), nothing fetched from outside,
    uploads (Replay files) no larger than the serving limit ``max_upload_bytes``, and errors shown to the caller:
    Gradio refuses a value of the wrong type, a wrong number of inputs or a file path nobody uploaded before the
    handler runs, and without show_error an API caller learns only that "the app raised an exception"."""
    limits = serving_limits(listen=args.listen, share=args.share)
    return dict(server_name="0.0.0.0" if args.listen else "127.0.0.1", server_port=args.server_port,
                share=args.share, ssr_mode=False, max_file_size=limits.max_upload_bytes, show_error=True)


PAGE_WAIT_S = 120.0   # how long serve() waits for its own page to answer before it gives up
PAGE_OK = (200, 301, 302, 303, 307, 308, 401)   # the answers Gradio's own check accepts


def wait_for_page(url: str, timeout_s: float = PAGE_WAIT_S, bad_answers: int = 5) -> str | None:
    """Poll ``url`` with HEAD (as Gradio's start-up check does) until it answers: None once it did, else what
    went wrong. Gradio's check (networking.url_ok) gives up at the first 3-second timeout, which a fully loaded
    2-core machine can exceed on a healthy page; this one retries timeouts and refused connections until
    ``timeout_s`` and gives up after ``bad_answers`` answers that are not OK, so a page that never works still
    fails (localhost blocked by a proxy, a server that died)."""
    import httpx
    deadline = time.monotonic() + timeout_s
    problem, bad = "no answer", 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"the page at {url} did not answer within {timeout_s:.0f} s ({problem})"
        try:
            r = httpx.head(url, timeout=min(30.0, max(left, 1.0)))
            if r.status_code in PAGE_OK:
                return None
            bad += 1
            problem = f"HEAD answered {r.status_code}"
            if bad >= bad_answers:
                return f"the page at {url} answered {r.status_code} {bad} times"
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))


def serve(demo: gr.Blocks, args: argparse.Namespace, page_wait_s: float = PAGE_WAIT_S) -> None:
    """launch() the (queued) page and block until the server stops. Gradio's own reachability check is replaced
    by ``wait_for_page`` (same request, patient on a busy machine, still fails when the page never answers);
    with --share Gradio skips that check itself, and so does this."""
    import inspect
    kwargs = launch_kwargs(args)
    own_check = not args.share and "_frontend" in inspect.signature(demo.launch).parameters
    if own_check:
        kwargs["_frontend"] = False   # in Gradio 6 this flag gates only the url_ok() check
    demo.launch(**kwargs, prevent_thread_lock=True)
    if own_check:
        problem = wait_for_page(demo.local_url, page_wait_s)
        if problem:
            demo.close()
            raise SystemExit(f"error: {problem}. Check that nothing (an HTTP proxy setting, a firewall) keeps "
                             "this process from reaching localhost, or use --share.")
    demo.block_thread()


def main(argv: list[str] | None = None) -> None:
    from dart_core.models.heads.dart import DartHeadError
    from dart_core.models.loader import load_target
    from dart_core.ui.startup import cost_summary, startup_summary, warm_up

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    banner = None
    if argv is None and space.on_space():  # Spaces passes no flags: the launch settings of spaces_config.yaml
        import torch
        try:
            argv = space.space_app_argv()
        except space.SpaceConfigError as exc:
            raise SystemExit(f"error: {exc}") from None
        # without CUDA: the bundled CPU models, and a banner saying why
        argv, banner = space.cpu_fallback(argv, cuda_available=torch.cuda.is_available())
        if banner:
            logger.warning("%s", banner)
        logger.info("Space %s: launching with %s", os.environ["SPACE_ID"], " ".join(argv))
    args = parse_args(argv)
    try:
        target = load_target(args.base_model_name_or_path, dtype=args.dtype, device=args.device,
                             template_name=args.template_name)
        vis = Visualiser(target, args, banner=banner)
    except (ConfigError, DartHeadError, OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    logger.info("%s", startup_summary(target, vis.factory))
    if space.on_zerogpu():
        logger.info("ZeroGPU: no warm-up and no cost model yet (a GPU is attached only while a request runs): "
                    "the first request measures it")
    else:
        try:   # the cost model that sizes the trees (measured now, or read from the user cache)
            logger.info("%s", cost_summary(vis.factory, args.tree))
        except Exception:  # noqa: BLE001 - fixed trees still run; auto ones report the error per request
            logger.exception("measuring the cost model failed; the first request will show the error")
        try:
            warm_up(vis.factory, vis.template, max_length=args.max_length, tree=args.tree)
            if args.tree == "auto":   # the warmed-up (pooled) engines' AutoTrees: the cost view's first drawing
                vis.note_engines(vis.factory.build(RunSettings(tree="auto")))
        except Exception:  # noqa: BLE001 - the page still serves and reports each engine's error per request
            logger.exception("warm-up failed; the first request will show the error")
    serve(vis.queued(), args)


if __name__ == "__main__":
    main()
