"""Trees sized by measurement (dart_core.sizing): the acceptance model, the cost model, the chooser on
synthetic machines, and lossless decoding while the tree changes between steps."""
from __future__ import annotations

import itertools
import json
import logging
import math
import time
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dart_core.config import ConfigError, GenerationConfig
from dart_core.drafters.dart import DartDrafter
from dart_core.drafters.eagle3 import Eagle3Drafter, Eagle3TreeConfig
from dart_core.drafters.prompt_lookup import PromptLookupDrafter
from dart_core.drafters.pruning import PruningConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.engine.protocol import TreeDrafter
from dart_core.engine.tree import DraftTree
from dart_core.sizing import auto as auto_mod
from dart_core.sizing import costs as costs_mod
from dart_core.sizing.acceptance import AcceptanceModel
from dart_core.sizing.auto import PROBE_EVERY, AutoTree, make_auto
from dart_core.sizing.costs import CostCacheError, CostModel, DraftCost, VerifyCurve, _nonneg_normal
from dart_core.sizing.spaces import PLAIN, apply_choice, tree_space
from tiny_models import stand_in_drafter

# Held-out hit@1 / hit@10 per position of a strong head (published-scale targets) and of the bundled one.
STRONG = ([0.80, 0.65, 0.55, 0.48, 0.42, 0.38, 0.35, 0.33, 0.31], [0.97, 0.92, 0.88, 0.84, 0.80, 0.77, 0.75, 0.73, 0.71])
BUNDLED = ([0.45, 0.30, 0.20, 0.16, 0.14, 0.14, 0.13, 0.12, 0.12], [0.75, 0.63, 0.55, 0.50, 0.47, 0.47, 0.45, 0.43, 0.43])


# ---------------------------------------------------------------------------------------------- acceptance
def test_value_curve_is_the_sum_of_the_likeliest_nodes():
    m = AcceptanceModel.from_hit_rates([0.5, 0.4], [0.8, 0.7])
    r = m.rates
    # A chain (one child per node) of depth 2: p(d1) + p(d1) p(d2).
    chain = m.value_curve(4, max_depth=2, width=1)
    assert chain[1] == pytest.approx(r[0, 0]) and chain[2] == pytest.approx(r[0, 0] + r[0, 0] * r[1, 0])
    assert chain[3] == chain[2] == chain[4]                     # nothing deeper to add
    # Brute force on a small shape: every set of n nodes closed under parents, the best sum.
    depth, width = 2, 3
    nodes = [(d1,) for d1 in range(width)] + [(d1, d2) for d1 in range(width) for d2 in range(width)]

    def p(node):
        out = 1.0
        for level, rank in enumerate(node):
            out *= m.rate(level + 1, rank)
        return out

    curve = m.value_curve(len(nodes), max_depth=depth, width=width)
    for n in range(1, len(nodes) + 1):
        best = max(sum(p(x) for x in subset) for subset in itertools.combinations(nodes, n)
                   if all(x[:-1] in subset or len(x) == 1 for x in subset))
        assert curve[n] == pytest.approx(best), n
    # Beam: only one node expanded per depth.
    beam1 = m.value_curve(len(nodes), max_depth=depth, width=width, beam=1)
    assert beam1[-1] == pytest.approx(sum(p((i,)) for i in range(width)) + sum(p((0, j)) for j in range(width)))
    assert m.value_curve(0, 3, 3)[0] == 0 and not m.value_curve(5, 0, 3).any()



def test_value_curves_are_walked_again_only_when_the_rates_change():
    """The chooser decides every few steps; during plain steps nothing is learnt, so the walk is reused. A step that
    moves the rates (observe), a new request, or rates set by hand walk again; the curves equal a fresh model's."""
    m = AcceptanceModel.from_hit_rates(*BUNDLED)
    needs = {3: 12, 7: 30}
    first = m.value_curves(needs, 4, 4)
    assert m.value_curves(needs, 4, 4) is first                      # nothing changed: reused
    fresh = AcceptanceModel.from_hit_rates(*BUNDLED).value_curves(needs, 4, 4)
    assert first == fresh
    m.observe(np.array([-1, 0, 0, 1]), np.array([0.0, -0.1, -0.5, -0.2]), [0, 1, 3])   # two hits, one miss
    after = m.value_curves(needs, 4, 4)
    assert after is not first and after != first
    m.begin_request()
    assert m.value_curves(needs, 4, 4) != after
    m.longrun[0, 0] = 0.01                                            # set by hand: seen too
    m.begin_request()
    assert m.value_curves(needs, 4, 4)[3][1] == pytest.approx(0.01 * m.request_level())

