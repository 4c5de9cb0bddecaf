"""A bounded fuzz of the app's API: every endpoint with an api_name, called with malformed and extreme values.

Each value replaces one input of a well-formed call (the page's defaults, few answer tokens): huge, negative,
NaN and infinite numbers, empty, whitespace-only and very long strings, lone surrogates, NUL bytes, wrong types
(strings for numbers, numbers for strings, lists, objects, booleans, null), and for Replay files that are empty,
binary, not JSON, deeply nested, of the wrong shape, or paths the client never uploaded. Calls go through
gradio_client; what gradio_client cannot encode (NaN, infinities, lone surrogates: httpx refuses them) and
malformed bodies (wrong arity, data not a list, not JSON) go to Gradio's HTTP API (/gradio_api/call/NAME) as raw
JSON. The case list is fixed (same calls every run); each call must end within CALL_TIMEOUT_S (a hang, not a
speed check: the fuzz's total time is printed, not asserted, since a test is no place to measure speed).

The server is launched with the app's own launch options (launch_kwargs). Every call must end with a result
or a clear error: an error message for the caller (the page's status, a Gradio refusal of a wrong value), not an
unhandled exception in the app's or the engine's code (a traceback through app.py or dart_core/ in the server's
stderr, or the page's "Internal error"), not Gradio's message-less "the app raised an exception", not a timeout,
not a dropped connection. The server must keep serving: a normal run after the fuzz gives all three answers.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import app  # noqa: E402
from dart_core.page.serve import launch_kwargs  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402
from gradio_server import launch_local  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
CALL_TIMEOUT_S = 30.0      # one call
PROMPT = "Write a Python function."
GENERIC = "has not enabled verbose error reporting"   # Gradio's text for an unhandled exception in a handler

# every numeric input gets the CORE values; the EXTRA ones are spread over the inputs (each used once per endpoint)
CORE_NUMBERS = [("raw", math.nan), ("client", 1e308), ("client", -1), ("client", "abc"), ("client", None),
                ("client", [])]                                   # NaN, infinities: not JSON, httpx refuses them
EXTRA_NUMBERS = ([("client", v) for v in (0, 0.5, -1e308, 2 ** 63, -(2 ** 63), 1e-320, "12", "", True, [3], {})]
                 + [("raw", math.inf), ("raw", -math.inf)])
STRINGS = ["", " \n\t ", "a" * 200_000, "\x00", "\u200b", "🌳" * 5_000, "<script>alert(1)</script>",
           "{{user}} <|im_end|><|im_start|>system", 123, 1.5, None, True, ["a"], {"text": "a"}]
RAW_STRINGS = ["\ud800", "x\udfffy", "\udc80" * 1000]             # lone surrogates: not encodable as UTF-8


def _replay_files(tmp: Path) -> list[Path]:
    """Files for /replay: each is wrong in its own way (the recorded run is the one good file)."""
    files = {
        "empty.json": b"",
        "binary.json": bytes(range(256)) * 64,
        "not-json.json": b"{'format': 'dart-demo-run'",
        "nested.json": b"[" * 100_000 + b"]" * 100_000,
        "list.json": b"[1, 2, 3]",
        "null.json": b"null",
        "wrong-format.json": json.dumps({"format": "something-else", "version": 1}).encode(),
        "wrong-types.json": json.dumps({"format": "dart-demo-run", "version": 1, "prompt": 5, "runs": "x",
                                        "meta": []}).encode(),
        "surrogate.json": b'{"format": "dart-demo-run", "prompt": "\\ud800"}',
        "huge-numbers.json": json.dumps({"format": "dart-demo-run", "version": 1e308, "runs": {}}).encode(),
    }
    out = []
    for name, content in files.items():
        (tmp / name).write_bytes(content)
        out.append(tmp / name)
    recorded = DATA / "recorded_run.json"
    if recorded.is_file():
        out.append(recorded)
    return out


# ---------------------------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def served(tiny_app_models, tmp_path_factory):
    from tiny_models import tiny_app_argv

    root = tmp_path_factory.mktemp("fuzz")   # the replay files
    target, *dirs = tiny_app_models
    args = app.parse_args(tiny_app_argv(*dirs, max_new_tokens=8))
    vis = Visualiser(target, args)
    # the app's launch options (show_error, upload limit, ...) on a free local port
    own = {k: v for k, v in launch_kwargs(args).items()
           if k not in ("server_name", "server_port", "share", "ssr_mode")}
    url = launch_local(vis.demo, **own)
    yield vis, url, root
    vis.demo.close()


# ---------------------------------------------------------------------------------------------- calling
class Outcome:
    def __init__(self, kind: str, detail: str):
        self.kind = kind        # "result", "error" (a clear one) or "crash"
        self.detail = detail

    def __repr__(self) -> str:
        return f"{self.kind}: {self.detail[:300]}"


def _classify_error(message: str) -> Outcome:
    if not message or message == "None" or GENERIC in message:
        return Outcome("crash", message or "an error without a message")
    return Outcome("error", message)


def _ours(traceback_text: str) -> str | None:
    """The last traceback in the server's stderr that passes through the app's or the engine's code, if any
    (Gradio prints one for every exception a request raised; its own refusals of bad input have no such frame)."""
    found = None
    for tb in traceback_text.split("Traceback (most recent call last):")[1:]:
        frames = [line for line in tb.splitlines() if line.strip().startswith("File ")]
        if any(f"{ROOT / 'app.py'}\"" in f or f"{ROOT / 'dart_core'}" in f for f in frames):
            found = tb.strip()
    return found


def _client_call(client, api_name: str, args: list) -> Outcome:
    from gradio_client.exceptions import AppError
    try:
        job = client.submit(*args, api_name=api_name)
        return Outcome("result", json.dumps(job.result(timeout=CALL_TIMEOUT_S), default=str)[:2000])
    except AppError as exc:
        return _classify_error(str(exc))
    except TimeoutError as exc:
        return Outcome("crash", f"no answer within {CALL_TIMEOUT_S} s: {exc!r}")
    except (ValueError, TypeError) as exc:   # refused by gradio_client before anything was sent
        return Outcome("error", f"client: {type(exc).__name__}: {exc}")


def _raw_call(url: str, api_name: str, body: bytes) -> Outcome:
    """Gradio's HTTP API, with a body gradio_client would not send: POST /gradio_api/call/NAME, then read the
    event stream until it completes or errs."""
    import httpx
    base = f"{url}gradio_api/call/{api_name.lstrip('/')}"
    r = httpx.post(base, content=body, headers={"Content-Type": "application/json"}, timeout=CALL_TIMEOUT_S)
    if r.status_code != 200:
        return _classify_error(f"HTTP {r.status_code}: {r.text[:500]}") if r.status_code < 500 else \
            Outcome("crash", f"HTTP {r.status_code}: {r.text[:500]}")
    event_id = r.json()["event_id"]
    event = data = None
    with httpx.stream("GET", f"{base}/{event_id}", timeout=CALL_TIMEOUT_S) as s:
        for line in s.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data = line.split(":", 1)[1].strip()
                if event in ("complete", "error"):
                    break
    if event == "complete":
        return Outcome("result", (data or "")[:2000])
    if event == "error":
        message = json.loads(data) if data else None
        return _classify_error("" if message is None else str(message))
    return Outcome("crash", f"the event stream ended with {event!r}: {data!r}")


def _raw_body(args: list) -> bytes:
    return json.dumps({"data": args}, ensure_ascii=True, allow_nan=True).encode()


def _cases(api: dict, replay_files: list[Path]) -> list[tuple[str, str, object]]:
    """(api_name, how, args-or-body) for every endpoint: how is 'client' or 'raw'."""
    from gradio_client import handle_file
    cases: list[tuple[str, str, object]] = []
    for name, ep in sorted(api["named_endpoints"].items()):
        params = ep["parameters"]
        base = []
        for p in params:
            if p["component"] == "Textbox":
                base.append(PROMPT)
            elif p["component"] == "File":
                base.append(None)
            elif p.get("parameter_has_default"):
                base.append(p["parameter_default"])
            else:
                base.append(None)
        if name in ("/run", "/step_once"):
            base[1] = 2            # few answer tokens: runs stay quick
        cases.append((name, "client", list(base)))
        numeric = [i for i, p in enumerate(params) if p["component"] not in ("File", "Textbox")
                   and p["python_type"]["type"] != "str"]
        for i, p in enumerate(params):
            if p["component"] == "File":
                pools = [("client", handle_file(str(f))) for f in replay_files]
                pools += [("client", None), ("raw", "/etc/passwd"), ("raw", 5), ("raw", [1]),
                          ("raw", {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}),
                          ("raw", {"path": str(ROOT / "app.py"), "orig_name": "app.json",
                                   "meta": {"_type": "gradio.FileData"}})]
            elif p["python_type"]["type"] == "str":
                pools = [("client", v) for v in STRINGS] + [("raw", v) for v in RAW_STRINGS]
            else:
                pools = CORE_NUMBERS + [x for j, x in enumerate(EXTRA_NUMBERS) if j % len(numeric) == numeric.index(i)]
            for how, value in pools:
                args = list(base)
                args[i] = value
                cases.append((name, how, args if how == "client" else _raw_body(args)))
        # malformed calls: wrong arity, data not a list, not JSON at all
        cases.append((name, "raw", _raw_body(base + [1, "extra"])))
        if base:
            cases.append((name, "raw", _raw_body(base[:-1])))
        cases.append((name, "raw", json.dumps({"data": {"prompt": PROMPT}}).encode()))
        cases.append((name, "raw", b"{not json"))
    return cases


def _normal_run(client) -> str:
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/run"]["parameters"]
    values = [p["parameter_default"] for p in api[1:]]
    return json.dumps(client.submit(PROMPT, *values, api_name="/run").result(timeout=120), ensure_ascii=False,
                      default=str)


def test_fuzz_every_endpoint_and_the_server_keeps_serving(served, capfd):
    import httpx
    from gradio_client import Client
    vis, url, root = served
    client = Client(url, verbose=False, download_files=False)
    api = client.view_api(return_format="dict", print_info=False)
    names = set(api["named_endpoints"])
    assert {"/run", "/step_once", "/stop", "/clear", "/show_step", "/export", "/replay"} <= names
    cases = _cases(api, _replay_files(root))
    outcomes: list[tuple[str, str, str, Outcome]] = []
    capfd.readouterr()
    t0 = time.monotonic()
    for k, (name, how, payload) in enumerate(cases):
        what = (payload[:120].decode("ascii", "replace") if isinstance(payload, bytes)
                else json.dumps(payload, default=str)[:120])
        try:
            out = _client_call(client, name, payload) if how == "client" else _raw_call(url, name, payload)
        except httpx.HTTPError as exc:
            out = Outcome("crash", f"transport: {type(exc).__name__}: {exc}")
        tb = _ours(capfd.readouterr().err)
        if tb is not None:
            out = Outcome("crash", f"{out.kind} ({out.detail[:200]}), server traceback: ...{tb[-1200:]}")
        elif out.kind == "result" and "Internal error" in out.detail:
            out = Outcome("crash", out.detail)
        outcomes.append((name, how, what, out))
        if k % 25 == 24:   # the server still answers its page between batches
            assert httpx.get(url + "config", timeout=30).status_code == 200, f"after case {k}"
    elapsed = time.monotonic() - t0
    kinds = {kind: sum(o.kind == kind for *_, o in outcomes) for kind in ("result", "error", "crash")}
    print(f"\nfuzz: {len(cases)} calls in {elapsed:.1f} s: {kinds}")
    crashes = [f"{name} ({how}) {what}: {o.detail}" for name, how, what, o in outcomes if o.kind == "crash"]
    assert not crashes, f"{len(crashes)} calls ended without a result or a clear error:\n" + "\n".join(crashes)
    # the fuzz reached every endpoint, and calls got through to the handlers as well as being refused
    assert {name for name, *_ in outcomes} == names and kinds["result"] > 0 and kinds["error"] > 0
    # the server keeps serving: a normal run, from the same session and from a new one
    for c in (client, Client(url, verbose=False, download_files=False)):
        text = _normal_run(c)
        assert "Done.**" in text and text.count("tok/s") == 3, text[:2000]
