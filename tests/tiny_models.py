"""Tiny random target models for tests: a few layers, hidden 64, a byte-level BPE tokenizer.

    path = make_tiny_model_dir(tmp_path, model_type="llama")   # or "qwen3"
    target = load_target(str(path), dtype="float32", device="cpu")

The directory holds ``config.json`` + weights + a ``PreTrainedTokenizerFast`` that
``AutoTokenizer`` loads offline. The tokenizer is byte-level, so any text encodes,
and it knows the ChatML markers (``<|im_start|>``, ``<|im_end|>``) the chat templates
spell out; ``<|im_end|>`` is the model's EOS. Weights are seeded (same seed -> same
model) and drawn with a wide ``initializer_range`` so logits are far from ties and
fp32 argmax comparisons between differently shaped forwards are stable.
"""
from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face.",
    "Compose an engaging travel blog post about a recent trip to Hawaii.",
    "Write a Python function that returns the sum of a list of numbers.",
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. The dog sleeps.",
    "What is 12 times 7? The answer is 84. Explain your reasoning step by step.",
    "system user assistant question answer the of and to in is that for it with as on",
]


def make_tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on a few sentences (vocab_size ids in all)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   unk_token=None, pad_token="<|endoftext|>")


def make_tiny_model_dir(tmp_path, model_type: str = "llama", *, seed: int = 0, num_hidden_layers: int = 4,
                        initializer_range: float = 0.5, vocab_size: int = 320, name: str | None = None) -> Path:
    """Save a tiny random ``model_type`` ("llama", "qwen2" or "qwen3") causal LM + tokenizer under ``tmp_path``.

    Returns the model directory (``tmp_path / name``, default ``tiny-{model_type}-{seed}``).
    """
    import torch
    from transformers import AutoModelForCausalLM

    if model_type not in ("llama", "qwen2", "qwen3"):
        raise ValueError(f"model_type must be 'llama', 'qwen2' or 'qwen3', got {model_type!r}")
    out = Path(tmp_path) / (name or f"tiny-{model_type}-{seed}")
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tiny_tokenizer(vocab_size)
    n_vocab = len(tokenizer)  # the trainer may stop short of vocab_size
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    common = dict(hidden_size=64, num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, vocab_size=n_vocab,
                  max_position_embeddings=2048, initializer_range=initializer_range,
                  eos_token_id=eos, pad_token_id=pad, bos_token_id=None, tie_word_embeddings=False)
    if model_type == "llama":
        from transformers import LlamaConfig
        config = LlamaConfig(**common)
    elif model_type == "qwen2":   # q/k/v projections with bias
        from transformers import Qwen2Config
        config = Qwen2Config(**common)
    else:
        from transformers import Qwen3Config
        config = Qwen3Config(head_dim=16, **common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def make_tiny_distill(root: Path):
    """A tiny llama target and a small self-distilled corpus (its own greedy answers) under ``root``:
    returns (model dir, TargetModel, corpus path, rows) for the trainer tests."""
    import gzip
    import json

    import torch

    from dart_core.config import GenerationConfig
    from dart_core.engine.decoding import SpeculativeEngine
    from dart_core.models.loader import load_target

    d = make_tiny_model_dir(root, "llama")
    t = load_target(str(d), dtype="float32", device="cpu")
    eng = SpeculativeEngine(t)
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(24):
        prompt = torch.randint(3, t.vocab_size, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g).tolist()
        resp = eng.generate(prompt, GenerationConfig(max_new_tokens=30, max_length=80)).tokens
        rows.append({"id": f"row{i}", "source": "alpaca", "prompt_ids": prompt, "response_ids": resp})
    data = root / "distill.jsonl.gz"
    with gzip.open(data, "wt") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return d, t, data, rows


def make_tiny_app_models(root: Path):
    """A tiny fp32 llama target with random DART and EAGLE-3 heads saved under ``root`` (what the app tests load
    through the CLI flags): returns (TargetModel, model dir, DART head dir, EAGLE-3 head dir)."""
    from dart_core.models.heads.dart import new_head_for_target, save_dart_head
    from dart_core.models.heads.eagle3 import new_eagle3_head_for_target, save_eagle3_head
    from dart_core.models.loader import load_target

    model_dir = make_tiny_model_dir(root)
    target = load_target(str(model_dir), dtype="float32", device="cpu")
    dart_dir = save_dart_head(new_head_for_target(target, draft_length=4, seed=1), root / "dart", dtype=None)
    eagle_dir = save_eagle3_head(new_eagle3_head_for_target(target, seed=2), root / "eagle3", dtype=None)
    return target, model_dir, dart_dir, eagle_dir


def tiny_app_argv(model_dir, dart_dir, eagle_dir, max_new_tokens: int) -> list[str]:
    """app.py flags that load those models (no N-gram table)."""
    return ["--base-model-name-or-path", str(model_dir), "--dart-model-name-or-path", str(dart_dir),
            "--ngram-model-name-or-path", "none", "--eagle3-model-name-or-path", str(eagle_dir),
            "--max-new-tokens", str(max_new_tokens), "--max-length", "256"]


def stand_in_drafter(kind: str = "dart", draft_length: int = 8):
    """A drafter of ``kind`` ("dart" / "eagle3") with tree settings only (the paper's PruningConfig, the published
    Eagle3TreeConfig) and a head config: what an AutoTree reads and sets. Nothing runs it."""
    from types import SimpleNamespace

    from dart_core.drafters.eagle3 import Eagle3TreeConfig
    from dart_core.drafters.pruning import PruningConfig
    from dart_core.engine.protocol import TreeHolder
    fake = TreeHolder()
    fake.tree_kind, fake._tree_config = kind, PruningConfig() if kind == "dart" else Eagle3TreeConfig()
    fake.name, fake.needs_aux = kind, True
    fake.head = SimpleNamespace(config=SimpleNamespace(draft_length=draft_length, draft_vocab_size=8192))
    return fake
