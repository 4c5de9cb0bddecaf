"""The GPU path in one prepared run: lossless decoding on CUDA, and drafting cost at real shapes.

    python benchmarks/gpu_check.py --device cuda --json gpu_check.json     # on a GPU machine (no Hub needed)
    python benchmarks/gpu_check.py --device cpu --configs tiny --reps 2    # smoke run anywhere (the tests do this)

1. **Lossless on the device**: tiny random Llama and Qwen3 targets (built locally, float32) with random DART
   and EAGLE-3 heads; greedy vanilla, DART and EAGLE-3 answers to a few prompts must be identical.
2. **Stage timings at real shapes**: random-weight targets built from the Qwen3-4B/8B/14B configurations (bf16;
   latency does not depend on the weights' values) with random heads of the published shapes (32k draft
   vocabulary, DART draft length 8). After a 512-token prompt it times, median over ``--reps``:
   the target verifying 1 token and a 61-node tree, DART's draft forward at budget 60, and EAGLE-3's drafting
   (1 + depth head forwards) at the published tree 60/7/10. The paper reports DART's draft forward at 1.5 ms on
   Qwen3-14B, 6.8x cheaper than EAGLE-3's drafting.

Prints one Markdown table per part; ``--json`` also writes the figures. A measurement: it asserts nothing except
that it ran; part 1's ``identical`` column is the check to read.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dart_core.config import GenerationConfig, dtype_name  # noqa: E402
from dart_core.engine.protocol import AcceptedStep  # noqa: E402
from dart_core.methods import Parts, TreeRequest, build_engine, make_drafter  # noqa: E402
from dart_core.models.heads.dart import new_head_for_target  # noqa: E402
from dart_core.models.heads.eagle3 import new_eagle3_head_for_target  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from dart_core.models.target import TargetModel  # noqa: E402
from dart_core.engine.tree import DraftTree  # noqa: E402

# From the published config.json files (hidden, layers, heads, kv heads, head_dim, intermediate, vocab).
QWEN3 = {
    "qwen3-4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False),
    "qwen3-14b": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                      head_dim=128, intermediate_size=17408, vocab_size=151936, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=512, tie_word_embeddings=False),
}
DRAFT_VOCAB = 32000
PROMPTS = ["The quick brown fox", "def add(a, b):", "Once upon a time", "1, 2, 3, 4,"]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def lossless_check(device: str, max_new_tokens: int) -> list[dict]:
    from tiny_models import make_tiny_model_dir

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_type in ("llama", "qwen3"):
            target = load_target(str(make_tiny_model_dir(Path(tmp), model_type)), dtype="float32", device=device)
            parts = Parts(dart_head=new_head_for_target(target, draft_length=4, seed=0),
                          eagle3_head=new_eagle3_head_for_target(target, seed=0))
            engines = {
                "vanilla": build_engine(target, "vanilla"),
                "dart": build_engine(target, "dart", parts, TreeRequest({"budget": 16})),
                "eagle3": build_engine(target, "eagle3", parts,
                                       TreeRequest({"total_token": 16, "depth": 4, "top_k": 4})),
            }
            cfg = GenerationConfig(max_new_tokens=max_new_tokens, max_length=256)
            for prompt in PROMPTS:
                ids = target.tokenizer.encode(prompt, add_special_tokens=False)
                out = {name: e.generate(ids, cfg) for name, e in engines.items()}
                for name in ("dart", "eagle3"):
                    rows.append({"model": model_type, "prompt": prompt, "method": name,
                                 "identical": out[name].tokens == out["vanilla"].tokens,
                                 "tau": round(out[name].stats.tau, 2), "tokens": len(out["vanilla"].tokens)})
    return rows


def random_target(name: str, device: torch.device, dtype: torch.dtype) -> TargetModel:
    """A Qwen3 target with random weights at the configuration's real shapes (no download, no tokenizer)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**QWEN3[name], max_position_embeddings=40960, rope_theta=1_000_000.0, eos_token_id=0,
                         attn_implementation="sdpa")
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tokenizer = SimpleNamespace(eos_token_id=0, decode=lambda ids, **kw: "")
    return TargetModel(model, tokenizer, name=f"random {name}", template_name="qwen3")


