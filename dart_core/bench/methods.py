"""Benchmark methods backed by draft heads: ``dart`` (the paper's: the corpus table only), ``dart_context``
(DART + the request's live context, docs/ARCHITECTURE.md section 5a), ``dart_no_ngram`` (the N-gram ablation),
``dart_chain`` (the paper's DART drafting one chain of ``--budget`` tokens, as vLLM verifies it), ``hybrid`` (prompt
lookup while the context match is long, the paper's DART otherwise), ``eagle3`` (the
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


def _tree(name: str, args):
    """The run's tree request for method ``name`` from its flags (dart_core.methods.tree_request, as the page and the
    API make theirs), with the benchmark's two rules for the shared ``--context-weight`` flag: the paper's DART (and
    the hybrid's, and the ablation's) never reads the live context; ``eagle3_context`` takes it when
    ``--eagle3-context-weight`` is unset, so the two heads read the live context alike."""
    from dataclasses import replace

    from ..methods import method, tree_request
    req = tree_request(method(name).kind, args, getattr(args, "tree", None) or "fixed")
    overrides = dict(req.overrides)
    if name in ("dart", "dart_no_ngram", "dart_chain", "hybrid"):
        overrides.pop("context_weight", None)
    shared = getattr(args, "context_weight", None)
    if name == "eagle3_context" and "context_weight" not in overrides and shared is not None:
        overrides["context_weight"] = float(shared)
    return replace(req, overrides=overrides)


def _parts(target, args, name: str):
    """What method ``name`` needs, loaded as its flags say (dart_core.loading; the bundled defaults when unset)."""
    from ..methods import Parts, method
    needs = method(name).needs
    parts = Parts()
    if "dart_head" in needs:
        from ..loading import load_head_and_ngram
        parts.dart_head, parts.ngram = load_head_and_ngram(
            target, getattr(args, "base_model_name_or_path", None), getattr(args, "dart_model_name_or_path", None),
            getattr(args, "ngram_model_name_or_path", None), is_small_ngram=bool(getattr(args, "small_ngram", False)),
            with_ngram=name != "dart_no_ngram")
    if "eagle3_head" in needs:
        from ..models.heads.eagle3 import load_eagle3_for_target
        parts.eagle3_head = load_eagle3_for_target(target, getattr(args, "base_model_name_or_path", None),
                                                   getattr(args, "eagle3_model_name_or_path", None))
    return parts


def _runner(name: str, target, args, EngineRunner, costs):
    """Method ``name``'s runner: its parts and its tree from the flags, built by dart_core.methods.build_drafter; a
    bad tree flag exits naming the flags, before anything loads. costs(target, args): the run's shared cost model
    (automatic trees)."""
    from ..config import ConfigError
    from ..methods import build_drafter, method, tree_config
    tree = _tree(name, args)
    kind = method(name).kind
    try:
        tree_config(name, tree)
    except ConfigError as e:
        knobs = (PRUNING_FIELDS if kind == "dart" else EAGLE3_FIELDS).values()
        flags = ", ".join("--" + k.replace("_", "-") for k in knobs)
        what = "DART pruning" if kind == "dart" else "EAGLE-3 tree"
        raise SystemExit(f"bad {what} flag: {e} (see {flags})") from None
    drafter = build_drafter(target, name, _parts(target, args, name), tree,
                            costs(target, args) if tree.auto and costs else None)
    return EngineRunner(name, target, drafter)


def _add_eagle3_arguments(p: argparse.ArgumentParser) -> None:
    from ..drafters.eagle3 import Eagle3TreeConfig
    g = p.add_argument_group("eagle3")
    g.add_argument("--eagle3-model-name-or-path", default=None, metavar="HEAD",
                   help="EAGLE-3 head: directory (config.json + model.safetensors or pytorch_model.bin) or Hub id; "
                        "default: the bundled head (assets/eagle3/)")
    # The tree's knobs (dart_core.presets.KNOBS); unset flags take the published Eagle3TreeConfig().
    add_tree_flags(g, "eagle3", Eagle3TreeConfig())


def register_all(register_method, MethodSpec, EngineRunner, METHODS, costs=None) -> None:
    """Register the head-backed methods into a bench module's registry (idempotent). ``costs(target, args)``: the
    run's cost model, for methods under ``--tree auto`` (``runners.tree_costs``); without it the tree flags run as
    given."""
    if "dart" in METHODS:
        return

    def factory(name):
        return lambda target, args: _runner(name, target, args, EngineRunner, costs)
    register_method(MethodSpec(
        "dart", factory("dart"),
        "DART: head forward + N-gram-guided tree pruning (--dart-model-name-or-path, --ngram-model-name-or-path)",
        add_arguments=_add_arguments, auto_tree=True))
    register_method(MethodSpec(
        "dart_no_ngram", factory("dart_no_ngram"),
        "DART without the N-gram term (ablation): pruning by the head's logits only", auto_tree=True))
    register_method(MethodSpec(
        "dart_context", factory("dart_context"),
        "DART + context: the request's own text adds candidates to DART's tree and shares its N-gram term "
        "(--context-weight; docs/ARCHITECTURE.md section 5a)", auto_tree=True))
    register_method(MethodSpec(
        "dart_chain", factory("dart_chain"),
        "DART, one chain: the pruned tree's best path, --budget tokens long, the draft vLLM verifies (the "
        "plugin's chain; benchmarks/vllm_check.py sets the two acceptances side by side)", auto_tree=True))
    register_method(MethodSpec(
        "hybrid", factory("hybrid"),
        "baseline: prompt lookup while the context match is >= 3 tokens, the paper's DART otherwise",
        auto_tree=True))
    register_method(MethodSpec(
        "eagle3", factory("eagle3"),
        "EAGLE-3 baseline: autoregressive head + EAGLE-2 dynamic tree (--eagle3-model-name-or-path)",
        add_arguments=_add_eagle3_arguments, auto_tree=True))
    register_method(MethodSpec(
        "eagle3_context", factory("eagle3_context"),
        "EAGLE-3 + context: the live context's candidates in EAGLE-3's tree by DART + context's rule "
        "(--context-weight)", auto_tree=True))
