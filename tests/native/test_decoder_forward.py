"""The native decoder's one-call step (``Decoder.forward``): the embedding rows, every layer, the aux features, the
final norm and the LM head's rows in one call, equal bit for bit to the same pieces run one by one (``Decoder.run``
over layer ranges, a sequential float64 sum of squares for the norm as the native RMSNorm takes it, ``small_gemm`` on
the normed rows), on every kernel path; and every bad argument refused before anything is written."""
import numpy as np
import pytest
import torch

from dart_core import _native
from rope_tables import rope_tables

HIDDEN, HEADS, KV_HEADS, D, INTER, LAYERS, VOCAB, EPS = 40, 4, 2, 16, 72, 3, 97, 1e-6


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def make(bf16: bool, seed: int = 0):
    """(decoder with its ends bound, the float32 values of embed / norm / lm_head, the kernel arrays)."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape, s=0.3: (rng.standard_normal(shape) * s).astype(np.float32)   # noqa: E731
    as_kernel = (lambda a: torch.from_numpy(a).bfloat16().view(torch.uint16).numpy()) if bf16 else (lambda a: a)
    dec = _native.Decoder(HIDDEN, HEADS, KV_HEADS, D, INTER, EPS, bf16)
    for _ in range(LAYERS):
        mats = {"q": f32(HEADS * D, HIDDEN), "k": f32(KV_HEADS * D, HIDDEN), "v": f32(KV_HEADS * D, HIDDEN),
                "o": f32(HIDDEN, HEADS * D), "gate": f32(INTER, HIDDEN), "up": f32(INTER, HIDDEN),
                "down": f32(HIDDEN, INTER)}
        dec.add_layer({**{n: as_kernel(a) for n, a in mats.items()}, "in_norm": 1 + f32(HIDDEN),
                       "post_norm": 1 + f32(HIDDEN), "q_norm": 1 + f32(D), "k_norm": 1 + f32(D)})
    embed, lm_head = as_kernel(f32(VOCAB, HIDDEN, s=1.0)), as_kernel(f32(VOCAB + 5, HIDDEN))
    norm = 1 + f32(HIDDEN)
    dec.set_ends(embed, norm, lm_head)
    return dec, embed, norm, lm_head


def as_float(a: np.ndarray) -> np.ndarray:
    """A kernel array's float32 values (bf16 bits widened exactly)."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def native_rms_norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """decoder.cpp's rms_norm: a sequential float64 sum of squares, the rest in float32."""
    out = np.empty_like(x)
    for r, row in enumerate(x):
        ss = np.cumsum(row.astype(np.float64) * row.astype(np.float64))[-1] if len(row) else 0.0
        inv = np.float32(1.0) / np.sqrt(np.float32(ss / len(row)) + np.float32(EPS))
        out[r] = w * (row * inv)
    return out


def fresh_cache(start: int, q: int, seed: int = 5):
    rng = np.random.default_rng(seed)
    keys = [np.zeros((KV_HEADS, start + q + 2, D), np.float32) for _ in range(LAYERS)]
    values = [np.zeros((KV_HEADS, start + q + 2, D), np.float32) for _ in range(LAYERS)]
    for c in keys + values:
        c[:, :start] = rng.standard_normal((KV_HEADS, start, D)).astype(np.float32)
    return keys, values


@pytest.mark.parametrize("q", [0, 1, 2, 9, 64, 65])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("tree_mask", [False, True])
@pytest.mark.parametrize("aux_layers", [[], [1], [2, 0, 3]], ids=["no-aux", "aux-1", "aux-2-0-3"])
def test_one_call_equals_the_pieces_bit_for_bit(gemm_path, q, bf16, tree_mask, aux_layers):
    dec, embed, norm, lm_head = make(bf16, seed=q + 2 * bf16)
    rng = np.random.default_rng(q)
    start = 11
    ids = rng.integers(0, VOCAB, size=q).astype(np.int64)
    pos = (start + np.arange(q)).astype(np.int64) if not tree_mask else (start + rng.integers(0, 4, q)).astype(np.int64)
    cos_t, sin_t = rope_tables(np.arange(start + q + 8), D)
    allowed = None
    if tree_mask:
        allowed = rng.random((q, start + q)) < 0.5
        allowed[:, :start] = True
        allowed[np.arange(q), start + np.arange(q)] = True

    # The pieces: embedding rows, the layers run up to each aux layer, the norm, the LM head on chosen rows.
    keys_a, values_a = fresh_cache(start, q)
    h = np.ascontiguousarray(as_float(embed)[ids])
    cos, sin = np.ascontiguousarray(cos_t[pos]), np.ascontiguousarray(sin_t[pos])
    cache_a = _native.DecoderCache(keys_a, values_a)
    aux_want, begin = {}, 0
    for stop in sorted(set(aux_layers)) + [LAYERS]:
        if stop > begin:
            dec.run(h, cos, sin, allowed, start, cache_a, begin, stop, 2)
            begin = stop
        aux_want[stop] = h.copy()
    normed = native_rms_norm(h, norm)
    head_rows = [r for r in (q - 1, 0, q // 2) if 0 <= r < q]
    want_logits = np.empty((len(head_rows), lm_head.shape[0]), np.float32)
    _native.small_gemm(np.ascontiguousarray(normed[head_rows]), lm_head, want_logits, 2)

    # One call.
    keys_b, values_b = fresh_cache(start, q)
    aux = np.full((q, len(aux_layers) * HIDDEN), -7.0, np.float32)
    out = np.full((q, HIDDEN), -7.0, np.float32)
    logits = np.full((len(head_rows), lm_head.shape[0]), -7.0, np.float32)
    dec.forward(ids, pos, cos_t, sin_t, allowed, start, _native.DecoderCache(keys_b, values_b), aux_layers,
                aux if aux_layers else None, out, head_rows, logits if head_rows else None, 2)
    assert np.array_equal(bits(out), bits(normed))
    for k, layer in enumerate(aux_layers):
        assert np.array_equal(bits(aux[:, k * HIDDEN:(k + 1) * HIDDEN]), bits(aux_want[layer]))
    assert np.array_equal(bits(logits), bits(want_logits))
    for got, want in zip(keys_b + values_b, keys_a + values_a):
        assert np.array_equal(bits(got), bits(want))

    if q:   # the last row alone: the same bits as its row among all
        last = np.empty((1, HIDDEN), np.float32)
        keys_c, values_c = fresh_cache(start, q)
        dec.forward(ids, pos, cos_t, sin_t, allowed, start, _native.DecoderCache(keys_c, values_c), [], None, last,
                    [0], one := np.empty((1, lm_head.shape[0]), np.float32), 1)
        assert np.array_equal(bits(last[0]), bits(normed[-1]))
        assert np.array_equal(bits(one[0]), bits(want_logits[0]))


def test_an_inner_prompt_chunk_writes_the_cache_and_nothing_else():
    """out=None (an inner chunk of a prompt): the layers run and write their K/V; no norm, no LM head."""
    dec, *_ = make(False)
    q, start = 5, 3
    cos_t, sin_t = rope_tables(np.arange(16), D)
    keys, values = fresh_cache(start, q)
    before = [k.copy() for k in keys]
    dec.forward(np.arange(q, dtype=np.int64), np.arange(start, start + q, dtype=np.int64), cos_t, sin_t, None, start,
                _native.DecoderCache(keys, values), [], None, None, [], None, 2)
    assert all((k[:, start:start + q] != b[:, start:start + q]).any() for k, b in zip(keys, before))
    assert all(np.array_equal(k[:, start + q:], b[:, start + q:]) for k, b in zip(keys, before))


def bad_calls():
    """(what, keyword changes to a good call, the message's words)."""
    return [
        ("ids out of range", {"ids": np.array([0, VOCAB], np.int64)}, "outside the vocabulary"),
        ("negative id", {"ids": np.array([-1, 0], np.int64)}, "outside the vocabulary"),
        ("ids int32", {"ids": np.array([0, 1], np.int32)}, "ids must be"),
        ("positions not one per id", {"positions": np.array([4], np.int64)}, "one per id"),
        ("position past the tables", {"positions": np.array([4, 99], np.int64)}, "past the RoPE tables"),
        ("tables of another width", {"cos_table": np.zeros((16, D + 2), np.float32)}, "RoPE tables"),
        ("aux layer past the last", {"aux_layers": [LAYERS + 1], "aux_out": np.zeros((2, HIDDEN), np.float32)},
         "aux layer"),
        ("aux layers without aux_out", {"aux_layers": [1]}, "aux_out"),
        ("aux_out of another width", {"aux_layers": [1], "aux_out": np.zeros((2, 2 * HIDDEN), np.float32)},
         "aux_out must be"),
        ("out of another shape", {"out": np.zeros((3, HIDDEN), np.float32)}, "out must be"),
        ("head row past out", {"head_rows": [2], "logits": np.zeros((1, VOCAB + 5), np.float32)}, "head row 2"),
        ("head rows without logits", {"head_rows": [0]}, "logits array"),
        ("logits of another width", {"head_rows": [0], "logits": np.zeros((1, VOCAB), np.float32)},
         "logits must be"),
        ("head rows without out", {"out": None, "head_rows": [0], "logits": np.zeros((1, VOCAB + 5), np.float32)},
         "needs out"),
        ("a step past the cache", {"start": 9}, "does not fit the cache"),
        ("a mask of another shape", {"allowed": np.ones((2, 3), np.bool_)}, "allowed must be"),
        ("no threads", {"threads": 0}, "threads"),
    ]


@pytest.mark.parametrize("what,change,words", bad_calls(), ids=[c[0] for c in bad_calls()])
def test_bad_arguments_are_refused_before_anything_is_written(what, change, words):
    dec, *_ = make(False)
    start = 4
    cos_t, sin_t = rope_tables(np.arange(16), D)
    keys, values = fresh_cache(start, 2)
    out = np.full((2, HIDDEN), -7.0, np.float32)
    call = {"ids": np.array([1, 2], np.int64), "positions": np.array([4, 5], np.int64), "cos_table": cos_t,
            "sin_table": sin_t, "allowed": None, "start": start, "cache": _native.DecoderCache(keys, values),
            "aux_layers": [], "aux_out": None, "out": out, "head_rows": [], "logits": None, "threads": 2}
    call.update(change)
    if "cos_table" in change:
        call["sin_table"] = change["cos_table"]
    snapshot = [c.copy() for c in keys + values]
    with pytest.raises(ValueError, match=words):
        dec.forward(**call)
    assert all(np.array_equal(c, s) for c, s in zip(keys + values, snapshot)), f"{what}: the cache was written"
    assert (out == -7.0).all(), f"{what}: out was written"


def test_forward_needs_the_ends_bound_first():
    dec = _native.Decoder(HIDDEN, HEADS, KV_HEADS, D, INTER, EPS, False)
    cos_t, sin_t = rope_tables(np.arange(4), D)
    keys, values = [np.zeros((KV_HEADS, 4, D), np.float32)], [np.zeros((KV_HEADS, 4, D), np.float32)]
    with pytest.raises(ValueError, match="set_ends"):
        dec.forward(np.array([0], np.int64), np.array([0], np.int64), cos_t, sin_t, None, 0,
                    _native.DecoderCache(keys, values), [], None, None, [], None, 1)


@pytest.mark.parametrize("bf16", [False, True])
def test_set_ends_refuses_tables_of_the_wrong_dtype_or_width(bf16):
    dec = _native.Decoder(HIDDEN, HEADS, KV_HEADS, D, INTER, EPS, bf16)
    good = np.zeros((VOCAB, HIDDEN), np.uint16 if bf16 else np.float32)
    wrong = np.zeros((VOCAB, HIDDEN), np.float32 if bf16 else np.uint16)
    norm = np.ones(HIDDEN, np.float32)
    with pytest.raises(ValueError, match="embedding table"):
        dec.set_ends(wrong, norm, good)
    with pytest.raises(ValueError, match="embedding table"):
        dec.set_ends(np.zeros((VOCAB, HIDDEN + 1), good.dtype), norm, good)
    with pytest.raises(ValueError, match="final norm"):
        dec.set_ends(good, np.ones(HIDDEN + 1, np.float32), good)
    with pytest.raises(ValueError, match="LM head"):
        dec.set_ends(good, norm, np.zeros((VOCAB, HIDDEN), np.int32))
    dec.set_ends(good, norm, np.zeros((VOCAB, HIDDEN), np.float32))   # an LM head of either dtype


@pytest.mark.parametrize("q", [31, 32, 33, 70])
@pytest.mark.parametrize("bf16", [False, True])
def test_a_prompt_chunk_equals_its_tokens_one_at_a_time(gemm_path, q, bf16):
    """A causal chunk of q rows (from 32 rows its norms, RoPE, residuals and SiLU run in row ranges on both threads,
    its norms four rows at a time) gives every row, every layer's K/V included, the bits that row gets as a
    one-row step after the rows before it: the prefill and the decoding steps agree."""
    dec, embed, *_ = make(bf16, seed=q)
    start = 5
    ids = np.random.default_rng(q).integers(0, VOCAB, size=q)
    cos_t, sin_t = rope_tables(np.arange(start + q + 2), D)
    pos = start + np.arange(q)
    h_chunk = np.ascontiguousarray(as_float(embed)[ids])
    keys_a, values_a = fresh_cache(start, q)
    dec.run(h_chunk, np.ascontiguousarray(cos_t[pos]), np.ascontiguousarray(sin_t[pos]), None, start,
            _native.DecoderCache(keys_a, values_a), 0, LAYERS, 2)
    keys_b, values_b = fresh_cache(start, q)
    cache_b = _native.DecoderCache(keys_b, values_b)
    for i in range(q):
        h = np.ascontiguousarray(as_float(embed)[ids[i:i + 1]])
        p = pos[i:i + 1]
        dec.run(h, np.ascontiguousarray(cos_t[p]), np.ascontiguousarray(sin_t[p]), None, start + i, cache_b, 0,
                LAYERS, 2)
        assert np.array_equal(bits(h[0]), bits(h_chunk[i])), f"row {i} of {q}"
    for got, want in zip(keys_b + values_b, keys_a + values_a):
        assert np.array_equal(bits(got), bits(want))


@pytest.mark.parametrize("q", [1, 2, 33, 70])
@pytest.mark.parametrize("bf16", [False, True])
def test_a_prompt_chunk_that_returns_fewer_rows_writes_the_same_cache(gemm_path, q, bf16):
    """A prompt's inner chunk (out=None) and its last chunk (out of one row) stop their other rows in the last layer
    once their K/V are written: the cache gets the bits a chunk returning every row writes, and the last row is
    the same bits."""
    dec, *_ = make(bf16, seed=q + 7)
    start = 4
    ids = np.random.default_rng(q + 1).integers(0, VOCAB, size=q).astype(np.int64)
    pos = (start + np.arange(q)).astype(np.int64)
    cos_t, sin_t = rope_tables(np.arange(start + q + 2), D)

    def run(out):
        keys, values = fresh_cache(start, q)
        dec.forward(ids, pos, cos_t, sin_t, None, start, _native.DecoderCache(keys, values), [], None, out, [], None,
                    2)
        return keys + values

    every = np.empty((q, HIDDEN), np.float32)
    want = run(every)
    last = np.empty((1, HIDDEN), np.float32)
    for got in (run(None), run(last)):
        for g, w in zip(got, want):
            assert np.array_equal(bits(g), bits(w))
    assert np.array_equal(bits(last[0]), bits(every[-1]))
