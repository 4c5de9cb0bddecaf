"""What does verifying a whole draft tree cost, relative to one plain decoding step?

    python benchmarks/tree_cost.py                          # bundled SmolLM2-135M, bf16 and fp32
    python benchmarks/tree_cost.py --nodes 8,16,32,61 --prefix 300 --reps 30 --threads 2
    python benchmarks/tree_cost.py --backends hf,native --dtypes bfloat16,float32 --nodes 2,5,16,31

After a prefix of ``--prefix`` tokens (default 300) is in the KV cache, it times
``TargetSession.verify`` on a 1-node tree (the root only: a vanilla step) and on a
random tree of ``--nodes`` nodes (default 61 = DART's 60-node budget plus the root;
depth at most ``--max-depth``), alternating the two so load drifts hit both alike.
Each timed call includes what a real step pays inside verify (tree mask and position
ids, the forward); the cache is rolled back to the prefix between calls. Prints the
median ms of each and their ratio: the speculative step must accept more than
``ratio`` tokens on average to beat vanilla decoding. A measurement, not a test: no
thresholds.

``--lm-head-first-rows all,4`` times each tree once per setting (interleaved): how many rows of the LM head a
verify computes at once (the engine's ``LM_HEAD_FIRST_ROWS``; ``all`` = every node, as before the LM head ran on
request). Rows an acceptance walk reads past them cost another LM head call in the engine's verify stage, which
this script does not run. ``--lm-head`` also times the LM head alone by row count.

``--prefill N`` also times the prefill of an N-token prompt (e.g. 2000: RAG, summaries) and gives its rate in
multiply-adds per second (the decoder layers' weights times N, plus causal attention), beside the rate torch's own
large float32 GEMM reaches in the same run (``--gemm-rows`` x K @ K x N at the target's hidden sizes): the ratio
says how close the prompt runs to this machine's GEMM speed. ``--many-rows off,12`` times the native prefill once
per arm of the small GEMM's many-rows threshold (from how many rows a call widens its bf16 weights once for all of
them; off = never), interleaved, with each arm's per-pair speed against the first.

``--bandwidth`` measures how close the plain step runs to the memory floor, per small-GEMM path (``--paths``,
default every vector path this CPU runs) and with the one-row kernel's software prefetch on and off (the row the
load-time measurement chose is marked; dart_core/models/gemv_prefetch.py), interleaved rep by rep in one process: (a) a plain read of a 512 MiB
buffer by the native streaming loop (``_native.stream_read``, the same threads), (b) one row (M = 1) through every
decoder weight matrix of the target in turn (``_native.gemm_sweep``, timed natively: bytes / time), (c) the whole
one-token step (the decoder weights and the LM head's bytes / the step's time, prefix ``--prefix``). Each as GB/s
(1e9 bytes/s) and as a share of (a).

``--sweep-rows 1,3,5,9`` times the small GEMM alone at each row count, interleaved rep by rep in one process: every
weight matrix of the target (decoder layers and LM head) in turn, read from memory (``_native.gemm_sweep``, one sweep),
and the first decoder matrices that fit in ``--cache-mib`` MiB (default 14: L3 on the CPUs we run) swept five times
(the fastest), so that only the kernel's own rate counts; with a plain read of ``--read-mib`` MiB beside them. Each
as GB/s of weights and against one row (M = 1, always timed): how much a tree of M nodes costs in the GEMM alone.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dart_core  # noqa: E402,F401  (before torch: its idle OpenMP threads spin only briefly, dart_core/openmp.py)
import torch  # noqa: E402

from dart_core.config import dtype_name  # noqa: E402
from dart_core.hardware import describe_machine  # noqa: E402
from dart_core.models.huge_pages import huge_page_buffer  # noqa: E402
from dart_core.models import gemv_prefetch  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from dart_core.engine.tree import DraftTree  # noqa: E402
from dart_core.models import target as target_module  # noqa: E402

ALL_ROWS = 1 << 30   # --lm-head-first-rows all
LM_HEAD_ROWS = (1, 2, 3, 4, 5, 9, 17)


def random_tree(n: int, vocab: int, max_depth: int, rng: np.random.Generator) -> DraftTree:
    """A random tree of ``n`` nodes (root included) no deeper than ``max_depth``."""
    parents, depths = [-1], [0]
    for _ in range(1, n):
        open_nodes = [i for i, d in enumerate(depths) if d < max_depth]
        p = int(rng.choice(open_nodes))
        parents.append(p)
        depths.append(depths[p] + 1)
    tokens = rng.integers(0, vocab, size=n).tolist()
    return DraftTree.from_parents(tokens, parents)


def time_verify(session, tree: DraftTree, prefix_len: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    session.verify(tree)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dt = time.perf_counter() - t0
    session.truncate(prefix_len)        # drop the verified nodes: back to the prefix
    return dt


def large_gemm_rate(k: int, n: int, rows: int = 2048, reps: int = 7) -> float:
    """Multiply-adds per second of torch's float32 ``[rows, k] @ [k, n]`` on this machine (median of ``reps``)."""
    a, b = torch.randn(rows, k), torch.randn(k, n)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return rows * k * n / statistics.median(times)