def timed(fn, reps: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls after 3 warm-up calls (fn returns its own time or None)."""
    out = []
    for i in range(3 + reps):
        sync(device)
        t0 = time.perf_counter()
        own = fn()
        sync(device)
        if i >= 3:
            out.append(own if own is not None else time.perf_counter() - t0)
    return statistics.median(out)


def draft_seconds(drafter, prompt: list[int], aux: torch.Tensor, reps: int, device: torch.device) -> float:
    """Median draft-forward time of ``propose`` in steady state (one token accepted per step)."""
    drafter.begin(prompt, aux)
    ctx = prompt + [1]
    drafter.propose(ctx)                        # the prompt step (the head reads every prompt position)
    drafter.observe(AcceptedStep([ctx[-1]], 1, aux[-1:]))
    ctx.append(1)

    def step():
        proposal = drafter.propose(ctx)
        drafter.observe(AcceptedStep([ctx[-1]], 1, aux[-1:]))
        ctx.append(1)
        return proposal.draft_forward_s
    return timed(step, reps, device)


def stage_timings(name: str, device: torch.device, dtype: torch.dtype, prefix: int, reps: int) -> dict:
    target = random_target(name, device, dtype)
    vocab = target.vocab_size
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, vocab, size=prefix).tolist()
    session = target.new_session(prefix + 64)
    aux = session.prefill(prompt, want_aux=True).aux
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, 61)]
    tree61 = DraftTree.from_parents(rng.integers(1, vocab, size=61).tolist(), parents)
    one = DraftTree.root_only(1)

    def verify(tree):
        def run():
            session.verify(tree)
            session.truncate(prefix)
        return run
    draft_ids = torch.arange(min(DRAFT_VOCAB, vocab))
    dart_head = new_head_for_target(target, draft_ids=draft_ids, draft_length=8).to(dtype)
    eagle_head = new_eagle3_head_for_target(target, draft_ids=draft_ids).to(dtype)
    parts = Parts(dart_head=dart_head, eagle3_head=eagle_head)
    dart = make_drafter(target, "dart", parts, TreeRequest({"budget": 60}))
    eagle = make_drafter(target, "eagle3", parts, TreeRequest({"total_token": 60, "depth": 7, "top_k": 10}))
    row = {"config": name, "dtype": dtype_name(dtype), "prefix": prefix,
           "verify_1_ms": 1000 * timed(verify(one), reps, device),
           "verify_61_ms": 1000 * timed(verify(tree61), reps, device),
           "dart_draft_ms": 1000 * draft_seconds(dart, prompt, aux, reps, device),
           "eagle3_draft_ms": 1000 * draft_seconds(eagle, prompt, aux, reps, device)}
    row["eagle3_over_dart"] = row["eagle3_draft_ms"] / row["dart_draft_ms"]
    del target, session, dart, eagle, dart_head, eagle_head
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--configs", default="qwen3-4b,qwen3-8b,qwen3-14b",
                   help=f"comma-separated, of {', '.join(QWEN3)}")
    p.add_argument("--dtype", default=None, help="stage-timing dtype (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=40, help="answer length of the lossless check")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU is visible; use --device cpu --configs tiny for a smoke run")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in QWEN3]
    if unknown:
        raise SystemExit(f"unknown --configs {unknown}; known: {', '.join(QWEN3)}")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    torch.manual_seed(0)

    lossless = lossless_check(args.device, args.max_new_tokens)
    print(f"# 1. lossless on {gpu}: tiny float32 targets, random heads, greedy")
    print("| model | method | prompts identical to vanilla | mean tau |\n|---|---|---:|---:|")
    for model in ("llama", "qwen3"):
        for method in ("dart", "eagle3"):
            rs = [r for r in lossless if r["model"] == model and r["method"] == method]
            print(f"| {model} | {method} | {sum(r['identical'] for r in rs)}/{len(rs)} | "
                  f"{statistics.mean(r['tau'] for r in rs):.2f} |")
    print(f"\n# 2. stage timings on {gpu}, random weights at real shapes, {dtype_name(dtype)}, "
          f"{args.prefix}-token prefix, median of {args.reps}")
    print("| config | verify 1 token ms | verify 61 nodes ms | DART draft ms (budget 60) | "
          "EAGLE-3 draft ms (60/7/10) | EAGLE-3 / DART |\n|---|---:|---:|---:|---:|---:|")
    timings = []
    for name in configs:
        r = stage_timings(name, device, dtype, args.prefix, args.reps)
        timings.append(r)
        print(f"| {name} | {r['verify_1_ms']:.2f} | {r['verify_61_ms']:.2f} | {r['dart_draft_ms']:.2f} | "
              f"{r['eagle3_draft_ms']:.2f} | {r['eagle3_over_dart']:.1f}x |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": gpu, "torch": torch.__version__, "lossless": lossless,
                                               "timings": timings}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
