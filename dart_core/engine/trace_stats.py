"""Analytics over StepTrace records that need no plotting: acceptance statistics, which step emitted
which answer token, how each token came (accepted draft or the target's own), node and candidate states.

The app's figures (dart_core.ui.viz_*), the run record (dart_core.ui.record) and the tests read these;
every function takes a :class:`StepTrace`, its ``to_dict()`` form or its JSON text.

    m = acceptance_metrics(traces)          # tau, draft acceptance rate, histogram, per depth (vLLM's definitions)
    k = step_for_token(traces, position)    # index of the step that emitted answer token ``position``
    tokens, labels = token_origins(traces)  # answer tokens, each labelled ACCEPTED_LABEL / BONUS_LABEL / PREFILL_LABEL
"""
from __future__ import annotations

import bisect
import json
from typing import Any, Mapping, Sequence, Union

import numpy as np

from .trace import StepTrace

#: How an answer token came (the labels of the page's highlighted answer).
ACCEPTED_LABEL = "accepted draft"
BONUS_LABEL = "target token (bonus)"
PREFILL_LABEL = "target token (prefill)"

TraceLike = Union[StepTrace, Mapping[str, Any], str]
#: Per scored candidate, the groups of :func:`candidate_groups`.
SCATTER_GROUPS = ("pruned", "kept", "accepted")


# ---------------------------------------------------------------------------------------------- inputs
def as_step(step: TraceLike) -> StepTrace:
    """A StepTrace from a StepTrace, its ``to_dict()`` form or its JSON text."""
    if isinstance(step, StepTrace):
        return step
    if isinstance(step, str):
        return StepTrace.from_json(step)
    if isinstance(step, Mapping):
        return StepTrace.from_dict(dict(step))
    raise TypeError(f"expected a StepTrace, its dict or its JSON text, got {type(step).__name__}")


def as_steps(steps: Sequence[TraceLike] | str) -> list[StepTrace]:
    """A list of StepTraces from traces, dicts, or a JSON list of trace dicts."""
    if isinstance(steps, str):
        steps = json.loads(steps)
    return [as_step(s) for s in steps]


def _floats(x: Any) -> list[float]:
    return [float(v) for v in np.asarray(x, dtype=np.float64).reshape(-1)]


def _ints(x: Any) -> list[int]:
    return [int(v) for v in np.asarray(x, dtype=np.int64).reshape(-1)]


# ---------------------------------------------------------------------------------------------- nodes
def candidate_nodes(step: TraceLike) -> list[int]:
    """Per scored candidate, its node index in ``step.tree`` (-1: pruned, or cut from the tree by
    the engine near the length limit; the engine renumbers ``candidates.node`` when it cuts)."""
    c = as_step(step).candidates
    return [] if c is None else _ints(c.node)


def node_states(step: TraceLike) -> list[str]:
    """Per tree node: "root", "accepted" or "rejected" (every non-root node was verified)."""
    st = as_step(step)
    states = ["rejected"] * len(st.tree)
    for n in st.accepted_nodes[1:]:
        states[int(n)] = "accepted"
    states[0] = "root"
    return states


def candidate_groups(step: TraceLike) -> list[str]:
    """Per scored candidate: "accepted" (on the accepted path), "kept" (in the tree, not accepted) or "pruned"."""
    st = as_step(step)
    if st.candidates is None:
        return []
    cn = candidate_nodes(st)
    acc = set(int(a) for a in st.accepted_nodes[1:])
    kept = [bool(k) for k in st.candidates.kept]
    return ["accepted" if cn[i] in acc and cn[i] > 0 else ("kept" if kept[i] else "pruned") for i in range(len(cn))]


# ---------------------------------------------------------------------------------------------- acceptance
def acceptance_metrics(steps: Sequence[TraceLike]) -> dict[str, Any]:
    """Acceptance statistics with vLLM's definitions.

    tau                   mean acceptance length: tokens emitted per verify step, bonus included
                          (the "compression ratio" of the DART/EAGLE apps)
    draft_acceptance_rate accepted drafted tokens / drafted tokens verified
    lengths               acceptance length per step; histogram: {length: steps}
    per_depth             per depth d >= 1: share of steps whose accepted path reached d (vLLM)
    per_depth_given_drafted  the same, among steps whose tree reached depth d
    Lengths count emitted tokens (the last step may be cut at EOS or a length limit);
    acceptance per depth counts what the target accepted.
    """
    sts = as_steps(steps)
    lengths = [st.acceptance_length for st in sts]
    accepted = [st.accepted_drafts for st in sts]
    drafted = [st.tree.num_drafted for st in sts]
    depth_reached = [st.tree.max_depth for st in sts]
    max_d = max(depth_reached + [0])
    per_depth, given = [], []
    for d in range(1, max_d + 1):
        hit = sum(a >= d for a in accepted)
        had = sum(m >= d for m in depth_reached)
        per_depth.append(hit / len(sts) if sts else 0.0)
        given.append(hit / had if had else 0.0)
    hist: dict[int, int] = {}
    for L in lengths:
        hist[L] = hist.get(L, 0) + 1
    return {
        "steps": len(sts), "tokens": sum(lengths), "tau": (sum(lengths) / len(sts)) if sts else 0.0,
        "drafted": sum(drafted), "accepted_drafts": sum(accepted),
        "draft_acceptance_rate": (sum(accepted) / sum(drafted)) if sum(drafted) else 0.0,
        "lengths": lengths, "histogram": dict(sorted(hist.items())),
        "per_depth": per_depth, "per_depth_given_drafted": given,
    }


# ---------------------------------------------------------------------------------------------- tokens
def step_for_token(steps: Sequence[TraceLike], position: int) -> int | None:
    """Index in ``steps`` of the step that emitted answer token ``position`` (0-based).

    None for the first answer token (chosen by the prefill, before any step) and for
    positions no step emitted. Steps must be in order, as the engine yields them.
    """
    sts = as_steps(steps)
    starts = [st.position for st in sts]
    k = bisect.bisect_right(starts, int(position)) - 1
    if k < 0:
        return None
    st = sts[k]
    return k if st.position <= position < st.position + len(st.emitted_tokens) else None


def token_origins(steps: Sequence[TraceLike]) -> tuple[list[int], list[str]]:
    """The answer tokens the steps cover and how each came: (tokens, labels).

    Starts with the first step's root (the token before it; answer position 0 for a full
    run, labelled as the prefill's), then each step's emitted tokens: its accepted drafts,
    then the target's bonus token.
    """
    sts = as_steps(steps)
    if not sts:
        return [], []
    first = sts[0]
    tokens = [int(first.tree.tokens[0])]
    labels = [PREFILL_LABEL if first.position == 1 else BONUS_LABEL]
    for st in sts:
        for i, tok in enumerate(st.emitted_tokens):
            tokens.append(int(tok))
            labels.append(ACCEPTED_LABEL if i < st.accepted_drafts else BONUS_LABEL)
    return tokens, labels
