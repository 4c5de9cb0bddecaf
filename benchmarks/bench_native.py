"""Benchmark of the native core: N-gram query latency, pruning latency per tree, table build
throughput, bytes per node and open time. Prints a Markdown table; figures are measured in
this run on this machine (nothing is asserted).

    python benchmarks/bench_native.py [--table assets/ngram/smollm2-135m-instruct.dngram]
                                      [--data DIR] [--tokenizer bundled]

Query latency is one context (the last order-1 tokens) against 25 candidates, as in the
DART paper ("6 us per query"); it is reported for the native loop alone and for a call
from Python (argument conversion included). Pruning is one tree from 9 rows x 25 at the
defaults (paper: about 2 ms); "end to end" includes building the DraftTree and the
ScoredCandidates lists of all 4,025 candidates. Chains: the vLLM plugin's chain picking for a batch of 1, 4 and
16 requests, one native call against a call a request.

    python benchmarks/bench_native.py --gemm [--threads 2] [--reps 21] [--cold] [--paths avx512,avx2] [--rows 1,3,9]

times only the small-GEMM kernel: G multiply-adds/s of every vector kernel path this CPU runs
(avx512 / avx2; --paths portable for the plain loop) at the SmolLM2-135M target's shapes with bf16
weights (--cold: read from memory on every call, as when decoding a model larger than the caches), for the row
counts of a plain step (1), draft trees (4..33) and a prompt chunk (64) (--rows: others), beside torch's float32
GEMM on a large product (2048 x 576 @ 576 x 1536) timed in the same loop. The arms alternate
rep by rep (order reversed every other rep), so load drifts on a shared machine hit all alike;
the ratios are medians of per-rep ratios.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dart_core.ngram import build as ngram_build, store as ngram  # noqa: E402
from dart_core.ngram.store import NgramStore  # noqa: E402
from dart_core.loading import bundled_table_path  # noqa: E402
from dart_core.models.loader import load_tokenizer  # noqa: E402
from dart_core.drafters.chain import best_chain, best_chains, chain_pruning, context_from_tail  # noqa: E402
from dart_core.drafters.pruning import (PruningConfig, TreeBuilder, prune_dart_tree,  # noqa: E402
                                        prune_dart_tree_reference)


def load_responses(data: Path | None, limit: int) -> list[list[int]]:
    path = None if data is None else data / "distill" / "smollm2-135m-instruct.jsonl.gz"
    if path is None or not path.is_file():
        return []
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            out.append(json.loads(line)["response_ids"])
            if len(out) >= limit:
                break
    return out


def best_of(fn, repeats: int = 5):
    """Minimum over repeats of fn() (seconds per operation, or a {'wall', 'cpu'} dict from the
    native benchmarks): the least-disturbed measurement."""
    results = [fn() for _ in range(repeats)]
    if isinstance(results[0], dict):
        return {k: min(r[k] for r in results) for k in ("wall", "cpu")}
    return min(results)


def per_call(fn, n: int = 200):
    """A timing of ``n`` calls of fn() for best_of: seconds a call, wall and this thread's CPU."""
    def run():
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            fn()
        return {"wall": (time.perf_counter() - w0) / n, "cpu": (time.thread_time() - c0) / n}
    return run


