"""Pure-Python reference of the N-gram store: counting, the back-off query, a reader of our
table format and a writer/reader of the original DART ``.trie`` format.

It is slow and holds everything in dicts; it exists so that tests can check the native
store (``dart_core.ngram``) against an implementation short enough to read in one sitting.

Counting follows the original ``TrieNgram::add_conversation``: every n-gram of length
1..order inside a document is counted once per occurrence; ``count(())`` (the root) is the
number of tokens. ``query`` is the original per-candidate back-off (docs/ARCHITECTURE.md section 6).
"""
from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

# Mirrors native/src/ngram_format.hpp (version 1).
MAGIC = b"DARTNGRM"
FORMAT_VERSION = 1
HEADER_SIZE = 512
MAX_ORDER = 8
_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def table_checksum(data: bytes) -> int:
    """The format's 64-bit checksum (native/src/checksum.hpp), vectorised with numpy."""
    n = len(data)
    padded = data + b"\0" * (-n % 8)
    w = np.frombuffer(padded, dtype="<u8").astype(np.uint64)
    with np.errstate(over="ignore"):
        idx = np.arange(w.shape[0], dtype=np.uint64) * np.uint64(_GOLDEN)
        z = w ^ idx
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    total = int(z.sum(dtype=np.uint64)) if z.size else 0
    return (total + n * _GOLDEN) & _MASK64


