"""Cost model: what a speculative step costs on this machine, per stage, as a function of the tree.

    costs = CostModel.load_or_measure(target)            # <= ~2 s, or read from the user cache
    costs.verify_s(9)                                    # one verify of a 9-node tree (root included)
    costs.draft_cost("dart").coef                        # a drafter's forward + tree build per unit of work
    costs.observe(trace, drafter_name, work)             # refresh from the stage times every step records

verify: the target's forward over a tree of n nodes after a short prefix, measured at a handful of sizes
(1..64, chains: the cost depends on the node count, not the shape) and interpolated piecewise-linearly
(beyond the last measured size: extended along the last segment); every step moves its level for all
sizes at once (the machine's speed drifts) and its shape slowly. Behind a longer context a verify costs more,
the more the more nodes attend to it: ``key_s + key_node_s * n`` seconds per cached key past the short prefix,
timed at start behind a longer one (on a 2-vCPU Zen 4 EPYC, the bundled target: 1.0 + 0.52 n us a key, so 9 nodes
cost 1.39x a plain step after 100 tokens and 1.88x after 1,500). The chooser prices trees at the request's length.
commit: the median commit. Both are kept in the user cache (``~/.cache/dart-demo/costs/``), keyed by the machine,
target, dtype, threads and code version, and re-measured when any of them changes.

draft: per drafter, seconds = a + b * forwards + c * rows + e * candidates (non-negative coefficients,
least squares over its recent steps), where the drafter's *work* for a tree setting is how many head
forwards it runs, how many rows they hold and how many candidates its tree build scores
(:mod:`dart_core.sizing.spaces`). Seeded by a few timed proposals at start, refreshed from every step.
"""
from __future__ import annotations

import bisect
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

logger = logging.getLogger(__name__)

#: Bumped when what the cache holds, or how it is measured, changes.
COST_MODEL_VERSION = 4   # 2: a verify runs the LM head for the likeliest rows only; 3: interleaved passes, least time;
#                          4: the cost per cached key
#: Tree sizes (nodes, root included) timed at start, in the order they are timed: the ends and the middle
#: first, so a start-up budget that runs out early still spans 1..64 (the rest fill in between).
VERIFY_SIZES = (1, 64, 9, 3, 33, 17, 5, 2)
#: Sizes timed whatever the budget (the curve needs both ends and a middle).
MIN_SIZES = 3
PREFIX_TOKENS = 64
#: The longer prefix behind which a verify of 1 and of KEY_NODES nodes is timed again: what a cached key costs.
LONG_PREFIX_TOKENS = 512
KEY_NODES = 9
#: How fast measured step times move the commit time (exponential moving average weight per step).
VERIFY_ALPHA = 0.05
#: How fast the verify curve follows the steps: its level (the machine's speed, every size by one factor; a VM's
#: speed drifts by 1.5x within an hour here) quickly, its shape (one size against the others) slowly, from what
#: the level does not explain.
SPEED_ALPHA = 0.1
SHAPE_ALPHA = 0.05
#: Weight of a draft-cost sample per newer sample after it (a window of about 20 steps, as the curve's level).
DRAFT_FORGET = 0.95
#: What a cache record may hold (anything else is damage: it is refused and measured again). The writer keeps
#: at most len(VERIFY_SIZES) sizes; a verify or commit over a minute is no timing of a step.
MAX_CACHED_SIZES = 64
MAX_CACHED_NODES = 4096
MAX_CACHED_SECONDS = 60.0
MAX_KEY_SECONDS = 1e-3           # a millisecond per cached key is no timing of attention
MAX_CACHE_BYTES = 64 * 1024      # a good record is under 1 KB; never parse a huge file on the start-up path


class CostCacheError(ValueError):
    """A cost-model cache record is damaged (the message names the field); it is measured again."""


