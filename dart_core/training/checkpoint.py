"""Atomic checkpoint directories: write ``DIR.tmp``, then swap it in, so a crash never leaves a half checkpoint.

    save_checkpoint(out / "checkpoint", write_fn)   # write_fn(tmp_dir) writes the files
    path = find_checkpoint(out / "checkpoint")      # the complete checkpoint, or None
    state = load_trainer_state(path / STATE_FILE)   # the trainer state in it, read as plain data

The RNG states a checkpoint records are here too (``rng_state`` / ``set_rng_state``).
"""
from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .run_config import TrainError

MARKER = "COMPLETE"
STATE_FILE = "trainer_state.pt"


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


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(s: dict) -> None:
    torch.set_rng_state(s["torch"]); np.random.set_state(s["numpy"]); random.setstate(s["python"])


def _numpy_array_globals() -> list:
    """What a pickled numpy array needs (the numpy RNG state is one): its class, dtype and rebuild function.
    None of them runs code of the file's choosing; numpy 1.x files name the rebuild function numpy.core.*."""
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    numeric_dtypes = sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdg"}, key=lambda t: t.__name__)
    return [np.ndarray, np.dtype, *numeric_dtypes, multiarray._reconstruct,
            (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
            (multiarray._reconstruct, "numpy._core.multiarray._reconstruct")]


def load_trainer_state(path: Path) -> dict[str, Any]:
    """A checkpoint's trainer state, read as data only (``torch.load(weights_only=True)``): tensors, numbers,
    text, containers and numpy arrays. A run directory may come from someone else, and unpickling an arbitrary
    object can run any code, so a state holding anything else is refused with TrainError."""
    import pickle

    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.split("error:", 1)[-1].strip() for ln in str(exc).splitlines()]
        found = next((ln for ln in lines if "GLOBAL" in ln or "global" in ln or "Can only build" in ln), None)
        if found is None:   # not a pickle of objects at all: a damaged or foreign file
            why = next((ln for ln in lines if "Unsupported" in ln), type(exc).__name__)
            raise TrainError(f"cannot read the trainer state {path} ({why}); the checkpoint is damaged: choose "
                             "another --out to start over") from None
        raise TrainError(f"refusing to resume from {path}: the trainer state holds Python objects besides plain "
                         f"data (tensors, numbers, text, arrays), and loading them could run code ({found}). "
                         "Resume only runs written by dart_core.train; to start over, choose another --out") from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise TrainError(f"cannot read the trainer state {path} ({type(exc).__name__}: {exc}); the checkpoint is "
                         "damaged: choose another --out to start over") from None
    if not isinstance(state, dict) or "step" not in state:
        raise TrainError(f"{path} is not a dart_core trainer state (no step count); choose another --out")
    return state
