"""The Hub path offline: local directories laid out exactly like the published repositories of the Space's trio
(Qwen/Qwen3-4B: sharded safetensors + tokenizer; fvliang/qwen4b-dart: config.json + model.safetensors;
AngelSlim/Qwen3-4B_eagle3: config.json + pytorch_model.bin; fvliang/dart-qwen3-ngram: small.trie + full.trie),
built from a tiny random Qwen3. They are loaded through app.py's own code path, from directories and, as
`preload_from_hub` leaves them, from the Hub cache by repo id (HF_HUB_OFFLINE=1); greedy DART and EAGLE-3 equal
vanilla (fp32); the .trie is imported once and cached; a head made for another target is refused; the app starts
(fallback banner, startup line, warm-up) and serves a streamed answer through a fake ZeroGPU `spaces` module."""
from __future__ import annotations

import functools
import inspect
import json
import logging
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import app  # noqa: E402
from dart_core.page.controls import SETTING_NAMES  # noqa: E402
from dart_core.page.visualiser import Visualiser  # noqa: E402
import gradio as gr  # noqa: E402
from dart_core import space  # noqa: E402
from dart_core.api import open_ngram  # noqa: E402
from dart_core.ui.session import RunSettings  # noqa: E402
from dart_core.models.heads.dart import new_head_for_target, save_dart_head  # noqa: E402
from dart_core.models.heads.files import DartHeadError, Eagle3HeadError, HeadTargetMismatch  # noqa: E402
from dart_core.models.heads.eagle3 import new_eagle3_head_for_target, save_eagle3_head  # noqa: E402
from dart_core.models.loader import load_target  # noqa: E402
from dart_core.ngram.reference import write_original_trie  # noqa: E402
from dart_core.page.startup import startup_summary, warm_up  # noqa: E402
from gradio_server import launch_local  # noqa: E402
from tiny_models import make_tiny_model_dir  # noqa: E402
import test_dart_head as dart_synth  # noqa: E402  (synthetic published-layout DART checkpoints)
import test_eagle3 as eagle_synth  # noqa: E402  (synthetic published-layout EAGLE-3 checkpoints)

TARGET, DART, EAGLE3, NGRAM = "Qwen/Qwen3-4B", "fvliang/qwen4b-dart", "AngelSlim/Qwen3-4B_eagle3", \
    "fvliang/dart-qwen3-ngram"
# docs/ARCHITECTURE.md section 4: the keys of a published DART head (embed_tokens is the target's)
DART_KEYS = {"fc.weight", "midlayer.mask_rep", "norm.weight", "lm_head.weight", "d2t", "t2d",
             *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
             *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
             *(f"midlayer.{n}.weight" for n in ("hidden_norm", "input_layernorm", "post_attention_layernorm"))}
PROMPTS = ["Write a Python function that returns the sum", "The quick brown fox", "What is 12 times 7?"]
VALUES = (12, 0.0, 1.0, 0, 16, 6, 6, 0.5, 0.0, 16, 3, 4, 0.0)  # page values in SETTING_NAMES order (small trees)