@dataclass
class VerifyCurve:
    """Seconds of one verify per tree size (nodes, root included), interpolated between measured sizes."""
    sizes: list[int]
    seconds: list[float]                            # behind PREFIX_TOKENS cached keys
    key_s: float = 0.0                              # + per cached key past PREFIX_TOKENS, any verify
    key_node_s: float = 0.0                         # + per cached key past PREFIX_TOKENS and per node
    drift: float = field(default=0.0, repr=False)   # recent common log error of the steps (see observe)

    def __call__(self, nodes: int, keys: int | None = None) -> float:
        """One size's seconds, as :meth:`table` prices it, in plain floats: every step's refresh calls this, right
        after a verify has streamed the weights through the caches, where a few numpy calls cost ~0.1 ms."""
        n = max(float(nodes), 1.0)
        s, t = self.sizes, self.seconds
        if len(s) == 1:
            base = t[0]
        elif n > s[-1]:
            base = t[-1] + max((t[-1] - t[-2]) / (s[-1] - s[-2]), 0.0) * (n - s[-1])
        elif n <= s[0]:
            base = t[0]
        else:
            j = bisect.bisect_right(s, n) - 1            # s[j] <= n < s[j + 1], or n == s[-1]
            base = t[j] if j == len(s) - 1 else t[j] + (t[j + 1] - t[j]) * (n - s[j]) / (s[j + 1] - s[j])
        return base + self.key_term(n, keys)

    def table(self, nodes: np.ndarray, keys: int | None = None) -> np.ndarray:
        """Seconds for each tree size in ``nodes`` (one vectorised call: the chooser prices every size at once),
        behind ``keys`` cached positions (None: the short measuring prefix)."""
        s, t = np.asarray(self.sizes, dtype=np.float64), np.asarray(self.seconds, dtype=np.float64)
        n = np.maximum(np.asarray(nodes, dtype=np.float64), 1.0)
        if len(s) == 1:
            base = np.full(n.shape, t[0])
        else:
            slope = max((t[-1] - t[-2]) / (s[-1] - s[-2]), 0.0)
            base = np.where(n <= s[-1], np.interp(n, s, t), t[-1] + slope * (n - s[-1]))
        return base + self.key_term(n, keys)

    def key_term(self, nodes, keys: int | None):
        """What ``keys`` cached positions add to a verify of ``nodes`` (a float, or an array of sizes) over the
        measuring prefix's."""
        extra = max(int(keys) - PREFIX_TOKENS, 0) if keys is not None else 0
        return extra * (self.key_s + self.key_node_s * nodes)

    def key_text(self) -> str:
        """The cost per cached key in words, for logs and the page ("" when there is none)."""
        if not (self.key_s or self.key_node_s):
            return ""
        return (f"+ {1e7 * self.key_s:.2f} + {1e7 * self.key_node_s:.2f} x nodes ms per 10,000 cached tokens "
                "(every node attends to them)")

    def observe(self, nodes: int, seconds: float, keys: int | None = None) -> None:
        """Move the curve toward one measured verify, in two parts. The level: every size moves by one factor,
        so a VM that slows down or speeds up mid-run is followed at every size although the steps show only the
        sizes the chooser takes (moving those alone once priced every tree dearer than a plain step after a
        slowdown, and the run fell back to plain steps). The shape: the measured sizes around ``nodes`` move by
        what this step's error has beyond the recent common one (``drift``), so sizes seen side by side correct
        each other (a start-up timed on a busy machine heals) while a speed change seen at one size alone
        leaves the shape as it is. ``keys``: the cached positions the verify read; their share (key_term) is
        taken out first, so long requests do not make every tree look dear to short ones."""
        seconds = float(seconds) - self.key_term(max(float(nodes), 1.0), keys)
        predicted = self(nodes)
        if not (seconds > 0 and predicted > 0):
            return
        err = math.log(seconds / predicted)      # plain floats throughout: see __call__
        self.drift += SPEED_ALPHA * (err - self.drift)
        s = self.sizes
        if nodes <= s[0]:
            pairs = [(0, 1.0)]
        elif nodes >= s[-1]:
            pairs = [(len(s) - 1, 1.0)]
        else:
            j = bisect.bisect_left(s, nodes)
            w = (nodes - s[j - 1]) / (s[j] - s[j - 1])
            pairs = [(j - 1, 1.0 - w), (j, w)]
        level = math.exp(SPEED_ALPHA * err)
        self.seconds = [t * level for t in self.seconds]
        for i, w in pairs:
            self.seconds[i] = max(self.seconds[i] * math.exp(SHAPE_ALPHA * w * (err - self.drift)), 1e-6)
        # a bigger tree never costs less: the sizes just measured stand, their neighbours give way (lifting a
        # measured size back up to an unmeasured smaller one would undo the measurement)
        lo = pairs[0][0]
        for i in range(lo - 1, -1, -1):
            self.seconds[i] = min(self.seconds[i], self.seconds[i + 1])
        for i in range(lo + 1, len(self.seconds)):
            self.seconds[i] = max(self.seconds[i], self.seconds[i - 1])


