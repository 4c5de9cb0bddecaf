"""Benchmark methods backed by draft heads: ``dart``, ``dart_no_ngram`` (the N-gram ablation) and
``eagle3`` (the EAGLE-3 baseline with the EAGLE-2 dynamic tree).

``bench/runners.py`` calls :func:`register_all` with its registry at import; the registry is passed in
(not imported) so that this module never imports the runners and a test can register into its own:

    python -m dart_core.bench --questions mt_bench.jsonl --methods vanilla,dart,dart_no_ngram \\
        [--dart-model-name-or-path DIR|HUB_ID] [--ngram-model-name-or-path FILE|DIR|HUB_ID|none] [--small-ngram] [--budget N]
        [--eagle3-model-name-or-path DIR|HUB_ID] [--eagle3-total-token 60 --eagle3-depth 7 --eagle3-top-k 10]

Defaults: the bundled heads and N-gram table of the bundled target, and each method's tree settings
measured for that target (``default_pruning``, ``default_eagle3_tree``).
"""
from __future__ import annotations

import argparse

from ..presets import LIMITS


def _limit(key: str, flag: str):
    """argparse type: the range of LIMITS[key], checked at parse time (before any model load)."""
    return LIMITS[key].arg_type(flag)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("dart")
    g.add_argument("--dart-model-name-or-path", default=None, metavar="HEAD",
                   help="DART head: directory (config.json + model.safetensors) or Hub id; default: the bundled head")
    g.add_argument("--ngram-model-name-or-path", default=None, metavar="TABLE",
                   help="N-gram table for dart: .dngram file, directory, Hub repo, or 'none'; default: the bundled one")
    g.add_argument("--small-ngram", action="store_true", help="prefer small.* over full.* tables in a directory/repo")
    # Pruner knobs: unset flags take the target's default (dart_core.drafters.pruning.default_pruning).
    g.add_argument("--budget", type=_limit("budget", "--budget"), default=None, metavar="N",
                   help="drafted nodes kept per step, root excluded; 0 = no draft, a plain target step (default: the "
                        "target's tuned value, else 60)")
    g.add_argument("--beam-width", type=_limit("beam_width", "--beam-width"), default=None, metavar="N",
                   help="candidates expanded per tree level (default: the target's tuned value, else 20)")
    g.add_argument("--level-top-k", type=_limit("level_top_k", "--level-top-k"), default=None, metavar="K",
                   help="tokens taken from each head row (default: the target's tuned value, else 25)")
    g.add_argument("--ngram-weight", type=_limit("ngram_weight", "--ngram-weight"), default=None, metavar="W",
                   help="weight of the N-gram term (default 0.5; dart_no_ngram has no N-gram term)")


def _flags_over(base, args, flags: dict[str, str], what: str):
    """``base`` (a tree-settings dataclass) with every set flag in ``flags`` (field -> argparse dest) applied;
    a bad value exits naming the flags, not the dataclass fields."""
    from dataclasses import replace

    given = {field: getattr(args, dest) for field, dest in flags.items() if getattr(args, dest, None) is not None}
    try:
        return replace(base, **given)
    except ValueError as e:
        names = ", ".join("--" + dest.replace("_", "-") for dest in flags.values())
        raise SystemExit(f"bad {what} flag: {e} (see {names})") from None


def _pruning(target, args):
    from ..drafters.pruning import default_pruning
    return _flags_over(default_pruning(target.name), args, {"budget": "budget", "beam_width": "beam_width",
                       "level_top_k": "level_top_k", "ngram_weight": "ngram_weight"}, "DART pruning")


def _add_eagle3_arguments(p: argparse.ArgumentParser) -> None:
    # Unset flags take the target's default (dart_core.drafters.eagle3.default_eagle3_tree).
    g = p.add_argument_group("eagle3")
    g.add_argument("--eagle3-model-name-or-path", default=None, metavar="HEAD",
                   help="EAGLE-3 head: directory (config.json + model.safetensors or pytorch_model.bin) or Hub id; "
                        "default: the bundled head (assets/eagle3/)")
    g.add_argument("--eagle3-total-token", type=_limit("eagle3_total_token", "--eagle3-total-token"), default=None,
                   metavar="N",
                   help="nodes verified per step, root included (default: the target's tuned value, else 60)")
    g.add_argument("--eagle3-depth", type=_limit("eagle3_depth", "--eagle3-depth"), default=None, metavar="N",
                   help="tree forwards per step, drafted depth <= N + 1 (default: the target's tuned value, else 7)")
    g.add_argument("--eagle3-top-k", type=_limit("eagle3_top_k", "--eagle3-top-k"), default=None, metavar="K",
                   help="children per expanded node (default: the target's tuned value, else 10)")


def _eagle3_tree(target, args):
    from ..drafters.eagle3 import default_eagle3_tree
    return _flags_over(default_eagle3_tree(target.name), args, {"total_token": "eagle3_total_token",
                       "depth": "eagle3_depth", "top_k": "eagle3_top_k"}, "EAGLE-3 tree")


def _load_eagle3(target, args):
    from ..drafters.eagle3 import Eagle3Drafter
    from ..models.heads.eagle3 import load_eagle3_for_target

    tree = _eagle3_tree(target, args)
    head = load_eagle3_for_target(target, getattr(args, "base_model_name_or_path", None),
                                  getattr(args, "eagle3_model_name_or_path", None))
    return Eagle3Drafter(head, tree)


def _load(target, args, with_ngram: bool):
    from ..api import load_head_and_ngram
    from ..drafters.dart import DartDrafter

    head, store = load_head_and_ngram(target, getattr(args, "base_model_name_or_path", None),
                                      getattr(args, "dart_model_name_or_path", None),
                                      getattr(args, "ngram_model_name_or_path", None),
                                      is_small_ngram=bool(getattr(args, "small_ngram", False)), with_ngram=with_ngram)
    return DartDrafter(head, store, target.eos_token_ids, pruning=_pruning(target, args),
                       name="dart" if with_ngram else "dart_no_ngram")


def register_all(register_method, MethodSpec, EngineRunner, METHODS) -> None:
    """Register ``dart``, ``dart_no_ngram`` and ``eagle3`` into a bench module's registry (idempotent)."""
    if "dart" in METHODS:
        return
    register_method(MethodSpec(
        "dart", lambda target, args: EngineRunner("dart", target, _load(target, args, True)),
        "DART: head forward + N-gram-guided tree pruning (--dart-model-name-or-path, --ngram-model-name-or-path)",
        add_arguments=_add_arguments))
    register_method(MethodSpec(
        "dart_no_ngram", lambda target, args: EngineRunner("dart_no_ngram", target, _load(target, args, False)),
        "DART without the N-gram term (ablation): pruning by the head's logits only"))
    register_method(MethodSpec(
        "eagle3", lambda target, args: EngineRunner("eagle3", target, _load_eagle3(target, args)),
        "EAGLE-3 baseline: autoregressive head + EAGLE-2 dynamic tree (--eagle3-model-name-or-path)",
        add_arguments=_add_eagle3_arguments))
