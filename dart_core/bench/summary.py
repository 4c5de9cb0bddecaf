"""Benchmark figures from the answer records: per-method rates, greedy identity, per-group tables, Markdown.

Figures per method (definitions as in ``GenerationStats``):
  tokens_per_s        total new tokens / total wall time (request to last token, prefill included)
  speedup_vs_vanilla  tokens_per_s / vanilla's tokens_per_s in this run (null without vanilla)
  tau                 tokens committed by verify steps / verify steps (null without verify steps)
  stage_ms_per_step   mean ms per verify step of each stage in ``trace.STAGES``
  identical_to_vanilla greedy only: every answer token-for-token equal to vanilla's
  bandwidth_gbs       weight bytes x target forwards / s ("bandwidth achieved", as gpt-fast reports),
                      next to the machine's measured memory bandwidth
  decode_tokens_per_s tokens after the first / (wall time - time to first token): decoding alone, prefill excluded
  decode_speedup_vs_vanilla  decode_tokens_per_s / vanilla's
  ttft_ms             mean time to first token (the prompt's prefill and the first token)
  accepted_sources    accepted drafted tokens by source: head, context (the request's own text), corpus (the
                      N-gram table), several (more than one proposed or supported it); with their shares
  tree                the tree settings the method ran: {"mode": "fixed", "settings"} or {"mode": "auto", "held", ...}
  tree_nodes_hist     verify steps per tree size (nodes verified, root included)
  auto_tree           automatic trees only: ``chosen`` (verify steps per setting, summed over the answers; the
                      warm-up not counted), ``expected_tau`` (what the acceptance model expected of the chosen
                      trees) against ``achieved_tau`` (what they got), both over the drafting steps whose tree
                      was not cut short at an answer's end (``drafting_steps``)
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from ..engine.trace import STAGES

if TYPE_CHECKING:  # types only: the figures need neither torch nor a model
    from .runners import AnswerRecord, MethodRunner


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _rates(recs: Sequence[AnswerRecord], speculative: bool) -> dict:
    new = sum(r.new_tokens for r in recs)
    wall = sum(r.wall_s for r in recs)
    steps = sum(r.steps for r in recs)
    # tau as GenerationStats defines it: the first answer token comes from the prefill, not a verify step.
    committed = sum(r.new_tokens - 1 for r in recs if r.steps)
    prefill = sum(getattr(r, "prefill_s", 0.0) for r in recs)
    later = sum(max(r.new_tokens - 1, 0) for r in recs)
    return {
        "answers": len(recs),
        "new_tokens": new,
        "wall_s": wall,
        "tokens_per_s": new / wall if wall > 0 else None,
        "decode_tokens_per_s": later / (wall - prefill) if prefill > 0 and wall > prefill else None,
        "ttft_ms": 1000 * prefill / len(recs) if prefill > 0 and recs else None,
        "steps": steps if speculative else None,
        "tau": committed / steps if speculative and steps else None,
    }


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """Index of the first position where two answers differ (None when equal)."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def summarize(records: dict[str, list[AnswerRecord]], runners: dict[str, MethodRunner], weight_bytes: int,
              machine_bandwidth_gbs: float | None, greedy: bool) -> dict[str, dict]:
    """Per-method figures (see the module docstring) from the answer records."""
    base = records.get("vanilla")
    base_by_key = {(r.question_id, r.turn): r for r in base} if base is not None else {}
    base_rates = _rates(base, True) if base is not None else None

    out: dict[str, dict] = {}
    for name, recs in records.items():
        spec = runners[name].speculative
        rates = _rates(recs, spec)
        steps = sum(r.steps for r in recs)
        stage_ms = {s: (1000 * sum(r.stage_s.get(s, 0.0) for r in recs) / steps if spec and steps else None)
                    for s in STAGES}
        forwards = sum(r.target_forwards for r in recs)
        fps = forwards / rates["wall_s"] if rates["wall_s"] > 0 else None
        bw = weight_bytes * fps / 1e9 if fps is not None else None
        summary = {
            **rates,
            "speedup_vs_vanilla": _ratio(rates["tokens_per_s"], base_rates["tokens_per_s"]) if base_rates else None,
            "decode_speedup_vs_vanilla": (_ratio(rates["decode_tokens_per_s"], base_rates["decode_tokens_per_s"])
                                          if base_rates else None),
            "stage_ms_per_step": stage_ms,
            "ms_per_step": sum(stage_ms.values()) if spec and steps else None,
            "target_forwards": forwards,
            "target_forwards_per_s": fps,
            "bandwidth_gbs": bw,
            "bandwidth_fraction": _ratio(bw, machine_bandwidth_gbs),
            "stop_reasons": {k: sum(r.stop_reason == k for r in recs) for k in sorted({r.stop_reason for r in recs})},
            "identical_to_vanilla": None,
            "n_divergent": None,
            "divergences": [],
        }
        if greedy and base is not None:
            divs = []
            for r in recs:
                ref = base_by_key.get((r.question_id, r.turn))
                pos = first_divergence(r.tokens, ref.tokens) if ref is not None else 0
                if pos is not None:
                    divs.append({"question_id": r.question_id, "turn": r.turn, "position": pos,
                                 "token": r.tokens[pos] if pos < len(r.tokens) else None,
                                 "vanilla_token": ref.tokens[pos] if ref is not None and pos < len(ref.tokens)
                                 else None})
            summary.update(identical_to_vanilla=not divs, n_divergent=len(divs), divergences=divs)
        summary["per_category"] = _grouped(recs, base, spec, lambda r: r.category)
        summary["per_set"] = _grouped(recs, base, spec, lambda r: r.question_set)
        lengths = [n for r in recs for n in r.accept_lengths]
        summary["accept_length_hist"] = ({str(n): lengths.count(n) for n in range(1, max(lengths) + 1)}
                                         if spec and lengths else None)
        summary["tree"] = getattr(runners[name], "tree", None)
        summary["tree_nodes_hist"] = _tree_nodes_hist(recs) if spec else None
        summary["auto_tree"] = auto_tree_summary(recs)
        summary["accepted_sources"] = sources_summary(recs) if spec else None
        out[name] = summary
    return out


