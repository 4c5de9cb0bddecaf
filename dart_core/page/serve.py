"""Serving the page: Gradio's launch() options, and a patient wait for the page to answer before serving on."""
from __future__ import annotations

import argparse
import time
from typing import Any

import gradio as gr

from ..ui.serving import serving_limits


def launch_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """launch() options: the page's CSS, local only unless asked, SSR off (no Node server), nothing fetched from outside,
    uploads (Replay files) no larger than the serving limit ``max_upload_bytes``, and errors shown to the caller:
    Gradio refuses a value of the wrong type, a wrong number of inputs or a file path nobody uploaded before the
    handler runs, and without show_error an API caller learns only that "the app raised an exception"."""
    from .layout import PAGE_CSS

    limits = serving_limits(listen=args.listen, share=args.share)
    return dict(css=PAGE_CSS, server_name="0.0.0.0" if args.listen else "127.0.0.1", server_port=args.server_port,
                share=args.share, ssr_mode=False, max_file_size=limits.max_upload_bytes, show_error=True)


PAGE_WAIT_S = 120.0   # how long serve() waits for its own page to answer before it gives up
PAGE_OK = (200, 301, 302, 303, 307, 308, 401)   # the answers Gradio's own check accepts


def wait_for_page(url: str, timeout_s: float = PAGE_WAIT_S, bad_answers: int = 5) -> str | None:
    """Poll ``url`` with HEAD (as Gradio's start-up check does) until it answers: None once it did, else what
    went wrong. Gradio's check (networking.url_ok) gives up at the first 3-second timeout, which a fully loaded
    2-core machine can exceed on a healthy page; this one retries timeouts and refused connections until
    ``timeout_s`` and gives up after ``bad_answers`` answers that are not OK, so a page that never works still
    fails (localhost blocked by a proxy, a server that died)."""
    import httpx
    deadline = time.monotonic() + timeout_s
    problem, bad = "no answer", 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"the page at {url} did not answer within {timeout_s:.0f} s ({problem})"
        try:
            r = httpx.head(url, timeout=min(30.0, max(left, 1.0)))
            if r.status_code in PAGE_OK:
                return None
            bad += 1
            problem = f"HEAD answered {r.status_code}"
            if bad >= bad_answers:
                return f"the page at {url} answered {r.status_code} {bad} times"
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))


def serve(demo: gr.Blocks, args: argparse.Namespace, page_wait_s: float = PAGE_WAIT_S) -> None:
    """launch() the (queued) page and block until the server stops. Gradio's own reachability check is replaced
    by ``wait_for_page`` (same request, patient on a busy machine, still fails when the page never answers);
    with --share Gradio skips that check itself, and so does this."""
    import inspect
    kwargs = launch_kwargs(args)
    own_check = not args.share and "_frontend" in inspect.signature(demo.launch).parameters
    if own_check:
        kwargs["_frontend"] = False   # in Gradio 6 this flag gates only the url_ok() check
    demo.launch(**kwargs, prevent_thread_lock=True)
    if own_check:
        problem = wait_for_page(demo.local_url, page_wait_s)
        if problem:
            demo.close()
            raise SystemExit(f"error: {problem}. Check that nothing (an HTTP proxy setting, a firewall) keeps "
                             "this process from reaching localhost, or use --share.")
    demo.block_thread()
