"""Whether the one-row kernel prefetches weights in software: measured on the model's own weights at load.

A plain decoding step streams every weight once through the one-row kernel (M = 1, the GEMV). Issuing the next
block's loads early helps on some CPUs and paths and hurts on others. Measured on a 2-vCPU AMD EPYC (Zen 5, family
26), the bundled SmolLM2-135M in bf16, one row through every decoder matrix, 2 threads, interleaved in one process:
the avx512bf16 kernel streamed 88-93% of the read bandwidth without it against 81-83% with it (one token 0.87-0.95x
the time), while the avx512 and avx2 kernels fell from 77% / 84% to 64% / 72% without it. Earlier sessions found
prefetching paid on the avx512 kernel of an Emerald Rapids VM and not on the AMX kernel (which never prefetches).
The output is the same bits either way (only which loads are issued early changes), so the setting is chosen by
timing both arms on the model's matrices (the first ones, four times the last-level cache or 256 MiB, whichever is
more: a sample the cache holds measured 1.7x in favour of prefetching, 64 MiB against a 32 MiB L3 flip-flopped),
once per kernel path per process. The gain moves with the machine: on that EPYC, pairs of whole sweeps gave ratios
(without / with) of 0.87-1.03 from one second to the next, median about 0.95, so near a tie either setting costs
at most a percent or so, and only a clear median gain turns the prefetch off.

Since the avx512bf16 one-row kernel streams its rows one by one, its prefetch is of the line 4 KiB ahead into L2
(PREFETCHT1), and the setting also covers its two-row trees (on a Zen 4 EPYC, in place, both ran 2-3% faster
without it, while trees of 3-17 rows, which always prefetch so, verified in 0.80-0.95x the time); that figure of
the Zen 5 was of the blocks of 8 before.
``DART_GEMV_PREFETCH=on`` or ``off`` fixes the setting (no measurement); ``auto`` (the default) measures.
"""
from __future__ import annotations

import logging
import os
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..hardware import last_level_cache_bytes

logger = logging.getLogger(__name__)

try:
    from .. import _native
except ImportError:  # the lean forward (the only caller) is off without the extension
    _native = None

ENV = "DART_GEMV_PREFETCH"
SETTINGS = ("auto", "on", "off")
MIN_SAMPLE_BYTES = 256 << 20   # at least this much of the model is swept (all of it if smaller), and 4x the LLC
REPS = 21                 # interleaved pairs of sweeps: ~0.3 s for the bundled model
WARMUP = 2                # pairs first, not counted (the pool's threads, the page tables, the load's aftermath)
MIN_GAIN = 0.01           # "off" must be this much faster (median of the pairs' ratios): else the default (on)


@dataclass(frozen=True)
class GemvPrefetch:
    """The setting one kernel path runs with, and how it was chosen."""
    path: str
    on: bool
    source: str                  # "measured", "DART_GEMV_PREFETCH" or "no vector kernel"
    ms_on: float | None = None   # median ms of a sweep over the sample, each arm
    ms_off: float | None = None
    ratio: float | None = None   # median over the interleaved pairs of (time without) / (time with)

    def describe(self) -> str:
        state = "on" if self.on else "off"
        if self.source == "measured":
            return (f"GEMV prefetch {state} (measured: {self.ms_on:.2f} ms with, {self.ms_off:.2f} without, "
                    f"{self.ratio:.2f}x)")
        return f"GEMV prefetch {state} ({self.source})"


_chosen: dict[str, GemvPrefetch] = {}   # per kernel path, for the life of the process


def env_setting() -> str:
    """``DART_GEMV_PREFETCH`` as one of SETTINGS; ValueError (saying what to write) for anything else."""
    raw = os.environ.get(ENV, "auto")
    value = raw.strip().lower() or "auto"
    if value not in SETTINGS:
        raise ValueError(f"{ENV}={raw!r} is not one of {', '.join(SETTINGS)}: set it to on or off to fix the "
                         "one-row kernel's software prefetch, or auto (or unset it) to measure which is faster")
    return value


