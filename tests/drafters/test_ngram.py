"""N-gram store: native table vs the pure-Python reference, the builder's inputs, the .trie
importer, and bad files (truncated, corrupted, other version, other tokenizer)."""
from __future__ import annotations

import gzip
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart_core.ngram import build as ngram_build, cli as ngram_cli, store as ngram
from dart_core.ngram.store import NgramFormatError, NgramStore, NgramTokenizerMismatch
from dart_core.ngram.reference import ReferenceNgram, table_checksum, write_original_trie

native = ngram.require_native()
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def build_native(tmp_path: Path, docs: list[list[int]], order: int, vocab: int, min_count: int = 1,
                 chunk_tokens: int = 1 << 20, fingerprint: str = "test-fp", name: str = "t.dngram") -> Path:
    """Build a table straight from token-id documents with the native builder."""
    out = tmp_path / name
    work = tmp_path / (name + ".work")
    work.mkdir(exist_ok=True)
    b = native.TableBuilder(order, vocab, str(work), chunk_tokens)
    flat = np.array([t for d in docs for t in d], dtype=np.int64)
    b.add_documents(flat, np.array([len(d) for d in docs], dtype=np.int64), vocab)
    b.finish(str(out), min_count, fingerprint, json.dumps({"test": True}))
    return out


def assert_same_answers(store, ref: ReferenceNgram, contexts, candidates) -> None:
    for ctx in contexts:
        p1, m1 = store.query(ctx, candidates)
        p2, m2 = ref.query(ctx, candidates)
        assert m1.tolist() == m2.tolist(), f"matched lengths differ for context {ctx}"
        assert p1.tolist() == p2.tolist(), f"probabilities differ for context {ctx}"


docs_strategy = st.lists(st.lists(st.integers(0, 6), min_size=0, max_size=30), min_size=1, max_size=6)


# ---------------------------------------------------------------------------- equivalence
@SETTINGS
@given(docs=docs_strategy, order=st.integers(1, 5), min_count=st.integers(1, 3), chunk=st.integers(1, 40),
       contexts=st.lists(st.lists(st.integers(0, 7), max_size=6), min_size=1, max_size=6),
       candidates=st.lists(st.integers(0, 7), max_size=12))
def test_native_matches_reference(tmp_path_factory, docs, order, min_count, chunk, contexts, candidates):
    tmp = tmp_path_factory.mktemp("eq")
    path = build_native(tmp, docs, order, vocab=8, min_count=min_count, chunk_tokens=chunk)
    store = NgramStore.open(path, verify=True)
    ref = ReferenceNgram.from_sequences(docs, order, min_count=min_count, vocab_size=8)
    assert store.node_count == ref.node_count
    assert store.order == order and store.vocab_size == 8
    assert_same_answers(store, ref, contexts + [d[-6:] for d in docs], candidates + list(range(8)))
    # The reference reader of the file format sees exactly the reference counts.
    assert ReferenceNgram.from_table_file(path).counts == ref.counts


def test_original_example_backoff(tmp_path):
    # The example in fvliang/DART's trie code: order 3, context (2, 3).
    docs = [[1, 2, 3, 2, 2, 1, 3, 2, 3, 1, 2]]
    store = NgramStore.open(build_native(tmp_path, docs, order=3, vocab=4))
    probs, matched = store.query([2, 3], [1, 2, 3])
    assert probs.tolist() == [0.5, 0.5, 0.0]     # "2 3" occurs twice, followed by 2 and by 1
    assert matched.tolist() == [2, 2, 0]         # 3 never follows "2 3" nor "3": unmatched, P = 0
    probs, matched = store.query([9 % 4, 1], [2, 3])  # context (1, 1) unseen: back off to (1)
    assert matched.tolist() == [1, 1] and probs.tolist() == [2 / 3, 1 / 3]


def test_empty_context_and_candidates(tmp_path):
    store = NgramStore.open(build_native(tmp_path, [[1, 2, 3]], order=3, vocab=4))
    p, m = store.query([], [1, 2])
    assert p.tolist() == [0.0, 0.0] and m.tolist() == [0, 0]
    p, m = store.query([1, 2], [])
    assert p.shape == (0,) and m.dtype == np.int32
    # "2 3" and "3" occur but end the document: no continuations, so nothing is matched.
    assert store.continuations([2, 3])[0] == 0
    matched, count, toks, counts = store.continuations([0, 1])  # (0, 1) unseen: back off to (1)
    assert (matched, count, toks.tolist(), counts.tolist()) == (1, 1, [2], [1])


