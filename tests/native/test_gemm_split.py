"""How the small GEMM cuts a call's rows among its threads (dart_core/models/gemm_split.py and the native knob):
every cut gives the same bits on every path and edge size, the choice is timed once and kept per machine, fixed by
DART_GEMM_SPLIT, and bad values are refused saying what to write."""
import json

import numpy as np
import pytest
import torch

from dart_core import _native
from dart_core.hardware import cache_dir, keyed_file
from dart_core.models import gemm_split, kernel_path

PATHS = list(_native.small_gemm_paths())


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    """Each test starts with chunks, no choice in the process and an empty cache; it leaves the path and the cut
    as it found them."""
    path, items, choice = _native.small_gemm_path(), _native.small_gemm_split(), gemm_split._chosen
    monkeypatch.setenv("DART_DEMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(gemm_split.ENV, raising=False)
    gemm_split.forget()
    yield
    _native.small_gemm_set_path(path)
    _native.small_gemm_set_split(items)
    gemm_split._chosen = choice


def _products(x, w, threads):
    y = np.empty((x.shape[0], w.shape[0]), np.float32)
    _native.small_gemm(x, w, y, threads)
    return y


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_cut_gives_the_same_bits(path, dtype):
    """Rows 1-17 and 64 (one row, trees, the blocks, a prefill chunk) by 0-1,000 outputs (below and across the
    pool's 64-row floor, the 8- and 16-row units, ragged ends) by K of 0, 1 and 576."""
    _native.small_gemm_set_path(path)
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 63, 64, 65, 100, 1000):
        for k in (0, 1, 576):
            w = torch.from_numpy(rng.standard_normal((n, k), dtype=np.float32))
            w = w.bfloat16().view(torch.uint16).numpy() if dtype == "bfloat16" else w.numpy()
            for m in (1, 2, 3, 8, 9, 17, 64):
                x = rng.standard_normal((m, k), dtype=np.float32)
                _native.small_gemm_set_split(0)
                want = _products(x, w, 2)
                for items in (1, 2, 3, 64):
                    _native.small_gemm_set_split(items)
                    for threads in (1, 2, 3):
                        got = _products(x, w, threads)
                        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (path, n, k, m, items)


def test_the_native_knob_refuses_what_it_cannot_cut():
    for bad in (-1, 65, 1000):
        with pytest.raises(ValueError, match="items per thread must be 0"):
            _native.small_gemm_set_split(bad)
    assert _native.small_gemm_split() == 0                      # a refused value leaves the cut as it was
    for good in (0, 1, 64):
        _native.small_gemm_set_split(good)
        assert _native.small_gemm_split() == good


def test_env_setting(monkeypatch):
    for raw, want in (("auto", None), ("", None), (" Chunks ", 0), ("1", 1), ("2", 2), ("64", 64)):
        monkeypatch.setenv(gemm_split.ENV, raw)
        assert gemm_split.env_setting() == want
    for raw in ("0", "65", "-1", "one", "1.5"):
        monkeypatch.setenv(gemm_split.ENV, raw)
        with pytest.raises(ValueError, match="auto, chunks or a number of ranges per thread from 1 to 64"):
            gemm_split.env_setting()


def test_decide_keeps_chunks_unless_another_cut_is_clearly_faster():
    assert gemm_split.decide({0: 1.0, 2: 0.995, 1: 0.999}) == 0          # within 1%: chunks
    assert gemm_split.decide({0: 1.0, 2: 0.98, 1: 0.95}) == 1
    assert gemm_split.decide({0: 0.9, 2: 1.0, 1: 1.1}) == 0
    assert gemm_split.decide({2: 1.0, 1: 0.9}) == 1                      # chunks not timed: the fastest


def weights(n=4, rows=256, k=576, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, k, generator=g).bfloat16().view(torch.uint16).numpy() for _ in range(n)]


def test_timed_once_then_read_from_the_machines_cache(monkeypatch):
    ws = weights()
    first = gemm_split.choose(ws, 2, "tiny 2x576", "uint16")
    assert first.source == "measured" and first.path == _native.small_gemm_path()
    assert set(first.ms) == {gemm_split.name(c) for c in gemm_split.CANDIDATES} and all(v > 0 for v in first.ms.values())
    assert _native.small_gemm_split() == first.items in gemm_split.CANDIDATES
    assert "rows cut in" in first.describe() and "measured on the" in first.describe()
    key = gemm_split.cache_key("tiny 2x576", "uint16", 2)
    record = json.loads(keyed_file(cache_dir() / "kernels", key).read_text())
    assert record["items"] == first.items and record["key"] == key and record["key"]["path"] == first.path

    monkeypatch.setattr(gemm_split, "measure", lambda *a, **k: pytest.fail("timed again"))
    assert gemm_split.choose(ws, 2, "tiny 2x576", "uint16") is first        # the same process: its choice
    gemm_split.forget()                                                     # a new process: the cache
    assert _native.small_gemm_split() == 0
    again = gemm_split.choose(ws, 2, "tiny 2x576", "uint16")
    assert (again.items, again.source, again.ms) == (first.items, "cached", first.ms)
    assert _native.small_gemm_split() == first.items


