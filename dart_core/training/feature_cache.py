"""The target-feature cache: one target pass over a distillation corpus, read by every epoch of both trainers.

Training a head needs, per sequence, the target's aux hidden states and its next-token distribution.
Recomputing them is most of a CPU training step, and they never change for a fixed target and corpus.
``build_feature_cache`` computes them once with the trainers' own forward (``features.target_states``,
so cached and on-the-fly features agree) and ``FeatureCache`` serves them as ``SequenceFeatures``.

A cache is a directory named by the first 16 hex digits of its fingerprint (a hash of the format
version, the target's name, config, dtype and weights, the corpus file's bytes, the aux layers and
``top_k``) under ``<user cache>/features/``:

    meta.json       fingerprint and what went into it, the row table (id, prompt length, length, offsets)
    aux.bin         bf16 bits [tokens, 3H]: the hidden states entering the aux layers, every position
    topk_ids.bin    uint16 or int32 [answer rows, top_k]: the target's top-k next tokens (target ids), by
                    probability; row r of a sequence with prompt length P is position P + r (it predicts
                    token P + r + 1), for r in 0..T-P-2
    topk_logp.bin   float16 [answer rows, top_k]: their log-probabilities under the full softmax
    progress.json   rows done, per chunk of rows: a SHA-256 per file, the mass the top-k kept, the seconds

The pass writes ``chunk_rows`` rows at a time and records a chunk in progress.json only after its
bytes are flushed, so a killed pass resumes where it stopped, losing at most one chunk. Readers check
each chunk's checksums the first time they touch it. Under torchrun (``train features``) the ranks
share the chunks (rank r takes every world-th), each recording its own in ``progress.rank{r}.json``;
rank 0 merges them into progress.json at the end, and a reader only ever opens that one.

Why top-k and not the whole distribution: the full distribution over an 8k draft vocabulary would be
16 kB per answer token (25 GB for the bundled corpus). k = 128 is the smallest power of two that keeps
at least 99% of the bundled target's probability mass on average (100 random rows of its corpus, 23k
answer positions: k 64 -> 98.83%, 128 -> 99.27%, 192 -> 99.45%, 256 -> 99.56%) at 512 bytes per
answer token; the build records the mean kept mass over the whole corpus.
The training loss renormalises the kept mass over the draft vocabulary, as before.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..config import dtype_name
from .data import DistillRow, load_distill_rows, resolve_data
from .features import SequenceFeatures, target_states

logger = logging.getLogger(__name__)

FORMAT = "dart-demo-target-features"
VERSION = 1
DEFAULT_TOP_K = 128
DEFAULT_CHUNK_ROWS = 32
FILES = ("aux", "topk_ids", "topk_logp")


class FeatureCacheError(ValueError):
    """A feature cache is missing, incomplete, damaged or built for another target or corpus."""


def cache_dir_root() -> Path:
    from ..models.bundled import cache_root

    return cache_root() / "features"


# ---------------------------------------------------------------------------------------------- fingerprint
def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def target_digest(target) -> str:
    """SHA-256 over the target's parameters and buffers (names and bytes): two checkpoints of one
    architecture never share a cache."""
    h = hashlib.sha256()
    for name, t in sorted(target.model.state_dict().items()):
        h.update(name.encode())
        h.update(str(t.dtype).encode())
        h.update(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint_parts(target, data: str | Path, top_k: int) -> dict:
    from ..models.bundled import BUNDLED_ALIASES
    # One name per target: `--target bundled` and no --target load the same model under two names, and a cache
    # built under one must be found under the other (the weights' digest below is what identifies a target).
    name = "bundled" if target.name in BUNDLED_ALIASES else target.name
    return {"format": FORMAT, "version": VERSION, "target": name,
            "target_config": target.model.config.to_json_string(use_diff=False),
            "target_dtype": dtype_name(target.dtype), "target_weights": target_digest(target),
            "corpus_sha256": file_sha256(resolve_data(data)), "aux_layers": list(target.aux_layer_ids), "top_k": int(top_k)}


def fingerprint(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def default_cache_path(fp: str) -> Path:
    return cache_dir_root() / fp[:16]


# ---------------------------------------------------------------------------------------------- layout
def _row_table(rows: Sequence[DistillRow]) -> np.ndarray:
    """[N, 4] int64: prompt length, length, token offset, answer-row offset."""
    table = np.zeros((len(rows), 4), dtype=np.int64)
    tok = resp = 0
    for i, r in enumerate(rows):
        P, T = len(r.prompt_ids), len(r)
        table[i] = (P, T, tok, resp)
        tok += T
        resp += T - 1 - P
    return table


def _ends(table: np.ndarray, b: int) -> tuple[int, int]:
    """Token and answer-row offsets just past rows [0, b)."""
    if b == 0:
        return 0, 0
    P, T, tok, resp = (int(v) for v in table[b - 1])
    return tok + T, resp + T - 1 - P


def _id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _chunk_bytes(arrays: dict[str, np.ndarray], table: np.ndarray, a: int, b: int) -> dict[str, memoryview]:
    """The byte ranges of rows [a, b) in each file."""
    tok0, resp0 = int(table[a, 2]), int(table[a, 3])
    tok1, resp1 = _ends(table, b)
    return {"aux": memoryview(arrays["aux"][tok0:tok1]).cast("B"),
            "topk_ids": memoryview(arrays["topk_ids"][resp0:resp1]).cast("B"),
            "topk_logp": memoryview(arrays["topk_logp"][resp0:resp1]).cast("B")}


def _digests(views: dict[str, memoryview]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in views.items()}


def _open_arrays(path: Path, meta: dict, mode: str) -> dict[str, np.ndarray]:
    tokens, answers = meta["tokens"], meta["answer_rows"]
    k, width = meta["top_k"], meta["aux_dim"]
    shapes = {"aux": ((tokens, width), np.uint16), "topk_ids": ((answers, k), np.dtype(meta["id_dtype"])),
              "topk_logp": ((answers, k), np.float16)}
    out = {}
    for name, (shape, dtype) in shapes.items():
        f = path / f"{name}.bin"
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if mode == "w+" and not f.exists():
            with open(f, "wb") as fh:  # sparse until written
                fh.truncate(size)
        if size == 0:
            out[name] = np.zeros(shape, dtype=dtype)
            continue
        if not f.is_file():
            raise _damaged(path, f"{f.name} is missing")
        if f.stat().st_size != size:
            raise _damaged(path, f"{f.name} holds {f.stat().st_size} bytes, not the {size} its meta.json expects")
        out[name] = np.memmap(f, dtype=dtype, mode="r+" if mode == "w+" else "r", shape=shape)
    return out


def _damaged(path: Path, what: str) -> "FeatureCacheError":
    return FeatureCacheError(f"the feature cache {path} is damaged: {what}. Delete that directory and rebuild it "
                             "with `python -m dart_core.train features` (or drop --features / use --features none)")


# ---------------------------------------------------------------------------------------------- the pass
@torch.no_grad()
def build_feature_cache(target, data: str | Path, out: str | Path | None = None, *, top_k: int = DEFAULT_TOP_K,
                        chunk_rows: int = DEFAULT_CHUNK_ROWS, limit: int | None = None,
                        progress: bool = True, rank: int = 0, world: int = 1,
                        barrier: Callable[[], None] | None = None) -> Path:
    """Run ``target`` over every row of the corpus ``data`` and write (or finish) the cache; returns its
    directory (``out``, or the default path of its fingerprint). Rerun after a kill to resume.

    Several ranks (``train features`` under torchrun) build one cache in shards: rank r computes the chunks
    c with c % world == r into the shared files (disjoint byte ranges) and records them in its own
    ``progress.rank{r}.json``; after ``barrier()`` rank 0 merges every record into progress.json, the one file
    a reader opens. A killed build resumes at any world size: the chunks recorded anywhere are kept."""
    from tqdm.auto import tqdm

    if top_k < 1:
        raise FeatureCacheError(f"--top-k must be >= 1, got {top_k}")
    if chunk_rows < 1:
        raise FeatureCacheError(f"--chunk-rows must be >= 1, got {chunk_rows}")
    if world > 1 and barrier is None:
        raise ValueError("a build on several ranks needs their barrier")
    top_k = min(int(top_k), int(target.vocab_size))
    rows = load_distill_rows(data, limit=limit, vocab_size=target.vocab_size)
    parts = fingerprint_parts(target, data, top_k)
    if limit is not None:
        parts["limit"] = int(limit)
    fp = fingerprint(parts)
    path = Path(out) if out is not None else default_cache_path(fp)
    table = _row_table(rows)
    tokens, answers = _ends(table, len(table))
    meta = {**{k: v for k, v in parts.items() if k != "target_config"}, "fingerprint": fp, "data": str(data),
            "rows": len(rows), "tokens": tokens, "answer_rows": answers, "aux_dim": 3 * target.hidden_size,
            "vocab_size": target.vocab_size, "id_dtype": _id_dtype(target.vocab_size).name,
            "chunk_rows": int(chunk_rows), "ids": [r.id for r in rows], "table": table.tolist()}
    meta_path = path / "meta.json"
    if meta_path.exists():   # every rank checks, so that each names the problem itself
        old = _read_json(meta_path)
        if old.get("fingerprint") != fp or old.get("chunk_rows") != chunk_rows:
            raise FeatureCacheError(f"{path} holds a feature cache of another target, corpus or layout "
                                    f"({_describe(old)}); choose another --features directory or delete it")
    if rank == 0:            # one writer of meta.json and the (sparse) files; the others open them after
        path.mkdir(parents=True, exist_ok=True)
        if not meta_path.exists():
            _write_json_atomic(meta_path, meta)
        arrays = _open_arrays(path, meta, "w+")
    if barrier is not None:
        barrier()
    if rank != 0:
        arrays = _open_arrays(path, meta, "w+")
    done = _recorded_chunks(path, chunk_rows, len(rows))
    n_chunks = -(-len(rows) // chunk_rows)
    if len(done) == n_chunks and _read_json(path / "progress.json").get("complete"):
        logger.info("feature cache %s is complete (%d rows)", path, len(rows))
        return path
    mine = [c for c in range(n_chunks) if c % world == rank and c not in done]
    own_path = path / ("progress.json" if world == 1 else f"progress.rank{rank}.json")
    # A rank's file keeps what it held (an earlier run's records), plus, on one rank, every record found.
    own = done if world == 1 else _chunk_records(own_path, chunk_rows, len(rows))
    dev = target.device
    w = target.model.get_output_embeddings().weight
    bar = tqdm(total=sum(_chunk_tokens(table, c, chunk_rows) for c in mine), unit="tok", unit_scale=True,
               desc="target features" if world == 1 else f"target features (rank {rank} of {world})",
               disable=not progress, file=sys.stderr, dynamic_ncols=True, smoothing=0.05)
    for c in mine:
        t_start = time.perf_counter()
        a, b = c * chunk_rows, min(len(rows), (c + 1) * chunk_rows)
        kept = 0.0
        for i in range(a, b):
            P, T, tok, resp = (int(v) for v in table[i])
            x = torch.as_tensor(rows[i].ids, dtype=torch.long, device=dev)
            aux, last = target_states(target, x, P)
            logp = torch.log_softmax((last @ w.T).float(), dim=-1)
            top = logp.topk(top_k, dim=-1)
            arrays["aux"][tok:tok + T] = aux.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
            arrays["topk_ids"][resp:resp + T - 1 - P] = top.indices.cpu().numpy().astype(meta["id_dtype"])
            arrays["topk_logp"][resp:resp + T - 1 - P] = top.values.cpu().numpy().astype(np.float16)
            kept += float(top.values.exp().sum())
            bar.update(T)
        for arr in arrays.values():
            if isinstance(arr, np.memmap):
                arr.flush()
        own[c] = {"rows": [a, b], "sha256": _digests(_chunk_bytes(arrays, table, a, b)), "kept_mass": kept,
                  "elapsed_s": time.perf_counter() - t_start}
        _write_json_atomic(own_path, _progress(own, table, len(rows)))
    bar.close()
    if barrier is not None:
        barrier()
    if rank == 0:
        merged = _recorded_chunks(path, chunk_rows)
        _write_json_atomic(path / "progress.json", _progress(merged, table, len(rows)))
        if len(merged) == n_chunks:   # the ranks' records are all in progress.json now
            for f in path.glob("progress.rank*.json"):
                f.unlink()
    if barrier is not None:
        barrier()           # every rank returns a cache that rank 0 has finished
    st = cache_status(path)
    logger.info("feature cache %s: %d rows, %d tokens, top-%d keeps %.4f of the mass on average, %.0f s",
                path, len(rows), tokens, top_k, st.kept_mass, st.elapsed_s)
    return path


def _chunk_tokens(table: np.ndarray, c: int, chunk_rows: int) -> int:
    a, b = c * chunk_rows, min(len(table), (c + 1) * chunk_rows)
    return _ends(table, b)[0] - int(table[a, 2])


def _read_json(path: Path) -> dict:
    """A cache's JSON file ({} when absent); a file that is not a JSON object is a damaged cache."""
    if not path.is_file():
        return {}
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _damaged(path.parent, f"{path.name} is not JSON ({exc})") from None
    if not isinstance(out, dict):
        raise _damaged(path.parent, f"{path.name} is not a JSON object")
    return out


