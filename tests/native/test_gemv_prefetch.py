"""The one-row kernel's software prefetch (dart_core/models/gemv_prefetch.py): it changes which loads are issued
early and nothing else, so every output is the same bits with it on or off, on every path this CPU runs; the setting
is per path, fixed by DART_GEMV_PREFETCH or measured at load, and a bad value says how to fix it."""
import numpy as np
import pytest
import torch

from dart_core import _native
from dart_core.models import gemv_prefetch

PATHS = list(_native.small_gemm_paths())


@pytest.fixture(autouse=True)
def _fresh_choices():
    """Each test starts from no choice (the default, on, everywhere) and leaves none behind."""
    before_path = _native.small_gemm_path()
    gemv_prefetch.forget()
    yield
    gemv_prefetch.forget()
    _native.small_gemm_set_path(before_path)


def run(x, w, threads):
    buf = np.full((x.shape[0] + 4, w.shape[0]), -7.0, np.float32)   # guard rows around y
    y = buf[2:2 + x.shape[0]]
    _native.small_gemm(x, w, y, threads)
    assert (buf[:2] == -7.0).all() and (buf[2 + x.shape[0]:] == -7.0).all()
    return y.copy()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_prefetch_on_or_off_gives_the_same_bits(path, dtype):
    """M = 1 (the kernel the setting changes), M = 2 (which it also changes on the avx512bf16 path) and M = 3 (which
    always prefetches there), at block and chunk boundaries: the rows a prefetch would reach past the end of a
    thread's chunk or of the matrix included."""
    _native.small_gemm_set_path(path)
    for M in (1, 2, 3):
        for N, K in [(0, 64), (1, 1), (7, 33), (8, 32), (9, 31), (15, 576), (16, 577), (17, 64), (64, 576),
                     (65, 1536), (1041, 576), (4111, 63)]:
            g = torch.Generator().manual_seed(M * 100000 + N * 100 + K)
            x = torch.randn(M, K, generator=g).numpy()
            w = torch.randn(N, K, generator=g)
            w = w.bfloat16().view(torch.uint16).numpy() if dtype == "bfloat16" else w.numpy()
            for threads in (1, 2):
                _native.small_gemm_set_gemv_prefetch(path, True)
                with_prefetch = run(x, w, threads)
                _native.small_gemm_set_gemv_prefetch(path, False)
                without = run(x, w, threads)
                assert np.array_equal(with_prefetch, without), (path, dtype, M, N, K, threads)


def test_the_setting_is_per_path_and_names_are_checked():
    for path in ("amx", "avx512bf16", "avx512", "avx2", "portable"):
        assert _native.small_gemm_gemv_prefetch(path) is True        # the default
    _native.small_gemm_set_gemv_prefetch("avx2", False)
    assert _native.small_gemm_gemv_prefetch("avx2") is False
    assert all(_native.small_gemm_gemv_prefetch(p) for p in ("amx", "avx512bf16", "avx512", "portable"))
    for bad in ("", "AVX2", "sse"):
        with pytest.raises(ValueError, match="not one of amx, avx512bf16"):
            _native.small_gemm_set_gemv_prefetch(bad, False)
        with pytest.raises(ValueError, match="not one of"):
            _native.small_gemm_gemv_prefetch(bad)
    assert _native.small_gemm_gemv_prefetch("avx2") is False          # a refused call changed nothing