def test_another_target_threads_or_path_is_timed_on_its_own(monkeypatch):
    ws = weights()
    gemm_split.choose(ws, 2, "tiny 2x576", "uint16")
    timed = []
    monkeypatch.setattr(gemm_split, "measure", lambda w, t, *a, **k: timed.append(t) or {0: 1.0, 2: 0.5, 1: 0.9})
    for target, threads in (("other", 2), ("tiny 2x576", 3)):
        gemm_split.forget()
        assert gemm_split.choose(ws, threads, target, "uint16").items == 2
    assert timed == [2, 3]
    others = [p for p in PATHS if p != _native.small_gemm_path()]
    if others:   # the choice of one path is not another's
        _native.small_gemm_set_path(others[0])
        assert gemm_split.choose(ws, 2, "tiny 2x576", "uint16").source == "measured" and len(timed) == 3


def test_a_damaged_cache_file_is_timed_again(monkeypatch):
    ws = weights()
    key = gemm_split.cache_key("tiny 2x576", "uint16", 2)
    file = keyed_file(cache_dir() / "kernels", key)
    file.parent.mkdir(parents=True)
    monkeypatch.setattr(gemm_split, "measure", lambda *a, **k: {0: 1.0, 2: 1.0, 1: 0.5})
    for text in ("{not json", "[1, 2]", json.dumps({"key": key, "items": -3}), json.dumps({"key": key, "items": "1"}),
                 json.dumps({"key": key, "items": True}), json.dumps({"key": {**key, "path": "elsewhere"}, "items": 2})):
        file.write_text(text)
        gemm_split.forget()
        choice = gemm_split.choose(ws, 2, "tiny 2x576", "uint16")
        assert (choice.source, choice.items) == ("measured", 1)
    file.write_text(json.dumps({"key": key, "items": 2, "ms": [3]}))   # the count kept, damaged times dropped
    gemm_split.forget()
    choice = gemm_split.choose(ws, 2, "tiny 2x576", "uint16")
    assert (choice.source, choice.items, choice.ms) == ("cached", 2, {}) and "rows cut in 2 ranges" in choice.describe()


def test_the_variable_fixes_the_cut_without_timing(monkeypatch):
    monkeypatch.setattr(gemm_split, "measure", lambda *a, **k: pytest.fail("timed with the cut fixed"))
    for raw, items in (("chunks", 0), ("1", 1), ("5", 5)):
        monkeypatch.setenv(gemm_split.ENV, raw)
        gemm_split.forget()
        choice = gemm_split.choose(weights(), 2, "tiny 2x576", "uint16")
        assert (choice.items, choice.source) == (items, gemm_split.ENV) and _native.small_gemm_split() == items
    monkeypatch.setenv(gemm_split.ENV, "lots")
    gemm_split.forget()
    with pytest.raises(ValueError, match="DART_GEMM_SPLIT='lots'"):
        gemm_split.choose(weights(), 2, "tiny 2x576", "uint16")
    assert _native.small_gemm_split() == 0                                  # nothing set by the refusal


def test_one_thread_or_no_weights_needs_no_timing(monkeypatch):
    monkeypatch.setattr(gemm_split, "measure", lambda *a, **k: pytest.fail("timed"))
    assert gemm_split.choose(weights(), 1, "tiny", "uint16").source == "one thread"
    gemm_split.forget()
    assert gemm_split.choose([], 2, "tiny", "uint16").source == "no weights to time"


def test_a_loaded_model_names_its_cut_and_the_cost_model_is_keyed_by_it(bundled_bf16):
    from dart_core.sizing.costs import _machine_key
    choice = gemm_split._chosen = bundled_bf16.fast.gemm_split   # what its load chose (the fixture forgot it)
    assert choice.describe() in bundled_bf16.forward_backend
    _native.small_gemm_set_split(choice.items)
    a = _machine_key(bundled_bf16)
    _native.small_gemm_set_split(0 if choice.items else 1)
    assert _machine_key(bundled_bf16)["gemm_split"] != a["gemm_split"]


def test_a_verify_is_the_same_bits_under_every_cut(bundled_bf16):
    """The decoder, the LM head and the attention with each cut: a 9-node tree's logits after 40 tokens."""
    from dart_core.engine.tree import DraftTree
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, bundled_bf16.vocab_size, size=40).tolist()
    tokens = rng.integers(0, bundled_bf16.vocab_size, size=9).tolist()
    tree = DraftTree.from_parents(tokens, [-1, 0, 1, 2, 3, 0, 5, 6, 7])   # a chain of 4 and a branch of 4
    logits = {}
    torch.set_num_threads(2)
    for items in (0, 1, 2):
        _native.small_gemm_set_split(items)
        session = bundled_bf16.new_session(64)
        session.prefill(prompt)
        out = session.verify(tree).logits
        rows = out.rows(range(9)) if hasattr(out, "rows") else out
        logits[items] = rows.float().numpy().copy()
    for items in (1, 2):
        assert np.array_equal(logits[items].view(np.uint32), logits[0].view(np.uint32))
