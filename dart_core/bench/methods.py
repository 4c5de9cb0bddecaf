"""Benchmark methods backed by draft heads: ``dart`` (the paper's: the corpus table only), ``dart_context``
(DART + the request's live context, docs/ARCHITECTURE.md section 5a), ``dart_no_ngram`` (the N-gram ablation),
``hybrid`` (prompt lookup while the context match is long, the paper's DART otherwise), ``eagle3`` (the
EAGLE-3 baseline with the EAGLE-2 dynamic tree) and ``eagle3_context`` (the same with the live context).

``bench/runners.py`` calls :func:`register_all` with its registry at import; the registry is passed in
(not imported) so that this module never imports the runners and a test can register into its own:

    python -m dart_core.bench --questions mt_bench.jsonl --methods vanilla,dart,dart_no_ngram \\
        [--dart-model-name-or-path DIR|HUB_ID] [--ngram-model-name-or-path FILE|DIR|HUB_ID|none] [--small-ngram] [--budget N]
        [--eagle3-model-name-or-path DIR|HUB_ID] [--eagle3-total-token 60 --eagle3-depth 7 --eagle3-top-k 10]

Defaults: the bundled heads and N-gram table of the bundled target; the paper's pruning (``PruningConfig()``:
budget 60, beam 20, top-k 25) and the published EAGLE-3 tree (``Eagle3TreeConfig()``: 60/7/10) as the base
tree settings. With ``--tree auto`` (the default) each drafter runs under an AutoTree
(:mod:`dart_core.sizing`) that chooses its tree size every few steps from the run's shared cost model,
holding any size flag the user gave (``--budget``; ``--eagle3-total-token/--eagle3-depth/--eagle3-top-k``);
with ``--tree fixed`` the settings run as given.
"""
from __future__ import annotations

import argparse

from ..presets import EAGLE3_FIELDS, PRUNING_FIELDS, add_tree_flags


def _add_arguments(p: argparse.ArgumentParser) -> None:
    from ..drafters.pruning import PruningConfig
    g = p.add_argument_group("dart", "dart and dart_no_ngram (the same without the N-gram term)")
    g.add_argument("--dart-model-name-or-path", default=None, metavar="HEAD",
                   help="DART head: directory (config.json + model.safetensors) or Hub id; default: the bundled head")
    g.add_argument("--ngram-model-name-or-path", default=None, metavar="TABLE",
                   help="N-gram table for dart: .dngram file, directory, Hub repo, or 'none'; default: the bundled one")
    g.add_argument("--small-ngram", action="store_true", help="prefer small.* over full.* tables in a directory/repo")
    # The pruner's knobs (dart_core.presets.KNOBS); unset flags take the paper's PruningConfig() (dart_no_ngram
    # has no N-gram term whatever --ngram-weight says).
    add_tree_flags(g, "dart", PruningConfig())


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


def _pruning(target, args, context: bool = False):
    """The run's pruning: the paper's PruningConfig() (``dart_context``: with the live context at
    ``CONTEXT_WEIGHT``), then every pruning flag the user set."""
    from ..drafters.pruning import CONTEXT_WEIGHT, PruningConfig
    base = PruningConfig(context_weight=CONTEXT_WEIGHT) if context else PruningConfig()
    return _flags_over(base, args, PRUNING_FIELDS, "DART pruning")


def _add_eagle3_arguments(p: argparse.ArgumentParser) -> None:
    from ..drafters.eagle3 import Eagle3TreeConfig
    g = p.add_argument_group("eagle3")
    g.add_argument("--eagle3-model-name-or-path", default=None, metavar="HEAD",
                   help="EAGLE-3 head: directory (config.json + model.safetensors or pytorch_model.bin) or Hub id; "
                        "default: the bundled head (assets/eagle3/)")
    # The tree's knobs (dart_core.presets.KNOBS); unset flags take the published Eagle3TreeConfig().
    add_tree_flags(g, "eagle3", Eagle3TreeConfig())


def _eagle3_tree(target, args, context: bool = False):
    """The published tree, then the EAGLE-3 flags set; ``eagle3_context`` takes ``--eagle3-context-weight``, else
    DART + context's weight (``--context-weight``, else CONTEXT_WEIGHT), so the two heads read the live context
    alike."""
    from dataclasses import replace

    from ..drafters.eagle3 import Eagle3TreeConfig
    from ..drafters.pruning import CONTEXT_WEIGHT
    tree = _flags_over(Eagle3TreeConfig(), args, EAGLE3_FIELDS, "EAGLE-3 tree")
    if context and getattr(args, "eagle3_context_weight", None) is None:
        w = getattr(args, "context_weight", None)
        tree = replace(tree, context_weight=CONTEXT_WEIGHT if w is None else float(w))
    return tree


def _held_sizes(engine: str, args) -> dict[str, int]:
    """The size knobs of ``engine`` the user set ({config field: value}): automatic trees hold them fixed."""
    from ..presets import SIZE_FIELDS
    return {field: int(getattr(args, knob)) for field, knob in SIZE_FIELDS[engine].items()
            if getattr(args, knob, None) is not None}


