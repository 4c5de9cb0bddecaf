"""Atomic checkpoint directories: write ``DIR.tmp``, then swap it in, so a crash never leaves a half checkpoint.

    save_checkpoint(out / "checkpoint", write_fn)   # write_fn(tmp_dir) writes the files
    path = find_checkpoint(out / "checkpoint")      # the complete checkpoint, or None
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

MARKER = "COMPLETE"


def save_checkpoint(path: str | Path, write: Callable[[Path], None]) -> Path:
    path = Path(path)
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write(tmp)
    (tmp / MARKER).write_text("ok\n")
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(path, old)
    os.replace(tmp, path)
    if old.exists():
        shutil.rmtree(old)
    return path


def find_checkpoint(path: str | Path) -> Path | None:
    """The latest complete checkpoint at ``path`` (or its ``.old`` twin after a crash mid-swap)."""
    path = Path(path)
    for p in (path, path.with_name(path.name + ".old")):
        if (p / MARKER).is_file():
            return p
    return None
