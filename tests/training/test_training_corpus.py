"""Fine-tuning on new kinds of prompt: regenerate's per-category pick, ``train mix`` (joining corpora) and
``train eval`` (heads scored per kind on the trainers' held-out rows). Tiny random targets only."""
from __future__ import annotations

import gzip
import json

import pytest

from dart_core.training import cli
from dart_core.training.data import DataError, load_distill_rows, mix_corpora, split_rows
from dart_core.training.evaluate import evaluate_heads, format_scores, head_method, row_groups
from dart_core.training.regenerate import select_prompts
from dart_core.training.run_config import TrainError


# ---------------------------------------------------------------------------------------------- regenerate's pick
def _prompts(counts: dict[str, int]) -> list[dict]:
    rows = []
    for kind, n in counts.items():
        rows += [{"id": f"{kind}-{i}", "category": kind, "prompt": f"{kind} {i}"} for i in range(n)]
    return rows[::2] + rows[1::2]   # kinds interleaved, as a real file may hold them


def test_per_category_pick_caps_each_kind_keeps_file_order_and_grows_as_a_superset():
    rows = _prompts({"translation": 50, "summarization": 7, "passage_qa": 30})
    picked = select_prompts(rows, per_category=10, seed=3)
    kinds = [r["category"] for r in picked]
    assert kinds.count("translation") == 10 and kinds.count("passage_qa") == 10 and kinds.count("summarization") == 7
    order = {r["id"]: i for i, r in enumerate(rows)}
    assert [order[r["id"]] for r in picked] == sorted(order[r["id"]] for r in picked)
    assert picked == select_prompts(rows, per_category=10, seed=3)                  # seeded
    assert {r["id"] for r in picked} <= {r["id"] for r in select_prompts(rows, per_category=20, seed=3)}
    assert select_prompts(rows, per_category=0) == []
    assert len(select_prompts(rows, per_category=10, limit=4)) == 4
    assert select_prompts(rows) == rows


