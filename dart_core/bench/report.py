"""The benchmark report a person reads: one standalone HTML page of Plotly charts next to the
JSON and the Markdown table that ``python -m dart_core.bench ... --report DIR`` writes.

    write_report(report, markdown, "runs/report", sweep=load_sweep("runs/tune_trees.json"))
    # -> report.json, report.md, report.html

Charts, all from the bench report dict (and optionally a ``benchmarks/tune_tree.py --json`` sweep):
  speedup over vanilla per question set and per category, one bar per method;
  tau per question set, one bar per speculative method;
  time per verify step split into stages (draft_forward, tree_build, verify, commit), next to
  vanilla's time per token;
  acceptance-length histograms (share of verify steps committing n tokens, bonus included);
  tau and speedup against tree size (nodes verified per step), from the sweep, with each automatic-tree
  arm of the sweep as a level line.
With automatic trees (``--tree auto``) the page also lists the run's cost curve and, per method, the trees
chosen and expected against achieved tau.
The page embeds plotly.js, so it opens offline and sends no request anywhere.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Iterable

import plotly.graph_objects as go

from ..engine.trace import STAGES
from ..palette import OKABE_ITO

# One colour per method across every chart (Okabe-Ito, colour-blind safe).
METHOD_COLOURS = {
    "dart": OKABE_ITO["blue"], "eagle3": OKABE_ITO["vermillion"], "prompt_lookup": OKABE_ITO["bluish_green"],
    "vanilla": OKABE_ITO["grey"], "hf_generate": OKABE_ITO["black"], "dart_no_ngram": OKABE_ITO["sky_blue"],
}
STAGE_COLOURS = {"draft_forward": OKABE_ITO["blue"], "tree_build": OKABE_ITO["yellow"],
                 "verify": OKABE_ITO["orange"], "commit": OKABE_ITO["reddish_purple"]}
SWEEP_KEYS = ("sweep", "vanilla")


class ReportInputError(ValueError):
    """A sweep file is missing or not a tune_tree.py output; the message names the file."""


def question_files(settings: dict) -> list[str]:
    """The question files of a report's settings (a single string in reports written before --questions took
    several files)."""
    q = settings["questions"]
    return list(q) if isinstance(q, (list, tuple)) else [q]


def load_sweep(path: str | Path) -> dict:
    """A ``benchmarks/tune_tree.py --json`` output, checked enough to chart."""
    path = Path(path)
    try:
        sweep = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportInputError(f"sweep file {path} does not exist (--sweep takes a tune_tree.py --json output)") \
            from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportInputError(f"sweep file {path} is not JSON ({exc}); pass the file that "
                               "`python benchmarks/tune_tree.py --json FILE` wrote") from None
    if not isinstance(sweep, dict) or any(k not in sweep for k in SWEEP_KEYS) or not isinstance(sweep["sweep"], list):
        raise ReportInputError(f"sweep file {path} has no 'sweep' rows: it is not a tune_tree.py --json output")
    for row in sweep["sweep"]:
        if not isinstance(row, dict) or any(k not in row for k in ("tau", "speedup")):
            raise ReportInputError(f"sweep file {path}: every row needs tau and speedup, got {row!r}")
    return sweep


def chosen_text(chosen: dict[str, int], most: int = 4) -> str:
    """``budget 3 62%, budget 4 30%, +2 more``: the commonest settings with their share of the steps."""
    total = sum(chosen.values())
    if not total:
        return "–"
    items = list(chosen.items())
    text = ", ".join(f"{label} {100 * steps / total:.0f}%" for label, steps in items[:most])
    return text + (f", +{len(items) - most} more" if len(items) > most else "")


def _colour(name: str) -> str:
    return METHOD_COLOURS.get(name, OKABE_ITO["bluish_green"])


def _layout(fig: go.Figure, title: str, x: str, y: str, **kw: Any) -> go.Figure:
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=380,
                      legend_title_text=kw.pop("legend", "method"), margin=dict(l=60, r=20, t=60, b=60), **kw)
    return fig


def speedup_figure(report: dict, key: str = "per_set") -> go.Figure | None:
    """Speedup over this run's vanilla per group (question set or category), one bar per method."""
    methods = {n: r for n, r in report["methods"].items() if n != "vanilla" and r.get(key)}
    groups = sorted({g for r in methods.values() for g in r[key]})
    if not methods or not groups or "vanilla" not in report["methods"]:
        return None
    fig = go.Figure()
    for name, r in methods.items():
        ys = [(r[key].get(g) or {}).get("speedup_vs_vanilla") for g in groups]
        fig.add_bar(name=name, x=groups, y=ys, marker_color=_colour(name),
                    text=[f"{y:.2f}x" if y is not None else "" for y in ys], textposition="outside")
    fig.add_hline(y=1.0, line_dash="dot", line_color=OKABE_ITO["grey"], annotation_text="vanilla")
    what = "question set" if key == "per_set" else "category"
    return _layout(fig, f"Speedup over vanilla per {what}", what, "speedup (tokens/s ÷ vanilla's)",
                   barmode="group")


