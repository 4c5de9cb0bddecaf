"""Resolving the drafters' parts for a target: its DART head and N-gram table (no Gradio here). The target
itself loads with dart_core.models.loader.load_target, the EAGLE-3 head with
dart_core.models.heads.eagle3.load_eagle3_for_target.

    head, store = load_head_and_ngram(target, None, None, None)     # the bundled head and N-gram table
    store = open_ngram("fvliang/dart-qwen3-ngram", tokenizer, is_small_ngram=True)   # .dngram, or .trie converted once

The Python API (dart_core.api.DartModel.from_pretrained), the page's engine pool (dart_core.page.engines) and
the benchmark load through these functions.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from .models.bundled import is_bundled_target
from .models.heads.dart import DartHeadError, load_dart_head

logger = logging.getLogger(__name__)

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
    # A name ending like a table file is a path that is missing, never a Hub repo id ("typo/x.dngram").
    if name.startswith((".", "/", "~")) or name.count("/") != 1 or name.endswith((".dngram", ".trie")):
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
