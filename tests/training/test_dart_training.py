"""DART training: the prefix-shared block mask (dense SDPA vs flex_attention vs the inference path),
draft vocabulary, target features, loss going down, the CLI run with checkpoint/resume, and the
resumable corpus regeneration. Tiny random targets only (the bundled model is never trained here)."""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from dart_core.config import GenerationConfig
from dart_core.engine.decoding import SpeculativeEngine
from dart_core.models.heads.config import HeadConfig
from dart_core.models.heads.dart import BlockLayout, DartHead, load_dart_head, new_head_for_target
from dart_core.models.heads.files import validate_vocab_mapping
from dart_core.training.dart_trainer import (DartTrainConfig, TrainError, dart_loss, evaluate_head,
                                             sample_prefixes, train_dart)
from dart_core.training.data import DataError, DistillRow, load_distill_rows, split_rows
from dart_core.training.features import compute_features
from dart_core.training.runner import load_trainer_state
from dart_core.training.schedule import BudgetPlanner, cosine_lr
from dart_core.training.vocab import build_draft_vocab


def small_head(D=3, V=40, seed=0) -> DartHead:
    torch.manual_seed(seed)
    cfg = HeadConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=V, draft_vocab_size=V, draft_length=D, initializer_range=0.2, kind="dart")
    head = DartHead(cfg)
    head.reset_parameters(seed)
    return head.attach_embedding(torch.randn(V, 32))


# ---------------------------------------------------------------------------------------------- block mask
def reference_mask(n, prefix_ends, D):
    """Hand-written rule: real rows causal over real rows; block b's slot j sees real <= p_b and its own
    slots 1..j; nothing else."""
    N = n + len(prefix_ends) * D
    m = torch.zeros(N, N, dtype=torch.bool)
    for q in range(n):
        m[q, : q + 1] = True
    for b, p in enumerate(prefix_ends):
        for j in range(D):
            q = n + b * D + j
            m[q, : p + 1] = True
            m[q, n + b * D: q + 1] = True
    return m


def test_block_mask_matches_the_rule():
    n, pe, D = 9, [2, 5, 8, 0], 3
    layout = BlockLayout.build(n, torch.tensor(pe), D)
    assert torch.equal(layout.dense_mask(), reference_mask(n, pe, D))
    assert layout.positions[n:].tolist() == [p + j for p in pe for j in range(1, D + 1)]
    assert layout.output_rows()[1].tolist() == [5, n + 3, n + 4, n + 5]
    padded = BlockLayout.build(n, torch.tensor(pe), D, pad_to=8)
    dm = padded.dense_mask()
    N = n + len(pe) * D
    assert torch.equal(dm[:N, :N], reference_mask(n, pe, D)) and not dm[:N, N:].any()
    assert dm[N:, N:].diagonal().all(), "padding rows must see themselves (no empty softmax)"


