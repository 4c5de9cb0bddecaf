"""The draft heads' native step (native/src/head_step.hpp, dart_core/models/heads/native_step.py) against the
torch heads: a float64 run of the torch head is the reference (bf16 weights are exact in float64), the native
step computes in float32, so logits agree to float32 rounding and top-k ids agree wherever the reference's
top-k is not a near-tie. Drafters on the native step propose the same trees as on the torch head in float64,
greedy and sampling outputs stay identical to vanilla's, and bad input is refused before anything is read.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from dart_core import _native
from dart_core.config import GenerationConfig
from dart_core.drafters.dart import DartDrafter
from dart_core.drafters.eagle3 import Eagle3Drafter, Eagle3TreeConfig
from dart_core.drafters.pruning import PruningConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.engine.protocol import AcceptedStep
from dart_core.models.heads.dart import new_head_for_target
from dart_core.models.heads.eagle3 import new_eagle3_head_for_target
from dart_core.models.heads.native_step import HEAD_BACKENDS, NativeHeadStep, prepare_head

PROMPTS = ["Write a Python function that returns the sum", "The quick brown fox", "What is 12 times 7?"]


# The kernel paths a reference test runs: the float32-activation path (the best one that keeps float32 activations:
# float32 rounding only) and each bf16 dot-product path this CPU runs (amx, avx512bf16: with bf16 weights they round
# every weight product's input to bf16, so values agree to that rounding, BF16_DOT_TOL times looser: 3e-3 and 6e-3 of
# the largest value, about one bf16 rounding of it; 100 times failed on qwen3's EAGLE-3 step).
_PATHS = list(_native.small_gemm_paths())
_BF16_DOT = [p for p in ("amx", "avx512bf16") if p in _PATHS]
BF16_DOT_TOL = 300.0


@pytest.fixture(params=["float32-activations", *_BF16_DOT])
def kernel_tol(request):
    """Forces a kernel path for the test; the tolerance factor for bf16 weights on it."""
    before = _native.small_gemm_path()
    f32_path = next(p for p in _PATHS if p not in _BF16_DOT)
    _native.small_gemm_set_path(f32_path if request.param == "float32-activations" else request.param)
    yield 1.0 if request.param == "float32-activations" else BF16_DOT_TOL
    _native.small_gemm_set_path(before)


def _dart_head(t, dtype=torch.float32, draft_length=4, seed=5):
    head = new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=draft_length, seed=seed)
    return head.to(dtype).attach_embedding(t.model.get_input_embeddings().weight)


def _eagle_head(t, dtype=torch.float32, seed=1):
    head = new_eagle3_head_for_target(t, draft_ids=torch.arange(0, t.vocab_size, 2), seed=seed)
    return head.to(dtype).attach_embedding(t.model.get_input_embeddings().weight)


def _reference(head):
    """The torch head in float64 (same values: bf16 and float32 are exact in float64), the same embedding."""
    ref = copy.deepcopy(head).double()
    return ref.attach_embedding(head.embedding)


def _inputs(t, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3 * t.hidden_size, generator=g), torch.randint(0, t.vocab_size, (n,), generator=g)


def _assert_top_k_matches(vals, toks, ref_logits, d2t, k, atol):
    """vals/toks [rows, k] from the native step; ref_logits [rows, V_d] float64. Values agree to atol; ids agree
    column by column up to the first pair of reference values closer than 2 * atol (a near-tie may swap)."""
    ref_logits = ref_logits.detach()
    ref_vals, ref_idx = torch.topk(ref_logits, min(k + 1, ref_logits.shape[-1]), dim=-1)
    np.testing.assert_allclose(vals, ref_vals[:, :k].numpy(), atol=atol, rtol=0)
    ref_toks = (ref_idx + d2t[ref_idx]).numpy()
    gap = torch.cat([ref_vals[:, :-1] - ref_vals[:, 1:], torch.full_like(ref_vals[:, :1], float("inf"))], dim=1)
    for r in range(vals.shape[0]):
        for j in range(k):
            if gap[r, j] < 2 * atol or (j and gap[r, j - 1] < 2 * atol):
                break
            assert toks[r, j] == ref_toks[r, j], f"row {r} column {j}: native id {toks[r, j]}, reference {ref_toks[r, j]}"


# ---------------------------------------------------------------------------------------------- DART
@pytest.mark.parametrize("model", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dart_step_equals_the_float64_torch_head(tiny_llama_qwen3, model, dtype, kernel_tol):
    t = tiny_llama_qwen3[model]
    tol = kernel_tol if dtype == torch.bfloat16 else 1.0
    head = _dart_head(t, dtype)
    ref = _reference(head)
    step = NativeHeadStep(head)
    cache, ref_cache = step.new_cache(capacity=4), ref.new_cache(capacity=4)   # small: both grow
    D = head.config.draft_length
    # A long first step (the prompt), then steps of 1..3 new positions with every number of levels, edge ones too.
    for i, (n, levels, k) in enumerate([(9, D + 1, 5), (1, 1, 1), (3, 2, 7), (2, D + 1, head.config.draft_vocab_size),
                                        (1, D + 1, 3), (1, 3, 4)]):
        aux, ids = _inputs(t, n, seed=i)
        want = ref.step(aux.double(), ids, ref_cache, levels)                  # [levels, V_d] float64
        vals, toks, logits = step.dart_logits(aux, ids.numpy(), cache, levels, k)
        assert cache.length == ref_cache.length, "the native step must keep the real positions only"
        assert logits.shape == (levels, head.config.draft_vocab_size) and vals.shape == toks.shape == (levels, k)
        scale = float(want.abs().max())
        np.testing.assert_allclose(logits, want.numpy(), atol=tol * 1e-5 * scale, rtol=0)
        _assert_top_k_matches(vals, toks, want, head.d2t, k, tol * 1e-5 * scale)


def test_dart_step_is_the_same_on_one_and_two_threads(tiny_llama_qwen3):
    """Every output is summed in a fixed order (GEMM rows, attention heads): the thread count changes no bit."""
    t = tiny_llama_qwen3["llama"]
    head = _dart_head(t, torch.bfloat16)
    step = NativeHeadStep(head)
    outs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        cache = step.new_cache()
        for i, (n, levels) in enumerate([(7, 5), (2, 3), (1, 5)]):
            aux, ids = _inputs(t, n, seed=10 + i)
            outs.append(step.dart_logits(aux, ids.numpy(), cache, levels, 6))
    half = len(outs) // 2
    for a, b in zip(outs[:half], outs[half:]):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_dart_drafter_proposes_the_torch_heads_trees(tiny_llama_qwen3):
    """Native and float64-torch drafters fed the same steps propose the same trees (ids, parents) and candidates."""
    t = tiny_llama_qwen3["llama"]
    head = _dart_head(t, torch.float32)
    pruning = PruningConfig(budget=12, level_top_k=4, beam_width=3)
    native = DartDrafter(head, None, t.eos_token_ids, pruning)
    torch_ref = DartDrafter(_reference(head), None, t.eos_token_ids, PruningConfig(**pruning.to_dict()),
                            head_backend="torch")
    assert native.head_backend == "native" and torch_ref.head_backend == "torch"
    prompt = t.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    aux, _ = _inputs(t, len(prompt), seed=3)
    for d in (native, torch_ref):
        d.begin(prompt, aux)
    ctx = prompt + [5]
    for step in range(6):
        a, b = native.propose(ctx), torch_ref.propose(ctx)
        assert list(a.tree.tokens) == list(b.tree.tokens) and list(a.tree.parents) == list(b.tree.parents)
        np.testing.assert_array_equal(a.candidates.token, b.candidates.token)
        np.testing.assert_allclose(a.candidates.score, b.candidates.score, atol=1e-4)
        assert a.draft_forward_s > 0 and a.tree_build_s > 0
        accepted = [ctx[-1]] + [int(x) for x in a.tree.tokens[1:1 + step % 3]]
        new_aux, _ = _inputs(t, len(accepted), seed=100 + step)
        bonus = (7 * step + 11) % t.vocab_size
        for d in (native, torch_ref):
            d.observe(AcceptedStep(accepted, bonus, new_aux))
        ctx = ctx + accepted[1:] + [bonus]


# ---------------------------------------------------------------------------------------------- EAGLE-3
@pytest.mark.parametrize("model", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_eagle3_steps_equal_the_float64_torch_head(tiny_llama_qwen3, model, dtype, kernel_tol):
    t = tiny_llama_qwen3[model]
    tol = kernel_tol if dtype == torch.bfloat16 else 1.0
    head = _eagle_head(t, dtype)
    ref = _reference(head)
    step = NativeHeadStep(head)
    cache, ref_cache = step.new_cache(capacity=4), ref.new_cache(capacity=4)
    V_d, k = head.config.draft_vocab_size, 3
    for i, n in enumerate([8, 1, 3]):
        aux, ids = _inputs(t, n, seed=20 + i)
        g_ref = ref.step_real(aux.double(), ids, ref_cache)[-1:]
        logp_ref = torch.log_softmax(ref.logits(g_ref), dim=-1)
        g, vals, toks = step.eagle3_real(aux, ids.numpy(), cache, k)
        assert cache.length == ref_cache.length
        np.testing.assert_allclose(g, g_ref.numpy(), atol=tol * 2e-5 * float(g_ref.abs().max()), rtol=0)
        _assert_top_k_matches(vals, toks, logp_ref, head.d2t, k, tol * 2e-5 * float(logp_ref.abs().max()))
        # Two tree depths over a frontier of k nodes, the second attending to its parents' slots.
        real = cache.length
        h = np.repeat(g, k, axis=0)
        f_ids = toks[0]
        allowed = np.eye(k, dtype=bool)
        for depth, tree_start in enumerate((real, real + k)):
            ref_cache.reserve(tree_start + k)
            g_ref = ref.step_tree(torch.from_numpy(h).double(), torch.from_numpy(f_ids), real + depth, ref_cache,
                                  tree_start, torch.from_numpy(allowed))
            logp_ref = torch.log_softmax(ref.logits(g_ref), dim=-1)
            g2, vals, toks2 = step.eagle3_tree(h, f_ids, real + depth, cache, tree_start, allowed, k)
            np.testing.assert_allclose(g2, g_ref.numpy(), atol=tol * 2e-5 * float(g_ref.abs().max()), rtol=0)
            assert vals.shape == (k, k)
            _assert_top_k_matches(vals, toks2, logp_ref, head.d2t, k, tol * 2e-5 * float(logp_ref.abs().max()))
            h, f_ids = g2[[2, 0, 1]], toks2[[2, 0, 1], 0]
            allowed = np.concatenate([allowed[[2, 0, 1]], np.eye(k, dtype=bool)], axis=1)
        assert cache.length == real, "tree slots are scratch: the cache keeps the real positions only"
        assert V_d == logp_ref.shape[-1]


def test_eagle3_drafter_proposes_the_torch_heads_trees(tiny_llama_qwen3):
    t = tiny_llama_qwen3["qwen3"]
    head = _eagle_head(t, torch.float32)
    tc = Eagle3TreeConfig(total_token=10, depth=3, top_k=3)
    native = Eagle3Drafter(head, tc)
    torch_ref = Eagle3Drafter(_reference(head), Eagle3TreeConfig(total_token=10, depth=3, top_k=3),
                              head_backend="torch")
    assert native.head_backend == "native"
    prompt = t.tokenizer.encode(PROMPTS[1], add_special_tokens=False)
    aux, _ = _inputs(t, len(prompt), seed=4)
    for d in (native, torch_ref):
        d.begin(prompt, aux)
    ctx = prompt + [9]
    for step in range(5):
        a, b = native.propose(ctx), torch_ref.propose(ctx)
        assert list(a.tree.tokens) == list(b.tree.tokens) and list(a.tree.parents) == list(b.tree.parents)
        np.testing.assert_allclose(a.tree.scores, b.tree.scores, atol=1e-4)
        accepted = [ctx[-1]] + [int(x) for x in a.tree.tokens[1:1 + step % 2]]
        new_aux, _ = _inputs(t, len(accepted), seed=200 + step)
        for d in (native, torch_ref):
            d.observe(AcceptedStep(accepted, 3, new_aux))
        ctx = ctx + accepted[1:] + [3]


# ---------------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("model", ["llama", "qwen3"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_native_drafters_decode_as_the_torch_heads_and_greedy_as_vanilla(tiny_llama_qwen3, model, temperature):
    """Same trees -> the same answers, sampling included (same seed); greedy answers equal vanilla's."""
    t = tiny_llama_qwen3[model]
    dart, eagle = _dart_head(t), _eagle_head(t)
    cfg = GenerationConfig(max_new_tokens=32, max_length=96, temperature=temperature, seed=7)
    engines = {
        "dart": SpeculativeEngine(t, DartDrafter(dart, None, t.eos_token_ids, PruningConfig(budget=8))),
        "dart64": SpeculativeEngine(t, DartDrafter(_reference(dart), None, t.eos_token_ids, PruningConfig(budget=8),
                                                   head_backend="torch")),
        "eagle3": SpeculativeEngine(t, Eagle3Drafter(eagle, Eagle3TreeConfig(total_token=8, depth=2, top_k=2))),
        "eagle364": SpeculativeEngine(t, Eagle3Drafter(_reference(eagle), Eagle3TreeConfig(total_token=8, depth=2,
                                                                                           top_k=2),
                                                       head_backend="torch")),
    }
    vanilla = SpeculativeEngine(t)
    for p in PROMPTS:
        ids = t.tokenizer.encode(p, add_special_tokens=False)
        out = {name: e.generate(ids, cfg) for name, e in engines.items()}
        assert out["dart"].tokens == out["dart64"].tokens and out["eagle3"].tokens == out["eagle364"].tokens
        assert [len(tr.tree) for tr in out["dart"].traces] == [len(tr.tree) for tr in out["dart64"].traces]
        if temperature == 0.0:
            assert out["dart"].tokens == vanilla.generate(ids, cfg).tokens == out["eagle3"].tokens


