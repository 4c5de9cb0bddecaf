"""The benchmark CLI, run in-process on a tiny random Llama: report fields, greedy identity, bad input."""
from __future__ import annotations

import argparse
import json

import pytest
import torch

from dart_core.bench import cli as bench
from dart_core.bench import runners
from dart_core.bench.questions import (QUESTION_SETS, BenchInputError, load_question_sets, load_questions,
                                       resolve_question_set, resolve_question_source)
from dart_core.bench.runners import AnswerRecord
from dart_core.bench.summary import first_divergence, summarize
from dart_core.config import GenerationConfig
from dart_core.engine.trace import STAGES
from tiny_models import make_tiny_model_dir

QUESTIONS = [
    {"question_id": "t/1", "category": "writing",
     "turns": ["Write a short poem about the sea.", "Now make every line rhyme."]},
    {"question_id": 2, "category": "coding", "turns": ["def add(a, b): return a + b. Explain add."]},
    {"question_id": "t/3", "category": "writing",
     "turns": ["The quick brown fox jumps over the lazy dog. The quick brown fox", "Again, shorter."]},
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # A narrower init than the default makes the random model repeat itself, so prompt lookup's
    # drafts get accepted (tau > 1) and identity is checked on multi-token steps too.
    return make_tiny_model_dir(tmp_path_factory.mktemp("bench"), "llama", initializer_range=0.1)


@pytest.fixture()
def questions_file(tmp_path):
    p = tmp_path / "questions.jsonl"
    p.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    return p


def _run(argv, capsys):
    code = bench.main([str(a) for a in argv])
    assert code == 0
    return capsys.readouterr()


def _common(tiny_dir, questions_file):
    # One thread: the test machine is shared, and oversubscribed OpenMP threads crawl.
    return ["--questions", questions_file, "--base-model-name-or-path", tiny_dir, "--dtype", "float32",
            "--device", "cpu", "--threads", "1", "--bandwidth-mib", "8", "--no-progress",
            "--max-busy", "1"]   # the test machine is shared: the busy check has its own test


def test_bench_greedy_report(tiny_dir, questions_file, tmp_path, capsys):
    out_json, out_md = tmp_path / "r" / "bench.json", tmp_path / "bench.md"
    # Fixed trees: prompt lookup drafts on every step. Under --tree auto the sizing may measure that a plain step
    # pays more on this machine and never draft (a CI run did: tau 1.0), which is right there but not what this
    # test checks.
    res = _run(_common(tiny_dir, questions_file) + [
        "--methods", "hf_generate,vanilla,prompt_lookup", "--turns", "all", "--max-new-tokens", "12",
        "--tree", "fixed", "--json", out_json, "--markdown", out_md], capsys)
    report = json.loads(out_json.read_text())

    assert report["settings"]["n_questions"] == 3 and report["settings"]["greedy"] is True
    m = report["machine"]
    for key in ("cpu_model", "torch_threads", "dtype", "device", "load_average", "torch", "transformers"):
        assert key in m, key
    assert m["torch_threads"] == 1 and m["dtype"] == "float32" and m["device"] == "cpu"
    assert m["memory_bandwidth_gbs"]["read"] > 0 and m["memory_bandwidth_gbs"]["copy"] > 0
    assert report["target"]["weight_bytes"] > 0

    methods = report["methods"]
    assert list(methods) == ["hf_generate", "vanilla", "prompt_lookup"]
    n_answers = sum(len(q["turns"]) for q in QUESTIONS)  # --turns all
    for name, r in methods.items():
        assert r["answers"] == n_answers and len(report["answers"][name]) == n_answers
        assert r["tokens_per_s"] > 0 and r["speedup_vs_vanilla"] > 0
        assert r["bandwidth_gbs"] > 0 and r["bandwidth_fraction"] > 0
        assert set(r["stage_ms_per_step"]) == set(STAGES)
        assert set(r["per_category"]) == {"writing", "coding"}
        # fp32 greedy: every method's answers are token-for-token vanilla's
        assert r["identical_to_vanilla"] is True, r["divergences"]
        assert r["n_divergent"] == 0 and r["divergences"] == []
    assert methods["vanilla"]["speedup_vs_vanilla"] == pytest.approx(1.0)
    assert methods["hf_generate"]["tau"] is None and methods["hf_generate"]["stage_ms_per_step"]["verify"] is None
    for name in ("vanilla", "prompt_lookup"):
        assert methods[name]["tau"] >= 1.0
        assert methods[name]["stage_ms_per_step"]["verify"] > 0
    assert methods["vanilla"]["tau"] == pytest.approx(1.0)
    assert methods["prompt_lookup"]["tau"] > 1.0  # drafts were accepted, and answers still equal vanilla's
    # A later turn's prompt holds the method's own first answer, so it is longer than the first turn's.
    turns = [a for a in report["answers"]["vanilla"] if a["question_id"] == "t/1"]
    assert [a["turn"] for a in turns] == [1, 2] and turns[1]["prompt_tokens"] > turns[0]["prompt_tokens"]
    assert all(a["new_tokens"] == len(a["tokens"]) <= 12 for a in report["answers"]["hf_generate"])

    # The Markdown table: on stdout, one row per method, and written with --markdown.
    assert "| method | tok/s | speedup | decode-only speedup | TTFT ms | tau |" in res.out
    for name in methods:
        assert f"| {name} |" in res.out
    assert out_md.read_text() == res.out
    assert "Traceback" not in res.err


def test_bench_sampling_without_vanilla(tiny_dir, questions_file, tmp_path, capsys):
    out_json = tmp_path / "s.json"
    _run(_common(tiny_dir, questions_file) + [
        "--methods", "prompt_lookup,hf_generate", "--limit", "1", "--max-new-tokens", "6",
        "--temperature", "0.8", "--top-k", "20", "--seed", "3", "--json", out_json], capsys)
    report = json.loads(out_json.read_text())
    assert report["settings"]["n_questions"] == 1 and report["settings"]["greedy"] is False
    for r in report["methods"].values():
        assert r["speedup_vs_vanilla"] is None       # no vanilla in --methods
        assert r["identical_to_vanilla"] is None     # only defined for greedy
        assert r["new_tokens"] > 0
    assert report["methods"]["prompt_lookup"]["tau"] >= 1.0


def test_bench_max_length_edge_identical(tiny_dir, questions_file, tmp_path, capsys):
    """Answers cut by max_length (prompt + answer) stop at the same token in every method."""
    out_json = tmp_path / "m.json"
    _run(_common(tiny_dir, questions_file) + [
        "--methods", "hf_generate,vanilla,prompt_lookup", "--max-new-tokens", "30", "--max-length", "110",
        "--json", out_json], capsys)
    report = json.loads(out_json.read_text())
    for name, r in report["methods"].items():
        assert r["identical_to_vanilla"] is True, (name, r["divergences"])
        assert r["stop_reasons"].get("max_length", 0) >= 1, (name, r["stop_reasons"])
        for a in report["answers"][name]:
            assert a["prompt_tokens"] + a["new_tokens"] <= 110


# ------------------------------------------------------------------------------------------- bad input
def _fails(argv, capsys, *needles):
    with pytest.raises(SystemExit) as exc:
        bench.main([str(a) for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("python -m dart_core.bench: error:"), err
    for needle in needles:
        assert needle in last, (needle, last)
    return last


def test_bad_json_line_names_file_and_line(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(QUESTIONS[0]) + "\n" + '{"question_id": 5, "category": "x", "turns": ["hi"]\n')
    _fails(["--questions", p], capsys, f"{p}:2", "not valid JSON")


def test_missing_field_names_file_line_and_field(tmp_path, capsys):
    p = tmp_path / "missing.jsonl"
    p.write_text("\n" + json.dumps({"question_id": 1, "turns": ["hi"]}) + "\n")
    _fails(["--questions", p], capsys, f"{p}:2", "category")


@pytest.mark.parametrize("row, needle", [
    ({"question_id": 1, "category": "x", "turns": []}, "turns"),
    ({"question_id": 1, "category": "x", "turns": "hi"}, "turns"),
    ({"question_id": [1], "category": "x", "turns": ["hi"]}, "question_id"),
    (["not", "an", "object"], "JSON object"),
])
def test_bad_rows(tmp_path, row, needle):
    p = tmp_path / "q.jsonl"
    p.write_text(json.dumps(row) + "\n")
    with pytest.raises(BenchInputError, match=needle):
        load_questions(p)


def test_duplicate_ids_and_empty_file(tmp_path):
    p = tmp_path / "dup.jsonl"
    p.write_text(json.dumps(QUESTIONS[0]) + "\n" + json.dumps(QUESTIONS[0]) + "\n")
    with pytest.raises(BenchInputError, match="repeats line 1"):
        load_questions(p)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(BenchInputError, match="no questions"):
        load_questions(empty)


def test_limit_reads_only_k_questions(questions_file):
    qs = load_questions(questions_file, limit=2)
    assert [q.question_id for q in qs] == ["t/1", "2"]   # integer ids become strings
    assert qs[0].turns == QUESTIONS[0]["turns"]


def test_unknown_method_lists_valid_ones(questions_file, capsys):
    last = _fails(["--questions", questions_file, "--methods", "vanilla,medusa"], capsys, "medusa")
    for name in runners.METHODS:
        assert name in last


@pytest.mark.parametrize("argv, needle", [
    (["--limit", "0"], "--limit"),
    (["--limit", "-3"], "--limit"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--temperature", "-1"], "--temperature"),
    (["--methods", "vanilla,vanilla"], "more than once"),
    (["--template-name", "nope"], "--template-name"),
    (["--base-model-name-or-path", "/no/such/model"], "/no/such/model"),
])
def test_bad_flags(questions_file, capsys, argv, needle):
    _fails(["--questions", questions_file, "--bandwidth-mib", "0", "--max-busy", "1", *argv], capsys, needle)


def test_missing_question_file(tmp_path, capsys):
    _fails(["--questions", tmp_path / "nope.jsonl"], capsys, "nope.jsonl", "does not exist")


# ------------------------------------------------------------------------------------------- summaries
def _rec(qid, turn, tokens, category="c", steps=None):
    steps = len(tokens) - 1 if steps is None else steps
    return AnswerRecord(question_id=qid, category=category, turn=turn, prompt_tokens=5, new_tokens=len(tokens),
                        wall_s=0.5, steps=steps, target_forwards=steps + 1,
                        stage_s={s: 0.001 * steps for s in STAGES}, stop_reason="max_new_tokens", text="",
                        tokens=list(tokens))


class _Runner:
    def __init__(self, speculative):
        self.speculative = speculative


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 4], [1, 2, 3]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2   # one answer stopped early (e.g. EOS)
    assert first_divergence([], [7]) == 0


def test_summarize_reports_divergences_and_tau():
    records = {
        "vanilla": [_rec("a", 1, [1, 2, 3, 4]), _rec("a", 2, [5, 6]), _rec("b", 1, [7, 8, 9], category="d")],
        # 4 tokens in 2 verify steps (3 committed after the prefill token) -> tau 1.5 for "a"/1
        "fast": [_rec("a", 1, [1, 2, 3, 4], steps=2), _rec("a", 2, [5, 0]), _rec("b", 1, [7, 8, 9], category="d")],
    }
    runners = {"vanilla": _Runner(True), "fast": _Runner(True)}
    s = summarize(records, runners, weight_bytes=10**9, machine_bandwidth_gbs=10.0, greedy=True)
    assert s["vanilla"]["identical_to_vanilla"] is True
    fast = s["fast"]
    assert fast["identical_to_vanilla"] is False and fast["n_divergent"] == 1
    assert fast["divergences"] == [{"question_id": "a", "turn": 2, "position": 1, "token": 0, "vanilla_token": 6}]
    assert fast["tau"] == pytest.approx((3 + 1 + 2) / (2 + 1 + 2))
    assert fast["stage_ms_per_step"]["verify"] == pytest.approx(1.0)
    # weight bytes x forwards / s: 8 forwards in 1.5 s of 1 GB each
    assert fast["bandwidth_gbs"] == pytest.approx(8 / 1.5) and fast["bandwidth_fraction"] == pytest.approx(8 / 15)
    assert fast["per_category"]["d"]["speedup_vs_vanilla"] == pytest.approx(1.0)
    assert fast["per_category"]["d"]["tau"] == pytest.approx(1.0)
    # sampling: identity is not defined
    s = summarize(records, runners, weight_bytes=1, machine_bandwidth_gbs=None, greedy=False)
    assert s["fast"]["identical_to_vanilla"] is None and s["fast"]["bandwidth_fraction"] is None


def test_registry_rejects_duplicates_and_lists_methods():
    assert {"hf_generate", "vanilla", "prompt_lookup"} <= set(runners.METHODS)
    with pytest.raises(ValueError, match="twice"):
        runners.register_method(runners.MethodSpec("vanilla", lambda target, args: None))


# ------------------------------------------------------------------------------------------- the report
@pytest.fixture()
def second_set(tmp_path):
    p = tmp_path / "code_set.jsonl"
    p.write_text(json.dumps({"question_id": "c/1", "category": "code",
                             "turns": ["def f(x): return x + 1. def g(x): return f(x) + 1. Explain g."]}) + "\n")
    return p


def test_report_dir_writes_json_markdown_and_offline_html(tiny_dir, questions_file, second_set, tmp_path, capsys):
    sweep = tmp_path / "tune.json"
    sweep.write_text(json.dumps({"limit": 2, "max_new_tokens": 8, "vanilla": {"tokens_per_s": 10.0}, "sweep": [
        {"arm": "dart@8", "method": "dart", "nodes": 9, "budget": 8, "tau": 1.8, "speedup": 1.2},
        {"arm": "dart@30", "method": "dart", "nodes": 31, "budget": 30, "tau": 2.0, "speedup": 1.1},
        {"arm": "eagle3@16/4/4", "method": "eagle3", "nodes": 16, "depth": 4, "top_k": 4, "tau": 1.7,
         "speedup": 1.0}]}))
    out = tmp_path / "rep"
    res = _run(_common(tiny_dir, questions_file) + [
        "--questions", questions_file, second_set, "--methods", "vanilla,prompt_lookup", "--max-new-tokens", "10",
        "--report", out, "--sweep", sweep], capsys)
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["n_questions"] == 4 and report["busy_warning"] is None
    pl = report["methods"]["prompt_lookup"]
    assert set(pl["per_set"]) == {"questions", "code_set"}
    assert all(g["speedup_vs_vanilla"] > 0 for g in pl["per_set"].values())
    # the histogram counts every verify step, and its mean is tau
    hist = {int(k): v for k, v in pl["accept_length_hist"].items()}
    assert sum(hist.values()) == pl["steps"]
    assert sum(k * v for k, v in hist.items()) / pl["steps"] == pytest.approx(pl["tau"])
    assert (out / "report.md").read_text() == res.out and "Per question set" in res.out
    page = (out / "report.html").read_text()
    for title in ("Speedup over vanilla per question set", "τ: tokens committed per target forward",
                  "Time per speculative step, by stage", "Acceptance length per step", "τ against tree size"):
        assert title in page, title
    # standalone and offline: plotly.js is inlined once, nothing is fetched from elsewhere
    # (plotly.js itself names its CDN for maps and MathJax, which these charts never load)
    assert "<script src=" not in page and "<link" not in page
    assert page.count("plotly.js v") >= 1


def test_ids_must_be_unique_across_question_files(questions_file, tmp_path, capsys):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(QUESTIONS[0]) + "\n")
    _fails(["--questions", questions_file, other], capsys, "t/1", "unique across")


def test_bad_sweep_file_names_it(questions_file, tmp_path, capsys):
    bad = tmp_path / "tune.json"
    bad.write_text(json.dumps({"rows": []}))
    _fails(["--questions", questions_file, "--sweep", bad], capsys, str(bad), "tune_tree.py")
    _fails(["--questions", questions_file, "--sweep", tmp_path / "none.json"], capsys, "does not exist")


def test_busy_machine_refuses_unless_allowed(tiny_dir, questions_file, tmp_path, capsys, monkeypatch):
    from dart_core import hardware as machine
    monkeypatch.setattr(machine, "cpu_busy_fraction", lambda interval_s=2.0: 0.9)
    argv = _common(tiny_dir, questions_file)
    del argv[argv.index("--max-busy"):argv.index("--max-busy") + 2]   # the default threshold, so the check runs
    with pytest.raises(SystemExit) as exc:
        bench.main([str(a) for a in argv + ["--methods", "vanilla"]])
    assert exc.value.code == 3
    err = capsys.readouterr().err
    assert "machine is busy: 90%" in err and "--allow-busy" in err and "Traceback" not in err
    out = tmp_path / "busy.json"
    res = _run(argv + ["--methods", "vanilla", "--limit", "1", "--max-new-tokens", "4", "--allow-busy",
                       "--json", out], capsys)
    assert "machine is busy" in json.loads(out.read_text())["busy_warning"]
    assert "**Warning: the machine is busy" in res.out
    monkeypatch.setattr(machine, "cpu_busy_fraction", lambda interval_s=2.0: 0.05)
    assert machine.busy_machine_reason(0.2) is None


def _tune_tree():
    return _bench_script("tune_tree")


def test_tune_tree_arm_parsing():
    import argparse

    tune_tree = _tune_tree()
    assert tune_tree.parse_eagle3_trees("60/7/10, 16/4/4") == [(60, 7, 10), (16, 4, 4)]
    assert tune_tree.parse_methods("dart,eagle3") == ["dart", "eagle3"]
    for bad, needle in (("60/7", "total_token/depth/top_k"), ("a/b/c", "60/7/10"), ("", "empty")):
        with pytest.raises(argparse.ArgumentTypeError, match=needle):
            tune_tree.parse_eagle3_trees(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="dart and/or eagle3"):
        tune_tree.parse_methods("dart,medusa")
    # the default sweep: small trees (the CPU's range), an auto arm per method unless --no-auto
    args = tune_tree.build_parser().parse_args([])
    assert args.budget == [1, 2, 3, 4, 6, 8, 12, 16] and args.auto is True
    assert args.eagle3_trees == [(2, 1, 1), (3, 2, 1), (4, 2, 2), (6, 3, 2), (8, 3, 3), (12, 4, 4)]
    assert tune_tree.build_parser().parse_args(["--no-auto"]).auto is False



def _bench_script(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tree_cost_times_each_lm_head_setting(tiny_dir, tmp_path, capsys):
    """benchmarks/tree_cost.py: one arm per --lm-head-first-rows value (timed interleaved, the engine's value
    restored after), the LM head alone by rows, and clear errors for bad values."""
    from dart_core.models import target as target_module

    tree_cost = _bench_script("tree_cost")
    out = tmp_path / "cost.json"
    default = target_module.LM_HEAD_FIRST_ROWS
    assert tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--dtypes", "float32", "--nodes", "3,5",
                           "--prefix", "4", "--reps", "1", "--warmup", "0", "--lm-head-first-rows", "all,2",
                           "--lm-head", "--json", str(out)]) == 0
    assert target_module.LM_HEAD_FIRST_ROWS == default
    res = json.loads(out.read_text())
    assert [r["lm_head_first_rows"] for r in res["results"]] == ["all", 2]
    assert all(set(r["trees"]) == {"3", "5"} for r in res["results"])
    assert set(res["lm_head_ms"]["float32"]) == {str(r) for r in tree_cost.LM_HEAD_ROWS}
    assert "| all | 5 |" in capsys.readouterr().out
    for bad, needle in (("0", ">= 1"), ("four", "integers and 'all'")):
        with pytest.raises(SystemExit):
            tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--lm-head-first-rows", bad])
        assert needle in capsys.readouterr().err


def test_tree_cost_prefill_times_each_many_rows_arm(tiny_dir, tmp_path, capsys):
    """benchmarks/tree_cost.py --prefill --many-rows: one interleaved arm per threshold (off = never widen once), each
    with its speed against the first, the kernel's threshold restored after; a bad arm is a usage error."""
    from dart_core import _native

    tree_cost = _bench_script("tree_cost")
    out = tmp_path / "prefill.json"
    before = _native._small_gemm_many_rows()
    assert tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--dtypes", "float32", "--nodes", "3",
                           "--prefix", "4", "--reps", "1", "--warmup", "0", "--prefill", "40", "--prefill-reps", "1",
                           "--many-rows", "off,12", "--json", str(out)]) == 0
    assert _native._small_gemm_many_rows() == before
    arms = json.loads(out.read_text())["prefill"]
    assert [a["backend"] for a in arms] == ["native (many rows: off)", "native (many rows: 12)"]
    assert arms[0]["pair_ratio_to_first"] == 1.0 and all(a["median_s"] > 0 for a in arms)
    assert "native (many rows: 12)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--prefill", "8", "--many-rows", "0"])
    assert "row count >= 1 or off" in capsys.readouterr().err