def test_the_seed_rates_give_the_held_out_top1_chain():
    """A position's own hit@1 rates, multiplied along a path, understate deep trees (hits come in runs): seeded
    with the held-out mean top-1 chain, the rank-0 rates past depth 1 rise until the product gives that chain,
    between the independent and the nested extremes, and the head's eval.json chain is read."""
    from dart_core.sizing.acceptance import chain_conditional

    def chain_of(rates):
        return float(np.sum(np.cumprod(rates)))
    hit1 = [0.714, 0.461, 0.332, 0.243, 0.174]
    independent, nested = chain_of(hit1), chain_of([hit1[0]] + [b / a for a, b in zip(hit1, hit1[1:])])
    for chain in (1.25, 1.3471, 1.6):
        assert independent < chain < nested
        rates = chain_conditional(hit1, chain)
        assert rates[0] == hit1[0] and chain_of(rates) == pytest.approx(chain, abs=1e-5)
        assert all(h <= r <= 1.0 for h, r in zip(hit1, rates))
    assert chain_conditional(hit1, 0.5) == pytest.approx(hit1)              # below the independent extreme
    assert chain_of(chain_conditional(hit1, 9.0)) == pytest.approx(nested)  # above the nested one
    assert chain_conditional([0.5], 0.9) == [0.5]                           # one level: nothing to condition
    plain = AcceptanceModel.from_hit_rates(hit1, [0.93, 0.82, 0.74, 0.67, 0.60])
    seeded = AcceptanceModel.from_hit_rates(hit1, [0.93, 0.82, 0.74, 0.67, 0.60], chain=1.3471)
    assert seeded.rate(1, 0) == plain.rate(1, 0) and seeded.rate(1, 1) == plain.rate(1, 1)
    assert seeded.rate(3, 0) > plain.rate(3, 0) and seeded.rate(3, 1) > plain.rate(3, 1)
    assert (seeded.seed_rates[:, :10].sum(axis=1) <= 1.0 + 1e-9).all()      # one child at most is the target's
    assert seeded.value_curve(8, max_depth=5, width=1)[5] == pytest.approx(1.3471, abs=1e-4)
    from pathlib import Path
    bundled = Path(__file__).resolve().parents[2] / "assets" / "dart" / "smollm2-135m-instruct"
    m = AcceptanceModel.for_head_dir(bundled)
    assert "top-1 chain" in m.source
    chain = json.loads((bundled / "eval.json").read_text())["mean_top1_chain"]
    assert m.value_curve(8, max_depth=5, width=1)[5] == pytest.approx(chain, abs=1e-4)

def test_acceptance_is_seeded_from_eval_json_and_learns_per_request(tmp_path):
    (tmp_path / "eval.json").write_text(json.dumps({"hit@1": BUNDLED[0], "hit@10": BUNDLED[1]}))
    m = AcceptanceModel.for_head_dir(tmp_path)
    assert m.rate(1, 0) == pytest.approx(0.45) and m.rate(2, 0) == pytest.approx(0.30)
    assert 0 < m.rate(1, 1) < m.rate(1, 0) and "eval.json" in m.source
    assert "generic" in AcceptanceModel.for_head_dir(tmp_path / "missing").source
    (tmp_path / "eval.json").write_text("{not json")
    assert "generic" in AcceptanceModel.for_head_dir(tmp_path).source
    # A tree: root -> a (rank 0), b (rank 1); a -> c. The target accepts a then c.
    tree = DraftTree.from_parents([1, 2, 3, 4], [-1, 0, 0, 1], [0.0, -0.1, -0.5, -0.2])
    m.begin_request()
    for _ in range(30):
        m.observe(tree.parents, tree.scores, [0, 1, 3])
    assert m.rate(1, 0) > 0.9 and m.rate(1, 1) < 0.05 and m.rate(2, 0) > 0.9
    assert m.trials[0, 0] == 30 and m.hits[1, 0] == 30
    learnt = m.rate(1, 0)
    m.begin_request()                        # a new answer starts from the slower long-run rates
    assert 0.45 < m.rate(1, 0) < learnt
    # A node whose parent was rejected is no trial.
    m2 = AcceptanceModel.from_hit_rates(*BUNDLED)
    m2.observe(tree.parents, tree.scores, [0, 2])
    assert m2.trials[1, 0] == 0 and m2.trials[0, 1] == 1 and m2.hits[0, 1] == 1
    with pytest.raises(ValueError, match="rates must be"):
        AcceptanceModel(np.zeros((2, 2)))
    # A request where the head misses at the cells it drafts stops believing in the cells it has not tried:
    # a wide tree of untried siblings must not look better than it did before the misses.
    m3 = AcceptanceModel.from_hit_rates(*BUNDLED)
    m3.begin_request()
    wide_before = m3.value_curve(8, max_depth=1, width=8)[8]
    chain = DraftTree.from_parents([1, 2], [-1, 0], [0.0, -0.1])
    for _ in range(20):
        m3.observe(chain.parents, chain.scores, [0])                 # rank 0 at depth 1 rejected every time
    assert m3.request_level() < 0.3 and m3.rate(1, 3) < 0.3 * m3.longrun[0, 3]
    assert m3.value_curve(8, max_depth=1, width=8)[8] < 0.3 * wide_before
    m3.begin_request()
    assert m3.request_level() == 1.0 and m3.rate(1, 3) == pytest.approx(m3.longrun[0, 3])


# ---------------------------------------------------------------------------------------------- costs
def test_verify_curve_interpolates_extends_and_learns():
    c = VerifyCurve([1, 9, 33], [0.010, 0.020, 0.060])
    assert c(1) == pytest.approx(0.010) and c(5) == pytest.approx(0.015) and c(0) == pytest.approx(0.010)
    assert c(65) == pytest.approx(0.060 + 32 * (0.040 / 24))          # along the last segment
    for _ in range(200):
        c.observe(5, 0.030)
    assert c(5) == pytest.approx(0.030, rel=0.02)
    assert all(b >= a for a, b in zip(c.seconds, c.seconds[1:]))       # never cheaper with more nodes


@pytest.mark.parametrize("speed, observed", [(1.6, [1]), (1.6, [3]), (0.6, [3]), (0.6, [1, 64])])
def test_a_machine_that_changes_speed_moves_the_whole_verify_curve(speed, observed):
    """A VM slowing down (or speeding up) mid-run changes every size by one factor; the steps only show the
    sizes the chooser takes. The curve must follow at every size, keep its shape, and never be bent by the
    monotone rule (a slowed plain step once lifted sizes 2..9 to its cost, trees looked dear or free by turns
    and the automatic trees fell back to plain steps)."""
    sizes = sorted(THIS_CPU)
    c = VerifyCurve(sizes, [THIS_CPU[n] / 1e3 for n in sizes])
    for step in range(150):
        n = observed[step % len(observed)]
        c.observe(n, speed * THIS_CPU[n] / 1e3)
    for n in sizes:
        assert c(n) == pytest.approx(speed * THIS_CPU[n] / 1e3, rel=0.12), n
    assert c(3) / c(1) == pytest.approx(THIS_CPU[3] / THIS_CPU[1], rel=0.05)
    assert all(b >= a for a, b in zip(c.seconds, c.seconds[1:]))