# ---------------------------------------------------------------------------------------------- errors
def test_bad_inputs_are_refused_and_leave_the_cache_as_it_was(tiny_llama_qwen3):
    t = tiny_llama_qwen3["llama"]
    head = _dart_head(t)
    step = NativeHeadStep(head)
    cache = step.new_cache()
    aux, ids = _inputs(t, 3, seed=1)
    step.dart(aux, ids.numpy(), cache, 2, 3)
    before = (cache.length, cache.k.clone(), cache.v.clone())
    k, v = cache.k.numpy(), cache.v.numpy()
    kern = step.kernel
    bad_ids = ids.numpy().copy()
    bad_ids[1] = t.vocab_size
    cases = [
        (lambda: kern.dart_step(aux.numpy(), bad_ids, k, v, cache.length, 2, 3), "outside the target's vocabulary"),
        (lambda: kern.dart_step(aux.numpy(), -ids.numpy() - 1, k, v, cache.length, 2, 3), "outside"),
        (lambda: kern.dart_step(aux[:2].numpy(), ids.numpy(), k, v, cache.length, 2, 3), "aux must be"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k, v, cache.length, 0, 3), "levels must be >= 1"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k, v, cache.length, 2, 0), "top_k must lie"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k, v, cache.length, 2, head.config.draft_vocab_size + 1),
         "top_k must lie"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy()[:0], k, v, cache.length, 2, 3), "n >= 1"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k, v, cache.capacity - 2, 2, 3), "reserve it first"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k, v, -1, 2, 3), "out of range"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k[:, :, :2].copy(), v, 0, 2, 3), "cache buffers"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k, k, 0, 2, 3), "non-overlapping buffers"),
        # two views of one buffer, one row apart: different pointers, shared bytes
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), *_overlapping_views(k), 0, 2, 3), "non-overlapping"),
        (lambda: kern.dart_step(aux.numpy(), ids.numpy(), k, v, 0, 2, 3, 0), "threads"),
        (lambda: kern.dart_step(aux.double().numpy(), ids.numpy(), k, v, 0, 2, 3), "aux must be"),
        (lambda: kern.eagle3_real(aux.numpy(), ids.numpy(), k, v, 0, 3), None),   # a DART kernel runs EAGLE-3's step
    ]
    for call, match in cases[:-1]:
        with pytest.raises(ValueError, match=match):
            call()
    assert cache.length == before[0] and torch.equal(cache.k, before[1]) and torch.equal(cache.v, before[2])
    eagle = NativeHeadStep(_eagle_head(t))
    with pytest.raises(ValueError, match="no mask_rep"):
        eagle.kernel.dart_step(aux.numpy(), ids.numpy(), k, v, 0, 2, 3)
    with pytest.raises(ValueError, match="tree_allowed must be"):
        eagle.kernel.eagle3_tree(np.zeros((2, t.hidden_size), np.float32), np.array([1, 2]), k, v, 3, 3, 3,
                                 np.ones((2, 3), bool), 2)
    with pytest.raises(ValueError, match="0 <= real <= tree_start"):
        eagle.kernel.eagle3_tree(np.zeros((2, t.hidden_size), np.float32), np.array([1, 2]), k, v, 3, 4, 3,
                                 np.ones((2, 1), bool), 2)
    with pytest.raises(ValueError, match="lies past any cache"):
        eagle.kernel.eagle3_tree(np.zeros((2, t.hidden_size), np.float32), np.array([1, 2]), k, v, 3, 3, 2**62,
                                 np.ones((2, 1), bool), 2)