def tau_figure(report: dict) -> go.Figure | None:
    """tau (tokens per target forward, bonus included) per question set, one bar per speculative method."""
    methods = {n: r for n, r in report["methods"].items() if r.get("tau") is not None and n != "vanilla"}
    groups = sorted({g for r in methods.values() for g in r.get("per_set") or {}})
    if not methods or not groups:
        return None
    fig = go.Figure()
    for name, r in methods.items():
        ys = [(r["per_set"].get(g) or {}).get("tau") for g in groups]
        fig.add_bar(name=name, x=groups, y=ys, marker_color=_colour(name),
                    text=[f"{y:.2f}" if y is not None else "" for y in ys], textposition="outside")
    return _layout(fig, "τ: tokens committed per target forward", "question set", "τ (mean acceptance length)",
                   barmode="group")


def stage_figure(report: dict) -> go.Figure | None:
    """Milliseconds per verify step by stage (stacked), with vanilla's per-token time as the yardstick."""
    methods = {n: r for n, r in report["methods"].items() if r.get("ms_per_step") is not None}
    if not methods:
        return None
    names = list(methods)
    fig = go.Figure()
    for stage in STAGES:
        fig.add_bar(name=stage, x=names, y=[methods[n]["stage_ms_per_step"].get(stage) or 0.0 for n in names],
                    marker_color=STAGE_COLOURS[stage])
    totals = [methods[n]["ms_per_step"] for n in names]
    fig.add_scatter(x=names, y=totals, mode="text", text=[f"{t:.1f} ms" for t in totals], textposition="top center",
                    showlegend=False, hoverinfo="skip")
    return _layout(fig, "Time per speculative step, by stage", "method", "ms per verify step", barmode="stack",
                   legend="stage")


def acceptance_figure(report: dict) -> go.Figure | None:
    """Share of verify steps that committed n tokens (bonus included), per speculative method."""
    methods = {n: r["accept_length_hist"] for n, r in report["methods"].items()
               if n != "vanilla" and r.get("accept_length_hist")}
    if not methods:
        return None
    fig = go.Figure()
    for name, hist in methods.items():
        total = sum(hist.values())
        xs = sorted(int(k) for k in hist)
        fig.add_bar(name=name, x=xs, y=[hist[str(x)] / total for x in xs], marker_color=_colour(name))
    return _layout(fig, "Acceptance length per step", "tokens committed by a verify step (bonus included)",
                   "share of steps", barmode="group")


def sweep_figures(sweep: dict) -> list[go.Figure]:
    """tau and speedup against nodes verified per step, one line per method (EAGLE-3: per depth/top_k)."""
    series: dict[str, list[dict]] = {}
    for r in sweep["sweep"]:
        method = r.get("method", "dart")
        label = method if method != "eagle3" else f"eagle3 (depth {r.get('depth')}, top_k {r.get('top_k')})"
        series.setdefault(label, []).append(r)
    figs = []
    for metric, title, ytitle in (("tau", "τ against tree size", "τ (tokens per target forward)"),
                                  ("speedup", "Speedup over vanilla against tree size", "speedup (this sweep)")):
        fig = go.Figure()
        for label, rows in series.items():
            rows = sorted(rows, key=lambda r: r.get("nodes", (r.get("budget") or 0) + 1))
            fig.add_scatter(name=label, x=[r.get("nodes", (r.get("budget") or 0) + 1) for r in rows],
                            y=[r[metric] for r in rows], mode="lines+markers",
                            line_color=_colour(label.split(" ")[0]),
                            line_dash="solid" if label == "dart" else "dash")
        for r in sweep.get("auto") or []:   # automatic trees have no one size: a level line per auto arm
            if r.get(metric) is not None:
                fig.add_hline(y=r[metric], line_dash="dashdot", line_color=_colour(r.get("method", "dart")),
                              annotation_text=f"{r.get('arm', 'auto')} (automatic trees)")
        if metric == "speedup":
            fig.add_hline(y=1.0, line_dash="dot", line_color=OKABE_ITO["grey"], annotation_text="vanilla")
        figs.append(_layout(fig, f"{title} ({sweep.get('limit')} dev questions x {sweep.get('max_new_tokens')} "
                                 "tokens)", "nodes verified per step (root included)", ytitle, legend="arm"))
    return figs


