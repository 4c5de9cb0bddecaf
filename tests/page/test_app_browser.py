"""The page in a real browser: Debian's chromium driven by Playwright (installed by .ci/run).

Walks the page as a teacher would: a guided example, a run with the paper's trees (the pruned tree, its dropped
candidates shown), a run with the calibrated trees, the slider, a click on an answer token, a hover on a tree
node, one round stage by stage; checks that no plot's title, legend or axis titles overlap at 1600, 1280 and
800 px (tests/plot_layout.py), that no request went anywhere but the local server, and saves the README's two
screenshots (docs/screenshot.png: calibrated trees; docs/screenshot-paper.png: the paper's trees). Under CI=true
a missing browser fails the run; elsewhere the test is skipped.

Runs on the bundled target (fp32, the session fixture) with its DART head; where that head is not
shipped yet it uses $DART_APP_TEST_HEAD, else a random head (the page renders the same).
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from gradio_server import launch_local  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
SCREENSHOT = ROOT / "docs" / "screenshot.png"              # calibrated trees (README)
SCREENSHOT_PAPER = ROOT / "docs" / "screenshot-paper.png"  # the paper's trees (README)
CHROMIUM = os.environ.get("DART_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
PROMPT = "Write a Python function that checks whether a string is a palindrome."


def _browser_or_skip():
    """Playwright's sync API and the chromium binary, or skip (fail under CI=true)."""
    from plot_layout import browser_or_skip
    return browser_or_skip()


@pytest.fixture(scope="module")
def served_app(request):
    import app
    from dart_core.loading import bundled_head_dir
    from dart_core.page.engines import EngineFactory
    from dart_core.page.serve import launch_kwargs
    from dart_core.page.visualiser import Visualiser

    _browser_or_skip()  # before loading anything: skip (or fail under CI=true) at once without a browser
    target = request.getfixturevalue("bundled_fp32")
    flags = ["--compare-eagle3", "--max-new-tokens", "48"]
    head = os.environ.get("DART_APP_TEST_HEAD")
    if (bundled_head_dir() / "config.json").is_file() or head:
        if head and not (bundled_head_dir() / "config.json").is_file():
            flags += ["--dart-model-name-or-path", head]
        vis = Visualiser(target, app.parse_args(flags))
    else:  # no trained head here: a random one still draws trees, timings and the whole page
        from dart_core.models.heads.dart import new_head_for_target
        base = EngineFactory.from_flags(target, compare_eagle3=True)
        factory = EngineFactory(target, dart_head=new_head_for_target(target, seed=0).to(target.dtype),
                                ngram=None, unavailable={k: v for k, v in base.unavailable.items() if k != "dart"})
        vis = Visualiser(target, app.parse_args(flags), factory)
    assert launch_kwargs(app.parse_args(flags))["ssr_mode"] is False
    yield vis, launch_local(vis.demo, css=launch_kwargs(app.parse_args(flags))["css"])
    vis.demo.close()


WIDTHS = (1600, 1280, 800)   # the page must have no overlapping plot text at each of these window widths


def _run(page) -> None:
    page.locator("#run-btn").click()
    # the status says "Running ..." from the run's first moment (an engine run takes seconds), then how it ended
    page.wait_for_function("() => /Running/.test(document.querySelector('#status').innerText)", timeout=120_000)
    page.wait_for_function("() => { const t = document.querySelector('#status').innerText; "
                           "return !/Running/.test(t) && /Done|Stopped|\u26a0/.test(t); }", timeout=300_000)
    status = page.locator("#status").inner_text()
    assert "Done" in status, status
    page.wait_for_selector("#tree-dart .js-plotly-plot .scatterlayer .point", timeout=60_000)


def _no_overlaps_at_every_width(page) -> None:
    from plot_layout import text_overlaps, texts_outside
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1200})
        page.wait_for_timeout(1500)   # plotly's responsive relayout after the window resize
        problems = text_overlaps(page, "body") + texts_outside(page, "body")
        assert not problems, f"overlapping or cut-off plot text at {width} px:\n" + "\n".join(problems)
    page.set_viewport_size({"width": WIDTHS[0], "height": 1200})
    page.wait_for_timeout(1000)