def sources_summary(recs: Sequence[AnswerRecord]) -> dict | None:
    """Accepted drafted tokens by source, summed over the answers, with each source's share."""
    total: dict[str, int] = {}
    for r in recs:
        for k, v in (getattr(r, "accepted_sources", None) or {}).items():
            total[k] = total.get(k, 0) + int(v)
    n = sum(total.values())
    if not n:
        return None
    return {"tokens": dict(sorted(total.items(), key=lambda kv: -kv[1])),
            "share": {k: v / n for k, v in sorted(total.items(), key=lambda kv: -kv[1])}}


def _tree_nodes_hist(recs: Sequence[AnswerRecord]) -> dict[str, int] | None:
    total: dict[int, int] = {}
    for r in recs:
        for n, c in (getattr(r, "tree_nodes", None) or {}).items():
            total[int(n)] = total.get(int(n), 0) + int(c)
    return {str(n): total[n] for n in sorted(total)} or None


def auto_tree_summary(recs: Sequence[AnswerRecord]) -> dict | None:
    """The answers' automatic-tree records summed: steps per chosen setting, expected and achieved tau."""
    autos = [r.auto_tree for r in recs if getattr(r, "auto_tree", None)]
    if not autos:
        return None
    chosen: dict[str, int] = {}
    for a in autos:
        for label, steps in a["chosen"].items():
            chosen[label] = chosen.get(label, 0) + int(steps)
    n = sum(int(a["drafting_steps"]) for a in autos)
    exp = sum(float(a["expected_tau_sum"]) for a in autos)
    ach = sum(float(a["achieved_tau_sum"]) for a in autos)
    return {"chosen": dict(sorted(chosen.items(), key=lambda kv: (-kv[1], kv[0]))),
            "steps": sum(chosen.values()), "drafting_steps": n,
            "expected_tau": exp / n if n else None, "achieved_tau": ach / n if n else None}