def test_flex_attention_agrees_with_the_sdpa_block_mask():
    """flex_attention has no backward on CPU, so this compares forwards (eager flex on CPU); on GPU the
    trainer runs the compiled flex_attention with the same BlockLayout.allowed rule."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    head = small_head()
    g = torch.Generator().manual_seed(0)
    aux, ids = torch.randn(13, 96, generator=g), torch.randint(0, 40, (13,), generator=g)
    pe = torch.tensor([0, 4, 7, 12])
    with torch.no_grad():
        a = head.forward_blocks(aux, ids, pe, attention="sdpa")
        b = head.forward_blocks(aux, ids, pe, attention="flex")
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_training_forward_equals_inference_steps():
    """Block s of the shared training forward is exactly what the drafter computes after prefix p_s."""
    head = small_head(D=4)
    g = torch.Generator().manual_seed(1)
    aux, ids = torch.randn(11, 96, generator=g), torch.randint(0, 40, (11,), generator=g)
    pe = torch.tensor([1, 6, 10])
    with torch.no_grad():
        blocks = head.forward_blocks(aux, ids, pe)
    for s, p in enumerate(pe.tolist()):
        cache = head.new_cache()
        half = (p + 1) // 2
        if half:
            head.step(aux[:half], ids[:half], cache)
        torch.testing.assert_close(head.step(aux[half: p + 1], ids[half: p + 1], cache), blocks[s],
                                   atol=1e-5, rtol=1e-5)


def test_masked_slots_do_not_see_other_blocks():
    head = small_head()
    g = torch.Generator().manual_seed(2)
    aux, ids = torch.randn(10, 96, generator=g), torch.randint(0, 40, (10,), generator=g)
    with torch.no_grad():
        alone = head.forward_blocks(aux, ids, torch.tensor([4]))
        together = head.forward_blocks(aux, ids, torch.tensor([2, 4, 9]))
    torch.testing.assert_close(alone[0], together[1], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- vocab, schedule, data
def test_draft_vocab_keeps_the_most_frequent_tokens():
    seqs = [[5, 5, 5, 7, 7, 9, 1], [5, 7, 3, 3, 3, 3]]
    v = build_draft_vocab(seqs, vocab_size=12, draft_vocab_size=3, always_include=[11])
    assert v.draft_ids.tolist() == [3, 5, 11]              # 3 (x4), 5 (x4), EOS 11 forced in; ids ascending
    assert v.d2t.tolist() == [3, 4, 9] and v.t2d.nonzero().view(-1).tolist() == [3, 5, 11]
    assert v.coverage == pytest.approx(8 / 13)
    cfg = HeadConfig(hidden_size=8, intermediate_size=8, num_attention_heads=2, num_key_value_heads=1,
                     vocab_size=12, draft_vocab_size=3, kind="dart")
    validate_vocab_mapping(v.d2t, v.t2d, cfg, "test")
    full = build_draft_vocab(seqs, vocab_size=12, draft_vocab_size=64)
    assert full.size == 12 and bool(full.t2d.all()) and not full.d2t.any()


def test_cosine_schedule_and_budget_planner():
    lrs = [cosine_lr(s, 100, 10, 1e-3, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] == pytest.approx(1e-4, rel=0.01)
    bp = BudgetPlanner(budget_s=1000, reserve_s=100, calibrate_after=3)
    assert bp.plan(500, 500, 2, 20, 10.0) == 500           # not calibrated yet
    assert bp.plan(500, 500, 10, 100, 10.0) == 10 + 80     # (1000 - 100 - 100) / 10 more steps
    # a slow start fitted 50 steps; at the faster pace since, the plan grows back, up to the ceiling
    assert bp.plan(50, 500, 10, 100, 10.0) == 90
    assert bp.plan(50, 60, 10, 100, 10.0) == 60
    assert bp.plan(89, 500, 10, 100, 10.0) == 89           # within the 2% tolerance: no lr wiggle
    assert bp.plan(91, 500, 10, 100, 10.0) == 90           # a smaller fit always shrinks (the budget holds)
    assert bp.plan(500, 500, 10, 950, 10.0) == 10          # out of time: stop now
    assert bp.pace([30.0, 1.0, 2.0, 3.0]) == 2.0           # the first (start-up) step left out
    assert BudgetPlanner(budget_s=1, window=2).pace([9.0, 9.0, 1.0, 3.0]) == 2.0 and bp.pace([]) == 0.0
    assert BudgetPlanner(budget_s=None).plan(500, 500, 10, 100, 10.0) == 500
    assert bp.over(950) and not bp.over(100)


def test_data_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_distill_rows(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt_ids": [1, 2], "response_ids": [3, 4]}) + "\n{oops\n")
    with pytest.raises(DataError, match="bad.jsonl:2"):
        load_distill_rows(bad)
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"prompt_ids": [1, 2], "response_ids": [3, 999]}) + "\n")
    with pytest.raises(DataError, match="outside the target vocabulary"):
        load_distill_rows(other, vocab_size=100)
    rows = [DistillRow(str(i), [1], [2, 3]) for i in range(200)]
    tr, ho = split_rows(rows, 100)
    assert len(tr) + len(ho) == 200 and 5 < len(ho) < 40 and split_rows(rows, 100)[1] == ho


# ----------------------------------------------------------------- with a tiny target: the tiny fixture in conftest.py
def test_features_align_with_the_engine(tiny):
    _, t, _, rows = tiny
    r = rows[0]
    ids = r["prompt_ids"] + r["response_ids"]
    draft_ids = torch.arange(0, t.vocab_size, 2)
    full = compute_features(t, ids, len(r["prompt_ids"]), draft_ids, "full")
    data = compute_features(t, ids, len(r["prompt_ids"]), draft_ids, "data")
    session = t.new_session(128)
    out = session.prefill(ids, want_aux=True)
    # The session may run the native CPU forward (another summation order): float32 agreement is a few
    # ulps of the largest activation (in the hundreds for these random weights), not 1e-4 per element.
    scale = max(1.0, float(out.aux.abs().max()))
    torch.testing.assert_close(full.aux, out.aux, atol=3e-5 * scale, rtol=0)
    P, T = len(r["prompt_ids"]), len(ids)
    assert full.logits.shape == (T - 1 - P, len(draft_ids))
    torch.testing.assert_close(full.logits, data.logits, atol=1e-4, rtol=1e-4)
    # The corpus is the target's own greedy answer: the data token is the target's argmax.
    assert torch.equal(full.argmax, data.argmax)


def test_a_few_training_steps_reduce_the_loss(tiny):
    _, t, _, rows = tiny
    vocab = build_draft_vocab([r["response_ids"] for r in rows], t.vocab_size, 128)
    head = new_head_for_target(t, vocab.draft_ids, draft_length=4, seed=0)
    t2d = head.target_to_draft()
    feats = [compute_features(t, r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"]), head.draft_ids, "full")
             for r in rows[:4]]
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)

    def batch_loss(grad: bool):
        total = 0.0
        for f in feats:
            loss, _ = dart_loss(head, f, sample_prefixes(f, 0), 0.6, t2d, with_stats=False)
            if grad:
                (loss / len(feats)).backward()
            total += float(loss.detach()) / len(feats)
        return total

    with torch.no_grad():
        before = batch_loss(False)
    for _ in range(15):
        opt.zero_grad()
        batch_loss(True)
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        opt.step()
    with torch.no_grad():
        after = batch_loss(False)
    assert after < 0.8 * before, f"loss {before:.3f} -> {after:.3f}"
    ev = evaluate_head(head, t, [DistillRow(r["id"], r["prompt_ids"], r["response_ids"]) for r in rows[:4]],
                       gamma=0.6, prefixes=0)
    assert len(ev["hit@1"]) == 5 and ev["hit@1"][0] > 0.2


def test_train_cli_writes_a_loadable_head_and_resumes(tiny, tmp_path):
    from dart_core.training.cli import main

    d, t, data, _ = tiny
    out = tmp_path / "run"
    common = ["dart", "--target", str(d), "--data", str(data), "--out", str(out), "--batch-seqs", "4",
              "--draft-length", "3", "--draft-vocab-size", "64", "--heldout-permille", "150", "--eval-rows", "3",
              "--dtype", "float32", "--lr", "2e-3", "--no-progress"]
    assert main(common + ["--max-steps", "2"]) == 0
    for name in ("config.json", "model.safetensors", "eval.json", "README.md", "train_log.jsonl",
                 "training_summary.json"):
        assert (out / name).is_file(), name
    head = load_dart_head(out, t)                       # strict load + target check
    assert head.config.draft_vocab_size == 64 and head.fc.weight.dtype == torch.float32  # cast to the target's
    with pytest.raises(TrainError, match="--resume"):
        train_dart(DartTrainConfig(data=str(data), out=str(out), target=str(d), max_steps=3, dtype="float32"))
    # Resuming a finished run changes nothing; a larger --max-steps extends it from its checkpoint.
    state = load_trainer_state(out / "checkpoint" / "trainer_state.pt")   # plain data: loads with weights_only
    assert state["step"] == 2 and state["finished"]
    assert main(common + ["--resume"]) == 0
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 2
    assert main(common + ["--max-steps", "4", "--resume"]) == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3, 4]
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 4 and len(summary["eval"]["hit@1"]) == 4
    assert "alpaca" in (out / "README.md").read_text()
    # other learning settings are refused, each named (the head, the schedule and run_info would disagree)
    changed = [a if a != "2e-3" else "0.5" for a in common]
    changed[changed.index("--draft-vocab-size") + 1] = "32"
    with pytest.raises(TrainError, match=r"--draft-vocab-size was 64, now 32; --lr was 0.002, now 0.5"):
        train_dart(DartTrainConfig(data=str(data), out=str(out), target=str(d), resume=True, max_steps=5,
                                   batch_seqs=4, draft_length=3, draft_vocab_size=32, heldout_permille=150,
                                   eval_rows=3, dtype="float32", lr=0.5, progress=False))
    assert main(changed + ["--resume", "--gamma", "0.9"]) == 2
    assert json.loads((out / "training_summary.json").read_text())["steps"] == 4      # nothing ran



def test_a_budget_shorter_than_the_evaluation_stops_after_calibrating(tiny, tmp_path):
    """--time-budget-min fits the plan from the pace of the first steps: a budget that the final evaluation alone
    would exceed stops the run once calibrated, with the learning rate schedule fitted to the steps taken."""
    from dart_core.training.cli import main

    d, t, data, _ = tiny
    out = tmp_path / "run"
    assert main(["dart", "--target", str(d), "--data", str(data), "--out", str(out), "--batch-seqs", "2",
                 "--draft-length", "2", "--draft-vocab-size", "64", "--heldout-permille", "150", "--eval-rows", "2",
                 "--dtype", "float32", "--no-progress", "--max-steps", "40", "--time-budget-min", "0.2"]) == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3] and log[0]["total_steps"] == 40   # the plan before fitting
    assert json.loads((out / "training_summary.json").read_text())["steps"] == 3

class _RunsCodeWhenUnpickled:
    """A pickled object whose loading calls os.mkdir(path): stands for any code a hostile file could run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import os
        return (os.mkdir, (self.path,))