def test_the_chosen_tree_survives_a_uniform_slowdown_seen_only_in_plain_steps():
    auto = AutoTree(stand_in_drafter("dart"), _costs(THIS_CPU, 1.5, 0.2), AcceptanceModel.from_hit_rates(*BUNDLED))
    before = auto.choose()
    assert not before.plain
    for _ in range(100):                                            # plain steps on a 1.6x slower machine
        auto.costs.observe({"verify": 1.6 * THIS_CPU[1] / 1e3, "commit": 0.0001}, 1)
    for name in ("dart", "eagle3"):                                # ... and its drafts as slow
        auto.costs.draft_cost(name).coef *= 1.6
    assert auto.choose() == before


def test_the_draft_cost_follows_a_machine_that_slows_down():
    """Recent steps weigh more: 150 drafts at one speed, then 60 at 1.6x; the fit prices the new speed."""
    rng = np.random.default_rng(1)
    cost = DraftCost()
    true = np.array([0.001, 0.001, 0.0002, 0.0])
    for i in range(210):
        work = (1, int(rng.integers(1, 12)), 0)
        cost.add(work, (1.0 if i < 150 else 1.6) * float(DraftCost.features(work) @ true))
    for rows in (1, 6, 11):
        x = DraftCost.features((1, rows, 0))
        assert x @ cost.coef == pytest.approx(1.6 * x @ true, rel=0.05)


def test_draft_cost_fit_is_non_negative_and_recovers_a_linear_cost():
    rng = np.random.default_rng(0)
    cost = DraftCost()
    for _ in range(60):
        work = (int(rng.integers(1, 8)), int(rng.integers(1, 40)), int(rng.integers(1, 400)))
        cost.add(work, 0.002 + 0.001 * work[0] + 0.0001 * work[1] + 0.00001 * work[2])
    assert np.allclose(cost.coef, [0.002, 0.001, 0.0001, 0.00001], atol=1e-6)
    X = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])
    assert (_nonneg_normal(X.T @ X, X.T @ y) >= 0).all()    # a falling cost fits as flat


def test_one_size_is_priced_as_the_table_prices_it():
    """VerifyCurve's scalar price (every step's refresh) and its vectorised table (every decision) agree at every
    size: below, at and between the measured sizes, past the last one, and behind any number of cached keys."""
    curve = VerifyCurve([1, 2, 3, 5, 9, 17, 33, 64], [0.010, 0.0106, 0.0112, 0.0125, 0.0145, 0.02, 0.03, 0.05],
                        key_s=1e-6, key_node_s=5e-7)
    nodes = [0, 1, 2, 4, 5, 7, 9, 40, 64, 65, 100]
    for keys in (None, 0, 64, 65, 700, 5000):
        table = curve.table(np.array(nodes), keys)
        for n, t in zip(nodes, table):
            assert curve(n, keys) == pytest.approx(float(t), rel=1e-12, abs=1e-15), (n, keys)
    single = VerifyCurve([9], [0.02])
    assert single(1) == single(30) == pytest.approx(0.02)


def test_the_draft_cost_fit_of_a_column_that_never_varies_is_lstsqs():
    """DART runs one head forward a step, so the forwards column equals the constant one: the normal equations are
    singular, and the fit must price every work as lstsq's minimum-norm solution does (the running sums' Cholesky
    with its tiny ridge), not blow up."""
    rng = np.random.default_rng(3)
    cost = DraftCost()
    X, y = [], []
    for _ in range(40):
        work = (1, int(rng.integers(1, 40)), int(rng.integers(0, 400)))
        t = 0.001 + 0.0001 * work[1] + 0.00001 * work[2] + float(rng.normal(0, 1e-5))
        cost.add(work, t)
        X.append(DraftCost.features(work))
        y.append(t)
    X = np.array(X)
    w = np.sqrt(0.95 ** np.arange(len(y) - 1, -1, -1))       # DRAFT_FORGET per newer sample
    ref = np.linalg.lstsq(X * w[:, None], np.array(y) * w, rcond=None)[0]
    assert (cost.coef >= 0).all() and np.all(np.isfinite(cost.coef))
    assert np.allclose(X @ cost.coef, X @ ref, atol=1e-9)
    assert cost.coef[0] == pytest.approx(cost.coef[1], rel=1e-6)   # the minimum norm splits the constant evenly


