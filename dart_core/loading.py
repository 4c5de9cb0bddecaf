"""Loading the drafters' parts for a target (its DART head and N-gram table, its EAGLE-3 head) and building
engines from them (no Gradio here). The target itself loads with dart_core.models.loader.load_target.

    head, store = load_head_and_ngram(target, None, None, None)     # the bundled head and N-gram table
    store = open_ngram("fvliang/dart-qwen3-ngram", tokenizer, is_small_ngram=True)   # .dngram, or .trie converted once
    factory = EngineFactory.from_flags(target, dart_model_name_or_path=..., compare_eagle3=True)
    with factory.checkout(settings) as lease:    # engines of this run's tree settings, its own until released
        lease.engines["dart"].generate(ids, config)

The Python API (dart_core.api.DartModel.from_pretrained), the page (app.py) and the benchmark load through
these functions. ``from_flags`` loads what the page's flags name (a head named explicitly must load; a
missing default only makes that engine unavailable, with the reason the page shows); the factory then
builds engines from those parts and pools them, so KV caches are reused across requests.

``settings`` is a :class:`dart_core.ui.session.RunSettings` (or anything with ``pruning(base)`` and
``eagle3_tree(base)``): the per-request tree knobs.
"""
from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from .config import ConfigError
from .drafters.pruning import PruningConfig
from .engine.decoding import SpeculativeEngine
from .models.bundled import is_bundled_target
from .models.heads.dart import DartHeadError, load_dart_head

if TYPE_CHECKING:
    from .ui.session import RunSettings

logger = logging.getLogger(__name__)

#: The engine every comparison measures against (plain target decoding, no drafts).
BASELINE = "vanilla"

#: Where the shipped default head lives in a source checkout.
BUNDLED_HEAD_NAME = "smollm2-135m-instruct"
#: File name of the bundled default N-gram table (for the bundled SmolLM2-135M-Instruct target).
BUNDLED_TABLE_NAME = "smollm2-135m-instruct.dngram"
NGRAM_NONE = ("none", "off", "")


def bundled_head_dir() -> Path:
    from .models.assets import asset_path
    return asset_path("dart", BUNDLED_HEAD_NAME)


def bundled_table_path() -> Path:
    """The bundled default N-gram table (``assets/ngram/``)."""
    from .models.assets import asset_path
    return asset_path("ngram", BUNDLED_TABLE_NAME)


def load_head_and_ngram(target, base_model_name_or_path: str | None, dart_model_name_or_path: str | None,
                        ngram_model_name_or_path: str | None, *, is_small_ngram: bool = False,
                        with_ngram: bool = True, check_fingerprint: bool = True):
    """The DART head and N-gram table for an already loaded ``target`` (None = the bundled defaults,
    which exist only for the bundled target). Returns ``(head, store)``; store is None without N-grams.
    Shared by ``DartModel.from_pretrained``, the benchmark and the app."""
    bundled = is_bundled_target(base_model_name_or_path)
    if dart_model_name_or_path is None:
        if not bundled:
            raise DartHeadError(f"no default DART head for {base_model_name_or_path!r}: pass "
                                "dart_model_name_or_path (e.g. fvliang/qwen8b-dart for Qwen/Qwen3-8B), or train "
                                f"one with `python -m dart_core.train dart --target {base_model_name_or_path} "
                                "--data FILE --out DIR`")
        head_dir = bundled_head_dir()
        if not (head_dir / "config.json").is_file():
            raise DartHeadError(f"the bundled DART head is missing from {head_dir}; train it with "
                                "`python -m dart_core.train dart --target bundled --data "
                                "CORPUS --out DIR` (CORPUS: the distillation corpus, e.g. regenerated with "
                                "`python -m dart_core.training.regenerate`) and copy "
                                "DIR/config.json and DIR/model.safetensors there")
        dart_model_name_or_path = str(head_dir)
    head = load_dart_head(dart_model_name_or_path, target, check_fingerprint=check_fingerprint)
    store = None
    if with_ngram:
        store = open_ngram(ngram_model_name_or_path, target.tokenizer, is_small_ngram=is_small_ngram,
                           bundled=bundled)
    return head, store


def open_ngram(name_or_path: str | None, tokenizer, *, is_small_ngram: bool = False, bundled: bool = True):
    """Open an N-gram table for ``tokenizer`` (see ``DartModel.from_pretrained``); None when disabled."""
    from .ngram.store import NgramStore, tokenizer_fingerprint

    if isinstance(name_or_path, str) and name_or_path.lower() in NGRAM_NONE:
        return None
    fp = tokenizer_fingerprint(tokenizer)
    if name_or_path is None:
        if not bundled:
            logger.warning("no N-gram table given for this target: pruning uses the head's logits only "
                           "(pass ngram_model_name_or_path for the N-gram term)")
            return None
        return NgramStore.open(bundled_table_path(), expected_fingerprint=fp)
    path = _resolve_ngram_file(str(name_or_path), is_small_ngram)
    if path.suffix == ".trie":
        path = _import_trie_cached(path, tokenizer)
    return NgramStore.open(path, expected_fingerprint=fp)


def _pick(files: list[Path], is_small: bool) -> Path | None:
    if not files:
        return None
    pref = [f for f in files if ("small" in f.name) == is_small]
    return sorted(pref or files)[0]


