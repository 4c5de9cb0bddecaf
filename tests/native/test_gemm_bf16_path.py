"""The bf16 dot-product small-GEMM paths: AVX512-BF16 (VDPBF16PS) and AMX (TDPBF16PS tiles), both bf16 activations x
bf16 weights with float32 sums.

Their numerics differ from the float32-activation paths (the activations are rounded to bf16), so each is checked
against a float64 product of the same bf16-rounded operands, for row independence (a tree row equals the row alone,
bit for bit) and end to end: a speculative engine's greedy output equals vanilla's when both run the path. A path
this CPU (or its OS) lacks is skipped (the other paths are tested in test_native_kernels.py).
"""
import numpy as np
import pytest
import torch

from dart_core import _native

BF16_DOT_PATHS = [p for p in ("amx", "avx512bf16") if p in _native.small_gemm_paths()]
pytestmark = pytest.mark.skipif(not BF16_DOT_PATHS, reason="this CPU (or its OS) has neither AMX nor AVX512-BF16")


@pytest.fixture(params=BF16_DOT_PATHS or ["none"])
def bf16_path(request):
    before = _native.small_gemm_path()
    _native.small_gemm_set_path(request.param)
    yield request.param
    _native.small_gemm_set_path(before)


def bf16_bits(w: torch.Tensor) -> np.ndarray:
    return w.bfloat16().view(torch.uint16).numpy()


def reference(x: np.ndarray, w_bits: np.ndarray) -> np.ndarray:
    """float64 x_bf16 @ w^T: the activations rounded to bf16 (nearest even, as torch rounds), the weights exact."""
    xb = torch.from_numpy(x).bfloat16().double().numpy()
    w = (w_bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return xb @ w.T


# AVX512-BF16: 1-2 rows in sequence, 3-7 four weight rows side by side, 8-9 three, 10-12 two groups of activations
@pytest.mark.parametrize("M", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 64, 65])
@pytest.mark.parametrize("K", [0, 1, 15, 16, 17, 31, 32, 33, 63, 577])
@pytest.mark.parametrize("N", [0, 1, 3, 4, 5, 8, 9, 67, 130])
def test_the_bf16_path_matches_a_float64_product_of_the_rounded_operands(bf16_path, M, K, N):
    g = torch.Generator().manual_seed(M * 10000 + K * 100 + N)
    x = torch.randn(M, K, generator=g).numpy()
    w = bf16_bits(torch.randn(N, K, generator=g))
    buf = np.full((M + 4, N), -7.0, np.float32)     # guard rows around y
    y = buf[2:2 + M]
    _native.small_gemm(x, w, y, 2)
    assert (buf[:2] == -7.0).all() and (buf[2 + M:] == -7.0).all()
    want = reference(x, w)
    # Exact products, float32 sums of at most K terms: float32 rounding only.
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6 * max(K, 1) ** 0.5)


def test_the_bf16_path_at_tile_and_chunk_boundaries(bf16_path):
    """Sizes around the AMX tiles (16 weight rows, 32 k, 16 activation rows) and the threads' chunks of rows: every
    output against the float64 product, nothing written outside y."""
    for M, K, N in [(15, 32, 16), (16, 31, 15), (17, 33, 17), (32, 64, 31), (33, 65, 33), (1, 1536, 576),
                    (3, 576, 1536), (16, 576, 192), (61, 577, 1041), (1, 32, 4096), (2, 63, 4111)]:
        g = torch.Generator().manual_seed(M * 10000 + K * 100 + N)
        x = torch.randn(M, K, generator=g).numpy()
        w = bf16_bits(torch.randn(N, K, generator=g))
        for threads in (1, 2):
            buf = np.full((M + 4, N), -7.0, np.float32)
            y = buf[2:2 + M]
            _native.small_gemm(x, w, y, threads)
            assert (buf[:2] == -7.0).all() and (buf[2 + M:] == -7.0).all(), (M, K, N, threads)
            np.testing.assert_allclose(y, reference(x, w), rtol=1e-5, atol=1e-6 * K ** 0.5,
                                       err_msg=f"{bf16_path} M={M} K={K} N={N} threads={threads}")


def test_the_bf16_dot_paths_sum_in_their_own_orders():
    """AMX and AVX512-BF16 round the same activations but add the products in different orders: both are within
    float32 rounding of the float64 product, and they are different paths (a process runs one)."""
    if len(BF16_DOT_PATHS) < 2:
        pytest.skip("this CPU runs one bf16 dot-product path")
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(7, 1536, generator=g).numpy(), bf16_bits(torch.randn(96, 1536, generator=g))
    before = _native.small_gemm_path()
    out = {}
    try:
        for path in BF16_DOT_PATHS:
            _native.small_gemm_set_path(path)
            out[path] = np.empty((7, 96), np.float32)
            _native.small_gemm(x, w, out[path], 2)
    finally:
        _native.small_gemm_set_path(before)
    for y in out.values():
        np.testing.assert_allclose(y, reference(x, w), rtol=1e-5, atol=1e-6 * 1536 ** 0.5)
    assert not np.array_equal(out["amx"], out["avx512bf16"])


