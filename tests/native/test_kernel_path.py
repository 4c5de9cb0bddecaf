"""The kernels' path chosen at load (dart_core/models/kernel_path.py): timed on the model's own matrices on a
machine's first load, kept per machine, target, dtype and threads, fixed by DART_GEMM_PATH or by a caller; and
the sweep that times it (``_native.gemm_sweep``) at its edge sizes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from dart_core import _native
from dart_core.models import gemv_prefetch, kernel_path

PATHS = list(_native.small_gemm_paths())
VECTOR_PATHS = [p for p in PATHS if p != "portable"]


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    """Each test starts with nothing forced, no choice in the process and an empty cache; it leaves the path as
    it found it."""
    before = _native.small_gemm_path()
    monkeypatch.setenv("DART_DEMO_CACHE", str(tmp_path / "cache"))
    kernel_path.forget()
    yield
    kernel_path.forget()
    gemv_prefetch.forget()
    _native.small_gemm_set_path(before)


def weights(n=4, rows=256, k=576, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, k, generator=g).bfloat16().view(torch.uint16).numpy() for _ in range(n)]


@pytest.mark.skipif(len(VECTOR_PATHS) < 2, reason="this CPU runs one vector path: nothing to choose")
def test_timed_once_then_read_from_the_machines_cache(monkeypatch):
    ws = weights()
    first = kernel_path.choose(ws, 2, "tiny 2x576", "uint16")
    assert first.source == "measured" and set(first.step_ms) == set(VECTOR_PATHS) == set(first.tree_ms)
    assert all(v > 0 for v in first.step_ms.values()) and all(v > 0 for v in first.tree_ms.values())
    assert first.path == kernel_path.decide(first.step_ms, first.tree_ms)
    assert _native.small_gemm_path() == first.path and _native.small_gemm_path_source() == "set"
    assert f"kernel path {first.path} (measured" in first.describe()
    record = json.loads(open(first.cache_file).read())
    assert record["path"] == first.path and record["key"]["target"] == "tiny 2x576"
    assert record["key"]["paths"] == VECTOR_PATHS and record["key"]["threads"] == 2

    monkeypatch.setattr(kernel_path, "measure", lambda *a, **k: pytest.fail("timed again"))
    assert kernel_path.choose(ws, 2, "tiny 2x576", "uint16") is first      # the same process: its choice
    kernel_path.forget()                                                    # a new process: the cache
    again = kernel_path.choose(ws, 2, "tiny 2x576", "uint16")
    assert (again.path, again.source, again.step_ms) == (first.path, "cached", first.step_ms)
    assert _native.small_gemm_path() == first.path
    monkeypatch.undo()

    # another target, dtype or thread count is timed on its own
    for target, dtype, threads in (("other 2x576", "uint16", 2), ("tiny 2x576", "float32", 2),
                                   ("tiny 2x576", "uint16", 1)):
        kernel_path.forget()
        assert kernel_path.choose(ws, threads, target, dtype).source == "measured"


@pytest.mark.skipif(len(VECTOR_PATHS) < 2, reason="this CPU runs one vector path: nothing to choose")
@pytest.mark.parametrize("damage", ["", "{not json", "[]", "another path", "another machine"])
def test_a_damaged_or_foreign_cache_file_is_timed_again(damage):
    ws = weights(n=2)
    first = kernel_path.choose(ws, 1, "tiny", "uint16")
    record = json.loads(open(first.cache_file).read())
    if damage == "another path":
        record["path"] = "sse9"
        text = json.dumps(record)
    elif damage == "another machine":
        record["key"]["machine"] = "some other CPU"
        text = json.dumps(record)
    else:
        text = damage
    with open(first.cache_file, "w") as f:
        f.write(text)
    kernel_path.forget()
    again = kernel_path.choose(ws, 1, "tiny", "uint16")
    assert again.source == "measured" and again.path in VECTOR_PATHS
    assert json.loads(open(again.cache_file).read())["path"] == again.path     # rewritten whole


def test_a_path_the_caller_forced_is_kept(monkeypatch):
    monkeypatch.setattr(kernel_path, "measure", lambda *a, **k: pytest.fail("timed a forced path"))
    for path in PATHS:
        kernel_path.forget()
        _native.small_gemm_set_path(path)
        choice = kernel_path.choose(weights(n=1), 1, "tiny", "uint16")
        assert (choice.path, choice.source) == (path, "set by the caller")
        assert _native.small_gemm_path() == path
        assert choice.describe() == f"kernel path {path} (set by the caller)"


def test_the_variable_fixes_the_path_without_timing():
    """DART_GEMM_PATH is read once per process by the kernels: a fresh interpreter loads a tiny model with it."""
    code = ("import numpy as np, torch\n"
            "from dart_core import _native\n"
            "from dart_core.models import kernel_path\n"
            "kernel_path.measure = lambda *a, **k: (_ for _ in ()).throw(AssertionError('timed'))\n"
            "ws = [torch.randn(64, 64).bfloat16().view(torch.uint16).numpy()]\n"
            "c = kernel_path.choose(ws, 1, 'tiny', 'uint16')\n"
            "print(c.path, c.source, _native.small_gemm_path_source())\n")
    want = VECTOR_PATHS[-1] if VECTOR_PATHS else "portable"
    env = {**os.environ, "DART_GEMM_PATH": want}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [want, "DART_GEMM_PATH", "DART_GEMM_PATH"]


def test_the_least_step_plus_tree_time_wins():
    assert kernel_path.decide({"amx": 1.0, "avx512": 0.9}, {"amx": 1.2, "avx512": 1.5}) == "amx"
    assert kernel_path.decide({"amx": 1.0, "avx512": 0.9}, {"amx": 1.2, "avx512": 1.2}) == "avx512"
    assert kernel_path.decide({"avx512bf16": 1.0, "avx512": 1.0}, {"avx512bf16": 1.0, "avx512": 1.0}) == "avx512bf16"


def test_auto_forces_nothing():
    _native.small_gemm_set_path("portable")
    assert _native.small_gemm_path_source() == "set"
    _native.small_gemm_set_path("auto")
    assert _native.small_gemm_path_source() in ("default", "DART_GEMM_PATH")


def test_the_sweep_at_its_edge_sizes():
    for rows in (1, 2, 7, 16, 17, 64):
        for ws in (weights(n=2, rows=8, k=32), [np.zeros((1, 1), np.float32)], [np.zeros((0, 16), np.float32)],
                   [np.zeros((5, 0), np.uint16)], []):
            times = _native.gemm_sweep(ws, 2, 3, rows)
            assert len(times) == 3 and all(t >= 0 for t in times)
    for bad in ({"threads": 0}, {"reps": 0}, {"rows": 0}, {"rows": -1}):
        with pytest.raises(ValueError, match="threads, reps and rows must be >= 1"):
            _native.gemm_sweep(weights(n=1), **{"threads": 1, "reps": 1, "rows": 1, **bad})
    with pytest.raises(ValueError, match="2-D and C-contiguous"):
        _native.gemm_sweep([weights(n=1)[0][:, ::2]], 1, 1, 2)
    with pytest.raises(TypeError, match="float32 or uint16"):
        _native.gemm_sweep([np.zeros((4, 4), np.float64)], 1, 1, 2)


def test_a_loaded_model_names_its_path():
    """The lean forward chooses at load and the backend line (logs, benchmark records, the page) names it."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    from dart_core.models.fast_forward import FastForward
    ff = FastForward(model)
    assert ff.gemm_path is kernel_path.chosen()
    assert ff.gemm_path.path == _native.small_gemm_path()
    assert ff.gemm_path.source in ("measured", "the only vector path", "DART_GEMM_PATH")