def test_out_of_range_ids_raise(tmp_path):
    store = NgramStore.open(build_native(tmp_path, [[1, 2, 3]], order=3, vocab=4))
    with pytest.raises(ValueError, match="outside the table's vocabulary"):
        store.query([1, 4], [1])
    with pytest.raises(ValueError, match="outside"):
        store.query([1], [-1])
    with pytest.raises(ValueError):
        native.TableBuilder(2, 4, str(tmp_path), 100).add_documents(np.array([5]), np.array([1]), 4)


# ---------------------------------------------------------------------------- builder inputs
class TinyTokenizer:
    """A whitespace word-level tokenizer with the attributes the builder uses."""

    def __init__(self, words: list[str]):
        self.vocab = {w: i for i, w in enumerate(["<eos>"] + words)}
        self.all_special_tokens = ["<eos>"]
        self.name_or_path = "tiny"

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[w] for w in text.split()]


def test_build_from_files(tmp_path):
    tok = TinyTokenizer(["a", "b", "c", "d"])
    ids_file = tmp_path / "distill.jsonl.gz"
    with gzip.open(ids_file, "wt") as f:
        f.write(json.dumps({"response_ids": [1, 2, 3, 0], "response": "ignored"}) + "\n")
        f.write(json.dumps({"response": "a a b"}) + "\n")
        f.write(json.dumps({"other": 1}) + "\n")  # no usable field: skipped
    text_file = tmp_path / "corpus.jsonl"
    text_file.write_text(json.dumps({"text": "c d a b"}) + "\n\n")
    plain = tmp_path / "notes.txt"
    plain.write_text("d d d\n")
    out = tmp_path / "sub" / "t.dngram"
    stats = ngram_build.build_ngram_table([ids_file, text_file, plain], out, tok, order=3, progress=False,
                                    chunk_tokens=3, command="test")
    docs = [[1, 2, 3, 0], [1, 1, 2], [3, 4, 1, 2], [4, 4, 4]]
    ref = ReferenceNgram.from_sequences(docs, 3, vocab_size=5)
    store = NgramStore.open(out, expected_fingerprint=ngram.tokenizer_fingerprint(tok))
    assert stats["node_count"] == store.node_count == ref.node_count
    assert stats["total_tokens"] == 14
    assert_same_answers(store, ref, [[1], [1, 2], [4, 4], [3, 4], [2]], list(range(5)))
    meta = store.info()["metadata"]
    assert [s["documents"] for s in meta["sources"]] == [2, 1, 1] and meta["sources"][0]["skipped"] == 1
    assert meta["command"] == "test" and meta["order"] == 3


def test_text_input_without_tokenizer_is_refused(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "a b"}) + "\n")
    with pytest.raises(ValueError, match="tokenizer"):
        ngram_build.build_ngram_table([f], tmp_path / "t.dngram", None, vocab_size=5, progress=False)


def test_fingerprint_is_stable_and_discriminates():
    a, b = TinyTokenizer(["x", "y"]), TinyTokenizer(["y", "x"])
    assert ngram.tokenizer_fingerprint(a) == ngram.tokenizer_fingerprint(TinyTokenizer(["x", "y"]))
    assert ngram.tokenizer_fingerprint(a) != ngram.tokenizer_fingerprint(b)
    assert len(ngram.tokenizer_fingerprint(a)) == 64


def test_wrong_tokenizer_is_refused(tmp_path):
    path = build_native(tmp_path, [[1, 2]], order=2, vocab=4, fingerprint="a" * 64)
    NgramStore.open(path, expected_fingerprint="a" * 64)
    with pytest.raises(NgramTokenizerMismatch, match="another tokenizer|other text"):
        NgramStore.open(path, expected_fingerprint="b" * 64)


# ---------------------------------------------------------------------------- bad files
@pytest.fixture(scope="module")
def good_table(tmp_path_factory) -> bytes:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50, size=int(rng.integers(5, 60))).tolist() for _ in range(30)]
    return build_native(tmp_path_factory.mktemp("good"), docs, order=4, vocab=50).read_bytes()


