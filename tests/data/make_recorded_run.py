"""Record tests/data/recorded_run.json: a short greedy DART + vanilla run on the bundled target (fp32, CPU),
exported exactly as the app's "Export traces" button does. Small trees keep the file small.

    python tests/data/make_recorded_run.py [DART_HEAD_DIR]     # default: the bundled head
"""
from __future__ import annotations

import sys
from pathlib import Path

from dart_core.page.engines import EngineFactory
from dart_core.ui.record import save_export
from dart_core.ui.session import Comparison, RunSettings
from dart_core.models.loader import load_target
from dart_core.models.templates import encode_chat, get_template

PROMPT = "Write a Python function that checks whether a string is a palindrome."


def main() -> None:
    target = load_target(None, dtype="float32", device="cpu")
    head = sys.argv[1] if len(sys.argv) > 1 else None
    factory = EngineFactory.from_flags(target, dart_model_name_or_path=head)
    settings = RunSettings(max_new_tokens=24, budget=16, beam_width=4, level_top_k=6)
    ids = encode_chat(target.tokenizer, get_template(target.template_name), [{"role": "user", "content": PROMPT}])
    cmp = Comparison(factory.build(settings), ids, settings.generation_config(2048), decode=target.tokenizer,
                     prompt=PROMPT, meta={"target": target.name, "dtype": "float32", "device": "cpu",
                                          "settings": settings.to_dict(), "recorded_at": "2026-11-29T12:45:00+00:00",
                                          "dart_head": "trained 51 min on CPU (runs/dart-smollm2-51min)"
                                          if head else "bundled"})
    for _ in cmp.run():
        pass
    out = save_export(cmp.record, Path(__file__).with_name("recorded_run.json"))
    print(out, out.stat().st_size, {n: (len(r.tokens), r.tau) for n, r in cmp.record.runs.items()})


if __name__ == "__main__":
    main()