def _overlapping_views(like: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two C-contiguous arrays shaped like ``like`` over one buffer, the second starting one row later."""
    row = like.shape[-1]
    flat = np.zeros(like.size + row, np.float32)
    return flat[: like.size].reshape(like.shape), flat[row:].reshape(like.shape)


def test_kernel_construction_checks_every_array(tiny_llama_qwen3):
    t = tiny_llama_qwen3["llama"]
    step = NativeHeadStep(_dart_head(t))
    c = step.config
    import dart_core._native as native

    def arrays(**over):
        head = _dart_head(t)
        mid = head.midlayer
        a = {"fc": head.fc.weight.detach().numpy(), "q": mid.self_attn.q_proj.weight.detach().numpy(),
             "k": mid.self_attn.k_proj.weight.detach().numpy(), "v": mid.self_attn.v_proj.weight.detach().numpy(),
             "o": mid.self_attn.o_proj.weight.detach().numpy(), "gate": mid.mlp.gate_proj.weight.detach().numpy(),
             "up": mid.mlp.up_proj.weight.detach().numpy(), "down": mid.mlp.down_proj.weight.detach().numpy(),
             "lm_head": head.lm_head.weight.detach().numpy(), "hidden_norm": np.ones(c.hidden_size, np.float32),
             "input_norm": np.ones(c.hidden_size, np.float32), "post_norm": np.ones(c.hidden_size, np.float32),
             "norm": np.ones(c.hidden_size, np.float32), "mask_rep": np.ones(2 * c.hidden_size, np.float32),
             "inv_freq": np.ones(c.head_dim // 2, np.float32), "embed": head.embedding.detach().numpy(),
             "d2t": head.d2t.numpy()}
        a.update(over)
        return a

    def make(a, **sizes):
        s = dict(hidden=c.hidden_size, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                 head_dim=c.head_dim, intermediate=c.intermediate_size, fc_in=3 * c.hidden_size,
                 draft_vocab=c.draft_vocab_size, vocab=c.vocab_size, eps=1e-6, bf16_weights=False)
        s.update(sizes)
        return native.DraftHeadKernel(arrays=a, **s)

    make(arrays())   # the good case builds
    bad_d2t = arrays()["d2t"].copy()
    bad_d2t[-1] = c.vocab_size
    for a, sizes, match in [
        (arrays(d2t=bad_d2t), {}, "d2t maps draft id"),
        (arrays(q=arrays()["k"]), {}, "q must be C-contiguous"),
        (arrays(lm_head=np.asfortranarray(arrays()["lm_head"])), {}, "lm_head must be C-contiguous"),
        (arrays(norm=np.ones(3, np.float32)), {}, "norm must be"),
        (arrays(), {"bf16_weights": True}, "must be uint16"),
        (arrays(), {"head_dim": 7}, "odd"),
        (arrays(), {"heads": 2**62}, "overflows"),
        (arrays(), {"hidden": 0}, "positive"),
        (arrays(), {"draft_vocab": c.vocab_size + 1}, "larger than the target's"),
        ({k: v for k, v in arrays().items() if k != "embed"}, {}, "lack embed"),
    ]:
        with pytest.raises(ValueError, match=match):
            make(a, **sizes)


def test_head_backend_choice_and_its_errors(tiny_llama_qwen3):
    t = tiny_llama_qwen3["llama"]
    assert HEAD_BACKENDS == ("auto", "native", "torch+gemm", "torch")
    assert prepare_head(_dart_head(t), "auto")[0] == "native"
    assert prepare_head(_dart_head(t), "torch+gemm")[0] == "torch+gemm"
    assert prepare_head(_dart_head(t), "torch") == ("torch", None)
    with pytest.raises(ValueError, match="head backend must be one of"):
        prepare_head(_dart_head(t), "fast")
    double = _dart_head(t).double()
    assert "float32 or bfloat16" in NativeHeadStep.supports(double)
    assert prepare_head(double, "auto")[0] in ("torch", "torch+gemm")     # auto falls back, saying nothing
    with pytest.raises(ValueError, match="cannot run this head: .*float32 or bfloat16"):
        DartDrafter(double, None, t.eos_token_ids, head_backend="native")