def test_tree_cost_sweep_rows_times_the_gemm_alone(tiny_dir, tmp_path, capsys):
    """benchmarks/tree_cost.py --sweep-rows: the small GEMM alone at each row count (one row always), from memory over
    every matrix and in cache over the first ones within --cache-mib, beside the read; bad row counts refused."""
    tree_cost = _bench_script("tree_cost")
    out = tmp_path / "sweeps.json"
    assert tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--dtypes", "float32", "--sweep-rows", "3,2",
                           "--reps", "2", "--warmup", "0", "--read-mib", "8", "--cache-mib", "1",
                           "--json", str(out)]) == 0
    (r,) = json.loads(out.read_text())["sweeps"]
    assert list(r["rows"]) == ["1", "2", "3"]
    assert r["read_gbs"] > 0 and 0 < r["warm_mb"] <= r["cold_mb"]
    assert r["rows"]["1"]["cold_vs_one"] == 1.0 and r["rows"]["1"]["warm_vs_one"] == 1.0
    for t in r["rows"].values():
        assert t["cold_ms"] > 0 and t["cold_gbs"] > 0 and t["warm_gbs"] > 0
    printed = capsys.readouterr().out
    assert "| float32 |" in printed and "in cache" in printed
    for bad in ("0,3", "1,x"):
        with pytest.raises(SystemExit):
            tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--sweep-rows", bad])
    assert "--sweep-rows" in capsys.readouterr().err


