"""The decoding loop: draft -> verify -> accept -> commit, one StepTrace per step.

    engine = SpeculativeEngine(target, drafter)          # drafter=None: vanilla decoding
    for trace in engine.stream(prompt_ids, config): ...  # live steps; returns a GenerationResult
    result = engine.generate(prompt_ids, config)         # the same loop, collected

Vanilla decoding is this very loop with a root-only tree, so speculative and plain
decoding share every line that could make their outputs differ.

Stages as timed: *verify* is the target's forward over the tree plus the acceptance walk, which reads the
target's logits at the nodes it visits (on the lean CPU path the LM head runs for those rows only);
*commit* keeps the accepted path's K/V and hands the step to the drafter.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Generator, Sequence

import torch

from ..config import ConfigError, GenerationConfig
from .protocol import AcceptedStep, Drafter, Proposal
from .sampling import accept_greedy, accept_sampling, warp_probs
from .trace import STAGES, OnRequest, StepTrace
from .tree import DraftTree

if TYPE_CHECKING:  # the engine runs any target with TargetModel's methods; models sit above it
    from ..models.target import TargetModel

logger = logging.getLogger(__name__)


class EngineBusyError(RuntimeError):
    """An engine was asked to start a generation while another one is still open on it (its KV cache and
    drafter state belong to that generation): each generation needs an engine of its own."""


@dataclass
class GenerationStats:
    """tau = tokens committed by verify steps / verify steps (prefill excluded, bonus included);
    tokens_per_s = new tokens / wall time from request to last token (prefill included)."""
    new_tokens: int = 0
    steps: int = 0
    tau: float = 0.0
    prefill_s: float = 0.0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})
    stop_reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    tokens: list[int]           # answer tokens (EOS included when reached)
    text: str                   # decoded answer, cut before EOS
    stats: GenerationStats
    traces: list[StepTrace]


class SpeculativeEngine:
    """One engine = one target session (its own KV cache) + an optional drafter.

    The cache and the drafter's state belong to one generation at a time: ``stream()`` owns the engine from
    its first step until it returns or is closed, and another generation started meanwhile raises
    :class:`EngineBusyError` before touching any state (two interleaved generations would otherwise each
    continue from the other's cache)."""

    def __init__(self, target: TargetModel, drafter: Drafter | None = None, name: str | None = None):
        self.target = target
        self.drafter = drafter
        self.name = name or (drafter.name if drafter is not None else "vanilla")
        self._session = None
        self._session_capacity = -1
        self._owner = threading.Lock()   # held by the open generation (released by any thread that ends it)

    @property
    def busy(self) -> bool:
        """True while a generation is open on this engine."""
        return self._owner.locked()

    def cache_nbytes(self) -> int:
        """Bytes held by this engine's own caches (the target KV cache and the drafter head's cache);
        the weights are shared with every other engine of the target and are not counted."""
        total = 0
        if self._session is not None:
            for layer in getattr(self._session.cache, "layers", ()):
                total += sum(int(t.nbytes) for t in (getattr(layer, "key_buffer", None),
                                                     getattr(layer, "value_buffer", None)) if t is not None)
        drafter_nbytes = getattr(self.drafter, "cache_nbytes", None)   # optional in the Drafter protocol
        return total + (int(drafter_nbytes()) if drafter_nbytes is not None else 0)

    # ------------------------------------------------------------------ helpers
    def _sync(self, config: GenerationConfig) -> None:
        if config.profile_stages and self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)

    def reserve(self, config: GenerationConfig) -> None:
        """Allocate (or keep) the KV cache a generation under ``config`` needs, now rather than in its first step.

        A cache is ``max_length`` + one tree of positions per layer (97 MB for the bundled model at 2,048), zeroed
        when allocated: done inside the first ``next()`` it is timed as that generation's prefill. The page's
        engines built for new settings showed it (under a busy browser on the same 2 cores, 0.8x instead of 1.5x
        for DART on a 62-token answer), so a caller that times steps (``ui.session.Comparison``) reserves first.
        Nothing is allocated for a config that ``stream`` would refuse (it reports the error itself)."""
        try:
            config.validate()
        except ConfigError:
            return
        if not self._owner.acquire(blocking=False):
            raise EngineBusyError(f"engine {self.name!r} is running a generation; its cache cannot be reserved "
                                  "for another one (close the other one first)")
        try:
            self._session_for(config)
        finally:
            self._owner.release()

    def _session_for(self, config: GenerationConfig):
        # A generation's cache: max_length positions and one tree past them. Reuse the preallocated cache across
        # requests when it is big enough.
        capacity = config.max_length + (self.drafter.max_tree_nodes if self.drafter is not None else 1)
        if (self._session is None or self._session_capacity < capacity
                or self._session.cache.key_dtype != self.target.activation_dtype):
            self._session = self.target.new_session(capacity)
            self._session_capacity = capacity
        self._session.reset()
        return self._session

    def _validate(self, prompt_ids: Sequence[int], config: GenerationConfig) -> list[int]:
        config.validate()
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ConfigError("the prompt is empty: give at least one token")
        if len(ids) >= config.max_length:
            raise ConfigError(f"the prompt has {len(ids)} tokens but max_length is {config.max_length}: "
                              "shorten the prompt or raise max_length (--max-length)")
        vocab = self.target.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ConfigError(f"prompt token ids must lie in [0, {vocab}); got {min(ids)}..{max(ids)}")
        return ids

    # ------------------------------------------------------------------ the loop
    def stream(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None
               ) -> Generator[StepTrace, None, GenerationResult]:
        """Steps of one generation (a generator: nothing runs before the first ``next()``). The engine is this
        generation's from its first step until it finishes or is closed; see :class:`EngineBusyError`."""
        if not self._owner.acquire(blocking=False):
            raise EngineBusyError(f"engine {self.name!r} is already running another generation; a generation "
                                  "needs an engine of its own (close the other one first)")
        try:
            return (yield from self._stream(prompt_ids, config))
        finally:
            self._owner.release()

    def _stream(self, prompt_ids: Sequence[int], config: GenerationConfig | None
                ) -> Generator[StepTrace, None, GenerationResult]:
        config = config or GenerationConfig()
        prompt = self._validate(prompt_ids, config)
        drafter = self.drafter
        want_aux = bool(drafter is not None and drafter.needs_aux)
        step_done = getattr(drafter, "step_done", None)   # optional: a drafter that learns from whole steps
        session = self._session_for(config)
        eos = set(self.target.eos_token_ids)
        generator = None
        if not config.greedy:
            generator = torch.Generator(device="cpu")
            if config.seed is not None:
                generator.manual_seed(config.seed)
            else:
                generator.seed()

        stats = GenerationStats()
        traces: list[StepTrace] = []
        t_start = time.perf_counter()
        out = session.prefill(prompt, want_aux=want_aux)
        first = self._choose(out.logits[-1], config, generator)
        self._sync(config)
        stats.prefill_s = time.perf_counter() - t_start
        answer = [first]
        if drafter is not None:
            drafter.begin(prompt, out.aux)
        stop = self._stop_reason(answer, len(prompt), config, eos)

        while stop is None:
            remaining = min(config.max_new_tokens - len(answer), config.max_length - len(prompt) - len(answer))
            context = prompt + answer
            t0 = time.perf_counter()
            proposal = drafter.propose(context) if drafter is not None else Proposal(DraftTree.root_only(answer[-1]))
            tree = proposal.tree
            if int(tree.tokens[0]) != answer[-1]:
                raise RuntimeError(f"drafter {self.name!r} proposed a tree rooted at token {int(tree.tokens[0])}, "
                                   f"expected the last committed token {answer[-1]}")
            candidates = proposal.candidates
            if len(tree) > 1:  # drafts deeper than the tokens we may still emit can never be used
                tree, new_index = tree.truncated_with_index(max_depth=remaining - 1,
                                                            max_nodes=session.capacity - session.length)
                if new_index is not None and candidates is not None:  # the trace describes the verified tree
                    candidates = candidates.with_nodes_remapped(new_index)
            self._sync(config)
            t1 = time.perf_counter()
            vout = session.verify(tree, want_aux=want_aux)
            logits = vout.logits   # NodeLogits: rows computed as the walk reads them
            children = tree.children()
            target_argmax = _node_target_argmax(logits)
            if config.greedy:   # the walk computes the rows it visits, one at a time past the first ones
                acc = accept_greedy(tree, target_argmax.per_node(), children)
            else:
                acc = accept_sampling(tree, _node_probs(logits, config).per_node(), children, generator)
            self._sync(config)
            t2 = time.perf_counter()

            emitted = [int(tree.tokens[n]) for n in acc.accepted_nodes[1:]] + [acc.bonus_token]
            session.commit(acc.accepted_nodes)
            if drafter is not None:
                aux = _accepted_aux(vout.aux, acc.accepted_nodes) if want_aux else None
                drafter.observe(AcceptedStep([int(tree.tokens[n]) for n in acc.accepted_nodes],
                                             acc.bonus_token, aux))
            self._sync(config)
            t3 = time.perf_counter()

            # Cut at the first EOS inside the emitted tokens and at the length limits.
            for i, tok in enumerate(emitted):
                if tok in eos:
                    emitted = emitted[: i + 1]
                    break
            emitted = emitted[:remaining]
            position = len(answer)
            answer.extend(emitted)
            stop = self._stop_reason(answer, len(prompt), config, eos)

            timings = {"draft_forward": proposal.draft_forward_s,
                       "tree_build": (t1 - t0) - proposal.draft_forward_s,
                       "verify": t2 - t1, "commit": t3 - t2}
            for k, v in timings.items():
                stats.stage_s[k] += v
            stats.steps += 1
            trace = StepTrace(
                step=stats.steps, position=position, tree=tree, accepted_nodes=acc.accepted_nodes,
                emitted_tokens=emitted, bonus_token=acc.bonus_token,
                node_target_prob=_node_target_probs(tree, logits, config),
                node_target_argmax=target_argmax, timings=timings, candidates=candidates,
                mode="greedy" if config.greedy else "sampling", stop_reason=stop, head_rows=proposal.head_rows)
            logits.release()   # a row is V floats; the page's late reads compute theirs again
            if not logits.lazy:  # every row exists already: record the lists now rather than keep the logits
                trace.node_target_prob = list(trace.node_target_prob)
                trace.node_target_argmax = list(trace.node_target_argmax)
            traces.append(trace)
            if step_done is not None:
                step_done(trace)
            yield trace

        stats.wall_s = time.perf_counter() - t_start
        stats.new_tokens = len(answer)
        stats.tau = (len(answer) - 1) / stats.steps if stats.steps else 0.0
        stats.tokens_per_s = stats.new_tokens / stats.wall_s if stats.wall_s > 0 else 0.0
        stats.stop_reason = stop
        return GenerationResult(tokens=answer, text=self.decode_answer(answer), stats=stats, traces=traces)

    def generate(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None) -> GenerationResult:
        gen = self.stream(prompt_ids, config)
        while True:
            try:
                next(gen)
            except StopIteration as done:
                return done.value

    # ------------------------------------------------------------------ small pieces
    def _choose(self, logits: torch.Tensor, config: GenerationConfig, generator) -> int:
        if config.greedy:
            return int(logits.argmax())
        probs = warp_probs(logits, config.temperature, config.top_k, config.top_p)
        return int(torch.multinomial(probs, 1, generator=generator))

    @staticmethod
    def _stop_reason(answer: list[int], prompt_len: int, config: GenerationConfig, eos: set[int]) -> str | None:
        if answer[-1] in eos:
            return "eos"
        if len(answer) >= config.max_new_tokens:
            return "max_new_tokens"
        if prompt_len + len(answer) >= config.max_length:
            return "max_length"
        return None

    def decode_answer(self, tokens: Sequence[int]) -> str:
        eos = set(self.target.eos_token_ids)
        cut = next((i for i, t in enumerate(tokens) if t in eos), len(tokens))
        return self.target.tokenizer.decode(list(tokens[:cut]), skip_special_tokens=True)


