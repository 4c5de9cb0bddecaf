"""DART's parallel logits (issue 38): each step's trace keeps the head's top-k per level from its one forward, before
pruning; the tree's head nodes come from those rows; exports keep them, and a damaged one is refused by name; the
page's view marks what the tree kept and accepted."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dart_core.config import GenerationConfig
from dart_core.drafters.dart import DartDrafter
from dart_core.drafters.pruning import PruningConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.engine.trace import SOURCE_HEAD
from dart_core.models.heads.dart import new_head_for_target
from dart_core.ui.record import EngineRun, ReplayError, RunRecord
from dart_core.ui.viz_tree import parallel_logits

PROMPT = [10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11]


@pytest.fixture(scope="module")
def run(tiny_llama):
    t = tiny_llama
    head = new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=5)
    d = DartDrafter(head, None, t.eos_token_ids, PruningConfig(budget=6, level_top_k=3, beam_width=2,
                                                                context_weight=1.0))
    res = SpeculativeEngine(t, d).generate(PROMPT, GenerationConfig(max_new_tokens=30, max_length=120))
    return t, d, res


def test_each_step_keeps_its_levels_top_k_and_the_tree_draws_from_them(run):
    t, d, res = run
    drafted = [st for st in res.traces if st.head_rows is not None]
    assert drafted, "no step ran the head"
    for st in res.traces:
        if st.head_rows is None:       # the context drafted alone (head skipped): no rows to show
            continue
        tokens = np.asarray(st.head_rows["token"])
        logits = np.asarray(st.head_rows["logit"])
        assert tokens.shape == logits.shape == (min(d.head.config.draft_length + 1, 6), 3)
        assert (np.diff(logits, axis=1) <= 0).all()              # each row best first
        c = st.candidates
        for tok, depth, src in zip(c.token, c.depth, c.source):
            if int(src) & SOURCE_HEAD:   # a head candidate at level l is one of row l's tokens
                assert int(tok) in tokens[int(depth) - 1].tolist()
    assert d.head_skipped == sum(st.head_rows is None and len(st.tree) > 1 for st in res.traces)


def test_exports_keep_the_parallel_logits_and_refuse_damaged_ones(run):
    t, d, res = run
    rec = RunRecord(runs={"dart": EngineRun("dart", tokens=list(res.tokens), traces=res.traces, done=True,
                                            stop_reason=res.stats.stop_reason, variant="+ context")},
                    decode=t.tokenizer, baseline="dart")
    data = json.loads(json.dumps(rec.to_export()))
    back = RunRecord.from_export(data)
    st = next(s for s in back.runs["dart"].traces if s.head_rows is not None)
    k = next(i for i, s in enumerate(back.runs["dart"].traces) if s.head_rows is not None)
    assert st.head_rows["token"] == np.asarray(res.traces[k].head_rows["token"]).tolist()
    assert back.runs["dart"].label == "DART + context"
    bad = json.loads(json.dumps(data))
    bad["engines"]["dart"]["traces"][k]["head_rows"]["logit"][0] = [1.0]
    with pytest.raises(ReplayError, match="head_rows level 1: 3 tokens but 1 logits"):
        RunRecord.from_export(bad)
    bad["engines"]["dart"]["traces"][k]["head_rows"] = {"token": [[1]]}
    with pytest.raises(ReplayError, match="logit"):
        RunRecord.from_export(bad)


def test_the_view_marks_what_the_tree_kept_and_accepted(run):
    t, d, res = run
    for st in res.traces:
        fig = parallel_logits(st, t.tokenizer)
        if st.head_rows is None:
            assert "no head forward" in fig.layout.annotations[0].text
            continue
        heat, kept, accepted, target = fig.data
        levels = len(st.head_rows["token"])
        assert list(heat.y) == list(range(1, levels + 1))
        path = [int(st.tree.tokens[n]) for n in st.accepted_nodes]
        rows = np.asarray(st.head_rows["token"])
        want = sum(1 for depth in range(1, min(len(path), levels + 1)) if path[depth] in rows[depth - 1].tolist())
        assert len(accepted.x) == want
        nodes = {(int(dp), int(tk)) for tk, dp in zip(st.tree.tokens[1:], st.tree.depths[1:])}
        in_rows = sum(1 for dp, tk in nodes if dp <= levels and tk in rows[dp - 1].tolist())
        assert len(kept.x) + len(accepted.x) == in_rows