def test_cost_model_is_measured_once_then_read_until_the_key_changes(tiny_app_models, tmp_path, monkeypatch):
    target = tiny_app_models[0]
    calls = []
    real = costs_mod.measure_verify_curve
    monkeypatch.setattr(costs_mod, "measure_verify_curve", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = CostModel.load_or_measure(target, cache_dir=tmp_path)
    assert calls == [1] and first.source.startswith("measured") and sorted(first.verify.sizes) == first.verify.sizes
    assert len(first.verify.sizes) >= 3 and {1, 64} <= set(first.verify.sizes)   # both ends, whatever the budget
    second = CostModel.load_or_measure(target, cache_dir=tmp_path)
    assert calls == [1] and second.source.startswith("cached") and second.verify.seconds == first.verify.seconds
    torch.set_num_threads(2)                                    # another thread count: measured again
    try:
        CostModel.load_or_measure(target, cache_dir=tmp_path)
    finally:
        torch.set_num_threads(1)
    assert calls == [1, 1]
    for f in tmp_path.glob("*.json"):                            # a damaged cache file: measured again
        f.write_text("{broken")
    CostModel.load_or_measure(target, cache_dir=tmp_path)
    assert len(calls) == 3
    assert "verify ms by nodes" in first.describe()
    assert first.key["dtype"] == "float32/float32"      # weights / activations: bf16 weights get their own entry
    # Steps refresh the curve; a new request writes it back, so a start-up measured on a busy machine heals.
    model = CostModel.load_or_measure(target, cache_dir=tmp_path)
    auto = AutoTree(PromptLookupDrafter(), model, AcceptanceModel.generic())
    for _ in range(auto_mod.SAVE_AFTER_STEPS - 1):
        model.observe({"verify": 0.5, "commit": 0.0}, 9)
    auto.begin([1, 2, 3], None)
    assert CostModel.load_or_measure(target, cache_dir=tmp_path).verify_s(9) < 0.4      # not yet written
    model.observe({"verify": 0.5, "commit": 0.0}, 9)
    auto.begin([1, 2, 3], None)
    assert CostModel.load_or_measure(target, cache_dir=tmp_path).verify_s(9) == pytest.approx(model.verify_s(9))


class _BurstyTarget:
    """A target whose verify of n nodes sleeps 2 + 0.5 n ms, except during one burst of load: three calls in a row
    take 40 ms more (a VM's neighbour). The cost model must measure the undisturbed curve all the same."""
    vocab_size = 100
    device = torch.device("cpu")

    def __init__(self, burst_from: int):
        self.calls, self.burst = 0, range(burst_from, burst_from + 3)

    def new_session(self, capacity):
        target = self

        class Session:
            def prefill(self, ids):
                pass

            def verify(self, tree):
                target.calls += 1
                time.sleep((2 + 0.5 * len(tree) + (40 if target.calls in target.burst else 0)) / 1e3)

            def commit(self, nodes):
                pass

            def truncate(self, n):
                pass
        return Session()


@pytest.mark.parametrize("burst_from", [1, 4, 6, 9])
def test_a_burst_of_load_does_not_bend_the_measured_curve(burst_from):
    curve, _ = costs_mod.measure_verify_curve(_BurstyTarget(burst_from), sizes=(1, 9, 3), budget_s=10.0, reps=3)
    assert curve.sizes == [1, 3, 9]
    for n, t in zip(curve.sizes, curve.seconds):
        assert (2 + 0.5 * n) / 1e3 <= t < (2 + 0.5 * n + 10) / 1e3, (n, t)


class _KeyedTarget:
    """A target whose verify of n nodes behind L cached positions sleeps 2 + 0.5 n + L (0.002 + 0.001 n) ms."""
    vocab_size = 100
    device = torch.device("cpu")

    def new_session(self, capacity):
        class Session:
            length = 0

            def prefill(self, ids):
                self.length += len(ids)

            def verify(self, tree):
                n = len(tree)
                time.sleep((2 + 0.5 * n + self.length * (0.002 + 0.001 * n)) / 1e3)

            def commit(self, nodes):
                pass

            def truncate(self, n):
                self.length = n
        return Session()


def test_the_cost_per_cached_key_is_measured_behind_a_longer_prefix():
    curve, _ = costs_mod.measure_verify_curve(_KeyedTarget(), sizes=(1, 9, 3), budget_s=10.0, reps=3)
    assert curve.key_s == pytest.approx(2e-6, rel=0.3) and curve.key_node_s == pytest.approx(1e-6, rel=0.3)
    # priced at a request's length: a tree's share grows with its nodes
    L = 1064
    assert curve(9, L) - curve(9) == pytest.approx((L - costs_mod.PREFIX_TOKENS) * (curve.key_s + 9 * curve.key_node_s))
    assert curve(9, 10) == curve(9) == curve(9, None)         # up to the measuring prefix: the curve itself
    no_keys, _ = costs_mod.measure_verify_curve(_KeyedTarget(), sizes=(1, 9, 3), budget_s=10.0, reps=1, long_prefix=0)
    assert no_keys.key_s == no_keys.key_node_s == 0.0


def test_a_long_request_does_not_make_every_tree_look_dear():
    """observe takes the cached keys' share out: a step behind 2,000 keys that cost what the model predicts there
    leaves the curve as it was; the same step read as if behind the short prefix would have lifted it."""
    curve = VerifyCurve([1, 9, 64], [0.010, 0.013, 0.030], key_s=1e-6, key_node_s=0.5e-6)
    seen = curve(9, 2000)
    curve.observe(9, seen, keys=2000)
    assert curve.seconds == pytest.approx([0.010, 0.013, 0.030])
    blind = VerifyCurve([1, 9, 64], [0.010, 0.013, 0.030], key_s=1e-6, key_node_s=0.5e-6)
    blind.observe(9, seen)
    assert blind(9) > 0.0135


def test_the_cost_per_key_is_cached_with_the_curve(tmp_path, monkeypatch):
    monkeypatch.setattr(costs_mod, "measure_verify_curve",
                        lambda *a, **k: (VerifyCurve([1, 9, 64], [0.01, 0.013, 0.03], 1.5e-6, 0.4e-6), 1e-4))
    target = _target_key_only()
    first = CostModel.load_or_measure(target, cache_dir=tmp_path)
    again = CostModel.load_or_measure(target, cache_dir=tmp_path)
    assert again.source.startswith("cached")
    assert (again.verify.key_s, again.verify.key_node_s) == (1.5e-6, 0.4e-6)
    assert again.verify_s(9, 1000) == pytest.approx(first.verify_s(9, 1000))
    assert "+ 15.00 + 4.00 x nodes ms per 10,000 cached tokens" in again.describe()


def test_behind_a_long_context_the_chooser_takes_a_smaller_tree():
    """The same acceptance, the same curve: after 3,000 cached keys every node attends to them, so a tree's extra
    nodes cost more and the chooser drafts fewer."""
    zen4 = {1: 9.7, 2: 10.25, 3: 10.7, 5: 11.4, 9: 13.05, 17: 18.08, 33: 32.49, 64: 54.47}   # tree_cost, prefix 64
    costs = _costs(zen4, 0.8, 0.05)
    costs.verify.key_s, costs.verify.key_node_s = 1.0e-6, 0.5e-6     # measured there: 1.0 + 0.52 n us a key
    auto = AutoTree(stand_in_drafter("dart"), costs, AcceptanceModel.from_hit_rates(*STRONG))
    auto._keys = 50                    # what propose() reads off the request's context before it chooses
    short = auto.choose()
    auto._keys = 3000
    long = auto.choose()
    assert not short.plain and long.nodes < short.nodes


# ---------------------------------------------------------------------------------------------- the chooser
def _costs(verify_ms: dict[int, float], per_forward_ms: float, per_row_ms: float) -> CostModel:
    sizes = sorted(verify_ms)
    model = CostModel(VerifyCurve(sizes, [verify_ms[n] / 1e3 for n in sizes]), 0.0001, source="synthetic")
    for name in ("dart", "eagle3"):
        model.draft_cost(name).coef = np.array([0.0, per_forward_ms / 1e3, per_row_ms / 1e3, 0.0])
    return model


GPU = {1: 20.0, 64: 21.0}                                              # memory-bound: flat to 64 nodes
THIS_CPU = {1: 14.6, 3: 15.9, 5: 21.8, 9: 32.1, 17: 55.0, 33: 100.0, 64: 190.0}   # a 2-core CPU (README tree_cost)


@pytest.mark.parametrize("kind", ["dart", "eagle3"])
def test_a_flat_verify_curve_picks_a_big_tree_and_this_cpu_a_small_one(kind):
    gpu = AutoTree(stand_in_drafter(kind), _costs(GPU, 1.0, 0.01), AcceptanceModel.from_hit_rates(*STRONG))
    assert gpu.choose().nodes >= 32
    cpu = AutoTree(stand_in_drafter(kind), _costs(THIS_CPU, 1.5, 0.2), AcceptanceModel.from_hit_rates(*BUNDLED))
    chosen = cpu.choose()
    assert not chosen.plain and chosen.nodes <= 5
    rates = cpu.rates()
    assert rates[0]["choice"] == chosen and rates[0]["tokens_per_s"] >= max(r["tokens_per_s"] for r in rates)


def test_held_knobs_stay_and_the_rest_are_chosen():
    auto = AutoTree(stand_in_drafter("eagle3"), _costs(GPU, 1.0, 0.01), AcceptanceModel.from_hit_rates(*STRONG),
                    fixed={"top_k": 2})
    assert all(c.plain or c.settings["top_k"] == 2 for c in auto.space)
    assert auto.choose().settings["top_k"] == 2
    dart = AutoTree(stand_in_drafter("dart"), _costs(GPU, 1.0, 0.01), AcceptanceModel.from_hit_rates(*STRONG), fixed={"budget": 5})
    assert [c.label for c in dart.space] == ["plain step", "budget 5"]


def test_plain_steps_when_no_tree_pays_with_a_probe_now_and_then():
    hopeless = AcceptanceModel.from_hit_rates([0.01] * 9, [0.02] * 9)
    inner = PromptLookupDrafter()
    auto = AutoTree(inner, _costs(THIS_CPU, 0.0, 0.0), hopeless)
    assert auto.choose().plain
    drafted = []
    context = [5, 6, 7, 5, 6, 7, 5, 6]
    auto.begin(context, None)
    for step in range(3 * PROBE_EVERY + 3):
        proposal = auto.propose(context)
        drafted.append(len(proposal.tree) > 1 or not auto._last.plain)
        auto.observe(None)
    assert sum(drafted) == 3 and not any(drafted[:PROBE_EVERY])      # one probe after each run of plain steps


def test_a_tree_within_the_margin_keeps_drafting_a_hopeless_one_does_not():
    """A plain step only when it beats every tree by more than PLAIN_MARGIN, while the best tree still expects
    MARGIN_MIN_GAIN accepted drafts: rates of 0.12 a token make a 2-node tree that costs 15% more than a plain step a
    few percent worse than plain (kept, inside the margin); rates of 0.01 expect too little to ride out (plain)."""
    from dart_core.sizing.auto import MARGIN_MIN_GAIN, PLAIN_MARGIN
    costs = _costs({1: 10.0, 2: 11.5, 9: 40.0}, 0.0, 0.0)
    auto = AutoTree(PromptLookupDrafter(), costs, AcceptanceModel.from_hit_rates([0.12] * 9, [0.15] * 9))
    rows = {r["label"]: r for r in auto.rates()}
    plain = rows.pop("plain step")
    best_tree = max(rows.values(), key=lambda r: r["tokens_per_s"])
    assert best_tree["tau"] - 1 >= MARGIN_MIN_GAIN
    assert plain["tokens_per_s"] * (1 - PLAIN_MARGIN) < best_tree["tokens_per_s"] < plain["tokens_per_s"]
    assert not auto.choose().plain
    hopeless = AcceptanceModel.from_hit_rates([0.01] * 9, [0.02] * 9)
    assert AutoTree(PromptLookupDrafter(), costs, hopeless).choose().plain


def test_the_request_rate_is_steadier_where_the_tree_reads_no_live_context():
    from dart_core.sizing.auto import STEADY_REQUEST_ALPHA
    costs = _costs(THIS_CPU, 0.0, 0.0)
    paper = AutoTree(stand_in_drafter("dart"), costs, AcceptanceModel.from_hit_rates(*BUNDLED))
    assert paper.acceptance.request_alpha == STEADY_REQUEST_ALPHA
    context = stand_in_drafter("dart")
    context.set_tree(context_weight=0.5)
    default = AcceptanceModel.from_hit_rates(*BUNDLED).request_alpha
    assert AutoTree(context, costs, AcceptanceModel.from_hit_rates(*BUNDLED)).acceptance.request_alpha == default
    assert default != STEADY_REQUEST_ALPHA

def test_tree_space_and_apply_choice_set_each_drafters_knobs():
    lookup = PromptLookupDrafter()
    space = tree_space(lookup)
    assert space[0] is PLAIN and all(c.nodes == c.settings["num_pred_tokens"] + 1 for c in space[1:])
    apply_choice(lookup, space[3])
    assert lookup.tree_settings() == {"num_pred_tokens": space[3].settings["num_pred_tokens"],
                                      "max_tree_nodes": space[3].nodes}          # one chain: the tree counted
    assert lookup.max_tree_nodes == space[3].nodes and space[3].label == f"num_pred_tokens {space[3].nodes - 1}"
    with pytest.raises(TypeError, match="no tree space"):
        tree_space(object())


def test_every_drafter_reads_and_sets_its_tree_through_the_protocol(tiny_app_models):
    """tree_settings() is what the drafter runs, by its tree config's field names; set_tree changes the named
    fields (and the tree size bound with them), refuses a bad value naming the field and keeps its settings."""
    drafters = _drafters(tiny_app_models)
    configs = {"dart": PruningConfig(), "eagle3": Eagle3TreeConfig()}
    for kind, drafter in drafters.items():
        assert isinstance(drafter, TreeDrafter) and drafter.tree_kind == kind
        if kind in configs:
            assert drafter.tree_settings() == asdict(configs[kind])
        with pytest.raises(TypeError):
            drafter.tree_settings()["budget"] = 1                     # read-only: set_tree is the way
    dart, eagle = drafters["dart"], drafters["eagle3"]
    dart.set_tree(budget=3)
    assert dart.tree_settings()["budget"] == 3 and dart.max_tree_nodes == 4
    assert dart.tree_settings()["beam_width"] == PruningConfig().beam_width
    eagle.set_tree(total_token=5, depth=1, top_k=2)
    assert eagle.max_tree_nodes == 5
    with pytest.raises(ValueError, match="beam_width"):
        dart.set_tree(beam_width=0)
    with pytest.raises(TypeError):
        eagle.set_tree(budget=3)                                       # not an EAGLE-3 setting
    assert dart.tree_settings()["beam_width"] == PruningConfig().beam_width and eagle.max_tree_nodes == 5
    prompt = [5, 9, 11, 4]
    cfg = GenerationConfig(max_new_tokens=12, max_length=100)
    want = SpeculativeEngine(tiny_app_models[0]).generate(prompt, cfg).tokens
    for drafter in (dart, eagle):
        got = SpeculativeEngine(tiny_app_models[0], drafter).generate(prompt, cfg)
        assert got.tokens == want and max(len(t.tree) for t in got.traces) <= drafter.max_tree_nodes


# ---------------------------------------------------------------------------------------------- a damaged cache
def _target_key_only():
    """What the cache key reads of a target (nothing here runs it: the measurement is faked)."""
    return SimpleNamespace(device=torch.device("cpu"), name="fake-target", dtype=torch.float32,
                           activation_dtype=torch.float32)


@pytest.fixture
def fake_measure(monkeypatch):
    """A GPU-like verify curve instead of timing a model; the list counts the measurements."""
    calls = []

    def measure(*a, **k):
        calls.append(1)
        return VerifyCurve([1, 9, 64], [0.020, 0.0202, 0.021]), 0.0001
    monkeypatch.setattr(costs_mod, "measure_verify_curve", measure)
    return calls


def _set(**fields):
    def poison(rec):
        rec["verify"].update(fields)
        return json.dumps(rec)
    return poison


POISONED = {   # issue 27: each was trusted as read
    "empty lists": _set(sizes=[], seconds=[]),
    "lists of different lengths": _set(seconds=[0.02, 0.021]),
    "NaN times": _set(seconds=[0.02, float("nan"), 0.021]),
    "infinite time": _set(seconds=[0.02, 0.0202, float("inf")]),
    "a repeated size": _set(sizes=[1, 9, 9]),
    "negative times": _set(seconds=[-0.02, -0.01, 0.021]),
    "decreasing times": _set(seconds=[0.03, 0.02, 0.021]),
    "sizes as strings": _set(sizes=["1", "9", "64"]),
    "2 million entries": _set(sizes=list(range(1, 2_000_001)), seconds=[0.02] * 2_000_000),
    "negative cost per key": _set(key_s=-1e-6),
    "NaN cost per key and node": _set(key_node_s=float("nan")),
    "a second per key": _set(key_s=1.0),
    "negative commit": lambda rec: json.dumps({**rec, "commit_s": -1.0}),
    "no verify": lambda rec: json.dumps({"key": rec["key"], "commit_s": 0.0}),
    "no key": lambda rec: json.dumps({k: v for k, v in rec.items() if k != "key"}),
    "a list": lambda rec: json.dumps([rec]),
    "deeply nested": lambda rec: "[" * 100_000 + "]" * 100_000,
    "not JSON": lambda rec: "{broken",
}


def test_a_kernel_that_changed_speed_makes_the_cached_curve_stale(tmp_path, fake_measure, monkeypatch):
    """The cost cache is keyed by the kernels' version (models/kernel_path.py bumps it when a kernel's speed
    changes): a curve measured with the old kernels is not used, the model is measured again."""
    from dart_core.models import kernel_path
    target = _target_key_only()
    CostModel.load_or_measure(target, cache_dir=tmp_path)
    assert CostModel.load_or_measure(target, cache_dir=tmp_path).source.startswith("cached")
    monkeypatch.setattr(kernel_path, "CACHE_VERSION", kernel_path.CACHE_VERSION + 1)
    assert CostModel.load_or_measure(target, cache_dir=tmp_path).source.startswith("measured")
    assert len(fake_measure) == 2


@pytest.mark.parametrize("poison", POISONED)
def test_a_damaged_cost_cache_is_refused_measured_again_and_replaced(tmp_path, fake_measure, caplog, poison):
    target = _target_key_only()
    good = CostModel.load_or_measure(target, cache_dir=tmp_path)
    [path] = tmp_path.glob("*.json")
    path.write_text(POISONED[poison](json.loads(path.read_text())))
    with caplog.at_level(logging.WARNING, logger=costs_mod.__name__):
        model = CostModel.load_or_measure(target, cache_dir=tmp_path)
    assert fake_measure == [1, 1] and model.source.startswith("measured")
    lines = [r.getMessage() for r in caplog.records if r.name == costs_mod.__name__]
    assert len(lines) == 1 and str(path) in lines[0] and "damaged" in lines[0] and "measuring it again" in lines[0]
    again = CostModel.load_or_measure(target, cache_dir=tmp_path)                  # the record was replaced
    assert fake_measure == [1, 1] and again.source.startswith("cached")
    assert again.verify.seconds == good.verify.seconds
    # DART's automatic trees draft as with a good cache.
    chosen = AutoTree(stand_in_drafter("dart"), model, AcceptanceModel.from_hit_rates(*STRONG)).choose()
    assert not chosen.plain and chosen == AutoTree(stand_in_drafter("dart"), good, AcceptanceModel.from_hit_rates(*STRONG)).choose()


def test_a_record_of_another_key_is_measured_again_quietly(tmp_path, fake_measure, caplog):
    target = _target_key_only()
    CostModel.load_or_measure(target, cache_dir=tmp_path)
    [path] = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "key": {**rec["key"], "threads": 99}}))
    with caplog.at_level(logging.WARNING, logger=costs_mod.__name__):
        assert CostModel.load_or_measure(target, cache_dir=tmp_path).source.startswith("measured")
    assert fake_measure == [1, 1] and not caplog.records