def test_tree_cost_bandwidth_reports_every_path(tiny_dir, tmp_path, capsys):
    """benchmarks/tree_cost.py --bandwidth: per small-GEMM path, with the one-row kernel's prefetch on and off (the
    load-time choice marked), the read bandwidth, the one-row GEMV over the decoder weights and the one-token step,
    in GB/s and as shares of the read; the forced path and each path's chosen prefetch are restored."""
    from dart_core import _native
    from dart_core.models import gemv_prefetch

    tree_cost = _bench_script("tree_cost")
    out = tmp_path / "bw.json"
    before = _native.small_gemm_path()
    paths = list(_native.small_gemm_paths())
    assert tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--dtypes", "float32", "--bandwidth",
                           "--paths", ",".join(paths), "--prefix", "4", "--reps", "2", "--warmup", "0",
                           "--read-mib", "8", "--before", "--json", str(out)]) == 0
    assert _native.small_gemm_path() == before
    res = json.loads(out.read_text())
    now = [r for r in res["bandwidth"] if not r["before"]]
    assert [(r["gemm_path"], r["gemv_prefetch"]) for r in now] == [(p, on) for p in paths for on in (True, False)]
    for p in paths:   # one arm per path is the choice, and the kernel keeps it afterwards
        picked = [r["gemv_prefetch"] for r in now if r["gemm_path"] == p and r["gemv_prefetch_chosen"]]
        assert picked == [gemv_prefetch.chosen(p).on] == [_native.small_gemm_gemv_prefetch(p)]
    assert [r["gemm_path"] for r in res["bandwidth"] if r["before"]] == [p for p in paths if p not in ("amx", "avx512bf16")]
    assert all(r["gemv_prefetch"] and not r["gemv_prefetch_chosen"] for r in res["bandwidth"] if r["before"])
    assert res["machine"]["gemm_path"] == before and res["machine"]["gemm_paths"] == paths
    for r in res["bandwidth"]:
        assert r["read_gbs"] > 0 and r["gemv_gbs"] > 0 and r["step_gbs"] > 0 and r["step_bytes"] > r["gemv_bytes"]
        assert r["gemv_share_of_read"] == pytest.approx(r["gemv_gbs"] / r["read_gbs"])
    printed = capsys.readouterr().out
    assert f"| float32 | {paths[0]} | on" in printed and f"| float32 | {paths[0]} | off" in printed
    assert "(chosen)" in printed
    with pytest.raises(SystemExit, match="does not run"):
        tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--bandwidth", "--paths", "sse9"])
    # The tree table times the paths side by side too, and names each.
    out2 = tmp_path / "trees.json"
    assert tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--dtypes", "float32", "--nodes", "3",
                           "--prefix", "4", "--reps", "1", "--warmup", "0", "--paths", ",".join(paths[:2]),
                           "--json", str(out2)]) == 0
    assert [r["gemm_path"] for r in json.loads(out2.read_text())["results"]] == paths[:2]
    assert _native.small_gemm_path() == before
    # and the thread splits, each named, leaving the process's own as it was
    split = _native.small_gemm_split()
    assert tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--dtypes", "float32", "--nodes", "3",
                           "--prefix", "4", "--reps", "1", "--warmup", "0", "--splits", "chunks,2",
                           "--json", str(out2)]) == 0
    assert [r["gemm_split"] for r in json.loads(out2.read_text())["results"]] == [0, 2]
    assert "| chunks |" in capsys.readouterr().out and _native.small_gemm_split() == split
    for bad in ("0", "65", "fine"):
        with pytest.raises(SystemExit):
            tree_cost.main(["--base-model-name-or-path", str(tiny_dir), "--nodes", "3", "--splits", bad])


