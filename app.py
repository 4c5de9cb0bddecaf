"""Gradio app: run a speculative decoder on the target and stream the answer with live statistics.

UI and CLI only: the engine (dart_core) does all decoding; this file builds engines from
flags and renders their StepTrace stream. The side-by-side DART / EAGLE-3 visualiser
grows here in later issues; today it offers DART (when a head is available), prompt
lookup and vanilla decoding, one at a time.

    python app.py                      # bundled SmolLM2-135M on CPU, http://127.0.0.1:7860
    python app.py --help
"""
from __future__ import annotations

import argparse
import logging
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # offline: no request leaves the machine

import gradio as gr  # noqa: E402

from dart_core.config import ConfigError, GenerationConfig  # noqa: E402
from dart_core.decoding import SpeculativeEngine  # noqa: E402
from dart_core.drafters import PromptLookupDrafter  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from dart_core.templates import encode_chat, get_template  # noqa: E402

logger = logging.getLogger("dart_app")

METHODS = {
    "prompt_lookup": lambda target: SpeculativeEngine(target, PromptLookupDrafter()),
    "vanilla": lambda target: SpeculativeEngine(target),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="DART speculative decoding demo (Gradio).")
    p.add_argument("--base-model-name-or-path", default=None,
                   help="target LLM: Hub id, local directory or .gguf file (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dart-model-name-or-path", default=None,
                   help="DART head: directory or Hub id (default: the bundled head, for the bundled target)")
    p.add_argument("--ngram-model-name-or-path", default=None,
                   help="N-gram table: .dngram / original .trie file, directory, Hub repo or 'none' (default: bundled)")
    p.add_argument("--template-name", default=None,
                   help="chat template from TEMPLATE_REGISTRY (default: guessed from the model type)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 where the hardware has it), bfloat16, float16, float32")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer tokens at most per request")
    p.add_argument("--max-length", type=int, default=2048, help="prompt + answer tokens at most (sizes the KV cache)")
    p.add_argument("--server-port", type=int, default=7860, help="port to serve on")
    p.add_argument("--listen", action="store_true", help="serve on 0.0.0.0 instead of 127.0.0.1")
    p.add_argument("--share", action="store_true", help="create a public Gradio share link")
    return p.parse_args(argv)


def make_dart_engine(target, args):
    """DART engine from --dart-model-name-or-path / --ngram-model-name-or-path, or the bundled head; None if
    no head is available (the page then offers the other methods and says why)."""
    from dart_core.api import bundled_head_dir, is_bundled_target, load_head_and_ngram
    from dart_core.drafters.dart import DartDrafter

    if args.dart_model_name_or_path is None and not (
            is_bundled_target(args.base_model_name_or_path) and (bundled_head_dir() / "config.json").is_file()):
        logger.warning("no DART head for this target: pass --dart-model-name-or-path")
        return None
    head, store = load_head_and_ngram(target, args.base_model_name_or_path, args.dart_model_name_or_path,
                                      args.ngram_model_name_or_path)
    from dart_core.pruning import default_pruning
    return SpeculativeEngine(target, DartDrafter(head, store, target.eos_token_ids,
                                                 pruning=default_pruning(target.name)))


def build_demo(target, args) -> gr.Blocks:
    engines = {name: make(target) for name, make in METHODS.items()}
    dart = make_dart_engine(target, args)
    if dart is not None:
        engines = {"dart": dart, **engines}
    template = get_template(args.template_name or target.template_name)

    def run(prompt: str, method: str, max_new_tokens: float, temperature: float):
        try:
            config = GenerationConfig(max_new_tokens=int(max_new_tokens), max_length=args.max_length,
                                      temperature=float(temperature))
            if not prompt or not prompt.strip():
                raise ConfigError("the prompt is empty: type a question first")
            ids = encode_chat(target.tokenizer, template, [{"role": "user", "content": prompt}])
            engine = engines[method]
            stream = engine.stream(ids, config)
            answer: list[int] = []
            while True:
                try:
                    trace = next(stream)
                except StopIteration as done:
                    result = done.value
                    break
                answer.extend(trace.emitted_tokens)
                yield engine.decode_answer(answer), f"step {trace.step}: accepted {trace.accepted_drafts} drafts"
            s = result.stats
            yield result.text, (f"{s.new_tokens} tokens in {s.wall_s:.2f} s ({s.tokens_per_s:.1f} tok/s), "
                                f"tau {s.tau:.2f} over {s.steps} steps, stopped by {s.stop_reason}")
        except (ConfigError, ValueError) as exc:
            yield "", f"Error: {exc}"

    with gr.Blocks(title="DART speculative decoding") as demo:
        gr.Markdown(f"## Speculative decoding demo\nTarget: `{target.name}` ({target.dtype}, {target.device})")
        with gr.Row():
            prompt = gr.Textbox(label="Prompt", lines=4, placeholder="Ask something…")
        with gr.Row():
            method = gr.Dropdown(list(engines), value=next(iter(engines)), label="Method")
            max_new = gr.Slider(1, args.max_new_tokens, value=min(128, args.max_new_tokens), step=1,
                                label="Max new tokens")
            temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
        go = gr.Button("Generate", variant="primary")
        answer = gr.Textbox(label="Answer", lines=12)
        status = gr.Markdown()
        go.click(run, [prompt, method, max_new, temperature], [answer, status])
    return demo


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    target = load_target(args.base_model_name_or_path, dtype=args.dtype, device=args.device,
                         template_name=args.template_name)
    logger.info("serving %s (%s on %s)", target.name, target.dtype, target.device)
    demo = build_demo(target, args)
    demo.queue(default_concurrency_limit=1).launch(
        server_name="0.0.0.0" if args.listen else "127.0.0.1", server_port=args.server_port,
        share=args.share, ssr_mode=False)


if __name__ == "__main__":
    main()
