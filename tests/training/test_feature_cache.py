"""The target-feature cache: what it stores equals the trainers' own features, a killed pass resumes,
a damaged or foreign cache is refused, and both trainers read it. Tiny random targets only."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from dart_core.training import feature_cache as fc
from dart_core.training.data import DistillRow, load_distill_rows, truncate
from dart_core.training.features import compute_features


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DART_CACHE", str(tmp_path / "user_cache"))
    return tmp_path / "user_cache"


def build(t, data, out, **kw):
    kw.setdefault("progress", False)
    return fc.build_feature_cache(t, data, out, **kw)


def draft_subset(V: int) -> torch.Tensor:
    return torch.arange(0, V, 3)      # a draft vocabulary that leaves most ids out


def test_cached_features_equal_the_trainers_features(tiny, tmp_path):
    _, t, data, _ = tiny
    path = build(t, data, tmp_path / "c", top_k=t.vocab_size, chunk_rows=5)
    cache = fc.FeatureCache(path, t, data)
    draft = draft_subset(t.vocab_size)
    for row in load_distill_rows(data)[:6]:
        ref = compute_features(t, row.ids, len(row.prompt_ids), draft, "full")
        got = cache.features(row, draft, aux_dtype=torch.float32)
        assert got.prompt_len == ref.prompt_len and torch.equal(got.ids, ref.ids)
        # aux is stored as bf16: equal to the reference rounded to bf16
        assert torch.equal(got.aux, ref.aux.to(torch.bfloat16).float())
        assert torch.equal(got.argmax, ref.argmax)
        # the same distribution over the draft vocabulary (log-probs kept in float16)
        torch.testing.assert_close(torch.softmax(got.logits, -1), torch.softmax(ref.logits, -1), atol=2e-3, rtol=0)


def test_top_k_keeps_the_most_likely_tokens_and_a_truncated_row_is_a_prefix(tiny, tmp_path):
    _, t, data, _ = tiny
    path = build(t, data, tmp_path / "c", top_k=4)
    cache = fc.FeatureCache(path, t, data)
    assert fc.cache_status(path).kept_mass <= 1.0
    full_draft = torch.arange(t.vocab_size)
    row = max(load_distill_rows(data), key=len)
    feats = cache.features(row, full_draft)
    assert (torch.isfinite(feats.logits).sum(-1) == 4).all()
    ref = compute_features(t, row.ids, len(row.prompt_ids), full_draft, "full")
    top = ref.logits.topk(4, -1).indices.sort(-1).values
    assert torch.equal(torch.isfinite(feats.logits).nonzero()[:, 1].view(-1, 4).sort(-1).values, top)
    short = truncate(row, len(row.prompt_ids) + 3)
    cut = cache.features(short, full_draft)
    assert cut.length == len(short) and cut.logits.shape[0] == 2
    assert torch.equal(cut.aux, feats.aux[:len(short)]) and torch.equal(cut.logits, feats.logits[:2])


def test_a_killed_pass_resumes_losing_at_most_one_chunk(tiny, tmp_path, monkeypatch):
    _, t, data, _ = tiny
    whole = build(t, data, tmp_path / "whole", chunk_rows=4)
    real = fc.target_states
    calls = {"n": 0}

    def dies_at_row_10(target, x, P):
        calls["n"] += 1
        if calls["n"] == 11:
            raise KeyboardInterrupt
        return real(target, x, P)

    monkeypatch.setattr(fc, "target_states", dies_at_row_10)
    with pytest.raises(KeyboardInterrupt):
        build(t, data, tmp_path / "killed", chunk_rows=4)
    st = fc.cache_status(tmp_path / "killed")
    assert st.rows_done == 8 and not st.complete          # chunks [0,4) and [4,8) done; row 10 died in [8,12)
    with pytest.raises(fc.FeatureCacheError, match="incomplete"):
        fc.FeatureCache(tmp_path / "killed", t, data)
    monkeypatch.setattr(fc, "target_states", real)
    build(t, data, tmp_path / "killed", chunk_rows=4)
    assert fc.cache_status(tmp_path / "killed").complete
    for name in fc.FILES:
        assert (whole / f"{name}.bin").read_bytes() == (tmp_path / "killed" / f"{name}.bin").read_bytes(), name
    assert fc.cache_status(whole).elapsed_s > 0


def test_a_cache_of_another_corpus_or_target_is_refused(tiny, tmp_path):
    d, t, data, rows = tiny
    path = build(t, data, tmp_path / "c")
    other = tmp_path / "other.jsonl.gz"
    with gzip.open(other, "wt") as f:
        for r in rows[:-1]:
            f.write(json.dumps(r) + "\n")
    with pytest.raises(fc.FeatureCacheError, match="built for"):
        fc.FeatureCache(path, t, other)
    with pytest.raises(fc.FeatureCacheError, match="another target, corpus"):
        build(t, other, path)
    # the same architecture with other weights is another target
    from dart_core.models.loader import load_target
    from tiny_models import make_tiny_model_dir

    t2 = load_target(str(make_tiny_model_dir(tmp_path / "m2", "llama", seed=5)), dtype="float32", device="cpu")
    with pytest.raises(fc.FeatureCacheError, match="built for"):
        fc.FeatureCache(path, t2, data)
    with pytest.raises(fc.FeatureCacheError, match="not a feature cache"):
        fc.FeatureCache(tmp_path / "nowhere", t, data)
    with pytest.raises(fc.FeatureCacheError, match="not in the feature cache"):
        fc.FeatureCache(path, t, data).features(DistillRow("stranger", [1, 2], [3, 4]), torch.arange(4))


def test_a_damaged_cache_is_refused_where_it_is_read(tiny, tmp_path):
    _, t, data, _ = tiny
    path = build(t, data, tmp_path / "c", chunk_rows=4)
    rows = load_distill_rows(data)
    meta = json.loads((path / "meta.json").read_text())
    tok_of_row_5 = meta["table"][5][2]
    raw = bytearray((path / "aux.bin").read_bytes())
    raw[tok_of_row_5 * meta["aux_dim"] * 2 + 7] ^= 0x40
    (path / "aux.bin").write_bytes(bytes(raw))
    cache = fc.FeatureCache(path, t, data)
    cache.features(rows[0], torch.arange(t.vocab_size))              # chunk 0 is intact
    with pytest.raises(fc.FeatureCacheError, match=r"rows 4-7 of aux.bin do not match"):
        cache.features(rows[5], torch.arange(t.vocab_size))


def _truncate_aux(path):
    raw = (path / "aux.bin").read_bytes()
    (path / "aux.bin").write_bytes(raw[: len(raw) // 2])


def _drop_last_record(path):
    prog = json.loads((path / "progress.json").read_text())
    prog["chunks"] = prog["chunks"][:-1]                      # "complete": true stays
    (path / "progress.json").write_text(json.dumps(prog))


def _rank_file_out_of_range(path):
    prog = json.loads((path / "progress.json").read_text())
    rec = dict(prog["chunks"][0], rows=[400, 404])
    (path / "progress.rank1.json").write_text(json.dumps({"chunks": [rec]}))


@pytest.mark.parametrize("damage,expect", [
    (_truncate_aux, "aux.bin holds .* bytes, not the"),
    (lambda p: (p / "aux.bin").unlink(), "aux.bin is missing"),
    (lambda p: (p / "progress.json").write_text("{garbage"), "progress.json is not JSON"),
    (lambda p: (p / "progress.rank1.json").write_text("[1, 2"), "progress.rank1.json is not JSON"),
    (lambda p: (p / "meta.json").write_text("[]"), "meta.json is not a JSON object"),
    (_drop_last_record, "is incomplete"),
    (_rank_file_out_of_range, r"records rows \[400, 404\], not a chunk"),
])
def test_a_damaged_cache_names_the_damage_and_the_rebuild(tiny, tmp_path, damage, expect):
    """Whatever part of a cache is damaged, reading it is a FeatureCacheError that says what and how to rebuild
    (never a raw mmap, JSON or index error); the trainers' automatic lookup then runs without it."""
    _, t, data, _ = tiny
    path = build(t, data, tmp_path / "c", chunk_rows=4)
    damage(path)
    with pytest.raises(fc.FeatureCacheError, match=expect) as info:
        fc.FeatureCache(path, t, data)
    assert "python -m dart_core.train features" in str(info.value)