def test_stream_read_reads_every_byte():
    """The plain-read loop of --bandwidth: the same checksum whatever the thread count (every byte read once)."""
    import numpy as np
    from dart_core import _native

    buf = np.random.default_rng(0).integers(0, 256, size=(3 << 20) + 77, dtype=np.uint8)
    sums = {_native.stream_read(buf, t) for t in (1, 2, 3)}
    assert len(sums) == 1


# ------------------------------------------------------------------------------------------- automatic trees
@pytest.fixture(scope="module")
def tiny_heads(tiny_dir):
    """Random DART and EAGLE-3 heads for the tiny target (DART draft length 4): their directories."""
    from dart_core.models.heads.dart import new_head_for_target, save_dart_head
    from dart_core.models.heads.eagle3 import new_eagle3_head_for_target, save_eagle3_head
    from dart_core.models.loader import load_target

    target = load_target(str(tiny_dir), dtype="float32", device="cpu")
    dart_dir = save_dart_head(new_head_for_target(target, draft_length=4, seed=1), tiny_dir.parent / "dart",
                              dtype=None)
    eagle_dir = save_eagle3_head(new_eagle3_head_for_target(target, seed=2), tiny_dir.parent / "eagle3", dtype=None)
    return dart_dir, eagle_dir


@pytest.fixture()
def cost_cache(tmp_path, monkeypatch):
    """The cost model's cache in tmp_path (measured once per test, never in the user's cache)."""
    monkeypatch.setenv("DART_DEMO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _heads(tiny_heads):
    dart_dir, eagle_dir = tiny_heads
    return ["--dart-model-name-or-path", dart_dir, "--ngram-model-name-or-path", "none",
            "--eagle3-model-name-or-path", eagle_dir]


def test_bench_auto_trees(tiny_dir, tiny_heads, questions_file, cost_cache, tmp_path, capsys):
    """--tree auto (the default): the drafting methods size their trees from one cost model; answers stay
    vanilla's; the report holds the chosen trees, expected and achieved tau, and the cost curve once."""
    out = tmp_path / "auto.json"
    res = _run(_common(tiny_dir, questions_file) + _heads(tiny_heads) + [
        "--methods", "vanilla,dart,eagle3,prompt_lookup", "--limit", "2", "--max-new-tokens", "24",
        "--eagle3-top-k", "2", "--json", out], capsys)
    report = json.loads(out.read_text())
    assert report["settings"]["tree"] == "auto" and report["tree"]["mode"] == "auto"
    cm = report["tree"]["cost_model"]
    assert cm["verify_ms"] and all(ms > 0 for ms in cm["verify_ms"].values()) and cm["commit_ms"] >= 0
    assert set(report["tree"]["verify_ms_after"]) == set(cm["verify_ms"])
    assert "automatic trees: cost model" in res.err and res.err.count("automatic trees: cost model") == 1
    assert len(list(cost_cache.glob("costs/*.json"))) == 1   # measured once, for every method

    methods = report["methods"]
    assert methods["vanilla"]["auto_tree"] is None and methods["vanilla"]["tree"] is None
    drafted = 0
    for name in ("dart", "eagle3", "prompt_lookup"):
        r = methods[name]
        assert r["identical_to_vanilla"] is True, (name, r["divergences"])
        assert r["tree"]["mode"] == "auto"
        a = r["auto_tree"]
        # every verify step of the timed answers is one chosen setting (the warm-up is not counted)
        assert a["chosen"] and sum(a["chosen"].values()) == a["steps"] == r["steps"]
        assert sum(r["tree_nodes_hist"].values()) == r["steps"]
        assert 0 <= a["drafting_steps"] <= r["steps"]
        if a["drafting_steps"]:
            assert a["expected_tau"] >= 1.0 and a["achieved_tau"] >= 1.0
        drafted += a["drafting_steps"]
    assert drafted > 0
    # a size flag given is held: every EAGLE-3 tree chosen has top_k 2
    assert methods["eagle3"]["tree"]["held"] == {"top_k": 2}
    assert all(label == "plain step" or label.endswith("top_k 2") for label in methods["eagle3"]["auto_tree"]["chosen"])
    assert methods["dart"]["tree"]["held"] == {} and methods["prompt_lookup"]["tree"]["held"] == {}
    # the Markdown: the cost curve once, a row per auto method
    assert "Automatic trees" in res.out and res.out.count("verify ms by nodes verified") == 1
    assert "| method | expected tau | achieved tau | drafting steps | trees chosen (share of steps) |" in res.out
    for name in ("dart", "eagle3", "prompt_lookup"):
        # main table + this one (+ the sources table when it accepted drafts)
        rows = 2 + bool(methods[name]["accepted_sources"])
        assert sum(line.startswith(f"| {name} |") for line in res.out.splitlines()) == rows
    # where accepted drafts came from: prompt lookup's all from the context, the heads' from the head (the paper's
    # DART may share them with the corpus table)
    for name, allowed in (("prompt_lookup", {"context"}), ("eagle3", {"head"}), ("dart", {"head", "several"})):
        got = methods[name]["accepted_sources"]
        assert got is None or set(got["tokens"]) <= allowed, (name, got)
    page_dir = tmp_path / "page"
    from dart_core.bench.report import write_report
    write_report(report, res.out, page_dir)
    assert "Automatic trees" in (page_dir / "report.html").read_text()


def test_bench_fixed_trees_run_as_given(tiny_dir, tiny_heads, questions_file, cost_cache, tmp_path, capsys):
    out = tmp_path / "fixed.json"
    res = _run(_common(tiny_dir, questions_file) + _heads(tiny_heads) + [
        "--methods", "vanilla,dart", "--tree", "fixed", "--budget", "3", "--limit", "2", "--max-new-tokens", "20",
        "--json", out], capsys)
    report = json.loads(out.read_text())
    assert report["tree"] == {"mode": "fixed", "cost_model": None, "verify_ms_after": None}
    assert not cost_cache.exists() and "Automatic trees" not in res.out   # nothing measured, nothing chosen
    dart = report["methods"]["dart"]
    assert dart["identical_to_vanilla"] is True and dart["auto_tree"] is None
    assert dart["tree"]["mode"] == "fixed" and dart["tree"]["settings"]["budget"] == 3
    # budget 3 every step: 4 nodes (root included), fewer only where a tree is cut at an answer's last tokens
    hist = {int(k): v for k, v in dart["tree_nodes_hist"].items()}
    assert sum(hist.values()) == dart["steps"] and max(hist) == 4
    assert hist[4] >= dart["steps"] - 3 * dart["answers"]


def test_fixed_variants_run_beside_the_automatic_trees(tiny_dir, tiny_heads, questions_file, cost_cache, tmp_path,
                                                       capsys):
    """NAME@KNOB=V and NAME@fixed: the same method under a fixed tree in the run that sizes NAME automatically,
    each under its own key, every answer vanilla's."""
    out = tmp_path / "variants.json"
    res = _run(_common(tiny_dir, questions_file) + _heads(tiny_heads) + [
        "--methods", "vanilla,dart,dart@budget=3,eagle3@fixed,eagle3@eagle3_total_token=4+eagle3_depth=2",
        "--limit", "2", "--max-new-tokens", "20", "--json", out], capsys)
    report = json.loads(out.read_text())
    methods = report["methods"]
    assert list(methods) == ["vanilla", "dart", "dart@budget=3", "eagle3@fixed", "eagle3@eagle3_total_token=4+eagle3_depth=2"]
    assert report["tree"]["mode"] == "auto" and report["tree"]["cost_model"]   # measured for the automatic dart
    assert methods["dart"]["tree"]["mode"] == "auto" and methods["dart"]["auto_tree"]
    fixed = methods["dart@budget=3"]
    assert fixed["tree"]["mode"] == "fixed" and fixed["tree"]["settings"]["budget"] == 3 and fixed["auto_tree"] is None
    assert max(int(k) for k in fixed["tree_nodes_hist"]) == 4
    published = methods["eagle3@fixed"]["tree"]["settings"]
    assert (published["total_token"], published["depth"], published["top_k"]) == (60, 7, 10)
    small = methods["eagle3@eagle3_total_token=4+eagle3_depth=2"]["tree"]["settings"]
    assert (small["total_token"], small["depth"], small["top_k"]) == (4, 2, 10)
    for name, r in methods.items():
        if name != "vanilla":
            assert r["identical_to_vanilla"] is True, (name, r["divergences"])
    assert "| dart@budget=3 |" in res.out


@pytest.mark.parametrize("entry, needle", [
    ("medusa@fixed", "unknown method 'medusa'"),
    ("vanilla@fixed", "vanilla has no tree to fix"),
    ("dart@beam", "not KNOB=VALUE of dart's tree"),
    ("dart@eagle3_depth=2", "its tree knobs: budget, beam_width"),
    ("dart@budget=-1", "DART tree budget"),
    ("dart@budget=many", "must be a number"),
    ("prompt_lookup@budget=3", "write prompt_lookup@fixed"),
])
def test_bad_variants_name_the_entry(questions_file, capsys, entry, needle):
    last = _fails(["--questions", questions_file, "--methods", f"vanilla,{entry}", "--bandwidth-mib", "0",
                   "--max-busy", "1"], capsys, needle)
    assert entry in last


def test_an_answers_time_is_its_generation_alone(tiny_dir, monkeypatch):
    """The report's bookkeeping after a generation (tree sizes, accepted sources) is not timed as the method's: a
    clock that jumps 100 s inside accepted_sources leaves the answer's wall time below it."""
    from dart_core.models.loader import load_target
    target = load_target(str(tiny_dir), dtype=torch.float32, device="cpu")
    runner = runners.METHODS["prompt_lookup"].factory(target, argparse.Namespace(tree="fixed"))
    clock, now = {"jump": 0.0}, runners.time.perf_counter
    monkeypatch.setattr(runners.time, "perf_counter", lambda: now() + clock["jump"])
    counted = runners.accepted_sources

    def slow_bookkeeping(traces, drafter):
        clock["jump"] += 100.0
        return counted(traces, drafter)
    monkeypatch.setattr(runners, "accepted_sources", slow_bookkeeping)
    out, wall = runners.run_answer(runner, [1, 2, 3, 4, 1, 2, 3], GenerationConfig(max_new_tokens=6),
                                   torch.device("cpu"))
    assert clock["jump"] == 100.0 and out.tokens   # the bookkeeping ran, after the generation's clock stopped
    assert 0 < wall < 100.0 and wall == out.wall_s


def test_bad_tree_mode_fails_at_parse_time(questions_file, capsys):
    _fails(["--questions", questions_file, "--tree", "big", "--bandwidth-mib", "0", "--max-busy", "1"], capsys,
           "--tree", "'big'", "auto", "fixed")


def test_tune_tree_auto_arm(tiny_dir, tiny_heads, questions_file, cost_cache, tmp_path, capsys):
    """tune_tree: an auto arm per method beside its fixed sweep arms, compared with the best fixed arm."""
    out = tmp_path / "tune.json"
    dart_dir, eagle_dir = tiny_heads
    assert _tune_tree().main([
        "--methods", "dart,eagle3", "--questions", str(questions_file), "--limit", "1", "--max-new-tokens", "10",
        "--budget", "1", "2", "--eagle3-trees", "2/1/1", "--base-model-name-or-path", str(tiny_dir),
        "--dart-model-name-or-path", str(dart_dir), "--eagle3-model-name-or-path", str(eagle_dir),
        "--dtype", "float32", "--threads", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["arm"] for r in report["sweep"]] == ["dart@1", "dart@2", "eagle3@2/1/1"]
    assert [r["arm"] for r in report["auto"]] == ["dart@auto", "eagle3@auto"]
    for r in report["auto"]:
        assert r["auto"] is True and r["identical_to_vanilla"] is True
        assert r["chosen"] and sum(r["chosen"].values()) == r["steps"] and r["speedup"] > 0
        cmp = report["auto_vs_best_fixed"][r["arm"]]
        assert cmp["best_fixed_arm"] == report["best"][r["method"]]
        assert cmp["auto_over_best_fixed"] == pytest.approx(cmp["auto_speedup"] / cmp["best_fixed_speedup"])
    assert report["cost_model"]["verify_ms"]
    printed = capsys.readouterr().out
    assert "dart@auto:" in printed and "auto / best fixed" in printed
    from dart_core.bench.report import load_sweep, sweep_figures
    assert len(sweep_figures(load_sweep(out))) == 2   # the report's sweep charts take the auto arms too


# ------------------------------------------------------------------------------------------- named question sets
# Offline against a fake Hugging Face cache in tmp_path (the conftest's hub_cache: HF_HUB_CACHE there,
# HF_HUB_OFFLINE=1); the online step runs with huggingface_hub's download replaced. No network.
def _set_lines(prefix: str, n: int = 2) -> str:
    return "".join(json.dumps({"question_id": f"{prefix}/{i}", "category": "writing", "turns": [f"Question {i}?"]})
                   + "\n" for i in range(n))


def test_the_named_sets():
    assert list(QUESTION_SETS) == ["mt_bench", "humaneval", "gsm8k", "alpaca", "context_dev"]
    assert [s.local_file for s in QUESTION_SETS.values()] == [
        "mt_bench.jsonl", "humaneval.jsonl", "gsm8k_test.jsonl", "alpaca.jsonl", "context_dev.jsonl"]
    for s in QUESTION_SETS.values():
        if s.hub is not None:
            assert s.hub.repo_type in ("dataset", "space") and s.hub.revision and s.hub.filename.endswith(".jsonl")


def test_limit_per_category_keeps_the_first_of_each_kind(tmp_path):
    from dart_core.bench.questions import load_question_sets
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"question_id": f"q{i}", "category": "ab"[i % 2], "turns": ["x?"]}) + "\n"
                         for i in range(7)))
    got = load_question_sets([f], per_category=2)
    assert [q.question_id for q in got] == ["q0", "q1", "q2", "q3"]
    assert [q.question_id for q in load_question_sets([f], 3, per_category=2)] == ["q0", "q1", "q2"]