def prefill_macs(target, n: int) -> float:
    """Multiply-adds of a prefill of ``n`` tokens: every decoder-layer weight once per token (the LM head runs for
    the last position only) plus causal attention (q.k and p.v over n(n+1)/2 pairs per head and layer)."""
    cfg = target.model.config
    layers = target.model.model.layers
    linear = sum(m.weight.numel() for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 2 * len(layers) * cfg.num_attention_heads * head_dim * n * (n + 1) / 2
    return n * linear + attention + cfg.hidden_size * target.vocab_size


def measure_prefill(model: str | None, dtype: str, device: str, n: int, reps: int, seed: int,
                    backends: list[str], gemm_rows: int, many_rows: list[str] | None = None) -> list[dict]:
    """The prefill of one random ``n``-token prompt per backend, median of ``reps`` (interleaved), and torch's
    large float32 GEMM at the target's hidden sizes in the same run (``gemm_rows`` rows). ``many_rows`` (the native
    backend): the small-GEMM row counts from which the kernel widens a call's weights once for all rows, each an
    arm of the same interleaved loop ("off": never), with each arm's per-pair ratio to the first."""
    from dart_core import _native
    target = load_target(model, dtype=dtype, device=device)
    cfg = target.model.config
    gemm = {"shape": f"{gemm_rows}x{cfg.hidden_size} @ {cfg.hidden_size}x{cfg.intermediate_size}",
            "macs_per_s": large_gemm_rate(cfg.hidden_size, cfg.intermediate_size, gemm_rows)}
    prompt = np.random.default_rng(seed).integers(0, target.vocab_size, size=n).tolist()
    arms = [(b, None) for b in backends if b != "native" or not many_rows]
    if "native" in backends and many_rows:
        arms += [("native", m) for m in many_rows]
    before = _native._small_gemm_many_rows()
    times: dict[tuple, list[float]] = {a: [] for a in arms}
    try:
        for rep in range(reps + 1):          # the first round warms up
            for arm in (arms if rep % 2 else arms[::-1]):
                b, m = arm
                target.set_fast_forward(b == "native")
                _native._small_gemm_set_many_rows(before if m is None else 1 << 40 if m == "off" else int(m))
                session = target.new_session(n + 1)
                t0 = time.perf_counter()
                session.prefill(prompt)
                if rep:
                    times[arm].append(time.perf_counter() - t0)
                del session
    finally:
        _native._small_gemm_set_many_rows(before)
    macs = prefill_macs(target, n)
    first = times[arms[0]]
    return [{"dtype": dtype_name(target.dtype), "backend": b if m is None else f"{b} (many rows: {m})", "tokens": n,
             "median_s": statistics.median(times[(b, m)]), "macs": macs,
             "macs_per_s": macs / statistics.median(times[(b, m)]), "gemm": gemm,
             "pair_ratio_to_first": statistics.median(a / t for a, t in zip(first, times[(b, m)]))}
            for b, m in arms]


def measure(model: str | None, dtype: str, device: str, prefix: int, sizes: list[int], max_depth: int,
            reps: int, warmup: int, seed: int, backends: list[str], head_rows: list[int],
            gemm_paths: list[str | None] | None = None, splits: list[int | None] | None = None) -> list[dict]:
    """One result per backend, LM-head setting, small-GEMM path (``gemm_paths``: None = the current one) and
    thread split (``splits``: rows cut in chunks (0) or that many ranges a thread; None = the one chosen at load),
    all timed in one interleaved loop on one loaded target."""
    gemm_paths = gemm_paths or [None]
    splits = splits or [None]
    native = "native" in backends
    if native:
        from dart_core import _native
    target = load_target(model, dtype=dtype, device=device)
    rng = np.random.default_rng(seed)
    vocab = target.vocab_size
    trees = {n: random_tree(n, vocab, max_depth, rng) for n in sizes}
    trees[1] = DraftTree.root_only(int(rng.integers(0, vocab)))
    prompt = rng.integers(0, vocab, size=prefix).tolist()
    sessions = {}
    for b in backends:
        target.set_fast_forward(b == "native")
        if b == "native" and target.fast is None:
            raise SystemExit(f"--backends native: {target.fast_unavailable_reason}")
        sessions[b] = target.new_session(prefix + max(sizes) + 1)
        sessions[b].prefill(prompt)
    dev = target.device
    arms = [(b, r, g, c) for b in backends for r in (head_rows if b == "native" else head_rows[:1])
            for g in (gemm_paths if b == "native" else [None]) for c in (splits if b == "native" else [None])]
    times: dict[tuple, list[float]] = {(*arm, n): [] for arm in arms for n in trees}
    default_rows = target_module.LM_HEAD_FIRST_ROWS
    path_before = _native.small_gemm_path() if native else None
    split_before = _native.small_gemm_split() if native else None
    try:
        for rep in range(warmup + reps):  # interleaved: load drifts hit every arm alike
            for b, r, g, c in arms:
                target.set_fast_forward(b == "native")
                target_module.LM_HEAD_FIRST_ROWS = r
                if b == "native":
                    _native.small_gemm_set_path(g or path_before)
                    _native.small_gemm_set_split(split_before if c is None else c)
                for n, tree in trees.items():
                    dt = time_verify(sessions[b], tree, prefix, dev)
                    if rep >= warmup:
                        times[(b, r, g, c, n)].append(dt)
    finally:
        target_module.LM_HEAD_FIRST_ROWS = default_rows
        if native:
            _native.small_gemm_set_path(path_before)
            _native.small_gemm_set_split(split_before)
    out = []
    for b, r, g, c in arms:
        one_ms = 1000 * statistics.median(times[(b, r, g, c, 1)])
        res = {"dtype": dtype_name(target.dtype), "backend": b, "device": str(dev), "model": target.name,
               "gemm_path": (g or path_before) if b == "native" else None,
               "gemm_split": (split_before if c is None else c) if b == "native" else None,
               "prefix": prefix, "lm_head_first_rows": "all" if r >= ALL_ROWS or b == "hf" else r,
               "one_token_ms": one_ms, "trees": {}}
        for n in sizes:
            ms = 1000 * statistics.median(times[(b, r, g, c, n)])
            res["trees"][n] = {"nodes": n, "max_depth": int(trees[n].max_depth), "median_ms": ms,
                               "ratio": ms / one_ms}
        out.append(res)
    del sessions, target
    return out


def load_native_target(model: str | None, dtype: str, device: str, flag: str):
    """The target on its native forward path, for the modes that time the native kernels alone (``flag`` names the
    mode in the refusal where this machine has no such path)."""
    target = load_target(model, dtype=dtype, device=device)
    target.set_fast_forward(True)
    if target.fast is None:
        raise SystemExit(f"{flag} needs the native path: {target.fast_unavailable_reason}")
    return target


def measure_lm_head(model: str | None, dtype: str, device: str, rows: list[int], reps: int) -> dict[int, float]:
    """Median ms of the native LM head alone (final-normed hidden rows -> logits) by row count, interleaved."""
    target = load_native_target(model, dtype, device, "--lm-head")
    hidden = {r: torch.randn(r, target.hidden_size) for r in rows}
    times: dict[int, list[float]] = {r: [] for r in rows}
    for rep in range(reps + 2):
        for r in rows:
            t0 = time.perf_counter()
            target.fast.lm_head(hidden[r])
            if rep >= 2:
                times[r].append(time.perf_counter() - t0)
    return {r: 1000 * statistics.median(times[r]) for r in rows}


def measure_bandwidth(model: str | None, dtype: str, device: str, prefix: int, reps: int, warmup: int, seed: int,
                      paths: list[str], threads: int, read_mib: int = 512, before: bool = False) -> list[dict]:
    """Per small-GEMM path: the plain read bandwidth, the one-row GEMV sweep over the decoder weights and the
    one-token step, interleaved rep by rep (see the module docstring). Medians of ``reps``."""
    from dart_core import _native
    target = load_native_target(model, dtype, device, "--bandwidth")
    ws = target.fast.decoder_matrices   # q, k, v, o, gate, up, down of every layer, in the decoder's order
    gemv_bytes = sum(w.nbytes for w in ws)
    step_bytes = gemv_bytes + target.fast.lm_head_array.nbytes
    # The floor is read from the same kind of pages as the weights (2 MiB where the OS grants them: huge_pages.py).
    buf, buf_pages = huge_page_buffer(read_mib << 20)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, target.vocab_size, size=prefix).tolist()
    root = DraftTree.root_only(int(rng.integers(0, target.vocab_size)))
    session = target.new_session(prefix + 2)
    session.prefill(prompt)
    path_before = _native.small_gemm_path()
    chosen = {}   # per path: the GEMV prefetch the load-time measurement picks
    for p in paths:
        _native.small_gemm_set_path(p)
        chosen[p] = gemv_prefetch.choose(ws, threads).on
    read: list[float] = []
    # (path, before the thread pool, GEMV prefetch); the paths that existed before the pool (the bf16 dot-product
    # paths came after it) prefetched.
    arms = [(p, False, on) for p in paths for on in (True, False)]
    arms += [(p, True, True) for p in paths if p not in ("amx", "avx512bf16")] if before else []
    gemv: dict[tuple, list[float]] = {a: [] for a in arms}
    step: dict[tuple, list[float]] = {a: [] for a in arms}
    try:
        for rep in range(warmup + reps):
            for a in arms:      # interleaved: load drifts hit every arm alike
                p, legacy, prefetch = a
                _native.small_gemm_set_path(p)
                _native._small_gemm_set_legacy(legacy)
                _native.small_gemm_set_gemv_prefetch(p, prefetch)
                t0 = time.perf_counter()
                _native.stream_read(buf, threads)
                dt_read = time.perf_counter() - t0
                dt_gemv = _native.gemm_sweep(ws, threads, 1)[0]
                dt_step = time_verify(session, root, prefix, target.device)
                if rep >= warmup:
                    read.append(dt_read)
                    gemv[a].append(dt_gemv)
                    step[a].append(dt_step)
    finally:
        for p in paths:
            _native.small_gemm_set_gemv_prefetch(p, chosen[p])
        _native.small_gemm_set_path(path_before)
        _native._small_gemm_set_legacy(False)
    read_gbs = buf.nbytes / statistics.median(read) / 1e9
    out = []
    for a in arms:
        p, legacy, prefetch = a
        g = gemv_bytes / statistics.median(gemv[a]) / 1e9
        st = statistics.median(step[a])
        out.append({"dtype": dtype_name(target.dtype), "gemm_path": p, "before": legacy, "gemv_prefetch": prefetch,
                    "gemv_prefetch_chosen": not legacy and prefetch == chosen[p], "threads": threads,
                    "prefix": prefix,
                    "read_gbs": read_gbs, "read_bytes": buf.nbytes,
                    "gemv_bytes": gemv_bytes, "gemv_ms": 1000 * statistics.median(gemv[a]), "gemv_gbs": g,
                    "gemv_share_of_read": g / read_gbs,
                    "step_bytes": step_bytes, "one_token_ms": 1000 * st, "step_gbs": step_bytes / st / 1e9,
                    "step_share_of_read": step_bytes / st / 1e9 / read_gbs, "reps": reps,
                    "weight_pages": target.fast.weight_pages.describe(), "read_pages": buf_pages.describe()})
    del session, target, buf
    return out


