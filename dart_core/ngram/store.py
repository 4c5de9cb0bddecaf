"""N-gram store: the Python face of the native memory-mapped table (``native/src/ngram_*``).

A table (``.dngram``) holds the counts of every n-gram (n = 1..order) of a token corpus as a
breadth-first trie with sorted children; it is opened by mmap in O(1) and queried with the
original DART per-candidate back-off (docs/ARCHITECTURE.md section 6)::

    store = NgramStore.open("assets/ngram/smollm2-135m-instruct.dngram",
                            expected_fingerprint=tokenizer_fingerprint(tokenizer))
    probs, matched = store.query(context_ids, candidate_ids)

Building and importing tables: ngram/build.py; the command line (``python -m dart_core.ngram --help``):
ngram/cli.py.

Every problem with a file raises :class:`NgramFormatError` (a ``ValueError``) saying which
file, what is wrong and which command rebuilds it; a table built for another tokenizer
raises :class:`NgramTokenizerMismatch`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

try:  # the extension is built by `pip install -e .`; a clear error at use, not at import
    from .. import _native
except ImportError as _err:  # pragma: no cover - exercised only on a broken install
    _native = None
    _NATIVE_IMPORT_ERROR: ImportError | None = _err
else:
    _NATIVE_IMPORT_ERROR = None

log = logging.getLogger(__name__)

#: Tables up to this size are checksummed on every open (a few ms). Larger ones (imported full
#: tables) are checksummed on their first open only: the result is recorded beside the table
#: (:func:`verified_record_path`), keyed by size, mtime and body checksum, and later opens
#: trust the record (O(1)) until the file changes.
VERIFY_ON_OPEN_MAX_BYTES = 256 << 20

#: A table modified less than this many seconds ago is verified but not recorded: a rewrite in the
#: same timestamp tick could keep both its size and its mtime (git's "racy" index entries).
RECORD_MIN_AGE_S = 2.0

REBUILD_HINT = ("rebuild it with `python -m dart_core.ngram build --tokenizer MODEL --corpus FILES... --out TABLE` "
                "(or convert an original DART .trie with `python -m dart_core.ngram import`)")


class NgramFormatError(ValueError):
    """A table (or original .trie) is truncated, corrupted, of another format version, or
    otherwise unreadable. The message names the file and how to rebuild it."""


class NgramTokenizerMismatch(NgramFormatError):
    """The table was built with another tokenizer than the one it is used with."""


def require_native():
    """The compiled extension, or an ImportError that says how to build it."""
    if _native is None:
        raise ImportError("dart_core._native (the C++ N-gram store and pruner) is not built: run "
                          "`pip install -e .` in the repository (needs a C++17 compiler)") from _NATIVE_IMPORT_ERROR
    return _native


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A stable SHA-256 (hex) of a tokenizer's vocabulary (token <-> id, added tokens included)
    and its special tokens: two tokenizers with the same fingerprint map ids to the same text,
    so an N-gram table built with one is valid for the other."""
    vocab = tokenizer.get_vocab()
    specials = sorted({str(t) for t in getattr(tokenizer, "all_special_tokens", [])})
    payload = json.dumps({"vocab": sorted(((int(i), str(t)) for t, i in vocab.items())), "special": specials},
                         ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def tokenizer_vocab_size(tokenizer: Any) -> int:
    """Number of ids a tokenizer can produce (base vocabulary plus added tokens)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)


def _as_ids(x: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype != np.int64:
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64)
    return arr.reshape(-1)


class NgramStore:
    """A read-only, memory-mapped N-gram table. Use :meth:`open`."""

    def __init__(self, native: Any, path: str):
        self._native = native
        self.path = path
        self._header = native.header()

    @classmethod
    def open(cls, path: str | os.PathLike, expected_fingerprint: str | None = None,
             verify: bool | None = None) -> "NgramStore":
        """Map the table at ``path``.

        The header is always checked (magic, version, sizes: a truncated file fails here);
        the body checksum and structure are checked when ``verify`` is True, or when it is
        None and the file is at most ``VERIFY_ON_OPEN_MAX_BYTES``; a larger file is checked
        on its first open with ``verify=None`` and recorded as verified (later opens are O(1)
        until the file changes). ``verify=False`` skips the check. ``expected_fingerprint``
        (from :func:`tokenizer_fingerprint`) refuses a table built for another tokenizer.
        """
        native_mod = require_native()
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"N-gram table {path} does not exist; {REBUILD_HINT}")
        before = _file_stamp(path)   # taken before mapping: a file replaced meanwhile no longer matches
        verify_once = verify is None and before["size"] > VERIFY_ON_OPEN_MAX_BYTES
        if verify is None:
            verify = not verify_once
        try:
            native = native_mod.NgramStore(path, bool(verify))
        except native_mod.FormatError as e:
            raise NgramFormatError(f"{path}: {e}; {REBUILD_HINT}") from None
        store = cls(native, path)
        if verify_once:
            store._verify_once(before)
        if expected_fingerprint is not None and store.fingerprint != expected_fingerprint:
            raise NgramTokenizerMismatch(
                f"{path} was built for a tokenizer with fingerprint {store.fingerprint[:16] or '(none)'}..., but the "
                f"target's tokenizer has fingerprint {expected_fingerprint[:16]}...; its token ids mean other text. "
                f"Build a table for this tokenizer: `python -m dart_core.ngram build --tokenizer MODEL "
                f"--corpus FILES... --out TABLE`, or pass --ngram none to run without one")
        return store

    # ------------------------------------------------------------------ header
    @property
    def order(self) -> int:
        return int(self._header["order"])

    @property
    def node_count(self) -> int:
        return int(self._header["node_count"])

    @property
    def vocab_size(self) -> int:
        return int(self._header["vocab_size"])

    @property
    def fingerprint(self) -> str:
        return str(self._header["fingerprint"])

    @property
    def native(self) -> Any:
        """The extension's table object, for native code that queries it directly (the DART pruner)."""
        return self._native

    def info(self) -> dict[str, Any]:
        """Header fields, bytes per node and the builder's metadata (sources, command)."""
        d = dict(self._header)
        d["path"] = self.path
        d["bytes_per_node"] = d["file_size"] / max(1, d["node_count"])
        try:
            d["metadata"] = json.loads(self._native.metadata() or "{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            d["metadata"] = {"error": "metadata is not valid JSON"}
        return d

    def verify(self) -> None:
        """Check the body checksum and structure (O(file size)); raises NgramFormatError."""
        try:
            self._native.verify()
        except require_native().FormatError as e:
            raise NgramFormatError(f"{self.path}: {e}; {REBUILD_HINT}") from None

    def _verify_once(self, before: dict[str, int]) -> None:
        """A large table: trust a matching record of an earlier verification, else verify it now
        (raising NgramFormatError if damaged) and record the result. ``before``: the file's stamp
        taken before it was mapped."""
        record = verified_record_path(self.path)
        stamp = before | {"body_checksum": int(self._header["body_checksum"])}
        unchanged = _file_stamp(self.path) == before   # the mapped file is the one stamped
        try:
            if unchanged and json.loads(record.read_text()) == stamp:
                return
        except (OSError, ValueError):
            pass  # no record, or an unreadable one: verify
        log.info("verifying N-gram table %s (%.0f MB) once; the result goes to %s", self.path,
                 stamp["size"] / 1e6, record)
        try:
            self.verify()
        except NgramFormatError:
            record.unlink(missing_ok=True)
            raise
        # Record only what was verified: the file must be unchanged since, and old enough that a
        # later same-size rewrite would show in its mtime.
        if _file_stamp(self.path) != before or time.time() - before["mtime_ns"] / 1e9 < RECORD_MIN_AGE_S:
            return
        tmp = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(stamp))
            os.replace(tmp, record)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            log.warning("could not record that %s was verified (%s): it will be verified again on every "
                        "open; make its folder writable to open it in O(1)", self.path, e)

    # ------------------------------------------------------------------ queries
    def query(self, context: Sequence[int], candidates: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``P(x | context)`` for each candidate x with the original per-candidate back-off:
        for len = min(order-1, len(context)) down to 1, candidates not matched yet that
        continue the last ``len`` context tokens get count(suffix + x) / count(suffix).

        Returns ``(probs float64 [n], matched_len int32 [n])``; never-matched candidates get
        0 and 0. Token ids outside ``[0, vocab_size)`` raise ValueError. Releases the GIL.
        """
        try:
            return self._native.query(_as_ids(context), _as_ids(candidates))
        except require_native().FormatError as e:
            raise NgramFormatError(f"{self.path}: {e}") from None

    def continuations(self, context: Sequence[int]) -> tuple[int, int, np.ndarray, np.ndarray]:
        """Children of the longest suffix of ``context`` in the table:
        ``(matched_len, suffix_count, tokens [m], counts [m])``."""
        return self._native.continuations(_as_ids(context))

    def __repr__(self) -> str:
        return (f"NgramStore({self.path!r}, order={self.order}, nodes={self.node_count:,}, "
                f"vocab={self.vocab_size})")


def _file_stamp(path: str) -> dict[str, int]:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def verified_record_path(table: str | os.PathLike) -> Path:
    """Where the record of a large table's verification lives: ``TABLE.verified`` beside it."""
    table = Path(table)
    return table.with_name(table.name + ".verified")
