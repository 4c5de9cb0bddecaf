"""What does one drafting step cost against a plain target step, per way of running the heads?

    python benchmarks/draft_cost.py --threads 2                  # bundled target, heads and N-gram table
    python benchmarks/draft_cost.py --threads 2 --budget 2 --eagle3-tree 3/1/2 --reps 60 --json draft_cost.json

Times ``propose`` of the DART and EAGLE-3 drafters on the bundled target after a real prompt, one arm per head
backend (``models.heads.native_step.HEAD_BACKENDS``):

* ``torch``: the head's forward as torch ops (the reference);
* ``torch+gemm``: torch ops with the projections through the native small-GEMM kernel;
* ``native``: one native call per head forward (DART: one a step; EAGLE-3: one per depth), the default on a CPU.

A plain target step (one token after the same prompt, the engine's verify of a root-only tree) is timed in the
same loop, every arm and the plain step interleaved rep by rep so load drifts hit all alike. Prints the median
draft forward and tree build ms of each arm, their sum as a multiple of the plain step, and EAGLE-3's cost per
drafted level against DART's whole draft (DART drafts every level in one forward). A measurement, not a test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dart_core  # noqa: E402,F401  (before torch: its idle OpenMP threads spin only briefly, dart_core/openmp.py)
import torch  # noqa: E402

from dart_core.loading import bundled_head_dir, open_ngram  # noqa: E402
from dart_core.engine.protocol import AcceptedStep  # noqa: E402
from dart_core.engine.tree import DraftTree  # noqa: E402
from dart_core.drafters.eagle3 import Eagle3TreeConfig  # noqa: E402
from dart_core.methods import Parts, TreeRequest, make_drafter  # noqa: E402
from dart_core.config import dtype_name  # noqa: E402
from dart_core.hardware import describe_machine  # noqa: E402
from dart_core.models.heads.dart import load_dart_head  # noqa: E402
from dart_core.models.heads.eagle3 import load_eagle3_for_target  # noqa: E402
from dart_core.models.heads.native_step import HEAD_BACKENDS  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from dart_core.drafters.pruning import PruningConfig  # noqa: E402
from dart_core.models.templates import encode_chat, get_template  # noqa: E402

PROMPT = "Explain how a hash table handles collisions, with a short example."


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--reps", type=int, default=40)
    # Small trees, as automatic sizing picks on a few CPU cores (the published 60 / 60-7-10 suit GPUs).
    p.add_argument("--budget", type=int, default=2, help="DART budget of the timed arms (default 2)")
    p.add_argument("--eagle3-tree", default="3/1/2", help="EAGLE-3 total_token/depth/top_k (default 3/1/2)")
    p.add_argument("--backends", default="torch,torch+gemm,native",
                   help=f"head backends to time, comma-separated (of {', '.join(HEAD_BACKENDS[1:])})")
    p.add_argument("--json", metavar="OUT.json", help="also write the figures here")
    args = p.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    bad = [b for b in backends if b not in HEAD_BACKENDS[1:]]
    if bad:
        p.error(f"--backends: unknown {', '.join(bad)}; choose from {', '.join(HEAD_BACKENDS[1:])}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target = load_target(None, dtype=args.dtype, device="cpu")
    store = open_ngram(None, target.tokenizer)
    pruning = PruningConfig(budget=args.budget)
    total, depth, top_k = (int(x) for x in args.eagle3_tree.split("/"))
    e3tree = Eagle3TreeConfig(total_token=total, depth=depth, top_k=top_k)
    ids = encode_chat(target.tokenizer, get_template(target.template_name), [{"role": "user", "content": PROMPT}])
    session = target.new_session(len(ids) + 2 * (1 + 4 + args.reps) + 8)
    aux = session.prefill(ids, want_aux=True).aux
    first = int(target.tokenizer.encode(" A", add_special_tokens=False)[0])

    arms = {}
    for b in backends:
        # each arm its own heads (a backend prepares its head once)
        parts = Parts(dart_head=load_dart_head(bundled_head_dir(), target), ngram=store,
                      eagle3_head=load_eagle3_for_target(target, None, None))
        arms[f"dart {b}"] = make_drafter(target, "dart", parts, TreeRequest(pruning.to_dict()), head_backend=b)
        arms[f"eagle3 {b}"] = make_drafter(target, "eagle3", parts, TreeRequest(asdict(e3tree)), head_backend=b)
    fwd: dict[str, list[float]] = {name: [] for name in arms}
    build: dict[str, list[float]] = {name: [] for name in arms}
    plain: list[float] = []
    contexts = {name: ids + [first] for name in arms}
    for drafter in arms.values():   # the prompt step (the head reads every prompt position) is not timed
        drafter.begin(ids, aux)
    prefix = session.length
    for rep in range(1 + 3 + args.reps):
        t0 = time.perf_counter()
        session.verify(DraftTree.root_only(first))      # a plain step: one token through the target
        dt = time.perf_counter() - t0
        session.truncate(prefix)
        for name, drafter in arms.items():
            ctx = contexts[name]
            proposal = drafter.propose(ctx)
            # Steady state: one token accepted per step (features of the last prompt position stand in).
            drafter.observe(AcceptedStep([ctx[-1]], first, aux[-1:]))
            ctx.append(first)
            if rep >= 4:
                fwd[name].append(proposal.draft_forward_s)
                build[name].append(proposal.tree_build_s)
        if rep >= 4:
            plain.append(dt)
    machine = describe_machine("cpu")
    plain_ms = 1000 * statistics.median(plain)
    print(f"# drafting step against a plain step: {machine['cpu_model']}, {machine['torch_threads']} threads, "
          f"GEMM path {machine.get('gemm_path', '?')}, dtype {dtype_name(target.dtype)}, DART budget "
          f"{pruning.budget}, EAGLE-3 tree {total}/{depth}/{top_k}, plain step {plain_ms:.2f} ms")
    print("| arm | draft forward ms | tree build ms | draft + build x plain step | per drafted level x plain |")
    print("|---|---:|---:|---:|---:|")
    rows = {}
    for name in arms:
        f_ms, b_ms = 1000 * statistics.median(fwd[name]), 1000 * statistics.median(build[name])
        levels = min(arms[name].head.config.draft_length + 1, pruning.budget) if name.startswith("dart") else depth + 1
        both = f_ms + b_ms
        rows[name] = {"draft_forward_ms": f_ms, "tree_build_ms": b_ms, "x_plain": both / plain_ms,
                      "levels": levels, "per_level_x_plain": both / levels / plain_ms}
        print(f"| {name} | {f_ms:.2f} | {b_ms:.2f} | {both / plain_ms:.3f}x | {both / levels / plain_ms:.3f}x |")
    for b in backends:
        d, e = rows[f"dart {b}"], rows[f"eagle3 {b}"]
        print(f"{b}: EAGLE-3's draft per level = {e['per_level_x_plain'] / d['x_plain']:.2f}x DART's whole draft")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "plain_step_ms": plain_ms,
                                               "budget": pruning.budget, "eagle3_tree": [total, depth, top_k],
                                               "arms": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