# ---------------------------------------------------------------------------------------------- the published layouts
def _publish(head_dir: Path, record_key: str) -> dict:
    """A head saved by our trainer, minus what only our heads carry (the target record): a published config."""
    cfg = json.loads((head_dir / "config.json").read_text())
    cfg.pop(record_key, None)
    (head_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def _make_repos(root: Path) -> dict[str, Path]:
    """The four repositories as directories named like them, from one tiny random Qwen3."""
    from transformers import AutoModelForCausalLM

    tgt = make_tiny_model_dir(root, "qwen3", name="Qwen3-4B")
    model = AutoModelForCausalLM.from_pretrained(tgt, dtype=torch.float32)
    (tgt / "model.safetensors").unlink()
    model.save_pretrained(tgt, max_shard_size="300KB")  # Qwen3-4B ships shards + model.safetensors.index.json
    target = load_target(str(tgt), dtype="float32", device="cpu")

    dart = save_dart_head(new_head_for_target(target, draft_ids=torch.arange(1, target.vocab_size, 2),
                                              draft_length=4, seed=1), root / "qwen4b-dart", dtype=None)
    _publish(dart, "dart_target")

    tmp = save_eagle3_head(new_eagle3_head_for_target(target, draft_ids=torch.arange(0, target.vocab_size, 3),
                                                      seed=2), root / "eagle3-tmp", dtype=None)
    from safetensors.torch import load_file
    cfg = _publish(tmp, "eagle3_target")
    eagle = Path(eagle_synth.write_head(root / "Qwen3-4B_eagle3", load_file(str(tmp / "model.safetensors")), cfg,
                                        fmt="bin"))                    # AngelSlim ships pytorch_model.bin
    shutil.rmtree(tmp)

    from dart_core.config import GenerationConfig
    from dart_core.engine.decoding import SpeculativeEngine
    ng = root / "dart-qwen3-ngram"
    ng.mkdir()
    docs = [SpeculativeEngine(target).generate(target.tokenizer.encode(p), GenerationConfig(
        max_new_tokens=40, max_length=80)).tokens for p in PROMPTS]
    write_original_trie(ng / "small.trie", docs, 4)
    (ng / "full.trie").write_bytes(b"\x07" * 64)  # not a trie: picking it instead of small.trie fails loudly
    return {TARGET: tgt, DART: dart, EAGLE3: eagle, NGRAM: ng}


@pytest.fixture(scope="module")
def dart_cache(tmp_path_factory):
    """The dart-demo user cache (imported N-gram tables land here), private to this module."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("dart-cache")
    mp.setenv("DART_CACHE", str(path))
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def repos(tmp_path_factory, dart_cache) -> dict[str, Path]:
    return _make_repos(tmp_path_factory.mktemp("hub"))


def _flags(repos: dict[str, Path], *extra: str) -> list[str]:
    return ["--base-model-name-or-path", str(repos[TARGET]), "--dart-model-name-or-path", str(repos[DART]),
            "--ngram-model-name-or-path", str(repos[NGRAM]), "--use-small-ngram",
            "--eagle3-model-name-or-path", str(repos[EAGLE3]), *extra]


@pytest.fixture(scope="module")
def loaded(repos):
    """target + Visualiser built exactly as app.main() builds them (fp32 for the exact lossless check)."""
    args = app.parse_args(_flags(repos, "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "32",
                                 "--max-length", "256"))
    target = load_target(args.base_model_name_or_path, dtype=args.dtype, device=args.device,
                         template_name=args.template_name)
    return target, args, Visualiser(target, args)


def test_directories_have_the_published_layouts(repos):
    from safetensors import safe_open
    tgt = repos[TARGET]
    index = json.loads((tgt / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2 and all((tgt / s).is_file() for s in shards) and not (tgt / "model.safetensors").exists()
    assert json.loads((tgt / "config.json").read_text())["model_type"] == "qwen3"
    assert (tgt / "tokenizer.json").is_file() and (tgt / "tokenizer_config.json").is_file()
    with safe_open(str(repos[DART] / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == DART_KEYS
    assert sorted(p.name for p in repos[DART].iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in repos[EAGLE3].iterdir()) == ["config.json", "pytorch_model.bin"]
    eagle_keys = set(torch.load(repos[EAGLE3] / "pytorch_model.bin", weights_only=True))
    assert eagle_keys == DART_KEYS - {"midlayer.mask_rep"}  # docs/ARCHITECTURE.md section 7: as DART, without mask_rep
    for d, key in ((repos[DART], "dart_target"), (repos[EAGLE3], "eagle3_target")):
        assert key not in json.loads((d / "config.json").read_text())  # published heads carry no target record


# ---------------------------------------------------------------------------------------------- loading, greedy
def test_app_code_path_loads_the_trio_and_greedy_equals_vanilla(loaded, dart_cache):
    target, args, vis = loaded
    assert vis.available == ["dart", "eagle3", "vanilla"] and vis.factory.unavailable == {}
    assert target.config.model_type == "qwen3" and vis.template.name == "qwen"
    store = vis.factory.ngram
    assert store is not None and Path(store.path).parent == dart_cache / "ngram" and store.order == 4
    assert Path(store.path).name.startswith("small-")  # --use-small-ngram (the older spelling of --small-ngram) picked small.trie, not full.trie
    engines = vis.factory.build(RunSettings(max_new_tokens=24))
    cfg = RunSettings(max_new_tokens=24).generation_config(args.max_length)
    for p in PROMPTS:
        ids = target.tokenizer.encode(p, add_special_tokens=False)
        want = engines["vanilla"].generate(ids, cfg).tokens
        for name in ("dart", "eagle3"):
            got = engines[name].generate(ids, cfg)
            assert got.tokens == want, f"{name} greedy output differs from vanilla for {p!r}"
            assert got.traces and got.stats.tau >= 1.0


def test_startup_line_and_warm_up(loaded, caplog):
    target, args, vis = loaded
    line = startup_summary(target, vis.factory)
    for part in (str(target.name), "float32 on cpu", "sdpa", f"DART head {vis.factory.dart_head.source}",
                 f"EAGLE-3 head {vis.factory.eagle3_head.source}", f"N-gram table {vis.factory.ngram.path}",
                 "order 4", "engines DART, EAGLE-3, Vanilla", "forward: native small-GEMM"):
        assert part in line, (part, line)
    with caplog.at_level(logging.INFO, logger="dart_core.page.startup"):
        seconds = warm_up(vis.factory, vis.template, max_length=args.max_length)
    assert set(seconds) == {"dart", "eagle3", "vanilla"} and "warm-up: DART" in caplog.text
    # the warmed engines are the ones a request at the page's default settings reuses (same trees, caches): with
    # automatic trees the page sends the pruner's knobs and leaves the size knobs to the chooser
    p = vis.factory.base_trees["dart"]
    page_defaults = RunSettings(beam_width=p.beam_width, level_top_k=p.level_top_k, ngram_weight=p.ngram_weight)
    warmed = vis.factory.build(RunSettings())
    assert all(vis.factory.build(page_defaults)[n] is warmed[n] for n in warmed)


# ---------------------------------------------------------------------------------------------- the .trie cache
def test_trie_is_imported_once_and_cached(repos, loaded, dart_cache, monkeypatch, tmp_path):
    from dart_core.ngram import build as ngram
    target = loaded[0]
    calls: list[str] = []
    real = ngram.import_original_trie

    def spy(src, dst, *a, **k):
        calls.append(str(src))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(ngram, "import_original_trie", spy)
    cached = Path(loaded[2].factory.ngram.path)
    mtime = cached.stat().st_mtime_ns
    again = open_ngram(str(repos[NGRAM]), target.tokenizer, is_small_ngram=True)
    assert calls == [] and Path(again.path) == cached and cached.stat().st_mtime_ns == mtime  # no re-import
    # another file (new size or time) is another cache entry: imported once, then reused
    copy = tmp_path / "small.trie"
    shutil.copy(repos[NGRAM] / "small.trie", copy)
    first = open_ngram(str(copy), target.tokenizer)
    second = open_ngram(str(copy), target.tokenizer)
    assert calls == [str(copy)] and first.path == second.path != str(cached)
    assert sorted(p.name for p in (dart_cache / "ngram").iterdir()) == sorted({Path(first.path).name, cached.name})


# ---------------------------------------------------------------------------------------------- refusing heads
@pytest.mark.parametrize("flag", ["--dart-model-name-or-path", "--eagle3-model-name-or-path"])
def test_a_head_for_another_target_is_refused(repos, tmp_path, flag, caplog):
    """A published head for a wider target (as fvliang/qwen8b-dart on Qwen3-4B): app.main() stops with one
    line naming the head, what does not match and how to fix it, never a traceback or random drafts."""
    if flag.startswith("--dart"):
        bad = dart_synth.write_head(tmp_path / "qwen8b-dart", dart_synth.published_state(),
                                    dart_synth.published_config())
    else:
        bad = eagle_synth.write_head(tmp_path / "Qwen3-8B_eagle3", eagle_synth.published_state(),
                                     eagle_synth.published_config(), fmt="bin")
    argv = _flags(repos, "--dtype", "float32", "--device", "cpu")
    argv[argv.index(flag) + 1] = bad
    with pytest.raises(SystemExit) as exc:
        app.main(argv)
    msg = str(exc.value)
    assert msg.startswith("error: ") and bad in msg and "hidden size" in msg, msg
    assert "load the base model this head was made for" in msg and "python -m dart_core.train" in msg
    target = load_target(str(repos[TARGET]), dtype="float32", device="cpu")
    with pytest.raises(HeadTargetMismatch) as err:
        Visualiser(target, app.parse_args(argv))
    # the mismatch is also the head's own error (what callers of that head catch), never the other head's
    own, other = (DartHeadError, Eagle3HeadError) if flag.startswith("--dart") else (Eagle3HeadError, DartHeadError)
    assert isinstance(err.value, own) and not isinstance(err.value, other)


# ---------------------------------------------------------------------------------------------- as preloaded
def _hub_cache(root: Path, repos: dict[str, Path], small_only: tuple[str, ...] = (NGRAM,)) -> Path:
    """The Hub cache as `preload_from_hub` leaves it: models--OWNER--NAME/{refs/main, snapshots/SHA/...}."""
    cache = root / "hub"
    for i, (repo, src) in enumerate(repos.items()):
        sha = f"{i + 1:040x}"
        d = cache / f"models--{repo.replace('/', '--')}"
        snap = d / "snapshots" / sha
        snap.mkdir(parents=True)
        for f in src.iterdir():
            if repo in small_only and f.name == "full.trie":
                continue  # preload_from_hub takes only small.trie of the N-gram repo
            shutil.copy(f, snap / f.name)
        (d / "refs").mkdir()
        (d / "refs" / "main").write_text(sha)
    return cache


def test_space_launch_settings_load_by_repo_id_from_the_hub_cache(repos, tmp_path, monkeypatch):
    """spaces_config.yaml's launch settings (the real Hub ids) resolve from the Hub cache offline."""
    import huggingface_hub.constants as hf_constants
    assert hf_constants.HF_HUB_OFFLINE, "run with HF_HUB_OFFLINE=1 (tests/conftest.py sets it)"
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path, repos)))
    argv, banner = space.cpu_fallback(space.space_app_argv(), cuda_available=True)
    assert banner is None and argv == space.space_app_argv()
    for repo in (TARGET, DART, EAGLE3, NGRAM):
        assert repo in argv
    args = app.parse_args(argv + ["--dtype", "float32", "--max-length", "256"])  # later flags win
    assert args.is_small_ngram and args.listen
    target = load_target(args.base_model_name_or_path, dtype=args.dtype, device="cpu")
    vis = Visualiser(target, args)
    assert vis.available == ["dart", "eagle3", "vanilla"]
    assert vis.factory.dart_head.source == DART and vis.factory.eagle3_head.source == EAGLE3
    assert "startup: target Qwen/Qwen3-4B (float32 on cpu" in startup_summary(target, vis.factory)
    ids = target.tokenizer.encode(PROMPTS[0], add_special_tokens=False)
    engines = vis.factory.build(RunSettings(max_new_tokens=8))
    cfg = RunSettings(max_new_tokens=8).generation_config(args.max_length)
    assert engines["dart"].generate(ids, cfg).tokens == engines["vanilla"].generate(ids, cfg).tokens


