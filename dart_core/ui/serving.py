"""What one visitor may cost the visualiser's server: every serving limit, defined once (no torch, no Gradio).

A server is *hosted* when it runs on a Hugging Face Space (``SPACE_ID`` is set) or serves other machines
(``--listen`` or ``--share``); otherwise it is *local* (one user on 127.0.0.1). ``serving_limits`` picks the
set; the page (dart_core.page) applies it (Gradio's upload limit, queue size and file clean-up, the run and
replay checks, the memory budget of cached tabs) and README.md's "Serving limits" table lists the same names and values
(``python -m dart_core.ui.serving`` prints that table; tests/page/test_app_serving.py checks README.md against it).

    limits = serving_limits(listen=args.listen, share=args.share)   # HOSTED or LOCAL
    limits.run_time_limit_s                                            # 120.0 hosted, None local

The knob ranges (tree budget, top-k, ...) are a different matter: dart_core.presets.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import Any, Mapping

from .. import space

MB = 1024 * 1024
GB = 1024 * MB


#: What each limit bounds: the README table's last column (``readme_table``).
MEANING: dict[str, str] = {
    "max_upload_bytes": "size of a file uploaded to *Replay* (Gradio's `max_file_size`: refused while it uploads)",
    "replay_max_tree_nodes": "draft-tree nodes of any one step of a replayed file (drawing a tree costs ~75 µs "
                             "a node per slider move; the page's own runs have at most 1,025)",
    "replay_max_candidates": "scored candidates of any one step of a replayed file (the score scatter, ~17 µs "
                             "each per slider move; the sliders' maxima give EAGLE-3 16,416)",
    "run_time_limit_s": "wall time of one run, from when it leaves the queue; the run stops there and says so",
    "max_new_tokens": "answer tokens of one request: caps `--max-new-tokens`, and so the slider",
    "session_memory_bytes": "memory all tabs hold between requests (their runs' traces and step-once engines' "
                            "KV caches, estimated): the least recently used tab is released first, and a run "
                            "that alone outgrows it stops",
    "queue_max_size": "requests waiting for the engine slot (one request runs at a time); more are refused",
    "file_ttl_s": "exported trace files and uploads are deleted once this old (Gradio's `delete_cache`) ...",
    "file_sweep_s": "... by a sweep this often; a tab's own export folder goes when the tab is released, and a "
                    "tab keeps only its latest export",
}


@dataclass(frozen=True)
class ServingLimits:
    """One server's limits: each field (but ``name``) is one limit, ``None`` = none of that kind. What each
    bounds: ``MEANING``."""
    name: str
    max_upload_bytes: int
    replay_max_tree_nodes: int
    replay_max_candidates: int
    run_time_limit_s: float | None
    max_new_tokens: int | None
    session_memory_bytes: int
    queue_max_size: int
    file_ttl_s: int
    file_sweep_s: int

    def cap_new_tokens(self, requested: int) -> int:
        """The --max-new-tokens this server serves: ``requested``, capped by ``max_new_tokens``."""
        return requested if self.max_new_tokens is None else min(int(requested), self.max_new_tokens)

    def gradio_delete_cache(self) -> tuple[int, int]:
        """gr.Blocks(delete_cache=...): (how often, how old) in seconds."""
        return (self.file_sweep_s, self.file_ttl_s)

    def replay_problem(self, record: Any) -> str | None:
        """None when a replayed RunRecord is within the replay limits, else the sentence the page shows."""
        for run in getattr(record, "runs", {}).values():
            for st in run.traces:
                nodes = len(st.tree)
                if nodes > self.replay_max_tree_nodes:
                    return (f"{run.label} step {st.step} has a draft tree of {nodes:,} nodes; this server replays "
                            f"trees of at most {self.replay_max_tree_nodes:,} nodes (replay_max_tree_nodes)")
                cands = len(st.candidates) if st.candidates is not None else 0
                if cands > self.replay_max_candidates:
                    return (f"{run.label} step {st.step} scored {cands:,} candidates; this server replays steps "
                            f"of at most {self.replay_max_candidates:,} candidates (replay_max_candidates)")
        return None

    def rows(self) -> list[tuple[str, str]]:
        """(field, value as README.md shows it) for every limit."""
        return [(f.name, describe(f.name, getattr(self, f.name))) for f in fields(self) if f.name != "name"]


def describe(name: str, value: Any) -> str:
    """A limit's value for people: bytes in MiB / GiB, seconds as such."""
    if value is None:
        return "none"
    if name.endswith("_bytes"):
        return f"{value / GB:g} GiB" if value >= GB else f"{value / MB:g} MiB"
    if name.endswith("_s"):
        return f"{value:g} s" + (f" ({value / 60:g} min)" if value >= 60 else "")
    return f"{value:,}"


# One user on their own machine: generous, but still bounded.
LOCAL = ServingLimits(
    name="local", max_upload_bytes=64 * MB, replay_max_tree_nodes=2048, replay_max_candidates=20_000,
    run_time_limit_s=None, max_new_tokens=None, session_memory_bytes=8 * GB, queue_max_size=64,
    file_ttl_s=30 * 60, file_sweep_s=10 * 60)

# A Space, --listen or --share: strangers share one engine slot.
HOSTED = ServingLimits(
    name="hosted", max_upload_bytes=16 * MB, replay_max_tree_nodes=2048, replay_max_candidates=20_000,
    run_time_limit_s=120.0, max_new_tokens=256, session_memory_bytes=2 * GB, queue_max_size=16,
    file_ttl_s=30 * 60, file_sweep_s=10 * 60)


def is_hosted(*, listen: bool = False, share: bool = False, env: Mapping[str, str] | None = None) -> bool:
    """True on a Hugging Face Space or when serving other machines (--listen, --share)."""
    return bool(listen or share or space.on_space(env))


def serving_limits(*, listen: bool = False, share: bool = False, env: Mapping[str, str] | None = None
                   ) -> ServingLimits:
    return HOSTED if is_hosted(listen=listen, share=share, env=env) else LOCAL


def readme_table() -> str:
    """The Markdown table of README.md's "Serving limits" section."""
    lines = ["| limit | local | hosted | bounds |", "| --- | --- | --- | --- |"]
    for (name, local), (_, hosted) in zip(LOCAL.rows(), HOSTED.rows()):
        lines.append(f"| `{name}` | {local} | {hosted} | {MEANING[name]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(readme_table() + "\n")
