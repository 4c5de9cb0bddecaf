"""TargetModel / TargetSession on tiny random Llama, Qwen2 and Qwen3 models, through both forward paths
(the lean native CPU forward and the HF modules), against a float64 reference."""
import copy

import numpy as np
import pytest
import torch

from dart_core.models.kv_cache import CacheFullError
from dart_core.models.loader import ModelLoadError, load_target
from dart_core.engine.tree import DraftTree
from tiny_models import make_tiny_model_dir


@pytest.fixture(scope="module", params=[(m, b) for m in ("llama", "qwen2", "qwen3") for b in ("native", "hf")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def tiny_target(request, tmp_path_factory):
    model_type, backend = request.param
    path = make_tiny_model_dir(tmp_path_factory.mktemp(model_type), model_type=model_type, num_hidden_layers=6)
    target = load_target(str(path), dtype="float32", device="cpu", fast_forward=backend == "native")
    assert (target.fast is not None) == (backend == "native"), target.fast_unavailable_reason
    return target


def random_tree(rng, n, vocab, root):
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    tokens = [root] + rng.integers(0, vocab, size=n - 1).tolist()
    return DraftTree.from_parents(tokens, parents, scores=-np.arange(n, dtype=float))


def tree_inputs(tree, prefix):
    """A tree's forward inputs after ``prefix`` committed positions, as TargetSession.verify makes them: ids,
    positions (prefix + depth) and the mask (the prefix, ancestors and self)."""
    allowed = torch.cat([torch.ones(len(tree), prefix, dtype=torch.bool), torch.from_numpy(tree.ancestor_mask())],
                        dim=1)
    return torch.from_numpy(tree.tokens), torch.from_numpy(tree.depths) + prefix, allowed


def reference_forward(target, ids):
    """Plain full forward without any cache, in float64: logits [T, V] and aux [T, 3H]."""
    ref = getattr(target, "_float64_reference", None)
    if ref is None:
        ref = target._float64_reference = copy.deepcopy(target.model).double()
    with torch.no_grad():
        out = ref(input_ids=torch.tensor([ids]), output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i][0] for i in target.aux_layer_ids], dim=-1)
    return out.logits[0], aux


def assert_near(actual, expected):
    """float32 vs the float64 reference: errors a few ulps of the largest value (these tiny random models
    have activations in the hundreds, so a relative bound per element would be noise)."""
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(actual.double(), expected, atol=6e-5 * scale, rtol=0)


