"""The self-distillation corpus: one JSON object per line (``.jsonl`` or ``.jsonl.gz``) with
``id``, ``prompt_ids`` (the chat-templated prompt, exactly as fed) and ``response_ids`` (the
target's own greedy continuation; EOS included when reached). Other fields are ignored.

    rows = load_distill_rows("corpus/smollm2-135m-instruct.jsonl.gz")   # made by dart_core.training.regenerate
    rows = load_distill_rows("owner/name:smollm2-135m-instruct.jsonl.gz")   # a Hub dataset (see below)
    train, heldout = split_rows(rows, heldout_permille=20)
    for epoch, batch in iterate_batches(train, batch_size=8, seed=0): ...

``--data`` is a local file, or a Hub dataset id ``owner/name[:file]`` (``file`` may be omitted when the
dataset holds one ``.jsonl``/``.jsonl.gz`` file). A Hub id resolves through huggingface_hub: from the
Hugging Face cache first, then, only when online (``HF_HUB_OFFLINE`` unset), from the Hub.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np


class DataError(ValueError):
    """A corpus file is missing or malformed; the message names the file and line."""


@dataclass
class DistillRow:
    id: str
    prompt_ids: list[int]
    response_ids: list[int]
    source: str | None = None

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def open_text(path: str | Path) -> io.TextIOBase:
    path = Path(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


#: ``owner/name`` or ``owner/name:path/in/repo`` (a Hub dataset id; a local path is never taken for one
#: when it exists, and a corpus file name such as ``runs/x.jsonl.gz`` is never taken for a repository)
_HUB_DATASET = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+?)(?::(?P<file>[^:]+))?$")
_CORPUS_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".gz")
_CORPUS_PATTERNS = ["*.jsonl", "*.jsonl.gz", "**/*.jsonl", "**/*.jsonl.gz"]


def hub_dataset_id(text: str) -> tuple[str, str | None] | None:
    """``(repo_id, file or None)`` when ``text`` reads as a Hub dataset id ``owner/name[:file]``, else None."""
    m = _HUB_DATASET.match(text.strip())
    if m is None or m.group("repo").endswith(_CORPUS_SUFFIXES):
        return None
    return m.group("repo"), m.group("file")


def resolve_data(data: str | Path) -> Path:
    """``--data`` as a local file: the path itself, or a Hub dataset's file from the cache / (online) the Hub."""
    from ..data_sources import DataSourceError, HubFile, hub_file, hub_offline, hub_snapshot

    path = Path(data)
    if path.is_file():
        return path
    hub = hub_dataset_id(str(data))
    if hub is None:
        raise DataError(f"training data {path} does not exist (--data); give the distillation corpus "
                        "(e.g. regenerate it with "
                        "`python -m dart_core.training.regenerate`); a Hub dataset is given as owner/name[:file]")
    repo_id, filename = hub
    offline = " (offline: HF_HUB_OFFLINE is set, so only the Hugging Face cache was read)" if hub_offline() else ""
    try:
        if filename is not None:
            src = HubFile(repo_id, filename)
            found = hub_file(src)
            if found is None:
                raise DataError(f"training data {data}: {filename} of the dataset {repo_id} is not in the Hugging "
                                f"Face cache{offline}; fetch it with `{src.download_command()}` (--data)")
            return found
        folder = hub_snapshot(repo_id, patterns=_CORPUS_PATTERNS)
    except DataSourceError as exc:
        raise DataError(f"training data {data}: {exc} (--data)") from None
    if folder is None:
        raise DataError(f"training data {data}: the dataset {repo_id} is not in the Hugging Face cache{offline}; "
                        f"fetch it with `hf download {repo_id} --repo-type dataset` (--data)")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith((".jsonl", ".jsonl.gz")))
    if len(files) != 1:
        names = ", ".join(str(p.relative_to(folder)) for p in files) or "none"
        raise DataError(f"training data {data}: the dataset {repo_id} holds {len(files)} .jsonl[.gz] files "
                        f"({names}); name one as {repo_id}:FILE (--data)")
    return files[0]