def report_figures(report: dict, sweep: dict | None = None) -> list[go.Figure]:
    figs = [speedup_figure(report, "per_set"), speedup_figure(report, "per_category"), tau_figure(report),
            stage_figure(report), acceptance_figure(report)]
    if sweep is not None:
        figs += sweep_figures(sweep)
    return [f for f in figs if f is not None]


def _summary_rows(report: dict) -> Iterable[str]:
    for name, r in report["methods"].items():
        cells = [name, f"{r['tokens_per_s']:.1f}" if r.get("tokens_per_s") else "–",
                 f"{r['speedup_vs_vanilla']:.2f}x" if r.get("speedup_vs_vanilla") else "–",
                 f"{r['tau']:.2f}" if r.get("tau") else "–",
                 f"{r['stage_ms_per_step']['draft_forward']:.2f}" if r.get("ms_per_step") is not None else "–",
                 f"{r['ms_per_step']:.1f}" if r.get("ms_per_step") is not None else "–"]
        yield "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def _auto_tree_html(report: dict) -> str:
    """The run's cost curve and, per method, the trees chosen and expected vs achieved tau (``--tree auto``)."""
    tree = report.get("tree") or {}
    if tree.get("mode") != "auto":
        return ""
    out = ["<h2>Automatic trees</h2>"]
    cm = tree.get("cost_model")
    if cm:
        curve = ", ".join(f"{n}: {ms:.2f}" for n, ms in cm["verify_ms"].items())
        out.append(f"<p>Cost model ({html.escape(str(cm['source']))}): verify ms by nodes verified {{{curve}}}, "
                   f"commit {cm['commit_ms']:.2f} ms.</p>")
    rows = [(n, r["auto_tree"]) for n, r in report["methods"].items() if r.get("auto_tree")]
    if rows:
        out.append("<table><tr><th>method</th><th>expected τ</th><th>achieved τ</th><th>drafting steps</th>"
                   "<th>trees chosen (share of steps)</th></tr>")
        for name, a in rows:
            cells = [name, "–" if a["expected_tau"] is None else f"{a['expected_tau']:.2f}",
                     "–" if a["achieved_tau"] is None else f"{a['achieved_tau']:.2f}", str(a["drafting_steps"]),
                     chosen_text(a["chosen"])]
            out.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        out.append("</table>")
    return "\n".join(out)


def render_html(report: dict, sweep: dict | None = None) -> str:
    """One self-contained page: header facts, a summary table and every chart (plotly.js inlined)."""

    s, m, t = report["settings"], report["machine"], report["target"]
    figs = report_figures(report, sweep)
    charts = [f.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
              for i, f in enumerate(figs)]
    sets = ", ".join(Path(q).stem for q in question_files(s))
    warning = (f"<p class='warn'>Warning: {html.escape(report['busy_warning'])}</p>"
               if report.get("busy_warning") else "")
    facts = (f"{t['name']} ({t['dtype']}, {t['device']}); {s['n_questions']} questions from {html.escape(sets)} "
             f"(turns: {s['turns']}), max_new_tokens {s['max_new_tokens']}, "
             + ("greedy" if s.get("greedy") else f"temperature {s['temperature']}")
             + f". Machine: {html.escape(str(m.get('cpu_model')))}"
             + (f", GPU {html.escape(str(m['gpu']))}" if m.get("gpu") else "")
             + f", {m.get('torch_threads')} torch threads. Created {report.get('created', '')}.")
    command = html.escape(" ".join(report.get("command", [])))
    head = "".join(f"<th>{h}</th>" for h in ("method", "tok/s", "speedup vs vanilla", "τ", "draft forward ms/step",
                                              "ms/step"))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dart_core.bench report</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}code{{background:#f4f4f4;padding:2px 4px}}
.warn{{background:#fde2c8;border:2px solid #D55E00;padding:8px;font-weight:bold}}</style></head>
<body><h1>Speculative decoding benchmark</h1>
<p>{facts}</p>{warning}
<p>Command: <code>{command}</code></p>
<table><tr>{head}</tr>{''.join(_summary_rows(report))}</table>
<p>Speedups are ratios of tokens/s within this one run (every method answers the same prompts in turn).
τ counts the bonus token. Stage times are per verify step.</p>
{_auto_tree_html(report)}
{''.join(f'<div class="chart">{c}</div>' for c in charts)}
</body></html>
"""


def write_report(report: dict, markdown: str, out_dir: str | Path, sweep: dict | None = None) -> list[Path]:
    """Write report.json, report.md and report.html into ``out_dir``; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md", out / "report.html"]
    paths[0].write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    paths[1].write_text(markdown, encoding="utf-8")
    paths[2].write_text(render_html(report, sweep), encoding="utf-8")
    return paths