KEY = {"machine": "m", "target": "t"}
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2, 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=4))
_garbage = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6),
                                                                                              inner, max_size=4),
                        max_leaves=12)
_sizes = st.one_of(st.lists(st.integers(1, 100), unique=True, max_size=9).map(sorted), st.lists(_scalar, max_size=5))
_seconds = st.one_of(st.lists(st.floats(1e-5, 2.0), max_size=9).map(sorted),
                     st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=5), _garbage)
_records = st.one_of(
    _garbage,
    st.fixed_dictionaries({"key": st.just(KEY) | _garbage,
                           "verify": st.fixed_dictionaries({"sizes": _sizes, "seconds": _seconds}) | _garbage,
                           "commit_s": st.floats(0, 0.01) | _scalar}))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record=_records)
def test_the_cost_cache_reader_never_crashes_nor_feeds_the_chooser_garbage(tmp_path, record):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(record))
    try:
        model = CostModel.read_cache(path, KEY)
    except CostCacheError as exc:
        assert str(exc)                                       # a named problem, logged by load_or_measure
        return
    if model is None:
        assert not isinstance(record, dict) or record.get("key") != KEY
        return
    prices = model.verify.table(np.arange(0, 200))
    assert np.isfinite(prices).all() and (prices > 0).all() and (np.diff(prices) >= 0).all()
    assert math.isfinite(model.commit_s) and model.commit_s >= 0
    auto = AutoTree(stand_in_drafter("dart"), model, AcceptanceModel.from_hit_rates(*STRONG))
    assert auto.choose() in auto.space
    assert all(math.isfinite(r["tokens_per_s"]) and r["step_s"] > 0 for r in auto.rates())