def load_distill_rows(path: str | Path, limit: int | None = None, vocab_size: int | None = None,
                      min_response: int = 2) -> list[DistillRow]:
    """Read the corpus (a local file or a Hub dataset id ``owner/name[:file]``, see ``resolve_data``).
    Rows with fewer than ``min_response`` response tokens are skipped (nothing to learn).
    With ``vocab_size``, every id is range-checked (a corpus of another tokenizer fails here)."""
    path = resolve_data(path)
    rows: list[DistillRow] = []
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                d = json.loads(line)
                p, r = d["prompt_ids"], d["response_ids"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise DataError(f"{where}: expected a JSON object with prompt_ids and response_ids ({exc})") from None
            if not (isinstance(p, list) and isinstance(r, list) and p):
                raise DataError(f"{where}: prompt_ids must be a non-empty list and response_ids a list of token ids")
            if vocab_size is not None:
                bad = [t for t in p + r if not (isinstance(t, int) and 0 <= t < vocab_size)]
                if bad:
                    raise DataError(f"{where}: token id {bad[0]!r} outside the target vocabulary [0, {vocab_size}); "
                                    "was this corpus made with another tokenizer?")
            if len(r) < min_response:
                continue
            rows.append(DistillRow(id=str(d.get("id", f"line{lineno}")), prompt_ids=p, response_ids=r,
                                   source=d.get("source")))
            if limit is not None and len(rows) >= limit:
                break
    if not rows:
        raise DataError(f"{path} holds no usable rows (each needs prompt_ids and >= {min_response} response tokens)")
    return rows


def mix_corpora(parts: Sequence[str], out: str | Path, seed: int = 0) -> list[tuple[str, int]]:
    """Join corpus files into ``out`` (``.jsonl`` or ``.jsonl.gz``): each part ``FILE`` or ``FILE=ROWS`` adds all
    of its lines or a seeded random ``ROWS`` of them (kept in file order), lines as they are. Ids must be unique
    across the parts (the trainers' held-out split and resume go by id). Returns (file, rows written) per part."""
    import os

    picked: list[tuple[str, list[str]]] = []
    seen: dict[str, str] = {}
    for k, part in enumerate(parts):
        name, _, count = part.partition("=")
        try:
            want = int(count) if count else None
        except ValueError:
            raise DataError(f"{part}: the row count after '=' must be an integer (FILE=ROWS)") from None
        if want is not None and want < 0:
            raise DataError(f"{part}: the row count must be >= 0")
        path = resolve_data(name)
        with open_text(path) as f:
            lines = [ln if ln.endswith("\n") else ln + "\n" for ln in f if ln.strip()]
        if want is not None and want < len(lines):
            keep = np.sort(np.random.default_rng([seed, k]).permutation(len(lines))[:want])
            lines = [lines[i] for i in keep.tolist()]
        for lineno, ln in enumerate(lines, 1):
            try:
                row_id = str(json.loads(ln)["id"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{path}: a line without an 'id' (row {lineno} of those kept); mix needs ids") from None
            if row_id in seen:
                raise DataError(f"id {row_id!r} is in both {seen[row_id]} and {path}: the trainers split and resume "
                                "by id, so the parts must not share ids")
            seen[row_id] = str(path)
        picked.append((str(path), lines))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    data = "".join(ln for _, lines in picked for ln in lines).encode("utf-8")
    with open(tmp, "wb") as raw:
        if out.suffix == ".gz":
            # No name or time in the header: the same parts give the same bytes, so the feature cache (keyed by
            # the corpus bytes) is found again after a rerun.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                gz.write(data)
        else:
            raw.write(data)
    os.replace(tmp, out)
    return [(name, len(lines)) for name, lines in picked]


def _bucket(row_id: str) -> int:
    return int.from_bytes(hashlib.sha256(row_id.encode("utf-8")).digest()[:4], "little") % 1000


def split_rows(rows: Sequence[DistillRow], heldout_permille: int = 20) -> tuple[list[DistillRow], list[DistillRow]]:
    """A stable train / held-out split by a hash of the row id (the same rows are held out in every run)."""
    train = [r for r in rows if _bucket(r.id) >= heldout_permille]
    heldout = [r for r in rows if _bucket(r.id) < heldout_permille]
    return train, heldout


def truncate(row: DistillRow, max_len: int) -> DistillRow:
    """Keep at most ``max_len`` tokens (the response is cut; the prompt kept whole if it fits)."""
    if len(row) <= max_len:
        return row
    keep_resp = max(0, max_len - len(row.prompt_ids))
    return DistillRow(row.id, row.prompt_ids[:max_len], row.response_ids[:keep_resp], row.source)


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The row order of one epoch (deterministic, so a resumed run sees the same order)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def iterate_batches(n_rows: int, batch_size: int, seed: int, start_epoch: int = 0, start_cursor: int = 0
                    ) -> Iterator[tuple[int, int, list[int]]]:
    """Endless (epoch, cursor after the batch, row indices) over shuffled epochs; a batch never spans epochs."""
    epoch, cursor = start_epoch, start_cursor
    while True:
        order = epoch_order(n_rows, seed, epoch)
        while cursor < n_rows:
            idx = order[cursor: cursor + batch_size].tolist()
            cursor += len(idx)
            yield epoch, cursor, idx
        epoch, cursor = epoch + 1, 0


def corpus_stats(rows: Sequence[DistillRow]) -> dict:
    return {"rows": len(rows), "prompt_tokens": int(sum(len(r.prompt_ids) for r in rows)),
            "response_tokens": int(sum(len(r.response_ids) for r in rows))}
