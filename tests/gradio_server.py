"""Serving a Gradio demo on a free local port for the app tests (gradio_client and the browser test)."""
from __future__ import annotations

import socket
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(demo, **kwargs) -> str:
    """Serve ``demo`` on a free local port and return its URL. Gradio's start-up probe gives up after
    five 3-second checks, which a heavily loaded machine can exceed: try a few times before failing."""
    for attempt in range(4):
        port = free_port()
        try:
            demo.queue(default_concurrency_limit=1).launch(server_name="127.0.0.1", server_port=port,
                                                           prevent_thread_lock=True, ssr_mode=False, quiet=True,
                                                           **kwargs)
            return f"http://127.0.0.1:{port}/"
        except ValueError as exc:
            if "localhost is not accessible" not in str(exc):
                raise
            status = _probe(f"http://127.0.0.1:{port}/")
            demo.close()
            if attempt == 3:
                raise AssertionError(f"the app did not come up on 127.0.0.1:{port} ({status}) after 4 tries") from exc
            time.sleep(2.0)
    raise AssertionError("unreachable")


def _probe(url: str) -> str:
    """What the start-up probe saw, for the failure message."""
    import httpx
    try:
        r = httpx.head(url, timeout=10)
        return f"HEAD / answered {r.status_code}: {r.text[:300]!r}"
    except Exception as exc:  # noqa: BLE001 - any failure is the diagnosis
        return f"HEAD / failed: {type(exc).__name__}: {exc}"