def _reopen(tmp_path: Path, data: bytes, verify=True) -> NgramStore:
    p = tmp_path / "bad.dngram"
    p.write_bytes(data)
    return NgramStore.open(p, verify=verify)


@pytest.mark.parametrize("keep", [0, 7, 100, 511, 512, 1000, -1])
def test_truncated_table_raises(tmp_path, good_table, keep):
    data = good_table[:keep] if keep >= 0 else good_table[:len(good_table) + keep]
    with pytest.raises(NgramFormatError, match="bad.dngram"):
        _reopen(tmp_path, data, verify=False)  # caught by the header alone, even without verify


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 10**9), value=st.integers(1, 255))
def test_any_mutated_byte_is_caught(tmp_path, good_table, pos, value):
    data = bytearray(good_table)
    pos %= len(data)
    data[pos] ^= value
    with pytest.raises(NgramFormatError):
        _reopen(tmp_path, bytes(data), verify=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(512, 10**9), value=st.integers(1, 255),
       ctx=st.lists(st.integers(0, 49), max_size=4), cands=st.lists(st.integers(0, 49), max_size=25))
def test_unverified_corruption_never_crashes(tmp_path, good_table, pos, value, ctx, cands):
    # Without verify a body mutation goes unnoticed at open, but every read is bounds-checked:
    # queries return numbers or raise NgramFormatError, never read outside the mapping.
    data = bytearray(good_table)
    data[512 + (pos - 512) % (len(data) - 512)] ^= value
    store = _reopen(tmp_path, bytes(data), verify=False)
    try:
        p, m = store.query(ctx, cands)
        assert p.shape == (len(cands),)
        store.continuations(ctx)
    except NgramFormatError:
        pass
    with pytest.raises(NgramFormatError, match="checksum"):
        store.verify()


def _patch_header(data: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    struct.pack_into("<Q", b, 504, table_checksum(bytes(b[:504])))  # keep the header checksum valid
    return bytes(b)


def test_wrong_version_and_magic(tmp_path, good_table):
    with pytest.raises(NgramFormatError, match="version 2"):
        _reopen(tmp_path, _patch_header(good_table, 8, "<I", 2))
    with pytest.raises(NgramFormatError, match="not a DART N-gram table.*import"):
        _reopen(tmp_path, b"XXXXXXXX" + good_table[8:])
    with pytest.raises(NgramFormatError, match="inconsistent"):
        _reopen(tmp_path, _patch_header(good_table, 32, "<Q", 10**6))   # node_count
    with pytest.raises(NgramFormatError, match="rebuild it with"):
        _reopen(tmp_path, good_table + b"\0")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="build"):
        NgramStore.open(tmp_path / "nope.dngram")


# ---------------------------------------------------------------------------- .trie import
@SETTINGS
@given(docs=docs_strategy, order=st.integers(1, 4), min_count=st.integers(1, 2))
def test_import_original_trie(tmp_path_factory, docs, order, min_count):
    tmp = tmp_path_factory.mktemp("trie")
    write_original_trie(tmp / "x.trie", docs, order)
    ref = ReferenceNgram.from_sequences(docs, order, vocab_size=8)
    assert ReferenceNgram.from_original_trie(tmp / "x.trie").counts == ref.counts  # the writer is faithful
    stats = ngram_build.import_original_trie(tmp / "x.trie", tmp / "x.dngram", vocab_size=8, fingerprint="fp",
                                       min_count=min_count, progress=False, chunk_records=5)
    store = NgramStore.open(tmp / "x.dngram", expected_fingerprint="fp")
    ref = ReferenceNgram.from_sequences(docs, order, min_count=min_count, vocab_size=8)
    assert stats["node_count"] == ref.node_count == store.node_count
    assert_same_answers(store, ref, [d[-4:] for d in docs] + [[0], [1, 2], []], list(range(8)))


def test_import_rejects_bad_trie(tmp_path):
    write_original_trie(tmp_path / "x.trie", [[1, 2, 3, 1, 2]], 3)
    data = (tmp_path / "x.trie").read_bytes()
    cases = {"trunc.trie": data[:-5], "short.trie": data[:10], "junk.trie": b"\x07" * 200,
             "tail.trie": data + b"\0\0"}
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(NgramFormatError):
            ngram_build.import_original_trie(tmp_path / name, tmp_path / "o.dngram", vocab_size=4, progress=False)
    with pytest.raises(NgramFormatError, match="outside the vocabulary"):
        ngram_build.import_original_trie(tmp_path / "x.trie", tmp_path / "o.dngram", vocab_size=3, progress=False)
    assert not (tmp_path / "o.dngram").exists()  # a failed import leaves no table behind


