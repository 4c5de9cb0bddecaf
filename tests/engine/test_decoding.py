"""The decoding loop: lossless greedy (exact equality with vanilla), lossless sampling, limits, bad input."""
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dart_core.config import ConfigError, GenerationConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.drafters import AcceptedStep, Proposal, PromptLookupDrafter
from dart_core.models.templates import encode_chat, get_template
from dart_core.engine.tree import DraftTree
from sampling_checks import chi_square_p, exact_marginals


# ---------------------------------------------------------------- test drafters (real drafters of known trees)
class ChainDrafter:
    """Proposes a known continuation as a chain, plus a wrong sibling branch at the root."""
    name, needs_aux, max_tree_nodes = "chain", True, 12

    def __init__(self, continuation, wrong_token):
        self.continuation, self.wrong = list(continuation), wrong_token
        self.prompt_len, self.observed = 0, []

    def begin(self, prompt_ids, prefill_aux):
        self.prompt_len = len(prompt_ids)
        assert prefill_aux is not None and prefill_aux.shape[0] == len(prompt_ids)

    def propose(self, context):
        done = len(context) - self.prompt_len  # answer tokens so far; the root is answer[done - 1]
        chain = self.continuation[done - 1: done + 7]
        tokens, parents = [context[-1], self.wrong], [-1, 0]
        for i, t in enumerate(chain):
            tokens.append(t)
            parents.append(0 if i == 0 else len(tokens) - 2)
        return Proposal(DraftTree.from_parents(tokens, parents, scores=[0.0, -5.0] + [-1.0] * len(chain)))

    def observe(self, step: AcceptedStep):
        assert step.aux is not None and step.aux.shape[0] == len(step.tokens)
        self.observed.append(step)


class FixedTreeDrafter:
    """The same branching tree every step (children of the root: several tokens, each with children)."""
    name, needs_aux, max_tree_nodes = "fixed", False, 16

    def __init__(self, first_level, second_level):
        self.first, self.second = first_level, second_level

    def begin(self, prompt_ids, prefill_aux):
        pass

    def propose(self, context):
        tokens, parents, scores = [context[-1]], [-1], [0.0]
        for rank, a in enumerate(self.first):
            tokens.append(a); parents.append(0); scores.append(-rank)
            node = len(tokens) - 1
            for r2, b in enumerate(self.second):
                tokens.append(b); parents.append(node); scores.append(-rank - r2 - 1)
        return Proposal(DraftTree.from_parents(tokens, parents, scores))

    def observe(self, step):
        pass


# ---------------------------------------------------------------- greedy: exact equality
PROMPTS_FILE = Path(__file__).resolve().parents[1] / "data" / "prompts.jsonl"


def project_rows() -> list[dict]:
    """The project's own test prompts (tests/data/prompts.jsonl: chat, code, math, long, multilingual), so
    the lossless checks run in any clone, without the shared evaluation corpus."""
    return [json.loads(line) for line in PROMPTS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


def first_prompts(*categories: str) -> list[str]:
    """The first prompt of each named category."""
    rows = project_rows()
    return [next(r["prompt"] for r in rows if r["category"] == c) for c in categories]


def test_the_project_prompts_cover_every_kind():
    rows = project_rows()
    assert len(rows) >= 30 and len({r["id"] for r in rows}) == len(rows)
    assert {r["category"] for r in rows} == {"chat", "code", "math", "long", "multilingual"}
    assert all(isinstance(r["prompt"], str) and r["prompt"].strip() for r in rows)


@pytest.mark.bundled
def test_speculative_greedy_equals_vanilla_on_bundled_model(bundled_fp32):
    target = bundled_fp32
    template = get_template(target.template_name)
    cfg = GenerationConfig(max_new_tokens=24, max_length=2048)   # 30 prompts x 24 tokens: breadth over length
    vanilla, spec = SpeculativeEngine(target), SpeculativeEngine(target, PromptLookupDrafter())
    prompts = [r["prompt"] for r in project_rows()]
    assert len(prompts) >= 30
    taus = []
    for text in prompts:
        ids = encode_chat(target.tokenizer, template, [{"role": "user", "content": text}])
        ref = vanilla.generate(ids, cfg)
        out = spec.generate(ids, cfg)
        assert out.tokens == ref.tokens, f"prompt {text[:60]!r}: speculative output diverged from vanilla"
        assert ref.stats.tau == 1.0
        taus.append(out.stats.tau)
    assert np.mean(taus) > 1.0  # prompt lookup does accept drafts on these prompts


@pytest.mark.bundled
def test_vanilla_loop_equals_transformers_generate(bundled_fp32):
    target = bundled_fp32
    template = get_template(target.template_name)
    for text in first_prompts("chat", "code", "multilingual"):
        ids = encode_chat(target.tokenizer, template, [{"role": "user", "content": text}])
        ours = SpeculativeEngine(target).generate(ids, GenerationConfig(max_new_tokens=24)).tokens
        with torch.no_grad():
            hf = target.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)[0, len(ids):]
        assert ours == hf.tolist()[: len(ours)]


