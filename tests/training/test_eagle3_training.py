"""EAGLE-3 training: the training-time-test forward against the inference head (step 0 = the real
forward, step k = feeding g back along a chain with step_tree), the loss going down, the CLI run
with checkpoint / resume / extension and its outputs, and flag errors. Tiny random targets only."""
from __future__ import annotations

import json

import pytest
import torch

from dart_core.models.heads.files import HeadTargetMismatch
from dart_core.models.heads.config import HeadConfig
from dart_core.models.heads.eagle3 import Eagle3Head, load_eagle3_head, new_eagle3_head_for_target
from dart_core.models.loader import load_target
from dart_core.training.data import DistillRow
from dart_core.training.eagle3_trainer import (Eagle3TrainConfig, eagle3_loss, evaluate_eagle3_head, train_eagle3,
                                               unrolled_forward)
from dart_core.training.features import compute_features
from dart_core.training.runner import TrainError
from dart_core.training.vocab import build_draft_vocab
from tiny_models import make_tiny_model_dir

H, V = 32, 40


def small_head(seed: int = 0) -> Eagle3Head:
    cfg = HeadConfig(hidden_size=H, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                     vocab_size=V, draft_vocab_size=V, head_dim=12, initializer_range=0.2, rope_theta=5000.0,
                     kind="eagle3")
    head = Eagle3Head(cfg)
    head.reset_parameters(seed)
    with torch.no_grad():  # norms away from 1 so they matter
        for name, p in head.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + 1)) * 0.2)
    return head.attach_embedding(torch.randn(V, H, generator=torch.Generator().manual_seed(seed + 2)))


def inputs(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3 * H, generator=g), torch.randint(0, V, (n,), generator=g)


