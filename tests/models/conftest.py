"""Fixtures of the model tests (targets and the draft heads on them)."""
import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny random targets in float32, their directories and the loaded models, by name: "llama", "llama_other"
    (another seed: same shapes, other weights) and "qwen3" (another architecture). Returns (dirs, targets)."""
    from dart_core.models.loader import load_target
    from tiny_models import make_tiny_model_dir

    root = tmp_path_factory.mktemp("tiny")
    dirs = {name: make_tiny_model_dir(root, mt, seed=seed, name=name)
            for name, mt, seed in (("llama", "llama", 0), ("llama_other", "llama", 1), ("qwen3", "qwen3", 0))}
    targets = {name: load_target(str(d), dtype="float32", device="cpu") for name, d in dirs.items()}
    return dirs, targets