@pytest.mark.bundled
def test_bf16_tokens_are_target_argmax_up_to_bf16_ties(bundled_bf16):
    """In bf16, kernels of different widths may flip near-ties, so check each token against the
    target's own logits for its emitted prefix, allowing a bf16-sized margin."""
    target = bundled_bf16
    template = get_template(target.template_name)
    spec = SpeculativeEngine(target, PromptLookupDrafter())
    for text in first_prompts("code", "math", "long"):
        ids = encode_chat(target.tokenizer, template, [{"role": "user", "content": text}])
        out = spec.generate(ids, GenerationConfig(max_new_tokens=32))
        with torch.no_grad():
            logits = target.model(input_ids=torch.tensor([ids + out.tokens])).logits[0].float()
        rows = logits[len(ids) - 1: len(ids) - 1 + len(out.tokens)]
        chosen = rows.gather(1, torch.tensor(out.tokens).view(-1, 1)).view(-1)
        best = rows.max(-1).values
        # 4 bf16 ulps of the best logit (bf16 keeps 8 significant bits): room for a flipped near-tie only
        ulp = torch.exp2(torch.floor(torch.log2(best.abs().clamp_min(1.0))) - 7)
        assert ((best - chosen) <= 4 * ulp).all(), "a bf16 token is not the target's argmax, even up to a near-tie"


def test_greedy_chain_drafter_on_tiny_model(tiny_llama):
    cfg = GenerationConfig(max_new_tokens=30)
    ref = SpeculativeEngine(tiny_llama).generate([5, 6, 7, 8], cfg)
    drafter = ChainDrafter(ref.tokens[1:], wrong_token=(ref.tokens[1] + 1) % tiny_llama.vocab_size)
    out = SpeculativeEngine(tiny_llama, drafter).generate([5, 6, 7, 8], cfg)
    assert out.tokens == ref.tokens
    assert out.stats.tau > 5  # a perfect chain is accepted up to its length (8) + bonus
    step = out.traces[0]
    assert step.accepted_nodes[:2] == [0, 2]  # the wrong sibling (node 1) was skipped
    assert step.emitted_tokens == out.tokens[1: 1 + len(step.emitted_tokens)]


def test_eos_inside_an_accepted_path_stops_there(tiny_llama, monkeypatch):
    cfg = GenerationConfig(max_new_tokens=30)
    ref = SpeculativeEngine(tiny_llama).generate([3, 4, 5], cfg)
    eos_pos = 6  # pretend the 7th answer token is an end-of-sequence token
    fake_eos = ref.tokens[eos_pos]
    first = ref.tokens.index(fake_eos)
    monkeypatch.setattr(tiny_llama, "eos_token_ids", (fake_eos,))
    drafter = ChainDrafter(ref.tokens[1:], wrong_token=(ref.tokens[1] + 1) % tiny_llama.vocab_size)
    out = SpeculativeEngine(tiny_llama, drafter).generate([3, 4, 5], cfg)
    assert out.tokens == ref.tokens[: first + 1]
    assert out.stats.stop_reason == "eos" and out.traces[-1].stop_reason == "eos"


