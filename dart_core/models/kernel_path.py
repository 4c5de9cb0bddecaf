"""Which small-GEMM path the target's kernels run: timed on the model's own weights at load, kept per machine.

The native kernels have up to four vector paths (``amx``, ``avx512bf16``, ``avx512``, ``avx2``); which is fastest
depends on the CPU and on how many rows a call carries, and the vendor is a poor guide: on a Zen 4 EPYC the
``avx512`` path ran the plain step 7% faster than ``avx512bf16``, on a Zen 5 ``avx512bf16`` ran trees 0.82-0.92x
the time of ``avx512``, and on Emerald Rapids (no AMX) it ran them 0.93-1.06x. So the first load of a model on a
machine times every path the CPU runs on the model's own matrices: a plain step's sweep (one row, each path with
the GEMV prefetch :mod:`gemv_prefetch` picks for it) and a tree verify's (``TREE_ROWS`` rows), interleaved pair by
pair so a drift in the machine's speed hits every path alike. The path with the least median time for one of each
wins: a decoding session runs plain steps (vanilla, the chooser's fall-backs) and verifies of trees of 2-9 nodes,
and a path that wins the plain step by a percent can lose a tree by a third (AVX512-BF16 on Intel without AMX).

The choice is kept in ``<cache>/kernels/`` (``DART_DEMO_CACHE``, else ``~/.cache/dart-demo``) under the machine
(CPU model and flags), the target, its dtype and the thread count, so later processes run the same path without
timing it again; delete the file to time again. Paths round differently (the bf16 dot-product paths round the
activations to bf16), so one path runs for the whole process: the first model's choice stands for every later
load, and vanilla and every drafter run it.

``DART_GEMM_PATH=amx|avx512bf16|avx512|avx2|portable`` fixes the path (no timing); a path a caller forced with
``_native.small_gemm_set_path`` (tests, benchmarks) is kept too.
"""
from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from . import gemv_prefetch
from ..hardware import cache_dir, keyed_file, machine_id, write_json

logger = logging.getLogger(__name__)

try:
    from .. import _native
except ImportError:  # the lean forward (the only caller) is off without the extension
    _native = None

ENV = "DART_GEMM_PATH"
TREE_ROWS = 8     # a verify's rows in the timing: the chooser's trees are 2-9 nodes
REPS = 9          # interleaved rounds (every path, both sweeps): ~0.5 s for the bundled model on three paths
WARMUP = 1        # rounds first, not counted
# Bumped when a kernel changes speed (2: the avx512bf16 one-row kernel streams row by row; 3: and trees of 2-7 rows;
# 4: and of 8-9 rows, prefetched into L2; 5: the decoder's q/k/v and gate/up one call each; 6: avx512bf16 trees of
# 3-9 rows with weight rows side by side).
CACHE_VERSION = 6


@dataclass(frozen=True)
class GemmPathChoice:
    """The path calls run with, and how it was chosen."""
    path: str
    source: str   # "measured", "cached", "DART_GEMM_PATH", "set by the caller", "the only vector path"
    # per path timed: median ms of the plain step's sweep and of the tree's (TREE_ROWS rows) over the sample
    step_ms: dict[str, float] = field(default_factory=dict)
    tree_ms: dict[str, float] = field(default_factory=dict)
    cache_file: str | None = None

    def describe(self) -> str:
        if not self.step_ms:
            return f"kernel path {self.path} ({self.source})"
        timed = ", ".join(f"{p} {self.step_ms[p]:.2f}+{self.tree_ms[p]:.2f}" for p in self.step_ms)
        return (f"kernel path {self.path} ({self.source}: ms for a 1-row + a {TREE_ROWS}-row sweep of the weights: "
                f"{timed})")


_chosen: GemmPathChoice | None = None   # for the life of the process


def candidates() -> list[str]:
    """The vector paths this CPU runs, best first (portable only where there is none)."""
    paths = [p for p in _native.small_gemm_paths() if p != "portable"]
    return paths or ["portable"]


def cache_file(key: dict) -> Path:
    return keyed_file(cache_dir() / "kernels", key)


def cache_key(target_name: str, dtype: str, threads: int) -> dict:
    from .. import __version__
    return {"machine": machine_id(), "target": target_name, "dtype": dtype, "threads": int(threads),
            "paths": candidates(), "code": f"{__version__}/{CACHE_VERSION}"}