def _resolve_ngram_file(name: str, is_small: bool) -> Path:
    p = Path(name).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        found = _pick(sorted(p.glob("*.dngram")), is_small) or _pick(sorted(p.glob("*.trie")), is_small)
        if found is None:
            raise FileNotFoundError(f"N-gram directory {p} holds no .dngram table (nor an original .trie)")
        return found
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(f"N-gram table {name!r} is not a file, a directory or a Hub repo id; check "
                                "ngram_model_name_or_path (or pass 'none')")
    from huggingface_hub import hf_hub_download
    stem = "small" if is_small else "full"
    errors = []
    for fname in (f"{stem}.dngram", f"{stem}.trie"):
        try:
            return Path(hf_hub_download(name, fname))
        except Exception as exc:  # noqa: BLE001 - try the next name, report all
            errors.append(f"{fname}: {type(exc).__name__}")
    raise FileNotFoundError(f"could not fetch an N-gram table from the Hub repo {name!r} ({'; '.join(errors)})")


def _import_trie_cached(src: Path, tokenizer) -> Path:
    """Convert an original DART .trie once into the dart-demo cache; later calls reuse it."""
    from .models.bundled import cache_root
    from .ngram.build import import_original_trie
    from .ngram.store import tokenizer_fingerprint

    st = src.stat()
    key = hashlib.sha256(f"{src.resolve()}:{st.st_size}:{int(st.st_mtime)}:{tokenizer_fingerprint(tokenizer)}"
                         .encode()).hexdigest()[:16]
    dst = cache_root() / "ngram" / f"{src.stem}-{key}.dngram"
    if not dst.is_file():
        logger.warning("converting the original N-gram trie %s into %s (once)", src, dst)
        import_original_trie(src, dst, tokenizer)
    return dst


class EngineFactory:
    """The drafters' loaded parts (heads, N-gram table) for one target, and engines built from them.

    ``unavailable`` maps an engine name to the reason the page shows when it cannot run.

    An engine (its KV cache and drafter state) belongs to one run at a time: ``checkout(settings)`` hands a run
    an :class:`EngineLease` of engines no other run holds, taking the idle ones of the same tree settings from
    the pool (so KV caches are reused across requests) and building the rest; ``lease.release()`` puts them
    back. Two runs at once therefore never share an engine, whatever serves them (and
    ``SpeculativeEngine.stream`` refuses a second open generation on one engine besides).
    """

    def __init__(self, target, *, dart_head=None, ngram=None, dart_pruning: PruningConfig | None = None,
                 eagle3_head=None, eagle3_tree=None, unavailable: Mapping[str, str] | None = None,
                 costs=None):
        """dart_pruning / eagle3_tree: the base tree settings (default: the paper's / published ones), which
        fixed trees run as given and automatic trees start from. costs: the target's CostModel
        (dart_core.sizing.costs; default: measured, or read from the cache, when first needed)."""
        from .drafters.eagle3 import Eagle3TreeConfig
        self.target = target
        self.dart_head = dart_head
        self.ngram = ngram
        self.dart_pruning = dart_pruning or PruningConfig()
        self.eagle3_head = eagle3_head
        self.eagle3_tree_base = eagle3_tree or Eagle3TreeConfig()
        self.unavailable: dict[str, str] = dict(unavailable or {})
        self._costs = costs
        self._pool: dict[str, tuple[Any, SpeculativeEngine]] = {}   # idle engines, at most one per name
        self._pool_lock = threading.Lock()

    @property
    def costs(self):
        """This target's cost model on this machine (measured at first use, or read from the user cache)."""
        if self._costs is None:
            from .sizing.costs import CostModel
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
            from .models.heads.eagle3 import Eagle3HeadError, load_eagle3_for_target
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

    def _make(self, name: str, settings: "RunSettings") -> SpeculativeEngine:
        target = self.target
        if name == "dart":
            from .drafters.dart import DartDrafter
            drafter = DartDrafter(self.dart_head, self.ngram, target.eos_token_ids,
                                  pruning=settings.pruning(self.dart_pruning))
        elif name == "eagle3":
            from .drafters.eagle3 import Eagle3Drafter
            drafter = Eagle3Drafter(self.eagle3_head, settings.eagle3_tree(self.eagle3_tree_base))
        elif name == BASELINE:
            return SpeculativeEngine(target, name=BASELINE)
        else:
            raise ConfigError(f"unknown engine {name!r}; this app runs {self.names}")
        fixed = settings.fixed_sizes(name)
        if fixed is not None:
            from .sizing.auto import make_auto
            drafter = make_auto(drafter, self.costs, fixed)
        return SpeculativeEngine(target, drafter, name=name)

    def tree_key(self, name: str, settings: "RunSettings") -> Any:
        """What makes two engines of ``name`` interchangeable: their tree settings (and, with automatic trees,
        which size knobs are held)."""
        if name == "dart":
            tree = tuple(sorted(settings.pruning(self.dart_pruning).to_dict().items()))
        elif name == "eagle3":
            tree = tuple(sorted(asdict(settings.eagle3_tree(self.eagle3_tree_base)).items()))
        else:
            return ()
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