SWEEP_WARM_SWEEPS = 5   # in-cache sweeps per rep (the fastest counts): the kernel's rate without the memory's


def measure_sweeps(model: str | None, dtype: str, device: str, rows: list[int], reps: int, warmup: int,
                   read_mib: int, cache_mib: int) -> dict:
    """The small GEMM alone by row count (see the module docstring, ``--sweep-rows``): medians of ``reps``."""
    from dart_core import _native
    target = load_native_target(model, dtype, device, "--sweep-rows")
    threads = torch.get_num_threads()
    cold = list(target.fast.decoder_matrices) + [target.fast.lm_head_array]
    warm, warm_bytes = [], 0
    for w in target.fast.decoder_matrices:
        if warm and warm_bytes + w.nbytes > cache_mib << 20:
            break
        warm.append(w)
        warm_bytes += w.nbytes
    cold_bytes = sum(w.nbytes for w in cold)
    buf, _ = huge_page_buffer(read_mib << 20)
    read: list[float] = []
    t_cold: dict[int, list[float]] = {r: [] for r in rows}
    t_warm: dict[int, list[float]] = {r: [] for r in rows}
    for rep in range(warmup + reps):
        t0 = time.perf_counter()
        _native.stream_read(buf, threads)
        dt = time.perf_counter() - t0
        for r in rows:   # interleaved: load drifts and the VM's memory speed hit every row count alike
            c = _native.gemm_sweep(cold, threads, 1, r)[0]
            w = min(_native.gemm_sweep(warm, threads, SWEEP_WARM_SWEEPS, r))
            if rep >= warmup:
                t_cold[r].append(c)
                t_warm[r].append(w)
        if rep >= warmup:
            read.append(dt)
    out = {"dtype": dtype_name(target.dtype), "gemm_path": _native.small_gemm_path(),
           "gemm_split": _native.small_gemm_split(), "threads": threads,
           "read_gbs": buf.nbytes / statistics.median(read) / 1e9, "cold_mb": cold_bytes / 1e6,
           "warm_mb": warm_bytes / 1e6, "rows": {}}
    one_cold, one_warm = statistics.median(t_cold[1]), statistics.median(t_warm[1])
    for r in rows:
        c, w = statistics.median(t_cold[r]), statistics.median(t_warm[r])
        out["rows"][r] = {"cold_ms": 1000 * c, "cold_gbs": cold_bytes / c / 1e9, "warm_gbs": warm_bytes / w / 1e9,
                          "cold_vs_one": c / one_cold, "warm_vs_one": w / one_warm}
    del target
    return out


