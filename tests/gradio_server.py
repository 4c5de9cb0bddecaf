"""Serving a Gradio demo on a free local port for the app tests (gradio_client and the browser test)."""
from __future__ import annotations

import socket


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
            if "localhost is not accessible" not in str(exc) or attempt == 3:
                raise
            demo.close()
    raise AssertionError("unreachable")