@dataclass
class DraftCost:
    """One drafter's step cost (head forwards + tree build) from its work: a + b*forwards + c*rows + e*cands.

    Least squares over every sample, the older ones down-weighted by DRAFT_FORGET per newer sample (the machine's
    speed drifts, and a fit that still averaged the old speed priced drafts at a speed the verify curve had already
    left): kept as the weighted normal equations' sums, updated in plain floats at each sample (a step adds one,
    right after a verify, where numpy calls are slow; a fit over a 256-sample window cost ~0.45 ms a decision)."""
    samples: int = 0                  # samples added
    _coef: np.ndarray = field(default_factory=lambda: np.zeros(4), repr=False)
    _stale: bool = field(default=False, repr=False)
    _xtx: list = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)], repr=False)   # sum w x x^T
    _xty: list = field(default_factory=lambda: [0.0] * 4, repr=False)                       # sum w x y

    @staticmethod
    def features(work: Sequence[float]) -> np.ndarray:
        forwards, rows, candidates = work
        return np.array([1.0, float(forwards), float(rows), float(candidates)])

    @property
    def coef(self) -> np.ndarray:
        """The fitted coefficients, refitted here when samples came in since the last read: every step adds one,
        but the chooser reads them only every few steps."""
        if self._stale:
            self.refit()
        return self._coef

    @coef.setter
    def coef(self, value) -> None:
        self._coef = np.asarray(value, dtype=np.float64)
        self._stale = False

    def add(self, work: Sequence[float], seconds: float) -> None:
        forwards, rows, candidates = work
        x = (1.0, float(forwards), float(rows), float(candidates))
        y = float(seconds)
        f = DRAFT_FORGET
        for i in range(4):
            row = self._xtx[i]
            for j in range(4):
                row[j] = f * row[j] + x[i] * x[j]
            self._xty[i] = f * self._xty[i] + x[i] * y
        self.samples += 1
        self._stale = True

    def refit(self) -> None:
        self._stale = False
        if self.samples:
            self._coef = _nonneg_normal(self._xtx, self._xty)


def _nonneg_normal(A, b) -> np.ndarray:
    """Least squares from its normal equations (A = X^T W X, b = X^T W y) with every coefficient >= 0 (a stage
    never gets cheaper with more work): drop the most negative column until none is left (a small active-set solve;
    4 columns). Each solve is a Cholesky factorisation in plain floats with a ridge of 1e-12 of A's trace: a column
    that never varied (DART's one forward a step, beside the constant) gets the minimum-norm share, as lstsq on X
    would give it, and numpy's LAPACK calls cost ~0.2 ms a decision right after a verify."""
    A = [[float(v) for v in row] for row in np.asarray(A, dtype=np.float64)]
    b = [float(v) for v in np.asarray(b, dtype=np.float64)]
    active = list(range(len(b)))
    coef = np.zeros(len(b))
    while active:
        sol = _ridge_solve([[A[i][j] for j in active] for i in active], [b[i] for i in active])
        if min(sol) >= 0:
            coef[active] = sol
            return coef
        active.pop(min(range(len(sol)), key=sol.__getitem__))
    return coef


