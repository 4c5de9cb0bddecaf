"""TargetModel / TargetSession on tiny random Llama and Qwen3 models (fp32, exact up to float error)."""
import numpy as np
import pytest
import torch

from dart_core.models.kv_cache import CacheFullError
from dart_core.models.loader import ModelLoadError, load_target
from dart_core.tree import DraftTree
from tiny_models import make_tiny_model_dir


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny_target(request, tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), model_type=request.param,
                               num_hidden_layers=6)
    return load_target(str(path), dtype="float32", device="cpu")


def random_tree(rng, n, vocab, root):
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    tokens = [root] + rng.integers(0, vocab, size=n - 1).tolist()
    return DraftTree.from_parents(tokens, parents, scores=-np.arange(n, dtype=float))


def reference_forward(target, ids):
    """Plain full forward without any cache: logits [T, V] and aux [T, 3H]."""
    with torch.no_grad():
        out = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i][0] for i in target.aux_layer_ids], dim=-1)
    return out.logits[0].float(), aux


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
    assert out.logits.shape == (15, vocab) and out.aux.shape == (15, 3 * tiny_target.hidden_size)
    for i in range(len(tree)):
        seq = prompt + tree.tokens[tree.path_to(i)].tolist()
        ref_logits, ref_aux = reference_forward(tiny_target, seq)
        torch.testing.assert_close(out.logits[i], ref_logits[-1], atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(out.aux[i], ref_aux[-1], atol=2e-4, rtol=1e-4)


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
    torch.testing.assert_close(out.logits[0], ref[-1], atol=2e-4, rtol=1e-4)


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
    torch.testing.assert_close(out_a.logits[0], ref[-1], atol=2e-4, rtol=1e-4)
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
    torch.testing.assert_close(out.logits[0], ref[-1], atol=2e-4, rtol=1e-4)
