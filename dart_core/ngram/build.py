"""Building N-gram tables from corpora, and importing original DART ``.trie`` files.

Reading and tokenizing happen here; counting, merging and writing happen in the native
``TableBuilder`` (bounded memory: sorted runs of ``chunk_tokens`` tokens are spilled to a
temporary directory and merged at the end). Tokenization runs in the tokenizer's own Rust
thread pool (``encode_batch``, parallel across documents) on a background thread while the
native counter consumes the previous batch, so the two overlap.

Inputs, by file name:
  ``*.jsonl`` / ``*.jsonl.gz``  one JSON object per line; ``response_ids`` (token ids, used
                                as they are), else ``text``, else ``response`` (tokenized)
  anything else (``*.txt``, ``*.md``, ``*.gz``)  plain text, tokenized in ~1 MB blocks

An input written ``PATH@K`` (K a positive integer) is counted K times: its n-gram counts are
multiplied by K, a mixture weight (e.g. the target's own answers weighted above generic text),
which also lets its n-grams survive ``--min-count K``.
"""
from __future__ import annotations

import datetime
import gzip
import io
import json
import logging
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

log = logging.getLogger(__name__)

_TEXT_BLOCK_BYTES = 1 << 20


def _tokenizer_identity(tokenizer, vocab_size: int | None, fingerprint: str | None) -> tuple[int | None, str | None]:
    """Vocab size and fingerprint for a table header: given values win, else the tokenizer's."""
    if tokenizer is None:
        return vocab_size, fingerprint
    from .store import tokenizer_fingerprint, tokenizer_vocab_size
    return vocab_size or tokenizer_vocab_size(tokenizer), fingerprint or tokenizer_fingerprint(tokenizer)


@dataclass
class _SourceStats:
    path: str
    bytes: int
    weight: int = 1
    documents: int = 0
    tokens: int = 0
    skipped: int = 0


@dataclass
class _Batch:
    ids: list[list[int]] = field(default_factory=list)     # documents already as token ids
    texts: list[str] = field(default_factory=list)         # documents to tokenize
    source: _SourceStats | None = None
    bytes_read: int = 0


class _ByteCounter(io.RawIOBase):
    """Wraps a raw file to report how many (compressed) bytes were read, for the progress bar."""

    def __init__(self, raw):
        self.raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self.raw.readinto(b)
        self.count += n or 0
        return n


def _open_text(path: Path) -> tuple[io.TextIOBase, _ByteCounter]:
    counter = _ByteCounter(open(path, "rb", buffering=0))
    raw = io.BufferedReader(counter, 1 << 20)
    stream = gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw
    return io.TextIOWrapper(stream, encoding="utf-8", errors="replace"), counter


def parse_input(spec: str | os.PathLike) -> tuple[Path, int]:
    """``PATH`` or ``PATH@K`` -> (path, weight K >= 1)."""
    text = os.fspath(spec)
    path, sep, weight = text.rpartition("@")
    if sep and weight.isdigit() and not Path(text).exists():
        if int(weight) < 1:
            raise ValueError(f"{text}: the weight after @ must be a positive integer")
        return Path(path), int(weight)
    return Path(text), 1