def test_a_name_resolves_from_the_data_dir_first(hub_cache, tmp_path, monkeypatch):
    data = tmp_path / "eval"
    data.mkdir()
    (data / "gsm8k_test.jsonl").write_text(_set_lines("local"))
    hub_cache.put(QUESTION_SETS["gsm8k"].hub, _set_lines("cached"))
    assert resolve_question_set("gsm8k", data).path == data / "gsm8k_test.jsonl"
    monkeypatch.setenv("DART_DATA_DIR", str(data))
    assert resolve_question_set("gsm8k") == (data / "gsm8k_test.jsonl", "gsm8k", None)   # Spec-Bench lines
    qs = load_question_sets(["gsm8k"])
    assert [q.question_id for q in qs] == ["local/0", "local/1"] and {q.question_set for q in qs} == {"gsm8k"}


def test_a_name_resolves_from_the_hub_cache_offline(hub_cache, tmp_path):
    cached = hub_cache.put(QUESTION_SETS["mt_bench"].hub, _set_lines("mt"))
    empty = tmp_path / "empty"
    empty.mkdir()   # a data dir without the file falls through to the cache
    src = resolve_question_source("mt_bench", empty)
    assert src.path.resolve() == cached.resolve() and src.name == "mt_bench" and src.prompt_category is None
    qs = load_question_sets(["mt_bench"], limit=1)
    # the report groups by the set's name, not by the Hub file's stem (question.jsonl)
    assert len(qs) == 1 and qs[0].question_set == "mt_bench"


