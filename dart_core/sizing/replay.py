"""The tree chooser's regret, offline: what every tree setting would accept at every position of a greedy answer, and
what the chooser or any fixed tree pays over that answer, priced by the measured cost model.

Greedy decoding commits the same tokens whatever the tree (every tree is verified losslessly), and the committed
token at a position does not depend on how the steps before it were cut. So one greedy pass that drafts, at every
position, the tree of every setting in the drafter's space and then runs a plain target step records everything a
run could see: a setting's accepted path at position i is the longest path of its tree there that the answer
follows. A fixed tree's run and the chooser's run are then walks over that record, their steps priced by one cost
model (verify curve + commit + the drafter's draft cost), so their ratio carries no timing noise:

    logs = record(target, {"dart": drafter}, prompt_ids, max_new_tokens=128)   # per position: each setting's tree
    fixed = walk_fixed([logs["dart"]], choice, costs, drafter.name)   # seconds, steps, tokens of one fixed tree
    auto, _ = walk_chooser([logs["dart"]], drafter, costs)            # the AutoTree's own choices over the logs

``python -m dart_core.bench.regret`` runs this per method and question kind (docs/benchmarks.md).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import MappingProxyType, SimpleNamespace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..engine.protocol import AcceptedStep, Proposal, TreeDrafter
from ..engine.sampling import accept_greedy
from ..engine.tree import DraftTree
from .acceptance import AcceptanceModel
from .auto import AutoTree
from .costs import CostModel, DraftCost
from .spaces import PLAIN, TreeChoice, apply_choice, tree_space

Key = tuple   # a setting's chosen knobs, (knob, value) pairs sorted: what the record is keyed by


def key_of(choice: TreeChoice) -> Key:
    return tuple(sorted(choice.params))


@dataclass
class Drafted:
    """One setting's tree at one position and the path of it the answer follows."""
    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    scores: np.ndarray
    accepted: list[int]                      # accepted node indices, root first
    head_skipped: bool = False               # drafted by the context alone (DART + context): no head forward

    def tree(self) -> DraftTree:
        return DraftTree.trusted(self.tokens, self.parents, self.depths, self.scores)


@dataclass
class Position:
    regime: str                              # the drafter's regime here ("head", or "copy" for DART + context)
    trees: dict[Key, Drafted] = field(default_factory=dict)


@dataclass
class RequestLog:
    """One greedy answer with every setting's tree at every position (positions[i]: the root is answer[i])."""
    prompt: list[int]
    answer: list[int]
    positions: list[Position]
    kind: str = ""

    @property
    def decode_tokens(self) -> int:
        """Tokens the verify steps emit (the first answer token comes from the prefill)."""
        return len(self.answer) - 1


def follow(tree: DraftTree, continuation: Sequence[int]) -> list[int]:
    """The engine's greedy acceptance walk (``accept_greedy``) against a known answer: the target's choice after a
    node at depth d is ``continuation[d]`` (none past its end), so the path is the longest one the answer follows."""
    want = [int(continuation[d]) if d < len(continuation) else -1 for d in np.asarray(tree.depths).tolist()]
    return accept_greedy(tree, want, tree.children()).accepted_nodes


def _proposals(drafter: Any, context: list[int], choices: Sequence[TreeChoice]) -> list[Proposal]:
    """Every choice's proposal at this position, leaving the drafter as one proposal would: DART drafts every budget
    from one head forward, EAGLE-3 every setting from one expansion per top-k (``propose_each``); a drafter without
    state between steps (prompt lookup) is asked once per setting."""
    each = getattr(drafter, "propose_each", None)
    if each is not None and drafter.tree_kind == "dart":
        return each(context, [int(c.settings["budget"]) for c in choices])
    if each is not None and drafter.tree_kind == "eagle3":
        return each(context, [c.settings for c in choices])
    if getattr(drafter, "needs_aux", False):
        raise TypeError(f"{type(drafter).__name__} keeps state between steps and has no propose_each(): its settings "
                        "cannot all be drafted at one position (the replay covers DART, EAGLE-3 and prompt lookup)")
    out = []
    for c in choices:
        apply_choice(drafter, c)
        out.append(drafter.propose(context))
    return out