def _load_eagle3(target, args, context: bool = False):
    from ..drafters.eagle3 import Eagle3Drafter
    from ..models.heads.eagle3 import load_eagle3_for_target

    tree = _eagle3_tree(target, args, context)
    head = load_eagle3_for_target(target, getattr(args, "base_model_name_or_path", None),
                                  getattr(args, "eagle3_model_name_or_path", None))
    return Eagle3Drafter(head, tree, name="eagle3_context" if context else "eagle3")


def _eagle3_runner(target, args, EngineRunner, sized, context: bool = False):
    drafter = _load_eagle3(target, args, context)
    return EngineRunner(drafter.name, target, sized(drafter, target, args, _held_sizes("eagle3", args)))


def _load(target, args, with_ngram: bool, name: str = "", context: bool = False):
    from ..loading import load_head_and_ngram
    from ..drafters.dart import DartDrafter

    head, store = load_head_and_ngram(target, getattr(args, "base_model_name_or_path", None),
                                      getattr(args, "dart_model_name_or_path", None),
                                      getattr(args, "ngram_model_name_or_path", None),
                                      is_small_ngram=bool(getattr(args, "small_ngram", False)), with_ngram=with_ngram)
    pruning = _pruning(target, args, context)
    if not context and pruning.context_weight != 0:
        # the paper's DART stays the paper's: --context-weight applies to dart_context
        from dataclasses import replace
        pruning = replace(pruning, context_weight=0.0)
    return DartDrafter(head, store, target.eos_token_ids, pruning=pruning,
                       name=name or ("dart" if with_ngram else "dart_no_ngram"))


def _dart_runner(target, args, with_ngram: bool, EngineRunner, sized, name: str = "", context: bool = False):
    drafter = _load(target, args, with_ngram, name, context)
    return EngineRunner(drafter.name, target, sized(drafter, target, args, _held_sizes("dart", args)))


def _hybrid_runner(target, args, EngineRunner, sized):
    """Prompt lookup while the context match is long, the paper's DART otherwise (drafters/hybrid.py)."""
    from ..drafters import PromptLookupDrafter
    from ..drafters.hybrid import SwitchDrafter

    dart = sized(_load(target, args, True, "dart"), target, args, _held_sizes("dart", args))
    lookup = sized(PromptLookupDrafter(), target, args, {})
    return EngineRunner("hybrid", target, SwitchDrafter(dart, lookup, vocab_size=_vocab(target, dart)))


def _vocab(target, drafter) -> int:
    """The ids the live context may hold: the DART drafter's own index's (the target's, or its table's)."""
    return int(getattr(drafter, "inner", drafter).live.index.vocab_size)


def _no_sizing(drafter, target, args, fixed):
    return drafter


def register_all(register_method, MethodSpec, EngineRunner, METHODS, sized=None) -> None:
    """Register ``dart``, ``dart_no_ngram`` and ``eagle3`` into a bench module's registry (idempotent).
    ``sized(drafter, target, args, fixed)`` puts a drafter under automatic trees when the run asks for them
    (``runners.sized``); without it every drafter runs its tree settings as given."""
    if "dart" in METHODS:
        return
    sized = sized or _no_sizing
    register_method(MethodSpec(
        "dart", lambda target, args: _dart_runner(target, args, True, EngineRunner, sized),
        "DART: head forward + N-gram-guided tree pruning (--dart-model-name-or-path, --ngram-model-name-or-path)",
        add_arguments=_add_arguments, auto_tree=True))
    register_method(MethodSpec(
        "dart_no_ngram", lambda target, args: _dart_runner(target, args, False, EngineRunner, sized),
        "DART without the N-gram term (ablation): pruning by the head's logits only", auto_tree=True))
    register_method(MethodSpec(
        "dart_context", lambda target, args: _dart_runner(target, args, True, EngineRunner, sized, "dart_context",
                                                          context=True),
        "DART + context: the request's own text adds candidates to DART's tree and shares its N-gram term "
        "(--context-weight; docs/ARCHITECTURE.md section 5a)", auto_tree=True))
    register_method(MethodSpec(
        "hybrid", lambda target, args: _hybrid_runner(target, args, EngineRunner, sized),
        "baseline: prompt lookup while the context match is >= 3 tokens, the paper's DART otherwise",
        auto_tree=True))
    register_method(MethodSpec(
        "eagle3", lambda target, args: _eagle3_runner(target, args, EngineRunner, sized),
        "EAGLE-3 baseline: autoregressive head + EAGLE-2 dynamic tree (--eagle3-model-name-or-path)",
        add_arguments=_add_eagle3_arguments, auto_tree=True))
    register_method(MethodSpec(
        "eagle3_context", lambda target, args: _eagle3_runner(target, args, EngineRunner, sized, context=True),
        "EAGLE-3 + context: the live context's candidates in EAGLE-3's tree by DART + context's rule "
        "(--context-weight)", auto_tree=True))