def _grouped(recs: Sequence[AnswerRecord], base: Sequence[AnswerRecord] | None, speculative: bool,
             key: Callable[[AnswerRecord], str]) -> dict[str, dict]:
    """tokens/s, tau and speedup vs vanilla per group (category or question set)."""
    out = {}
    for group in sorted({key(r) for r in recs}):
        c = _rates([r for r in recs if key(r) == group], speculative)
        b = _rates([r for r in base if key(r) == group], True) if base is not None else None
        out[group] = {"answers": c["answers"], "new_tokens": c["new_tokens"], "tokens_per_s": c["tokens_per_s"],
                      "tau": c["tau"],
                      "speedup_vs_vanilla": _ratio(c["tokens_per_s"], b["tokens_per_s"]) if b and b["answers"]
                      else None,
                      "decode_speedup_vs_vanilla": (_ratio(c["decode_tokens_per_s"], b["decode_tokens_per_s"])
                                                    if b and b["answers"] else None)}
    return out


# ---------------------------------------------------------------------------------------------- Markdown
def _f(x: float | None, fmt: str = "{:.2f}", none: str = "–") -> str:
    return none if x is None else fmt.format(x)


def render_markdown(report: dict) -> str:
    from .report import question_files  # lazy: the report module pulls in plotly

    s, m, t = report["settings"], report["machine"], report["target"]
    bw = m.get("memory_bandwidth_gbs") or {}
    load = m.get("load_average")
    lines = [
        f"### dart_core.bench: {t['name']} ({t['dtype']}, {t['device']})",
        "",
        f"{s['n_questions']} questions from {', '.join(f'`{Path(q).name}`' for q in question_files(s))} "
        f"(turns: {s['turns']}), "
        f"max_new_tokens {s['max_new_tokens']}, temperature {s['temperature']}"
        + (f", seed {s['seed']}" if s["temperature"] > 0 else " (greedy)") + ".  ",
        f"Machine: {m['cpu_model']}" + (f", GPU {m['gpu']}" if m.get("gpu") else "")
        + (f", CPU {t['gemm_path_choice']}" if t.get("gemm_path_choice")
           else f", CPU kernels' path {m['gemm_path']}" if m.get("gemm_path") else "")
        + (f", {t['gemm_split_choice']}" if t.get("gemm_split_choice") else "")
        + f", {m['torch_threads']} torch threads"
        + (f" (idle OpenMP threads: {m['openmp_wait']})" if m.get("openmp_wait") else "")
        + ", load average at start "
        + (", ".join(f"{x:.2f}" for x in load) if load else "n/a")
        + f", memory bandwidth measured {_f(bw.get('read'), '{:.1f}')} GB/s (read), "
          f"{_f(bw.get('copy'), '{:.1f}')} GB/s (copy); weights {t['weight_bytes'] / 1e6:.1f} MB"
        + (f" ({t['weight_pages']})" if t.get("weight_pages") else "") + ".",
        "",
    ]
    head = ["method", "tok/s", "speedup", "decode-only speedup", "TTFT ms", "tau"] + \
        [f"{st} ms/step" for st in STAGES] + ["GB/s achieved (of measured)", "identical to vanilla"]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + [":---:"]) + "|"]
    for name, r in report["methods"].items():
        if name == "vanilla":
            ident = "(reference)"
        elif r["identical_to_vanilla"] is None:
            ident = "n/a"
        elif r["identical_to_vanilla"]:
            ident = "yes"
        else:
            ident = f"no ({r['n_divergent']}/{r['answers']} differ)"
        bw_cell = _f(r["bandwidth_gbs"], "{:.1f}")
        if r["bandwidth_fraction"] is not None:
            bw_cell += f" ({100 * r['bandwidth_fraction']:.0f}%)"
        row = [name, _f(r["tokens_per_s"], "{:.1f}"), _f(r["speedup_vs_vanilla"], "{:.2f}x"),
               _f(r.get("decode_speedup_vs_vanilla"), "{:.2f}x"), _f(r.get("ttft_ms"), "{:.0f}"), _f(r["tau"])]
        row += [_f(r["stage_ms_per_step"][st], "{:.2f}") for st in STAGES]
        row += [bw_cell, ident]
        lines.append("| " + " | ".join(row) + " |")
    lines += _tree_section(report)
    lines += _sources_section(report)
    lines += _group_table(report, "per_set", "Per question set")
    lines += _group_table(report, "per_category", "Per category")
    if report.get("busy_warning"):
        lines += ["", f"**Warning: {report['busy_warning']}**"]
    return "\n".join(lines) + "\n"


