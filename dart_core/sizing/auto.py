"""AutoTree: a drafter whose tree is chosen by measurement, step by step.

    auto = AutoTree(DartDrafter(head, store, eos), costs, AcceptanceModel.for_head_dir(head_dir))
    auto.calibrate()                                  # a few timed proposals seed its draft cost
    engine = SpeculativeEngine(target, auto)          # the engine calls auto.step_done(trace) after each step

Every ``redecide_every`` steps it weighs each setting of the drafter's tree space (:mod:`.spaces`) by

    expected tokens per second = (expected accepted drafts + 1) / (draft + build + verify + commit seconds)

with the acceptance model's expectation for the best tree of that shape and the cost model's prices, and
sets the best. When no tree is expected to beat a plain target step, it takes plain steps (the head does
not run; its features wait) and every ``probe_every`` steps drafts once with the best tree anyway, so the
acceptance model keeps learning and speculation returns when it pays again. Every step's stage times
refresh the cost model and its accepted path the acceptance model, in a batch before each decision (one step at
a time, right after its verify, the same work cost the bundled target 0.12 ms a step, batched 0.03-0.05). The
choice never changes the output: every tree is verified by the same lossless loop.
"""
from __future__ import annotations

import copy
import time
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..engine.protocol import AcceptedStep, Proposal
from ..engine.trace import StepTrace
from ..engine.tree import DraftTree
from .acceptance import AcceptanceModel
from .costs import CostModel, DraftCost
from .spaces import PLAIN, TreeChoice, apply_choice, drafter_kind, tree_space

#: Steps between decisions, and plain steps between probes.
REDECIDE_EVERY = 8
PROBE_EVERY = 16
#: Steps that must refresh the cost model before a new request writes it back to its cache file.
SAVE_AFTER_STEPS = 32
#: Largest tree weighed (nodes, root included): 64 drafted nodes, as the paper's 60 plus margin.
MAX_NODES = 65
#: A plain step is taken only when it beats every tree by more than this share of its tokens/s. The acceptance
#: estimate right after a run of misses is noisy, and where the smallest tree costs a few percent more than a plain
#: step, drafting through the dip costs less than the plain steps until the next probe. Offline on 10 context_dev
#: prompts a kind (a 2-node verify at 1.05-1.07x a plain step, Zen 4): the paper's DART regret against its best fixed
#: tree went from +8.5 / +4.0 / +3.4% (passage / summaries / translation) to +2.4 / -0.3 / +2.5% with this margin and
#: STEADY_REQUEST_ALPHA, EAGLE-3's from +4.3 / +3.7 / +2.1% to -0.7 / +1.1 / +1.3%; DART + context unchanged.
PLAIN_MARGIN = 0.06
#: ... but only while the best tree is expected to add at least this many accepted drafts a step: where drafts are
#: not being accepted there is no dip to ride out, and plain steps follow as soon as the rates say so.
MARGIN_MIN_GAIN = 0.1
#: How fast a request's own acceptance rates follow its steps when the drafter's tree reads no live context (one
#: regime: the paper's DART, the published EAGLE-3 tree, prompt lookup): slower than the acceptance model's default,
#: so a few misses in a row do not send the chooser to plain steps (offline, above: 0.15 left DART's passages at
#: +3.7% with the margin alone; 0.06 with it, +2.4%). Drafters that read the live context keep the default: their
#: "copy" and "head" regimes already separate the two rates, and the slower one cost DART + context 2.5%.
STEADY_REQUEST_ALPHA = 0.06
#: What a regime keeps of its own (a drafter with ``regime(context)``, e.g. DART + context's "copy" steps, where
#: the context drafts alone and far more is accepted, and its "head" steps): acceptance, choice, probe state.
REGIME_STATE = ("acceptance", "choice", "_best_tree", "_tau_of", "_plain_run", "_step")


