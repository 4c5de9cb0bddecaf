"""What the server holds for each browser tab, and the memory budget over all of them (no Gradio here).

A :class:`TabState` is one tab's: when it last pressed Stop, the run on screen and its step-once session
(:class:`StepSession`, engines of its own). :class:`TabRegistry` knows every tab that may hold memory, releases a
tab when it closes or its state times out, and drops the runs of the least recently used tabs when the
tabs together outgrow the serving limit ``session_memory_bytes``.
"""
from __future__ import annotations

import shutil
import threading
import time
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from ..config import GenerationConfig
from ..engine.trace import StepTrace
from ..ui.record import RunRecord
from ..ui.session import Comparison, RunSettings
from .engines import EngineFactory

TAB_TTL_S = 30 * 60                      # per-tab state (step-once caches, last run) lives this long idle
FRAME_ALL = "all"                        # the step view shows the whole step (else one stage: controls.FRAMES)


def fmt_bytes(n: float) -> str:
    """A byte count as the page writes it (e.g. "1.5 MiB")."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}".replace(".0 ", " ")
        n /= 1024
    return f"{n} GiB"


class TabState:
    """What one browser tab holds: when it last pressed Stop, the run on screen and its step-once session.
    Released by ``release()`` when the tab closes or its state times out (gr.State delete_callback), and its
    run and session by ``drop()`` when the server needs the memory (the least recently used tab first).

    Stop is a time, not a flag: a request stops when Stop was pressed after it was *queued*, so a Stop pressed
    while the request still waits in the queue is not lost when it starts (see ``Handlers._queued_at``)."""

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


class StepSession:
    """Step-once teaching mode: a comparison with its own engines (own KV caches, so other tabs' runs
    cannot disturb it), advanced one round per call. ``close()`` gives the engines back."""

    def __init__(self, factory: EngineFactory, settings: RunSettings, prompt_ids: Sequence[int],
                 config: GenerationConfig, *, prompt: str = "", meta: Mapping[str, Any] | None = None):
        # A cache just big enough for this request: per-tab sessions should stay small.
        need = len(prompt_ids) + config.max_new_tokens + 1
        if need < config.max_length:
            config = GenerationConfig(**{**asdict(config), "max_length": need})
        self.key = (tuple(prompt_ids), repr(settings.to_dict()))
        self.lease = factory.checkout(settings, fresh=True)
        self.comparison = Comparison(self.lease.engines, prompt_ids, config, decode=factory.target.tokenizer,
                                     prompt=prompt, meta=meta, lease=self.lease)
        self.rounds = 0
        self.last: dict[str, StepTrace | None] = {}

    @property
    def done(self) -> bool:
        return self.comparison.done

    def step(self) -> dict[str, StepTrace | None]:
        """One speculative round of every unfinished engine; returns each engine's new trace."""
        self.last = self.comparison.round()
        self.rounds += 1
        return self.last

    def nbytes(self) -> int:
        """Estimated memory this session holds: its record's traces and, until it finishes, its engines' caches."""
        return self.comparison.record.nbytes() + self.lease.cache_nbytes()

    def close(self) -> None:
        self.comparison.stop("closed")
        self.comparison.engines.clear()


class TabRegistry:
    """The tabs that hold state on this server: by session (so a closed tab can be released at once) and, for
    the memory budget, those that may hold memory, least recently used first."""

    def __init__(self) -> None:
        self.by_session: dict[str, TabState] = {}   # session hash -> tab
        self._held: dict[int, TabState] = {}        # tabs that may hold memory, least recently used first
        self._lock = threading.Lock()

    def remember(self, tab: TabState, request: Any) -> None:
        sid = getattr(request, "session_hash", None) if request is not None else None
        if sid:
            with self._lock:
                self.by_session[sid] = tab

    def on_unload(self, request: Any) -> None:
        """The tab closed: free its caches now (Gradio itself keeps closed tabs' state for an hour)."""
        with self._lock:
            tab = self.by_session.pop(getattr(request, "session_hash", None) or "", None)
            if tab is not None:
                self._held.pop(id(tab), None)
        if tab is not None:
            tab.release()

    def on_state_deleted(self, tab: Any) -> None:
        """gr.State's delete callback (time-to-live expired or session evicted)."""
        if isinstance(tab, TabState):
            tab.release()
        with self._lock:
            for sid in [k for k, v in self.by_session.items() if v is tab]:
                del self.by_session[sid]
            self._held.pop(id(tab), None)

    def touch(self, tab: TabState) -> None:
        """``tab`` was just used: last in the least-recently-used order of the memory budget."""
        tab.last_used = time.monotonic()
        tab.dropped = None
        with self._lock:
            self._held.pop(id(tab), None)
            self._held[id(tab)] = tab

    def fit_memory(self, budget: int, current: TabState | None = None) -> int:
        """Keep the tabs' memory within ``budget`` bytes (the serving limit ``session_memory_bytes``): drop the
        runs and step-once sessions of the least recently used tabs (never ``current``, never one with a request
        in progress) until the total fits. Returns the estimated bytes all tabs hold afterwards."""
        with self._lock:
            tabs = list(self._held.values())
        sizes = {id(t): t.nbytes() for t in tabs}
        total = sum(sizes.values())
        for t in tabs:
            if total <= budget:
                break
            if t is current or t.active or not sizes[id(t)]:
                continue
            t.drop(f"this tab's run was released to keep the server within its memory budget for open tabs "
                   f"({fmt_bytes(budget)}, `session_memory_bytes`; the least recently used tab goes first)")
            total -= sizes[id(t)]
            with self._lock:
                self._held.pop(id(t), None)
        with self._lock:
            for t in tabs:
                if not sizes[id(t)] and t is not current and not t.active:
                    self._held.pop(id(t), None)   # holds nothing: no need to track it
        return total
