"""The seeds' "Example 3": a JSONL batch script with DART swapped in for model.generate().

    python examples/batch_generate.py                                  # bundled target, head and N-gram table
    python examples/batch_generate.py --prompts my.jsonl --out results.jsonl \
        --base-model-name-or-path Qwen/Qwen3-8B --dart-model-name-or-path fvliang/qwen8b-dart \
        --ngram-model-name-or-path fvliang/dart-qwen3-ngram --small-ngram

Input: one JSON object per line with "prompt" and optionally "temperature" and "max_tokens".
Output: one line per prompt with "prompt", "response" and the speculative-decoding stats.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dart_core import DartModel, dart_generate

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(HERE / "prompts.jsonl"))
    ap.add_argument("--out", default="results.jsonl")
    ap.add_argument("--base-model-name-or-path", default=None)
    ap.add_argument("--dart-model-name-or-path", default=None)
    ap.add_argument("--ngram-model-name-or-path", default=None)
    ap.add_argument("--small-ngram", action="store_true")
    ap.add_argument("--dtype", default=None, help="e.g. bfloat16, float16, float32 (default: auto)")
    args = ap.parse_args()

    model = DartModel.from_pretrained(
        base_model_name_or_path=args.base_model_name_or_path,
        dart_model_name_or_path=args.dart_model_name_or_path,
        ngram_model_name_or_path=args.ngram_model_name_or_path,
        torch_dtype=getattr(torch, args.dtype) if args.dtype else None,
        device_map="auto",
        is_small_ngram=args.small_ngram,
    )
    template = model.template  # the seeds use TEMPLATE_REGISTRY["qwen"] for Qwen3; this follows the target

    with open(args.prompts, encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f if line.strip()]

    results = []
    for item in prompts:
        formatted = template.format(messages=[{"role": "user", "content": item["prompt"]}])
        output = dart_generate(
            model, prompt=formatted,
            temperature=item.get("temperature", 0.7),
            top_p=0.9, top_k=50,
            max_new_token_num=item.get("max_tokens", 512),
            max_length=2048,
        )
        results.append({"prompt": item["prompt"], "response": output.text,
                        "tau": round(output.stats.tau, 3), "new_tokens": output.stats.new_tokens,
                        "tokens_per_s": round(output.stats.tokens_per_s, 2)})
        print(f"[{len(results)}/{len(prompts)}] tau {output.stats.tau:.2f}, "
              f"{output.stats.tokens_per_s:.1f} tok/s: {item['prompt'][:60]!r}")

    with open(args.out, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(results)} results to {args.out}")


if __name__ == "__main__":
    main()