# ---------------------------------------------------------------------------------------------- the unrolled forward
def test_step0_equals_the_inference_forward():
    head = small_head()
    aux, ids = inputs(11)
    with torch.no_grad():
        step0 = unrolled_forward(head, aux, ids, steps=3)[0]
        plain = head.layer(head.fc(aux), ids, torch.arange(11), None)          # causal, no cache
    cache = head.new_cache()
    real = torch.cat([head.step_real(aux[:4], ids[:4], cache), head.step_real(aux[4:], ids[4:], cache)])
    assert step0.k == 0 and step0.first == 0
    torch.testing.assert_close(step0.g, real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step0.g, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("first_anchor", [0, 3])
def test_unrolled_step_k_equals_feeding_g_back_at_inference(first_anchor):
    """Step k at anchor p = the drafter's depth-k node of the chain x_{p+2}.. after real positions 0..p:
    step_real over 0..p, then step_tree k times, each node fed its parent's g and attending to every real
    position, its ancestors and itself."""
    head = small_head(seed=3)
    n, K = 12, 5
    aux, ids = inputs(n, seed=4)
    with torch.no_grad():
        unrolled = unrolled_forward(head, aux, ids, steps=K, first_anchor=first_anchor)
    assert [u.k for u in unrolled] == list(range(K))
    for u in unrolled[1:]:
        assert u.first == first_anchor and u.g.shape[0] == n - u.k - first_anchor
    checked = 0
    for p in range(first_anchor, n):
        cache = head.new_cache(8)
        g = head.step_real(aux[: p + 1], ids[: p + 1], cache)[-1:]              # depth-1 logits come from here
        torch.testing.assert_close(g[0], unrolled[0].g[p], atol=1e-5, rtol=1e-5)
        for k in range(1, K):
            if p + k >= n:                                                       # no input token x_{p+k+1}
                break
            tree_allowed = torch.ones(1, k, dtype=torch.bool)                    # ancestors + itself
            g = head.step_tree(g, ids[p + k: p + k + 1], p + k, cache, p + k, tree_allowed)
            u = unrolled[k]
            torch.testing.assert_close(g[0], u.g[p - u.first], atol=1e-5, rtol=1e-5)
            checked += 1
    assert checked > 20


def test_unrolled_forward_has_gradients_for_every_parameter():
    head = small_head()
    aux, ids = inputs(9)
    steps = unrolled_forward(head, aux, ids, steps=4)
    sum(head.logits(u.g).logsumexp(-1).sum() for u in steps).backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# ----------------------------------------------------------------- with a tiny target: the tiny fixture in conftest.py
def test_loss_masks_and_weights(tiny):
    """Only answer positions count, steps are weighted gamma**k, and out-of-vocabulary targets are masked."""
    _, t, _, rows = tiny
    r = rows[0]
    vocab = build_draft_vocab([x["response_ids"] for x in rows], t.vocab_size, 16)
    head = new_eagle3_head_for_target(t, vocab.draft_ids, seed=0)
    t2d = head.target_to_draft()
    f = compute_features(t, r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"]), head.draft_ids, "full")
    with torch.no_grad():
        loss, st = eagle3_loss(head, f, 4, 0.8, t2d)
    R = f.logits.shape[0]
    inside = (t2d[f.argmax] >= 0).tolist()
    # step k has a label for answer rows r = 0..R-1-k (its anchor is P-1+r)
    assert st.count.tolist() == [sum(inside[k:]) for k in range(4)]
    assert st.prefixes == R and torch.isfinite(loss)
    none_inside = torch.full_like(t2d, -1)
    loss0, st0 = eagle3_loss(head, f, 4, 0.8, none_inside)
    assert float(loss0.detach()) == 0.0 and st0.count.sum() == 0


def test_a_few_training_steps_reduce_the_loss(tiny):
    _, t, _, rows = tiny
    vocab = build_draft_vocab([r["response_ids"] for r in rows], t.vocab_size, 128)
    head = new_eagle3_head_for_target(t, vocab.draft_ids, seed=0)
    t2d = head.target_to_draft()
    feats = [compute_features(t, r["prompt_ids"] + r["response_ids"], len(r["prompt_ids"]), head.draft_ids, "full")
             for r in rows[:4]]
    opt = torch.optim.AdamW(head.parameters(), lr=3e-3)

    def batch_loss(grad: bool):
        total = 0.0
        for f in feats:
            loss, _ = eagle3_loss(head, f, 4, 0.8, t2d, with_stats=False)
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
    ev = evaluate_eagle3_head(head, t, [DistillRow(r["id"], r["prompt_ids"], r["response_ids"]) for r in rows[:4]],
                              steps=4)
    assert len(ev["hit@1"]) == 4 and ev["positions"] == ["t+1", "t+2", "t+3", "t+4"] and ev["hit@1"][0] > 0.2


def test_train_cli_writes_a_loadable_head_and_resumes(tiny, tmp_path):
    from dart_core.training.cli import main

    d, t, data, _ = tiny
    out = tmp_path / "run"
    common = ["eagle3", "--target", str(d), "--data", str(data), "--out", str(out), "--batch-seqs", "4",
              "--ttt-steps", "3", "--draft-vocab-size", "64", "--heldout-permille", "150", "--eval-rows", "3",
              "--dtype", "float32", "--lr", "2e-3", "--no-progress"]
    assert main(common + ["--max-steps", "2"]) == 0
    for name in ("config.json", "model.safetensors", "eval.json", "README.md", "train_log.jsonl",
                 "training_summary.json", "run_info.json"):
        assert (out / name).is_file(), name
    from safetensors import safe_open
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16                # --save-dtype default
    assert {"fc.weight", "midlayer.hidden_norm.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= keys
    assert not any("mask_rep" in k or "embed_tokens" in k for k in keys)
    head = load_eagle3_head(out, t)                     # strict load + target check
    assert head.config.draft_vocab_size == 64 and head.fc.weight.dtype == torch.float32
    other = load_target(str(make_tiny_model_dir(tmp_path, "llama", seed=1)), dtype="float32", device="cpu")
    with pytest.raises(HeadTargetMismatch, match="train eagle3"):
        load_eagle3_head(out, other)
    ev = json.loads((out / "eval.json").read_text())
    assert len(ev["hit@1"]) == 3 and len(ev["hit@10"]) == 3
    with pytest.raises(TrainError, match="--resume"):
        train_eagle3(Eagle3TrainConfig(data=str(data), out=str(out), target=str(d), max_steps=3, dtype="float32"))
    # A DART run must not resume an EAGLE-3 checkpoint.
    from dart_core.training.dart_trainer import DartTrainConfig, train_dart
    with pytest.raises(TrainError, match="eagle3 run"):
        train_dart(DartTrainConfig(data=str(data), out=str(out), target=str(d), resume=True, dtype="float32",
                                   heldout_permille=150, draft_vocab_size=64))
    # Resuming a finished run changes nothing; a larger --max-steps extends it from its checkpoint.
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 2 and state["finished"] and state["method"] == "eagle3"
    assert main(common + ["--resume"]) == 0
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 2
    assert main(common + ["--max-steps", "4", "--resume"]) == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3, 4] and all(len(x["hit@1"]) == 3 for x in log)
    summary = json.loads((out / "training_summary.json").read_text())
    assert summary["steps"] == 4 and summary["method"] == "eagle3" and len(summary["eval"]["hit@1"]) == 3
    card = (out / "README.md").read_text()
    assert "EAGLE-3 draft head" in card and "alpaca" in card
    assert "4 optimizer steps x 4 sequences" in card
    assert "comparable" not in card, "without --compare-with the card must not claim a comparison"


def test_an_interrupted_run_checkpoints_and_resumes(tiny, tmp_path, monkeypatch):
    """Ctrl-C mid-step: the checkpoint holds the last finished step; --resume redoes the rest."""
    import dart_core.training.eagle3_trainer as e3
    from dart_core.training.cli import main

    d, _, data, _ = tiny
    out = tmp_path / "run"
    args = ["eagle3", "--target", str(d), "--data", str(data), "--out", str(out), "--batch-seqs", "4",
            "--ttt-steps", "2", "--draft-vocab-size", "64", "--heldout-permille", "150", "--eval-rows", "2",
            "--dtype", "float32", "--max-steps", "3", "--no-progress"]
    real, calls = e3.eagle3_loss, {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 6:                     # the second sequence of step 2
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(e3, "eagle3_loss", flaky)
    assert main(args) == 130
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 1 and not state["finished"] and not (out / "model.safetensors").exists()
    monkeypatch.setattr(e3, "eagle3_loss", real)
    assert main(args + ["--resume"]) == 0
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in log] == [1, 2, 3]
    assert json.loads((out / "training_summary.json").read_text())["steps"] == 3


def test_model_card_compares_with_the_dart_run(tiny, tmp_path):
    from dart_core.training.cli import main

    d, _, data, _ = tiny
    dart_out, e3_out = tmp_path / "dart", tmp_path / "eagle3"
    common = ["--target", str(d), "--data", str(data), "--batch-seqs", "4", "--draft-vocab-size", "64",
              "--heldout-permille", "150", "--eval-rows", "2", "--dtype", "float32", "--max-steps", "1",
              "--no-progress"]
    assert main(["dart", "--out", str(dart_out), "--draft-length", "2", *common]) == 0
    assert main(["eagle3", "--out", str(e3_out), "--ttt-steps", "2", "--compare-with", str(dart_out), *common]) == 0
    card = (e3_out / "README.md").read_text()
    assert "The DART head it is compared with (`dart`): 1 steps x 4 sequences" in card
    assert "comparable to the DART head" in card
    assert "comparable" not in (dart_out / "README.md").read_text()   # the DART run named no other run


def test_train_flags_are_validated(tiny, tmp_path, capsys):
    from dart_core.training.cli import main

    d, _, data, _ = tiny
    for over, flag in (({"ttt_steps": 0}, "--ttt-steps"), ({"gamma": 0.0}, "--gamma"),
                       ({"checkpoint_minutes": 30}, "--checkpoint-minutes"), ({"batch_seqs": 0}, "--batch-seqs"),
                       ({"compare_with": str(tmp_path / "nope")}, "--compare-with"),
                       ({"save_dtype": "int8"}, "--save-dtype")):
        with pytest.raises(TrainError, match=flag):
            train_eagle3(Eagle3TrainConfig(data=str(data), out=str(tmp_path / "x"), target=str(d), **over))
    assert main(["eagle3", "--target", str(d), "--data", str(tmp_path / "missing.jsonl"),
                 "--out", str(tmp_path / "y"), "--no-progress"]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eagle3", "--data", str(data), "--out", str(tmp_path / "z"), "--attention", "flex"])  # a DART flag


def test_budget_paragraph_claims_comparable_only_on_the_same_cpu():
    from dart_core.training.model_card import card_budget_lines
    dart_run = {"dir": "runs/dart", "method": "dart", "steps": 800, "batch_seqs": 8, "train_wall_s": 5689,
                "device": "cpu", "cpu": "Intel Xeon (native bf16)", "time_budget_min": 100, "sequences_seen": 6400}
    s = {"method": "eagle3", "steps": 200, "batch_seqs": 8, "sequences_seen": 1600, "train_wall_s": 5700.0,
         "device": "cpu", "cpu": "AMD EPYC (no native bf16)", "config": {"time_budget_min": 95},
         "compare_with": dart_run}
    text = "\n".join(card_budget_lines(s, "dart"))
    assert "comparable" not in text and "not equal in compute" in text
    assert "25% as many training sequences" in text and "AMD EPYC" in text and "Intel Xeon" in text
    s["cpu"] = dart_run["cpu"]
    assert "comparable to the DART head" in "\n".join(card_budget_lines(s, "dart"))


def test_init_head_and_init_layer_from_target(tiny, tmp_path, capsys):
    """--init-head fine-tunes an EAGLE-3 head (its weights and draft vocabulary), refusing a DART head or one
    made for another target; --init-layer-from-target starts a new head's layer from the target's last."""
    from dart_core.training.cli import main

    d, t, data, _ = tiny
    common = ["--target", str(d), "--data", str(data), "--batch-seqs", "4", "--ttt-steps", "2",
              "--heldout-permille", "150", "--eval-rows", "2", "--dtype", "float32", "--no-progress",
              "--max-steps", "1"]
    base = tmp_path / "base"
    assert main(["eagle3", "--out", str(base), "--draft-vocab-size", "64", "--lr", "2e-3",
                 "--init-layer-from-target", "--save-dtype", "float32"] + common) == 0
    h0 = load_eagle3_head(base, t)
    info = json.loads((base / "run_info.json").read_text())
    assert info["init"] == {"head": None, "layer_from_target": True, "lm_head_from_target": True}
    assert "decoder layer from the target's last layer" in (base / "README.md").read_text()
    fresh = new_eagle3_head_for_target(t, h0.draft_ids.cpu(), seed=0, init_layer_from_target=True)
    last = t.model.model.layers[-1]
    assert torch.equal(fresh.midlayer.mlp.up_proj.weight, last.mlp.up_proj.weight.float())

    tuned = tmp_path / "tuned"
    assert main(["eagle3", "--out", str(tuned), "--draft-vocab-size", "32", "--lr", "1e-12",
                 "--init-head", str(base)] + common) == 0
    h1 = load_eagle3_head(tuned, t)
    assert h1.config.draft_vocab_size == 64 and torch.equal(h1.d2t, h0.d2t)
    assert torch.allclose(h1.fc.weight, h0.fc.weight, atol=1e-2)
    info = json.loads((tuned / "run_info.json").read_text())
    assert info["init"]["head"] == str(base) and info["vocab"]["from"] == str(base)
    assert f"`--init-head {base}`" in (tuned / "README.md").read_text()

    other = make_tiny_model_dir(tmp_path, "llama", seed=1)
    capsys.readouterr()
    argv = ["eagle3", "--out", str(tmp_path / "x"), "--init-head", str(base)] + common
    argv[argv.index("--target") + 1] = str(other)
    assert main(argv) == 2
    assert f"--init-head {base} was made for another target" in capsys.readouterr().err
    from dart_core.models.heads.dart import new_head_for_target, save_dart_head
    dart_dir = save_dart_head(new_head_for_target(t, h0.draft_ids.cpu(), draft_length=2), tmp_path / "dart")
    assert main(["eagle3", "--out", str(tmp_path / "y"), "--init-head", str(dart_dir)] + common) == 2
    err = capsys.readouterr().err
    assert "is not a usable eagle3 head" in err and "unexpected key midlayer.mask_rep" in err
