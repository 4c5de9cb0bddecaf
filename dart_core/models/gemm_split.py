"""How the small GEMM cuts a call's weight rows among its threads: timed on the model's own weights at load.

Every call of the native small GEMM (the decoder's projections, the LM head, the heads' layers) cuts the weight
matrix's rows into ranges that the thread pool's threads claim in order. Two ways to cut them:

- ``chunks`` (the native default): ranges of about 48 KiB of weights, at least two per thread. A thread the OS has
  not scheduled yet leaves its chunks to the others, so a busy machine costs little; chosen on an Emerald Rapids
  VM, where 48-128 KiB streamed 66-68% of the read bandwidth against 60% for 16 KiB.
- ``k`` equal ranges per thread (1 or 2): each thread streams one or two long runs of consecutive rows, which a
  CPU's hardware prefetchers may follow better than a new 48 KiB run every few microseconds.

On a 2-vCPU Zen 4 EPYC (the bundled model in bf16, 2 threads, in place, interleaved): one range a thread ran a
plain step in 0.97x the time of chunks, and trees of 3 / 9 / 17 nodes in 0.94x / 0.91x / 0.90x. Which wins depends
on the CPU, so the first load of a model on a machine times the settings on its kernel path, on the model's own
matrices (one row, as a plain step, and ``kernel_path.TREE_ROWS`` rows, as a tree), interleaved; a setting other
than chunks must be at least ``MIN_GAIN`` faster (chunks is the safer cut on a busy machine). The choice is kept
beside the kernel path's (``<cache>/kernels/``, keyed by machine, target, dtype, threads, path and code version).
The results are the same bits under any cut (each output's sum runs over K in one order, whoever computes it).

``DART_GEMM_SPLIT=chunks`` or ``=K`` (1-64 ranges a thread) fixes the cut without timing; ``auto`` (default) times.
"""
from __future__ import annotations

import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..hardware import write_json
from . import gemv_prefetch, kernel_path

logger = logging.getLogger(__name__)

try:
    from .. import _native
except ImportError:  # the lean forward (the only caller) is off without the extension
    _native = None

ENV = "DART_GEMM_SPLIT"
CANDIDATES = (0, 2, 1)   # items per thread: 0 = chunks of ~48 KiB (the default, first: it wins ties)
MAX_ITEMS = 64           # the native limit on ranges per thread
REPS = 7                 # interleaved rounds (each setting: a one-row and a tree sweep): ~0.4 s for the bundled model
WARMUP = 1
MIN_GAIN = 0.01          # a cut other than chunks must take at most 1 - MIN_GAIN of chunks' time


def name(items: int) -> str:
    """How a setting reads in logs and on the page."""
    return "chunks of ~48 KiB" if items == 0 else f"{items} range{'s' if items > 1 else ''} a thread"


@dataclass(frozen=True)
class GemmSplit:
    """The cut calls run with, and how it was chosen."""
    items: int                 # ranges per thread; 0 = chunks of ~48 KiB
    source: str                # "measured", "cached", "DART_GEMM_SPLIT", "one thread", "no weights to time"
    path: str = ""             # the kernel path it was timed on
    ms: dict[str, float] = field(default_factory=dict)   # per setting: median ms of a 1-row + a tree sweep

    def describe(self) -> str:
        if not self.ms:
            return f"rows cut in {name(self.items)} ({self.source})"
        timed = ", ".join(f"{k} {v:.2f}" for k, v in self.ms.items())
        return (f"rows cut in {name(self.items)} ({self.source} on the {self.path} path: ms for a 1-row + a "
                f"{kernel_path.TREE_ROWS}-row sweep: {timed})")


_chosen: GemmSplit | None = None


def env_setting() -> int | None:
    """``DART_GEMM_SPLIT`` as items per thread (None: ``auto``); ValueError saying what to write otherwise."""
    raw = os.environ.get(ENV, "auto")
    value = raw.strip().lower() or "auto"
    if value == "auto":
        return None
    if value == "chunks":
        return 0
    if value.isdigit() and 1 <= int(value) <= MAX_ITEMS:
        return int(value)
    raise ValueError(f"{ENV}={raw!r} is not auto, chunks or a number of ranges per thread from 1 to {MAX_ITEMS}: "
                     f"set it to chunks (the pool's ~48 KiB chunks) or e.g. 1 to fix how a call's rows are cut "
                     "among the threads, or auto (or unset it) to time which is faster here")