def _accepted_aux(aux: torch.Tensor, nodes: list[int]) -> torch.Tensor:
    """The aux rows of the accepted nodes. On a CPU in numpy: torch's indexing of these few rows took ~0.15 ms a
    step in the loop (about 7 us alone), numpy's a third of that (DART + context on context_dev, Zen 4 EPYC)."""
    if aux.device.type == "cpu" and aux.dtype == torch.float32:   # the lean path's (bf16 has no numpy type)
        return torch.from_numpy(aux.numpy()[nodes])
    return aux[nodes]


# Each step's lists are made by a function of that step's logits (a lambda in the loop would read whichever
# step's logits the loop variable holds when a list is read later).
def _node_target_argmax(logits) -> OnRequest:
    """Per node, the target's most likely next token; computed when first read. numpy's argmax (the first
    maximum, as torch's) runs on the calling thread: torch's would wake its OpenMP team for a row of V floats
    every step, whose spinning threads then compete with the native kernels' pool for the same cores."""
    def argmax(nodes: list[int]) -> list[int]:
        rows = logits.rows(nodes)
        return (rows.numpy().argmax(-1) if rows.device.type == "cpu" else rows.argmax(-1)).tolist()
    return OnRequest(len(logits), argmax, holds_nbytes=logits.nbytes)