# ---------------------------------------------------------------- sampling: lossless (the checks: sampling_checks.py)
def test_speculative_sampling_matches_the_target_distribution(tiny_llama, monkeypatch):
    """Chi-square goodness of fit of answer tokens 1 and 2 (both produced by speculative steps).

    Threshold p < 1e-3 per token position: under a correct sampler a fresh set of seeds fails with
    probability 0.1% per position (0.2% for this test); the seeds are fixed, so the run is reproducible.
    """
    cfg = GenerationConfig(max_new_tokens=3, temperature=1.5, top_k=30)
    monkeypatch.setattr(tiny_llama, "eos_token_ids", ())  # compare raw token distributions, no early stop
    prompt = [10, 11, 12, 13]
    p1, p2 = exact_marginals(tiny_llama, prompt, cfg)
    # Draft the most likely tokens under the target so that acceptance and rejection both happen often.
    top = torch.topk(torch.from_numpy(p1), 4).indices.tolist()
    engine = SpeculativeEngine(tiny_llama, FixedTreeDrafter(first_level=top[:3], second_level=top[1:4]))
    V = tiny_llama.vocab_size
    c1, c2 = np.zeros(V), np.zeros(V)
    accepted = 0
    n = 2000
    for seed in range(n):
        cfg.seed = seed
        out = engine.generate(prompt, cfg)
        c1[out.tokens[1]] += 1
        c2[out.tokens[2]] += 1
        accepted += out.traces[0].accepted_drafts
    assert accepted > n * 0.1, "the test tree should be accepted often, or it tests only the residual path"
    assert chi_square_p(c1, p1) > 1e-3
    assert chi_square_p(c2, p2) > 1e-3


def test_seeded_sampling_is_reproducible_and_temperature_zero_is_greedy(tiny_llama):
    engine = SpeculativeEngine(tiny_llama, PromptLookupDrafter())
    a = engine.generate([1, 2, 3, 1, 2], GenerationConfig(max_new_tokens=20, temperature=0.8, seed=7))
    b = engine.generate([1, 2, 3, 1, 2], GenerationConfig(max_new_tokens=20, temperature=0.8, seed=7))
    assert a.tokens == b.tokens
    greedy = SpeculativeEngine(tiny_llama).generate([1, 2, 3, 1, 2], GenerationConfig(max_new_tokens=20))
    zero = engine.generate([1, 2, 3, 1, 2], GenerationConfig(max_new_tokens=20, temperature=0.0, top_p=0.5))
    assert zero.tokens == greedy.tokens and zero.traces[0].mode == "greedy"


# ---------------------------------------------------------------- limits and bad input
def test_max_length_edge(tiny_llama):
    prompt = list(range(20, 40))
    out = SpeculativeEngine(tiny_llama, PromptLookupDrafter()).generate(prompt, GenerationConfig(max_length=21,
                                                                                                  max_new_tokens=50))
    assert len(out.tokens) == 1 and out.stats.stop_reason == "max_length" and out.stats.steps == 0
    for max_length in (24, 27, 33):
        ref = SpeculativeEngine(tiny_llama).generate(prompt, GenerationConfig(max_length=max_length, max_new_tokens=50))
        drafter = ChainDrafter(ref.tokens[1:] + [0] * 20, wrong_token=0)
        out = SpeculativeEngine(tiny_llama, drafter).generate(prompt, GenerationConfig(max_length=max_length,
                                                                                        max_new_tokens=50))
        assert len(prompt) + len(out.tokens) == max_length
        assert out.tokens == ref.tokens and out.stats.stop_reason == "max_length"


