"""The page's engine pool: the drafters' loaded parts for one target (heads, N-gram table) and the engines built
from them, each leased to one run at a time (no Gradio here).

    factory = EngineFactory.from_flags(target, dart_model_name_or_path=..., compare_eagle3=True)
    with factory.checkout(settings) as lease:    # engines of this run's tree settings, its own until released
        lease.engines["dart"].generate(ids, config)

``from_flags`` loads what the page's flags name through dart_core.loading (a head named explicitly must load; a
missing default only makes that engine unavailable, with the reason the page shows); the factory then builds
engines from those parts and pools them, so KV caches are reused across requests.

``settings`` is a :class:`dart_core.ui.session.RunSettings` (or anything with ``tree_overrides(kind)``,
``tree_for(kind, base)`` and ``fixed_sizes(name)``): the per-request tree knobs, which a drafter takes through the
drafter protocol's ``set_tree``.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping

from ..config import ConfigError
from ..drafters.pruning import PruningConfig
from ..engine.decoding import SpeculativeEngine
from ..methods import Parts, TreeRequest, build_engine
from ..loading import load_head_and_ngram
from ..models.bundled import is_bundled_target
from ..models.heads.dart import DartHeadError
from ..ui.record import BASELINE

if TYPE_CHECKING:
    from ..ui.session import RunSettings

logger = logging.getLogger(__name__)


class EngineFactory:
    """The drafters' loaded parts (heads, N-gram table) for one target, and engines built from them.

    ``unavailable`` maps an engine name to the reason the page shows when it cannot run.

    An engine (its KV cache and drafter state) belongs to one run at a time: ``checkout(settings)`` hands a run
    an :class:`EngineLease` of engines no other run holds, taking the idle ones of the same tree settings from
    the pool (so KV caches are reused across requests) and building the rest; ``lease.release()`` puts them
    back. Two runs at once therefore never share an engine, whatever serves them (and
    ``SpeculativeEngine.stream`` refuses a second open generation on one engine besides).
    """

    def __init__(self, target, *, dart_head=None, ngram=None, eagle3_head=None,
                 base_trees: Mapping[str, Any] | None = None, unavailable: Mapping[str, str] | None = None,
                 costs=None):
        """base_trees: by tree kind ("dart", "eagle3"), the tree config each drafter is built with (default: the
        paper's PruningConfig, the published Eagle3TreeConfig); fixed trees run it with the request's fields set
        (``set_tree``), automatic trees start from it. costs: the target's CostModel (dart_core.sizing.costs;
        default: measured, or read from the cache, when first needed)."""
        from ..drafters.eagle3 import Eagle3TreeConfig
        self.target = target
        self.dart_head = dart_head
        self.ngram = ngram
        self.eagle3_head = eagle3_head
        self.base_trees: dict[str, Any] = {"dart": PruningConfig(), "eagle3": Eagle3TreeConfig(),
                                           **dict(base_trees or {})}
        self.unavailable: dict[str, str] = dict(unavailable or {})
        self._costs = costs
        self._pool: dict[str, tuple[Any, SpeculativeEngine]] = {}   # idle engines, at most one per name
        self._pool_lock = threading.Lock()

    @property
    def costs(self):
        """This target's cost model on this machine (measured at first use, or read from the user cache)."""
        if self._costs is None:
            from ..sizing.costs import CostModel
            self._costs = CostModel.load_or_measure(self.target)
        return self._costs

    @property
    def names(self) -> list[str]:
        """Engines this factory can build, in column order (the baseline last)."""
        out = []
        if self.dart_head is not None:
            out.append("dart")
        if self.eagle3_head is not None:
            out.append("eagle3")
        return out + [BASELINE]

    @classmethod
    def from_flags(cls, target, *, base_model_name_or_path: str | None = None,
                   dart_model_name_or_path: str | None = None, ngram_model_name_or_path: str | None = None,
                   is_small_ngram: bool = False, eagle3_model_name_or_path: str | None = None,
                   compare_eagle3: bool = False) -> "EngineFactory":
        """Load the heads the flags name. A head the user named explicitly must load (errors propagate,
        naming the flag); a missing *default* head only makes that engine unavailable, with the reason."""
        unavailable: dict[str, str] = {}
        dart_head = store = None
        try:
            dart_head, store = load_head_and_ngram(target, base_model_name_or_path, dart_model_name_or_path,
                                                   ngram_model_name_or_path, is_small_ngram=is_small_ngram)
        except DartHeadError as exc:
            if dart_model_name_or_path is not None:
                raise
            unavailable["dart"] = (f"**DART is unavailable**: {exc}. Start the app with "
                                   "--dart-model-name-or-path DIR|HUB_ID to add it.")
            logger.warning("%s", unavailable["dart"])
        eagle3_head = None
        if compare_eagle3 or eagle3_model_name_or_path is not None:
            from ..models.heads.eagle3 import Eagle3HeadError, load_eagle3_for_target
            try:
                eagle3_head = load_eagle3_for_target(target, base_model_name_or_path, eagle3_model_name_or_path)
            except Eagle3HeadError as exc:
                if eagle3_model_name_or_path is not None:
                    raise
                bundled = "bundled" if is_bundled_target(base_model_name_or_path) else base_model_name_or_path
                msg = f"**EAGLE-3 is unavailable**: {exc}"
                if "dart_core.train eagle3" not in msg:  # always say how to get a head
                    msg += (f". To get a head: `python -m dart_core.train eagle3 --target {bundled} --data FILE "
                            "--out DIR`, then start the app with --eagle3-model-name-or-path DIR")
                unavailable["eagle3"] = msg + ". DART and the vanilla baseline run without it."
                logger.warning("%s", unavailable["eagle3"])
        return cls(target, dart_head=dart_head, ngram=store, eagle3_head=eagle3_head, unavailable=unavailable)

    @property
    def parts(self) -> Parts:
        return Parts(dart_head=self.dart_head, ngram=self.ngram, eagle3_head=self.eagle3_head)

    def _make(self, name: str, settings: "RunSettings") -> SpeculativeEngine:
        if name not in self.names:
            raise ConfigError(f"unknown engine {name!r}; this app runs {self.names}")
        if name == BASELINE:
            return build_engine(self.target, "vanilla")
        # The page's tree is the request's knobs over this factory's base tree (a bad field: a ConfigError naming
        # it), given whole to the builder; with automatic trees the size knobs set are held.
        tree = settings.tree_for(name, self.base_trees[name])
        fixed = settings.fixed_sizes(name)
        request = TreeRequest(asdict(tree), auto=fixed is not None, held=fixed or {})
        engine = build_engine(self.target, name, self.parts, request, costs=self.costs if request.auto else None)
        return engine

    def tree_key(self, name: str, settings: "RunSettings") -> Any:
        """What makes two engines of ``name`` interchangeable: their tree settings (and, with automatic trees,
        which size knobs are held)."""
        if name not in self.base_trees:
            return ()
        tree = tuple(sorted(asdict(settings.tree_for(name, self.base_trees[name])).items()))
        fixed = settings.fixed_sizes(name)
        return tree if fixed is None else ("auto", tree, tuple(sorted(fixed.items())))

    def checkout(self, settings: "RunSettings", *, fresh: bool = False) -> "EngineLease":
        """Engines for one run, owned by it until ``release()``: idle pooled engines of the same tree settings
        (none when ``fresh``), the rest built new. Tree settings are validated first, so a bad one fails
        before any engine work."""
        keys = {name: self.tree_key(name, settings) for name in self.names}
        engines: dict[str, SpeculativeEngine] = {}
        if not fresh:
            with self._pool_lock:
                for name, key in keys.items():
                    idle = self._pool.get(name)
                    if idle is not None and idle[0] == key and not idle[1].busy:
                        engines[name] = self._pool.pop(name)[1]
        for name in keys:
            if name not in engines:
                engines[name] = self._make(name, settings)
        return EngineLease(self, {n: engines[n] for n in keys}, keys, fresh=fresh)

    def _check_in(self, lease: "EngineLease") -> None:
        """A run's engines back into the pool. A run's lease replaces the idle engine of its name (the latest
        settings are the likeliest next); a fresh lease (step-once) only fills an empty place. Engines still
        generating are dropped (their owner never closed them)."""
        with self._pool_lock:
            for name, engine in lease.engines.items():
                if engine.busy or (lease.fresh and name in self._pool):
                    continue
                self._pool[name] = (lease.keys[name], engine)

    def build(self, settings: "RunSettings", *, fresh: bool = False) -> dict[str, SpeculativeEngine]:
        """Engines for single-threaded use (warm-up, scripts): with ``fresh`` new ones of their own, else the
        pooled ones, which stay in the pool for the next checkout. Anything that may run beside other runs
        (the app) takes its engines with :meth:`checkout`."""
        if fresh:
            return {name: self._make(name, settings) for name in self.names}
        lease = self.checkout(settings)
        lease.release()
        return dict(lease.engines)


class EngineLease:
    """Engines checked out of an :class:`EngineFactory` by one run: its own until ``release()`` (idempotent,
    thread-safe) gives them back. Usable as a context manager."""

    def __init__(self, factory: EngineFactory, engines: dict[str, SpeculativeEngine], keys: dict[str, Any],
                 *, fresh: bool = False):
        self.factory = factory
        self.engines = engines
        self.keys = keys
        self.fresh = fresh
        self._released = False
        self._lock = threading.Lock()

    @property
    def released(self) -> bool:
        return self._released

    def cache_nbytes(self) -> int:
        """Bytes in these engines' own caches while the lease is held (0 once released)."""
        return 0 if self._released else sum(e.cache_nbytes() for e in self.engines.values())

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self.factory._check_in(self)

    def __enter__(self) -> "EngineLease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