# ---------------------------------------------------------------------------------------------- mix
def _write(path, rows, gz=True):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def _rows(prefix: str, n: int, category=None) -> list[dict]:
    return [{"id": f"{prefix}{i}", "category": category, "prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6 + i % 3]}
            for i in range(n)]


def test_mix_samples_each_part_and_writes_the_same_bytes_twice(tmp_path):
    a = _write(tmp_path / "a.jsonl.gz", _rows("a", 40))
    b = _write(tmp_path / "b.jsonl", _rows("b", 9, "translation"), gz=False)
    out = tmp_path / "mixed.jsonl.gz"
    counts = mix_corpora([f"{a}=12", str(b)], out, seed=1)
    assert counts == [(str(a), 12), (str(b), 9)]
    rows = load_distill_rows(out)
    assert len(rows) == 21 and [r.id for r in rows[12:]] == [f"b{i}" for i in range(9)]
    ids_a = [int(r.id[1:]) for r in rows[:12]]
    assert ids_a == sorted(ids_a)                                                     # kept in file order
    first = out.read_bytes()
    mix_corpora([f"{a}=12", str(b)], out, seed=1)
    assert out.read_bytes() == first                   # no time or name in the gzip header: the cache finds it again
    mix_corpora([f"{a}=12", str(b)], out, seed=2)
    assert out.read_bytes() != first
    assert mix_corpora([f"{a}=0", f"{b}=100"], out) == [(str(a), 0), (str(b), 9)]   # none; more than there are
    assert len(load_distill_rows(out)) == 9


def test_mix_refuses_shared_ids_bad_counts_and_missing_files_and_leaves_no_output(tmp_path):
    a = _write(tmp_path / "a.jsonl.gz", _rows("a", 5))
    out = tmp_path / "m.jsonl.gz"
    with pytest.raises(DataError, match="is in both"):
        mix_corpora([str(a), str(a)], out)
    with pytest.raises(DataError, match="must be an integer"):
        mix_corpora([f"{a}=many"], out)
    with pytest.raises(DataError, match=">= 0"):
        mix_corpora([f"{a}=-1"], out)
    with pytest.raises(DataError, match="does not exist"):
        mix_corpora([str(tmp_path / "nope.jsonl.gz")], out)
    no_id = _write(tmp_path / "noid.jsonl.gz", [{"prompt_ids": [1], "response_ids": [2, 3]}])
    with pytest.raises(DataError, match="without an 'id'"):
        mix_corpora([str(no_id)], out)
    assert not out.exists() and not list(tmp_path.glob("*.tmp"))


def test_mix_cli(tmp_path, capsys):
    a = _write(tmp_path / "a.jsonl.gz", _rows("a", 5))
    out = tmp_path / "m.jsonl"
    assert cli.main(["mix", f"{a}=3", "--out", str(out)]) == 0
    assert "3 rows of" in capsys.readouterr().out and len(out.read_text().splitlines()) == 3
    assert cli.main(["mix", f"{a}=x", "--out", str(out)]) == 2
    assert "FILE=ROWS" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- eval
@pytest.fixture(scope="module")
def tiny_heads(tiny_app_models, tiny):
    target, model_dir, dart_dir, eagle3_dir = tiny_app_models
    _, _, data, rows = tiny
    return target, model_dir, dart_dir, eagle3_dir, data, rows


def _with_categories(data, rows, path):
    """The tiny corpus with half its rows 'translation', a quarter 'passage_qa', the rest no category."""
    kinds = ["translation", "translation", "passage_qa", None]
    return _write(path, [dict(r, category=kinds[i % 4]) for i, r in enumerate(rows)])


def test_row_groups_take_the_trainers_held_out_rows_by_kind(tiny_heads, tmp_path):
    *_, data, rows = tiny_heads
    corpus = _with_categories(data, rows, tmp_path / "c.jsonl.gz")
    groups = row_groups(corpus, 1000)
    assert sorted(groups) == ["alpaca", "passage_qa", "translation"]          # no category: the source
    assert [len(groups[k]) for k in ("translation", "passage_qa", "alpaca")] == [12, 6, 6]
    _, held = split_rows(load_distill_rows(corpus), 500)
    assert sorted(r.id for g in row_groups(corpus, 500).values() for r in g) == sorted(r.id for r in held)
    assert all(len(g) <= 2 for g in row_groups(corpus, 1000, max_rows=2).values())
    assert sorted(row_groups(corpus, 1000, kinds=["passage_qa", "alpaca"])) == ["alpaca", "passage_qa"]


def test_eval_scores_both_kinds_of_head_on_every_kind(tiny_heads, tmp_path):
    target, model_dir, dart_dir, eagle3_dir, data, rows = tiny_heads
    corpus = _with_categories(data, rows, tmp_path / "c.jsonl.gz")
    scores = evaluate_heads([str(dart_dir), str(eagle3_dir)], str(corpus), target=str(model_dir),
                            heldout_permille=1000, max_rows=3, features="none", dtype="float32", device="cpu")
    assert [(s.method, s.group) for s in scores] == [(m, k) for m in ("dart", "eagle3")
                                                     for k in ("alpaca", "passage_qa", "translation")]
    for s in scores:
        assert s.rows == 3 and s.hit1 and all(0.0 <= h <= 1.0 for h in s.hit1)
    table = format_scores(scores, positions=2)
    assert table.count("\n") == len(scores) + 1 and "| t+1 | t+2 |" in table


def test_eval_errors_name_the_flag(tiny_heads, tmp_path, capsys):
    target, model_dir, dart_dir, eagle3_dir, data, rows = tiny_heads
    assert head_method(dart_dir) == "dart" and head_method(eagle3_dir) == "eagle3"
    with pytest.raises(TrainError, match="no config.json"):
        head_method(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(TrainError, match="neither a DART head"):
        head_method(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TrainError, match="not a JSON object"):
        head_method(tmp_path)
    with pytest.raises(TrainError, match="heldout-permille"):
        evaluate_heads([str(dart_dir)], str(data), target=str(model_dir), heldout_permille=1001)
    with pytest.raises(TrainError, match="no held-out rows"):
        evaluate_heads([str(dart_dir)], str(data), target=str(model_dir), heldout_permille=0, features="none",
                       dtype="float32", device="cpu")
    assert cli.main(["eval", "--head", str(tmp_path), "--data", str(data), "--target", str(model_dir)]) == 2
    assert "not a JSON object" in capsys.readouterr().err
    assert cli.main(["eval", "--head", str(dart_dir), "--data", str(tmp_path / "none.jsonl"),
                     "--target", str(model_dir), "--dtype", "float32", "--device", "cpu"]) == 2
    assert "does not exist" in capsys.readouterr().err