def _ridge_solve(A: list[list[float]], b: list[float]) -> list[float]:
    """x = (A + ridge I)^-1 b for a symmetric positive semi-definite A (Cholesky, plain floats)."""
    n = len(b)
    ridge = 1e-12 * max(sum(A[i][i] for i in range(n)), 1e-300)
    L = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            v = A[i][j] + (ridge if i == j else 0.0) - sum(L[i][k] * L[j][k] for k in range(j))
            L[i][j] = math.sqrt(max(v, ridge)) if i == j else v / L[j][j]
    y = [0.0] * n
    for i in range(n):
        y[i] = (b[i] - sum(L[i][k] * y[k] for k in range(i))) / L[i][i]
    x = [0.0] * n
    for i in range(n - 1, -1, -1):
        x[i] = (y[i] - sum(L[k][i] * x[k] for k in range(i + 1, n))) / L[i][i]
    return x


def _machine_key(target) -> dict:
    from ..models.kernel_path import CACHE_VERSION as KERNELS_VERSION
    dev = target.device
    if dev.type == "cuda":
        machine = torch.cuda.get_device_name(dev)
    else:
        from ..hardware import machine_id
        machine = machine_id()
    from .. import __version__
    from ..hardware import gemm_paths
    kernels = gemm_paths() if dev.type == "cpu" else {}
    return {"machine": machine, "device": dev.type, "target": str(target.name),
            # weights and activations: bf16 weights may run with float32 activations, as float32 weights do
            "dtype": f"{str(target.dtype).replace('torch.', '')}/{str(target.activation_dtype).replace('torch.', '')}",
            "threads": torch.get_num_threads(),
            # the CPU kernels' path (DART_GEMM_PATH) changes what a verify costs
            "gemm_path": kernels.get("gemm_path"),
            # and so does how its calls' rows are cut among the threads (models/gemm_split.py)
            "gemm_split": kernels.get("gemm_split"),
            # a kernel that changed speed (models/kernel_path.py bumps its version) makes a cached curve stale
            "code": f"{__version__}/{COST_MODEL_VERSION}/kernels {KERNELS_VERSION}"}


def cost_cache_dir() -> Path:
    from ..hardware import cache_dir
    return cache_dir() / "costs"


def _dummy_prompt(n: int, vocab: int) -> list[int]:
    """The measuring prompt: ``n`` fixed tokens (its first PREFIX_TOKENS are the short prefix)."""
    return [(17 + 31 * i) % vocab for i in range(n)]


def _chain(prompt: Sequence[int], n: int, vocab: int):
    """A chain tree of ``n`` nodes rooted at the prompt's last token (a tree's cost depends on its node count)."""
    from ..engine.tree import DraftTree
    return DraftTree.from_parents([prompt[-1]] + [(prompt[j % len(prompt)] + 1) % vocab for j in range(1, n)],
                                  [-1] + list(range(n - 1)))


def _synchronizer(target):
    """Waits for the target's device (CUDA kernels run asynchronously), so a timer reads finished work."""
    return (lambda: torch.cuda.synchronize(target.device)) if target.device.type == "cuda" else (lambda: None)


def _timed_verify(session, tree, sync) -> float:
    sync()
    t0 = time.perf_counter()
    session.verify(tree)
    sync()
    return time.perf_counter() - t0


