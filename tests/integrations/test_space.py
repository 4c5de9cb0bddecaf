"""The Hugging Face Space, offline: spaces_config.yaml validated and agreeing with README.md's front matter and
requirements.txt, its launch settings mapped onto app.py's flags, and the native-extension bootstrap's decisions
(pip mocked). The build replay in an empty venv (tests/space_build_replay.sh) needs PyPI and minutes: `-m slow`."""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dart_core import space
from dart_core.space import LaunchSettings, NativeBuildError, SpaceConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / space.CONFIG_NAME


@pytest.fixture(scope="module")
def cfg() -> space.SpaceConfig:
    return space.load_config(CONFIG)


def _copy_repo_files(tmp_path: Path, mutate=None) -> Path:
    """The files the config is checked against, in a temp dir; ``mutate(dict)`` edits the config first."""
    for name in ("README.md", "requirements.txt", "app.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    data = yaml.safe_load(CONFIG.read_text())
    if mutate is not None:
        mutate(data)
    path = tmp_path / space.CONFIG_NAME
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


# ---------------------------------------------------------------------------------------------- README front matter
def test_readme_front_matter_agrees_with_config(cfg):
    assert space.front_matter_problems(cfg, ROOT / "README.md") == [], \
        "run: python -m dart_core.space front-matter --write"
    assert space.main(["front-matter", "--check"]) == 0


def test_check_fails_when_readme_disagrees_and_write_fixes_it(tmp_path, capsys):
    path = _copy_repo_files(tmp_path)
    readme = tmp_path / "README.md"
    block, rest = space.split_front_matter(readme.read_text())
    readme.write_text(f"---\n{block.replace('sdk_version: 6.31.0', 'sdk_version: 6.0.0')}---\n{rest}")
    assert space.main(["front-matter", "--check", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "sdk_version" in err and "front-matter --write" in err

    assert space.main(["front-matter", "--write", "--config", str(path)]) == 0
    assert space.main(["front-matter", "--check", "--config", str(path)]) == 0
    assert space.split_front_matter(readme.read_text())[1] == rest  # the rest of README untouched, byte for byte


def test_check_fails_when_config_changes(tmp_path, capsys):
    path = _copy_repo_files(tmp_path, lambda d: d.update(title="Another title"))
    assert space.main(["front-matter", "--check", "--config", str(path)]) == 1
    assert "title" in capsys.readouterr().err


def test_write_adds_front_matter_keeping_the_readme(tmp_path):
    path = _copy_repo_files(tmp_path)
    readme = tmp_path / "README.md"
    body = "# Title\n\nText with --- inside.\n\n---\n\nmore\n"
    readme.write_text(body)
    cfg = space.load_config(path)
    assert space.front_matter_problems(cfg, readme)  # none yet
    assert space.write_front_matter(cfg, readme) is True
    text = readme.read_text()
    assert text.startswith("---\ntitle: ") and text.endswith("\n" + body)
    assert space.front_matter_problems(cfg, readme) == []
    assert space.write_front_matter(cfg, readme) is False  # idempotent
    assert yaml.safe_load(space.split_front_matter(text)[0])["python_version"] == "3.12"  # stays a string


def test_front_matter_lists_models_and_no_launch_section(cfg):
    fm = yaml.safe_load(space.render_front_matter(cfg).strip("-\n"))
    assert space.LAUNCH_KEY not in fm and set(fm) <= space.SPACES_KEYS
    assert fm["models"] == cfg.launch.hub_repos()
    assert fm["sdk"] == "gradio" and fm["app_file"] == "app.py"


# ---------------------------------------------------------------------------------------------- the config's facts
def test_sdk_version_equals_gradio_pin(cfg):
    pin = space.gradio_pin(ROOT / "requirements.txt")
    assert pin is not None and cfg.settings["sdk_version"] == pin


def test_gradio_pin_parsing(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("torch>=2.4\ngradio[oauth] == 6.31.0  # the Space's sdk_version\n")
    assert space.gradio_pin(req) == "6.31.0"
    req.write_text("gradio>=6\n")
    assert space.gradio_pin(req) is None


def test_preload_never_lists_full_trie(cfg):
    entries = [space.parse_preload(e) for e in cfg.settings["preload_from_hub"]]
    repos = {repo: files for repo, files, _ in entries}
    assert not any(Path(f).name == "full.trie" for _, files, _ in entries for f in files or [])
    assert repos[cfg.launch.ngram_model] == ["small.trie"] and cfg.launch.use_small_ngram
    assert set(cfg.launch.hub_repos()) <= set(repos)  # everything the app loads is on disk at startup


def test_hardware_values_are_spaces_flavours(cfg):
    hub = pytest.importorskip("huggingface_hub")
    flavours = {h.value for h in hub.SpaceHardware}
    missing = set(space.HARDWARE) - flavours
    if int(hub.__version__.split(".")[0]) < 2:   # 1.x (what transformers' floor brings) predates the RTX PRO 6000s
        missing = {f for f in missing if not f.startswith("rtx-pro-6000")}
    assert not missing, f"not Spaces flavours in huggingface_hub {hub.__version__}: {sorted(missing)}"
    assert cfg.settings["suggested_hardware"] in flavours and cfg.settings["suggested_hardware"] != "cpu-basic"


def test_parse_preload_forms():
    assert space.parse_preload("a/b") == ("a/b", None, None)
    assert space.parse_preload("a/b x.json,y/z.bin") == ("a/b", ["x.json", "y/z.bin"], None)
    assert space.parse_preload("a/b x.json abc123") == ("a/b", ["x.json"], "abc123")
    with pytest.raises(SpaceConfigError, match="preload_from_hub"):
        space.parse_preload("a/b x y z")


def _set_launch(**kw):
    return lambda d: d["launch"].update(kw)


BAD = [
    ("unknown Spaces key", lambda d: d.update(hardware="l4x1"), "hardware: not a setting Spaces accepts"),
    ("launch-like key at top", lambda d: d.update(base_model="x"), "base_model: not a setting"),
    ("missing title", lambda d: d.pop("title"), "title: missing"),
    ("python_version as number", lambda d: d.update(python_version=3.1), "quote it"),
    ("python_version not 3.x", lambda d: d.update(python_version="py3"), "python_version"),
    ("not gradio", lambda d: d.update(sdk="streamlit"), "sdk: this app is a Gradio app"),
    ("bad colour", lambda d: d.update(colorFrom="orange"), "colorFrom"),
    ("bad hardware", lambda d: d.update(suggested_hardware="h100-huge"), "suggested_hardware"),
    ("ZeroGPU python", lambda d: d.update(suggested_hardware="zero-a10g", python_version="3.11"), "ZeroGPU"),
    ("bad timeout", lambda d: d.update(startup_duration_timeout="forever"), "startup_duration_timeout"),
    ("long description", lambda d: d.update(short_description="x" * 61), "short_description"),
    ("tags not a list", lambda d: d.update(tags="demo"), "tags: must be a list"),
    ("sdk_version off the pin", lambda d: d.update(sdk_version="6.0.0"), "requirements.txt pins gradio==6.31.0"),
    ("app_file missing", lambda d: d.update(app_file="main.py"), "app_file"),
    ("full.trie preloaded", lambda d: d["preload_from_hub"].append("fvliang/dart-qwen3-ngram full.trie"),
     "full.trie"),
    ("ngram repo preloaded whole", lambda d: d["preload_from_hub"].__setitem__(3, "fvliang/dart-qwen3-ngram"),
     "preloaded whole"),
    ("launch model not preloaded", lambda d: d["preload_from_hub"].pop(0), "Qwen/Qwen3-4B' but it is not preloaded"),
    ("unknown launch setting", _set_launch(base="x"), "launch.base is not a launch setting"),
    ("launch type", _set_launch(max_new_tokens="many"), "launch.max_new_tokens must be an integer"),
    ("launch bool type", _set_launch(use_small_ngram="yes"), "launch.use_small_ngram must be true or false"),
    ("launch dtype", _set_launch(dtype="fp8"), "launch.dtype"),
    ("launch lengths", _set_launch(max_new_tokens=4096), "max_length"),
    ("launch not a mapping", lambda d: d.update(launch=["x"]), "launch must be a mapping"),
]


@pytest.mark.parametrize("mutate,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_fields_rejected(tmp_path, mutate, message):
    path = _copy_repo_files(tmp_path, mutate)
    with pytest.raises(SpaceConfigError) as exc:
        space.load_config(path)
    assert message in str(exc.value) and space.CONFIG_NAME in str(exc.value)


def test_unreadable_config_errors(tmp_path):
    with pytest.raises(SpaceConfigError, match="cannot read"):
        space.load_config(tmp_path / "nope.yaml")
    bad = tmp_path / space.CONFIG_NAME
    bad.write_text("title: [unclosed\n")
    with pytest.raises(SpaceConfigError, match="not valid YAML"):
        space.load_config(bad)
    assert space.main(["front-matter", "--check", "--config", str(bad)]) == 2


# ---------------------------------------------------------------------------------------------- launch -> app args
def test_launch_settings_to_argv():
    s = LaunchSettings(base_model="Qwen/Qwen3-4B", ngram_model="none", use_small_ngram=True, compare_eagle3=False,
                       dtype="bfloat16", max_new_tokens=64)
    assert s.to_argv() == ["--base-model-name-or-path", "Qwen/Qwen3-4B", "--ngram-model-name-or-path", "none",
                           "--small-ngram", "--dtype", "bfloat16", "--max-new-tokens", "64"]
    assert LaunchSettings().to_argv() == []  # nothing set: app.py's defaults (the bundled models)
    assert set(LaunchSettings.FLAGS) == {f.name for f in dataclasses.fields(LaunchSettings)}
    assert s.hub_repos() == ["Qwen/Qwen3-4B"]  # "none" is no repo


@pytest.fixture(scope="module")
def app_module():
    sys.path.insert(0, str(ROOT))
    import app
    return app


def test_launch_settings_become_app_args(cfg, app_module):
    from dart_core.page.serve import launch_kwargs
    args = app_module.parse_args(cfg.app_argv())
    launch = cfg.launch
    assert args.base_model_name_or_path == launch.base_model == "Qwen/Qwen3-4B"
    assert args.dart_model_name_or_path == launch.dart_model == "fvliang/qwen4b-dart"
    assert args.ngram_model_name_or_path == launch.ngram_model == "fvliang/dart-qwen3-ngram"
    assert args.is_small_ngram is True and args.compare_eagle3 is True
    assert args.eagle3_model_name_or_path == launch.eagle3_model == "AngelSlim/Qwen3-4B_eagle3"
    assert (args.dtype, args.max_new_tokens, args.max_length) == (launch.dtype, launch.max_new_tokens,
                                                                  launch.max_length)
    assert args.listen is True and launch_kwargs(args)["server_name"] == "0.0.0.0"
    assert args.server_port == 7860 and args.share is False


class _Stop(Exception):
    pass


def _main_args(app_module, monkeypatch, argv=None) -> tuple[list[str] | None, dict]:
    """Run app.main() up to model loading; return the argv it parsed and what it asked load_target for."""
    import dart_core.models.loader as loader
    seen: dict = {}
    real_parse = app_module.parse_args

    def parse(a=None):
        seen["argv"] = a
        return real_parse(a)

    def load_target(name, **kw):
        seen["load"] = dict(name=name, **kw)
        raise _Stop

    monkeypatch.setattr(app_module, "parse_args", parse)
    monkeypatch.setattr(loader, "load_target", load_target)
    monkeypatch.setattr(sys, "argv", ["app.py"])
    with pytest.raises(_Stop):
        app_module.main(argv)
    return seen["argv"], seen["load"]


def test_app_main_reads_the_config_on_a_space(cfg, app_module, monkeypatch):
    import torch
    monkeypatch.setenv("SPACE_ID", "someone/dart-demo")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # without CUDA the app falls back to CPU models
    argv, load = _main_args(app_module, monkeypatch)
    assert argv == cfg.app_argv()
    assert load["name"] == "Qwen/Qwen3-4B" and load["dtype"] == "bfloat16"


def test_app_main_ignores_the_config_locally(app_module, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    argv, load = _main_args(app_module, monkeypatch)
    assert argv is None and load["name"] is None  # sys.argv's (no flags): the bundled target
    argv, load = _main_args(app_module, monkeypatch, ["--dtype", "float32"])
    assert argv == ["--dtype", "float32"] and load["dtype"] == "float32"


def test_app_main_bad_config_on_a_space_is_a_clear_exit(app_module, monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/dart-demo")

    def broken():
        raise SpaceConfigError("spaces_config.yaml: launch.dtype must be ...")

    monkeypatch.setattr(space, "space_app_argv", broken)
    with pytest.raises(SystemExit, match="error: spaces_config.yaml: launch.dtype"):
        app_module.main()


# ---------------------------------------------------------------------------------------------- native bootstrap
class FakeRun:
    """subprocess.run stand-in: records commands, answers with the given return codes in turn."""

    def __init__(self, *codes: int):
        self.codes = list(codes)
        self.calls: list[tuple[list[str], dict]] = []

    def __call__(self, cmd, **kw):
        self.calls.append((list(cmd), kw))
        return subprocess.CompletedProcess(cmd, self.codes.pop(0))


def _bootstrap(run, *, env=None, importable=False, restarts=None):
    env = {"SPACE_ID": "someone/dart-demo"} if env is None else env
    restarts = [] if restarts is None else restarts
    return space.bootstrap_native(root=ROOT, env=env, run=run, importable=lambda: importable,
                                  restart=lambda: restarts.append(1))


def test_bootstrap_does_nothing_off_a_space():
    run = FakeRun()
    assert _bootstrap(run, env={}) == "not-a-space" and run.calls == []
    assert _bootstrap(run, env={"SPACE_ID": ""}) == "not-a-space"


def test_bootstrap_does_nothing_when_the_extension_imports():
    run = FakeRun()
    assert _bootstrap(run, importable=True) == "present" and run.calls == []


def test_bootstrap_builds_checks_and_restarts(monkeypatch, caplog):
    monkeypatch.setattr(space, "missing_build_tools", lambda: [])
    run, restarts = FakeRun(0, 0), []
    with caplog.at_level("INFO", logger="dart_core.space"):
        assert _bootstrap(run, restarts=restarts) == "built"
    (pip, pip_kw), (check, check_kw) = run.calls
    assert pip == [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", str(ROOT)]
    assert pip_kw["cwd"] == str(ROOT)
    assert check == [sys.executable, "-c", f"import {space.NATIVE_MODULE}"] and check_kw["cwd"] == str(ROOT)
    assert restarts == [1]
    assert "building it once" in caplog.text and "built dart_core._native" in caplog.text


def test_bootstrap_pip_failure_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(space, "missing_build_tools", lambda: [])
    run, restarts = FakeRun(1), []
    with pytest.raises(NativeBuildError, match=r"building dart_core._native failed \(pip exit 1\)"):
        _bootstrap(run, restarts=restarts)
    assert len(run.calls) == 1 and restarts == []


def test_bootstrap_import_check_failure_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(space, "missing_build_tools", lambda: [])
    run, restarts = FakeRun(0, 1), []
    with pytest.raises(NativeBuildError, match="fresh interpreter"):
        _bootstrap(run, restarts=restarts)
    assert restarts == []


def test_bootstrap_never_loops_after_a_restart(monkeypatch):
    monkeypatch.setattr(space, "missing_build_tools", lambda: [])
    run = FakeRun()
    env = {"SPACE_ID": "someone/dart-demo", space.BOOTSTRAPPED_ENV: "1"}
    with pytest.raises(NativeBuildError, match="still does not import after a restart"):
        _bootstrap(run, env=env)
    assert run.calls == []


def test_bootstrap_names_missing_build_tools(monkeypatch):
    monkeypatch.setattr(space, "missing_build_tools", lambda: ["cmake", "pybind11"])
    run = FakeRun()
    with pytest.raises(NativeBuildError, match="missing cmake, pybind11.*requirements.txt"):
        _bootstrap(run)
    assert run.calls == []


def test_missing_build_tools_lists_each(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    missing = space.missing_build_tools()
    assert missing[:3] == ["scikit-build-core", "pybind11", "cmake"] and "C++17 compiler" in missing[3]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/" + name)
    assert space.missing_build_tools() == []


def test_reexec_restarts_the_same_command(monkeypatch, tmp_path):
    script = tmp_path / "app.py"
    script.write_text("")
    calls = []
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.append((exe, argv)))
    monkeypatch.setattr(sys, "argv", [str(script), "--x"])
    monkeypatch.setenv(space.BOOTSTRAPPED_ENV, "")  # recorded, so the variable _reexec sets is undone afterwards
    monkeypatch.delenv(space.BOOTSTRAPPED_ENV)
    space._reexec()
    assert calls == [(sys.executable, [sys.executable, str(script), "--x"])]
    assert os.environ[space.BOOTSTRAPPED_ENV] == "1"
    monkeypatch.setattr(sys, "argv", ["-c"])
    with pytest.raises(NativeBuildError, match="restart the app"):
        space._reexec()


def test_real_bootstrap_is_a_no_op_here(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert space.bootstrap_native() == "not-a-space"
    monkeypatch.setenv("SPACE_ID", "someone/dart-demo")
    assert space.bootstrap_native() == "present"  # this checkout has the extension built (pip install -e .)


def test_requirements_carry_what_the_space_needs():
    reqs = {line.split("#")[0].strip().split(">")[0].split("=")[0].split("[")[0].lower()
            for line in (ROOT / "requirements.txt").read_text().splitlines() if line.split("#")[0].strip()}
    # the build tools of pyproject's [build-system] (an isolated build is not an option: it would fetch them and
    # could pull a second torch), cmake for scikit-build-core, and the config reader
    assert {"scikit-build-core", "pybind11", "cmake", "pyyaml", "gradio"} <= reqs
    assert "." not in reqs and "-e" not in reqs


# ---------------------------------------------------------------------------------------------- the build replay
@pytest.mark.slow
def test_space_build_replay(request, tmp_path):
    """Empty venv, requirements.txt, repository copied in, bootstrap builds the extension (space_build_replay.sh)."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("minutes long and needs PyPI: run with -m slow")
    proc = subprocess.run(["bash", str(ROOT / "tests" / "space_build_replay.sh"), str(tmp_path / "replay")],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "replay passed" in proc.stdout
    shutil.rmtree(tmp_path / "replay", ignore_errors=True)  # a venv with torch: ~1.5 GB (kept when it fails)