# ---------------------------------------------------------------------------------------------- no GPU; ZeroGPU
def test_without_cuda_the_space_falls_back_to_the_bundled_models(repos):
    argv, banner = space.cpu_fallback(space.space_app_argv(), cuda_available=False)
    args = app.parse_args(argv)
    assert args.base_model_name_or_path is None and args.dart_model_name_or_path is None
    assert args.ngram_model_name_or_path is None and args.eagle3_model_name_or_path is None
    assert not args.is_small_ngram and args.dtype == "auto" and args.device == "auto"
    assert args.compare_eagle3 and args.listen and args.max_new_tokens == 256  # the rest as configured
    assert banner.startswith("No GPU on this machine") and TARGET in banner and "bundled CPU models" in banner
    assert "l4x1" in banner
    assert space.cpu_fallback(space.space_app_argv(), cuda_available=True)[1] is None
    local = _flags(repos)  # local directories are not Hub models: kept, no banner, even without CUDA
    assert space.cpu_fallback(local, cuda_available=False) == (local, None)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("cuda", [True, False])
def test_main_on_a_space_loads_the_configured_models_only_with_cuda(cuda, monkeypatch):
    """app.main() as Spaces starts it (no flags, SPACE_ID set): the configured Hub trio with CUDA, else the
    bundled target (load_target stopped before any model work)."""
    import dart_core.models.loader as loader
    seen: dict = {}

    def load_target(name, **kw):
        seen.update(name=name, **kw)
        raise _Stop

    monkeypatch.setenv("SPACE_ID", "someone/dart-demo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(loader, "load_target", load_target)
    with pytest.raises(_Stop):
        app.main()
    if cuda:
        assert seen["name"] == TARGET and seen["dtype"] == "bfloat16"
    else:
        assert seen["name"] is None and seen["dtype"] == "auto" and seen["device"] == "auto"


def test_main_on_a_space_without_cuda_shows_the_banner_logs_and_warms_up(repos, monkeypatch, caplog):
    """app.main() as Spaces starts it (no flags, SPACE_ID set, no CUDA): the fallback argv (here the tiny trio
    stands in for the bundled models), the banner in the page, the startup line, a warm-up, then launch."""
    seen: dict = {}

    def fake_fallback(argv, *, cuda_available):
        seen["cuda"], seen["argv"] = cuda_available, argv
        return _flags(repos, "--dtype", "float32", "--max-length", "128"), "No GPU on this machine: test banner"

    monkeypatch.setenv("SPACE_ID", "someone/dart-demo")
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.setattr(space, "cpu_fallback", fake_fallback)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: seen.setdefault("launch", (self, kw)))
    with caplog.at_level(logging.INFO):
        app.main()
    demo, kw = seen["launch"]
    assert seen["cuda"] is False and seen["argv"] == space.space_app_argv() and kw["server_name"] == "127.0.0.1"
    banners = [c for c in demo.config["components"] if c.get("props", {}).get("elem_id") == "fallback-banner"]
    assert len(banners) == 1 and "test banner" in banners[0]["props"]["value"]
    assert "No GPU on this machine: test banner" in caplog.text
    assert "startup: target " in caplog.text and "warm-up: DART" in caplog.text


