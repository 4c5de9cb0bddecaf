"""Plain-words narration of one speculative step, from its StepTrace (no Gradio here).

    print(narrate_step(record.runs["dart"].traces[0], target.tokenizer).text)

The decisions are re-derived from the tree and the accepted path with the engine's own acceptance rules
(dart_core.engine.sampling), so the page can say what was drafted, what the target checked, why the
accepted path stopped and where the bonus token came from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine.trace import StepTrace
from .record import Decode, decoder_fn, label_of


@dataclass
class Decision:
    """What happened at one node of the accepted path.

    node          the tree node where the target chose the next token
    target_choice the target's most likely token there
    tried         children compared / tried, in draft-rank order: (node, token, p_target, p_accept);
                  p_accept is the chance sampling gave it after earlier siblings were rejected (greedy: None)
    accepted      the child that was accepted (None: the path stopped here)
    """
    node: int
    target_choice: int
    tried: list[tuple[int, int, float, float | None]]
    accepted: int | None


@dataclass
class Narration:
    engine: str
    step: int
    mode: str
    decisions: list[Decision]
    accepted_path: list[int]       # tree nodes, root first (as the decisions imply)
    bonus_token: int
    text: str                      # Markdown for the page


def _q(decode: Decode, tok: int) -> str:
    s = decode([int(tok)])
    s = s.replace("\n", "\u21b5").replace("`", "'")
    return f"`{s}`" if s.strip() else f"`{s!r}`"


def narrate_step(trace: StepTrace, decode: Any, engine: str = "dart") -> Narration:
    """Explain one speculative round in plain words, from its trace: what was drafted, what the target
    checked, why the accepted path stopped, and where the bonus token came from.

    The decisions are derived from the tree and the accepted path with the engine's own rules
    (dart_core.engine.sampling): greedy follows the child equal to the target's argmax; sampling tries
    children in draft-rank order and accepts child x with p(x) renormalised over what earlier
    rejections left. ``decode``: a tokenizer or a callable ids -> text.
    """
    raw = decode.decode if hasattr(decode, "decode") else decoder_fn(decode)
    dec: Decode = lambda ids: raw(list(ids))  # noqa: E731
    st = trace
    tree = st.tree
    children = tree.children()
    path = [int(n) for n in st.accepted_nodes]
    greedy = st.mode == "greedy"
    decisions: list[Decision] = []
    for i, node in enumerate(path):
        nxt = path[i + 1] if i + 1 < len(path) else None
        kids = children[node]
        tried_nodes = kids[: kids.index(nxt) + 1] if nxt is not None and nxt in kids else list(kids)
        tried: list[tuple[int, int, float, float | None]] = []
        rejected_mass = 0.0
        for c in tried_nodes:
            p = float(st.node_target_prob[c]) if c < len(st.node_target_prob) else float("nan")
            if greedy:
                tried.append((c, int(tree.tokens[c]), p, None))
            else:
                left = 1.0 - rejected_mass
                tried.append((c, int(tree.tokens[c]), p, (p / left) if left > 0 else 0.0))
                if c != nxt:
                    rejected_mass += p
        decisions.append(Decision(node=node, target_choice=int(st.node_target_argmax[node]), tried=tried,
                                  accepted=nxt))

    label = label_of(engine)
    n_drafted = tree.num_drafted
    lines: list[str] = []
    start, n_emit = st.position, len(st.emitted_tokens)
    lines.append(f"**{label}, step {st.step}** (answer tokens {start}\u2013{start + n_emit - 1}, "
                 f"{'greedy' if greedy else 'sampling'})")
    if n_drafted == 0:
        why = (f"{label} decoding proposes no draft" if engine == "vanilla" else
               "the tree was cut to its root (only one more answer token was allowed, so drafts could not be used)"
               if st.stop_reason is not None else "the drafter proposed no draft this step")
        lines.append(f"- **Drafted:** nothing: {why}, so the target's one forward pass gives exactly one token, "
                     f"{_q(dec, st.bonus_token)}.")
        lines.append("- **Result:** 0 drafted tokens accepted + 1 from the target = 1 token for one target "
                     "forward pass.")
        return Narration(engine, st.step, st.mode, decisions, path, int(st.bonus_token), "\n".join(lines))
    cands = st.candidates
    if engine == "dart":
        how = "the DART head ran **once** and scored"
        if cands is not None:
            n_pruned = int(len(cands) - sum(bool(k) for k in cands.kept))
            how += (f" {len(cands)} candidate continuations (logit term + N-gram term); the pruner kept the best "
                    f"{n_drafted} and dropped {n_pruned}")
    elif engine == "eagle3":
        how = "the EAGLE-3 head ran **once per tree level** (depth by depth) and kept the best-ranked"
        if cands is not None:
            how += f" {n_drafted} of {len(cands)} candidates by cumulative log-probability"
    else:
        how = f"the drafter proposed {n_drafted} tokens"
    best = [int(n) for n in tree.children()[0][:1]]
    lines.append(f"- **Drafted:** {how}, a tree of {n_drafted} tokens up to {tree.max_depth} deep after the "
                 f"root {_q(dec, tree.tokens[0])} (the last committed token)."
                 + (f" Its top first guess was {_q(dec, tree.tokens[best[0]])}." if best else ""))
    lines.append(f"- **Checked:** the target ran **one forward pass** over all {len(tree)} nodes at once and "
                 "computed, after every node, which token it would choose itself.")
    rule = ("greedy: a drafted token is accepted when it is exactly the target's top choice"
            if greedy else
            "sampling: each drafted child x is tried in draft order and accepted with probability p(x) (the "
            "target's probability after temperature / top-k / top-p, renormalised over what earlier "
            "rejections left); since drafts are fixed tokens this keeps the output distribution exactly the "
            "target's")
    lines.append(f"- **Rule** ({rule}):")
    for d in decisions:
        at = _q(dec, tree.tokens[d.node])
        if greedy:
            want = _q(dec, d.target_choice)
            offered = ", ".join(_q(dec, t) for _, t, _, _ in d.tried)
            if d.accepted is not None:
                lines.append(f"  - after {at} the target's top choice is {want}; the draft offered {offered} "
                             f"\u2192 {_q(dec, tree.tokens[d.accepted])} matches: **accepted**.")
            elif not d.tried:
                lines.append(f"  - after {at} nothing was drafted (a leaf of the tree), so the path stops here.")
            else:
                lines.append(f"  - after {at} the target's top choice is {want}, but the draft offered only "
                             f"{offered} \u2192 no match: **the path stops here**.")
        else:
            parts = []
            for c, t, p, pa in d.tried:
                verdict = "accepted" if c == d.accepted else "rejected"
                parts.append(f"{_q(dec, t)} (p = {p:.3f}, chance {pa:.3f}: {verdict})")
            if d.accepted is not None:
                lines.append(f"  - after {at}: tried " + ", then ".join(parts) + ".")
            elif not d.tried:
                lines.append(f"  - after {at} nothing was drafted (a leaf of the tree), so the path stops here.")
            else:
                lines.append(f"  - after {at}: tried " + ", then ".join(parts) +
                             " \u2192 every child rejected: **the path stops here**.")
    last = decisions[-1]
    if greedy:
        bonus_how = "its own top choice there"
    elif last.tried:
        bonus_how = "drawn from its distribution there with the rejected tokens removed and renormalised"
    else:
        bonus_how = "drawn from its full distribution there"
    lines.append(f"- **Bonus:** the target adds its own token {_q(dec, st.bonus_token)} ({bonus_how}).")
    acc = len(path) - 1
    result = (f"- **Result:** {acc} drafted token{'s' if acc != 1 else ''} accepted + 1 from the target = "
              f"{acc + 1} token{'s' if acc else ''} for one target forward pass")
    if n_emit < acc + 1:
        result += (f"; generation stopped ({st.stop_reason or 'end of answer'}), so only {n_emit} of them "
                   "were kept")
    lines.append(result + ".")
    return Narration(engine, st.step, st.mode, decisions, path, int(st.bonus_token), "\n".join(lines))
