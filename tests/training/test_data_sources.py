"""A distillation corpus given as a Hub dataset id (``python -m dart_core.train ... --data owner/name[:file]``)
resolves through huggingface_hub: from the Hugging Face cache (offline), else the Hub when online. Every test
runs offline against a fake cache in tmp_path (the conftest's hub_cache); the named question sets of the
benchmark are tested in test_bench.py."""
from __future__ import annotations

import json

import pytest

from dart_core.data_sources import HubFile
from dart_core.training.data import DataError, hub_dataset_id, load_distill_rows


def _distill(n: int = 3) -> str:
    return "".join(json.dumps({"id": f"r{i}", "prompt_ids": [1, 2], "response_ids": [3, 4, 5]}) + "\n"
                   for i in range(n))


def test_hub_dataset_ids():
    assert hub_dataset_id("owner/name") == ("owner/name", None)
    assert hub_dataset_id("owner/name:data/x.jsonl.gz") == ("owner/name", "data/x.jsonl.gz")
    assert hub_dataset_id("runs/corpus.jsonl.gz") is None            # a missing local file, not a repository
    assert hub_dataset_id("/abs/path/x.jsonl") is None and hub_dataset_id("x.jsonl") is None


def test_distill_rows_from_the_hub_cache(hub_cache):
    hub_cache.put(HubFile("someone/distill", "a.jsonl.gz"), _distill(3))
    rows = load_distill_rows("someone/distill:a.jsonl.gz")
    assert [r.id for r in rows] == ["r0", "r1", "r2"]
    assert len(load_distill_rows("someone/distill")) == 3   # the dataset's one corpus file
    hub_cache.put(HubFile("someone/distill", "b.jsonl"), _distill(1))
    with pytest.raises(DataError, match="holds 2 .jsonl"):
        load_distill_rows("someone/distill")
    assert len(load_distill_rows("someone/distill:b.jsonl")) == 1


def test_a_local_file_wins_over_a_hub_id(hub_cache, tmp_path, monkeypatch):
    local = tmp_path / "someone" / "distill"
    local.parent.mkdir()
    local.write_text(_distill(2))
    hub_cache.put(HubFile("someone/distill", "a.jsonl"), _distill(3))
    monkeypatch.chdir(tmp_path)
    assert len(load_distill_rows("someone/distill")) == 2


def test_offline_and_not_cached_says_how_to_fetch(hub_cache, tmp_path):
    with pytest.raises(DataError) as exc:
        load_distill_rows("someone/missing:c.jsonl")
    assert "hf download someone/missing c.jsonl --repo-type dataset" in str(exc.value)
    assert "HF_HUB_OFFLINE" in str(exc.value)
    with pytest.raises(DataError, match="hf download someone/missing --repo-type dataset"):
        load_distill_rows("someone/missing")
    with pytest.raises(DataError, match="does not exist"):
        load_distill_rows(tmp_path / "nope.jsonl")