def _iter_batches(paths: Sequence[str | os.PathLike], batch_docs: int, max_docs: int | None,
                  sources: list[_SourceStats]) -> Iterator[_Batch]:
    """Read inputs into batches of documents (token-id lists or texts)."""
    docs = 0
    for p in paths:
        path, weight = parse_input(p)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file {path} does not exist")
        src = _SourceStats(path=str(path), bytes=path.stat().st_size, weight=weight)
        sources.append(src)
        is_jsonl = ".jsonl" in path.suffixes
        text, counter = _open_text(path)
        batch, last = _Batch(source=src), 0
        with text:
            if is_jsonl:
                for lineno, line in enumerate(text, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from None
                    if isinstance(obj.get("response_ids"), list):
                        batch.ids.append(obj["response_ids"])
                    elif isinstance(obj.get("text"), str):
                        batch.texts.append(obj["text"])
                    elif isinstance(obj.get("response"), str):
                        batch.texts.append(obj["response"])
                    else:
                        src.skipped += 1
                        continue
                    docs += 1
                    if len(batch.ids) + len(batch.texts) >= batch_docs or docs == max_docs:
                        batch.bytes_read, last = counter.count - last, counter.count
                        yield batch
                        batch = _Batch(source=src)
                    if docs == max_docs:
                        return
            else:
                while True:
                    block = text.read(_TEXT_BLOCK_BYTES)
                    if not block:
                        break
                    block += text.readline()  # end the block at a line boundary
                    batch.texts.append(block)
                    docs += 1
                    if len(batch.texts) >= max(1, batch_docs // 64) or docs == max_docs:
                        batch.bytes_read, last = counter.count - last, counter.count
                        yield batch
                        batch = _Batch(source=src)
                    if docs == max_docs:
                        return
        batch.bytes_read = counter.count - last
        if batch.ids or batch.texts or batch.bytes_read:
            yield batch


def _tokenize(tokenizer: Any, batch: _Batch) -> tuple[np.ndarray, np.ndarray, _Batch]:
    """Token ids of a batch, flattened: (tokens int64 [T], lengths int64 [docs])."""
    docs = [list(map(int, ids)) for ids in batch.ids]
    if batch.texts and tokenizer is None:
        raise ValueError(f"{batch.source.path} holds text, which needs --tokenizer to tokenize")
    if batch.texts:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer: parallel over the batch, no length warnings
            docs += [e.ids for e in backend.encode_batch(batch.texts, add_special_tokens=False)]
        else:
            docs += [tokenizer.encode(t, add_special_tokens=False) for t in batch.texts]
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    flat = np.fromiter((t for d in docs for t in d), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths, batch


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled)


def build_ngram_table(inputs: Sequence[str | os.PathLike], out: str | os.PathLike, tokenizer: Any = None, *,
                      order: int = 4, min_count: int = 1, vocab_size: int | None = None,
                      fingerprint: str | None = None, chunk_tokens: int = 1 << 23, batch_docs: int = 256,
                      max_docs: int | None = None, tmp_dir: str | os.PathLike | None = None,
                      progress: bool = True, tokenizer_name: str | None = None,
                      command: str | None = None) -> dict[str, Any]:
    """Count all n-grams (n = 1..order) of ``inputs`` and write a table to ``out``.

    ``tokenizer`` tokenizes text inputs and supplies the vocabulary size and fingerprint;
    without it, every input must carry ``response_ids`` and ``vocab_size`` must be given.
    N-grams seen fewer than ``min_count`` times are dropped (with their continuations);
    surviving counts are exact, so P(x | ctx) of a surviving n-gram equals the unpruned one.
    Returns build statistics (nodes per level, bytes, tokens, seconds, tokens per second).
    """
    from .store import require_native

    native = require_native()
    if not 1 <= order <= 8:
        raise ValueError(f"--order must be between 1 and 8, got {order}")
    vocab_size, fingerprint = _tokenizer_identity(tokenizer, vocab_size, fingerprint)
    if vocab_size is None:
        raise ValueError("pass a tokenizer (or vocab_size) so token ids can be range-checked")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sources: list[_SourceStats] = []
    total_bytes = sum(parse_input(p)[0].stat().st_size for p in inputs if parse_input(p)[0].is_file())
    t0 = time.perf_counter()
    tokenize_s = 0.0
    with tempfile.TemporaryDirectory(prefix="ngram-build-", dir=tmp_dir) as tmp:
        builder = native.TableBuilder(order, vocab_size, tmp, chunk_tokens)
        bar = _progress(total_bytes, f"counting {order}-grams", progress)
        # Tokenize batch i+1 on a worker thread while the native counter consumes batch i.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending: Future | None = None
            batches = _iter_batches(inputs, batch_docs, max_docs, sources)

            def consume(fut: Future) -> None:
                nonlocal tokenize_s
                flat, lengths, batch = fut.result()
                for _ in range(batch.source.weight):  # a weight K counts the documents K times
                    builder.add_documents(flat, lengths, vocab_size)
                batch.source.documents += len(lengths)
                batch.source.tokens += int(flat.shape[0])
                bar.update(batch.bytes_read)
                bar.set_postfix(tokens=f"{builder.total_tokens:,}")

            def timed_tokenize(batch: _Batch):
                nonlocal tokenize_s
                s = time.perf_counter()
                r = _tokenize(tokenizer, batch)
                tokenize_s += time.perf_counter() - s
                return r

            for batch in batches:
                fut = pool.submit(timed_tokenize, batch)
                if pending is not None:
                    consume(pending)
                pending = fut
            if pending is not None:
                consume(pending)
        bar.close()
        count_s = time.perf_counter() - t0
        log.info("merging runs and writing %s ...", out)
        metadata = {
            "format": "dart_core N-gram table v1",
            "order": order,
            "min_count": max(1, min_count),
            "tokenizer": tokenizer_name or getattr(tokenizer, "name_or_path", None),
            "fingerprint": fingerprint,
            "vocab_size": vocab_size,
            "sources": [vars(s) | {"path": Path(s.path).name} for s in sources],
            "command": command,
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        stats = builder.finish(str(out), min_count, fingerprint or "", json.dumps(metadata))
    elapsed = time.perf_counter() - t0
    stats.update(seconds=round(elapsed, 3), count_seconds=round(count_s, 3), tokenize_seconds=round(tokenize_s, 3),
                 tokens_per_second=round(stats["total_tokens"] / max(elapsed, 1e-9)),
                 bytes_per_node=round(stats["file_size"] / max(1, stats["node_count"]), 2),
                 sources=metadata["sources"], out=str(out))
    log.info("wrote %s: %s nodes, %.1f MB, %.1f s", out, f"{stats['node_count']:,}", stats["file_size"] / 1e6, elapsed)
    return stats


def import_original_trie(src: str | os.PathLike, dst: str | os.PathLike, tokenizer: Any = None, *,
                         vocab_size: int | None = None, fingerprint: str | None = None, min_count: int = 1,
                         tmp_dir: str | os.PathLike | None = None, chunk_records: int = 1 << 23,
                         progress: bool = True, command: str | None = None) -> dict[str, Any]:
    """Convert an original DART ``.trie`` (fvliang/DART ``TrieNgram::save``) into a table,
    reading it once front to back (per-node bookkeeping lives in a temporary file-backed
    array, never in hash maps). ``tokenizer`` (or ``vocab_size`` + ``fingerprint``) must be
    the one the .trie was built with: ids are range-checked against it."""
    from .store import NgramFormatError, require_native

    native = require_native()
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"{src} does not exist")
    with open(src, "rb") as f:
        if f.read(8) == b"DARTNGRM":
            raise NgramFormatError(f"{src} is already a dart_core N-gram table: open it with NgramStore.open")
    vocab_size, fingerprint = _tokenizer_identity(tokenizer, vocab_size, fingerprint)
    if vocab_size is None:
        raise ValueError("pass --tokenizer (or --vocab-size) of the tokenizer the .trie was built with")
    dst.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "dart_core N-gram table v1", "imported_from": src.name, "source_bytes": src.stat().st_size,
                "min_count": max(1, min_count), "fingerprint": fingerprint, "vocab_size": vocab_size,
                "tokenizer": getattr(tokenizer, "name_or_path", None), "command": command,
                "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    bar = _progress(src.stat().st_size, f"importing {src.name}", progress)

    def on_progress(done: int, total: int) -> None:
        bar.update(done - bar.n)

    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="ngram-import-", dir=tmp_dir) as tmp:
            stats = native.import_original_trie(str(src), str(dst), vocab_size, fingerprint or "",
                                                json.dumps(metadata), min_count, tmp, chunk_records, on_progress)
    except native.FormatError as e:
        raise NgramFormatError(f"{e} (expected an original DART .trie as written by fvliang/DART "
                               f"TrieNgram::save)") from None
    finally:
        bar.close()
    stats.update(seconds=round(time.perf_counter() - t0, 3), out=str(dst),
                 bytes_per_node=round(stats["file_size"] / max(1, stats["node_count"]), 2))
    return stats