def test_a_hub_file_of_prompt_lines_reads_as_single_turn_questions(hub_cache):
    hub_cache.put(QUESTION_SETS["humaneval"].hub,
                  "".join(json.dumps({"prompt": f"def f{i}(x):\n    \"\"\"Return x.\"\"\"\n"}) + "\n" for i in range(3)))
    qs = load_question_sets(["humaneval"], limit=2)
    assert [(q.question_id, q.category, q.question_set) for q in qs] == [
        ("humaneval/0", "code", "humaneval"), ("humaneval/1", "code", "humaneval")]
    assert qs[1].turns == ['def f1(x):\n    """Return x."""\n']
    hub_cache.put(QUESTION_SETS["gsm8k"].hub, json.dumps({"question": "no prompt"}) + "\n")
    with pytest.raises(BenchInputError, match="math_reasoning.jsonl:1: expected a JSON object with a non-empty prompt"):
        load_question_sets(["gsm8k"])


def test_offline_with_nothing_found_names_the_flag_and_the_download(hub_cache):
    with pytest.raises(BenchInputError) as exc:
        resolve_question_set("humaneval")
    msg = str(exc.value)
    for needle in ("--data-dir", "DART_DATA_DIR", "humaneval.jsonl", "hf download", "HF_HUB_OFFLINE",
                   QUESTION_SETS["humaneval"].hub.repo_id):
        assert needle in msg, (needle, msg)
    with pytest.raises(BenchInputError, match="no Hub source"):   # alpaca: a data dir or the cache only
        resolve_question_set("alpaca")