@torch.inference_mode()
def record(target, drafters: Mapping[str, Any], prompt_ids: Sequence[int], max_new_tokens: int, kind: str = "",
           choices: Mapping[str, Sequence[TreeChoice]] | None = None) -> dict[str, RequestLog]:
    """One greedy answer (plain target steps: the vanilla loop) and, for each drafter at each position before the
    answer's last token, the tree of every setting in its space (``choices[name]`` instead where given; the plain
    step needs no tree). The drafters share the target's pass; their tree settings are restored afterwards."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("the prompt is empty")
    spaces = {}
    for name, drafter in drafters.items():
        if not isinstance(drafter, TreeDrafter):
            raise TypeError(f"{name}: {type(drafter).__name__} has no tree settings to replay")
        given = (choices or {}).get(name)
        spaces[name] = [c for c in (given if given is not None else tree_space(drafter)) if not c.plain]
    saved = {name: dict(d.tree_settings()) for name, d in drafters.items()}
    want_aux = any(bool(d.needs_aux) for d in drafters.values())
    eos = set(target.eos_token_ids)
    session = target.new_session(len(prompt) + max_new_tokens + 1)
    out = session.prefill(prompt, want_aux=want_aux)
    answer = [int(out.logits[-1].argmax())]
    for d in drafters.values():
        d.begin(prompt, out.aux if d.needs_aux else None)
    positions: dict[str, list[Position]] = {name: [] for name in drafters}
    try:
        while answer[-1] not in eos and len(answer) < max_new_tokens:
            context = prompt + answer
            for name, drafter in drafters.items():
                regime = getattr(drafter, "regime", None)
                pos = Position(regime(context) if regime is not None else "head")
                for c, p in zip(spaces[name], _proposals(drafter, context, spaces[name])):
                    t = p.tree
                    pos.trees[key_of(c)] = Drafted(np.asarray(t.tokens), np.asarray(t.parents),
                                                   np.asarray(t.depths), np.asarray(t.scores), [],
                                                   bool(getattr(drafter, "last_head_skipped", False)))
                positions[name].append(pos)
            vout = session.verify(DraftTree.root_only(answer[-1]), want_aux=want_aux)
            nxt = int(vout.logits.rows([0])[0].argmax())
            vout.logits.release()
            session.commit([0])
            for d in drafters.values():
                d.observe(AcceptedStep([answer[-1]], nxt, vout.aux[[0]] if d.needs_aux else None))
            answer.append(nxt)
    finally:
        for name, d in drafters.items():
            d.set_tree(**saved[name])
    for pos_list in positions.values():
        for i, pos in enumerate(pos_list):
            for d in pos.trees.values():
                d.accepted = follow(d.tree(), answer[i + 1:])
    return {name: RequestLog(prompt, answer, positions[name], kind) for name in drafters}


# ---------------------------------------------------------------------- pricing
class FrozenCosts(CostModel):
    """A cost model that the walks read and never change (a chooser's steps would refresh a live one)."""

    @classmethod
    def of(cls, costs: CostModel) -> "FrozenCosts":
        frozen = cls(costs.verify, costs.commit_s, dict(costs.key), source=costs.source)
        frozen.drafts = copy.deepcopy(costs.drafts)
        return frozen

    def observe(self, *args, **kwargs) -> None:
        return None

    def save(self, min_steps: int = 0) -> bool:
        return False


def step_seconds(costs: CostModel, drafter_name: str, nodes: int, work: tuple[int, int, int],
                 keys: int | None = None) -> float:
    """A step's price: verify of ``nodes`` behind ``keys`` cached positions + commit + the draft's (head forwards,
    rows, candidates)."""
    draft = costs.drafts.get(drafter_name)
    d = float(DraftCost.features(work) @ draft.coef) if draft is not None and nodes > 1 else 0.0
    return costs.verify_s(nodes, keys) + costs.commit_s + d


@dataclass
class Walk:
    seconds: float = 0.0
    steps: int = 0
    tokens: int = 0
    plain_steps: int = 0
    chosen: dict = field(default_factory=dict)   # steps per setting label

    def add(self, other: "Walk") -> "Walk":
        chosen = dict(self.chosen)
        for k, v in other.chosen.items():
            chosen[k] = chosen.get(k, 0) + v
        return Walk(self.seconds + other.seconds, self.steps + other.steps, self.tokens + other.tokens,
                    self.plain_steps + other.plain_steps, chosen)

    @property
    def ms_per_token(self) -> float:
        return 1e3 * self.seconds / max(self.tokens, 1)

    @property
    def tau(self) -> float:
        return self.tokens / max(self.steps, 1)


def _take_step(w: Walk, costs: CostModel, drafter_name: str, choice: TreeChoice, drafted: Drafted | None,
               remaining: int, waiting: int, keys: int) -> tuple[list[int], int]:
    """Count one step of ``choice`` into ``w`` (its recorded tree ``drafted``; None for a plain step) and price it:
    the accepted path (cut at the answer's end: ``remaining`` tokens) and the positions then waiting for the head
    (a plain step or a step the context drafted alone leaves them waiting; a head forward reads them all);
    ``keys``: the request's length at the step (prompt and answer so far), which the verify attends to."""
    if choice.plain:
        n, path, work = 1, [0], (0, 0, 0)
        w.plain_steps += 1
        waiting += 1
    else:
        n, path = len(drafted.tokens), drafted.accepted[:remaining]
        f, rows, k = choice.work
        work = (0, 0, k) if drafted.head_skipped else (f, rows + waiting, k)
        waiting = (waiting if drafted.head_skipped else 0) + len(path)
    w.seconds += step_seconds(costs, drafter_name, n, work, keys)
    w.steps += 1
    w.tokens += len(path)
    w.chosen[choice.label] = w.chosen.get(choice.label, 0) + 1
    return path, waiting


def walk_fixed(logs: Sequence[RequestLog], choice: TreeChoice, costs: CostModel, drafter_name: str) -> Walk:
    """One fixed setting over each answer: its steps, their price, the tokens they emit."""
    total = Walk()
    for log in logs:
        w, i, waiting = Walk(), 0, len(log.prompt)       # the first drafting step reads the prompt's features
        while i < len(log.positions):
            drafted = None if choice.plain else log.positions[i].trees[key_of(choice)]
            path, waiting = _take_step(w, costs, drafter_name, choice, drafted, len(log.positions) - i, waiting,
                                       len(log.prompt) + i + 1)
            i += len(path)
        total = total.add(w)
    return total


class ReplayDrafter:
    """Stands in for a drafter under an AutoTree during a walk: each proposal is the recorded tree of the setting
    the chooser set, at the walk's position (the walk tells it where it is)."""
    needs_aux = False

    def __init__(self, drafter: Any):
        self.name = drafter.name
        self.tree_kind = drafter.tree_kind
        self.head = getattr(drafter, "head", None)
        self._settings = dict(drafter.tree_settings())
        self._chosen_knobs = {k for c in tree_space(drafter) for k, _ in c.params}
        self.max_tree_nodes = int(getattr(drafter, "max_tree_nodes", 65))
        self.log: RequestLog | None = None
        self.at = 0
        self.waiting_positions = 0
        self.last_head_skipped = False

    def tree_settings(self) -> Mapping[str, Any]:
        return MappingProxyType(self._settings)

    def set_tree(self, **settings: Any) -> None:
        self._settings.update(settings)

    def begin(self, prompt_ids, prefill_aux) -> None:
        self.waiting_positions = len(prompt_ids)

    def regime(self, context) -> str:
        return self.log.positions[self.at].regime

    def _key(self) -> Key:
        return tuple(sorted((k, int(v)) for k, v in self._settings.items() if k in self._chosen_knobs))

    def recorded(self) -> Drafted:
        return self.log.positions[self.at].trees[self._key()]

    def skip(self, context) -> Proposal:
        return Proposal(DraftTree.root_only(int(context[-1])))

    def propose(self, context) -> Proposal:
        d = self.recorded()
        self.last_head_skipped = d.head_skipped
        return Proposal(d.tree())

    def observe(self, step: AcceptedStep) -> None:
        return None


def walk_chooser(logs: Sequence[RequestLog], drafter: Any, costs: CostModel,
                 acceptance: AcceptanceModel | None = None,
                 make: Callable[..., AutoTree] = AutoTree) -> tuple[Walk, list[Walk]]:
    """The chooser (an AutoTree over ``drafter``'s space, its acceptance model seeded as the benchmark seeds it)
    over the answers in order, as one engine serves them: the walk over all, and one per answer. Each step is
    priced as :func:`walk_fixed` prices it; the chooser reads the same frozen cost model."""
    replay = ReplayDrafter(drafter)
    if acceptance is None:
        acceptance = AcceptanceModel.for_head_dir(getattr(getattr(drafter, "head", None), "files_dir", None))
    auto = make(replay, FrozenCosts.of(costs), acceptance)
    total, per = Walk(), []
    for log in logs:
        replay.log = log
        replay.at = 0
        auto.begin(log.prompt, None)
        w = Walk()
        while replay.at < len(log.positions):
            i = replay.at
            proposal = auto.propose(log.prompt + log.answer[:i + 1])
            choice = auto.last_used
            drafted = None if choice.plain else replay.recorded()
            accepted, replay.waiting_positions = _take_step(w, costs, drafter.name, choice, drafted,
                                                            len(log.positions) - i, replay.waiting_positions,
                                                            len(log.prompt) + i + 1)
            auto.step_done(SimpleNamespace(tree=proposal.tree, accepted_nodes=accepted,
                                           timings={"verify": 0.0, "commit": 0.0, "draft_forward": 0.0,
                                                    "tree_build": 0.0}))
            replay.at += len(accepted)
        per.append(w)
        total = total.add(w)
    return total, per


def save_logs(path, logs: Mapping[str, Sequence[RequestLog]], costs: CostModel) -> None:
    """The recorded answers of each method and the cost model that priced them, for walks without the target (a
    chooser's knobs tried offline). A pickle: read it back only from a file you wrote."""
    import pickle
    with open(path, "wb") as f:
        pickle.dump({"logs": {k: list(v) for k, v in logs.items()}, "costs": FrozenCosts.of(costs)}, f)


def load_logs(path) -> tuple[dict[str, list[RequestLog]], CostModel]:
    import pickle
    with open(path, "rb") as f:
        d = pickle.load(f)
    return d["logs"], d["costs"]


__all__ = ["Drafted", "FrozenCosts", "Position", "ReplayDrafter", "RequestLog", "Walk", "follow", "key_of", "load_logs", "save_logs",
           "record", "step_seconds", "walk_chooser", "walk_fixed"]