def _fake_spaces(calls: list[str]) -> types.ModuleType:
    """A stand-in for Hugging Face's `spaces` package: GPU(fn) wraps plain and generator functions."""
    mod = types.ModuleType("spaces")

    def GPU(fn=None, duration=None):  # noqa: N802 - the real name
        if fn is None:
            return lambda f: GPU(f, duration=duration)
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*a, **k):
                calls.append(fn.__name__)
                yield from fn(*a, **k)
            return gen

        @functools.wraps(fn)
        def call(*a, **k):
            calls.append(fn.__name__)
            return fn(*a, **k)
        return call

    mod.GPU = GPU
    return mod


def test_gpu_decorator_wraps_only_on_a_space_with_the_spaces_package(monkeypatch):
    def handler(x):
        return x + 1
    assert space.gpu_decorator({})(handler) is handler                       # local: untouched
    assert space.gpu_decorator({"SPACE_ID": "a/b"})(handler) is handler      # a Space without `spaces`
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "spaces", _fake_spaces(calls))
    assert space.gpu_decorator({})(handler) is handler                       # `spaces` installed locally: no-op
    env = {"SPACE_ID": "a/b"}
    wrapped = space.gpu_decorator(env)(handler)
    assert wrapped is not handler and wrapped(1) == 2 and calls == ["handler"]

    def stream(n):
        yield from range(n)
    g = space.gpu_decorator(env, duration=120)(stream)
    assert inspect.isgeneratorfunction(g) and list(g(3)) == [0, 1, 2] and calls == ["handler", "stream"]
    assert not space.on_zerogpu(env) and space.on_zerogpu({**env, "SPACES_ZERO_GPU": "true"})