def test_online_downloads_the_pinned_file(hub_cache, tmp_path, monkeypatch):
    import huggingface_hub

    from dart_core.data_sources import hub_file

    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []
    fetched = tmp_path / "fetched.jsonl"
    fetched.write_text(_set_lines("hub"))

    def fake_download(repo_id, filename, **kw):
        calls.append((repo_id, filename, kw.get("repo_type"), kw.get("revision"), kw.get("local_files_only")))
        if kw.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        return str(fetched)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    src = QUESTION_SETS["mt_bench"].hub
    assert resolve_question_set("mt_bench").path == fetched
    assert calls == [(src.repo_id, src.filename, src.repo_type, src.revision, True),
                     (src.repo_id, src.filename, src.repo_type, src.revision, None)]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # offline, the Hub is never asked
    calls.clear()
    assert hub_file(src) is None and calls and all(c[-1] for c in calls)


def test_unknown_set_names_list_the_known_ones(hub_cache):
    with pytest.raises(BenchInputError, match="mt_bench, humaneval, gsm8k, alpaca"):
        resolve_question_source("mtbench")


def test_cli_error_for_a_missing_named_set(hub_cache, tmp_path, capsys):
    _fails(["--questions", "gsm8k", "--bandwidth-mib", "0", "--max-busy", "1"], capsys,
           "gsm8k", "--data-dir", "DART_DATA_DIR", "hf download")
    _fails(["--questions", "gsm8k", "--data-dir", tmp_path / "nowhere", "--bandwidth-mib", "0", "--max-busy", "1"],
           capsys, "--data-dir", "nowhere")