class AutoTree:
    """Wraps a drafter (DART, EAGLE-3 or prompt lookup) and sets its tree knobs by expected tokens/s."""

    def __init__(self, drafter: Any, costs: CostModel, acceptance: AcceptanceModel, *,
                 fixed: Mapping[str, int] | None = None, redecide_every: int = REDECIDE_EVERY,
                 probe_every: int = PROBE_EVERY, max_nodes: int = MAX_NODES):
        self.inner = drafter
        self.name = drafter.name
        self.needs_aux = drafter.needs_aux
        self.kind = drafter_kind(drafter)
        self.fixed = dict(fixed or {})
        self.space = tree_space(drafter, self.fixed, max_nodes)
        self.max_tree_nodes = max(c.nodes for c in self.space)
        # per (width, beam): the depth limits among the settings and the drafted nodes each curve must reach
        self._shape_needs: dict[tuple, dict[int, int]] = {}
        self._shapes: dict[tuple, int] = {}               # (depth, width, beam) -> row of the value table
        for c in self.space:
            if not c.plain:
                needs = self._shape_needs.setdefault((c.width, c.beam), {})
                needs[c.max_depth] = max(needs.get(c.max_depth, 0), c.nodes - 1)
                self._shapes.setdefault((c.max_depth, c.width, c.beam), len(self._shapes))
        self._shape_idx = np.array([len(self._shapes) if c.plain else self._shapes[(c.max_depth, c.width, c.beam)]
                                    for c in self.space])
        self._nodes = np.array([c.nodes for c in self.space])
        self._work = np.array([np.zeros(4) if c.plain else DraftCost.features(c.work) for c in self.space])
        self.costs = costs
        self.acceptance = acceptance
        settings = drafter.tree_settings() if hasattr(drafter, "tree_settings") else {}
        if not float(settings.get("context_weight", 0.0) or 0.0) > 0:
            acceptance.request_alpha = STEADY_REQUEST_ALPHA
        self._plain = np.array([c.plain for c in self.space])
        self.redecide_every = int(redecide_every)
        self.probe_every = int(probe_every)
        self.choice: TreeChoice = PLAIN
        self.chosen: Counter = Counter()           # steps per setting label (this engine's life)
        self.expected_tau: list[float] = []        # per drafting step: expected and achieved tokens
        self.achieved_tau: list[float] = []
        self._step = 0
        self._plain_run = 0
        self._last: TreeChoice = PLAIN
        self._applied: TreeChoice | None = None     # the setting the drafter holds (None: unknown, set it again)
        self._last_expected = 1.0
        self._last_work: tuple[int, int, int] = (0, 0, 0)
        self._keys = 0                              # the request's length at this step: what a verify attends to
        self._best_tree: TreeChoice | None = None
        self._tau_of: dict[TreeChoice, float] = {}
        self._seen: list[tuple] = []                # steps not yet learnt from (see step_done)
        self._regime = "head"                       # the regime whose state the attributes hold
        self._stash: dict[str, dict] = {}          # the other regimes' REGIME_STATE
        self.regime_steps: Counter = Counter()

    @property
    def last_used(self) -> TreeChoice:
        """The setting the last step ran: a probe step differs from :attr:`choice`."""
        return self._last

    # ------------------------------------------------------------------ the choice
    def _expected(self) -> tuple[np.ndarray, np.ndarray]:
        """Per setting of the space (in order): expected tau and predicted step seconds (vectorised: this runs
        every few steps over hundreds of EAGLE-3 settings)."""
        costs = self.costs
        fixed_s = costs.verify.table(np.arange(self.max_tree_nodes + 1), self._keys) + costs.commit_s
        draft = costs.drafts.get(self.name)
        coef = draft.coef if draft is not None else np.zeros(4)
        values = np.zeros((len(self._shapes) + 1, self.max_tree_nodes + 1))   # last row: the plain step's
        for (width, beam), needs in self._shape_needs.items():     # one walk per (width, beam)
            for depth, curve in self.acceptance.value_curves(needs, width, beam).items():
                values[self._shapes[(depth, width, beam)], :len(curve)] = curve
        drafted = np.maximum(self._nodes - 1, 0)
        tau = 1.0 + values[self._shape_idx, drafted]
        work = self._work.copy()
        if self._regime == "copy":
            work[:, 1:3] = 0.0       # the context drafts alone: no head forward, no rows (columns 1, 2)
        else:
            # the head also reads the positions committed since its last run: in steady drafting, tau of them
            work[:, 2] += np.where(self._nodes > 1, tau, 0.0)  # column 2: rows (DraftCost.features)
        step = fixed_s[self._nodes] + work @ coef
        return tau, step

    def rates(self) -> list[dict]:
        """Every setting with its expected tau, predicted step seconds and expected tokens/s (best first)."""
        self.learn()
        tau, step = self._expected()
        rows = [{"choice": c, "label": c.label, "nodes": c.nodes, "tau": float(t), "step_s": float(s),
                 "tokens_per_s": float(t / max(s, 1e-9))} for c, t, s in zip(self.space, tau, step)]
        rows.sort(key=lambda r: (-r["tokens_per_s"], r["nodes"]))
        return rows

    def choose(self) -> TreeChoice:
        self.learn()
        tau, step = self._expected()
        tps = tau / np.maximum(step, 1e-9)
        drafting = np.where(self._plain, -np.inf, tps)
        if not self._plain.all() and tau[int(np.argmax(drafting))] - 1.0 >= MARGIN_MIN_GAIN:
            tps = np.where(self._plain, tps * (1.0 - PLAIN_MARGIN), tps)   # plain only when clearly better
        order = np.lexsort((self._nodes, -tps))              # most tokens/s, then the smaller tree
        self.choice = self.space[int(order[0])]
        drafting = [i for i in order[:8] if not self.space[int(i)].plain]
        self._best_tree = self.space[int(drafting[0])] if drafting else None
        self._tau_of = dict(zip(self.space, tau.tolist()))
        return self.choice

    # ------------------------------------------------------------------ the drafter protocol
    def begin(self, prompt_ids: Sequence[int], prefill_aux: torch.Tensor | None) -> None:
        self.learn()                                      # the last request's steps, into its own rates
        self.costs.save(min_steps=SAVE_AFTER_STEPS)       # what the last answers measured outlives the process
        self.inner.begin(prompt_ids, prefill_aux)
        self.acceptance.begin_request()
        self._step = 0
        self._plain_run = 0
        for state in self._stash.values():
            state["acceptance"].begin_request()
            state["_step"] = state["_plain_run"] = 0

    def _enter(self, regime: str) -> None:
        """Hold ``regime``'s own acceptance model and choice (a new regime starts from the current one's rates and
        decides at once)."""
        if regime == self._regime:
            return
        self.learn()                                      # the steps so far belong to the regime being left
        self._stash[self._regime] = {a: getattr(self, a) for a in REGIME_STATE}
        state = self._stash.pop(regime, None)
        if state is None:
            state = {"acceptance": copy.deepcopy(self.acceptance), "choice": PLAIN, "_best_tree": None,
                     "_tau_of": {}, "_plain_run": 0, "_step": 0}
        for a in REGIME_STATE:
            setattr(self, a, state[a])
        self._regime = regime

    def propose(self, context: Sequence[int]) -> Proposal:
        regime = getattr(self.inner, "regime", None)
        self._enter(regime(context) if regime is not None else "head")
        self.regime_steps[self._regime] += 1
        self._keys = len(context)
        if self._step % self.redecide_every == 0:
            self.choose()
        self._step += 1
        choice = self.choice
        if choice.plain and self._best_tree is not None and self._plain_run >= self.probe_every:
            choice = self._best_tree                    # a probe: keep learning what the head would get
        if choice.plain:
            self._plain_run += 1
            skip = getattr(self.inner, "skip", None)
            proposal = skip(context) if skip is not None else Proposal(DraftTree.root_only(int(context[-1])))
        else:
            self._plain_run = 0
            if choice != self._applied:             # a decision holds for several steps: set the knobs once
                apply_choice(self.inner, choice)
                self._applied = choice
            # rows through the head = the setting's own + the positions it catches up on (after plain steps,
            # many): priced as such, a catch-up never makes drafting look dearer than it is
            caught_up = getattr(self.inner, "waiting_positions", 0)
            f, r, k = choice.work
            self._last_work = (f, r + caught_up, k)
            proposal = self.inner.propose(context)
            if getattr(self.inner, "last_head_skipped", False):
                self._last_work = (0, 0, k)     # the context drafted alone (DART + context): no head forward
        self._last = choice
        self._last_expected = self._tau_of.get(choice, 1.0)
        return proposal

    def observe(self, step: AcceptedStep) -> None:
        self.inner.observe(step)

    def cache_nbytes(self) -> int:
        """The wrapped drafter's cache bytes (the chooser holds no cache of its own)."""
        nbytes = getattr(self.inner, "cache_nbytes", None)
        return int(nbytes()) if nbytes is not None else 0

    def step_done(self, trace: StepTrace) -> None:
        """After each verify step (the engine calls it): count the setting and keep what the models learn from it.
        The learning itself waits for the next decision (:meth:`learn`): right after a verify has streamed the
        weights through the caches, the same Python and numpy work costs several times what it costs in a batch
        (the two models' refresh: 0.12 ms a step on the bundled target, 2-vCPU Zen 4, against 0.03-0.05 batched;
        benchmarks/chooser_cost.py)."""
        tree = trace.tree
        choice = self._last
        self.chosen[choice.label] += 1
        self._seen.append((choice, tree.parents, tree.scores, trace.accepted_nodes, trace.timings, len(tree),
                           self._last_work, self._keys))
        if not choice.plain and (len(tree) == choice.nodes or self.kind == "prompt_lookup"):  # not cut at the end
            self.expected_tau.append(self._last_expected)
            self.achieved_tau.append(float(len(trace.accepted_nodes)))   # accepted drafts + the bonus

    def learn(self) -> None:
        """Refresh both models from the steps seen since the last call, in their order: the acceptance model from
        each drafted tree's accepted path, the cost model from each step's stage times."""
        seen, self._seen = self._seen, []
        for choice, parents, scores, accepted, timings, nodes, work, keys in seen:
            if choice.plain:
                self.costs.observe(timings, nodes, keys=keys)
                continue
            self.acceptance.observe(parents, scores, accepted)
            self.costs.observe(timings, nodes, self.name, work, keys)

    # ------------------------------------------------------------------ start-up and reports
    def calibrate(self, prompt_len: int = 16, reps: int = 2) -> float:
        """Seed the draft cost: time a few proposals (settings spread over the space) on a dummy context.
        Returns the seconds spent. The drafter's state is garbage afterwards; begin() resets it."""
        t0 = time.perf_counter()
        trees = [c for c in self.space if not c.plain]
        if not trees:
            return 0.0
        # about seven settings spread over the space (its order varies forwards, rows and candidates apart), so the
        # four coefficients of the draft cost are all pinned down
        picks = set(trees[:: max(1, len(trees) // 6)]) | {trees[-1], max(trees, key=lambda c: c.work[0])}
        head = getattr(self.inner, "head", None)
        embedding = head.embedding if head is not None else None
        vocab = int(embedding.shape[0]) if embedding is not None else 1000
        prompt = [(7 + 13 * i) % vocab for i in range(prompt_len)]
        aux = None
        if self.needs_aux:
            fc = self.inner.head.fc.weight
            aux = torch.zeros(prompt_len, fc.shape[1], dtype=fc.dtype, device=fc.device)
        self._applied = None                            # the timed proposals leave the knobs at their last
        for choice in sorted(picks, key=lambda c: c.nodes):
            apply_choice(self.inner, choice)
            self.inner.begin(prompt, aux)
            ctx = prompt + [prompt[0]]                  # the prompt and the first answer token (the root)
            for r in range(reps + 1):
                p = self.inner.propose(ctx)
                if r:                                   # the first proposal warms this setting up
                    f, rows, k = choice.work            # each later one reads one new position (the root)
                    self.costs.draft_cost(self.name).add((f, rows + (1 if aux is not None else 0), k),
                                                         p.draft_forward_s + p.tree_build_s)
                bonus = (ctx[-1] + 1) % vocab           # as if the target rejected every draft
                self.inner.observe(AcceptedStep([ctx[-1]], bonus, None if aux is None else aux[:1]))
                ctx = ctx + [bonus]
        return time.perf_counter() - t0

    def report(self) -> dict:
        """What was chosen (steps per setting), expected against achieved tau, and the models' state."""
        self.learn()
        exp, ach = self.expected_tau, self.achieved_tau
        return {"chosen": dict(self.chosen.most_common()),
                "expected_tau": round(float(np.mean(exp)), 3) if exp else None,
                "achieved_tau": round(float(np.mean(ach)), 3) if ach else None,
                "drafting_steps": len(exp),
                "verify_ms": {n: round(1e3 * self.costs.verify_s(n), 3) for n in self.costs.verify.sizes},
                "acceptance": self.acceptance.summary()}


def make_auto(drafter: Any, costs: CostModel, fixed: Mapping[str, int] | None = None,
              acceptance: AcceptanceModel | None = None) -> AutoTree:
    """``drafter`` under an AutoTree: its acceptance model seeded from its head's held-out figures (``eval.json``
    beside the weights; a generic prior without), its draft cost timed once per drafter name on ``costs``."""
    if acceptance is None:
        head = getattr(drafter, "head", None)
        acceptance = AcceptanceModel.for_head_dir(getattr(head, "files_dir", None))
    auto = AutoTree(drafter, costs, acceptance, fixed=fixed)
    if auto.name not in costs.drafts:
        auto.calibrate()
    return auto


__all__ = ["AutoTree", "MAX_NODES", "PROBE_EVERY", "REDECIDE_EVERY", "make_auto"]