def test_the_bf16_path_rounds_the_activations(bf16_path):
    """It is not the float32-activation product: an activation between two bf16 values is rounded first."""
    x = np.array([[1.0 + 2.0 ** -9]], np.float32)   # halfway between 1 and 1 + 2^-8: rounds to even, 1.0
    w = bf16_bits(torch.ones(4, 1))
    y = np.empty((1, 4), np.float32)
    _native.small_gemm(x, w, y, 1)
    assert (y == 1.0).all()


@pytest.mark.parametrize("K", [577, 13, 48, 64])
def test_on_the_bf16_path_a_row_does_not_depend_on_the_call(bf16_path, K):
    g = torch.Generator().manual_seed(K)
    N = 47   # not a multiple of 3 or 4: the rows left after the side-by-side groups run one at a time
    w = bf16_bits(torch.randn(N, K, generator=g))
    x = torch.randn(70, K, generator=g).numpy()
    alone = np.empty((70, N), np.float32)
    for m in range(70):
        _native.small_gemm(np.ascontiguousarray(x[m:m + 1]), w, alone[m:m + 1], 1)
    rng = np.random.default_rng(K)
    for M in range(1, 71):
        rows = rng.choice(70, size=M, replace=False)
        together = np.empty((M, N), np.float32)
        _native.small_gemm(np.ascontiguousarray(x[rows]), w, together, 2 if M % 2 else 1)
        assert np.array_equal(together, alone[rows]), f"M={M} changed a row's bits"
    for j in (0, 3, 7, 8, 22, 44):   # nor on the weight rows blocked with it
        one = np.empty((70, 1), np.float32)
        _native.small_gemm(x, np.ascontiguousarray(w[j:j + 1]), one, 1)
        assert np.array_equal(one[:, 0], alone[:, j]), f"weight row {j} alone differs"


def test_float32_weights_on_the_bf16_path_run_the_float32_avx512_kernel(bf16_path):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 203, generator=g).numpy(), torch.randn(67, 203, generator=g).numpy()
    out = {}
    for path in (bf16_path, "avx512"):
        _native.small_gemm_set_path(path)
        out[path] = np.empty((9, 67), np.float32)
        _native.small_gemm(x, w, out[path], 2)
    assert np.array_equal(out[bf16_path], out["avx512"])


def test_the_bf16_paths_are_chosen_by_name():
    """DART_GEMM_PATH names either; auto runs AMX where it runs (it pays: see small_gemm.cpp), else AVX512-BF16 on
    an AMD CPU and avx512 on others."""
    import os
    import subprocess
    import sys

    from test_native_kernels import cpu_is_amd
    code = "from dart_core import _native; print(_native.small_gemm_path())"
    default = "amx" if "amx" in BF16_DOT_PATHS else "avx512bf16" if cpu_is_amd() else "avx512"
    for env, want in [(p, p) for p in BF16_DOT_PATHS] + [("auto", default)]:
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "DART_GEMM_PATH": env},
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


@pytest.mark.bundled
def test_greedy_outputs_on_the_bf16_path_identical_to_vanilla(bundled_bf16, bf16_path):
    """Vanilla and every drafter run the same path in one process: on this path DART's, EAGLE-3's and prompt
    lookup's greedy answers equal vanilla's, token for token; and the path is really in use (the target's logits
    differ from the float32-activation AVX-512 path's)."""
    from dart_core.config import GenerationConfig
    from dart_core.drafters import PromptLookupDrafter
    from dart_core.drafters.dart import DartDrafter
    from dart_core.drafters.eagle3 import Eagle3Drafter
    from dart_core.drafters.pruning import PruningConfig
    from dart_core.engine.decoding import SpeculativeEngine
    from dart_core.hardware import describe_machine
    from dart_core.loading import load_head_and_ngram
    from dart_core.models.heads.eagle3 import load_eagle3_for_target
    from dart_core.models.templates import encode_chat, get_template

    t = bundled_bf16
    assert t.fast is not None, t.fast_unavailable_reason
    assert describe_machine()["gemm_path"] == bf16_path
    template = get_template(t.template_name)
    prompts = [encode_chat(t.tokenizer, template, [{"role": "user", "content": text}])
               for text in ("Write a Python function that reverses a string.", "What is 17 times 23?")]
    session = t.new_session(len(prompts[0]) + 1)
    bf16_logits = session.prefill(prompts[0]).logits
    _native.small_gemm_set_path("avx512")
    session = t.new_session(len(prompts[0]) + 1)
    f32_logits = session.prefill(prompts[0]).logits
    _native.small_gemm_set_path(bf16_path)
    assert not torch.equal(bf16_logits, f32_logits), "the bf16 path gave the float32 path's bits: not in use?"

    head, store = load_head_and_ngram(t, None, None, None)
    engines = {"dart": SpeculativeEngine(t, DartDrafter(head, store, t.eos_token_ids, PruningConfig(budget=8))),
               "eagle3": SpeculativeEngine(t, Eagle3Drafter(load_eagle3_for_target(t, None, None))),
               "prompt_lookup": SpeculativeEngine(t, PromptLookupDrafter())}
    vanilla = SpeculativeEngine(t)
    cfg = GenerationConfig(max_new_tokens=40, max_length=1024)
    for ids in prompts:
        ref = vanilla.generate(ids, cfg).tokens
        for name, engine in engines.items():
            out = engine.generate(ids, cfg)
            assert out.tokens == ref, f"{name} diverged from vanilla on the {bf16_path} path"
    assert _native.small_gemm_path() == bf16_path