def _tree_section(report: dict) -> list[str]:
    """Automatic trees: the run's cost curve once, then per method the trees chosen and expected vs achieved tau."""
    from .report import chosen_text

    tree = report.get("tree") or {}
    if tree.get("mode") != "auto":
        return []
    lines = ["", "Automatic trees (`--tree auto`): every few steps each drafter takes the tree setting with the most "
             "expected tokens/s under the run's cost model.", ""]
    cm = tree.get("cost_model")
    if cm:
        curve = ", ".join(f"{n}: {ms:.2f}" for n, ms in cm["verify_ms"].items())
        lines += [f"Cost model ({cm['source']}): verify ms by nodes verified {{{curve}}}, "
                  f"commit {cm['commit_ms']:.2f} ms.", ""]
    rows = [(name, r) for name, r in report["methods"].items() if r.get("auto_tree")]
    if rows:
        lines += ["| method | expected tau | achieved tau | drafting steps | trees chosen (share of steps) |",
                  "|---|---:|---:|---:|---|"]
        for name, r in rows:
            a = r["auto_tree"]
            lines.append(f"| {name} | {_f(a['expected_tau'])} | {_f(a['achieved_tau'])} | {a['drafting_steps']} | "
                         f"{chosen_text(a['chosen'])} |")
    return lines


def _sources_section(report: dict) -> list[str]:
    """Where each method's accepted drafts came from (head, context, corpus, several)."""
    rows = [(name, r["accepted_sources"]) for name, r in report["methods"].items() if r.get("accepted_sources")]
    if not rows:
        return []
    lines = ["", "Accepted drafts by source (share): head = the draft head, context = the request's own text, "
             "corpus = the N-gram table, several = more than one.", "", "| method | accepted drafts | by source |",
             "|---|---:|---|"]
    for name, a in rows:
        parts = ", ".join(f"{k} {100 * v:.0f}%" for k, v in a["share"].items())
        lines.append(f"| {name} | {sum(a['tokens'].values())} | {parts} |")
    return lines


def _group_table(report: dict, key: str, title: str) -> list[str]:
    """A Markdown table of tok/s (speedup, tau) per group, when there is more than one group."""
    groups = sorted({g for r in report["methods"].values() for g in r.get(key) or {}})
    if len(groups) < 2:
        return []
    names = list(report["methods"])
    lines = ["", f"{title}: tok/s (speedup vs vanilla, tau)", "",
             f"| {key.removeprefix('per_')} | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for group in groups:
        cells = []
        for name in names:
            c = (report["methods"][name].get(key) or {}).get(group)
            if c is None:
                cells.append("–")
                continue
            extra = [x for x in (_f(c["speedup_vs_vanilla"], "{:.2f}x", ""), _f(c["tau"], "tau {:.2f}", "")) if x]
            cells.append(_f(c["tokens_per_s"], "{:.1f}") + (f" ({', '.join(extra)})" if extra else ""))
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return lines
