"""Does a verify run faster with the weights on 2 MiB pages? Both placements in one process, interleaved.

    python benchmarks/huge_pages.py --threads 2
    python benchmarks/huge_pages.py --threads 2 --reps 120 --nodes 1,3,5 --prefix 300

Loads the target twice, once with its weights left where torch put them (``DART_HUGE_PAGES=0``: 4 KiB pages under
transparent huge pages in ``madvise`` mode) and once moved onto 2 MiB pages (dart_core/models/huge_pages.py, the
default). After a prefix of ``--prefix`` random tokens in each cache, it times ``TargetSession.verify`` of a chain of
each ``--nodes`` size on both copies, alternating which goes first, and prints each median and the median of the
per-pair ratios (2 MiB / 4 KiB; below 1: the huge pages pay). A measurement, not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dart_core  # noqa: E402,F401  (before torch: its idle OpenMP threads spin only briefly, dart_core/openmp.py)
import torch  # noqa: E402

from dart_core.engine.tree import DraftTree  # noqa: E402
from dart_core.hardware import describe_machine  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402


def load_with_pages(huge: bool, dtype: str):
    before = os.environ.get("DART_HUGE_PAGES")
    os.environ["DART_HUGE_PAGES"] = "1" if huge else "0"
    try:
        target = load_target(None, dtype=dtype, device="cpu")
    finally:
        if before is None:
            os.environ.pop("DART_HUGE_PAGES", None)
        else:
            os.environ["DART_HUGE_PAGES"] = before
    if target.fast is None:
        raise SystemExit(f"this needs the native path: {target.fast_unavailable_reason}")
    return target


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--prefix", type=int, default=300)
    p.add_argument("--nodes", default="1,3", help="chain lengths to verify, root included (default 1,3)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    copies = {"4 KiB": load_with_pages(False, args.dtype), "2 MiB": load_with_pages(True, args.dtype)}
    if copies["2 MiB"].fast.weight_pages.reason is not None:
        raise SystemExit(f"nothing to compare: {copies['2 MiB'].fast.weight_pages.describe()}")
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, copies["4 KiB"].vocab_size, size=args.prefix).tolist()
    sessions = {}
    for name, target in copies.items():
        sessions[name] = target.new_session(args.prefix + 64)
        sessions[name].prefill(prompt)
    sizes = [int(x) for x in args.nodes.split(",") if x]
    trees = {n: DraftTree.from_parents(list(range(5, 5 + n)), [-1] + list(range(n - 1))) for n in sizes}
    times: dict[tuple[str, int], list[float]] = {(name, n): [] for name in copies for n in sizes}
    order = list(sessions.items())
    for rep in range(args.reps):
        for n, tree in trees.items():
            for name, session in (order if rep % 2 else order[::-1]):   # each copy goes first half the time
                t0 = time.perf_counter()
                session.verify(tree)
                times[(name, n)].append(time.perf_counter() - t0)
                session.truncate(args.prefix)
    machine = describe_machine("cpu")
    print(f"# verify with the weights on 4 KiB vs 2 MiB pages: {machine['cpu_model']}, {machine['torch_threads']} "
          f"threads, GEMM path {machine.get('gemm_path', '?')}, prefix {args.prefix}, {args.reps} reps interleaved")
    print(f"# 2 MiB copy: {copies['2 MiB'].fast.weight_pages.describe()}")
    print("| nodes | 4 KiB pages ms | 2 MiB pages ms | 2 MiB / 4 KiB (median of pairs) |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        small, huge = times[("4 KiB", n)], times[("2 MiB", n)]
        ratio = statistics.median(b / a for a, b in zip(small, huge))
        print(f"| {n} | {1e3 * statistics.median(small):.2f} | {1e3 * statistics.median(huge):.2f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
