"""Shared fixtures: models are loaded once per test session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(os.environ.get("DART_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA} (set DART_SHARED_DATA)")
    return SHARED_DATA


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