def measure_verify_curve(target, sizes: Sequence[int] = VERIFY_SIZES, budget_s: float = 1.5,
                         reps: int = 3, long_prefix: int = LONG_PREFIX_TOKENS) -> tuple[VerifyCurve, float]:
    """Time the target's verify at ``sizes`` behind a short prefix, then 1 and KEY_NODES nodes behind
    ``long_prefix`` (0: not, and no cost per key); returns the curve (sorted by size) and the median commit. A
    warm-up pass in the given order decides which sizes fit ``budget_s`` (at least MIN_SIZES);
    then ``reps`` timed passes go over those sizes in turn, and each size keeps its least time. On a VM a burst
    of load lasts tens of milliseconds: timing one size's reps back to back let a burst take all of them (one
    size 2.5x its cost, and the monotone rule then lifted every size up to it), while interleaved passes spread
    a burst over several sizes once each, and the least time of a size is its cost undisturbed (every step
    moves the curve's level to the speed the machine actually runs at)."""
    vocab = int(target.vocab_size)
    prefix = _dummy_prompt(PREFIX_TOKENS, vocab)
    session = target.new_session(PREFIX_TOKENS + max(sizes) + 4)
    sync = _synchronizer(target)
    session.prefill(prefix)
    trees = {int(n): _chain(prefix, int(n), vocab) for n in sizes}   # built once: each verified 1 + reps times

    def one(n: int) -> tuple[float, float]:
        verify_s = _timed_verify(session, trees[n], sync)
        t1 = time.perf_counter()
        session.commit([0])
        sync()
        commit_s = time.perf_counter() - t1
        session.truncate(PREFIX_TOKENS)
        return verify_s, commit_s

    t_start = time.perf_counter()
    chosen: list[int] = []
    for i, n in enumerate(sizes):            # warm-up: each size once, until its share of the budget is spent
        one(int(n))
        chosen.append(int(n))
        if i + 1 >= MIN_SIZES and time.perf_counter() - t_start > budget_s / (reps + 1):
            break
    times: dict[int, list[float]] = {n: [] for n in chosen}
    commits = []
    for _ in range(reps):
        for n in chosen:
            verify_s, commit_s = one(n)
            times[n].append(verify_s)
            commits.append(commit_s)
    sizes_sorted = sorted(chosen)
    seconds = [min(times[n]) for n in sizes_sorted]
    for i in range(1, len(seconds)):            # a bigger tree never costs less (timing noise aside)
        seconds[i] = max(seconds[i], seconds[i - 1])
    curve = VerifyCurve(sizes_sorted, seconds)
    if long_prefix > PREFIX_TOKENS:
        curve.key_s, curve.key_node_s = _measure_key_cost(target, curve, long_prefix, reps)
    return curve, float(np.median(commits))


