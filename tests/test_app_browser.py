"""The page in a real browser: Debian's chromium driven by Playwright (installed by .ci/run).

Loads the page, runs a prompt, waits for the draft tree, timing and cost-of-a-tree plots to render, moves the
answer-token slider, checks that no request went anywhere but the local server, and saves a
screenshot to docs/screenshot.png (the README's picture). Under CI=true a missing browser fails
the run; elsewhere the test is skipped.

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCREENSHOT = ROOT / "docs" / "screenshot.png"
CHROMIUM = os.environ.get("DART_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
PROMPT = "Write a Python function that checks whether a string is a palindrome."


def _browser_or_skip():
    """Playwright's sync API and the chromium binary, or skip (fail under CI=true)."""
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


def app_module():
    import app
    return app






@pytest.fixture(scope="module")
def served_app(request):
    import app
    from dart_core.loading import bundled_head_dir
    from dart_core.loading import EngineFactory

    _browser_or_skip()  # before loading anything: skip (or fail under CI=true) at once without a browser
    target = request.getfixturevalue("bundled_fp32")
    flags = ["--compare-eagle3", "--max-new-tokens", "48"]
    head = os.environ.get("DART_APP_TEST_HEAD")
    if (bundled_head_dir() / "config.json").is_file() or head:
        if head and not (bundled_head_dir() / "config.json").is_file():
            flags += ["--dart-model-name-or-path", head]
        vis = app.Visualiser(target, app.parse_args(flags))
    else:  # no trained head here: a random one still draws trees, timings and the whole page
        from dart_core.models.heads.dart import new_head_for_target
        base = EngineFactory.from_flags(target, compare_eagle3=True)
        factory = EngineFactory(target, dart_head=new_head_for_target(target, seed=0).to(target.dtype),
                                ngram=None, unavailable={k: v for k, v in base.unavailable.items() if k != "dart"})
        vis = app.Visualiser(target, app.parse_args(flags), factory)
    assert app.launch_kwargs(app.parse_args(flags))["ssr_mode"] is False
    yield vis, launch_local(vis.demo)
    vis.demo.close()


@pytest.mark.bundled
def test_page_in_a_real_browser(served_app):
    sync_playwright = _browser_or_skip()
    vis, url = served_app
    local = urlparse(url)
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.on("request", lambda r: requests.append(r.url))
            page.goto(url, wait_until="load")
            page.wait_for_selector("#prompt textarea", timeout=60_000)
            page.locator("#prompt textarea").fill(PROMPT)
            page.locator("#run-btn").click()
            page.wait_for_function("() => /Done|Stopped/.test(document.querySelector('#status').innerText)",
                                   timeout=240_000)
            # the tree and timing plots are rendered by plotly in the page (SVG with node markers / bars)
            page.wait_for_selector("#tree-dart .js-plotly-plot .scatterlayer .point", timeout=60_000)
            page.wait_for_selector("#timing-plot .js-plotly-plot .barlayer .point", timeout=60_000)
            assert page.locator("#tree-dart .js-plotly-plot .scatterlayer .point").count() > 2
            assert "tok/s" in page.locator("#metrics-dart").inner_text()
            assert "identical to the baseline" in page.locator("#metrics-dart").inner_text()
            # the cost of a tree on this machine: measured verify points, DART's tokens/s by budget, and why
            page.wait_for_selector("#cost-verify .js-plotly-plot .scatterlayer .point", timeout=60_000)
            page.wait_for_selector("#cost-rate .js-plotly-plot .scatterlayer .point", timeout=60_000)
            cost_text = page.locator("#cost-text").inner_text()
            assert "verify of a 33-node tree" in cost_text and "DART's chooser picks" in cost_text, cost_text
            before = page.locator("#narration-dart").inner_text()
            assert "step" in before
            # move the answer-token slider to token 0 (keyboard on the range input, as a user would)
            slider = page.locator("#step-slider input[type=range]")
            slider.focus()
            page.keyboard.press("Home")
            page.wait_for_function("() => document.querySelector('#narration-dart').innerText.includes('prefill')",
                                   timeout=60_000)
            page.keyboard.press("ArrowRight")
            page.wait_for_function("() => document.querySelector('#narration-dart').innerText.includes('step 1')",
                                   timeout=60_000)
            # for the screenshot: the step with the longest accepted path
            tab = next(iter(vis._tabs.values()))
            best = app_module().Visualiser._default_position(tab.record)
            for _ in range(best - 1):
                page.keyboard.press("ArrowRight")
            page.wait_for_function("(best) => document.querySelector('#narration-dart').innerText"
                                   ".includes('tokens ' + best + '\u2013')", arg=best, timeout=60_000)
            page.wait_for_timeout(1000)
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.evaluate("window.scrollTo(0, 0)")
            # answers, metrics and the step view: the part of the page the README shows
            height = min(page.evaluate("document.documentElement.scrollHeight"), 2300)
            page.screenshot(path=str(SCREENSHOT), full_page=True, clip={"x": 0, "y": 0, "width": 1500,
                                                                        "height": height})
            # the tree-size control, in the Settings accordion: auto by default, and the page says what applies
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
    assert SCREENSHOT.stat().st_size > 10_000
