"""Starting the app the way a user does: `python app.py --compare-eagle3` (the README's command, on a free port
through the app's --server-port flag) while both CPU cores are busy, then a run through the page.

Gradio's launch() checks its own page with one HEAD / and a 3-second timeout and aborts the process at the first
timeout. The page used to take 1-5 s (Gradio deep-copies the page config on every GET / and /config, and the
config held a bound method of the Visualiser, so each copy cloned the target's weights), and the app aborted at
start on a 2-core machine. Covered here: the page config is plain data (cheap to copy), the app's own check
(wait_for_page) waits out a slow page but still fails on one that never works, and the real start-up.
"""
from __future__ import annotations

import copy
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from gradio_server import free_port

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import app  # noqa: E402
from dart_core.page.serve import wait_for_page  # noqa: E402
from dart_core.page.tabs import TabState  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402

CHROMIUM = os.environ.get("DART_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
PROMPT = "What is 2 + 3?"
START_S = 600        # model load + warm-up of three engines with both cores taken by busy loops


# ---------------------------------------------------------------------------------------------- the page config
def _non_plain_leaves(obj, path=()):
    """Paths in a config whose leaves are not JSON data or a plain function (deep-copied by reference)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _non_plain_leaves(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _non_plain_leaves(v, path + (i,))
    elif not isinstance(obj, (str, int, float, bool, type(None), types.FunctionType)):
        yield path, type(obj).__name__


def test_page_config_is_plain_data_and_cheap_to_copy(tmp_path):
    """Gradio deep-copies the config for every page load: nothing in it may reach the engines or the target."""
    import torch
    from dart_core.models.heads.dart import new_head_for_target, save_dart_head
    from dart_core.models.heads.eagle3 import new_eagle3_head_for_target, save_eagle3_head
    from dart_core.models.loader import load_target
    from tiny_models import make_tiny_model_dir

    model_dir = make_tiny_model_dir(tmp_path)
    target = load_target(str(model_dir), dtype="float32", device="cpu")
    dart = save_dart_head(new_head_for_target(target, draft_length=4, seed=1), tmp_path / "dart", dtype=None)
    eagle = save_eagle3_head(new_eagle3_head_for_target(target, seed=2), tmp_path / "eagle3", dtype=None)
    args = app.parse_args(["--base-model-name-or-path", str(model_dir), "--dart-model-name-or-path", str(dart),
                           "--ngram-model-name-or-path", "none", "--eagle3-model-name-or-path", str(eagle)])
    vis = Visualiser(target, args)
    config = vis.demo.config
    assert not list(_non_plain_leaves(config))
    memo: dict = {}
    copy.deepcopy(config, memo)
    copied = [type(v).__name__ for v in memo.values()
              if isinstance(v, (torch.Tensor, torch.nn.Module, Visualiser, TabState))]
    assert not copied, f"copying the page config copied {sorted(set(copied))}"


def test_startup_names_the_cost_model():
    """The start-up log line that names the cost model sizing the trees (dart_core.page.startup.cost_summary)."""
    from types import SimpleNamespace
    from dart_core.sizing.costs import CostModel, VerifyCurve
    from dart_core.page.startup import cost_summary

    costs = CostModel(VerifyCurve([1, 9, 33], [0.002, 0.003, 0.006]), 1e-4, source="measured in 1.3 s")
    factory = SimpleNamespace(costs=costs)
    assert cost_summary(factory, "auto") == ("trees sized automatically: cost model measured in 1.3 s: verify ms by "
                                             "nodes {1: 2.0, 9: 3.0, 33: 6.0}, commit 0.10 ms")
    assert cost_summary(factory, "fixed").startswith("trees fixed (--tree fixed; the page can switch to auto): ")
    costs.source = "cached /somewhere/abc.json"
    assert "cost model cached /somewhere/abc.json, read in " in cost_summary(factory)
    costs.verify.key_s, costs.verify.key_node_s = 1.0e-6, 0.5e-6      # what each cached token adds, named too
    assert "{1: 2.0, 9: 3.0, 33: 6.0}, + 10.00 + 5.00 x nodes ms per 10,000 cached tokens" in cost_summary(factory)


# ---------------------------------------------------------------------------------------------- wait_for_page
class _Handler(http.server.BaseHTTPRequestHandler):
    delay_first_s = 0.0      # the first request waits this long before it answers
    status = 200
    seen = 0

    def do_HEAD(self):  # noqa: N802 - http.server's naming
        cls = type(self)
        cls.seen += 1
        if cls.seen == 1:
            time.sleep(cls.delay_first_s)
        self.send_response(cls.status)
        self.end_headers()

    def log_message(self, *args):  # quiet
        pass


def _serve(delay_first_s: float = 0.0, status: int = 200):
    handler = type("H", (_Handler,), {"delay_first_s": delay_first_s, "status": status, "seen": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def test_a_slow_first_page_fails_gradios_check_and_passes_the_apps():
    from gradio import networking
    server, url = _serve(delay_first_s=3.5)
    try:
        assert networking.url_ok(url) is False        # Gradio's check: one 3 s timeout and it gives up
        assert wait_for_page(url, timeout_s=30) is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_that_never_works_still_fails_the_apps_check():
    server, url = _serve(status=500)
    try:
        problem = wait_for_page(url, timeout_s=30)
        assert problem and "answered 500 5 times" in problem
    finally:
        server.shutdown()
        server.server_close()
    port = free_port()   # nothing listens there
    t0 = time.monotonic()
    problem = wait_for_page(f"http://127.0.0.1:{port}/", timeout_s=1.5)
    assert problem and "did not answer within 2 s" in problem and "ConnectError" in problem
    assert time.monotonic() - t0 < 10


# ---------------------------------------------------------------------------------------------- the real start-up
def _busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop(proc: subprocess.Popen, group: bool = False) -> None:
    if proc.poll() is not None:
        return
    try:
        if group:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.terminate()
        proc.wait(timeout=20)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        except ProcessLookupError:
            pass
        proc.wait(timeout=20)


def _wait_for_first_page(proc: subprocess.Popen, url: str, log: Path) -> tuple[float, float]:
    """Poll GET / until the page answers (the app must stay alive meanwhile); returns the first answer's
    latency and the time from start to it."""
    import httpx
    t0 = time.monotonic()
    while time.monotonic() - t0 < START_S:
        if proc.poll() is not None:
            pytest.fail(f"the app exited with {proc.returncode} while starting:\n{log.read_text()[-4000:]}")
        t = time.monotonic()
        try:
            r = httpx.get(url, timeout=60)
        except httpx.HTTPError:
            time.sleep(0.5)
            continue
        assert r.status_code == 200, r.text[:500]
        return time.monotonic() - t, time.monotonic() - t0
    pytest.fail(f"the page did not answer within {START_S} s:\n{log.read_text()[-4000:]}")


def _run_in_browser(url: str) -> dict[str, str]:
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(url, wait_until="load")
            page.wait_for_selector("#prompt textarea", timeout=120_000)
            page.locator("#prompt textarea").fill(PROMPT)
            page.locator("#run-btn").click()
            page.wait_for_function("() => /Done|Stopped/.test(document.querySelector('#status').innerText)",
                                   timeout=400_000)
            return {k: page.locator(f"#{k}").inner_text() for k in
                    ("status", "answer-dart", "answer-eagle3", "metrics-dart", "metrics-eagle3", "metrics-vanilla")}
        finally:
            browser.close()


def _run_through_client(url: str) -> dict[str, str]:
    import json
    from gradio_client import Client
    client = Client(url, verbose=False, download_files=False)
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/run"]["parameters"]
    values = [p["parameter_default"] for p in info[1:]]   # the page's defaults for every setting
    out = client.submit(PROMPT, *values, api_name="/run").result(timeout=400)
    text = json.dumps(out, ensure_ascii=False, default=str)
    assert text.count("tok/s") >= 3, text[:2000]   # one metrics line per engine (the page's checks are per column)
    return {"status": text, "metrics-dart": text, "metrics-eagle3": text, "answer-dart": text,
            "answer-eagle3": text, "metrics-vanilla": text}


def _browser_available() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return Path(CHROMIUM).is_file()


@pytest.mark.bundled
def test_readme_command_starts_on_busy_cores_and_serves_a_run(tmp_path):
    """`python app.py --compare-eagle3 --server-port PORT` with every core busy: it must come up (no abort at
    Gradio's start-up check), answer GET / quickly, and run DART and EAGLE-3 through the page."""
    in_ci = os.environ.get("CI", "").lower() == "true"
    if not _browser_available() and in_ci:
        pytest.fail(f"no playwright or no chromium at {CHROMIUM} under CI=true")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = tmp_path / "app.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    busy = _busy_loops(os.cpu_count() or 2)
    proc = None
    try:
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "app.py", "--compare-eagle3", "--server-port", str(port)],
                                    cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        first_s, started_s = _wait_for_first_page(proc, url, log)
        import httpx
        t = time.monotonic()
        assert httpx.get(url + "config", timeout=60).status_code == 200
        config_s = time.monotonic() - t
        print(f"\nstarted in {started_s:.1f} s; first GET / {first_s * 1000:.0f} ms, GET /config "
              f"{config_s * 1000:.0f} ms (both cores busy)")
        time.sleep(2.0)   # past the app's own start-up check: the process must still be serving
        assert proc.poll() is None, log.read_text()[-4000:]
        seen = _run_in_browser(url) if _browser_available() else _run_through_client(url)
        assert "Done" in seen["status"], seen["status"][:2000]
        for slot in ("dart", "eagle3", "vanilla"):
            assert "tok/s" in seen[f"metrics-{slot}"], seen
        assert seen["answer-dart"].strip() and seen["answer-eagle3"].strip()
        assert proc.poll() is None, log.read_text()[-4000:]
        text = log.read_text()
        assert "localhost is not accessible" not in text and "terminate called" not in text, text[-4000:]
        assert "trees sized automatically: cost model " in text, text[-4000:]   # measured, or read from the cache
    finally:
        for b in busy:
            _stop(b)
        if proc is not None:
            _stop(proc, group=True)