@pytest.mark.parametrize("raw, want", [(None, "auto"), ("", "auto"), ("auto", "auto"), ("on", "on"), (" OFF ", "off")])
def test_the_variable_is_read(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv(gemv_prefetch.ENV, raising=False)
    else:
        monkeypatch.setenv(gemv_prefetch.ENV, raw)
    assert gemv_prefetch.env_setting() == want


@pytest.mark.parametrize("raw", ["1", "yes", "prefetch", "of"])
def test_a_bad_variable_says_what_to_write(monkeypatch, raw):
    monkeypatch.setenv(gemv_prefetch.ENV, raw)
    with pytest.raises(ValueError, match=r"DART_GEMV_PREFETCH=.* is not one of auto, on, off: set it to on or off"):
        gemv_prefetch.choose([np.zeros((8, 8), np.float32)], 1)
    assert gemv_prefetch.chosen(_native.small_gemm_path()) is None   # nothing set
    assert _native.small_gemm_gemv_prefetch(_native.small_gemm_path()) is True


def test_off_only_when_clearly_faster():
    assert gemv_prefetch.decide(1.0) is True
    assert gemv_prefetch.decide(0.995) is True         # half a percent: a tie, the default stays
    assert gemv_prefetch.decide(0.99) is False         # 1%
    assert gemv_prefetch.decide(1.2) is True
    assert gemv_prefetch.decide(0.9, min_gain=0.2) is True


def test_the_sample_is_the_first_matrices_up_to_the_size():
    ws = [np.zeros((n, 16), np.float32) for n in (4, 8, 16, 32)]    # 256, 512, 1024, 2048 bytes
    assert [w.shape[0] for w in gemv_prefetch.sample(ws, 800)] == [4, 8]
    assert [w.shape[0] for w in gemv_prefetch.sample(ws, 10)] == [4]          # at least one
    assert [w.shape[0] for w in gemv_prefetch.sample(ws, 1 << 20)] == [4, 8, 16, 32]
    assert gemv_prefetch.sample_bytes() >= gemv_prefetch.MIN_SAMPLE_BYTES


def test_the_last_level_cache_is_read_on_linux():
    from dart_core.hardware import last_level_cache_bytes
    size = last_level_cache_bytes()
    assert size is None or size >= 64 << 10


def test_fixed_by_the_variable_without_measuring(monkeypatch):
    monkeypatch.setenv(gemv_prefetch.ENV, "off")
    monkeypatch.setattr(gemv_prefetch, "measure", lambda *a, **k: pytest.fail("measured despite the variable"))
    path = _native.small_gemm_path()
    choice = gemv_prefetch.choose([np.zeros((8, 8), np.float32)], 1)
    assert (choice.path, choice.on, choice.source) == (path, False, "DART_GEMV_PREFETCH")
    assert _native.small_gemm_gemv_prefetch(path) is False
    assert "GEMV prefetch off (DART_GEMV_PREFETCH)" == choice.describe()
    gemv_prefetch.forget()
    assert _native.small_gemm_gemv_prefetch(path) is True


def test_measured_once_per_path(monkeypatch):
    """auto: both arms timed on the given matrices, the faster kept in the kernel; a second load on the same path
    reuses the choice; another path measures its own."""
    monkeypatch.delenv(gemv_prefetch.ENV, raising=False)
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(256, 576, generator=g).bfloat16().view(torch.uint16).numpy() for _ in range(4)]
    vector_paths = [p for p in PATHS if p != "portable"]
    for path in vector_paths[:2]:
        _native.small_gemm_set_path(path)
        choice = gemv_prefetch.choose(ws, 2)
        assert choice.source == "measured" and choice.path == path
        assert choice.ms_on > 0 and choice.ms_off > 0 and choice.ratio > 0
        assert choice.on == gemv_prefetch.decide(choice.ratio)
        assert _native.small_gemm_gemv_prefetch(path) is choice.on
        assert "measured" in choice.describe()
        with monkeypatch.context() as m:
            m.setattr(gemv_prefetch, "measure", lambda *a, **k: pytest.fail("measured twice"))
            assert gemv_prefetch.choose(ws, 2) is choice
    _native.small_gemm_set_path("portable")
    assert gemv_prefetch.choose(ws, 2).source == "no vector kernel"


def test_measure_leaves_the_setting_as_it_was():
    path = _native.small_gemm_path()
    ws = [np.ones((64, 64), np.float32)]
    for before in (False, True):
        _native.small_gemm_set_gemv_prefetch(path, before)
        on, off, ratio = gemv_prefetch.measure(ws, 1, reps=2)
        assert on > 0 and off > 0 and ratio > 0
        assert _native.small_gemm_gemv_prefetch(path) is before


@pytest.mark.bundled
def test_greedy_decoding_is_the_same_with_or_without(bundled_bf16):
    """End to end on the bundled model: vanilla greedy tokens equal with the prefetch on and off, and the target's
    description names the choice made at load."""
    from dart_core.config import GenerationConfig
    from dart_core.engine.decoding import SpeculativeEngine
    from dart_core.models.templates import encode_chat, get_template

    t = bundled_bf16
    assert t.fast is not None, t.fast_unavailable_reason
    path = _native.small_gemm_path()
    gemv_prefetch.choose(t.fast.decoder_matrices, torch.get_num_threads())
    assert "GEMV prefetch" in t.forward_backend
    ids = encode_chat(t.tokenizer, get_template(t.template_name),
                      [{"role": "user", "content": "Name three rivers in Europe."}])
    cfg = GenerationConfig(max_new_tokens=24, max_length=512)
    tokens = {}
    for on in (True, False):
        _native.small_gemm_set_gemv_prefetch(path, on)
        tokens[on] = SpeculativeEngine(t).generate(ids, cfg).tokens
    assert tokens[True] == tokens[False]
