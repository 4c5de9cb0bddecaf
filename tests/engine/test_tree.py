import json

import numpy as np
import pytest

from dart_core.engine.trace import ScoredCandidates, StepTrace
from dart_core.engine.tree import DraftTree, InvalidTreeError


def small_tree():
    #        0(root=7)
    #       /        \
    #    1(8)        2(9)
    #    /   \         \
    #  3(10) 4(11)     5(12)
    #   |
    #  6(13)
    return DraftTree.from_parents([7, 8, 9, 10, 11, 12, 13], [-1, 0, 0, 1, 1, 2, 3],
                                  scores=[0, -0.1, -0.5, -0.3, -0.2, -0.9, -0.4])


def test_depths_positions_and_paths():
    t = small_tree()
    assert t.depths.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert t.position_offsets().tolist() == t.depths.tolist()
    assert t.leaves() == [4, 5, 6]
    assert t.root_to_leaf_paths() == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]
    assert t.max_depth == 3 and t.num_drafted == 6


def test_ancestor_mask_is_ancestors_and_self():
    m = small_tree().ancestor_mask()
    expected = np.zeros((7, 7), dtype=bool)
    for i, anc in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]):
        expected[i, anc] = True
    assert (m == expected).all()


def test_children_ranked_by_score_then_index():
    t = DraftTree.from_parents([1, 2, 3, 4], [-1, 0, 0, 0], scores=[0, -1.0, -0.5, -0.5])
    # node 2 and 3 tie on score: the lower index (drafted first) comes first
    assert t.children()[0] == [2, 3, 1]


def test_from_paths_merges_common_prefixes():
    t = DraftTree.from_paths(5, [[1, 2, 3], [1, 2, 4], [6]], path_scores=[-1.0, -2.0, -3.0])
    assert t.tokens.tolist() == [5, 1, 2, 3, 4, 6]
    assert t.parents.tolist() == [-1, 0, 1, 2, 2, 0]
    assert t.scores.tolist() == [0.0, -1.0, -1.0, -1.0, -2.0, -3.0]


@pytest.mark.parametrize("tokens,parents,depths,msg", [
    ([], [], [], "at least the root"),
    ([1, 2], [-1, 1], [0, 1], "parents must precede"),
    ([1, 2], [0, 0], [0, 1], "node 0 must be the root"),
    ([1, 2], [-1, 0], [0, 2], "expected depth"),
    ([1, -2], [-1, 0], [0, 1], ">= 0"),
    ([1, 2], [-1], [0, 1], "must match"),
])
def test_invalid_trees_are_rejected(tokens, parents, depths, msg):
    with pytest.raises(InvalidTreeError, match=msg):
        DraftTree(tokens, parents, depths)


def test_nan_scores_rejected():
    with pytest.raises(InvalidTreeError, match="NaN"):
        DraftTree([1, 2], [-1, 0], [0, 1], [0.0, float("nan")])


def test_truncated_keeps_a_valid_subtree():
    t = small_tree()
    d1 = t.truncated(max_depth=1)
    assert d1.tokens.tolist() == [7, 8, 9] and d1.parents.tolist() == [-1, 0, 0]
    n4 = t.truncated(max_nodes=4)
    assert n4.tokens.tolist() == [7, 8, 9, 10] and n4.parents.tolist() == [-1, 0, 0, 1]
    assert t.truncated(max_depth=10, max_nodes=100) is t
    assert len(t.truncated(max_depth=0)) == 1


def test_cut_tree_remaps_the_scored_candidates():
    t = small_tree()
    # candidates 0..n-2 are the kept nodes 1..n-1 in order, then one pruned candidate
    n = len(t)
    cands = ScoredCandidates(token=[int(x) for x in t.tokens[1:]] + [99], parent=[-1] * n, depth=[1] * n,
                             logit_term=[0.0] * n, ngram_term=[0.0] * n, score=[0.0] * n,
                             kept=[True] * (n - 1) + [False], node=list(range(1, n)) + [-1])
    cut, new_index = t.truncated_with_index(max_depth=1)
    assert t.truncated_with_index(max_depth=10)[1] is None
    r = cands.with_nodes_remapped(new_index)
    kept_nodes = sorted(int(x) for x, k in zip(r.node, r.kept) if k)
    assert kept_nodes == list(range(1, len(cut)))
    for i in range(n):
        if r.kept[i]:
            assert cut.tokens[r.node[i]] == cands.token[i]
        else:
            assert r.node[i] == -1
    assert sum(bool(k) for k in r.kept) == len(cut) - 1 < sum(cands.kept)