def sweeps_main(args, machine: dict, rows: list[int]) -> int:
    print(f"# the small GEMM alone by row count: {machine['cpu_model']}, {torch.get_num_threads()} threads, load "
          f"average {machine['load_average']}, {args.reps} reps interleaved (medians)")
    print("| dtype | GEMM path | split | read GB/s | rows | from memory ms | GB/s | time vs 1 row | in cache GB/s "
          "| time vs 1 row |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        r = measure_sweeps(args.base_model_name_or_path, dtype, args.device, rows, args.reps, args.warmup,
                           args.read_mib, args.cache_mib)
        results.append(r)
        split = "chunks" if r["gemm_split"] == 0 else r["gemm_split"]
        for m, t in r["rows"].items():
            print(f"| {r['dtype']} | {r['gemm_path']} | {split} | {r['read_gbs']:.1f} | {m} | {t['cold_ms']:.2f} | "
                  f"{t['cold_gbs']:.1f} | {t['cold_vs_one']:.2f}x | {t['warm_gbs']:.1f} | {t['warm_vs_one']:.2f}x |",
                  flush=True)
        print(f"# {r['dtype']}: from memory {r['cold_mb']:.0f} MB a sweep (every matrix), in cache "
              f"{r['warm_mb']:.1f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "sweeps": results}, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-model-name-or-path", default=None,
                   help="target (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated dtypes to measure")
    p.add_argument("--device", default="cpu")
    p.add_argument("--nodes", default="61", help="comma-separated tree sizes, root included (default 61)")
    p.add_argument("--max-depth", type=int, default=8, help="deepest draft level of the random trees")
    p.add_argument("--prefix", type=int, default=300, help="tokens already in the KV cache")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backends", default="native",
                   help="comma-separated target forward paths to compare: hf, native (default: native, "
                        "the path sessions use on a CPU)")
    p.add_argument("--lm-head-first-rows", default=None,
                   help="comma-separated LM head rows a verify computes at once, 'all' = every node (default: the "
                        f"engine's {target_module.LM_HEAD_FIRST_ROWS})")
    p.add_argument("--lm-head", action="store_true", help="also time the LM head alone at 1..17 rows")
    p.add_argument("--prefill", type=int, default=0,
                   help="also time the prefill of a prompt of this many tokens (e.g. 2000; 0 = skip)")
    p.add_argument("--prefill-reps", type=int, default=3)
    p.add_argument("--many-rows", default=None,
                   help="--prefill: comma-separated arms of the small GEMM's many-rows threshold (a row count, or "
                        "off), interleaved, e.g. off,12: the speed of widening a call's bf16 weights once")
    p.add_argument("--gemm-rows", type=int, default=2048, help="rows of torch's large reference GEMM")
    p.add_argument("--bandwidth", action="store_true",
                   help="only measure the plain step against the memory read bandwidth, per small-GEMM path")
    p.add_argument("--paths", default=None,
                   help="comma-separated small-GEMM paths to time side by side, interleaved (the tree table: default "
                        "the current path; --bandwidth: default every path this CPU runs but portable)")
    p.add_argument("--splits", default=None,
                   help="comma-separated thread splits of the small GEMM to time side by side, interleaved: chunks "
                        "(~48 KiB a chunk) or a number of ranges a thread, e.g. chunks,2,1 (default: the one chosen "
                        "at load, dart_core/models/gemm_split.py)")
    p.add_argument("--before", action="store_true",
                   help="--bandwidth: also time each path as before the thread pool (an OpenMP region per GEMM call; "
                        "one row with 256-bit blocks; the attention keeps the pool), interleaved in the same run")
    p.add_argument("--read-mib", type=int, default=512,
                   help="--bandwidth, --sweep-rows: MiB of the plain read (default 512)")
    p.add_argument("--sweep-rows", default=None,
                   help="only time the small GEMM alone at these comma-separated row counts (1 is always timed), "
                        "from memory and in cache, e.g. 1,3,5,9")
    p.add_argument("--cache-mib", type=int, default=14,
                   help="--sweep-rows: MiB of the first decoder matrices swept in cache (default 14)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    many_rows = [m.strip() for m in args.many_rows.split(",") if m.strip()] if args.many_rows else None
    for arm in many_rows or ():
        if arm != "off" and not (arm.isdigit() and int(arm) >= 1):
            p.error(f"--many-rows {arm!r}: each arm is a row count >= 1 or off (e.g. --many-rows off,12)")
    try:
        sizes = sorted({int(x) for x in args.nodes.split(",") if x.strip()})
    except ValueError:
        p.error(f"--nodes must be comma-separated integers, got {args.nodes!r}")
    if not sizes or min(sizes) < 2:
        p.error("--nodes sizes must be >= 2 (the 1-node step is always measured)")
    if args.prefix < 1 or args.reps < 1 or args.max_depth < 1:
        p.error("--prefix, --reps and --max-depth must be >= 1")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or any(b not in ("hf", "native") for b in backends):
        p.error(f"--backends takes hf and/or native, got {args.backends!r}")
    head_rows = [target_module.LM_HEAD_FIRST_ROWS]
    if args.lm_head_first_rows:
        try:
            head_rows = [ALL_ROWS if x.strip() == "all" else int(x) for x in args.lm_head_first_rows.split(",")
                         if x.strip()]
        except ValueError:
            p.error(f"--lm-head-first-rows takes integers and 'all', got {args.lm_head_first_rows!r}")
        if not head_rows or min(head_rows) < 1:
            p.error("--lm-head-first-rows values must be >= 1 (the root's row is always computed)")
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    sweep_rows = None
    if args.sweep_rows:
        try:
            sweep_rows = sorted({1, *(int(x) for x in args.sweep_rows.split(",") if x.strip())})
        except ValueError:
            p.error(f"--sweep-rows must be comma-separated row counts, got {args.sweep_rows!r}")
        if sweep_rows[0] < 1:
            p.error(f"--sweep-rows: every row count must be >= 1, got {args.sweep_rows!r}")
        if args.cache_mib < 1:
            p.error("--cache-mib must be >= 1")
    machine = describe_machine(args.device)
    if args.bandwidth:
        return bandwidth_main(args, machine)
    if sweep_rows:
        return sweeps_main(args, machine, sweep_rows)
    print(f"# tree verification cost: {machine['cpu_model']}"
          + (f", {machine['gpu']}" if machine.get("gpu") else "")
          + f", {machine['torch_threads']} threads, load average {machine['load_average']}, prefix {args.prefix}"
          + f", small-GEMM path {machine.get('gemm_path')}")
    gemm_paths = None
    if args.paths:
        from dart_core import _native
        gemm_paths = [x.strip() for x in args.paths.split(",") if x.strip()]
        missing = [x for x in gemm_paths if x not in _native.small_gemm_paths()]
        if missing:
            raise SystemExit(f"--paths: this CPU does not run {missing} (it runs {_native.small_gemm_paths()})")
    splits = None
    if args.splits:
        splits = []
        for x in (x.strip() for x in args.splits.split(",") if x.strip()):
            if x != "chunks" and not (x.isdigit() and 1 <= int(x) <= 64):
                p.error(f"--splits {x!r}: each arm is chunks or a number of ranges a thread from 1 to 64")
            splits.append(0 if x == "chunks" else int(x))
    print("| dtype | backend | GEMM path | split | LM head rows first | nodes | max depth | 1-token step ms | tree ms "
          "| ratio to 1 token | speedup over hf |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        rs = measure(args.base_model_name_or_path, dtype, args.device, args.prefix, sizes, args.max_depth,
                     args.reps, args.warmup, args.seed, backends, head_rows, gemm_paths, splits)
        results.extend(rs)
        hf = next((r for r in rs if r["backend"] == "hf"), None)
        for r in rs:
            rows = [(1, {"nodes": 1, "max_depth": 0, "median_ms": r["one_token_ms"], "ratio": 1.0})]
            rows += list(r["trees"].items())
            for n, t in rows:
                vs = "–"
                if hf is not None and r is not hf:
                    base = hf["one_token_ms"] if n == 1 else hf["trees"][n]["median_ms"]
                    vs = f"{base / t['median_ms']:.2f}x"
                split = "–" if r["gemm_split"] is None else "chunks" if r["gemm_split"] == 0 else r["gemm_split"]
                print(f"| {r['dtype']} | {r['backend']} | {r['gemm_path'] or '–'} | {split} | {r['lm_head_first_rows']} "
                      f"| {t['nodes']} | {t['max_depth']} "
                      f"| {r['one_token_ms']:.1f} | {t['median_ms']:.1f} | {t['ratio']:.2f}x | {vs} |", flush=True)
    heads = {}
    if args.lm_head:
        print("\n# the LM head alone (native path): ms by rows")
        print("| dtype | " + " | ".join(f"{r} rows" for r in LM_HEAD_ROWS) + " |")
        print("|---|" + "---:|" * len(LM_HEAD_ROWS))
        for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
            ms = measure_lm_head(args.base_model_name_or_path, dtype, args.device, list(LM_HEAD_ROWS), args.reps)
            heads[dtype] = ms
            print(f"| {dtype} | " + " | ".join(f"{ms[r]:.2f}" for r in LM_HEAD_ROWS) + " |", flush=True)
    prefills = []
    if args.prefill > 0:
        from dart_core import _native
        path = _native.small_gemm_path() if hasattr(_native, "small_gemm_path") else "?"
        print(f"\n# prefill of {args.prefill} tokens beside torch's float32 GEMM (same run); native GEMM path {path}")
        print("| dtype | backend | prefill s | tokens/s | G multiply-adds/s | torch GEMM | its G multiply-adds/s "
              "| share of the large GEMM's rate | speed vs the first arm (per pair) |")
        print("|---|---|---:|---:|---:|---|---:|---:|---:|")
        for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
            for r in measure_prefill(args.base_model_name_or_path, dtype, args.device, args.prefill,
                                     args.prefill_reps, args.seed, backends, args.gemm_rows, many_rows):
                prefills.append(r)
                gemm = r["gemm"]["macs_per_s"]
                print(f"| {r['dtype']} | {r['backend']} | {r['median_s']:.2f} | {r['tokens'] / r['median_s']:.0f} | "
                      f"{r['macs_per_s'] / 1e9:.1f} | {r['gemm']['shape']} | {gemm / 1e9:.1f} | "
                      f"{r['macs_per_s'] / gemm:.0%} | {r['pair_ratio_to_first']:.2f}x |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "results": results, "lm_head_ms": heads,
                                               "prefill": prefills}, indent=1) + "\n")
    return 0


