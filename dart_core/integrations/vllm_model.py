"""The DART head as a vLLM draft model, driven by vLLM's EAGLE-3 proposer (registered by ``vllm_plugin.register``).

vLLM imports this module only where it builds the draft model; it imports vLLM at the top. The plan, and where
vLLM's interfaces stop, is in :mod:`dart_core.integrations.vllm_plugin`'s docstring. Two paths, chosen by the
speculative config's ``parallel_drafting`` (fixed for the engine's life):

One forward (``parallel_drafting`` True; the head's config.json has ``mask_token_id``): vLLM's proposer runs the
model once a step over the newly verified positions followed by k - 1 mask rows per request (input id
``mask_token_id``, hidden state ``fc(mask_hidden)``). This model's ``mask_hidden`` is NaN, so those rows' hidden
states are NaN and nothing else's is: the model puts ``mask_rep`` (and residual ``mask_rep[:H]``) in exactly those
rows, the other rows as below. ``compute_logits`` gets k rows a request (request-major: level 0, the last verified
row, then the k - 1 mask slots), takes every level's top-k in one call and every request's chain from all its
levels in one :meth:`~.vllm_plugin.ChainDrafter.chains` call.

k passes (``parallel_drafting`` False, vLLM's default; the fallback), per speculative step:

* pass 0 (the proposer's first call): the rows of the newly verified positions, input = the next token and the
  target's combined aux features ``fc(aux)``, as in ``DartHead.embed_inputs``; the row the proposer samples (the last
  verified position, whose next token is the root) gives tree level 0;
* passes 1..k-1: one row per request at positions i+1, i+2, ...: DART's mask slots (input ``mask_rep``, residual
  ``mask_rep[:H]``, as ``DartHead.mask_inputs``). The model tells them from pass-0 rows by the hidden state the
  proposer hands back: this model returns NaN rows for it, which no target feature is;
* the decoder layer is the head's (``DartHead.layer``: attention, ``hidden = residual + o_proj``, then
  ``hidden + mlp(post_attention_layernorm(hidden))``), on vLLM's layers and paged KV cache, and the logits are
  ``lm_head(norm(norm(hidden)))``;
* ``compute_logits`` of pass l takes level l's top-k (target ids through ``d2t``), and the chain's token for level l
  from :class:`~.vllm_plugin.ChainDrafter` (levels 0..l and the context tail); it returns logits that are 0 at that
  token and -inf elsewhere, so vLLM's greedy draft sampling (argmax) or probabilistic one drafts it.

The context tail (the root and the tokens before it, for the N-gram term) is not something a draft model is handed:
the model keeps the token of every position it has run in a table indexed like vLLM's KV cache slots (from the
attention metadata's slot mapping and block table), and the sampled rows carry their tail to ``compute_logits`` in
extra float32 columns (token ids are exact in float32 below 2**24). With prefix caching, a cached block's last slot
holds the token that followed it in the request that filled it: a tail reaching across it may be off by that token
(the draft may differ, never the output).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

from .vllm_plugin import level_topk, open_chain_drafter, parallel_drafting_refusal

logger = logging.getLogger(__name__)

_EXACT_IDS = 1 << 24   # token ids a float32 column holds exactly


class DartEagle3ForCausalLM(Eagle3LlamaForCausalLM):
    """A DART head (published layout) as the draft model of vLLM's EAGLE-3 proposer."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        spec = vllm_config.speculative_config
        if spec is None or spec.method != "eagle3":
            raise ValueError("a DART head runs in vLLM under speculative_config method 'eagle3' (its proposer hands "
                             f"the draft model the target's aux features); got method {getattr(spec, 'method', None)!r}")
        if spec.use_local_argmax_reduction:
            raise ValueError("DART in vLLM drafts through compute_logits; unset use_local_argmax_reduction")
        #: one forward a step (vLLM's parallel drafting) or k one-row passes (the fallback)
        self.one_forward = bool(spec.parallel_drafting)
        if self.one_forward:
            # vLLM's proposer refuses a head without the field before the model is built; this names the fix
            refusal = parallel_drafting_refusal(spec.draft_model_config.hf_config, int(spec.num_speculative_tokens),
                                                vllm_config.model_config.get_vocab_size())
            if refusal:
                raise ValueError(f"DART in vLLM: {refusal}")
            schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None) or ()
            odd = sorted({int(e[2]) for e in schedule} - {0, int(spec.num_speculative_tokens)})
            if odd:
                # vLLM 0.32's proposer lays out num_speculative_tokens rows a request for parallel drafting and
                # views the sampled ids as [-1, K] for the step's K: for 0 < K < the maximum that is not [B, K]
                raise ValueError(f"DART in vLLM: parallel_drafting with num_speculative_tokens_per_batch_size K = "
                                 f"{odd}: vLLM's parallel drafting runs num_speculative_tokens = "
                                 f"{spec.num_speculative_tokens} rows a request, so each K must be 0 or that; leave "
                                 "parallel_drafting unset (the k-pass path) for other K")
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        c = self.config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        levels = int(getattr(c, "draft_length", 0)) + 1
        if spec.num_speculative_tokens > levels:
            raise ValueError(f"num_speculative_tokens={spec.num_speculative_tokens}, but this DART head drafts "
                             f"{levels} levels (draft_length {levels - 1} + 1): use at most {levels}")
        if vllm_config.model_config.get_vocab_size() > _EXACT_IDS:
            raise ValueError("DART in vLLM carries token ids in float32 columns: vocabularies up to 2**24 only")
        self.mask_rep = nn.Parameter(torch.zeros(2 * c.hidden_size), requires_grad=False)
        target = getattr(c, "dart_target", None) or {}
        if target.get("aux_layer_ids") and not getattr(c, "eagle_aux_hidden_state_layer_ids", None):
            # the target layers the head was trained on; vLLM's runner reads this when it sets the target's aux outputs
            c.eagle_aux_hidden_state_layer_ids = [int(i) for i in target["aux_layer_ids"]]
        self.chain = open_chain_drafter(target, vllm_config.model_config.tokenizer)
        self.target_vocab = int(vllm_config.model_config.get_vocab_size())
        self.block_size = int(vllm_config.cache_config.block_size)
        self._slot_tokens = torch.full((0,), -1, dtype=torch.long)   # KV slot -> the token after that position
        self._level = -1
        self._rows: list[tuple[np.ndarray, np.ndarray]] = []
        self._tails: np.ndarray | None = None

    # ------------------------------------------------------------------ weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]):
        rest, found = [], False
        for name, tensor in weights:
            if name.endswith("mask_rep"):
                self.mask_rep.data.copy_(tensor.to(self.mask_rep.dtype).view(-1))
                found = True
            else:
                rest.append((name, tensor))
        if not found:
            raise ValueError("this checkpoint has no midlayer.mask_rep: it is not a DART head")
        if self.one_forward:
            if any("mask_hidden" in name for name, _ in rest):
                raise ValueError("this DART checkpoint carries a mask_hidden: a DART head's mask rows take mask_rep, "
                                 "and the model sets mask_hidden itself (NaN, the mark of a mask row)")
            # vLLM's parent class copies it into its mask_hidden buffer; the proposer then takes fc(mask_hidden),
            # NaN, as every mask row's hidden state, which is how forward() tells those rows
            rest.append(("mask_hidden", torch.full_like(self.mask_hidden, float("nan"))))
        return super().load_weights(rest)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.model.layers[0]
        n, H = hidden_states.shape[0], self.config.hidden_size
        tails = torch.zeros((n, self.chain.context_tokens), dtype=torch.float32, device=hidden_states.device)
        if self.one_forward:               # verified rows and mask rows in one forward
            x, residual = self._one_forward_inputs(layer, input_ids, positions, hidden_states, inputs_embeds, tails)
        elif n > 0 and bool(torch.isnan(hidden_states[0, 0])):   # a mask pass: DART's mask slots (DartHead.mask_inputs)
            rep = self.mask_rep.to(hidden_states.dtype)
            x, residual = rep.expand(n, -1).contiguous(), rep[:H].expand(n, -1).contiguous()
            self._level += 1
        else:                              # verified positions: next token + fc(aux) (DartHead.embed_inputs)
            x, residual = self._verified_inputs(layer, input_ids, hidden_states, inputs_embeds), hidden_states
            tails = self._context_tails(input_ids, positions, n, tails)
            self._level = 0
        hidden = residual + layer.self_attn(positions=positions, hidden_states=x)
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        sample = torch.cat([self.model.norm(hidden).float(), tails], dim=-1)
        return sample, torch.full_like(hidden_states, float("nan"))

    def _verified_inputs(self, layer, input_ids: torch.Tensor, hidden_states: torch.Tensor,
                         inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        """The layer input of verified rows: the next token's embedding beside fc(aux), each normed."""
        embeds = self.model.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        return torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden_states)], dim=-1)

    def _one_forward_inputs(self, layer, input_ids: torch.Tensor, positions: torch.Tensor,
                            hidden_states: torch.Tensor, inputs_embeds: torch.Tensor | None,
                            tails: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(layer input, residual) of verified rows (next token + fc(aux)) and mask rows (``mask_rep``) at once;
        fills ``tails`` for the verified rows. A mask row is one whose hidden state is NaN: ``fc(mask_hidden)``, never
        a target's."""
        H = self.config.hidden_size
        mask = torch.isnan(hidden_states[:, 0]).unsqueeze(1)
        rep = self.mask_rep.to(hidden_states.dtype)
        x = torch.where(mask, rep, self._verified_inputs(layer, input_ids, hidden_states, inputs_embeds))
        residual = torch.where(mask, rep[:H], hidden_states)   # fresh tensors with real rows: no stride-0 rows
        self._context_tails(input_ids, positions, hidden_states.shape[0], tails, keep=~mask[:, 0])
        return x, residual

    def _context_tails(self, input_ids: torch.Tensor, positions: torch.Tensor, n: int,
                       tails: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """[n, T] float32: each row's context tail, the row's own next token (for the sampled row: the root) last.
        keep: the rows whose token the slot table records (None: all; mask rows' ids are not tokens)."""
        tails[:, -1] = input_ids[:n].float()
        md = self._metadata()
        if md is None:                     # a dummy run
            return tails
        m = int(md.num_actual_tokens)
        slots = md.slot_mapping[:m].long()
        table = md.block_table
        need = (int(table.max()) + 1) * self.block_size if table.numel() else 0
        need = max(need, int(slots.max()) + 1 if m else 0)
        if need > self._slot_tokens.numel():
            grown = torch.full((need,), -1, dtype=torch.long)
            grown[: self._slot_tokens.numel()] = self._slot_tokens
            self._slot_tokens = grown
        ok = slots >= 0
        if keep is not None:
            ok = ok & keep[:m].to(ok.device)
        self._slot_tokens[slots[ok].cpu()] = input_ids[:m][ok].long().cpu()
        T = tails.shape[1]
        if T > 1 and m:
            req = torch.searchsorted(md.query_start_loc[1:].long(), torch.arange(m, device=slots.device),
                                     right=True).clamp_max(table.shape[0] - 1)
            pos = positions[:m].long()
            for d in range(1, T):          # tok(p+1-d) lies in the slot of position p-d
                q = pos - d
                valid = q >= 0
                qc = q.clamp_min(0)
                slot = table[req, (qc // self.block_size).clamp_max(table.shape[1] - 1)].long() * self.block_size + qc % self.block_size
                tok = self._slot_tokens[slot.cpu()].to(tails.device)
                tails[:m, T - 1 - d] = torch.where(valid, tok, torch.full_like(tok, -1)).float()
        return tails

    def _metadata(self):
        ctx = get_forward_context()
        md = ctx.attn_metadata
        if md is None:
            return None
        if isinstance(md, list):           # micro-batches: not used on this path
            md = md[0]
        return md.get(self.model.layers[0].self_attn.attn.layer_name)

    # ------------------------------------------------------------------ drafting
    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        H = self.config.hidden_size
        x = hidden_states[:, :H].to(self.lm_head.weight.dtype)
        logits = self.logits_processor(self.lm_head, self.model.norm(x))     # the second norm: lm_head(norm(norm(h)))
        vals, toks = level_topk(logits, self.chain.pruning.level_top_k, self.draft_id_to_target_id)
        if self.one_forward:
            return self._one_forward_chains(hidden_states, vals, toks)
        B = vals.shape[0]
        if self._level == 0 or self._tails is None or self._tails.shape[0] != B or len(self._rows) != self._level:
            if self._level != 0:
                logger.warning("DART in vLLM: pass %d came without its earlier passes; drafting from it alone",
                               self._level)
            self._rows = []
            self._tails = hidden_states[:, H:].float().cpu().numpy().astype(np.int64)
        self._rows.append((vals, toks))
        # levels 0..l of every request [B, l + 1, k]; this pass drafts each chain's last token
        levels_v = np.stack([v for v, _ in self._rows], axis=1)
        levels_t = np.stack([t for _, t in self._rows], axis=1)
        chosen = self.chain.chains(levels_v, levels_t, self._tails)[:, -1]
        return self._one_point(chosen, hidden_states.device)

    def _one_forward_chains(self, hidden_states: torch.Tensor, vals: np.ndarray, toks: np.ndarray) -> torch.Tensor:
        """Rows request-major, k a request (level 0, then the mask slots): every request's chain in one call."""
        R, K = vals.shape[0], self.num_speculative_tokens
        if R % K:
            raise RuntimeError(f"DART in vLLM (one forward): {R} rows to sample, not {K} a request; vLLM's parallel "
                               "drafting hands the draft model k rows a request")
        B, width = R // K, vals.shape[1]
        tails = hidden_states[::K, self.config.hidden_size:].float().cpu().numpy().astype(np.int64)   # level-0 rows
        chosen = self.chain.chains(vals.reshape(B, K, width), toks.reshape(B, K, width), tails)
        return self._one_point(chosen.reshape(-1), hidden_states.device)

    def _one_point(self, chosen: np.ndarray, device) -> torch.Tensor:
        """[R] chosen target ids -> logits 0 there and -inf elsewhere (a one-point draft distribution)."""
        R = int(chosen.shape[0])
        out = torch.full((R, self.target_vocab), float("-inf"), dtype=torch.float32, device=device)
        out[torch.arange(R), torch.as_tensor(chosen, device=out.device)] = 0.0
        return out

    def get_top_tokens(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden_states).argmax(dim=-1)
