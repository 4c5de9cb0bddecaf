"""Benchmark methods backed by DART heads: ``dart`` and ``dart_no_ngram`` (the N-gram ablation).

``bench.py`` calls :func:`register_all` with its own registry at import (also when it runs as
``__main__``, which is why the registry is passed in rather than imported):

    python -m dart_core.bench --questions mt_bench.jsonl --methods vanilla,dart,dart_no_ngram \\
        [--dart-model-name-or-path DIR|HUB_ID] [--ngram-model-name-or-path FILE|DIR|HUB_ID|none] [--small-ngram]

Defaults: the bundled head and N-gram table of the bundled target.
"""
from __future__ import annotations

import argparse


def _add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dart")
    g.add_argument("--dart-model-name-or-path", default=None, metavar="HEAD",
                   help="DART head: directory (config.json + model.safetensors) or Hub id; default: the bundled head")
    g.add_argument("--ngram-model-name-or-path", default=None, metavar="TABLE",
                   help="N-gram table for dart: .dngram file, directory, Hub repo, or 'none'; default: the bundled one")
    g.add_argument("--small-ngram", action="store_true", help="prefer small.* over full.* tables in a directory/repo")


def _load(target, args, with_ngram: bool):
    from .api import load_head_and_ngram
    from .drafters.dart import DartDrafter

    head, store = load_head_and_ngram(target, getattr(args, "base_model_name_or_path", None),
                                      getattr(args, "dart_model_name_or_path", None),
                                      getattr(args, "ngram_model_name_or_path", None),
                                      is_small_ngram=bool(getattr(args, "small_ngram", False)), with_ngram=with_ngram)
    return DartDrafter(head, store, target.eos_token_ids, name="dart" if with_ngram else "dart_no_ngram")


def register_all(register_method, MethodSpec, EngineRunner, METHODS) -> None:
    """Register ``dart`` and ``dart_no_ngram`` into a bench module's registry (idempotent)."""
    if "dart" in METHODS:
        return
    register_method(MethodSpec(
        "dart", lambda target, args: EngineRunner("dart", target, _load(target, args, True)),
        "DART: head forward + N-gram-guided tree pruning (--dart-model-name-or-path, --ngram-model-name-or-path)",
        add_arguments=_add_arguments))
    register_method(MethodSpec(
        "dart_no_ngram", lambda target, args: EngineRunner("dart_no_ngram", target, _load(target, args, False)),
        "DART without the N-gram term (ablation): pruning by the head's logits only"))
