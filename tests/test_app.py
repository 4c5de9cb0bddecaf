"""The app's CLI and page build on a tiny target; a request streams an answer and bad input shows a message."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import app  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from tiny_models import make_tiny_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return load_target(str(make_tiny_model_dir(tmp_path_factory.mktemp("app"))), dtype="float32", device="cpu")


def test_cli_defaults_are_the_bundled_model_on_cpu_or_auto():
    args = app.parse_args([])
    assert args.base_model_name_or_path is None and args.dtype == "auto" and args.server_port == 7860


def test_page_builds_and_streams(tiny_target):
    args = app.parse_args(["--max-new-tokens", "16"])
    demo = app.build_demo(tiny_target, args)
    handler = next(fn for fn in demo.fns.values() if fn.name == "run").fn
    outputs = list(handler("Write a Python function.", "prompt_lookup", 8, 0.0))
    final_text, final_status = outputs[-1]
    assert "tau" in final_status and "8 tokens" in final_status
    errors = list(handler("   ", "vanilla", 8, 0.0))
    assert errors[-1][1].startswith("Error:") and "empty" in errors[-1][1]
    bad = list(handler("hi", "vanilla", 8, -1.0))
    assert "temperature" in bad[-1][1]


def test_page_offers_dart_with_a_head(tiny_target, tmp_path):
    from dart_core.models.dart_head import new_head_for_target, save_dart_head
    head_dir = save_dart_head(new_head_for_target(tiny_target, draft_length=4, seed=1), tmp_path / "head", dtype=None)
    args = app.parse_args(["--base-model-name-or-path", "tiny", "--dart-model-name-or-path", str(head_dir),
                           "--ngram-model-name-or-path", "none"])
    demo = app.build_demo(tiny_target, args)
    handler = next(fn for fn in demo.fns.values() if fn.name == "run").fn
    final_text, final_status = list(handler("Write a Python function.", "dart", 8, 0.0))[-1]
    assert "tau" in final_status, final_status