def test_max_new_tokens_is_exact(tiny_llama):
    ref = SpeculativeEngine(tiny_llama).generate([7, 8, 9], GenerationConfig(max_new_tokens=40))
    out = SpeculativeEngine(tiny_llama, ChainDrafter(ref.tokens[1:], 0)).generate([7, 8, 9],
                                                                                 GenerationConfig(max_new_tokens=13))
    assert out.tokens == ref.tokens[:13] and out.stats.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("kwargs,msg", [
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=-3), "max_new_tokens"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(max_length=1), "max_length"),
])
def test_bad_settings_are_rejected(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        GenerationConfig(**kwargs)


def test_bad_prompts_are_rejected(tiny_llama):
    engine = SpeculativeEngine(tiny_llama)
    with pytest.raises(ConfigError, match="empty"):
        engine.generate([], GenerationConfig())
    with pytest.raises(ConfigError, match="max_length"):
        engine.generate(list(range(30)), GenerationConfig(max_length=30))
    with pytest.raises(ConfigError, match="token ids"):
        engine.generate([1, 2, tiny_llama.vocab_size], GenerationConfig())
    # the engine still works after rejecting bad input
    assert len(engine.generate([1, 2, 3], GenerationConfig(max_new_tokens=4)).tokens) == 4


def test_trace_records_every_stage(tiny_llama):
    out = SpeculativeEngine(tiny_llama, PromptLookupDrafter()).generate([1, 2, 3, 1, 2, 3, 1, 2],
                                                                        GenerationConfig(max_new_tokens=16))
    assert out.stats.steps == len(out.traces)
    assert sum(len(t.emitted_tokens) for t in out.traces) == len(out.tokens) - 1
    for t in out.traces:
        assert set(t.timings) == {"draft_forward", "tree_build", "verify", "commit"}
        assert len(t.node_target_prob) == len(t.tree) == len(t.node_target_argmax)


def test_the_walk_runs_the_lm_head_only_where_it_reads(tiny_llama, monkeypatch):
    """On the lean path a step computes the target's logits at the nodes its walk visits (and the few the verify
    computes first), not at every node; the trace's per-node choices are computed when read, and agree with the
    walk: along the accepted path each node's choice is the next accepted token, then the bonus."""
    if tiny_llama.fast is None:
        pytest.skip("the HF forward computes every row")
    prompt = [10, 11, 12, 13, 10, 11]
    ref = SpeculativeEngine(tiny_llama).generate(prompt, GenerationConfig(max_new_tokens=24))
    top = ref.tokens[:4]
    engine = SpeculativeEngine(tiny_llama, FixedTreeDrafter(first_level=top[:3], second_level=top[1:4]))
    rows: list[int] = []
    head = tiny_llama.fast.lm_head
    monkeypatch.setattr(tiny_llama.fast, "lm_head", lambda h: (rows.append(int(h.shape[0])), head(h))[1])
    out = engine.generate(prompt, GenerationConfig(max_new_tokens=24))
    assert out.tokens == ref.tokens
    nodes = sum(len(t.tree) for t in out.traces)
    assert out.stats.steps > 1 and 0 < sum(rows) < nodes
    during = sum(rows)
    for t in out.traces:   # read after the run: computed now, from the kept hidden states
        path = t.accepted_nodes
        for a, b in zip(path, path[1:]):
            assert t.node_target_argmax[a] == int(t.tree.tokens[b])
        assert t.node_target_argmax[path[-1]] == t.bonus_token
        assert len(list(t.node_target_argmax)) == len(t.tree) and len(list(t.node_target_prob)) == len(t.tree)
        assert all(0.0 <= p <= 1.0 for p in t.node_target_prob)
    assert sum(rows) > during


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_accepted_nodes_aux_rows_are_torchs_rows(dtype):
    """The loop takes the accepted nodes' aux rows through numpy where it can (float32 on a CPU): the same rows, in
    the accepted order, as torch's indexing; bf16 (no numpy type) through torch."""
    from dart_core.engine.decoding import _accepted_aux
    aux = torch.randn(7, 12).to(dtype)
    for nodes in ([0], [0, 3, 5], [0, 1, 2, 3, 4, 5, 6], []):
        got = _accepted_aux(aux, nodes)
        assert got.dtype == dtype and got.shape == (len(nodes), 12) and got.is_contiguous()
        assert torch.equal(got, aux[nodes])
