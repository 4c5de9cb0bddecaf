"""What does one drafting step cost, with and without the CPU optimisations of the draft heads?

    python benchmarks/draft_cost.py --threads 2            # bundled target, heads and N-gram table

Times ``propose`` of the DART and EAGLE-3 drafters on the bundled target after a real prompt,
arms interleaved in one loop so load drifts hit all alike:

* ``dart torch``: the head's projections through torch, all D+1 levels drafted;
* ``dart native``: projections through the native small-GEMM kernel, all levels;
* ``dart native+levels``: native, and only as many levels as the tree budget can keep;
* ``eagle3 torch`` / ``eagle3 native``: the EAGLE-3 head's projections through torch or the kernel.

Prints the median draft-forward ms of each (the head forward only, as the engine's stage timer
reports it) and each arm's speedup over the first arm of its method. A measurement, not a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dart_core.loading import bundled_head_dir, open_ngram  # noqa: E402
from dart_core.engine.protocol import AcceptedStep  # noqa: E402
from dart_core.drafters.dart import DartDrafter  # noqa: E402
from dart_core.drafters.eagle3 import Eagle3Drafter, Eagle3TreeConfig  # noqa: E402
from dart_core.config import dtype_name  # noqa: E402
from dart_core.hardware import describe_machine  # noqa: E402
from dart_core.models.heads.dart import load_dart_head  # noqa: E402
from dart_core.models.heads.eagle3 import load_eagle3_for_target  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from dart_core.drafters.pruning import PruningConfig  # noqa: E402
from dart_core.models.templates import encode_chat, get_template  # noqa: E402

PROMPT = "Explain how a hash table handles collisions, with a short example."


class AllLevels(DartDrafter):
    """A DartDrafter that drafts every level whatever its budget (the behaviour before the change)."""

    def propose(self, context):
        budget = self.pruning.budget
        self.pruning.budget = self.head.config.draft_length + 1   # levels = D + 1 in propose
        try:
            return super().propose(context)
        finally:
            self.pruning.budget = budget


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--reps", type=int, default=30)
    # Small trees, as automatic sizing picks on a few CPU cores (the published 60 / 60-7-10 suit GPUs).
    p.add_argument("--budget", type=int, default=3, help="DART budget of the timed arms (default 3)")
    p.add_argument("--eagle3-tree", default="3/1/2", help="EAGLE-3 total_token/depth/top_k (default 3/1/2)")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    target = load_target(None, dtype=args.dtype, device="cpu")
    store = open_ngram(None, target.tokenizer)
    pruning = PruningConfig(budget=args.budget)
    total, depth, top_k = (int(x) for x in args.eagle3_tree.split("/"))
    e3tree = Eagle3TreeConfig(total_token=total, depth=depth, top_k=top_k)
    ids = encode_chat(target.tokenizer, get_template(target.template_name), [{"role": "user", "content": PROMPT}])
    session = target.new_session(len(ids) + 1)
    aux = session.prefill(ids, want_aux=True).aux
    first = int(target.tokenizer.encode(" A", add_special_tokens=False)[0])

    arms = {
        "dart torch": AllLevels(load_dart_head(bundled_head_dir(), target), store, target.eos_token_ids, pruning,
                                native_linears=False),
        "dart native": AllLevels(load_dart_head(bundled_head_dir(), target), store, target.eos_token_ids, pruning),
        "dart native+levels": DartDrafter(load_dart_head(bundled_head_dir(), target), store, target.eos_token_ids,
                                          pruning),
        "eagle3 torch": Eagle3Drafter(load_eagle3_for_target(target, None, None), e3tree, native_linears=False),
        "eagle3 native": Eagle3Drafter(load_eagle3_for_target(target, None, None), e3tree),
    }
    times: dict[str, list[float]] = {name: [] for name in arms}
    contexts = {name: ids + [first] for name in arms}
    for drafter in arms.values():   # the prompt step (the head reads every prompt position) is not timed
        drafter.begin(ids, aux)
    for rep in range(1 + 3 + args.reps):
        for name, drafter in arms.items():
            ctx = contexts[name]
            proposal = drafter.propose(ctx)
            # Steady state: one token accepted per step (features of the last prompt position stand in).
            drafter.observe(AcceptedStep([ctx[-1]], first, aux[-1:]))
            ctx.append(first)
            if rep >= 4:
                times[name].append(proposal.draft_forward_s)
    machine = describe_machine("cpu")
    print(f"# draft forward per step: {machine['cpu_model']}, {machine['torch_threads']} threads, "
          f"dtype {dtype_name(target.dtype)}, DART budget {pruning.budget}, "
          f"EAGLE-3 tree {e3tree}")
    print("| arm | draft forward ms | speedup over the method's torch arm |\n|---|---:|---:|")
    base: dict[str, float] = {}
    for name, ts in times.items():
        ms = 1000 * statistics.median(ts)
        method = name.split()[0]
        base.setdefault(method, ms)
        print(f"| {name} | {ms:.2f} | {base[method] / ms:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
