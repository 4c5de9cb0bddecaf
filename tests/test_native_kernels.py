"""The native small-GEMM kernel, the native decoder's argument checks, and the head-projection patch."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dart_core import _native
from dart_core.models.native_linear import use_native_linears


def bf16_bits(w: torch.Tensor) -> np.ndarray:
    return w.bfloat16().view(torch.uint16).numpy()


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
@pytest.mark.parametrize("M,N,K", [(1, 37, 64), (2, 64, 576), (5, 100, 13), (7, 9, 200), (16, 300, 96),
                                   (65, 40, 24)])
@pytest.mark.parametrize("threads", [1, 2])
def test_small_gemm_matches_a_float64_product(weights, M, N, K, threads):
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g)
    if weights == "bfloat16":
        w_array, w_exact = bf16_bits(w), w.bfloat16().double()   # the kernel reads the bf16 values exactly
    else:
        w_array, w_exact = w.numpy(), w.double()
    y = np.full((M, N), np.nan, dtype=np.float32)
    _native.small_gemm(x.numpy(), w_array, y, threads)
    want = x.double() @ w_exact.T
    torch.testing.assert_close(torch.from_numpy(y).double(), want, atol=1e-5 * K ** 0.5, rtol=1e-5)


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_a_row_does_not_depend_on_the_other_rows(weights):
    """Each output is one dot product summed in a fixed order, so a tree row equals the same row alone."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(203, 576, generator=g)
    w_array = bf16_bits(w) if weights == "bfloat16" else w.numpy()
    x = torch.randn(9, 576, generator=g).numpy()
    together = np.empty((9, 203), dtype=np.float32)
    _native.small_gemm(x, w_array, together, 2)
    for m in range(9):
        alone = np.empty((1, 203), dtype=np.float32)
        _native.small_gemm(np.ascontiguousarray(x[m:m + 1]), w_array, alone, 1)
        assert np.array_equal(alone[0], together[m])


def test_small_gemm_rejects_bad_arguments():
    x = np.ones((2, 8), np.float32)
    w = np.ones((4, 8), np.float32)
    y = np.empty((2, 4), np.float32)
    with pytest.raises(ValueError, match="shapes do not match"):
        _native.small_gemm(x, np.ones((4, 9), np.float32), y)
    with pytest.raises(ValueError, match="shapes do not match"):
        _native.small_gemm(x, w, np.empty((2, 5), np.float32))
    with pytest.raises(TypeError, match="float32"):
        _native.small_gemm(x.astype(np.float64), w, y)
    with pytest.raises(TypeError, match="uint16"):
        _native.small_gemm(x, w.astype(np.float16), y)
    with pytest.raises(ValueError, match="C-contiguous"):
        _native.small_gemm(np.ones((8, 2), np.float32).T, w, y)
    with pytest.raises(ValueError, match="2-D"):
        _native.small_gemm(x[0], w, y)
    y.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        _native.small_gemm(x, w, y)
    with pytest.raises(ValueError, match="threads"):
        _native.small_gemm(x, w, np.empty((2, 4), np.float32), 0)


def test_native_decoder_checks_its_inputs():
    dec = _native.Decoder(hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, eps=1e-6,
                          bf16_weights=False)
    with pytest.raises(ValueError, match="lacks q"):
        dec.add_layer({})
    f = lambda *shape: np.zeros(shape, np.float32)   # noqa: E731
    layer = {"q": f(8, 8), "k": f(4, 8), "v": f(4, 8), "o": f(8, 8), "gate": f(16, 8), "up": f(16, 8),
             "down": f(8, 16), "in_norm": f(8), "post_norm": f(8)}
    with pytest.raises(ValueError, match=r"k must be C-contiguous \[4, 8\]"):
        dec.add_layer({**layer, "k": f(8, 8)})
    with pytest.raises(ValueError, match="uint16"):
        _native.Decoder(8, 2, 1, 4, 16, 1e-6, True).add_layer(layer)
    dec.add_layer(layer)
    cache = _native.DecoderCache([f(1, 6, 4)], [f(1, 6, 4)])
    h, cs = f(2, 8), f(2, 4)
    dec.run(h, cs, cs, None, 0, cache, 0, 1, 1)                          # fits: positions 0..1
    with pytest.raises(ValueError, match="does not fit"):
        dec.run(h, cs, cs, None, 5, cache, 0, 1, 1)
    with pytest.raises(ValueError, match="another model"):
        dec.run(h, cs, cs, None, 0, _native.DecoderCache([f(2, 6, 4)], [f(2, 6, 4)]), 0, 1, 1)
    with pytest.raises(ValueError, match="allowed"):
        dec.run(h, cs, cs, np.ones((2, 3), np.bool_), 0, cache, 0, 1, 1)
    with pytest.raises(ValueError, match="heads must be a multiple"):
        _native.Decoder(8, 3, 2, 4, 16, 1e-6, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patched_linears_match_torch_and_leave_training_alone(dtype):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.Linear(40, 7, bias=False)).to(dtype)
    x = torch.randn(3, 5, 24, dtype=dtype)
    with torch.no_grad():
        want = [F.linear(x, net[0].weight, net[0].bias)]
        want.append(F.linear(want[0], net[1].weight))
    assert use_native_linears(net) == 2
    with torch.inference_mode():
        got0 = net[0](x)
        got1 = net[1](got0)
    assert got0.dtype == dtype and got0.shape == (3, 5, 40)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got0, want[0], **tol)
    torch.testing.assert_close(got1, want[1], **tol)
    # With autograd on (training) the patched layers fall back to F.linear: gradients still flow.
    net.float()
    loss = net(torch.randn(2, 24)).sum()
    loss.backward()
    assert net[0].weight.grad is not None and net[0].weight.grad.abs().sum() > 0