def _measure_key_cost(target, curve: VerifyCurve, long_prefix: int, reps: int) -> tuple[float, float]:
    """(key_s, key_node_s): a verify of 1 and of KEY_NODES nodes (chains) timed behind ``long_prefix`` cached
    positions, interleaved, least of ``reps`` each, against the curve at the short prefix; never negative."""
    vocab = int(target.vocab_size)
    prompt = _dummy_prompt(long_prefix, vocab)
    session = target.new_session(long_prefix + KEY_NODES + 4)
    session.prefill(prompt)
    sync = _synchronizer(target)
    trees = {n: _chain(prompt, n, vocab) for n in (1, KEY_NODES)}
    times: dict[int, list[float]] = {n: [] for n in trees}
    for _ in range(1 + reps):                     # the first pass warms up, uncounted
        for n, tree in trees.items():
            times[n].append(_timed_verify(session, tree, sync))
            session.truncate(long_prefix)
    extra = long_prefix - PREFIX_TOKENS
    d1 = min(times[1][1:]) - curve(1)
    dn = min(times[KEY_NODES][1:]) - curve(KEY_NODES)
    key_node_s = max((dn - d1) / ((KEY_NODES - 1) * extra), 0.0)
    key_s = max(d1 / extra - key_node_s, 0.0)
    return key_s, key_node_s


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _checked_record(d: dict) -> tuple[list[int], list[float], float, tuple[float, float]]:
    """(sizes, seconds, commit_s, (key_s, key_node_s)) of a cache record, or :class:`CostCacheError` naming the
    first bad field."""
    v = d.get("verify")
    if not isinstance(v, dict):
        raise CostCacheError("verify is missing or not an object")
    sizes, seconds = v.get("sizes"), v.get("seconds")
    for name, xs in (("sizes", sizes), ("seconds", seconds)):
        if not isinstance(xs, list) or not 1 <= len(xs) <= MAX_CACHED_SIZES:
            raise CostCacheError(f"verify.{name} must be a list of 1..{MAX_CACHED_SIZES} numbers, got "
                                 f"{len(xs) if isinstance(xs, list) else type(xs).__name__}")
    if len(sizes) != len(seconds):
        raise CostCacheError(f"verify.sizes has {len(sizes)} entries but verify.seconds {len(seconds)}")
    for i, n in enumerate(sizes):
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CACHED_NODES:
            raise CostCacheError(f"verify.sizes[{i}] is {n!r}, not a tree size in 1..{MAX_CACHED_NODES}")
        if i and n <= sizes[i - 1]:
            raise CostCacheError(f"verify.sizes[{i}] ({n}) does not follow {sizes[i - 1]} (sizes must increase)")
    for i, t in enumerate(seconds):
        if not _number(t) or not 0 < t <= MAX_CACHED_SECONDS:      # NaN fails both comparisons
            raise CostCacheError(f"verify.seconds[{i}] is {t!r}, not a time in (0, {MAX_CACHED_SECONDS}] s")
        if i and t < seconds[i - 1]:
            raise CostCacheError(f"verify.seconds[{i}] ({t}) is below the smaller tree's {seconds[i - 1]} "
                                 "(a bigger tree never costs less)")
    commit = d.get("commit_s")
    if not _number(commit) or not 0 <= commit <= MAX_CACHED_SECONDS:
        raise CostCacheError(f"commit_s is {commit!r}, not a time in [0, {MAX_CACHED_SECONDS}] s")
    per_key = []
    for name in ("key_s", "key_node_s"):
        t = v.get(name, 0.0)
        if not _number(t) or not 0 <= t <= MAX_KEY_SECONDS:
            raise CostCacheError(f"verify.{name} is {t!r}, not a time per cached key in [0, {MAX_KEY_SECONDS}] s")
        per_key.append(float(t))
    return list(sizes), [float(t) for t in seconds], float(commit), (per_key[0], per_key[1])