def test_resume_refuses_a_state_file_that_would_run_code(tiny, tmp_path):
    from dart_core.training.checkpoint import save_checkpoint

    d, _, data, _ = tiny
    out, marker = tmp_path / "run", tmp_path / "code-ran"

    def write(tmp):
        (tmp / "head").mkdir()
        torch.save({"step": 1, "total_steps": 2, "method": "dart", "payload": _RunsCodeWhenUnpickled(marker)},
                   tmp / "trainer_state.pt")
    save_checkpoint(out / "checkpoint", write)
    with pytest.raises(TrainError, match="refusing to resume .* could run code") as info:
        train_dart(DartTrainConfig(data=str(data), out=str(out), target=str(d), resume=True, max_steps=3,
                                   dtype="float32", draft_length=3, draft_vocab_size=64, progress=False))
    assert "posix.mkdir" in str(info.value) or "mkdir" in str(info.value)
    assert not marker.exists(), "the state file's code ran"
    # the same refusal for the file on its own, and a damaged file is a clear error too
    with pytest.raises(TrainError, match="could run code"):
        load_trainer_state(out / "checkpoint" / "trainer_state.pt")
    (out / "checkpoint" / "trainer_state.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(TrainError, match="the checkpoint is damaged"):
        load_trainer_state(out / "checkpoint" / "trainer_state.pt")
    assert not marker.exists()


def test_model_card_names_the_target_and_a_schedule_restart(tmp_path):
    from dart_core.training.dart_trainer import display_target, lr_restarts

    log = tmp_path / "train_log.jsonl"
    lrs = [1e-4, 2e-4, 5e-4, 4e-4, 1e-4, 2e-5, 3e-4, 2e-4]   # warm-up, decay, extended at step 7
    log.write_text("".join(json.dumps({"step": i + 1, "lr": lr}) + "\n" for i, lr in enumerate(lrs)) + "{torn")
    assert lr_restarts(log, warmup=3) == [7]
    assert lr_restarts(tmp_path / "missing.jsonl", warmup=3) == []
    assert display_target("bundled").startswith("SmolLM2-135M-Instruct")
    assert display_target("Qwen/Qwen3-4B") == "Qwen/Qwen3-4B"


def test_train_flags_are_validated(tiny, tmp_path):
    d, _, data, _ = tiny
    with pytest.raises(TrainError, match="--checkpoint-minutes"):
        train_dart(DartTrainConfig(data=str(data), out=str(tmp_path), checkpoint_minutes=30))
    with pytest.raises(TrainError, match="--attention flex needs a GPU"):
        train_dart(DartTrainConfig(data=str(data), out=str(tmp_path / "x"), target=str(d), attention="flex",
                                   device="cpu"))


def test_regeneration_is_resumable_and_greedy(tiny, tmp_path):
    from dart_core.models.templates import encode_chat, get_template
    from dart_core.training.regenerate import regenerate, select_prompts

    _, t, _, _ = tiny
    prompts = [{"id": f"p{i}", "source": "alpaca", "prompt": text}
               for i, text in enumerate(["Write a Python function", "The quick brown fox", "What is 12 times 7?"])]
    assert len(select_prompts(prompts * 10, fraction=0.5, seed=1)) < 30
    out = tmp_path / "corpus.jsonl.gz"
    partial = tmp_path / "corpus.jsonl.gz.partial.jsonl"
    # A previous run finished p0 and was killed while writing the next line.
    template = get_template(t.template_name)
    ids0 = encode_chat(t.tokenizer, template, [{"role": "user", "content": prompts[0]["prompt"]}])
    partial.write_text(json.dumps({"id": "p0", "source": "alpaca", "category": None, "prompt_ids": ids0,
                                   "response_ids": [1, 2], "response": "kept"}) + "\n" + '{"id": "p1", "pro')
    stats = regenerate(t, prompts, out, max_new_tokens=12, progress=False)
    assert stats["resumed"] == 1 and stats["written"] == 2 and not partial.exists()
    rows = [json.loads(x) for x in gzip.open(out, "rt")]
    assert [r["id"] for r in rows] == ["p0", "p1", "p2"] and rows[0]["response"] == "kept"
    for r in rows[1:]:
        want = SpeculativeEngine(t).generate(r["prompt_ids"], GenerationConfig(max_new_tokens=12, max_length=200))
        assert r["response_ids"] == want.tokens
    assert load_distill_rows(out)[1].response_ids == rows[1]["response_ids"]
    # A larger pick over the finished OUT answers only the new prompt and keeps the rows it had.
    more = prompts + [{"id": "p3", "source": "alpaca", "prompt": "Name a colour"}]
    stats = regenerate(t, more, out, max_new_tokens=12, progress=False)
    assert stats["resumed"] == 3 and stats["written"] == 1 and not partial.exists()
    again = [json.loads(x) for x in gzip.open(out, "rt")]
    assert again[:3] == rows and again[3]["id"] == "p3"


def test_init_head_fine_tunes_a_head_and_refuses_another_targets(tiny, tmp_path, capsys):
    """--init-head starts from a trained head's weights and draft vocabulary (as a run fine-tuning the shipped
    assets/dart head would), is recorded in run_info and the card, and refuses a head made for another target."""
    from dart_core.training.cli import main
    from tiny_models import make_tiny_model_dir

    d, t, data, _ = tiny
    common = ["--target", str(d), "--data", str(data), "--batch-seqs", "4", "--draft-length", "3",
              "--heldout-permille", "150", "--eval-rows", "2", "--dtype", "float32", "--no-progress",
              "--max-steps", "1"]
    base = tmp_path / "base"
    assert main(["dart", "--out", str(base), "--draft-vocab-size", "64", "--lr", "2e-3"] + common) == 0
    tuned = tmp_path / "tuned"
    # A tiny learning rate: the saved head is the start head (to bf16 precision), vocabulary included.
    assert main(["dart", "--out", str(tuned), "--draft-vocab-size", "32", "--lr", "1e-12",
                 "--init-head", str(base)] + common) == 0
    h0, h1 = load_dart_head(base, t), load_dart_head(tuned, t)
    assert h1.config.draft_vocab_size == 64 and torch.equal(h1.d2t, h0.d2t)      # its vocabulary, not 32
    for name in ("fc.weight", "midlayer.mask_rep", "midlayer.mlp.down_proj.weight", "lm_head.weight"):
        assert torch.allclose(h1.state_dict()[name], h0.state_dict()[name], atol=1e-2), name
    info = json.loads((tuned / "run_info.json").read_text())
    assert info["init"] == {"head": str(base), "layer_from_target": False, "lm_head_from_target": False}
    assert info["vocab"]["size"] == 64 and info["vocab"]["from"] == str(base)
    card = (tuned / "README.md").read_text()
    assert f"`--init-head {base}`" in card and "the starting head's 64 tokens (`--init-head`)" in card
    # Another target's head is refused, naming the flag; so is a head with another draft length.
    other = make_tiny_model_dir(tmp_path, "llama", seed=1)
    capsys.readouterr()
    argv = ["dart", "--out", str(tmp_path / "x"), "--lr", "1e-3", "--init-head", str(base)] + common
    argv[argv.index("--target") + 1] = str(other)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--init-head {base} was made for another target" in err and "other weights" in err
    # Another draft length fine-tunes the same weights (the mask slots share one input vector).
    longer = tmp_path / "longer"
    assert main(["dart", "--out", str(longer), "--lr", "1e-12", "--init-head", str(base)] + common
                + ["--draft-length", "4"]) == 0
    h2 = load_dart_head(longer, t)
    assert h2.config.draft_length == 4 and torch.equal(h2.d2t, h0.d2t)
    assert torch.allclose(h2.state_dict()["midlayer.mask_rep"], h0.state_dict()["midlayer.mask_rep"], atol=1e-2)
    assert len(json.loads((longer / "eval.json").read_text())["hit@1"]) == 5
    assert main(["dart", "--out", str(tmp_path / "z"), "--init-head", str(base), "--init-layer-from-target"]
                + common) == 2
    assert "cannot be combined with --init-head" in capsys.readouterr().err


def test_rebuild_vocab_gives_a_fine_tuned_head_the_corpus_vocabulary(tiny, tmp_path, capsys):
    """--rebuild-vocab: the starting head's weights with a draft vocabulary of this corpus's answers; tokens it
    had keep their LM-head rows, new ones start from the target's; recorded in run_info and the card."""
    from dart_core.models.heads.dart import save_dart_head
    from dart_core.models.heads.layers import remap_vocab
    from dart_core.training.cli import main
    from dart_core.training.data import truncate

    d, t, data, _ = tiny
    size = 16
    odd = torch.arange(1, t.vocab_size, 2)[:size]                     # a vocabulary the corpus did not choose
    base_head = new_head_for_target(t, odd, draft_length=3, seed=2)
    base = tmp_path / "base"
    save_dart_head(base_head, base, dtype=torch.float32)
    common = ["--target", str(d), "--data", str(data), "--batch-seqs", "4", "--draft-length", "3",
              "--heldout-permille", "150", "--eval-rows", "2", "--dtype", "float32", "--no-progress",
              "--max-steps", "1", "--lr", "1e-12", "--save-dtype", "float32"]
    tuned = tmp_path / "tuned"
    assert main(["dart", "--out", str(tuned), "--init-head", str(base), "--rebuild-vocab"] + common) == 0
    train_rows, _ = split_rows([truncate(r, 1024) for r in load_distill_rows(data)], 150)
    want = build_draft_vocab((r.response_ids for r in train_rows), t.vocab_size, size,
                             always_include=t.eos_token_ids)
    h0, h1 = load_dart_head(base, t), load_dart_head(tuned, t)
    assert torch.equal(h1.draft_ids.cpu(), want.draft_ids)
    old_row = h0.target_to_draft()
    out_emb = t.model.get_output_embeddings().weight.float()
    kept = 0
    for row, tid in enumerate(h1.draft_ids.tolist()):
        expect = h0.lm_head.weight[old_row[tid]] if old_row[tid] >= 0 else out_emb[tid]
        kept += int(old_row[tid] >= 0)
        assert torch.allclose(h1.lm_head.weight[row], expect, atol=1e-4), tid
    assert 0 < kept < size
    info = json.loads((tuned / "run_info.json").read_text())["vocab"]
    assert info["rebuilt"] and info["kept"] == kept and info["coverage"] > info["start_coverage"]
    card = (tuned / "README.md").read_text()
    assert "rebuilt from this corpus (`--rebuild-vocab`)" in card and f"{kept} of them the starting head's" in card
    # a new head builds its own vocabulary already; a wrong-sized remap is refused
    capsys.readouterr()
    assert main(["dart", "--out", str(tmp_path / "x"), "--rebuild-vocab"] + common) == 2
    assert "drop --rebuild-vocab or give --init-head" in capsys.readouterr().err
    with pytest.raises(ValueError, match="ids for a draft vocabulary"):
        remap_vocab(h1, t, want.draft_ids[:-1])


def test_init_layer_from_target_starts_the_layer_from_the_targets_last(tiny, tmp_path):
    from dart_core.training.cli import main

    d, t, data, _ = tiny
    out = tmp_path / "run"
    assert main(["dart", "--target", str(d), "--data", str(data), "--out", str(out), "--batch-seqs", "4",
                 "--draft-length", "3", "--draft-vocab-size", "64", "--heldout-permille", "150", "--eval-rows", "2",
                 "--dtype", "float32", "--no-progress", "--max-steps", "1", "--lr", "1e-12",
                 "--init-layer-from-target", "--save-dtype", "float32"]) == 0
    head = load_dart_head(out, t)
    last = t.model.model.layers[-1]
    H = head.config.hidden_size
    assert torch.allclose(head.midlayer.mlp.down_proj.weight, last.mlp.down_proj.weight, atol=1e-6)
    assert torch.allclose(head.midlayer.self_attn.q_proj.weight[:, H:], last.self_attn.q_proj.weight, atol=1e-6)
    info = json.loads((out / "run_info.json").read_text())
    assert info["init"] == {"head": None, "layer_from_target": True, "lm_head_from_target": True}
    card = (out / "README.md").read_text()
    assert "decoder layer from the target's last layer" in card