def test_app_on_the_hub_layout_streams_through_zerogpu_handlers(loaded, monkeypatch):
    """The page on the Hub-layout trio, built on a Space with a (fake) `spaces` package: the engine handlers go
    through spaces.GPU and a client still gets a streamed answer from every engine, and the banner shows."""
    gradio_client = pytest.importorskip("gradio_client")
    target, args, _ = loaded
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "spaces", _fake_spaces(calls))
    monkeypatch.setenv("SPACE_ID", "someone/dart-demo")
    vis = Visualiser(target, args, banner="No GPU on this machine: test banner")
    monkeypatch.delenv("SPACE_ID")
    url = launch_local(vis.demo)
    try:
        client = gradio_client.Client(url, verbose=False, download_files=False)
        job = client.submit("Write a Python function.", *VALUES, api_name="/run")
        streamed = list(job) or job.outputs()
        text = json.dumps(streamed[-1], ensure_ascii=False, default=str)
        assert len(streamed) >= 2 and "Done.**" in text and text.count("tok/s") == 3, text[:2000]
        assert "identical to the baseline" in text
        assert calls == ["run_ui"]
        step = client.predict("Hi", *VALUES, api_name="/step_once")
        assert "round 1" in json.dumps(step, ensure_ascii=False, default=str) and calls[-1] == "step_ui"
    finally:
        vis.demo.close()
