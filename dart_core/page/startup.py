"""Serving start-up for app.py (no Gradio here): the log lines naming what was loaded and the cost model that
sizes the trees, and a warm-up.

    factory = EngineFactory.from_flags(target, ...)
    logger.info("%s", startup_summary(target, factory))   # target, heads, N-gram table, dtype, device
    logger.info("%s", cost_summary(factory, "auto"))        # measures (or reads) the target's cost model
    warm_up(factory, template, max_length=2048)            # a few tokens per engine before the first request

The warm-up runs each engine the page will use (same tree settings, same KV-cache size) for a few tokens, so the
first request does not pay for CUDA context set-up, kernel selection and cache allocation. On ZeroGPU hardware a
GPU exists only inside ``spaces.GPU`` calls: app.py skips the warm-up there (see ``space.on_zerogpu``).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..config import dtype_name
from ..models.templates import encode_chat
from ..ui.record import label_of
from ..ui.session import RunSettings
from .engines import EngineFactory

logger = logging.getLogger(__name__)

WARMUP_PROMPT = "Hello!"
WARMUP_TOKENS = 4


def startup_summary(target: Any, factory: EngineFactory) -> str:
    """One line: target (dtype, device, attention), each head's source, the N-gram table, and the engines."""
    attn = getattr(getattr(target, "config", None), "_attn_implementation", None)
    backend = getattr(target, "forward_backend", None)
    parts = [f"target {target.name} ({dtype_name(target.dtype)} on {target.device}"
             + (f", {attn} attention" if attn else "") + (f", forward: {backend})" if backend else ")")]
    for name, head in (("DART", factory.dart_head), ("EAGLE-3", factory.eagle3_head)):
        if head is not None:
            parts.append(f"{name} head {getattr(head, 'source', '?')}")
    if factory.dart_head is not None:
        store = factory.ngram
        parts.append("N-gram table " + (f"{store.path} (order {store.order}, {store.node_count:,} nodes)"
                                        if store is not None else "none (pruning by the head's logits only)"))
    parts.append("engines " + ", ".join(label_of(n) for n in factory.names))
    if factory.unavailable:
        parts.append("unavailable " + ", ".join(label_of(n) for n in factory.unavailable))
    return "startup: " + "; ".join(parts)


def cost_summary(factory: EngineFactory, tree: str = "auto") -> str:
    """One line naming the target's cost model on this machine (``factory.costs``: measured now, or read from
    the user cache), which sizes the trees in ``tree`` mode "auto" and draws the page's *Cost of a tree*."""
    t0 = time.perf_counter()
    costs = factory.costs
    spent = time.perf_counter() - t0
    how = ("trees sized automatically" if tree == "auto"
           else "trees fixed (--tree fixed; the page can switch to auto)")
    source = str(getattr(costs, "source", "measured"))
    if source.startswith("cached"):
        source += f", read in {spent:.2f} s"
    v = costs.verify
    points = ", ".join(f"{int(n)}: {1e3 * float(t):.1f}" for n, t in zip(v.sizes, v.seconds))
    keys = f", {v.key_text()}" if v.key_text() else ""
    return (f"{how}: cost model {source}: verify ms by nodes {{{points}}}{keys}, commit {1e3 * costs.commit_s:.2f} ms")


def warm_up(factory: EngineFactory, template: Any, *, max_length: int, max_new_tokens: int = WARMUP_TOKENS,
            prompt: str = WARMUP_PROMPT, tree: str = "auto") -> dict[str, float]:
    """Generate ``max_new_tokens`` tokens (greedy) with every engine at the page's default settings (``tree``:
    the page's default tree mode), which builds and caches the very engines (and KV caches of ``max_length``)
    the first request reuses. Returns seconds per engine."""
    settings = RunSettings(max_new_tokens=max_new_tokens, tree=tree)
    config = settings.generation_config(max_length)
    ids = encode_chat(factory.target.tokenizer, template, [{"role": "user", "content": prompt}])
    seconds: dict[str, float] = {}
    for name, engine in factory.build(settings).items():
        t0 = time.perf_counter()
        engine.generate(ids, config)
        seconds[name] = time.perf_counter() - t0
    logger.info("warm-up: %s", ", ".join(f"{label_of(n)} {s:.2f} s" for n, s in seconds.items()))
    return seconds