# ---------------------------------------------------------------------------------------------- lossless
class _Cycling(AutoTree):
    """Every step another setting (plain steps included), so the tree changes between steps."""
    def choose(self):
        self._cycle = getattr(self, "_cycle", -1) + 1
        self.choice = self.space[self._cycle % len(self.space)]
        self._best_tree, self._tau_of = None, {}
        return self.choice


def _drafters(tiny_app_models):
    from dart_core.models.heads.dart import load_dart_head
    from dart_core.models.heads.eagle3 import load_eagle3_head
    target, _, dart_dir, eagle_dir = tiny_app_models
    return {"dart": DartDrafter(load_dart_head(dart_dir, target), None, target.eos_token_ids, PruningConfig()),
            "eagle3": Eagle3Drafter(load_eagle3_head(eagle_dir, target), Eagle3TreeConfig()),
            "prompt_lookup": PromptLookupDrafter()}


@pytest.mark.parametrize("kind", ["dart", "eagle3", "prompt_lookup"])
def test_greedy_output_equals_vanilla_while_the_tree_changes_every_step(tiny_app_models, kind):
    target = tiny_app_models[0]
    costs = _costs(THIS_CPU, 1.0, 0.1)
    auto = _Cycling(_drafters(tiny_app_models)[kind], costs, AcceptanceModel.generic(), redecide_every=1)
    engine, vanilla = SpeculativeEngine(target, auto), SpeculativeEngine(target)
    cfg = GenerationConfig(max_new_tokens=40, max_length=200)
    rng = np.random.default_rng(1)
    for _ in range(3):
        prompt = rng.integers(3, target.vocab_size, size=int(rng.integers(4, 20))).tolist()
        got = engine.generate(prompt, cfg)
        assert got.tokens == vanilla.generate(prompt, cfg).tokens
        sizes = {len(t.tree) for t in got.traces}
        assert 1 in sizes and len(sizes) >= 3                    # plain steps and trees of several sizes
    assert sum(auto.chosen.values()) > 0 and "plain step" in auto.chosen