def _node_probs(logits, config: GenerationConfig) -> OnRequest:
    """Per node, the target's warped distribution [V] (the sampling walk's rows)."""
    warp = (config.temperature, config.top_k, config.top_p)   # the values now: a config may change later
    return OnRequest(len(logits), lambda nodes: list(warp_probs(logits.rows(nodes), *warp)))


def _node_target_probs(tree: DraftTree, logits, config: GenerationConfig) -> OnRequest:
    """Per node, the target's probability of the node's token at its parent (root: 1.0): the warped
    distribution when sampling, the plain softmax (temperature 1) in greedy mode. Computed when first read."""
    greedy, warp = config.greedy, (config.temperature, config.top_k, config.top_p)

    def compute(nodes: list[int]) -> list[float]:
        out = [1.0] * len(nodes)
        drafted = [k for k, n in enumerate(nodes) if n > 0]
        if drafted:
            parents = [int(tree.parents[nodes[k]]) for k in drafted]
            toks = torch.as_tensor([int(tree.tokens[nodes[k]]) for k in drafted]).view(-1, 1)
            rows = logits.rows(parents)
            if greedy:
                p = torch.exp(rows.gather(1, toks).view(-1) - torch.logsumexp(rows, dim=-1))
            else:
                p = warp_probs(rows, *warp).gather(1, toks).view(-1)
            for k, v in zip(drafted, p.tolist()):
                out[k] = v
        return out
    return OnRequest(len(tree), compute)
