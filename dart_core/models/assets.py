"""Where the bundled assets (default heads, N-gram table) are found.

A source checkout (``pip install -e .``) reads them from the repository's ``assets/``;
a regular wheel install carries a copy in ``dart_core/_assets`` (see native/CMakeLists.txt).
"""
from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]   # dart_core/ (this file is dart_core/models/assets.py)
_CANDIDATES = (_PACKAGE_DIR.parent / "assets", _PACKAGE_DIR / "_assets")


def asset_path(*parts: str) -> Path:
    """Path of a bundled asset, e.g. ``asset_path("ngram", "x.dngram")``; the checkout's copy wins."""
    for root in _CANDIDATES:
        path = root.joinpath(*parts)
        if path.exists():
            return path
    return _CANDIDATES[0].joinpath(*parts)  # where it would be: error messages name this path