def test_make_auto_seeds_the_draft_cost_once_per_drafter_and_reports(tiny_app_models):
    target = tiny_app_models[0]
    costs = CostModel(VerifyCurve([1, 64], [0.001, 0.002]), 0.0)
    drafters = _drafters(tiny_app_models)
    auto = make_auto(drafters["dart"], costs)
    assert "dart" in costs.drafts and costs.drafts["dart"].samples >= 4
    n = costs.drafts["dart"].samples
    make_auto(drafters["dart"], costs, fixed={"budget": 3})
    assert costs.drafts["dart"].samples == n                 # timed once per drafter name
    out = SpeculativeEngine(target, auto).generate([5, 9, 11, 4], GenerationConfig(max_new_tokens=24, max_length=100))
    assert out.tokens == SpeculativeEngine(target).generate([5, 9, 11, 4], GenerationConfig(max_new_tokens=24,
                                                                                            max_length=100)).tokens
    rep = auto.report()
    assert sum(rep["chosen"].values()) == out.stats.steps and set(rep["verify_ms"]) == {1, 64}
    assert "generic" in rep["acceptance"]["source"]              # a random head carries no eval.json


def test_factory_builds_auto_engines_holding_the_set_knobs(tiny_app_models):
    from dart_core.page.engines import EngineFactory
    from dart_core.models.heads.dart import load_dart_head
    from dart_core.models.heads.eagle3 import load_eagle3_head
    from dart_core.ui.session import RunSettings
    target, _, dart_dir, eagle_dir = tiny_app_models
    costs = CostModel(VerifyCurve([1, 64], [0.001, 0.002]), 0.0)
    factory = EngineFactory(target, dart_head=load_dart_head(dart_dir, target),
                            eagle3_head=load_eagle3_head(eagle_dir, target), costs=costs)
    engines = factory.build(RunSettings(eagle3_top_k=2), fresh=True)
    assert isinstance(engines["dart"].drafter, AutoTree) and isinstance(engines["eagle3"].drafter, AutoTree)
    assert engines["eagle3"].drafter.fixed == {"top_k": 2} and engines["dart"].drafter.fixed == {}
    fixed = factory.build(RunSettings(tree="fixed", budget=3), fresh=True)
    assert isinstance(fixed["dart"].drafter, DartDrafter) and fixed["dart"].drafter.tree_settings()["budget"] == 3
    assert fixed["eagle3"].drafter.tree_settings() == asdict(Eagle3TreeConfig())          # the published tree
    assert factory.tree_key("dart", RunSettings()) != factory.tree_key("dart", RunSettings(tree="fixed"))
    with pytest.raises(ConfigError, match="tree must be one of auto, fixed"):
        RunSettings.from_values(tree="big")