def bandwidth_main(args, machine: dict) -> int:
    from dart_core import _native
    paths = ([x.strip() for x in args.paths.split(",") if x.strip()] if args.paths
             else [x for x in _native.small_gemm_paths() if x != "portable"] or ["portable"])
    missing = [x for x in paths if x not in _native.small_gemm_paths()]
    if missing:
        raise SystemExit(f"--paths: this CPU does not run {missing} (it runs {_native.small_gemm_paths()})")
    threads = torch.get_num_threads()
    print(f"# the plain step against the memory floor: {machine['cpu_model']}, {threads} threads, load average "
          f"{machine['load_average']}, prefix {args.prefix}, {args.reps} reps interleaved (medians)")
    print("| dtype | GEMM path | GEMV prefetch | read GB/s | 1-row GEMV MB | GEMV GB/s | GEMV / read | 1-token ms "
          "| step MB | step GB/s | step / read |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for dtype in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
        for r in measure_bandwidth(args.base_model_name_or_path, dtype, args.device, args.prefix, args.reps,
                                   args.warmup, args.seed, paths, threads, args.read_mib, args.before):
            results.append(r)
            name = r["gemm_path"] + (" (before)" if r["before"] else "")
            prefetch = ("on" if r["gemv_prefetch"] else "off") + (" (chosen)" if r["gemv_prefetch_chosen"] else "")
            print(f"| {r['dtype']} | {name} | {prefetch} | {r['read_gbs']:.1f} | {r['gemv_bytes'] / 1e6:.0f} "
                  f"| {r['gemv_gbs']:.1f} | {r['gemv_share_of_read']:.0%} | {r['one_token_ms']:.2f} "
                  f"| {r['step_bytes'] / 1e6:.0f} | {r['step_gbs']:.1f} | {r['step_share_of_read']:.0%} |", flush=True)
    if results:
        print(f"# weights: {results[0]['weight_pages']}; read buffer: {results[0]['read_pages']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "bandwidth": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