def measure(weights: Sequence[np.ndarray], threads: int, paths: Sequence[str], reps: int = REPS
            ) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per path of a one-row and a ``TREE_ROWS``-row sweep of ``weights``, each path with its own
    GEMV prefetch (measured by :func:`gemv_prefetch.choose` when first needed). Interleaved: each round times
    every path once, the order rotating. Leaves the last path timed set: :func:`choose` sets the chosen one (or,
    when the timing fails, the one it found)."""
    for p in paths:    # each path's prefetch, before any path is timed
        _native.small_gemm_set_path(p)
        gemv_prefetch.choose(weights, threads)
    step: dict[str, list[float]] = {p: [] for p in paths}
    tree: dict[str, list[float]] = {p: [] for p in paths}
    for rnd in range(WARMUP + reps):
        shift = rnd % len(paths)
        for p in list(paths[shift:]) + list(paths[:shift]):
            _native.small_gemm_set_path(p)
            one = _native.gemm_sweep(weights, threads, 1, 1)[0]
            many = _native.gemm_sweep(weights, threads, 1, TREE_ROWS)[0]
            if rnd >= WARMUP:
                step[p].append(one)
                tree[p].append(many)
    return ({p: statistics.median(v) for p, v in step.items()}, {p: statistics.median(v) for p, v in tree.items()})


def decide(step_s: dict[str, float], tree_s: dict[str, float]) -> str:
    """The path with the least plain-step plus tree time (ties: the first, i.e. the better-ranked path)."""
    return min(step_s, key=lambda p: step_s[p] + tree_s[p])


def _read_cache(path: Path, key: dict) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or record.get("path") not in key["paths"]:
        return None   # another machine's or version's file under a colliding name, or a damaged one: time again
    return record


def _write_cache(path: Path, record: dict) -> None:
    try:
        write_json(path, record)
    except OSError as e:   # a read-only home: the choice holds for this process
        logger.warning("could not keep the kernel path choice in %s (%s): it is timed again next time", path, e)


def choose(weights: Sequence[np.ndarray], threads: int, target_name: str, dtype: str) -> GemmPathChoice:
    """The small-GEMM path for this process, chosen once (see the module's doc): kept when a caller or
    ``DART_GEMM_PATH`` fixed it, read from the machine's cache, or timed on ``weights`` (the model's matrices in
    the order a step reads them) with ``threads`` threads. Sets it in the native kernels and returns it."""
    global _chosen
    source = _native.small_gemm_path_source()
    current = _native.small_gemm_path()
    if _chosen is not None and source == "set" and current == _chosen.path:
        return _chosen                                  # this process chose it already
    if source != "default":
        _chosen = GemmPathChoice(current, "set by the caller" if source == "set" else ENV)
        return _chosen
    paths = candidates()
    if len(paths) == 1 or not weights:
        _native.small_gemm_set_path(paths[0])
        _chosen = GemmPathChoice(paths[0], "the only vector path" if len(paths) == 1 else "no weights to time")
        return _chosen
    key = cache_key(target_name, dtype, threads)
    file = cache_file(key)
    record = _read_cache(file, key)
    if record is not None:
        _native.small_gemm_set_path(record["path"])
        _chosen = GemmPathChoice(record["path"], "cached", record["step_ms"], record["tree_ms"], str(file))
    else:
        t0 = time.perf_counter()
        try:
            step_s, tree_s = measure(gemv_prefetch.sample(weights), threads, paths)
        except BaseException:
            _native.small_gemm_set_path(current)
            raise
        path = decide(step_s, tree_s)
        _native.small_gemm_set_path(path)
        _chosen = GemmPathChoice(path, "measured", {p: 1000 * s for p, s in step_s.items()},
                                 {p: 1000 * s for p, s in tree_s.items()}, str(file))
        _write_cache(file, {"key": key, **{k: v for k, v in asdict(_chosen).items() if k != "cache_file"},
                            "seconds_timing": round(time.perf_counter() - t0, 3),
                            "when": time.strftime("%Y-%m-%d %H:%M:%S")})
    logger.info("small-GEMM %s; kept in %s", _chosen.describe(), file)
    return _chosen


def chosen() -> GemmPathChoice | None:
    """What :func:`choose` settled on in this process (None: no model loaded yet)."""
    return _chosen


def forget() -> None:
    """Tests: drop the process's choice and return the path to the default (the next :func:`choose` decides
    again, from the cache or by timing)."""
    global _chosen
    _chosen = None
    _native.small_gemm_set_path("auto")