def test_cli_runs_a_named_set_from_the_data_dir(tiny_dir, hub_cache, tmp_path, capsys):
    data = tmp_path / "eval"
    data.mkdir()
    (data / "mt_bench.jsonl").write_text(_set_lines("mt_bench"))
    out = tmp_path / "named.json"
    argv = _common(tiny_dir, "mt_bench")
    _run(argv + ["--data-dir", data, "--methods", "vanilla", "--limit", "1", "--max-new-tokens", "4",
                 "--json", out], capsys)
    report = json.loads(out.read_text())
    assert report["settings"]["questions"] == ["mt_bench"]
    assert report["settings"]["question_sources"] == [str(data / "mt_bench.jsonl")]
    assert list(report["methods"]["vanilla"]["per_set"]) == ["mt_bench"]


@pytest.mark.bundled
def test_chooser_cost_times_each_part_on_the_bundled_model(questions_file, capsys):
    """benchmarks/chooser_cost.py: per step of automatic trees, the decision, the learning, the step's record and
    the drafting it wraps, each timed; a method without automatic trees is refused by name."""
    chooser_cost = _bench_script("chooser_cost")
    assert chooser_cost.main(["--methods", "dart_context,eagle3", "--questions", str(questions_file), "--limit", "2",
                              "--max-new-tokens", "24", "--threads", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| dart_context", "| eagle3"))]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        steps, times = int(cells[1]), [float(c) for c in cells[2:]]
        assert steps > 0 and times[0] > 0 and times[2] > 0   # every step recorded, a decision every few
        assert times[6] >= times[5] > 0                      # the wrapped propose inside the chooser's
    with pytest.raises(SystemExit, match="vanilla has no automatic trees"):
        chooser_cost.main(["--methods", "vanilla", "--questions", str(questions_file), "--limit", "1",
                           "--max-new-tokens", "4"])


def test_draft_cost_and_step_stages_run_on_the_bundled_model(tmp_path, capsys):
    """benchmarks/draft_cost.py (drafting step against a plain step, per head backend) and step_stages.py (each
    stage in place for fixed trees, answers checked against vanilla) run and write what they print."""
    draft_cost, step_stages = _bench_script("draft_cost"), _bench_script("step_stages")
    out = tmp_path / "draft.json"
    assert draft_cost.main(["--reps", "1", "--backends", "torch,native", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["arms"]) == {"dart torch", "eagle3 torch", "dart native", "eagle3 native"}
    assert all(a["draft_forward_ms"] > 0 and a["x_plain"] > 0 for a in res["arms"].values())
    assert "EAGLE-3's draft per level" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        draft_cost.main(["--backends", "native,cuda"])
    assert "unknown cuda" in capsys.readouterr().err
    out = tmp_path / "stages.json"
    assert step_stages.main(["--limit", "1", "--max-new-tokens", "6", "--budgets", "2", "--eagle3-trees", "2/0/1",
                             "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"vanilla", "DART budget 2", "EAGLE-3 2/0/1"} and all(r["answers_equal"] for r in rows.values())