def make_queries(store: NgramStore, docs: list[list[int]], n: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contexts from real text; 'likely' candidates = the 25 most frequent continuations of the
    context's last token (hits at several back-off levels), 'random' = uniform ids (mostly misses)."""
    ctx_len = max(store.order - 1, 1)
    contexts, likely = [], []
    while len(contexts) < n:
        if docs:
            d = docs[int(rng.integers(len(docs)))]
            if len(d) <= ctx_len:
                continue
            i = int(rng.integers(ctx_len, len(d)))
            ctx = d[i - ctx_len:i]
        else:
            ctx = rng.integers(0, store.vocab_size, size=ctx_len).tolist()
        _, _, toks, counts = store.continuations(ctx[-1:])
        top = toks[np.argsort(-counts, kind="stable")[:25]].tolist()
        top += rng.integers(0, store.vocab_size, size=25 - len(top)).tolist()
        contexts.append(ctx)
        likely.append(top)
    rand = rng.integers(0, store.vocab_size, size=(n, 25))
    return np.array(contexts, dtype=np.int64), np.array(likely, dtype=np.int64), rand.astype(np.int64)


def bench_queries(store: NgramStore, contexts, likely, rand) -> list[tuple[str, str]]:
    rows = []
    for name, cands in (("likely candidates", likely), ("random candidates", rand)):
        t = best_of(lambda: store.native.bench_query(contexts, cands, 3))
        def py_loop():
            w0, c0 = time.perf_counter(), time.thread_time()
            for c, k in zip(contexts, cands):
                store.query(c, k)
            return {"wall": (time.perf_counter() - w0) / len(contexts), "cpu": (time.thread_time() - c0) / len(contexts)}
        t_py = best_of(py_loop)
        rows.append((f"N-gram query, {name}: native, per query (per candidate)",
                     f"{t['cpu'] * 1e6:.2f} us ({t['cpu'] * 1e9 / 25:.0f} ns) CPU; {t['wall'] * 1e6:.2f} us wall "
                     f"(paper: 6 us)"))
        rows.append((f"N-gram query, {name}: one call from Python", f"{t_py['cpu'] * 1e6:.2f} us CPU; "
                                                                    f"{t_py['wall'] * 1e6:.2f} us wall"))
    return rows


def bench_pruning(store: NgramStore, contexts, likely, rng) -> list[tuple[str, str]]:
    cfg = PruningConfig()
    native = ngram.require_native()
    trees = []
    for i in range(20):  # 9 levels x 25 plausible tokens with drafter-like logits
        logits = np.sort(rng.normal(size=(9, 25)).astype(np.float32) * 3, axis=1)[:, ::-1].copy()
        tokens = likely[rng.integers(len(likely), size=9)]
        trees.append((logits, tokens, contexts[i].tolist()))
    def native_only():
        runs = [native.bench_prune(lg, tk, np.array(ctx[-(store.order - 1):]), store.native, np.array([2]),
                                   cfg, 20) for lg, tk, ctx in trees]
        return {k: statistics.mean(r[k] for r in runs) for k in ("wall", "cpu")}
    def end_to_end():
        w0, c0 = time.perf_counter(), time.thread_time()
        for lg, tk, ctx in trees:
            prune_dart_tree(lg, tk, ctx, store, [2], cfg)
        return {"wall": (time.perf_counter() - w0) / len(trees), "cpu": (time.thread_time() - c0) / len(trees)}
    t_native, t_e2e = best_of(native_only), best_of(end_to_end)
    lg, tk, ctx = trees[0]
    t0 = time.thread_time()
    prune_dart_tree_reference(lg, tk, ctx, store, [2], cfg)
    t_ref = time.thread_time() - t0
    fmt = lambda t: f"{t['cpu'] * 1e3:.3f} ms CPU; {t['wall'] * 1e3:.3f} ms wall"  # noqa: E731
    return [("Pruning per tree (9 x 25, beam 20, budget 60): native", fmt(t_native) + " (paper: 2 ms)"),
            ("Pruning per tree: end to end from Python (tree + 4,025-candidate trace)", fmt(t_e2e)),
            ("Pruning per tree: pure-Python reference", f"{t_ref * 1e3:.1f} ms CPU")]


def bench_chains(store: NgramStore, contexts, likely, rng) -> list[tuple[str, str]]:
    """The vLLM plugin's chain picking for a batch (3 levels x 25, the plugin's chain search): one native call for
    the batch against best_chain a request from Python (what the plugin did before the batch call)."""
    builder = TreeBuilder(store, [2])
    cfg = chain_pruning(PruningConfig(), 3, 25)
    rows = []
    for B in (1, 4, 16):
        logits = np.sort(rng.normal(size=(B, 3, 25)).astype(np.float32) * 3, axis=2)[:, :, ::-1].copy()
        tokens = likely[rng.integers(len(likely), size=(B, 3))]
        tails = contexts[rng.integers(len(contexts), size=B)]
        one = lambda: best_chains(builder, logits, tokens, tails, cfg)  # noqa: E731
        each = lambda: [best_chain(builder, logits[b], tokens[b], context_from_tail(tails[b]), cfg)  # noqa: E731
                        for b in range(B)]
        t_one, t_each = best_of(per_call(one)), best_of(per_call(each))
        rows.append((f"Chains of a batch of {B} (3 x 25, the vLLM plugin's): one native call / a call a request",
                     f"{t_one['wall'] * 1e6:.0f} / {t_each['wall'] * 1e6:.0f} us wall"))
    return rows


def bench_build(data: Path | None, tokenizer_name: str | None) -> list[tuple[str, str]]:
    rows = []
    distill = None if data is None else data / "distill" / "smollm2-135m-instruct.jsonl.gz"
    with tempfile.TemporaryDirectory() as tmp:
        if distill is not None and distill.is_file():
            s = ngram_build.build_ngram_table([distill], Path(tmp) / "d.dngram", None, vocab_size=49152, fingerprint="bench",
                                        order=4, progress=False)
            rows.append(("Build from token ids (distill, order 4): tokens/s",
                         f"{s['tokens_per_second']:,} ({s['total_tokens']:,} tokens, {s['node_count']:,} nodes, "
                         f"{s['seconds']:.1f} s)"))
        corpus = data / "corpus" / "TheAlgorithms-Python.jsonl.gz"
        if tokenizer_name and corpus.is_file():
            tok = load_tokenizer(tokenizer_name)
            s = ngram_build.build_ngram_table([corpus], Path(tmp) / "c.dngram", tok, order=4, progress=False)
            rows.append(("Build from text incl. tokenization (order 4): tokens/s",
                         f"{s['tokens_per_second']:,} ({s['total_tokens']:,} tokens, {s['seconds']:.1f} s)"))
    return rows


def bench_open(path: Path, store: NgramStore) -> list[tuple[str, str]]:
    def opens(verify):
        def run():
            t0 = time.perf_counter()
            for _ in range(20):
                NgramStore.open(path, verify=verify)
            return (time.perf_counter() - t0) / 20
        return best_of(run)
    info = store.info()
    n = info["node_count"]
    original = 16 + 24 * n + 12 * (n - 1)  # the same trie in the original .trie layout
    return [("Table", f"{path.name}: order {info['order']}, {n:,} nodes, {info['file_size'] / 1e6:.1f} MB"),
            ("Bytes per node on disk (original .trie layout: same trie)",
             f"{info['bytes_per_node']:.2f}  ({original / n:.1f}; the original's RAM is 3-4x that)"),
            ("Open (mmap + header check)", f"{opens(False) * 1e6:.0f} us"),
            ("Open with full checksum + structure check", f"{opens(True) * 1e3:.1f} ms")]


GEMM_SHAPES = (("q_proj-ish: 576 -> 1536", 576, 1536), ("down_proj: 1536 -> 576", 1536, 576),
               ("LM head: 576 -> 49152", 576, 49152))
GEMM_ROWS = (1, 4, 5, 9, 17, 33, 64)


def bench_gemm(threads: int, reps: int, paths: list[str] | None = None, cold: bool = False, rows=GEMM_ROWS,
               shapes=GEMM_SHAPES) -> None:
    """Prints a Markdown table: the native kernel per path and torch's large float32 GEMM, interleaved.
    paths: kernel paths to time, best first (default: every vector path this CPU runs; the portable loop
    only where there is none, as it calls libm's fmaf on x86 and runs ~100x slower there).
    cold: cycle through copies of each weight matrix (>= 128 MB in all), so every call reads its weights
    from memory as a decoding step of a model larger than the caches does; otherwise one matrix stays
    in cache (the 49152-row LM head never fits: it is read from memory either way)."""
    import torch
    from dart_core import _native
    torch.set_num_threads(threads)
    supported = list(_native.small_gemm_paths())
    if paths is None:
        paths = [p for p in supported if p != "portable"] or supported
    missing = [p for p in paths if p not in supported]
    if missing:
        raise SystemExit(f"--paths: this CPU runs {supported}, not {missing}")
    before = _native.small_gemm_path()
    rng = np.random.default_rng(0)
    ta, tb = torch.randn(2048, 576), torch.randn(1536, 576)
    torch_macs = 2048 * 576 * 1536

    def torch_arm():
        t0 = time.perf_counter()
        ta @ tb.T
        return time.perf_counter() - t0

    torch_arm()
    torch_times: list[float] = []
    lines = []
    try:
        for name, K, N in shapes:
            w0 = torch.randn(N, K).bfloat16().view(torch.uint16).numpy()
            ws = [w0] + [w0.copy() for _ in range(-(-(128 << 20) // w0.nbytes) - 1 if cold else 0)]
            turn = [0]
            for M in rows:
                x = rng.standard_normal((M, K)).astype(np.float32)
                y = np.empty((M, N), np.float32)
                macs = M * N * K
                inner = max(1, min(100, int(1e8 // macs)))   # ~ a few ms per arm and rep

                def native_arm(path):
                    _native.small_gemm_set_path(path)
                    if not cold:
                        _native.small_gemm(x, w0, y, threads)   # warm: weights and x in cache
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        _native.small_gemm(x, ws[turn[0] % len(ws)], y, threads)
                        turn[0] += 1
                    return (time.perf_counter() - t0) / inner

                arms = [*paths, "torch"]
                t: dict[str, list[float]] = {a: [] for a in arms}
                for r in range(reps):
                    for a in (arms if r % 2 == 0 else arms[::-1]):
                        t[a].append(torch_arm() if a == "torch" else native_arm(a))
                torch_times += t["torch"]
                rate = {a: macs / statistics.median(t[a]) / 1e9 for a in paths}
                torch_rate = torch_macs / statistics.median(t["torch"]) / 1e9
                vs_avx2 = (statistics.median(b / a for a, b in zip(t[paths[0]], t["avx2"]))
                           if "avx2" in paths and paths[0] != "avx2" else None)
                vs_torch = statistics.median((macs / a) / (torch_macs / b) for a, b in zip(t[paths[0]], t["torch"]))
                lines.append(f"| {name} | {M} | " + " | ".join(f"{rate[a]:.1f}" for a in paths)
                             + f" | {torch_rate:.1f} | {'-' if vs_avx2 is None else f'{vs_avx2:.2f}'} | {vs_torch:.2f} |")
    finally:
        _native.small_gemm_set_path(before)
    print(f"\nsmall GEMM y = x @ w.T, bf16 weights ({'read from memory' if cold else 'in cache'}), float32 x and y,"
          f" {threads} threads (torch.set_num_threads({threads}));"
          f" G multiply-adds/s, median of {reps} interleaved reps; torch = float32 2048 x 576 @ 576 x 1536 in the same loop"
          f" (overall median {torch_macs / statistics.median(torch_times) / 1e9:.1f}); ratios = medians of per-rep ratios\n")
    print("| shape | M | " + " | ".join(paths) + " | torch large | " + f"{paths[0]} / avx2 | {paths[0]} / torch large |")
    print("|---|---:|" + "---:|" * (len(paths) + 3))
    for line in lines:
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", type=Path, default=bundled_table_path())
    ap.add_argument("--data", type=Path, default=None,
                    help="folder holding distill/smollm2-135m-instruct.jsonl.gz (the distillation corpus) for realistic "
                         "contexts and the build timing; without it those parts use what the table alone gives")
    ap.add_argument("--tokenizer", default=None, help="also time building from text (e.g. 'bundled' or a dir)")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--skip-build", action="store_true")
    ap.add_argument("--gemm", action="store_true", help="time only the small-GEMM kernel paths against torch")
    ap.add_argument("--threads", type=int, default=2, help="--gemm: kernel and torch threads")
    ap.add_argument("--reps", type=int, default=21, help="--gemm: interleaved repetitions per shape")
    ap.add_argument("--cold", action="store_true", help="--gemm: weights read from memory on every call "
                                                         "(as in decoding a model larger than the caches)")
    ap.add_argument("--paths", default=None, help="--gemm: kernel paths, comma-separated, best first "
                                                  "(default: every vector path this CPU runs)")
    ap.add_argument("--rows", default=None, help="--gemm: activation row counts, comma-separated (default "
                                                 + ",".join(map(str, GEMM_ROWS)) + ")")
    args = ap.parse_args()
    if args.gemm:
        try:
            rows = tuple(int(r) for r in args.rows.split(",")) if args.rows else GEMM_ROWS
        except ValueError:
            raise SystemExit(f"--rows: comma-separated row counts, e.g. 1,3,9 (got {args.rows!r})")
        if any(r < 1 for r in rows):
            raise SystemExit(f"--rows: every row count must be >= 1 (got {args.rows!r})")
        bench_gemm(args.threads, args.reps, args.paths.split(",") if args.paths else None, args.cold, rows)
        return
    rng = np.random.default_rng(0)
    store = NgramStore.open(args.table)
    docs = load_responses(args.data, 2000)
    contexts, likely, rand = make_queries(store, docs, args.queries, rng)
    rows = bench_open(args.table, store) + bench_queries(store, contexts, likely, rand)
    rows += bench_pruning(store, contexts, likely, rng)
    rows += bench_chains(store, contexts, likely, rng)
    if not args.skip_build:
        rows += bench_build(args.data, args.tokenizer)
    print(f"\nnative core benchmark (OpenMP: {ngram.require_native().has_openmp()}; CPU = this thread's CPU "
          f"time, wall = elapsed, best of 5)\n")
    print("| measure | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
