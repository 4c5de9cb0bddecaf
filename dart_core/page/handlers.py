"""The page's event handlers: run (streamed), step once, the step view's slider, token clicks and stages, stop,
clear, export and replay, in :class:`Handlers`. Each handler takes the tab's
:class:`~dart_core.page.tabs.TabState` and returns ``{component: value}`` updates drawn by
:class:`~dart_core.page.render.Rendering`.

Stop is a time, not a flag: a request stops when Stop was pressed after it was *queued* (``_queued_at``), so a
Stop pressed while the request still waits in Gradio's queue is not lost when it starts.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import gradio as gr

from ..config import ConfigError, dtype_name
from ..models.templates import encode_chat
from ..ui.record import MEMORY_LIMIT, STOPPED, TIME_LIMIT, RunRecord, label_of, save_export
from ..ui.session import Comparison, RunSettings, check_prompt_length
from ..ui.viz import md_text
from .controls import FRAME_KEYS, SETTING_NAMES, SIZE_KNOBS
from .tabs import FRAME_ALL, StepSession, TabRegistry, TabState, fmt_bytes

if TYPE_CHECKING:
    from ..ui.serving import ServingLimits
    from .components import PageComponents
    from .costs import CostViews
    from .engines import EngineFactory
    from .render import Rendering
    from .trees import TreeControls

logger = logging.getLogger("dart_app")

UI_INTERVAL_S = 0.2                      # streaming: redraw the answers at most this often
BUSY_CPUS = 0.25                         # other programs' busy CPUs in a run above which the status warns
MEMORY_CHECK_S = 0.5                     # a run checks the tabs' memory budget at most this often
STOPPED_IN_QUEUE = ("**Stopped** before it started: **Stop** was pressed while this {what} waited in the queue, "
                    "so no engine ran. Press the button again to start it.")


def load_note(other_cpus: float | None, cpus: int | None = None) -> str:
    """A sentence for the status when other programs kept more than ``BUSY_CPUS`` CPUs busy while the engines'
    clocks ran (``ui.session.Comparison.other_load``); empty otherwise. Measured on a 2-core machine: a browser
    on the same cores took about one of them while a run streamed, and every engine's step took twice as long."""
    if other_cpus is None or other_cpus <= BUSY_CPUS:
        return ""
    cpus = cpus or os.cpu_count() or 1
    return (f" ⚠ **This machine was busy**: while the engines ran, other programs kept {other_cpus:.1f} of its "
            f"{cpus} CPUs busy (a browser on the same machine counts), so every engine ran slower than it does "
            "alone and the speedups are noisier. Run again once it is quiet, or measure with "
            "`python -m dart_core.bench`, which refuses a busy machine.")