# ---------------------------------------------------------------------------- CLI
def test_cli_info_query_and_errors(tmp_path, capsys):
    path = build_native(tmp_path, [[1, 2, 3, 1, 2, 4]], order=3, vocab=5)
    assert ngram_cli.main(["info", str(path), "--verify"]) == 0
    assert "verified" in capsys.readouterr().out
    assert ngram_cli.main(["query", str(path), "--ids", "1", "2"]) == 0
    assert "P=0.500000" in capsys.readouterr().out     # "1 2" -> 3 and 4, once each
    assert ngram_cli.main(["query", str(path), "--ids", "1", "2", "--candidates", "3", "4"]) == 0
    (tmp_path / "bad.dngram").write_bytes(b"junk")
    assert ngram_cli.main(["info", str(tmp_path / "bad.dngram")]) == 2
    assert "error:" in capsys.readouterr().err


def test_input_weight_multiplies_counts(tmp_path):
    f = tmp_path / "ids.jsonl"
    f.write_text(json.dumps({"response_ids": [1, 2, 1, 3]}) + "\n")
    g = tmp_path / "more.jsonl"
    g.write_text(json.dumps({"response_ids": [1, 3]}) + "\n")
    ngram_build.build_ngram_table([f"{f}@3", g], tmp_path / "w.dngram", None, vocab_size=4, fingerprint="fp",
                            order=2, min_count=3, progress=False)
    ref = ReferenceNgram.from_sequences([[1, 2, 1, 3]] * 3 + [[1, 3]], 2, min_count=3, vocab_size=4)
    store = NgramStore.open(tmp_path / "w.dngram")
    assert store.node_count == ref.node_count
    assert_same_answers(store, ref, [[1], [2], [3]], [0, 1, 2, 3])   # P(3 | 1) = 4/7, P(2 | 1) = 3/7
    assert store.info()["metadata"]["sources"][0]["weight"] == 3
    with pytest.raises(ValueError, match="positive"):
        ngram_build.build_ngram_table([f"{f}@0"], tmp_path / "x.dngram", None, vocab_size=4, progress=False)


# ---------------------------------------------------------------------------- edge sizes
def reference_continuations(ref: ReferenceNgram, context: list[int]):
    for length in range(min(ref.order - 1, len(context)), 0, -1):
        ctx = tuple(context[len(context) - length:])
        kids = sorted((k[-1], c) for k, c in ref.counts.items() if len(k) == length + 1 and k[:-1] == ctx)
        if kids and ref.counts.get(ctx, 0):
            return length, ref.counts[ctx], [t for t, _ in kids], [c for _, c in kids]
    return 0, 0, [], []


@pytest.mark.parametrize("n_cands", [0, 1, 63, 64, 65])
@pytest.mark.parametrize("ctx_len", [0, 1, 3, 64, 65])
def test_lookups_at_edge_sizes_match_the_reference(tmp_path_factory, good_table, n_cands, ctx_len):
    tmp = tmp_path_factory.mktemp("edge")
    path = tmp / "t.dngram"
    path.write_bytes(good_table)
    store = NgramStore.open(path)
    ref = ReferenceNgram.from_table_file(path)
    rng = np.random.default_rng(n_cands * 100 + ctx_len)
    context = rng.integers(0, 50, size=ctx_len).tolist()
    candidates = rng.integers(0, 50, size=n_cands).tolist()
    assert_same_answers(store, ref, [context, context[-1:], context[-3:]], candidates)
    m, count, toks, counts = store.continuations(context)
    assert (m, count, toks.tolist(), counts.tolist()) == reference_continuations(ref, context)


