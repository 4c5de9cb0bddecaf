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