def test_aux_layers_follow_the_convention(tiny_target):
    L = tiny_target.num_layers
    assert tiny_target.aux_layer_ids == (2, L // 2, L - 3)


def test_verify_matches_token_by_token_decoding(tiny_target):
    rng = np.random.default_rng(0)
    vocab = tiny_target.vocab_size
    prompt = rng.integers(0, vocab, size=17).tolist()
    session = tiny_target.new_session(64)
    session.prefill(prompt)
    tree = random_tree(rng, 15, vocab, root=int(rng.integers(0, vocab)))
    out = session.verify(tree, want_aux=True)
    assert out.logits.all().shape == (15, vocab) and out.aux.shape == (15, 3 * tiny_target.hidden_size)
    for i in range(len(tree)):
        seq = prompt + tree.tokens[tree.path_to(i)].tolist()
        ref_logits, ref_aux = reference_forward(tiny_target, seq)
        assert_near(out.logits[i], ref_logits[-1])
        assert_near(out.aux[i], ref_aux[-1])


def test_commit_compacts_the_accepted_path(tiny_target):
    rng = np.random.default_rng(1)
    vocab = tiny_target.vocab_size
    prompt = rng.integers(0, vocab, size=9).tolist()
    session = tiny_target.new_session(64)
    session.prefill(prompt)
    tree = random_tree(rng, 12, vocab, root=int(rng.integers(0, vocab)))
    leaf = tree.leaves()[-1]
    path = tree.path_to(leaf)
    session.verify(tree)
    session.commit(path)
    assert session.length == len(prompt) + len(path)
    nxt = int(rng.integers(0, vocab))
    out = session.verify(DraftTree.root_only(nxt))
    ref, _ = reference_forward(tiny_target, prompt + tree.tokens[path].tolist() + [nxt])
    assert_near(out.logits[0], ref[-1])


def test_commit_without_verify_is_an_error(tiny_target):
    session = tiny_target.new_session(16)
    session.prefill([1, 2, 3])
    with pytest.raises(RuntimeError, match="verify"):
        session.commit([0])


def test_sessions_share_weights_but_not_caches(tiny_target):
    a, b = tiny_target.new_session(32), tiny_target.new_session(32)
    a.prefill([5, 6, 7, 8])
    b.prefill([9, 10])
    out_a = a.verify(DraftTree.root_only(11))
    ref, _ = reference_forward(tiny_target, [5, 6, 7, 8, 11])
    assert_near(out_a.logits[0], ref[-1])
    assert b.length == 2


def test_cache_never_written_past_capacity(tiny_target):
    session = tiny_target.new_session(10)
    session.prefill(list(range(8)))
    tree = DraftTree.from_parents([1, 2, 3], [-1, 0, 1])
    with pytest.raises(CacheFullError, match="overflow"):
        session.verify(tree)
    assert session.length == 8  # nothing was written
    with pytest.raises(CacheFullError):
        tiny_target.new_session(4).prefill(list(range(5)))


def test_unknown_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not a local directory"):
        load_target(str(tmp_path / "no-such-model"))
    with pytest.raises(ModelLoadError, match="GGUF file"):
        load_target(str(tmp_path / "missing.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        load_target(str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="dtype"):
        load_target(str(tmp_path / "empty"), dtype="int3")


def test_truncate_rolls_back_a_verify(tiny_target):
    session = tiny_target.new_session(32)
    session.prefill([4, 5, 6, 7])
    session.verify(DraftTree.from_parents([8, 9, 10], [-1, 0, 1]))
    session.truncate(4)
    assert session.length == 4
    with pytest.raises(RuntimeError, match="verify"):
        session.commit([0])
    with pytest.raises(ValueError, match="truncate"):
        session.truncate(5)
    out = session.verify(DraftTree.root_only(8))
    ref, _ = reference_forward(tiny_target, [4, 5, 6, 7, 8])
    assert_near(out.logits[0], ref[-1])


def test_long_prompt_then_short_steps_share_one_cache(tiny_target):
    """A prompt longer than NATIVE_MAX_ROWS runs torch ops, a short continuation (causal, after a prefix)
    and a tree run the native decoder: all three must write and read the same cache layout."""
    from dart_core.models.fast_forward import NATIVE_MAX_ROWS

    rng = np.random.default_rng(3)
    vocab = tiny_target.vocab_size
    prompt = rng.integers(0, vocab, size=NATIVE_MAX_ROWS + 6).tolist()
    more = rng.integers(0, vocab, size=3).tolist()
    session = tiny_target.new_session(NATIVE_MAX_ROWS + 40)
    session.prefill(prompt)
    out = session.prefill(more)
    ref, _ = reference_forward(tiny_target, prompt + more)
    assert_near(out.logits[-1], ref[-1])
    tree = random_tree(rng, 9, vocab, root=int(rng.integers(0, vocab)))
    vout = session.verify(tree)
    for i in (0, len(tree) - 1):
        ref, _ = reference_forward(tiny_target, prompt + more + tree.tokens[tree.path_to(i)].tolist())
        assert_near(vout.logits[i], ref[-1])


def test_switching_the_forward_path_needs_new_sessions(tmp_path):
    """bf16 weights: the native path keeps float32 activations and cache, the HF path bf16 ones."""
    path = make_tiny_model_dir(tmp_path, "llama")
    target = load_target(str(path), dtype="bfloat16", device="cpu")
    assert target.fast is not None and target.activation_dtype == torch.float32
    old = target.new_session(16)
    old.prefill([3, 4, 5])
    target.set_fast_forward(False)
    assert target.fast is None and target.activation_dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="new session"):
        old.verify(DraftTree.root_only(6))
    target.new_session(16).prefill([3, 4, 5])   # a new session works
    target.set_fast_forward(True)
    assert target.fast is not None and "native" in target.forward_backend


def test_the_forward_description_names_the_kernel_path_and_its_rounding(tmp_path):
    """Logs and the page's start-up line say which kernel path ran and whether it rounds the activations to bf16
    (amx, avx512bf16 with bf16 weights) or keeps them float32."""
    from dart_core import _native
    target = load_target(str(make_tiny_model_dir(tmp_path, "llama")), dtype="bfloat16", device="cpu")
    before = _native.small_gemm_path()
    try:
        for path in _native.small_gemm_paths():
            _native.small_gemm_set_path(path)
            text = target.forward_backend
            assert f"kernel path {path}" in text
            rounded = path in ("amx", "avx512bf16")
            assert ("rounded to bf16" in text) == rounded and ("float32 activations" in text) == (not rounded)
    finally:
        _native.small_gemm_set_path(before)


def test_fast_forward_refuses_what_it_cannot_run(tmp_path):
    from dart_core.models.fast_forward import FastForward

    path = make_tiny_model_dir(tmp_path, "qwen3")
    target = load_target(str(path), dtype="float32", device="cpu")
    model = target.model
    assert FastForward.supports(model) is None
    model.config.use_sliding_window = True
    assert "sliding-window" in FastForward.supports(model)
    with pytest.raises(ValueError, match="sliding-window"):
        FastForward(model)
    model.config.use_sliding_window = False
    half = load_target(str(path), dtype="float16", device="cpu")
    assert half.fast is None and "float16" in half.fast_unavailable_reason


def test_a_tree_larger_than_one_native_chunk(tiny_target):
    """Trees of more than NATIVE_MAX_ROWS nodes verify in chunks (nodes follow their ancestors)."""
    from dart_core.models.fast_forward import NATIVE_MAX_ROWS

    rng = np.random.default_rng(4)
    vocab = tiny_target.vocab_size
    prompt = rng.integers(0, vocab, size=5).tolist()
    session = tiny_target.new_session(NATIVE_MAX_ROWS + 32)
    session.prefill(prompt)
    tree = random_tree(rng, NATIVE_MAX_ROWS + 9, vocab, root=int(rng.integers(0, vocab)))
    out = session.verify(tree, want_aux=True)
    assert out.logits.all().shape[0] == len(tree) and out.aux.shape[0] == len(tree)
    for i in (1, NATIVE_MAX_ROWS - 1, NATIVE_MAX_ROWS, len(tree) - 1):
        ref_logits, ref_aux = reference_forward(tiny_target, prompt + tree.tokens[tree.path_to(i)].tolist())
        assert_near(out.logits[i], ref_logits[-1])
        assert_near(out.aux[i], ref_aux[-1])


@pytest.mark.parametrize("n", [1, 255, 256, 257, 513])
def test_prefill_chunks_give_the_same_bits_at_every_chunk_size(tiny_target, monkeypatch, n):
    """A prompt runs in chunks of PREFILL_ROWS positions (native path): the chunk size must not change a bit of
    the logits, the aux states or what a later step computes from the cache (each row's GEMM and softmax are
    independent of the rows beside it), at and around the chunk boundaries."""
    from dart_core.models import fast_forward

    if tiny_target.fast is None:
        pytest.skip("the HF path does not chunk prompts")
    rng = np.random.default_rng(n)
    prompt = rng.integers(0, tiny_target.vocab_size, size=n).tolist()
    nxt = rng.integers(0, tiny_target.vocab_size, size=2).tolist()
    outs = []
    for rows in (fast_forward.PREFILL_ROWS, fast_forward.NATIVE_MAX_ROWS, 7):
        monkeypatch.setattr(fast_forward, "PREFILL_ROWS", rows)
        session = tiny_target.new_session(n + 4)
        first = session.prefill(prompt, want_aux=True)
        then = session.prefill(nxt)
        outs.append((first.logits, first.aux, then.logits))
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert torch.equal(a, b)
    ref, _ = reference_forward(tiny_target, prompt + nxt)
    assert_near(outs[0][2][-1], ref[-1])


# ---------------------------------------------------------------- the LM head on request (NodeLogits)
def test_verify_runs_the_lm_head_for_the_likeliest_rows_only(tiny_target):
    """A verify computes the root's and the likeliest nodes' logits (LM_HEAD_FIRST_ROWS in all); any other row
    is computed when asked for, equal bit for bit to the same row computed with the whole tree."""
    from dart_core.models.target import LM_HEAD_FIRST_ROWS

    rng = np.random.default_rng(7)
    vocab = tiny_target.vocab_size
    prompt = rng.integers(0, vocab, size=9).tolist()
    tree = random_tree(rng, 11, vocab, root=int(rng.integers(0, vocab)))
    session = tiny_target.new_session(32)
    session.prefill(prompt)
    out = session.verify(tree)
    logits = out.logits
    assert len(logits) == len(tree)
    if not logits.lazy:   # the HF forward computed every row
        assert tiny_target.fast is None
        return
    assert logits.rows_computed == LM_HEAD_FIRST_ROWS and logits.head_calls == 1
    late = logits.row(len(tree) - 1)                       # not among the first rows: one more call
    assert logits.rows_computed == LM_HEAD_FIRST_ROWS + 1 and logits.head_calls == 2
    logits.row(0)                                          # already there: no call
    assert logits.head_calls == 2
    every = logits.all()                                   # the rest in one call
    assert logits.head_calls == 3 and logits.rows_computed == len(tree)
    assert torch.equal(late, every[-1])
    # the same tree with every row in one LM head call: the same bits
    again = tiny_target.new_session(32)
    again.prefill(prompt)
    full = tiny_target.forward(again.cache, *tree_inputs(tree, len(prompt)), want_aux=False)
    assert torch.equal(every, full.logits)
    logits.release()
    assert torch.equal(logits.row(3), full.logits[3])       # computed again from the kept hidden states
    for i in range(len(tree)):
        ref, _ = reference_forward(tiny_target, prompt + tree.tokens[tree.path_to(i)].tolist())
        assert_near(logits[i], ref[-1])


def test_the_forwards_own_lm_head_rows_across_chunks(tiny_target):
    """The lean forward computes the LM head of the rows asked for (``head_rows``) in its own native call, chunk by
    chunk: for a tree larger than one chunk, rows on both sides of the boundary, in the order asked, equal bit for
    bit the rows an LM head call computes from the hidden states afterwards. Bad requests are refused."""
    from dart_core.models.fast_forward import NATIVE_MAX_ROWS

    if tiny_target.fast is None:
        pytest.skip("the HF forward computes every row")
    rng = np.random.default_rng(12)
    vocab = tiny_target.vocab_size
    prompt = rng.integers(0, vocab, size=6).tolist()
    tree = random_tree(rng, NATIVE_MAX_ROWS + 5, vocab, root=int(rng.integers(0, vocab)))
    session = tiny_target.new_session(NATIVE_MAX_ROWS + 32)
    session.prefill(prompt)
    ids, pos, allowed = tree_inputs(tree, len(prompt))
    rows = [len(tree) - 1, 2, NATIVE_MAX_ROWS, 0, NATIVE_MAX_ROWS - 1]
    hidden, aux, first = tiny_target.fast.forward(session.cache, ids, pos, allowed, None, "hidden", rows)
    assert aux is None and first.shape == (len(rows), tiny_target.vocab_size)
    assert torch.equal(first, tiny_target.fast.lm_head(hidden[rows]))
    session.truncate(len(prompt))
    with pytest.raises(ValueError, match="head_rows goes with rows='hidden'"):
        tiny_target.fast.forward(session.cache, ids, pos, allowed, None, "all", [0])
    with pytest.raises(IndexError, match="head row"):
        tiny_target.fast.forward(session.cache, ids, pos, allowed, None, "hidden", [len(tree)])
    assert session.length == len(prompt)   # refused before anything ran


def test_node_logits_edges(tiny_target):
    session = tiny_target.new_session(16)
    session.prefill([3, 4, 5])
    out = session.verify(DraftTree.root_only(6))            # a plain step: one row, computed by verify
    logits = out.logits
    assert len(logits) == 1 and logits.rows([]).shape == (0, tiny_target.vocab_size)
    assert logits.all().shape == (1, tiny_target.vocab_size)
    assert logits.rows([0, 0]).shape == (2, tiny_target.vocab_size)   # a node asked twice: one row, twice
    if logits.lazy:
        assert logits.rows_computed == 1 and logits.head_calls == 1
    with pytest.raises(IndexError, match="node 1 is not in a tree of 1 nodes"):
        logits.row(1)
    with pytest.raises(IndexError, match="node -1"):
        logits.rows([-1])


def test_rope_rows_equal_the_rotary_modules_bit_for_bit(tiny_target):
    """The lean path takes RoPE's cos / sin rows from tables (the module once, not every step): each row must be
    the module's own output for that position, before and after the tables grow, in any order, repeated."""
    fast = tiny_target.fast
    if fast is None:
        pytest.skip("the HF forward runs the rotary module itself")
    for positions in ([0], [5, 3, 3, 0], [1023, 1024, 7], [5000, 2, 4999], []):
        pos = np.array(positions, dtype=np.int64)
        cos, sin = fast._rope(pos)
        assert cos.shape == sin.shape == (len(positions), fast.head_dim) and cos.dtype == np.float32
        for k, p in enumerate(positions):
            with torch.inference_mode():
                c, s = fast.rotary(torch.zeros(1, 1, fast.head_dim), torch.tensor([[p]]))
            assert np.array_equal(cos[k], c[0, 0].numpy()) and np.array_equal(sin[k], s[0, 0].numpy()), p