def test_the_api_takes_auto_or_fixed_trees(tiny_app_models):
    from dart_core.api import DartModel
    from dart_core.models.heads.dart import load_dart_head
    target, _, dart_dir, _ = tiny_app_models
    head = load_dart_head(dart_dir, target)
    assert isinstance(DartModel(target, head, tree="fixed").engine.drafter, DartDrafter)
    with pytest.raises(ConfigError, match="tree='huge'"):
        DartModel(target, head, tree="huge")


@pytest.mark.bundled
def test_auto_trees_on_the_bundled_model_are_lossless_and_report_expected_and_achieved_tau(bundled_fp32, tmp_path):
    from dart_core.loading import load_head_and_ngram
    from dart_core.models.templates import encode_chat, get_template
    t = bundled_fp32
    head, store = load_head_and_ngram(t, None, None, None)
    auto = make_auto(DartDrafter(head, store, t.eos_token_ids), CostModel.load_or_measure(t, cache_dir=tmp_path))
    assert "eval.json" in auto.acceptance.source                  # the shipped head's held-out figures
    engine, vanilla = SpeculativeEngine(t, auto), SpeculativeEngine(t)
    cfg = GenerationConfig(max_new_tokens=48, max_length=512)
    for text in ("Write a Python function that reverses a string.", "Name three primary colours."):
        ids = encode_chat(t.tokenizer, get_template(t.template_name), [{"role": "user", "content": text}])
        assert engine.generate(ids, cfg).tokens == vanilla.generate(ids, cfg).tokens
    rep = auto.report()
    assert rep["drafting_steps"] > 0 and rep["expected_tau"] >= 1.0 and rep["achieved_tau"] >= 1.0


def test_tests_use_their_own_cost_cache():
    """conftest points the cost cache at a temporary folder: no test (nor an app it starts) writes timings of a
    faked or slowed target into the user's cache, where the next real start would size its trees from them."""
    import os
    from pathlib import Path

    from dart_core.sizing.costs import cost_cache_dir

    user = Path(os.path.expanduser("~")) / ".cache" / "dart-demo"
    assert user not in cost_cache_dir().parents
    assert Path(os.environ["DART_DEMO_CACHE"]).is_dir()


def test_the_draft_cost_refits_only_when_read():
    """Every step adds a sample; the fit runs when the chooser reads the coefficients (every few steps), and a read
    sees every sample added before it."""
    cost = DraftCost()
    cost.add((1, 4, 0), 0.003)
    cost.add((1, 8, 0), 0.005)
    assert cost._stale
    first = cost.coef.copy()
    assert not cost._stale and first @ DraftCost.features((1, 8, 0)) == pytest.approx(0.005, rel=1e-6)
    cost.coef = np.array([0.0, 0.001, 0.0, 0.0])           # set by hand (tests, a start-up seed): kept until a sample
    assert cost.coef[1] == 0.001
    cost.add((1, 12, 0), 0.007)
    assert cost.coef @ DraftCost.features((1, 12, 0)) == pytest.approx(0.007, rel=1e-6)