@pytest.mark.parametrize("q,k", [(0, 3), (2, 0), (0, 0), (1, 1), (3, 65)])
def test_bench_query_at_edge_sizes(good_table, tmp_path, q, k):
    # Zero candidates once read probs[0] of an empty vector (a crash).
    path = tmp_path / "t.dngram"
    path.write_bytes(good_table)
    store = native.NgramStore(str(path), True)
    contexts, cands = np.ones((q, 3), np.int64), np.ones((q, k), np.int64)
    if q == 0:
        with pytest.raises(ValueError, match="at least one"):
            store.bench_query(contexts, cands, 1)
        return
    out = store.bench_query(contexts, cands, 2)
    assert np.isfinite(out["wall"]) and np.isfinite(out["cpu"])
    with pytest.raises(ValueError, match="repeats"):
        store.bench_query(contexts, cands, 0)


@pytest.mark.parametrize("lengths", [[], [0], [0, 0, 1], [1], [63], [64], [65], [64, 1, 65, 0, 7]])
@pytest.mark.parametrize("chunk", [1, 64, 65])
def test_builder_at_edge_sizes_matches_the_reference(tmp_path, lengths, chunk):
    # Documents of 0, 1 and 64/65 tokens around a 64/65-token chunk: the spill boundary.
    rng = np.random.default_rng(sum(lengths) + chunk)
    docs = [rng.integers(0, 5, size=n).tolist() for n in lengths]
    path = build_native(tmp_path, docs, order=3, vocab=5, chunk_tokens=chunk)
    store = NgramStore.open(path, verify=True)
    ref = ReferenceNgram.from_sequences(docs, 3, vocab_size=5)
    assert store.node_count == ref.node_count
    assert ReferenceNgram.from_table_file(path).counts == ref.counts


@pytest.mark.parametrize("per_call", [1, 63, 64, 65])
@pytest.mark.parametrize("chunk", [0, 1, 64])
def test_builder_across_calls_at_edge_sizes_matches_the_reference(tmp_path, per_call, chunk):
    # The same documents fed by several add_documents calls (empty calls included) around the spill boundary;
    # chunk 0 counts as 1.
    rng = np.random.default_rng(per_call + chunk)
    docs = [rng.integers(0, 5, size=n).tolist() for n in (0, 1, 64, 65, 3, 130)]
    b = native.TableBuilder(3, 5, str(tmp_path), chunk)
    b.add_documents(np.array([], np.int64), np.array([], np.int64), 5)
    for i in range(0, len(docs), 2):
        part = docs[i:i + 2]
        b.add_documents(np.array([t for d in part for t in d], np.int64), np.array([len(d) for d in part]), 5)
        b.add_documents(np.zeros(0, np.int64), np.zeros(per_call % 2, np.int64), 5)   # no document / one empty one
    assert b.total_tokens == sum(map(len, docs))
    b.finish(str(tmp_path / "t.dngram"), 0)                 # min_count 0 counts as 1
    ref = ReferenceNgram.from_sequences(docs, 3, vocab_size=5)
    assert ReferenceNgram.from_table_file(tmp_path / "t.dngram").counts == ref.counts


@pytest.mark.parametrize("order,vocab", [(1, 1), (8, 1), (1, 2), (8, 2), (1, 2**32 - 1)])
def test_builder_at_edge_orders_and_vocabularies(tmp_path, order, vocab):
    b = native.TableBuilder(order, vocab, str(tmp_path), 1)
    b.add_documents(np.array([0, 0, vocab - 1], np.int64), np.array([3]), vocab)
    b.finish(str(tmp_path / "t.dngram"))
    store = NgramStore.open(tmp_path / "t.dngram", verify=True)
    assert store.vocab_size == vocab and store.order == order and b.total_tokens == 3