def test_step_trace_round_trips_through_json():
    cands = ScoredCandidates()
    cands.append(token=8, parent=-1, depth=1, logit_term=-0.1, ngram_term=-2.0, score=-1.1, kept=True, node=1)
    cands.append(token=99, parent=0, depth=2, logit_term=-3.0, ngram_term=-23.0, score=-9.0, kept=False, node=-1)
    tr = StepTrace(step=1, position=4, tree=small_tree(), accepted_nodes=[0, 1, 3], emitted_tokens=[8, 10, 42],
                   bonus_token=42, node_target_prob=[1.0] * 7, node_target_argmax=[8, 10, 0, 42, 0, 0, 0],
                   timings={"draft_forward": 0.001, "tree_build": 0.0005, "verify": 0.02, "commit": 0.0001},
                   candidates=cands, stop_reason=None)
    back = StepTrace.from_json(json.dumps(json.loads(tr.to_json())))
    assert back.tree.to_dict() == tr.tree.to_dict()
    assert back.candidates == tr.candidates
    assert back.acceptance_length == 3 and back.accepted_drafts == 2
    d = tr.to_dict()
    d["version"] = 999
    with pytest.raises(ValueError, match="version"):
        StepTrace.from_dict(d)


# ---------------------------------------------------------------- the rows a verify computes first
def test_likeliest_grows_from_the_root_by_score():
    t = small_tree()   # scores: 1 -0.1, 2 -0.5, 3 -0.3, 4 -0.2, 5 -0.9, 6 -0.4
    assert t.likeliest(1) == [0] and t.likeliest(0) == [0]
    assert t.likeliest(2) == [0, 1]
    assert t.likeliest(4) == [0, 1, 4, 3]
    assert t.likeliest(5) == [0, 1, 4, 3, 6]          # 6 (-0.4) only once its parent 3 is taken
    assert t.likeliest(100) == [0, 1, 4, 3, 6, 2, 5]  # every node, ancestors first
    assert DraftTree.root_only(5).likeliest(4) == [0]
    # equal scores: lower index first
    flat = DraftTree.from_parents([1, 2, 3, 4], [-1, 0, 0, 1])
    assert flat.likeliest(3) == [0, 1, 2]


def test_on_request_computes_missing_values_once():
    from dart_core.engine.trace import OnRequest

    calls = []

    def compute(nodes):
        calls.append(list(nodes))
        return [10 * i for i in nodes]

    lazy = OnRequest(4, compute, holds_nbytes=100)
    assert len(lazy) == 4 and calls == []
    walk = lazy.per_node()                      # a walk computes the nodes it visits, one at a time
    assert walk[2] == 20 and walk[3] == 30 and walk[2] == 20 and calls == [[2], [3]]
    assert lazy[0] == 0 and calls[-1] == [0, 1]  # a reader's first read computes the rest in one call
    assert list(lazy) == [0, 10, 20, 30] and lazy[-1] == 30 and len(calls) == 3
    assert lazy == [0, 10, 20, 30] and [0, 10, 20, 30] == lazy and lazy[1:3] == [10, 20]
    assert np.asarray(lazy).tolist() == [0, 10, 20, 30] and len(calls) == 3
    assert lazy.nbytes >= 100 and len(walk) == 4
    for bad in (lambda: lazy[4], lambda: walk[4], lambda: lazy.at(-1)):
        with pytest.raises(IndexError, match="node"):
            bad()


def test_a_trace_with_values_on_request_exports_plain_lists():
    from dart_core.engine.trace import OnRequest

    t = small_tree()
    st = StepTrace(step=1, position=0, tree=t, accepted_nodes=[0, 1], emitted_tokens=[8, 10], bonus_token=10,
                   node_target_prob=OnRequest(len(t), lambda nodes: [0.5] * len(nodes)),
                   node_target_argmax=OnRequest(len(t), lambda nodes: [8] * len(nodes)),
                   timings={"draft_forward": 0.0, "tree_build": 0.0, "verify": 0.0, "commit": 0.0})
    back = StepTrace.from_json(st.to_json())
    assert back.node_target_prob == [0.5] * 7 and back.node_target_argmax == [8] * 7
    assert st.node_target_prob == back.node_target_prob and st.node_target_argmax == back.node_target_argmax