class Handlers:
    """The page's event handlers (see the module docstring), over ``page``'s components.

    ``demo``: the page's Blocks (its queue says when a request was queued); ``target`` and ``template``: the loaded
    target and its chat template; ``factory``: the engine pool; ``tabs``: the tabs' registry and memory budget;
    ``limits``: what one visitor may cost; ``max_length`` / ``max_new_tokens``: the page's length caps;
    ``default_tree``: the tree mode of a request without one; ``shown`` / ``view_slots``: the answer columns and
    the engines with trees; ``rendering``, ``costs``, ``trees``: what draws the outputs and keeps the cost view
    and the presets' speeds."""

    def __init__(self, page: PageComponents, demo: gr.Blocks, *, target, template, factory: EngineFactory,
                 tabs: TabRegistry, limits: ServingLimits, max_length: int, max_new_tokens: int, default_tree: str,
                 shown: list[str], view_slots: list[str], rendering: Rendering, costs: CostViews,
                 trees: TreeControls):
        self.page = page
        self.demo = demo
        self.target = target
        self.template = template
        self.factory = factory
        self.tabs = tabs
        self.limits = limits
        self.max_length = max_length
        self.max_new_tokens = max_new_tokens
        self.default_tree = default_tree
        self.shown = shown
        self.view_slots = view_slots
        self.rendering = rendering
        self.costs = costs
        self.trees = trees

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

    def _encode(self, prompt: str, settings: RunSettings) -> tuple[list[int], str | None]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError("the prompt is empty: type a question or pick an example")
        ids = encode_chat(self.target.tokenizer, self.template, [{"role": "user", "content": prompt}])
        warn = check_prompt_length(len(ids), self.max_length, settings.max_new_tokens)
        return ids, warn

    def _config(self, settings: RunSettings):
        return settings.generation_config(self.max_length, max_new_tokens_limit=self.max_new_tokens)

    def _meta(self, settings: RunSettings) -> dict[str, Any]:
        return {"target": self.target.name, "dtype": dtype_name(self.target.dtype),
                "device": str(self.target.device), "settings": settings.to_dict(),
                "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def run(self, tab: TabState | None, prompt: str, *values, request: gr.Request | None = None) -> Iterator[dict]:
        """Stream all engines side by side; redraw the answers while running, everything at the end.

        The run stops within one step when Stop is pressed (one pressed while the run still waited in the queue
        stops it before any engine work), when it reaches ``limits.run_time_limit_s``, or when its traces alone
        outgrow ``limits.session_memory_bytes``; the page names the limit that stopped it."""
        queued_at = self._queued_at()
        tab = tab if isinstance(tab, TabState) else TabState()
        self.tabs.remember(tab, request)
        if tab.stop_requested_since(queued_at):
            yield {self.page.tab: tab, self.page.status: STOPPED_IN_QUEUE.format(what="run")}
            return
        tab.active += 1
        try:
            yield from self._run(tab, prompt, values, queued_at)
        finally:
            tab.active -= 1

    def _run(self, tab: TabState, prompt: str, values: tuple, queued_at: float) -> Iterator[dict]:
        self.tabs.touch(tab)
        tab.close_step_session()  # a full run replaces a half-stepped one
        tab.frame = FRAME_ALL     # a run shows whole steps; step once shows a round stage by stage
        try:
            settings = self._settings(values)
            config = self._config(settings)
            ids, warn = self._encode(prompt, settings)
            lease = self.factory.checkout(settings)   # engines no other run holds (item: one run per engine)
        except ConfigError as exc:
            yield {self.page.tab: tab, self.page.status: f"⚠ **Cannot run:** {exc}"}
            return
        cmp = Comparison(lease.engines, ids, config, decode=self.target.tokenizer, prompt=prompt,
                         meta=self._meta(settings), lease=lease)
        tab.record = cmp.record
        limit_s = self.limits.run_time_limit_s
        started = time.monotonic()
        checked = [float("-inf")]

        def why_stop() -> str | None:
            if tab.stop_requested_since(queued_at):
                return STOPPED
            now = time.monotonic()
            if limit_s is not None and now - started >= limit_s:
                return TIME_LIMIT
            if now - checked[0] >= MEMORY_CHECK_S:
                checked[0] = now
                if self.tabs.fit_memory(self.limits.session_memory_bytes, tab) > self.limits.session_memory_bytes:
                    return MEMORY_LIMIT
            return None

        note = f" ({warn})" if warn else ""
        cap = f" Runs on this server stop after {limit_s:g} s." if limit_s is not None else ""
        running = (f"Running {', '.join(label_of(n) for n in cmp.engines)} in turn on one clock "
                   f"(prompt: {len(ids)} tokens){note}. **Stop** takes effect within one step.{cap}")
        try:
            yield {self.page.tab: tab, self.page.status: running, **self.rendering.render_answers(cmp.record)}
            last = time.perf_counter()
            try:
                for _ in cmp.run(stop=why_stop):
                    if time.perf_counter() - last >= UI_INTERVAL_S:
                        yield {self.page.status: running, **self.rendering.render_answers(cmp.record)}
                        last = time.perf_counter()
            except Exception as exc:  # noqa: BLE001 - show it in the page; the server keeps serving
                logger.exception("run failed")
                cmp.stop("error")
                yield {self.page.tab: tab, self.page.status: f"⚠ **Internal error:** {type(exc).__name__}: {exc} "
                                                   "(details in the server log)",
                       **self.rendering.render_all(cmp.record, tab=tab)}
                return
        finally:
            cmp.close()   # a run closed early (the visitor left) gives its engines back too
        self.tabs.fit_memory(self.limits.session_memory_bytes, tab)
        reasons = {r.stop_reason for r in cmp.record.runs.values()}
        busy = sum(r.busy_s for r in cmp.record.runs.values())
        failed = [r for r in cmp.record.runs.values() if r.error]
        if TIME_LIMIT in reasons:
            head = (f"⏱ **Stopped by the time limit:** a run on this server may take {limit_s:g} s "
                    "(`run_time_limit_s`); lower *Max new tokens* or the tree sizes for a complete answer.")
        elif MEMORY_LIMIT in reasons:
            head = (f"**Stopped by the memory limit:** this run's traces outgrew the "
                    f"{fmt_bytes(self.limits.session_memory_bytes)} this server keeps for open tabs "
                    "(`session_memory_bytes`; every scored candidate is kept); lower *Max new tokens* or the "
                    "tree sizes.")
        elif STOPPED in reasons:
            head = "**Stopped.**"
        else:
            head = "✓ **Done.**"
        if failed:   # never "Done" over a failed engine: name it and say what the visitor can do
            names = " and ".join(r.label for r in failed)
            rest = ("no engine finished; " if len(failed) == len(cmp.record.runs)
                    else "the other engines' answers are complete; " if head == "✓ **Done.**" else "")
            fail = (f"⚠ **{names} failed** ({'; '.join(f'{r.label}: {md_text(r.error)}' for r in failed)}): {rest}"
                    "press **Run** to try again; if it fails again, try other settings (a fixed tree size, fewer "
                    "new tokens); the server log has the details.")
            head = fail if head == "✓ **Done.**" else f"{head} {fail}"
        status = head + f" Engine time {busy:.2f} s in all.{note}"
        other = cmp.other_load.cpus
        if other is not None:
            cmp.record.meta["other_cpus"] = round(other, 2)   # kept in the export beside the settings
        status += load_note(other)
        status += " Move the **answer token position** slider to inspect the step that produced each token."
        if settings.tree == "auto" and self.view_slots:
            status += " Tree sizes were chosen automatically (see *Cost of a tree*)."
        self.costs.note_engines(cmp.engines)   # their AutoTrees learned from this run: the cost view shows them
        self.trees.note_preset_run(settings, cmp.record)
        yield {self.page.tab: tab, self.page.status: status, **self.rendering.render_all(cmp.record, tab=tab),
               **self.costs.render_costs()}

    def step_once(self, tab: TabState | None, prompt: str, *values, request: gr.Request | None = None) -> dict:
        """Advance every engine by one speculative round and narrate it; starts a new session when the
        prompt or settings changed or the last one finished. A Stop pressed while the step waited in the
        queue cancels it."""
        queued_at = self._queued_at()
        tab = tab if isinstance(tab, TabState) else TabState()
        self.tabs.remember(tab, request)
        if tab.stop_requested_since(queued_at):
            return {self.page.tab: tab, self.page.status: STOPPED_IN_QUEUE.format(what="step")}
        tab.active += 1
        try:
            return self._step_once(tab, prompt, values)
        finally:
            tab.active -= 1

    def _step_once(self, tab: TabState, prompt: str, values: tuple) -> dict:
        self.tabs.touch(tab)
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
            return {self.page.tab: tab, self.page.status: f"⚠ **Cannot step:** {exc}"}
        sess.step()
        tab.record = sess.comparison.record
        tab.frame = FRAME_KEYS[1]   # each round starts at its first stage: the drafted candidates
        self.tabs.fit_memory(self.limits.session_memory_bytes, tab)
        done = (" All engines finished; the next click starts over." if sess.done else
                " Before the next click, predict: how many of the head's drafted tokens will the target accept?")
        status = (f"**Step-once mode**, round {sess.rounds}: each engine made one speculative step "
                  f"(the first round includes the prefill).{done} Click **Next stage ▶** under the step view to "
                  "walk through the round: drafted, pruned, checked, accepted, committed.")
        if warn:
            status += f" ({warn})"
        out = {self.page.tab: tab, self.page.status: status,
               **self.rendering.render_all(sess.comparison.record, latest=True, tab=tab), **self.costs.render_costs()}
        latest = [sess.comparison.record.runs[s].traces[-1].position for s in self.view_slots
                  if s in sess.comparison.record.runs and sess.comparison.record.runs[s].traces]
        if latest:
            out[self.page.slider] = gr.Slider(minimum=0, maximum=max(sess.comparison.record.max_position(), 1),
                                              value=latest[0])
        return out

    def show_step(self, tab: TabState | None, position: float) -> dict:
        record = tab.record if isinstance(tab, TabState) else None
        if record is not None:
            self.tabs.touch(tab)    # a tab being looked at is not the least recently used one
        frame, pruned = (tab.frame, tab.show_pruned) if isinstance(tab, TabState) else (FRAME_ALL, False)
        out = self.rendering.render_step_views(record, position, frame=frame, show_pruned=pruned)
        out[self.page.timing_plot] = self.rendering.render_timing(record, self.rendering.marks(record, position))
        if record is None and isinstance(tab, TabState) and tab.dropped:
            for s in self.view_slots:
                out[self.page.step_text[s]] = f"⚠ {tab.dropped[0].upper()}{tab.dropped[1:]}. Run the prompt again."
        return out

    def select_token(self, tab: TabState | None, position: int) -> dict:
        """A token of an answer was clicked: every engine shows the step that produced answer token
        ``position`` (the slider moves there too)."""
        record = tab.record if isinstance(tab, TabState) else None
        top = max(record.max_position(), 1) if record is not None else 1
        pos = min(max(int(position), 0), top)
        return {self.page.slider: gr.Slider(minimum=0, maximum=top, value=pos), **self.show_step(tab, pos)}

    def select_token_ui(self, tab: TabState | None, evt: gr.SelectData) -> dict:
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
        return {self.page.frame: nxt, **self.view_changed(tab, position, nxt, show_pruned)}

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
        out = {self.page.prompt: "", self.page.status: "Cleared.", self.page.export_file: None,
               **self.rendering.render_all(None)}
        return out

    def export(self, tab: TabState | None) -> dict:
        record = tab.record if isinstance(tab, TabState) else None
        if record is None or not any(r.tokens for r in record.runs.values()):
            return {self.page.status: "⚠ Nothing to export yet: run a prompt (or step once) first.",
                    self.page.export_file: None}
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
            too_big = (f"the file is larger than the {fmt_bytes(self.limits.max_upload_bytes)} this server "
                       "accepts under *Replay* (`max_upload_bytes`)")
        if too_big:
            status += f" ⚠ It will not replay here: {too_big}."
        return {self.page.export_file: str(path), self.page.status: status}

    def replay(self, tab: TabState | None, file: Any, request: gr.Request | None = None) -> dict:
        tab = tab if isinstance(tab, TabState) else TabState()
        self.tabs.remember(tab, request)
        if file is None:
            return {self.page.tab: tab, self.page.status: "Choose an exported trace file (.json) to replay."}
        path = Path(getattr(file, "name", file))
        try:
            record = RunRecord.from_export(path)
        except (OSError, ValueError) as exc:
            return {self.page.tab: tab, self.page.status: f"⚠ **Cannot replay {md_text(path.name)}:** {md_text(exc)}"}
        too_big = self.limits.replay_problem(record)
        if too_big:
            # too_big is this page's own sentence (limits and counts), not the file's text
            return {self.page.tab: tab, self.page.status: f"⚠ **Cannot replay {md_text(path.name)}:** {too_big}."}
        tab.request_stop()
        tab.close_step_session()
        tab.record = record
        self.tabs.touch(tab)
        self.tabs.fit_memory(self.limits.session_memory_bytes, tab)
        meta = record.meta
        # every string from the file is shown as literal text: a backtick or an <img> in it stays what it is
        t = {k: md_text(meta.get(k, "?"), 120) for k in ("target", "dtype", "device", "recorded_at")}
        status = (f"**Replaying** a recorded run: target {t['target']} ({t['dtype']} on {t['device']}), recorded "
                  f"{t['recorded_at']}. Prompt: *{md_text(record.prompt, 200)}*")
        missing = [label_of(s) for s in record.runs if s not in self.shown]
        if missing:
            status += f" (engines this page has no column for: {', '.join(missing)})"
        return {self.page.tab: tab, self.page.status: status, **self.rendering.render_all(record, tab=tab)}

    # Gradio injects gr.Request only into positional parameters, so the wired handlers take it first.
    def run_ui(self, request: gr.Request, tab: TabState | None, prompt: str, *values) -> Iterator[dict]:
        yield from self.run(tab, prompt, *values, request=request)

    def step_ui(self, request: gr.Request, tab: TabState | None, prompt: str, *values) -> dict:
        return self.step_once(tab, prompt, *values, request=request)

    def replay_ui(self, request: gr.Request, tab: TabState | None, file: Any) -> dict:
        return self.replay(tab, file, request=request)
