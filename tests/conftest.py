"""Shared settings and fixtures of every test folder (tests/<group>/test_*.py, grouped like the package:
docs/ARCHITECTURE.md section 1). pytest's default import mode puts this folder on sys.path, so the helper
modules beside it (tiny_models.py, sampling_checks.py, gradio_server.py, plot_layout.py) import from every
folder. The fixtures here serve several folders (the bundled model, loaded once per test session; the tiny
random targets, once per module); a fixture only one folder uses is in that folder's conftest.py."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Before any test imports torch, as a user's process does (dart_core/openmp.py): torch's idle OpenMP threads spin
# only briefly.
import dart_core  # noqa: E402,F401

# Tests never read or write the user's cost models (``~/.cache/dart-demo/costs``): a test that fakes or slows a
# target would leave its timings there, and the next real start would size its trees from them. This process and
# every app or benchmark it starts use a folder of their own, removed at exit.
os.environ["DART_DEMO_CACHE"] = tempfile.mkdtemp(prefix="dart-test-cache-")
atexit.register(shutil.rmtree, os.environ["DART_DEMO_CACHE"], True)



@pytest.fixture(autouse=True, scope="module")
def _release_apps_after_each_module():
    """Frees what a module's Gradio apps held (their targets, heads and engines: 0.2-1.5 GB a module) once it ends.
    FastAPI (0.165) keeps the route functions it classified in lru_caches of up to a few thousand entries
    (fastapi.dependencies.models' ``*_cached`` functions); a Gradio app's routes close over its Blocks, so every app
    a test built stayed alive to the end of the session (the suite's peak resident memory grew past 4 GB). One app
    per process, as the product runs, is unaffected."""
    yield
    import gc
    import sys

    models = sys.modules.get("fastapi.dependencies.models")
    for name in dir(models) if models is not None else ():
        cached = getattr(models, name)
        if name.endswith("_cached") and hasattr(cached, "cache_clear"):
            cached.cache_clear()
    gc.collect()
    _return_free_heap()


def _return_free_heap() -> None:
    """glibc keeps freed heap pages for reuse; give them back so one module's peak does not stay resident beside the
    next one's (other C libraries: nothing to do)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _shared_data() -> Path | None:
    """The shared data folder (train/, distill/, eval/), found as the benchmark finds its named sets: from
    ``DART_DATA_DIR`` (dart_core.data_sources), which ``.ci/run`` points at the shared ``data/eval`` folder
    beside the clone, so its parent is the data folder; ``DART_SHARED_DATA`` names that folder directly."""
    from dart_core.data_sources import env_data_dir

    if os.environ.get("DART_SHARED_DATA"):
        return Path(os.environ["DART_SHARED_DATA"])
    data_dir = env_data_dir()
    if data_dir is None:
        return None
    return next((d for d in (data_dir, data_dir.parent) if (d / "train").is_dir()), data_dir.parent)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    found = _shared_data()
    if found is None or not found.is_dir():
        where = f"at {found}" if found is not None else "(DART_DATA_DIR is not set)"
        pytest.skip(f"shared data not found {where}: set DART_DATA_DIR to its eval folder, as .ci/run does, "
                    "or DART_SHARED_DATA to the data folder")
    return found


class FakeHubCache:
    """An empty Hugging Face cache folder laid out as huggingface_hub writes it (``put`` adds a file)."""
    COMMIT = "0123456789abcdef0123456789abcdef01234567"   # a made-up commit of the fake cache, not a pin

    def __init__(self, path: Path):
        self.path = path

    def put(self, src, text: str, commit: str = COMMIT) -> Path:
        """``src`` (a dart_core.data_sources.HubFile) with ``text`` as content, in ``snapshots/<commit>/``;
        a named revision (``main``) gets ``refs/<revision>`` naming the commit, a pinned commit is the
        snapshot's own name. A ``.gz`` name is gzip-compressed."""
        import gzip
        import re

        repo = self.path / f"{src.repo_type}s--{src.repo_id.replace('/', '--')}"
        if re.fullmatch(r"[0-9a-f]{40}", src.revision):
            commit = src.revision
        else:
            (repo / "refs").mkdir(parents=True, exist_ok=True)
            (repo / "refs" / src.revision).write_text(commit)
        path = repo / "snapshots" / commit / src.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(text.encode()) if src.filename.endswith(".gz") else text.encode())
        return path


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch) -> FakeHubCache:
    """Offline, no DART_DATA_DIR, and HF_HUB_CACHE pointing at an empty cache in tmp_path: no test that uses
    it reads the machine's cache or the network."""
    cache = tmp_path / "hf-hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DART_DATA_DIR", raising=False)
    return FakeHubCache(cache)