class CostModel:
    """Verify curve + commit time of the target, and one :class:`DraftCost` per drafter (by name)."""

    def __init__(self, verify: VerifyCurve, commit_s: float, key: dict | None = None, source: str = "measured",
                 path: Path | None = None):
        self.verify = verify
        self.commit_s = float(commit_s)
        self.key = key or {}
        self.source = source
        self.path = path                  # the cache file (None: not cached)
        self.drafts: dict[str, DraftCost] = {}
        self.steps_observed = 0           # steps that refreshed the curve since it was last written

    def verify_s(self, nodes: int, keys: int | None = None) -> float:
        """One verify of ``nodes`` (root included) behind ``keys`` cached positions (None: a short prefix)."""
        return self.verify(nodes, keys)

    def draft_cost(self, drafter: str) -> DraftCost:
        return self.drafts.setdefault(drafter, DraftCost())

    def observe(self, timings: dict, nodes: int, drafter: str | None = None,
                work: Sequence[float] | None = None, keys: int | None = None) -> None:
        """Refresh from one step's recorded stage times (StepTrace.timings); ``keys``: the positions cached then."""
        self.verify.observe(nodes, float(timings["verify"]), keys)
        self.commit_s += VERIFY_ALPHA * (float(timings["commit"]) - self.commit_s)
        self.steps_observed += 1
        if drafter is not None and work is not None:
            self.draft_cost(drafter).add(work, float(timings["draft_forward"]) + float(timings["tree_build"]))

    def describe(self) -> str:
        v = self.verify
        pts = ", ".join(f"{n}: {1e3 * v(n):.1f}" for n in (1, 3, 9, 33) if n <= max(v.sizes) * 2)
        keys = f", {v.key_text()}" if v.key_text() else ""
        return f"cost model ({self.source}): verify ms by nodes {{{pts}}}{keys}, commit {1e3 * self.commit_s:.2f} ms"

    def to_dict(self) -> dict:
        return {"key": self.key, "verify": {"sizes": list(self.verify.sizes), "seconds": list(self.verify.seconds),
                                            "key_s": self.verify.key_s, "key_node_s": self.verify.key_node_s},
                "commit_s": self.commit_s, "source": self.source}

    # ------------------------------------------------------------------ the cache
    def save(self, min_steps: int = 0) -> bool:
        """Write the curve (refreshed by the steps since) to its cache file, when at least ``min_steps`` steps
        refreshed it: a start-up measurement taken on a busy machine is corrected by the steps that follow,
        and the next start reads the corrected curve. Returns whether it wrote."""
        if self.path is None or self.steps_observed < min_steps:
            return False
        from ..hardware import write_json
        try:
            write_json(self.path, self.to_dict())
        except OSError as exc:   # a read-only home still runs: the model is just measured again next time
            logger.warning("could not cache the cost model in %s: %s", self.path, exc)
            return False
        self.steps_observed = 0
        return True

    @classmethod
    def read_cache(cls, path: Path, key: dict) -> "CostModel | None":
        """The model cached at ``path`` for ``key``; None when there is none or it was cached under another key.
        Raises :class:`CostCacheError` naming the field when the file is damaged: the chooser prices every
        tree from this curve, so empty or unequal lists, NaN, negative or decreasing times and repeated sizes
        must never reach it."""
        try:
            if path.stat().st_size > MAX_CACHE_BYTES:
                raise CostCacheError(f"{path.stat().st_size} bytes, over the {MAX_CACHE_BYTES} a record can hold")
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CostCacheError(f"unreadable ({exc})") from None
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CostCacheError(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(d, dict):
            raise CostCacheError(f"expected a JSON object, found {type(d).__name__}")
        if not isinstance(d.get("key"), dict):
            raise CostCacheError("key is missing or not an object")
        if d["key"] != key:
            return None
        sizes, seconds, commit_s, per_key = _checked_record(d)
        return cls(VerifyCurve(sizes, seconds, *per_key), commit_s, key, source=f"cached {path}", path=path)

    @classmethod
    def load_or_measure(cls, target, cache_dir: str | Path | None = None, budget_s: float = 1.5,
                        refresh: bool = False) -> "CostModel":
        """The cached model for this machine/target/dtype/threads/code, else measured now (and cached)."""
        key = _machine_key(target)
        from ..hardware import keyed_file
        path = keyed_file(Path(cache_dir) if cache_dir is not None else cost_cache_dir(), key)
        if not refresh:
            try:
                cached = cls.read_cache(path, key)
                if cached is not None:
                    return cached
            except CostCacheError as exc:      # measured again below, and the record replaced
                logger.warning("the cost model cached in %s is damaged (%s); measuring it again", path, exc)
        t0 = time.perf_counter()
        curve, commit = measure_verify_curve(target, budget_s=budget_s)
        model = cls(curve, commit, key, source=f"measured in {time.perf_counter() - t0:.1f} s", path=path)
        model.save()
        return model


__all__ = ["COST_MODEL_VERSION", "SHAPE_ALPHA", "SPEED_ALPHA", "CostCacheError", "CostModel", "DraftCost",
           "VerifyCurve", "cost_cache_dir", "measure_verify_curve"]