def test_a_vocabulary_past_the_dense_root_index_answers_as_a_small_one(tmp_path):
    """Past 2^24 tokens the store bisects its 1-grams instead of holding an index per vocabulary id (2^32 - 1
    ids took 17 GB): the same documents give the same answers and continuations under either vocabulary, and
    opening the table stays small (resident memory follows the tokens counted, not the vocabulary)."""
    small, big = 50, 2**32 - 1
    rng = np.random.default_rng(4)
    docs = [rng.integers(0, small, 40).tolist() for _ in range(3)] + [[3, 7, 3, 7, 9]]
    stores = []
    for vocab in (small, big):
        b = native.TableBuilder(3, vocab, str(tmp_path), 1 << 10)
        b.add_documents(np.array([t for d in docs for t in d], np.int64), np.array([len(d) for d in docs]), vocab)
        b.finish(str(tmp_path / f"t{vocab}.dngram"))
        stores.append(NgramStore.open(tmp_path / f"t{vocab}.dngram", verify=True))
    # in a fresh process (this one's peak counts every earlier test): the big vocabulary's table opens small
    # VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec
    script = ("import sys; from dart_core.ngram.store import NgramStore; "
              f"s = NgramStore.open(sys.argv[1], verify=True); s.query([3, 7], [9]); "
              "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"t{big}.dngram")], capture_output=True,
                         text=True, check=True)
    assert int(out.stdout.split()[-1]) < 1 << 20, out.stdout        # KiB: under 1 GB (it took 17 GB)
    ref = ReferenceNgram.from_sequences(docs, 3, vocab_size=small)
    for ctx in ([3, 7], [7], [49, 0], [], [12, 13]):
        candidates = list(range(small))
        p_small, m_small = stores[0].query(ctx, candidates)
        p_big, m_big = stores[1].query(ctx, candidates)
        assert np.array_equal(p_small, p_big) and np.array_equal(m_small, m_big)
        p_ref, m_ref = ref.query(ctx, candidates)
        assert np.allclose(p_big, p_ref) and np.array_equal(m_big, m_ref)
        assert [np.asarray(x).tolist() for x in stores[0].continuations(ctx)] == \
            [np.asarray(x).tolist() for x in stores[1].continuations(ctx)]


@pytest.mark.parametrize("order,vocab,match", [(0, 4, "order"), (9, 4, "order"), (2, 0, "vocab_size")])
def test_builder_refuses_edge_orders_and_vocabularies(tmp_path, order, vocab, match):
    with pytest.raises(ValueError, match=match):
        native.TableBuilder(order, vocab, str(tmp_path), 1)


def test_an_empty_builder_writes_a_root_only_table(tmp_path):
    b = native.TableBuilder(3, 5, str(tmp_path), 1)
    stats = b.finish(str(tmp_path / "t.dngram"))
    assert stats["node_count"] == 1 and stats["total_tokens"] == 0
    assert NgramStore.open(tmp_path / "t.dngram", verify=True).node_count == 1


@pytest.mark.parametrize("lengths,match", [
    ([-1, 3], "document 0 has negative length -1"),
    ([1, 1], "sum to 2, but 3 tokens"),
    ([4], "more than the 3 tokens"),
    ([2**63 - 1, 2**63 - 1, 5], "more than the 3 tokens"),       # sums to 3 modulo 2^64
    ([], "sum to 0, but 3 tokens"),
])
def test_builder_refuses_bad_lengths_and_adds_nothing(tmp_path, lengths, match):
    b = native.TableBuilder(2, 4, str(tmp_path), 2)
    b.add_documents(np.array([1, 2]), np.array([2]), 4)
    with pytest.raises(ValueError, match=match):
        b.add_documents(np.array([1, 2, 3]), np.array(lengths, dtype=np.int64), 4)
    assert b.total_tokens == 2
    b.finish(str(tmp_path / "t.dngram"))
    assert ReferenceNgram.from_table_file(tmp_path / "t.dngram").counts == \
        ReferenceNgram.from_sequences([[1, 2]], 2, vocab_size=4).counts


def test_lengths_that_wrap_to_the_token_count_are_refused_in_a_subprocess(tmp_path):
    # Issue 27: int64 lengths summed in a wrapping uint64 passed the check; the builder then copied 2e9 tokens
    # from a 2-token array (SIGSEGV) or, for 1000, wrote a table of ids read from outside it.
    import subprocess
    import sys
    script = """
import sys, numpy as np
import dart_core._native as n
out = sys.argv[1]
for A in (2 * 10**9, 1000):
    b = n.TableBuilder(2, 10, out, 1 << 20)
    try:
        b.add_documents(np.array([1, 2]), np.array([A, 2**63 - 1, 2**63 - A, 3]), 10)
    except ValueError as e:
        print("refused:", e)
    assert b.total_tokens == 0, b.total_tokens
"""
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("refused: add_documents: document lengths add up to more than the 2 tokens") == 2
    assert list(tmp_path.iterdir()) == []                    # no table, no run file