def _chunk_records(path: Path, chunk_rows: int, n_rows: int | None = None) -> dict[int, dict]:
    """chunk index -> record, from one progress file. Files of format 1 before shards kept the mass and the
    seconds as run totals only: they go to the first chunk, so that the sums stay right. A record that is not
    one whole chunk of the corpus (``n_rows`` rows) is a damaged file."""
    prog = _read_json(path)
    chunks = prog.get("chunks", [])
    if not isinstance(chunks, list) or not all(isinstance(r, dict) for r in chunks):
        raise _damaged(path.parent, f"{path.name}'s chunks are not a list of records")
    if chunks and "kept_mass" not in chunks[0]:
        chunks = [{**r, "kept_mass": 0.0, "elapsed_s": 0.0} for r in chunks]
        chunks[0].update(kept_mass=float(prog.get("kept_mass_sum", 0.0)), elapsed_s=float(prog.get("elapsed_s", 0.0)))
    out = {}
    for r in chunks:
        rows = r.get("rows")
        ok = (isinstance(rows, list) and len(rows) == 2 and all(isinstance(x, int) for x in rows)
              and 0 <= rows[0] < rows[1] and rows[0] % chunk_rows == 0 and rows[1] - rows[0] <= chunk_rows
              and (n_rows is None or rows[1] == min(n_rows, rows[0] + chunk_rows))
              and isinstance(r.get("sha256"), dict))
        if not ok:
            raise _damaged(path.parent, f"{path.name} records rows {rows!r}, not a chunk of the corpus's "
                                        f"{n_rows if n_rows is not None else '?'} rows in steps of {chunk_rows}")
        out[rows[0] // chunk_rows] = r
    return out


def _recorded_chunks(path: Path, chunk_rows: int, n_rows: int | None = None) -> dict[int, dict]:
    """Every chunk recorded done: in progress.json and in the ranks' files of a sharded build."""
    done: dict[int, dict] = {}
    for f in [path / "progress.json", *sorted(path.glob("progress.rank*.json"))]:
        done.update(_chunk_records(f, chunk_rows, n_rows))
    return done


def _progress(chunks: dict[int, dict], table: np.ndarray, n_rows: int) -> dict:
    """A progress file of these chunk records: the records in order and their totals (``rows_done``: rows in
    recorded chunks; ``elapsed_s``: compute seconds summed over the chunks, so over the ranks too)."""
    recs = [chunks[c] for c in sorted(chunks)]
    rows_done = sum(r["rows"][1] - r["rows"][0] for r in recs)
    answer_rows = sum(_ends(table, r["rows"][1])[1] - int(table[r["rows"][0], 3]) for r in recs)
    return {"rows_done": rows_done, "chunks": recs, "kept_mass_sum": sum(r["kept_mass"] for r in recs),
            "answer_rows_done": answer_rows, "elapsed_s": sum(r["elapsed_s"] for r in recs),
            "complete": rows_done == n_rows}


def _describe(meta: dict) -> str:
    return (f"target {meta.get('target')!r}, corpus {meta.get('data')!r}, fingerprint "
            f"{str(meta.get('fingerprint'))[:16]}")


# ---------------------------------------------------------------------------------------------- the reader
def _read_meta(path: Path) -> dict:
    meta = _read_json(path / "meta.json")
    need = ("table", "rows", "chunk_rows", "tokens", "answer_rows", "top_k", "aux_dim", "id_dtype", "ids")
    missing = [k for k in need if k not in meta]
    if missing:
        raise _damaged(path, f"meta.json lacks {', '.join(missing)}")
    try:
        table = np.asarray(meta["table"], dtype=np.int64)
    except (TypeError, ValueError):
        raise _damaged(path, "meta.json's row table is not a table of integers") from None
    if table.size != 4 * int(meta["rows"]) or len(meta["ids"]) != int(meta["rows"]) or int(meta["chunk_rows"]) < 1:
        raise _damaged(path, "meta.json's row table, ids and row count disagree")
    return meta


@dataclass
class CacheStatus:
    path: Path
    rows: int
    rows_done: int
    complete: bool
    kept_mass: float
    elapsed_s: float


def cache_status(path: str | Path) -> CacheStatus:
    """How far a build is: from progress.json, and the ranks' own files while a sharded build is unfinished."""
    path = Path(path)
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        raise FeatureCacheError(f"{path} is not a feature cache (no meta.json); build one with "
                                "`python -m dart_core.train features --data FILE`")
    meta = _read_meta(path)
    table = np.asarray(meta["table"], dtype=np.int64).reshape(-1, 4)
    prog = _progress(_recorded_chunks(path, int(meta["chunk_rows"]), int(meta["rows"])), table, int(meta["rows"]))
    # complete: the flag and every row in a record of progress.json itself (a record removed under a "complete"
    # flag would otherwise be read past)
    final = _progress(_chunk_records(path / "progress.json", int(meta["chunk_rows"]), int(meta["rows"])), table,
                      int(meta["rows"]))
    complete = bool(_read_json(path / "progress.json").get("complete", False)) and final["complete"]
    return CacheStatus(path, int(meta["rows"]), int(prog["rows_done"]), complete,
                       float(prog["kept_mass_sum"]) / max(int(prog["answer_rows_done"]), 1), float(prog["elapsed_s"]))


class FeatureCache:
    """A finished cache, opened read-only and checked against the target and corpus it is used with."""

    def __init__(self, path: str | Path, target, data: str | Path, *, expected_fingerprint: str | None = None):
        self.path = Path(path)
        status = cache_status(self.path)
        self.meta = _read_meta(self.path)
        if self.meta.get("format") != FORMAT or self.meta.get("version") != VERSION:
            raise FeatureCacheError(f"{self.path} is a feature cache of format {self.meta.get('format')!r} version "
                                    f"{self.meta.get('version')!r}; this code reads {FORMAT} version {VERSION}: "
                                    "rebuild it with `python -m dart_core.train features`")
        if not status.complete:
            raise FeatureCacheError(f"{self.path} is incomplete ({status.rows_done} of {status.rows} rows); finish it "
                                    "with the same `python -m dart_core.train features` command (it resumes)")
        if expected_fingerprint is None:
            expected_fingerprint = fingerprint(fingerprint_parts(target, data, int(self.meta["top_k"])))
        if self.meta["fingerprint"] != expected_fingerprint:
            raise FeatureCacheError(f"{self.path} was built for {_describe(self.meta)}, not for target "
                                    f"{target.name!r} with corpus {str(data)!r} (fingerprint "
                                    f"{expected_fingerprint[:16]}); rebuild it with `python -m dart_core.train "
                                    "features` for this target and corpus, or drop --features")
        self.chunks = _chunk_records(self.path / "progress.json", int(self.meta["chunk_rows"]),
                                     int(self.meta["rows"]))
        self.table = np.asarray(self.meta["table"], dtype=np.int64).reshape(-1, 4)
        self.index = {rid: i for i, rid in enumerate(self.meta["ids"])}
        self.arrays = _open_arrays(self.path, self.meta, "r")
        self.chunk_rows = int(self.meta["chunk_rows"])
        self._verified: set[int] = set()
        self.kept_mass = status.kept_mass

    @property
    def top_k(self) -> int:
        return int(self.meta["top_k"])

    def _verify_chunk(self, c: int) -> None:
        if c in self._verified:
            return
        rec = self.chunks[c]
        a, b = rec["rows"]
        got = _digests(_chunk_bytes(self.arrays, self.table, a, b))
        bad = [name for name in FILES if got[name] != rec["sha256"][name]]
        if bad:
            raise FeatureCacheError(f"{self.path}: rows {a}-{b - 1} of {', '.join(f + '.bin' for f in bad)} do not "
                                    "match their checksum (the file is damaged); delete the cache directory and "
                                    "rebuild it with `python -m dart_core.train features`")
        # The checksums only say the bytes are the ones recorded: a cache rewritten with its checksums must not
        # index t2d with a negative id (backwards, silently) or one past the vocabulary.
        resp0, resp1 = int(self.table[a, 3]), _ends(self.table, b)[1]
        ids = np.asarray(self.arrays["topk_ids"][resp0:resp1])
        vocab = int(self.meta["vocab_size"])
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise FeatureCacheError(f"{self.path}: rows {a}-{b - 1} of topk_ids.bin hold token id {bad}, outside the "
                                    f"target vocabulary [0, {vocab}) (the file is damaged); delete the cache "
                                    "directory and rebuild it with `python -m dart_core.train features`")
        self._verified.add(c)

    def features(self, row: DistillRow, draft_ids: torch.Tensor, device: torch.device | str = "cpu",
                 aux_dtype: torch.dtype = torch.bfloat16) -> SequenceFeatures:
        """The cached features of ``row`` (possibly truncated, as ``data.truncate`` does) over the draft
        vocabulary ``draft_ids``: ``logits`` hold the top-k log-probs that fall in the draft vocabulary
        and -inf elsewhere (softmax renormalises them); ``argmax`` is the full-vocabulary argmax."""
        i = self.index.get(row.id)
        if i is None:
            raise FeatureCacheError(f"row {row.id!r} is not in the feature cache {self.path}: the cache was built "
                                    "from another corpus; rebuild it or drop --features")
        P, T, tok, resp = (int(v) for v in self.table[i])
        t, p = len(row), len(row.prompt_ids)
        if p != P or t > T:
            raise FeatureCacheError(f"row {row.id!r} has {p} prompt and {t} tokens, the cache {P} and {T}: the cache "
                                    "was built from another corpus; rebuild it or drop --features")
        self._verify_chunk(i // self.chunk_rows)
        R = max(t - 1 - P, 0)
        aux = torch.from_numpy(np.array(self.arrays["aux"][tok:tok + t]).view(np.int16)).view(torch.bfloat16)
        ids_k = torch.from_numpy(np.asarray(self.arrays["topk_ids"][resp:resp + R]).astype(np.int64))
        logp_k = torch.from_numpy(np.asarray(self.arrays["topk_logp"][resp:resp + R]).astype(np.float32))
        t2d = torch.full((int(self.meta["vocab_size"]),), -1, dtype=torch.long)
        t2d[draft_ids.cpu()] = torch.arange(draft_ids.numel())
        d = t2d[ids_k]                                                   # [R, k] draft ids, -1 outside
        logits = torch.full((R, draft_ids.numel()), float("-inf"))
        inside = d >= 0
        rows_idx = torch.arange(R)[:, None].expand_as(d)
        logits[rows_idx[inside], d[inside]] = logp_k[inside]
        # A position whose top-k holds no draft token keeps a uniform row (its label is masked anyway).
        empty = ~inside.any(dim=1)
        logits[empty] = 0.0
        dev = torch.device(device)
        return SequenceFeatures(ids=torch.as_tensor(row.ids, dtype=torch.long, device=dev), prompt_len=P,
                                aux=aux.to(device=dev, dtype=aux_dtype), logits=logits.to(dev),
                                argmax=ids_k[:, 0].to(dev) if R else torch.empty(0, dtype=torch.long, device=dev))


def find_cache(target, data: str | Path, top_k: int = DEFAULT_TOP_K) -> FeatureCache | None:
    """The finished cache of this target and corpus in the user cache, or None."""
    fp = fingerprint(fingerprint_parts(target, data, min(top_k, target.vocab_size)))
    path = default_cache_path(fp)
    if not (path / "meta.json").is_file():
        return None
    try:
        return FeatureCache(path, target, data, expected_fingerprint=fp)
    except FeatureCacheError as exc:
        logger.warning("feature cache %s not used: %s", path, exc)
        return None