@pytest.mark.parametrize("id_dtype,bad", [(np.int32, -3), (np.int32, 10**6), (np.uint16, 65535)])
def test_ids_outside_the_vocabulary_are_refused_even_with_matching_checksums(tiny, tmp_path, monkeypatch,
                                                                             id_dtype, bad):
    # Issue 27: a tampered cache (checksums recomputed) with a negative id indexed t2d backwards, silently.
    _, t, data, _ = tiny
    monkeypatch.setattr(fc, "_id_dtype", lambda vocab_size: np.dtype(id_dtype))   # int32: as for a large vocabulary
    path = build(t, data, tmp_path / "c", chunk_rows=4, top_k=4)
    rows = load_distill_rows(data)
    meta = json.loads((path / "meta.json").read_text())
    ids = np.memmap(path / "topk_ids.bin", dtype=meta["id_dtype"], mode="r+", shape=(meta["answer_rows"], 4))
    ids[meta["table"][5][3], 1] = bad
    ids.flush()
    del ids
    prog = json.loads((path / "progress.json").read_text())
    cache = fc.FeatureCache(path, t, data)
    arrays = fc._open_arrays(path, meta, "r")
    prog["chunks"][1]["sha256"] = fc._digests(fc._chunk_bytes(arrays, cache.table, 4, 8))
    (path / "progress.json").write_text(json.dumps(prog))
    cache = fc.FeatureCache(path, t, data)
    cache.features(rows[0], torch.arange(t.vocab_size))              # chunk 0 is intact
    with pytest.raises(fc.FeatureCacheError, match=rf"rows 4-7 of topk_ids.bin hold token id {bad}, outside"):
        cache.features(rows[5], torch.arange(t.vocab_size))


