"""Text-overlap checks for plotly figures rendered in a real browser (Playwright + chromium).

    sync_playwright = browser_or_skip()                  # skip without a browser (fail under CI=true)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        render_figures(page, {"tree": fig}, 640)         # each figure in a 640 px wide div, responsive
        assert text_overlaps(page, "body") == []

``text_overlaps`` works on any page where plotly.js has drawn figures (e.g. the Gradio app): it reads the
boxes of each plot's main title, legend box, axis titles (x, x2, y, y2, ...), colorbar titles and every
annotation's text (subplot titles are annotations, and so are labels over bars or shapes) and returns one
line per pair that intersects by more than 1 px each way. Pairs where one element contains the other are
ignored, and so are hidden and empty texts.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

import pytest

CHROMIUM = os.environ.get("DART_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
TOLERANCE_PX = 1.0


def browser_or_skip():
    """Playwright's sync API and the chromium binary, or skip (fail under CI=true); as
    tests/page/test_app_browser.py."""
    in_ci = os.environ.get("CI", "").lower() == "true"
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "playwright is not installed: pip install playwright"
        sync_playwright = None
    if problem is None and not Path(CHROMIUM).is_file():
        problem = f"no chromium at {CHROMIUM}: apt-get install -y chromium (or set DART_CHROMIUM)"
    if problem:
        if in_ci:
            pytest.fail(f"browser test cannot run under CI=true: {problem}")
        pytest.skip(problem)
    return sync_playwright


# Runs in the page: (root selector) -> per plot, its name, its box and its text items (kind, text, box).
_COLLECT_JS = r"""
(rootSelector) => {
  const plots = [];
  for (const r of document.querySelectorAll(rootSelector)) {
    if (r.classList && r.classList.contains('js-plotly-plot')) plots.push(r);
    r.querySelectorAll('.js-plotly-plot').forEach(p => { if (!plots.includes(p)) plots.push(p); });
  }
  const visible = el => {
    const b = el.getBoundingClientRect();
    if (b.width <= 0 || b.height <= 0) return null;
    for (let e = el; e && e.nodeType === 1; e = e.parentNode) {
      const s = getComputedStyle(e);
      if (s.display === 'none' || s.visibility === 'hidden' || s.opacity === '0') return null;
    }
    return b;
  };
  const short = t => { t = (t || '').replace(/\s+/g, ' ').trim(); return t.length > 40 ? t.slice(0, 39) + '\u2026' : t; };
  const box = b => ({left: b.left, top: b.top, right: b.right, bottom: b.bottom});
  return plots.map((gd, pi) => {
    const name = gd.id || (gd.closest('[id]') && gd.closest('[id]').id) || `plot ${pi}`;
    const items = [];
    const els = [];
    const add = (kind, el, text) => {
      const b = visible(el);
      if (!b) return;
      text = text === undefined ? el.textContent : text;
      if (!(text || '').trim() && kind !== 'legend') return;
      // parent/child pairs are not overlaps: remember which earlier items this one contains or sits in
      const nested = els.map((o, k) => (o.contains(el) || el.contains(o)) ? k : -1).filter(k => k >= 0);
      els.push(el);
      items.push({kind, text: short(text), box: box(b), nested});
    };
    gd.querySelectorAll('.infolayer .gtitle').forEach(el => add('title', el));
    gd.querySelectorAll('.infolayer .gtitle-subtitle').forEach(el => add('subtitle', el));
    gd.querySelectorAll('.infolayer text').forEach(el => {
      const m = Array.from(el.classList).find(c => /^[xy]\d*title$/.test(c));
      if (m) add(`axis title ${m.replace('title', '')}`, el);
    });
    gd.querySelectorAll('.legend').forEach(lg => {
      const names = Array.from(lg.querySelectorAll('.legendtext')).map(t => t.textContent).join(' | ');
      if (lg.querySelectorAll('.traces').length) add('legend', lg.querySelector('rect.bg') || lg, names);
    });
    gd.querySelectorAll('.colorbar .cbtitle text, .colorbar text.cbtitle').forEach(el => add('colorbar title', el));
    gd.querySelectorAll('.infolayer .annotation').forEach(g => add('annotation', g.querySelector('.annotation-text') || g));
    return {name, box: box(gd.getBoundingClientRect()), items};
  });
}
"""


def _box(b: dict) -> str:
    return f"[{round(b['left'])},{round(b['top'])} {round(b['right'] - b['left'])}x{round(b['bottom'] - b['top'])}]"


def _texts(page, root_selector: str) -> list[dict]:
    return page.evaluate(_COLLECT_JS, root_selector)


def text_overlaps(page, root_selector: str = "body") -> list[str]:
    """One description per pair of text boxes that intersect (more than 1 px each way) in the plotly figures
    under ``root_selector`` (itself a plot, or any element holding plots); [] when none do."""
    out = []
    for plot in _texts(page, root_selector):
        items = plot["items"]
        for j, b in enumerate(items):
            for i in range(j):
                a = items[i]
                if i in b["nested"]:
                    continue
                w = min(a["box"]["right"], b["box"]["right"]) - max(a["box"]["left"], b["box"]["left"])
                h = min(a["box"]["bottom"], b["box"]["bottom"]) - max(a["box"]["top"], b["box"]["top"])
                if w > TOLERANCE_PX and h > TOLERANCE_PX:
                    out.append(f'{plot["name"]}: {a["kind"]} "{a["text"]}" {_box(a["box"])} overlaps {b["kind"]} '
                               f'"{b["text"]}" {_box(b["box"])} by {round(w)}x{round(h)} px')
    return out


def texts_outside(page, root_selector: str = "body") -> list[str]:
    """The same texts that reach more than 1 px outside their own plot (cut off by its edges)."""
    out = []
    for plot in _texts(page, root_selector):
        p = plot["box"]
        for a in plot["items"]:
            b = a["box"]
            if (b["left"] < p["left"] - TOLERANCE_PX or b["top"] < p["top"] - TOLERANCE_PX
                    or b["right"] > p["right"] + TOLERANCE_PX or b["bottom"] > p["bottom"] + TOLERANCE_PX):
                out.append(f'{plot["name"]}: {a["kind"]} "{a["text"]}" {_box(b)} reaches outside the plot {_box(p)}')
    return out


_plotlyjs_dir: str | None = None


def _plotlyjs_path() -> Path:
    """plotly.min.js from the installed python ``plotly`` package, written once to a temporary folder."""
    global _plotlyjs_dir
    if _plotlyjs_dir is None:
        from plotly.offline import get_plotlyjs
        _plotlyjs_dir = tempfile.mkdtemp(prefix="plotlyjs-")
        (Path(_plotlyjs_dir) / "plotly.min.js").write_text(get_plotlyjs(), encoding="utf-8")
    return Path(_plotlyjs_dir) / "plotly.min.js"


def render_figures(page, figures: Mapping[str, object], width: int, *, gradio: bool = True,
                   timeout_ms: int = 60_000) -> None:
    """Show each figure (name -> plotly Figure) in its own ``width`` px wide div (id = the name) on a local
    page, with plotly.js from the installed plotly package (no network) and ``responsive: true``; returns
    once every figure has been drawn.

    ``gradio``: change each layout as gr.Plot does before it draws a figure (Gradio 6's PlotlyPlot.svelte):
    ``autosize`` on, ``margin.autoexpand`` on, and for a titled figure a top margin of at least 100 px
    (gr.Plot's default show_label). Note gr.Plot ships its own plotly.js build, which may differ in version
    from the python package's."""
    js = _plotlyjs_path()
    specs = {name: json.loads(fig.to_json()) for name, fig in figures.items()}
    divs = "\n".join(f'<div id="{name}" style="width:{int(width)}px"></div>' for name in specs)
    html = f"""<!doctype html><html><head><meta charset="utf-8">
<style>body {{ margin: 0; font-family: sans-serif; }} div {{ margin-bottom: 8px; }}</style>
<script src="{js.name}"></script></head><body>
{divs}
<script>
const specs = {json.dumps(specs)};
const asGradio = {'true' if gradio else 'false'};
Promise.all(Object.entries(specs).map(([name, f]) => {{
  const layout = f.layout || {{}};
  if (asGradio) {{
    layout.autosize = true;
    layout.margin = layout.margin || {{}};
    if (layout.title) layout.margin.t = Math.max(100, layout.margin.t || 0);
    layout.margin.autoexpand = true;
  }}
  return Plotly.newPlot(document.getElementById(name), f.data, layout, {{responsive: true}});
}}))
  .then(() => {{ window.__plotsDone = true; }}, e => {{ window.__plotsError = String(e); }});
</script></body></html>"""
    page_file = js.parent / f"figures-{os.getpid()}-{abs(hash(tuple(specs)))}-{int(width)}.html"
    page_file.write_text(html, encoding="utf-8")
    page.set_viewport_size({"width": int(width) + 40, "height": 900})
    page.goto(page_file.as_uri(), wait_until="load")
    page.wait_for_function("() => window.__plotsDone || window.__plotsError", timeout=timeout_ms)
    err = page.evaluate("() => window.__plotsError || null")
    if err:
        raise RuntimeError(f"plotly.js failed to draw the figures: {err}")
