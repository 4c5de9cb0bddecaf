"""Gradio app: DART, EAGLE-3 and a vanilla baseline side by side on one target, step by step.

The entry point the README and the Hugging Face Space run: flags, loading, serving. The page itself is the
package dart_core.page (layout, handlers, rendering, tab state, the engine pool); the engines (dart_core) decode.

    python app.py                                   # bundled SmolLM2-135M + DART head, http://127.0.0.1:7860
    python app.py --compare-eagle3                  # also EAGLE-3 (the bundled head, or --eagle3-model-name-or-path)
    python app.py --tree fixed                      # trees as the sliders set them (default: sized by measurement)
    python app.py --help
"""
from __future__ import annotations

import argparse
import logging
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no request leaves the machine

from dart_core import space  # noqa: E402  (light: no torch, no native extension)

# On a Hugging Face Space only: build the C++ extension if missing, before any module imports it (Spaces installs
# requirements.txt before copying the repository, so `.` cannot be a requirement). A no-op elsewhere.
try:
    space.bootstrap_native()
except space.NativeBuildError as _exc:
    raise SystemExit(f"error: {_exc}") from None
space.zerogpu_module()  # ZeroGPU wants `spaces` imported before torch touches CUDA (None elsewhere)

from dart_core.config import ConfigError  # noqa: E402
from dart_core.page.serve import serve  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402
from dart_core.presets import TREE_MODES  # noqa: E402
from dart_core.ui.session import RunSettings  # noqa: E402

logger = logging.getLogger("dart_app")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DART vs EAGLE-3 speculative decoding visualiser (Gradio). "
                                            "No flags: the bundled SmolLM2-135M target, DART head and N-gram "
                                            "table (CPU unless a GPU is present).")
    p.add_argument("--base-model-name-or-path", default=None,
                   help="target LLM: Hub id, local directory or .gguf file (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dart-model-name-or-path", default=None,
                   help="DART head: directory or Hub id (default: the bundled head, for the bundled target)")
    p.add_argument("--ngram-model-name-or-path", default=None,
                   help="N-gram table: .dngram / original .trie file, directory, Hub repo or 'none' (default: bundled)")
    p.add_argument("--small-ngram", "--use-small-ngram", dest="is_small_ngram", action="store_true",
                   help="in an N-gram directory or Hub repo, pick the small table (small.*) over full.* "
                        "(the API's is_small_ngram=True; --use-small-ngram is the older spelling)")
    p.add_argument("--eagle3-model-name-or-path", default=None,
                   help="EAGLE-3 head: directory or Hub id (implies --compare-eagle3)")
    p.add_argument("--compare-eagle3", action="store_true",
                   help="also run EAGLE-3 (the bundled head when none is given; the page says how to get one)")
    p.add_argument("--template-name", default=None,
                   help="chat template from TEMPLATE_REGISTRY (default: guessed from the model type)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: CUDA if present, else CPU)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bf16 where the hardware has it), bfloat16, float16, float32 (exact lossless check)")
    p.add_argument("--tree", choices=TREE_MODES, default="auto",
                   help="the page's default tree size: auto (chosen every few steps from this machine's measured "
                        "verify cost and the head's expected acceptance; the size sliders are not applied) or fixed "
                        "(the sliders, the paper's trees by default); the page can switch (default: auto)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer tokens at most per request (slider max)")
    p.add_argument("--max-length", type=int, default=2048, help="prompt + answer tokens at most (sizes the KV cache)")
    p.add_argument("--server-port", type=int, default=7860, help="port to serve on")
    p.add_argument("--listen", action="store_true", help="serve on 0.0.0.0 instead of 127.0.0.1")
    p.add_argument("--share", action="store_true", help="create a public Gradio share link (leaves the machine)")
    args = p.parse_args(argv)
    if args.max_new_tokens < 1:
        p.error("--max-new-tokens must be >= 1")
    if args.max_length < 2:
        p.error("--max-length must be >= 2")
    return args


def main(argv: list[str] | None = None) -> None:
    from dart_core.models.heads.dart import DartHeadError
    from dart_core.models.loader import load_target
    from dart_core.page.startup import cost_summary, startup_summary, warm_up

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    banner = None
    if argv is None and space.on_space():  # Spaces passes no flags: the launch settings of spaces_config.yaml
        import torch
        try:
            argv = space.space_app_argv()
        except space.SpaceConfigError as exc:
            raise SystemExit(f"error: {exc}") from None
        # without CUDA: the bundled CPU models, and a banner saying why
        argv, banner = space.cpu_fallback(argv, cuda_available=torch.cuda.is_available())
        if banner:
            logger.warning("%s", banner)
        logger.info("Space %s: launching with %s", os.environ["SPACE_ID"], " ".join(argv))
    args = parse_args(argv)
    try:
        target = load_target(args.base_model_name_or_path, dtype=args.dtype, device=args.device,
                             template_name=args.template_name)
        vis = Visualiser(target, args, banner=banner)
    except (ConfigError, DartHeadError, OSError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None
    logger.info("%s", startup_summary(target, vis.factory))
    if space.on_zerogpu():
        logger.info("ZeroGPU: no warm-up and no cost model yet (a GPU is attached only while a request runs): "
                    "the first request measures it")
    else:
        try:   # the cost model that sizes the trees (measured now, or read from the user cache)
            logger.info("%s", cost_summary(vis.factory, args.tree))
        except Exception:  # noqa: BLE001 - fixed trees still run; auto ones report the error per request
            logger.exception("measuring the cost model failed; the first request will show the error")
        try:
            warm_up(vis.factory, vis.template, max_length=args.max_length, tree=args.tree)
            if args.tree == "auto":   # the warmed-up (pooled) engines' AutoTrees: the cost view's first drawing
                vis.note_engines(vis.factory.build(RunSettings(tree="auto")))
        except Exception:  # noqa: BLE001 - the page still serves and reports each engine's error per request
            logger.exception("warm-up failed; the first request will show the error")
    serve(vis.queued(), args)


if __name__ == "__main__":
    main()