def sample_bytes() -> int:
    """How much of the model one measured sweep reads: 4x the last-level cache, at least ``MIN_SAMPLE_BYTES``, so
    that the weights come from memory as in a step, not from the cache."""
    return max(MIN_SAMPLE_BYTES, 4 * (last_level_cache_bytes() or 0))


def sample(weights: Sequence[np.ndarray], max_bytes: int | None = None) -> list[np.ndarray]:
    """The first matrices of ``weights`` (in order) up to ``max_bytes`` in all (default :func:`sample_bytes`);
    at least one."""
    max_bytes = sample_bytes() if max_bytes is None else max_bytes
    out, total = [], 0
    for w in weights:
        if out and total + w.nbytes > max_bytes:
            break
        out.append(w)
        total += w.nbytes
    return out


def measure(weights: Sequence[np.ndarray], threads: int, reps: int = REPS) -> tuple[float, float, float]:
    """Median seconds of one row through ``weights`` with the current path's GEMV prefetch on and off, and the
    median of the ratios (off / on) of the ``reps`` pairs. The two sweeps of a pair run back to back (the order
    alternating), so a drift in the machine's speed (a shared VM's moves by 10% within seconds) hits both alike.
    Leaves the setting as it found it."""
    path = _native.small_gemm_path()
    before = _native.small_gemm_gemv_prefetch(path)
    weights = list(weights)
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        for rep in range(WARMUP + reps):
            for on in ((True, False) if rep % 2 else (False, True)):
                _native.small_gemm_set_gemv_prefetch(path, on)
                dt = _native.gemm_sweep(weights, threads, 1)[0]
                if rep >= WARMUP:
                    times[on].append(dt)
    finally:
        _native.small_gemm_set_gemv_prefetch(path, before)
    ratios = [off / on for on, off in zip(times[True], times[False])]
    return statistics.median(times[True]), statistics.median(times[False]), statistics.median(ratios)


def decide(ratio: float, min_gain: float = MIN_GAIN) -> bool:
    """True (prefetch) unless going without takes at most ``1 - min_gain`` of the time (``ratio`` = off / on)."""
    return not ratio <= 1.0 - min_gain


def choose(weights: Sequence[np.ndarray], threads: int) -> GemvPrefetch:
    """The GEMV prefetch of the current kernel path: fixed by ``DART_GEMV_PREFETCH``, or measured on the first
    matrices of ``weights`` (the model's, in the order a step reads them) with ``threads`` threads, once per path
    per process. Sets it in the native kernel and returns it."""
    path = _native.small_gemm_path()
    if path in _chosen:
        return _chosen[path]
    setting = env_setting()
    if setting != "auto":
        choice = GemvPrefetch(path, setting == "on", ENV)
    elif path == "portable" or not weights:
        choice = GemvPrefetch(path, True, "no vector kernel" if path == "portable" else "no weights to measure")
    else:
        on_s, off_s, ratio = measure(sample(weights), threads)
        choice = GemvPrefetch(path, decide(ratio), "measured", 1000 * on_s, 1000 * off_s, ratio)
    _native.small_gemm_set_gemv_prefetch(path, choice.on)
    _chosen[path] = choice
    logger.info("one-row kernel (%s path): %s", path, choice.describe())
    return choice


def chosen(path: str) -> GemvPrefetch | None:
    """What :func:`choose` set for this path in this process (None: not chosen yet, the default on)."""
    return _chosen.get(path)


def forget() -> None:
    """Tests: drop the choices (the next :func:`choose` measures or reads the variable again) and restore the
    default (on) on every path."""
    for path in ("amx", "avx512bf16", "avx512", "avx2", "portable"):
        _native.small_gemm_set_gemv_prefetch(path, True)
    _chosen.clear()