class ReferenceNgram:
    """N-gram counts in a dict: ``counts[ngram_tuple] = occurrences`` (the root is ``()``)."""

    def __init__(self, order: int, counts: dict[tuple[int, ...], int], vocab_size: int | None = None):
        if not 1 <= order <= MAX_ORDER:
            raise ValueError(f"order must be in 1..{MAX_ORDER}, got {order}")
        self.order = order
        self.counts = counts
        self.vocab_size = vocab_size

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_sequences(cls, sequences: Iterable[Sequence[int]], order: int, min_count: int = 1,
                       vocab_size: int | None = None) -> "ReferenceNgram":
        """Count every n-gram (n = 1..order) of each sequence; drop those seen < min_count times."""
        counts: dict[tuple[int, ...], int] = defaultdict(int)
        total = 0
        for seq in sequences:
            seq = [int(t) for t in seq]
            total += len(seq)
            for start in range(len(seq)):
                for n in range(1, order + 1):
                    if start + n > len(seq):
                        break
                    counts[tuple(seq[start:start + n])] += 1
        min_count = max(1, int(min_count))
        kept = {k: c for k, c in counts.items() if c >= min_count}
        kept[()] = total
        return cls(order, kept, vocab_size)

    @classmethod
    def from_table_file(cls, path: str | Path) -> "ReferenceNgram":
        """Read one of our ``.dngram`` tables (format version 1), checking checksums and layout."""
        data = Path(path).read_bytes()
        if len(data) < HEADER_SIZE or data[:8] != MAGIC:
            raise ValueError(f"{path}: not a DART N-gram table")
        version, header_size, marker, order, vocab = struct.unpack_from("<5I", data, 8)
        if version != FORMAT_VERSION or header_size != HEADER_SIZE or marker != 0x01020304:
            raise ValueError(f"{path}: unsupported version {version}")
        if struct.unpack_from("<Q", data, 504)[0] != table_checksum(data[:504]):
            raise ValueError(f"{path}: header checksum mismatch")
        tb, ob, cb = data[28], data[29], data[30]
        node_count, internal, total = struct.unpack_from("<3Q", data, 32)
        level_start = struct.unpack_from("<10Q", data, 64)
        tok_off, cnt_off, off_off, meta_off, meta_len, file_size, body_sum = struct.unpack_from("<7Q", data, 144)
        if file_size != len(data) or table_checksum(data[HEADER_SIZE:]) != body_sum:
            raise ValueError(f"{path}: size or body checksum mismatch")
        tokens = np.frombuffer(data, dtype="<u2" if tb == 2 else "<u4", count=node_count, offset=tok_off)
        counts_arr = np.frombuffer(data, dtype="<u4", count=node_count, offset=cnt_off)
        offsets = np.frombuffer(data, dtype="<u4" if ob == 4 else "<u8", count=internal + 1, offset=off_off)
        assert cb == 4 and level_start[order + 1] == node_count
        ngram_of: list[tuple[int, ...]] = [()] * int(node_count)
        counts: dict[tuple[int, ...], int] = {(): int(total)}
        for node in range(int(internal)):
            for child in range(int(offsets[node]), int(offsets[node + 1])):
                ngram_of[child] = ngram_of[node] + (int(tokens[child]),)
                counts[ngram_of[child]] = int(counts_arr[child])
        return cls(int(order), counts, int(vocab))

    @classmethod
    def from_original_trie(cls, path: str | Path) -> "ReferenceNgram":
        """Read an original DART ``.trie`` (TrieNgram::save layout, 64-bit little-endian)."""
        data = Path(path).read_bytes()
        order, node_count = struct.unpack_from("<QQ", data, 0)
        pos = 16
        ngram_of: list[tuple[int, ...]] = []
        counts: dict[tuple[int, ...], int] = {}
        for i in range(node_count):
            token, parent, freq, n_children = struct.unpack_from("<iQiQ", data, pos)
            pos += 24 + 12 * n_children
            ngram_of.append(() if i == 0 else ngram_of[parent] + (token,))
            counts[ngram_of[i]] = freq
        return cls(int(order), counts)

    # ------------------------------------------------------------------ queries
    def query(self, context: Sequence[int], candidates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The original back-off: longest context suffix first; each candidate takes the first
        suffix it continues: P = count(suffix + x) / count(suffix), matched = len(suffix)."""
        context = [int(t) for t in context]
        candidates = [int(t) for t in candidates]
        self._check_ids(context, "context")
        self._check_ids(candidates, "candidates")
        probs = np.zeros(len(candidates), dtype=np.float64)
        matched = np.zeros(len(candidates), dtype=np.int32)
        for length in range(min(self.order - 1, len(context)), 0, -1):
            ctx = tuple(context[len(context) - length:])
            ctx_count = self.counts.get(ctx, 0)
            if ctx_count == 0:
                continue
            for i, x in enumerate(candidates):
                if matched[i] == 0 and ctx + (x,) in self.counts:
                    probs[i] = self.counts[ctx + (x,)] / ctx_count
                    matched[i] = length
        return probs, matched

    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        for t in ids:
            if t < 0 or (self.vocab_size is not None and t >= self.vocab_size):
                raise ValueError(f"{what} holds token id {t}, outside the vocabulary [0, {self.vocab_size})")

    @property
    def node_count(self) -> int:
        return len(self.counts)


def write_original_trie(path: str | Path, sequences: Iterable[Sequence[int]], order: int) -> None:
    """Write sequences in the original DART ``.trie`` format, exactly as TrieNgram would:
    ``add_conversation`` for each sequence (node ids in creation order, every node on a
    window's path counted once per window), then ``save``. Used by the import tests."""
    tokens: list[int] = [0]
    parents: list[int] = [0]
    freqs: list[int] = [0]
    children: list[dict[int, int]] = [{}]
    for seq in sequences:
        seq = [int(t) for t in seq]
        for start in range(len(seq)):
            cursor = 0
            for t in seq[start:start + order]:
                freqs[cursor] += 1
                nxt = children[cursor].get(t)
                if nxt is None:
                    nxt = len(tokens)
                    tokens.append(t)
                    parents.append(cursor)
                    freqs.append(0)
                    children.append({})
                    children[cursor][t] = nxt
                cursor = nxt
            freqs[cursor] += 1
    out = bytearray(struct.pack("<QQ", order, len(tokens)))
    for i in range(len(tokens)):
        out += struct.pack("<iQiQ", tokens[i], parents[i], freqs[i], len(children[i]))
        for t, c in children[i].items():
            out += struct.pack("<iQ", t, c)
    Path(path).write_bytes(bytes(out))