@pytest.fixture(scope="session")
def bundled_fp32():
    from dart_core.models.loader import load_target
    return load_target(None, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def bundled_bf16():
    from dart_core.models.loader import load_target
    return load_target(None, dtype="bfloat16", device="cpu")


@pytest.fixture(autouse=True)
def _one_thread_for_tiny_models(request):
    """Tiny-model tests run on one thread: their ops are too small to split, and two OpenMP threads
    on a busy 2-core machine wait on each other (10x slower). Bundled-model tests keep every core."""
    import torch
    if request.node.get_closest_marker("bundled"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------- tiny random targets (tiny_models.py), one a module
# Module-scoped, as each test module built its own before: a module's tests share them, no two modules do.
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny random Llama target in float32 (tiny_models.make_tiny_model_dir's defaults: seed 0, 4 layers,
    initializer range 0.5)."""
    from dart_core.models.loader import load_target
    from tiny_models import make_tiny_model_dir

    return load_target(str(make_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), "llama")), dtype="float32",
                       device="cpu")


@pytest.fixture(scope="module")
def tiny_llama_qwen3(tmp_path_factory):
    """Tiny random Llama and Qwen3 targets in float32 (seed 0), by model type: {"llama": ..., "qwen3": ...}."""
    from dart_core.models.loader import load_target
    from tiny_models import make_tiny_model_dir

    root = tmp_path_factory.mktemp("tiny-llama-qwen3")
    return {mt: load_target(str(make_tiny_model_dir(root, mt, seed=0)), dtype="float32", device="cpu")
            for mt in ("llama", "qwen3")}


@pytest.fixture(scope="module")
def tiny_store(tiny_llama, tmp_path_factory):
    """A native N-gram table (order 3) over the tiny vocabulary, built from tiny_llama's own greedy text, so N-gram
    terms are non-zero."""
    import json

    import numpy as np

    from dart_core.config import GenerationConfig
    from dart_core.engine.decoding import SpeculativeEngine
    from dart_core.ngram import store as ngram
    from dart_core.ngram.store import NgramStore, tokenizer_fingerprint

    t = tiny_llama
    native = ngram.require_native()
    eng = SpeculativeEngine(t)
    docs = [eng.generate(t.tokenizer.encode(p), GenerationConfig(max_new_tokens=40, max_length=80)).tokens
            for p in ("Write a Python", "The quick brown", "What is 12")]
    out = tmp_path_factory.mktemp("ng")
    b = native.TableBuilder(3, t.vocab_size, str(out), 1 << 16)
    b.add_documents(np.array([x for d in docs for x in d]), np.array([len(d) for d in docs]), t.vocab_size)
    b.finish(str(out / "t.dngram"), 1, tokenizer_fingerprint(t.tokenizer), json.dumps({}))
    return NgramStore.open(out / "t.dngram", expected_fingerprint=tokenizer_fingerprint(t.tokenizer))


@pytest.fixture(scope="module")
def tiny_app_models(tmp_path_factory):
    """A tiny fp32 Llama target with random DART and EAGLE-3 heads saved to disk, what the app loads through its
    flags (tiny_models.make_tiny_app_models): (TargetModel, model dir, DART head dir, EAGLE-3 head dir)."""
    from tiny_models import make_tiny_app_models

    return make_tiny_app_models(tmp_path_factory.mktemp("app-models"))
