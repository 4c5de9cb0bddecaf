"""Fixtures of the training tests."""
import pytest


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny llama target and a small self-distilled corpus (its own greedy answers), from
    tiny_models.make_tiny_distill: (model dir, TargetModel, corpus path, rows)."""
    from tiny_models import make_tiny_distill

    return make_tiny_distill(tmp_path_factory.mktemp("tiny-distill"))
