"""Training on several ranks: ``torchrun --nproc-per-node 2 -m dart_core.train ...`` on the CPU (gloo).

Two ranks take the steps one rank would (same global batch: the weights and the log equal a one-rank run's
within float tolerance, the order of the gradient sums being the only difference), a run resumes from its
checkpoint at another world size (2 -> 1 after a rank was killed, 1 -> 2 after Ctrl-C), and the feature cache
is built by the ranks in shards that one reader opens afterwards, a killed shard resuming at another world size.
Each torchrun is a subprocess (``python -m torch.distributed.run --standalone``, which takes a free port) with
a timeout and one thread per rank. Tiny random targets only."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch


pytestmark = pytest.mark.skipif(not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
                                reason="torch.distributed with gloo is needed")

TESTS = Path(__file__).resolve().parents[1]   # tests/, where rank_runner.py is
REPO = TESTS.parent


def torchrun(argv: list[str], *, kill: tuple[int, str, int] | None = None, timeout: float = 150) -> tuple[int, str]:
    """``torchrun --nproc-per-node 2`` of ``python -m dart_core.train argv`` (tests/rank_runner.py, which kills
    rank ``kill[0]`` at call ``kill[2]`` of ``kill[1]`` when asked); returns (exit code, output). One takes about
    25 s on a shared 2-core machine; the timeout is for a hang (a rank waiting on a collective forever)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if kill is not None:
        env.update(KILL_RANK=str(kill[0]), KILL_PATCH=kill[1], KILL_AT_CALL=str(kill[2]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(TESTS / "rank_runner.py"), *argv]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # torchrun and its ranks
        out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish in {timeout} s:\n{out[-4000:]}")
    return proc.returncode, out


def train_args(method: str, tiny, out: Path, steps: int = 4) -> list[str]:
    d, _, data, _ = tiny
    own = ["--draft-length", "3"] if method == "dart" else ["--ttt-steps", "3"]
    # float32 throughout and float32 weights written: the comparisons are float tolerance, not bf16 rounding.
    return [method, "--target", str(d), "--data", str(data), "--out", str(out), *own, "--batch-seqs", "4",
            "--draft-vocab-size", "64", "--heldout-permille", "150", "--eval-rows", "2", "--dtype", "float32",
            "--no-autocast", "--save-dtype", "float32", "--features", "none", "--no-progress",
            "--max-steps", str(steps), "--checkpoint-minutes", "0.0001"]   # a checkpoint after every step


@pytest.fixture(scope="module")
def one_rank(tiny, tmp_path_factory):
    """The one-rank runs every multi-rank run is held against, by method (made when first asked for)."""
    from dart_core.training.cli import main

    runs: dict[str, Path] = {}

    def get(method: str) -> Path:
        if method not in runs:
            out = tmp_path_factory.mktemp(f"one-{method}") / "run"
            assert main(train_args(method, tiny, out)) == 0
            runs[method] = out
        return runs[method]
    return get


def log(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines()]


def assert_same_run(ref: Path, got: Path) -> None:
    """The same steps: every logged step's figures (summed over the ranks) and the final weights agree."""
    from safetensors.torch import load_file

    a, b = log(ref), log(got)
    assert [x["step"] for x in b] == [x["step"] for x in a]
    for x, y in zip(a, b):
        assert (x["lr"], x["seqs"], x["tokens"]) == (y["lr"], y["seqs"], y["tokens"]), (x, y)
        for k in ("loss", "grad_norm"):
            assert y[k] == pytest.approx(x[k], rel=1e-4), (k, x, y)
        assert y["hit@1"] == pytest.approx(x["hit@1"], abs=1e-4)
    wa, wb = load_file(str(ref / "model.safetensors")), load_file(str(got / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert wb[k].dtype == wa[k].dtype
        # Reordered float32 sums through a few AdamW steps: observed differences ~6e-7 on weights ~0.1, while
        # each step moves a weight by about the learning rate (5e-4, the gradients being nonzero).
        torch.testing.assert_close(wb[k], wa[k], atol=2e-5, rtol=0, msg=k)
    assert all(x["grad_norm"] > 0 for x in a) and a[0]["lr"] >= 1e-4
    assert json.loads((got / "training_summary.json").read_text())["steps"] == len(a)


def test_two_ranks_take_the_steps_of_one_rank(tiny, tmp_path, one_rank):
    out = tmp_path / "two"
    rc, text = torchrun(train_args("eagle3", tiny, out))
    assert rc == 0, text[-4000:]
    assert json.loads((out / "run_info.json").read_text())["world_size"] == 2
    assert_same_run(one_rank("eagle3"), out)


def test_a_killed_rank_leaves_a_run_that_resumes_on_one_rank(tiny, tmp_path, one_rank):
    """Rank 1 is SIGKILLed in step 3: rank 0's collective fails, it checkpoints step 2 and says so; the run
    resumes on one rank and ends where the uninterrupted one-rank run ends."""
    from dart_core.training.checkpoint import load_trainer_state
    from dart_core.training.cli import main

    out = tmp_path / "killed"
    # rank 1 takes 2 of the 4 sequences per step: its 5th loss is step 3's first
    rc, text = torchrun(train_args("dart", tiny, out),
                                 kill=(1, "dart_core.training.dart_trainer:dart_loss", 5))
    assert rc != 0 and "another rank stopped; the checkpoint holds step 2" in text, text[-4000:]
    state = load_trainer_state(out / "checkpoint" / "trainer_state.pt")
    assert state["step"] == 2 and not state["finished"] and state["world_size"] == 2
    assert [x["step"] for x in log(out)] == [1, 2] and not (out / "model.safetensors").exists()
    assert main(train_args("dart", tiny, out) + ["--resume"]) == 0
    assert_same_run(one_rank("dart"), out)


def test_a_one_rank_run_resumes_on_two_ranks(tiny, tmp_path, one_rank, monkeypatch):
    import dart_core.training.dart_trainer as dt
    from dart_core.training.cli import main

    out = tmp_path / "grown"
    real, calls = dt.dart_loss, {"n": 0}

    def ctrl_c_in_step_3(*a, **k):
        calls["n"] += 1
        if calls["n"] == 9:                 # step 3's first sequence (4 per step on one rank)
            raise KeyboardInterrupt
        return real(*a, **k)
    monkeypatch.setattr(dt, "dart_loss", ctrl_c_in_step_3)
    assert main(train_args("dart", tiny, out)) == 130
    monkeypatch.setattr(dt, "dart_loss", real)
    rc, text = torchrun(train_args("dart", tiny, out) + ["--resume"])
    assert rc == 0, text[-4000:]
    assert "resuming a 1-rank run on 2 rank(s)" in text
    assert_same_run(one_rank("dart"), out)


def test_sigterm_stops_at_the_next_sequence_with_a_checkpoint(tiny, tmp_path, one_rank, monkeypatch):
    """SIGTERM (a scheduler; torchrun stopping the ranks) only sets a flag: the step under way is dropped at its
    next sequence, never half taken, and the run resumes to the uninterrupted one's weights."""
    import dart_core.training.dart_trainer as dt
    from dart_core.training.checkpoint import load_trainer_state
    from dart_core.training.cli import main

    out = tmp_path / "term"
    real, calls = dt.dart_loss, {"n": 0}

    def term_in_step_3(*a, **k):
        calls["n"] += 1
        if calls["n"] == 9:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)
    monkeypatch.setattr(dt, "dart_loss", term_in_step_3)
    assert main(train_args("dart", tiny, out)) == 130
    assert calls["n"] == 9, "the run stops before the next sequence's loss"
    assert load_trainer_state(out / "checkpoint" / "trainer_state.pt")["step"] == 2
    monkeypatch.setattr(dt, "dart_loss", real)
    assert main(train_args("dart", tiny, out) + ["--resume"]) == 0
    assert_same_run(one_rank("dart"), out)


def test_a_batch_smaller_than_the_ranks_is_refused(tiny, tmp_path, monkeypatch):
    from dart_core.training.dart_trainer import DartTrainConfig, TrainError, train_dart

    d, _, data, _ = tiny
    monkeypatch.setenv("WORLD_SIZE", "2")    # refused before the process group is joined
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(TrainError, match="--batch-seqs 1 is the global batch and torchrun started 2 ranks"):
        train_dart(DartTrainConfig(data=str(data), out=str(tmp_path / "r"), target=str(d), batch_seqs=1))


# ---------------------------------------------------------------------------------------------- the feature cache
def features_args(tiny, cache: Path) -> list[str]:
    d, _, data, _ = tiny
    return ["features", "--target", str(d), "--data", str(data), "--features", str(cache), "--dtype", "float32",
            "--chunk-rows", "4", "--no-progress"]


@pytest.fixture(scope="module")
def one_rank_cache(tiny, tmp_path_factory):
    from dart_core.training import feature_cache as fc

    _, t, data, _ = tiny
    return fc.build_feature_cache(t, data, tmp_path_factory.mktemp("fc1") / "cache", chunk_rows=4, progress=False)


def assert_same_cache(ref: Path, got: Path) -> None:
    from dart_core.training import feature_cache as fc

    for name in fc.FILES:
        assert (got / f"{name}.bin").read_bytes() == (ref / f"{name}.bin").read_bytes(), name
    a, b = (json.loads((p / "progress.json").read_text()) for p in (ref, got))
    assert [c["sha256"] for c in b["chunks"]] == [c["sha256"] for c in a["chunks"]]
    assert b["complete"] and b["kept_mass_sum"] == pytest.approx(a["kept_mass_sum"], rel=1e-6)
    assert not list(got.glob("progress.rank*.json")), "the ranks' records are merged into progress.json"


def test_the_ranks_build_the_feature_cache_in_shards(tiny, tmp_path, one_rank_cache):
    from dart_core.training import feature_cache as fc

    _, t, data, rows = tiny
    cache = tmp_path / "cache"
    rc, text = torchrun(features_args(tiny, cache))
    assert rc == 0, text[-4000:]
    assert_same_cache(one_rank_cache, cache)
    # one reader afterwards: the cache the trainers open, equal to the one-rank cache's features
    row = fc.load_distill_rows(data)[5]
    draft = torch.arange(0, t.vocab_size, 3)
    got = fc.FeatureCache(cache, t, data).features(row, draft)
    ref = fc.FeatureCache(one_rank_cache, t, data).features(row, draft)
    assert torch.equal(got.aux, ref.aux) and torch.equal(got.logits, ref.logits)


def test_a_killed_feature_rank_resumes_on_one_rank(tiny, tmp_path, one_rank_cache):
    """Rank 1 is SIGKILLed in its second chunk: its first chunk stays recorded in its own progress file, the
    build is incomplete (and refused by readers), and one rank finishes it to the same bytes."""
    from dart_core.training import feature_cache as fc

    _, t, data, _ = tiny
    cache = tmp_path / "cache"
    # 4 rows a chunk; rank 1 computes chunks 1, 3, 5: its 5th row is the first of chunk 3
    rc, text = torchrun(features_args(tiny, cache), kill=(1, "dart_core.training.feature_cache:target_states", 5))
    assert rc != 0
    st = fc.cache_status(cache)
    assert not st.complete and 4 <= st.rows_done < st.rows
    rank1 = json.loads((cache / "progress.rank1.json").read_text())
    assert [c["rows"] for c in rank1["chunks"]] == [[4, 8]]
    with pytest.raises(fc.FeatureCacheError, match="incomplete"):
        fc.FeatureCache(cache, t, data)
    fc.build_feature_cache(t, data, cache, chunk_rows=4, progress=False)
    assert_same_cache(one_rank_cache, cache)