def measure(weights: Sequence[np.ndarray], threads: int, candidates: Sequence[int] = CANDIDATES,
            reps: int = REPS) -> dict[int, float]:
    """Median seconds per setting of a one-row plus a ``TREE_ROWS``-row sweep of ``weights`` on the current path,
    interleaved (each round times every setting once, the order rotating). Leaves the cut as it found it."""
    before = _native.small_gemm_split()
    times: dict[int, list[float]] = {c: [] for c in candidates}
    try:
        for rnd in range(WARMUP + reps):
            shift = rnd % len(candidates)
            for c in list(candidates[shift:]) + list(candidates[:shift]):
                _native.small_gemm_set_split(c)
                dt = (_native.gemm_sweep(weights, threads, 1, 1)[0]
                      + _native.gemm_sweep(weights, threads, 1, kernel_path.TREE_ROWS)[0])
                if rnd >= WARMUP:
                    times[c].append(dt)
    finally:
        _native.small_gemm_set_split(before)
    return {c: statistics.median(v) for c, v in times.items()}


def decide(seconds: dict[int, float], min_gain: float = MIN_GAIN) -> int:
    """The fastest setting, if it beats chunks (0) by ``min_gain``; else chunks."""
    best = min(seconds, key=seconds.get)
    return best if 0 not in seconds or seconds[best] <= (1.0 - min_gain) * seconds[0] else 0


def cache_key(target_name: str, dtype: str, threads: int) -> dict:
    return {**kernel_path.cache_key(target_name, dtype, threads), "knob": "gemm_split",
            "path": _native.small_gemm_path()}


def _read_cache(file: Path, key: dict) -> GemmSplit | None:
    """The choice kept in ``file`` under ``key`` (source "cached"), or None for a missing, foreign or damaged one
    (another key's file under a colliding name: time again)."""
    try:
        record = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key:
        return None
    items, ms = record.get("items"), record.get("ms")
    if type(items) is not int or not 0 <= items <= MAX_ITEMS:
        return None
    return GemmSplit(items, "cached", key["path"], ms if isinstance(ms, dict) else {})


def choose(weights: Sequence[np.ndarray], threads: int, target_name: str, dtype: str) -> GemmSplit:
    """The cut for this process's calls on the current kernel path: fixed by ``DART_GEMM_SPLIT``, read from this
    machine's cache, or timed on ``weights`` (the model's matrices in the order a step reads them). Sets it in the
    native kernels and returns it. Call after :func:`kernel_path.choose` (the cut is timed on the path it set)."""
    global _chosen
    path = _native.small_gemm_path()
    if _chosen is not None and _chosen.path == path:
        return _chosen
    fixed = env_setting()
    if fixed is not None:
        choice = GemmSplit(fixed, ENV, path)
    elif threads <= 1 or not weights:
        choice = GemmSplit(0, "one thread" if threads <= 1 else "no weights to time", path)
    else:
        key = cache_key(target_name, dtype, threads)
        file = kernel_path.cache_file(key)
        choice = _read_cache(file, key)
        if choice is None:
            t0 = time.perf_counter()
            seconds = measure(gemv_prefetch.sample(weights), threads)
            choice = GemmSplit(decide(seconds), "measured", path, {name(c): 1000 * s for c, s in seconds.items()})
            try:
                write_json(file, {"key": key, **asdict(choice), "seconds_timing": round(time.perf_counter() - t0, 3),
                                  "when": time.strftime("%Y-%m-%d %H:%M:%S")})
            except OSError as e:   # a read-only home: the choice holds for this process
                logger.warning("could not keep the GEMM split choice (%s): it is timed again next time", e)
    _native.small_gemm_set_split(choice.items)
    _chosen = choice
    logger.info("small-GEMM %s", choice.describe())
    return choice


def chosen() -> GemmSplit | None:
    """What :func:`choose` set in this process (None: no model loaded yet; calls cut in chunks)."""
    return _chosen


def forget() -> None:
    """Tests: drop the process's choice and return to chunks (the next :func:`choose` decides again)."""
    global _chosen
    _chosen = None
    _native.small_gemm_set_split(0)