def test_bad_build_arguments_are_refused(tiny, tmp_path):
    _, t, data, _ = tiny
    with pytest.raises(fc.FeatureCacheError, match="--top-k"):
        build(t, data, tmp_path / "a", top_k=0)
    with pytest.raises(fc.FeatureCacheError, match="--chunk-rows"):
        build(t, data, tmp_path / "b", chunk_rows=0)


@pytest.mark.parametrize("method", ["dart", "eagle3"])
def test_both_trainers_read_the_cache(tiny, tmp_path, user_cache, method):
    from dart_core.training.cli import main

    d, t, data, _ = tiny
    common = [method, "--target", str(d), "--data", str(data), "--batch-seqs", "4", "--draft-vocab-size", "64",
              "--heldout-permille", "150", "--eval-rows", "3", "--dtype", "float32", "--no-progress",
              "--max-steps", "2"]
    # no cache yet: auto computes on the fly
    assert main(common + ["--out", str(tmp_path / "fly")]) == 0
    info = json.loads((tmp_path / "fly" / "run_info.json").read_text())
    assert info["features"]["source"] == "on the fly"
    # the CLI builds the cache where auto finds it
    assert main(["features", "--target", str(d), "--data", str(data), "--dtype", "float32", "--no-progress"]) == 0
    assert len(list((user_cache / "features").iterdir())) == 1
    assert main(common + ["--out", str(tmp_path / "auto")]) == 0
    info = json.loads((tmp_path / "auto" / "run_info.json").read_text())
    assert info["features"]["source"] == "cache" and info["argmax"] == "full"
    log = [json.loads(x) for x in (tmp_path / "auto" / "train_log.jsonl").read_text().splitlines()]
    fly = [json.loads(x) for x in (tmp_path / "fly" / "train_log.jsonl").read_text().splitlines()]
    assert abs(log[0]["loss"] - fly[0]["loss"]) < 0.05 * fly[0]["loss"]   # same batch, same head init
    # an explicit cache of another corpus is refused with the flag named
    other = tmp_path / "other.jsonl.gz"
    other.write_bytes(gzip.compress(b"".join(gzip.open(data).readlines()[:-1])))
    assert main(common + ["--out", str(tmp_path / "bad"), "--data", str(other), "--features",
                          str(next((user_cache / "features").iterdir()))]) == 2


def test_features_cli_reports_errors(tiny, tmp_path, capsys):
    from dart_core.training.cli import main

    d, _, _, _ = tiny
    assert main(["features", "--target", str(d), "--data", str(tmp_path / "missing.jsonl"), "--dtype", "float32",
                 "--no-progress"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_id_dtype_fits_the_vocabulary():
    assert fc._id_dtype(49152) == np.uint16 and fc._id_dtype(151936) == np.int32


def test_the_bundled_targets_names_share_one_cache(tiny, tmp_path):
    """`--target bundled` and no --target load the same model under two names: one fingerprint (a cache built
    under one was not found under the other, and the trainer ran the target at every step)."""
    _, t, data, _ = tiny
    name = t.name
    try:
        prints = set()
        for alias in ("bundled", "bundled:SmolLM2-135M-Instruct", "default"):
            t.name = alias
            prints.add(fc.fingerprint(fc.fingerprint_parts(t, data, 8)))
        assert len(prints) == 1
        t.name = "someone/else"
        assert fc.fingerprint(fc.fingerprint_parts(t, data, 8)) not in prints
    finally:
        t.name = name