def _screenshot(page, path: Path) -> None:
    """The answers, metrics and the step view: the part of the page the README shows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.wait_for_timeout(800)
    width = page.viewport_size["width"]
    height = min(page.evaluate("document.documentElement.scrollHeight"), 2500)
    page.screenshot(path=str(path), full_page=True, clip={"x": 0, "y": 0, "width": width, "height": height})


@pytest.mark.bundled
def test_page_in_a_real_browser(served_app):
    """A teacher's path through the page: a guided example, the paper's trees (a real pruned tree, with its
    dropped candidates), the calibrated trees, a click on an answer token, a hover on a tree node, one round
    stage by stage, and no overlapping plot text at 1600, 1280 and 800 px."""
    sync_playwright = _browser_or_skip()
    vis, url = served_app
    local = urlparse(url)
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": WIDTHS[0], "height": 1200})
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url, wait_until="load")
            page.wait_for_selector("#prompt textarea", timeout=60_000)
            # a guided example fills the prompt and asks its question
            page.locator("#example-code").click()
            page.wait_for_function("(p) => document.querySelector('#prompt textarea').value === p", arg=PROMPT,
                                   timeout=30_000)
            assert "Try this" in page.locator("#guide").inner_text()

            # the paper's trees: DART budget 60, EAGLE-3 60 / 7 / 10 (fixed), then run
            page.locator("#preset-paper").click()
            page.wait_for_function("() => /\u25b6 Paper.s trees/.test(document.querySelector('#preset-note')"
                                   ".innerText)", timeout=30_000)
            _run(page)
            assert "identical to the baseline" in page.locator("#metrics-dart").inner_text()
            page.wait_for_function("() => /Paper.s trees: measured here/.test("
                                   "document.querySelector('#preset-note').innerText)", timeout=60_000)
            paper_points = page.locator("#tree-dart .js-plotly-plot .scatterlayer .point").count()
            # the candidates the pruner dropped, faded under the parents they would have had
            page.locator("#show-pruned input").check()
            page.wait_for_function("(n) => document.querySelectorAll('#tree-dart .js-plotly-plot .scatterlayer "
                                   ".point').length > n", arg=paper_points, timeout=60_000)
            _screenshot(page, SCREENSHOT_PAPER)
            # a tall tree scrolls inside its frame, its depth axis and legend at the top
            frame = page.evaluate("() => { const f = document.querySelector('#tree-dart'); "
                                  "const svg = f.querySelector('.main-svg'); return {client: f.clientHeight, "
                                  "scroll: f.scrollHeight, fig: svg ? svg.getBoundingClientRect().height : 0}; }")
            from dart_core.page.layout import TREE_FRAME_PX
            assert frame["client"] <= TREE_FRAME_PX + 2, frame
            if frame["fig"] > TREE_FRAME_PX:
                assert frame["scroll"] > frame["client"], frame
                axis_y = page.evaluate("() => document.querySelector('#tree-dart .xtitle').getBoundingClientRect().y")
                point_y = page.evaluate("() => Math.min(...[...document.querySelectorAll("
                                        "'#tree-dart .scatterlayer .point')].map(e => e.getBoundingClientRect().y))")
                assert axis_y < point_y, (axis_y, point_y)
            _no_overlaps_at_every_width(page)
            page.locator("#show-pruned input").uncheck()

            # the calibrated trees: sized by this machine's measured costs
            page.locator("#preset-fastest").click()
            page.wait_for_function("() => /\u25b6 Fastest/.test(document.querySelector('#preset-note').innerText)",
                                   timeout=30_000)
            _run(page)
            assert "tok/s" in page.locator("#metrics-dart").inner_text()
            assert "identical to the baseline" in page.locator("#metrics-dart").inner_text()
            note = page.locator("#preset-note").inner_text()
            assert note.count("measured here") == 2, note
            # the cost of a tree on this machine: measured verify points, DART's tokens/s by budget, and why
            page.wait_for_selector("#cost-verify .js-plotly-plot .scatterlayer .point", timeout=60_000)
            page.wait_for_selector("#cost-rate .js-plotly-plot .scatterlayer .point", timeout=60_000)
            cost_text = page.locator("#cost-text").inner_text()
            assert "verify of a 33-node tree" in cost_text and "DART's chooser picks" in cost_text, cost_text
            # why this speed: this run's points on the speedup map
            page.wait_for_selector("#why-plot .js-plotly-plot", timeout=60_000)
            assert ", this run" in page.locator("#why-text").inner_text()

            # the slider: token 0 is the prefill, token 1 DART's first step
            slider = page.locator("#step-slider input[type=range]")
            slider.focus()
            page.keyboard.press("Home")
            page.wait_for_function("() => document.querySelector('#narration-dart').innerText.includes('prefill')",
                                   timeout=60_000)
            page.keyboard.press("ArrowRight")
            page.wait_for_function("() => document.querySelector('#narration-dart').innerText.includes('step 1')",
                                   timeout=60_000)
            # a click on an answer token selects the step that produced it, in every engine
            tab = next(iter(vis.tabs.by_session.values()))
            best = vis.rendering._default_position(tab.record)
            from dart_core.engine.trace_stats import step_for_token
            spans = tab.record.spans("dart")
            dart_steps = tab.record.runs["dart"].traces
            st = dart_steps[step_for_token(dart_steps, best)]
            # a token of that step the answer box draws (a bare newline has no element to click)
            lines = [sum(1 for piece in text.split("\n") if piece) for text, _ in spans]
            token = next(i for i in range(st.position, st.position + st.acceptance_length) if lines[i])
            page.locator("#answer-dart .token").nth(sum(lines[:token])).click()
            page.wait_for_function("(p) => document.querySelector('#narration-dart').innerText"
                                   ".includes('tokens ' + p + '\u2013')", arg=int(st.position), timeout=60_000)
            step = tab.record.runs["eagle3"].traces[step_for_token(tab.record.runs["eagle3"].traces, token)].step
            page.wait_for_function("(s) => document.querySelector('#narration-eagle3').innerText"
                                   ".includes('step ' + s)", arg=step, timeout=60_000)
            assert int(page.locator("#step-slider input[type=number]").input_value()) == token
            # the clicked token stays outlined (the page's CSS reaches the answer box)
            clicked = page.locator("#answer-dart .token.dart-selected")
            assert clicked.count() == 1
            assert clicked.evaluate("e => getComputedStyle(e).outlineStyle") == "solid"
            # the timing chart marks the selected step
            page.wait_for_function("() => /selected step/.test(document.querySelector('#timing-plot').textContent)",
                                   timeout=60_000)
            page.wait_for_timeout(1000)
            _screenshot(page, SCREENSHOT)
            # hovering a tree node outlines its token in the answer
            page.locator("#tree-dart .js-plotly-plot .scatterlayer .point").last.hover(force=True)
            hovered = [page.locator("#tree-dart .js-plotly-plot .scatterlayer .point").nth(i)
                       for i in range(page.locator("#tree-dart .js-plotly-plot .scatterlayer .point").count())]
            linked = False
            for point in hovered:
                point.hover(force=True)
                page.wait_for_timeout(150)
                if page.locator("#answer-dart .token.dart-linked").count() == 1:
                    linked = True
                    break
            assert linked, "hovering the tree's nodes outlined no answer token"
            assert page.locator("#answer-dart .token.dart-linked").evaluate(
                "e => getComputedStyle(e).outlineStyle") == "solid"
            _no_overlaps_at_every_width(page)

            # moving the slider by hand drops the clicked token's outline (the view left its step)
            slider.focus()
            page.keyboard.press("Home")
            page.wait_for_function("() => !document.querySelector('#answer-dart .token.dart-selected')", timeout=30_000)

            # one round, stage by stage
            page.locator("#step-btn").click()
            page.wait_for_function("() => /Step-once mode/.test(document.querySelector('#status').innerText)",
                                   timeout=120_000)
            page.wait_for_function("() => /Stage 1 of 5/.test(document.querySelector('#narration-dart').innerText)",
                                   timeout=60_000)
            for k in range(2, 6):
                page.locator("#next-frame").click()
                page.wait_for_function("(k) => document.querySelector('#narration-dart').innerText"
                                       ".includes('Stage ' + k + ' of 5')", arg=k, timeout=60_000)
                page.wait_for_selector("#tree-dart .js-plotly-plot .scatterlayer .point, "
                                       "#tree-dart .js-plotly-plot .main-svg", timeout=60_000)
            _no_overlaps_at_every_width(page)
            # the tree-size control, in the Settings accordion: auto after *Fastest*, and the page says what applies
            page.get_by_text("Settings", exact=True).first.click()
            page.wait_for_selector("#tree-mode", timeout=30_000)
            assert "auto (measured on this machine)" in page.locator("#tree-mode").inner_text()
            assert "not applied" in page.locator("#tree-note").inner_text()
        finally:
            browser.close()
    outside = sorted({u for u in requests if urlparse(u).scheme in ("http", "https", "ws", "wss")
                      and urlparse(u).netloc != local.netloc})
    assert not outside, f"requests left the machine: {outside}"
    assert any(urlparse(u).netloc == local.netloc for u in requests)
    assert SCREENSHOT.stat().st_size > 10_000 and SCREENSHOT_PAPER.stat().st_size > 10_000