def test_builder_refuses_ids_beyond_its_own_vocabulary(tmp_path):
    # add_documents' vocab_size argument once overrode the builder's: ids 4..99 were packed into the
    # 2 bits of a 4-id builder and gave a corrupted table.
    b = native.TableBuilder(2, 4, str(tmp_path), 100)
    with pytest.raises(ValueError, match="vocab_size 100 .* built for 4"):
        b.add_documents(np.array([3, 7]), np.array([2]), 100)
    with pytest.raises(ValueError, match=r"documents holds token id 7 .*\[0, 4\)"):
        b.add_documents(np.array([3, 7]), np.array([2]), 4)
    b.add_documents(np.array([3, 1]), np.array([2]), 4)
    assert b.total_tokens == 2


# ---------------------------------------------------------------------------- large tables
@pytest.fixture
def large_limit(monkeypatch):
    """Tables over 1 KB count as large (opened without the inline checksum)."""
    monkeypatch.setattr(ngram, "VERIFY_ON_OPEN_MAX_BYTES", 1024)
    calls = []
    real = NgramStore.verify

    def counting_verify(self):
        calls.append(self.path)
        return real(self)

    monkeypatch.setattr(NgramStore, "verify", counting_verify)
    return calls


def _settle(path: Path) -> None:
    """Date the file a minute back: a file modified within the last seconds is never recorded as
    verified (a same-second rewrite would keep its size and mtime)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - 60 * 10**9))


def test_large_table_is_verified_once_then_opens_fast(tmp_path, good_table, large_limit):
    path = tmp_path / "big.dngram"
    path.write_bytes(good_table)
    assert len(good_table) > 1024
    _settle(path)
    NgramStore.open(path)
    assert large_limit == [str(path)], "the first open of a large table checks it"
    assert ngram.verified_record_path(path).is_file()
    store = NgramStore.open(path)
    assert large_limit == [str(path)], "a recorded table is not checked again"
    assert store.query([1, 2], [3])[0].shape == (1,)


def test_damaged_large_table_is_refused(tmp_path, good_table, large_limit):
    path = tmp_path / "big.dngram"
    path.write_bytes(good_table)
    _settle(path)
    NgramStore.open(path)                      # good: verified and recorded
    data = bytearray(good_table)
    data[len(data) // 2] ^= 0x10               # a flipped bit in the body
    path.write_bytes(bytes(data))
    for _ in range(2):                         # refused every time, never recorded as good
        with pytest.raises(NgramFormatError, match=r"big\.dngram.*checksum.*rebuild it with"):
            NgramStore.open(path)
    assert not ngram.verified_record_path(path).exists()


def test_damaged_large_table_never_verified_before_is_refused(tmp_path, good_table, large_limit):
    data = bytearray(good_table)
    data[-100] ^= 0x01
    path = tmp_path / "imported.dngram"
    path.write_bytes(bytes(data))
    with pytest.raises(NgramFormatError, match=r"imported\.dngram.*rebuild it with.*import"):
        NgramStore.open(path)


def test_fresh_large_table_is_checked_until_it_settles(tmp_path, good_table, large_limit):
    path = tmp_path / "big.dngram"
    path.write_bytes(good_table)               # modified just now: verified, but not recorded yet
    NgramStore.open(path)
    NgramStore.open(path)
    assert len(large_limit) == 2 and not ngram.verified_record_path(path).exists()


def test_stale_or_garbled_record_means_verify_again(tmp_path, good_table, large_limit):
    path = tmp_path / "big.dngram"
    path.write_bytes(good_table)
    _settle(path)
    NgramStore.open(path)
    record = ngram.verified_record_path(path)
    record.write_text("not json")
    NgramStore.open(path)
    assert len(large_limit) == 2 and json.loads(record.read_text())["size"] == len(good_table)
    stamp = json.loads(record.read_text())
    record.write_text(json.dumps(stamp | {"body_checksum": stamp["body_checksum"] ^ 1}))
    NgramStore.open(path)
    assert len(large_limit) == 3


def test_small_tables_are_checked_on_every_open(tmp_path, good_table, monkeypatch):
    monkeypatch.setattr(ngram, "VERIFY_ON_OPEN_MAX_BYTES", 1 << 30)
    data = bytearray(good_table)
    data[-100] ^= 0x01
    path = tmp_path / "small.dngram"
    path.write_bytes(bytes(data))
    with pytest.raises(NgramFormatError, match="small.dngram"):
        NgramStore.open(path)
    assert not ngram.verified_record_path(path).exists()
