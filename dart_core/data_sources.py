"""Where data files come from: a local folder, the Hugging Face cache, or (online only) the Hub.

A data file the project names (a benchmark question set, a distillation corpus) resolves in this order:

1. a local folder: ``--data-dir DIR`` or the environment variable ``DART_DATA_DIR``;
2. the Hugging Face cache (``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``): its
   ``datasets--owner--name/snapshots/<commit>/<file>`` layout, found with ``local_files_only=True``;
3. the Hub itself, through huggingface_hub, only when online (``HF_HUB_OFFLINE`` unset).

    src = HubFile("RedHatAI/speculator_benchmarks", "question.jsonl", revision="main")
    path = hub_file(src)            # a cached path, a downloaded path, or None (offline, not cached)

The environment is read at each call (not at import), so a test or a shell can point ``HF_HUB_CACHE``
and ``HF_HUB_OFFLINE`` elsewhere after the package is imported.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_DATA_DIR = "DART_DATA_DIR"


class DataSourceError(ValueError):
    """A data file could not be found or fetched; the message says where it looked and what to do."""


@dataclass(frozen=True)
class HubFile:
    """One file of a Hub repository, pinned to a revision (a commit sha or a named ref such as ``main``)."""
    repo_id: str
    filename: str
    revision: str = "main"
    repo_type: str = "dataset"

    def download_command(self) -> str:
        """The shell command that puts this file into the Hugging Face cache."""
        return (f"hf download {self.repo_id} {self.filename} --repo-type {self.repo_type} "
                f"--revision {self.revision}")

    def __str__(self) -> str:
        return f"{self.repo_type} {self.repo_id}@{self.revision}:{self.filename}"


def env_data_dir() -> Path | None:
    """``DART_DATA_DIR`` as a path, or None when unset or empty."""
    value = os.environ.get(ENV_DATA_DIR, "").strip()
    return Path(value).expanduser() if value else None


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value now (read at call time)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> str | None:
    """``HF_HUB_CACHE`` now, or None for huggingface_hub's own default."""
    value = os.environ.get("HF_HUB_CACHE", "").strip()
    return value or None


def cached_hub_file(src: HubFile) -> Path | None:
    """``src`` from the Hugging Face cache only (no network), or None when it is not there."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(src.repo_id, src.filename, repo_type=src.repo_type, revision=src.revision,
                                    cache_dir=hub_cache_dir(), local_files_only=True))
    except Exception:  # LocalEntryNotFoundError, EntryNotFoundError, a bad repo id: not in the cache
        return None


def hub_file(src: HubFile) -> Path | None:
    """``src`` from the cache, else downloaded when online; None when offline and not cached.
    A failed download raises DataSourceError naming the file and the command to fetch it."""
    found = cached_hub_file(src)
    if found is not None or hub_offline():
        return found
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(src.repo_id, src.filename, repo_type=src.repo_type, revision=src.revision,
                                    cache_dir=hub_cache_dir()))
    except Exception as exc:
        raise DataSourceError(f"could not download {src} from the Hugging Face Hub ({type(exc).__name__}: "
                              f"{exc}); fetch it with `{src.download_command()}`") from None


def cached_hub_snapshot(repo_id: str, repo_type: str = "dataset", revision: str | None = None,
                        patterns: list[str] | None = None) -> Path | None:
    """The cached snapshot folder of a repository (no network), or None."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision, cache_dir=hub_cache_dir(),
                                      allow_patterns=patterns, local_files_only=True))
    except Exception:
        return None


def hub_snapshot(repo_id: str, repo_type: str = "dataset", revision: str | None = None,
                 patterns: list[str] | None = None) -> Path | None:
    """A snapshot folder holding ``patterns`` of a repository: cached, else downloaded when online."""
    found = cached_hub_snapshot(repo_id, repo_type, revision, patterns)
    if found is not None or hub_offline():
        return found
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, repo_type=repo_type, revision=revision, cache_dir=hub_cache_dir(),
                                      allow_patterns=patterns))
    except Exception as exc:
        raise DataSourceError(f"could not download the {repo_type} {repo_id} from the Hugging Face Hub "
                              f"({type(exc).__name__}: {exc})") from None
