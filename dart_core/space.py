"""The hosted Hugging Face Space: one config file, the README front matter derived from it, app flags, native build.

``spaces_config.yaml`` (repository root) is the single source of the Space. Its top-level keys, except ``launch``,
are Spaces settings and become README.md's YAML front matter; ``launch`` holds app.py's settings, which app.py reads
itself when ``SPACE_ID`` is set (Spaces starts ``python app.py`` with no flags).

    python -m dart_core.space front-matter --write    # rewrite README.md's front matter from the config
    python -m dart_core.space front-matter --check    # exit 1 when README.md disagrees (or the config is invalid)
    python -m dart_core.space argv                    # the app flags the Space runs with

Light on purpose (no torch, no Gradio, no native extension): app.py imports it before anything else, to build the
extension on a Space (``bootstrap_native``). On the Space, ``cpu_fallback`` swaps the configured Hub models for the
bundled CPU ones when there is no CUDA (with a banner for the page), and ``gpu_decorator`` wraps the engine handlers
in ``spaces.GPU`` when the ZeroGPU package is installed (a no-op elsewhere).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, ClassVar, Mapping, Sequence

import yaml

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]   # dart_core/space.py -> the repository
CONFIG_NAME = "spaces_config.yaml"
LAUNCH_KEY = "launch"  # our section; everything else in the config is a Spaces setting

# Every key the Spaces config reference (huggingface.co/docs/hub/spaces-config-reference) accepts, plus `license`
# (generic repo-card metadata the Hub reads on any repo). A key outside this set is a typo or not a Spaces setting.
SPACES_KEYS = frozenset({
    "title", "short_description", "emoji", "colorFrom", "colorTo", "sdk", "python_version", "sdk_version",
    "suggested_hardware", "suggested_storage", "app_file", "app_port", "base_path", "fullWidth", "header",
    "models", "datasets", "tags", "thumbnail", "pinned", "hf_oauth", "hf_oauth_scopes",
    "hf_oauth_expiration_minutes", "hf_oauth_authorized_org", "disable_embedding", "startup_duration_timeout",
    "custom_headers", "preload_from_hub", "license",
})
REQUIRED_KEYS = ("title", "sdk", "sdk_version", "app_file", "python_version")
COLORS = ("red", "yellow", "green", "blue", "indigo", "purple", "pink", "gray")
# Hardware flavours (huggingface_hub.SpaceHardware); tests check this list against the installed huggingface_hub.
HARDWARE = ("cpu-basic", "cpu-upgrade", "zero-a10g", "t4-small", "t4-medium", "l4x1", "l4x4", "l40sx1", "l40sx4",
            "l40sx8", "a10g-small", "a10g-large", "a10g-largex2", "a10g-largex4", "a100-large", "a100x4", "a100x8",
            "rtx-pro-6000", "rtx-pro-6000x2", "rtx-pro-6000x4", "rtx-pro-6000x8")
ZEROGPU_PYTHONS = ("3.10", "3.12")  # the only Python versions ZeroGPU hardware runs
FORBIDDEN_PRELOAD_FILES = ("full.trie",)  # the original full N-gram trie: 43.5 GB, never preloaded
REPOS_WITH_FULL_TRIE = ("fvliang/dart-qwen3-ngram",)  # never preloaded whole (the launch's N-gram repo neither)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_DURATION = re.compile(r"^\d+(s|m|h)$")


class SpaceConfigError(ValueError):
    """spaces_config.yaml (or README.md's front matter) is invalid; the message names the field and the fix."""


class NativeBuildError(RuntimeError):
    """The C++ extension could not be built or imported on the Space; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------- launch settings
@dataclass(frozen=True)
class LaunchSettings:
    """app.py's settings on the Space (the ``launch`` section); each field maps to one app.py flag. None (or
    False) leaves the flag out, so app.py's own default applies: defaults live in one place, app.py."""
    base_model: str | None = None
    dart_model: str | None = None
    ngram_model: str | None = None
    use_small_ngram: bool = False
    eagle3_model: str | None = None
    compare_eagle3: bool = False
    template_name: str | None = None
    device: str | None = None
    dtype: str | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None

    # field -> app.py flag (store_true flags for the booleans)
    FLAGS: ClassVar[dict[str, str]] = {
        "base_model": "--base-model-name-or-path", "dart_model": "--dart-model-name-or-path",
        "ngram_model": "--ngram-model-name-or-path", "use_small_ngram": "--small-ngram",
        "eagle3_model": "--eagle3-model-name-or-path", "compare_eagle3": "--compare-eagle3",
        "template_name": "--template-name", "device": "--device", "dtype": "--dtype",
        "max_new_tokens": "--max-new-tokens", "max_length": "--max-length",
    }

    @classmethod
    def from_mapping(cls, data: Any) -> "LaunchSettings":
        where = f"{CONFIG_NAME}: {LAUNCH_KEY}"
        if not isinstance(data, Mapping):
            raise SpaceConfigError(f"{where} must be a mapping of app settings (e.g. `base_model: Qwen/Qwen3-4B`)")
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise SpaceConfigError(f"{where}.{unknown[0]} is not a launch setting; the settings are: "
                                   f"{', '.join(names)}")
        for key, value in data.items():
            kind = str(names[key].type)  # annotations are strings here (from __future__ import annotations)
            want = bool if kind == "bool" else int if kind.startswith("int") else str
            ok = (isinstance(value, want) and not (want is int and isinstance(value, bool))) or \
                 (value is None and "None" in kind)
            if not ok:
                what = {bool: "true or false", int: "an integer", str: "a string"}[want]
                raise SpaceConfigError(f"{where}.{key} must be {what}, got {value!r}")
        s = cls(**data)
        if s.dtype not in (None, "auto", "bfloat16", "float16", "float32"):
            raise SpaceConfigError(f"{where}.dtype must be auto, bfloat16, float16 or float32, got {s.dtype!r}")
        if s.max_new_tokens is not None and s.max_new_tokens < 1:
            raise SpaceConfigError(f"{where}.max_new_tokens must be >= 1, got {s.max_new_tokens}")
        if s.max_length is not None and s.max_length < 2:
            raise SpaceConfigError(f"{where}.max_length must be >= 2, got {s.max_length}")
        if s.max_length is not None and s.max_new_tokens is not None and s.max_length <= s.max_new_tokens:
            raise SpaceConfigError(f"{where}.max_length ({s.max_length}) must exceed max_new_tokens "
                                   f"({s.max_new_tokens}): it bounds prompt + answer")
        return s

    def to_argv(self) -> list[str]:
        """The app.py flags for these settings (unset ones left out: app.py's defaults apply)."""
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            flag = self.FLAGS[f.name]
            argv += [flag] if value is True else [flag, str(value)]
        return argv

    def hub_repos(self) -> list[str]:
        """The Hub repositories these settings load (those that are not local paths)."""
        ids = (self.base_model, self.dart_model, self.ngram_model, self.eagle3_model)
        return [r for r in ids if r and r.lower() != "none" and "/" in r and _REPO_ID.match(r)
                and not Path(r).expanduser().exists()]


# ---------------------------------------------------------------------------------------------- the config
@dataclass(frozen=True)
class SpaceConfig:
    settings: dict[str, Any]   # the Spaces settings, in file order (the front matter, before derived fields)
    launch: LaunchSettings
    path: Path

    def front_matter(self) -> dict[str, Any]:
        """README front matter: the settings, plus `models` from the launch settings unless given (so the Space
        page links the models it runs; Spaces cannot find them in our code, which takes ids from this file)."""
        fm = dict(self.settings)
        if "models" not in fm and self.launch.hub_repos():
            fm["models"] = self.launch.hub_repos()
        return fm

    def app_argv(self) -> list[str]:
        """app.py's argv on the Space: the launch settings, served on 0.0.0.0 (the Space proxies port 7860)."""
        return self.launch.to_argv() + ["--listen"]


def gradio_pin(requirements: Path) -> str | None:
    """The exact gradio version requirements.txt pins (``gradio==X``, extras allowed), or None."""
    for line in requirements.read_text().splitlines():
        m = re.match(r"^\s*gradio(\[[^\]]*\])?\s*==\s*([\w.+-]+)\s*(#.*)?$", line)
        if m:
            return m.group(2)
    return None


def parse_preload(entry: str) -> tuple[str, list[str] | None, str | None]:
    """``"repo [file1,file2 [revision]]"`` -> (repo, files or None for the whole repo, revision)."""
    parts = entry.split()
    if not 1 <= len(parts) <= 3:
        raise SpaceConfigError(f"{CONFIG_NAME}: preload_from_hub entry {entry!r} must be 'REPO', 'REPO FILE1,FILE2' "
                               "or 'REPO FILE1,FILE2 COMMIT'")
    files = [f for f in parts[1].split(",") if f] if len(parts) > 1 else None
    return parts[0], files, parts[2] if len(parts) > 2 else None


def validate(settings: Mapping[str, Any], launch: LaunchSettings, *, root: Path | None = None) -> None:
    """Raise SpaceConfigError naming the first field Spaces would reject or that disagrees with the repository."""
    def fail(key: str, why: str) -> None:
        raise SpaceConfigError(f"{CONFIG_NAME}: {key}: {why}")

    unknown = sorted(set(settings) - SPACES_KEYS)
    if unknown:
        fail(unknown[0], "not a setting Spaces accepts (see https://huggingface.co/docs/hub/spaces-config-reference); "
                         f"remove it, or put app settings under `{LAUNCH_KEY}:`")
    for key in REQUIRED_KEYS:
        if key not in settings:
            fail(key, "missing; the Space needs it")
    for key in ("title", "short_description", "sdk", "sdk_version", "app_file", "python_version",
                "suggested_hardware", "startup_duration_timeout", "emoji", "license"):
        if key in settings and not isinstance(settings[key], str):
            fail(key, f"must be a string, got {settings[key]!r}" + (" (quote it: 3.10 unquoted reads as 3.1)"
                                                                    if key == "python_version" else ""))
    if settings["sdk"] != "gradio":
        fail("sdk", f"this app is a Gradio app: use `sdk: gradio`, not {settings['sdk']!r}")
    if not re.fullmatch(r"3\.\d+(\.\d+)?", settings["python_version"]):
        fail("python_version", f"must be '3.x' or '3.x.x', got {settings['python_version']!r}")
    for key in ("colorFrom", "colorTo"):
        if key in settings and settings[key] not in COLORS:
            fail(key, f"must be one of {', '.join(COLORS)}, got {settings[key]!r}")
    hw = settings.get("suggested_hardware")
    if hw is not None and hw not in HARDWARE:
        fail("suggested_hardware", f"{hw!r} is not a Spaces hardware flavour; use one of {', '.join(HARDWARE)}")
    if hw == "zero-a10g" and settings["python_version"] not in ZEROGPU_PYTHONS:
        fail("python_version", f"ZeroGPU runs Python {' or '.join(ZEROGPU_PYTHONS)} only")
    if len(settings.get("short_description", "")) > 60:
        fail("short_description", "Spaces allows 60 characters at most")
    if "startup_duration_timeout" in settings and not _DURATION.match(settings["startup_duration_timeout"]):
        fail("startup_duration_timeout", f"must be a duration like 30m or 1h, got "
                                         f"{settings['startup_duration_timeout']!r}")
    for key in ("models", "datasets", "tags", "preload_from_hub"):
        value = settings.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            fail(key, "must be a list of strings")
    preloaded: dict[str, list[str] | None] = {}
    for entry in settings.get("preload_from_hub") or []:
        repo, files, _ = parse_preload(entry)
        if not _REPO_ID.match(repo):
            fail("preload_from_hub", f"{repo!r} is not a Hub repo id (owner/name)")
        bad = [f for f in files or [] if Path(f).name in FORBIDDEN_PRELOAD_FILES]
        if bad:
            fail("preload_from_hub", f"{entry!r} lists {bad[0]} (43.5 GB); preload small.trie and launch with "
                                     "use_small_ngram: true")
        preloaded[repo] = files
    # The N-gram repo holds full.trie: preloading it whole would pull 43.5 GB, so it must name its files.
    for repo in (*REPOS_WITH_FULL_TRIE, launch.ngram_model):
        if repo in preloaded and preloaded[repo] is None:
            fail("preload_from_hub", f"{repo!r} is preloaded whole, which includes full.trie (43.5 GB); write "
                                     f"'{repo} small.trie'")
    for repo in launch.hub_repos():
        if repo not in preloaded:
            fail("preload_from_hub", f"{LAUNCH_KEY} loads {repo!r} but it is not preloaded, so every cold start "
                                     f"would download it: add `- {repo}` (with file names for a large repo)")
    if root is not None:
        if not (root / settings["app_file"]).is_file():
            fail("app_file", f"{settings['app_file']!r} does not exist in {root}")
        req = root / "requirements.txt"
        pin = gradio_pin(req) if req.is_file() else None
        if pin is None:
            fail("sdk_version", f"requirements.txt pins no gradio version; add `gradio=={settings['sdk_version']}`")
        if pin != settings["sdk_version"]:
            fail("sdk_version", f"{settings['sdk_version']} but requirements.txt pins gradio=={pin}; the Space "
                                "builder installs gradio==sdk_version next to requirements.txt: make them equal")


def load_config(path: str | Path | None = None) -> SpaceConfig:
    """Read and validate spaces_config.yaml (default: the repository's); checks it against its directory's
    requirements.txt and app file too."""
    path = Path(path) if path is not None else REPO_ROOT / CONFIG_NAME
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpaceConfigError(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SpaceConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SpaceConfigError(f"{path} must be a YAML mapping of Space settings")
    launch = LaunchSettings.from_mapping(data.pop(LAUNCH_KEY, {}) or {})
    validate(data, launch, root=path.parent)
    return SpaceConfig(settings=data, launch=launch, path=path)


# ---------------------------------------------------------------------------------------------- README front matter
def render_front_matter(cfg: SpaceConfig) -> str:
    """The ``---``-delimited YAML block that opens README.md."""
    body = yaml.safe_dump(cfg.front_matter(), sort_keys=False, allow_unicode=True, default_flow_style=False,
                          width=1000)
    return f"---\n{body}---\n"


def split_front_matter(text: str) -> tuple[str | None, str]:
    """(front matter YAML text or None, the rest of the file)."""
    m = re.match(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*(\r?\n|\Z)", text, re.S | re.M)
    if not m:
        return None, text
    return m.group(1), text[m.end():]


def write_front_matter(cfg: SpaceConfig, readme: Path) -> bool:
    """Put the config's front matter at the top of README.md (replacing any), keeping the rest byte for byte.
    True when the file changed."""
    text = readme.read_text(encoding="utf-8")
    _, rest = split_front_matter(text)
    new = render_front_matter(cfg) + ("\n" + rest if rest and not rest.startswith("\n") else rest)
    if new == text:
        return False
    readme.write_text(new, encoding="utf-8")
    return True


def front_matter_problems(cfg: SpaceConfig, readme: Path) -> list[str]:
    """How README.md's front matter differs from the config (empty list: they agree)."""
    block, _ = split_front_matter(readme.read_text(encoding="utf-8"))
    if block is None:
        return [f"{readme.name} has no front matter (a '---' YAML block on its first line)"]
    try:
        have = yaml.safe_load(block) or {}
    except yaml.YAMLError as e:
        return [f"{readme.name}'s front matter is not valid YAML: {e}"]
    want = cfg.front_matter()
    if not isinstance(have, dict):
        return [f"{readme.name}'s front matter is not a mapping"]
    problems = [f"{k}: README has {have.get(k)!r}, {CONFIG_NAME} says {want.get(k)!r}"
                for k in list(want) + [k for k in have if k not in want] if have.get(k) != want.get(k)]
    if not problems and list(have) != list(want):
        problems.append("keys are in another order than in the config")
    return problems


# ---------------------------------------------------------------------------------------------- on the Space
def on_space(env: Mapping[str, str] | None = None) -> bool:
    """True inside a Hugging Face Space (the runtime sets SPACE_ID)."""
    return bool((os.environ if env is None else env).get("SPACE_ID"))


def space_app_argv(path: str | Path | None = None) -> list[str]:
    """The app.py argv for the Space, from spaces_config.yaml."""
    return load_config(path).app_argv()


# ---------------------------------------------------------------------------------------------- GPU or not
#: launch settings whose app.py flags name the models (and their precision / device); without a GPU on the Space
#: they are dropped for the bundled CPU models.
MODEL_SETTINGS = ("base_model", "dart_model", "ngram_model", "use_small_ngram", "eagle3_model", "dtype", "device")


def cpu_fallback(argv: Sequence[str], *, cuda_available: bool, path: str | Path | None = None
                 ) -> tuple[list[str], str | None]:
    """The Space's app argv for this machine, and a banner for the page (None when all is as configured).

    Without CUDA, Hub models named in ``argv`` (billions of parameters, bf16) cannot serve on the CPU: their
    flags (and dtype / device) are dropped, so the app falls back to the bundled CPU models with the same engines
    and page, and the banner says so and why. ``path``: the spaces_config.yaml for the suggested hardware."""
    argv = list(argv)
    flags = {LaunchSettings.FLAGS[k] for k in MODEL_SETTINGS}
    repos = [v for f, v in zip(argv, argv[1:]) if f in flags and v.lower() != "none" and _REPO_ID.match(v)
             and "/" in v and not Path(v).expanduser().exists()]
    if cuda_available or not repos:
        return argv, None
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a in (LaunchSettings.FLAGS["use_small_ngram"], "--use-small-ngram"):   # app.py takes both spellings
            continue
        if a in flags:
            next(it, None)  # the flag's value
            continue
        out.append(a)
    try:
        hw = load_config(path).settings.get("suggested_hardware")
    except SpaceConfigError:
        hw = None
    banner = (f"No GPU on this machine (CUDA is not available), so this Space runs the bundled CPU models "
              f"(SmolLM2-135M-Instruct with its DART head and N-gram table) instead of the configured "
              f"{', '.join(repos)}, which need a GPU. To run those, pick GPU hardware in the Space's settings"
              + (f" (suggested: {hw})." if hw else "."))
    return out, banner


def zerogpu_module(env: Mapping[str, str] | None = None) -> ModuleType | None:
    """The ``spaces`` package when running on a Space that installs it (ZeroGPU hardware), else None.
    Imported early by app.py: ZeroGPU wants ``spaces`` imported before CUDA is touched."""
    if not on_space(env):
        return None
    try:
        return importlib.import_module("spaces")
    except ImportError:
        return None


def on_zerogpu(env: Mapping[str, str] | None = None) -> bool:
    """True on ZeroGPU hardware: a GPU is attached only inside ``spaces.GPU`` calls (the runtime sets
    SPACES_ZERO_GPU), so start-up work (warm-up) must not run CUDA kernels."""
    env = os.environ if env is None else env
    return zerogpu_module(env) is not None and bool(env.get("SPACES_ZERO_GPU"))


def gpu_decorator(env: Mapping[str, str] | None = None, *, duration: int | None = None
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``spaces.GPU`` on a Space that has the ``spaces`` package (it asks ZeroGPU for a GPU for the call and is
    a no-op on other hardware), else the identity. Wraps plain and generator handlers alike. The serving path
    never uses torch.compile, which ZeroGPU does not support."""
    mod = zerogpu_module(env)
    if mod is None:
        return lambda fn: fn

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        return mod.GPU(fn) if duration is None else mod.GPU(fn, duration=duration)
    return wrap


NATIVE_MODULE = "dart_core._native"      # built from native/ (CMake target _native, installed into dart_core/)
BOOTSTRAPPED_ENV = "DART_SPACE_NATIVE_BOOTSTRAPPED"  # set across the one re-exec after a build: never loop


def _native_importable() -> bool:
    try:
        importlib.import_module(NATIVE_MODULE)
        return True
    except ImportError:
        return False


def missing_build_tools() -> list[str]:
    """What `pip install --no-build-isolation` needs and this interpreter lacks (requirements.txt brings them)."""
    missing = [name for mod, name in (("scikit_build_core", "scikit-build-core"), ("pybind11", "pybind11"))
               if importlib.util.find_spec(mod) is None]
    if shutil.which("cmake") is None and importlib.util.find_spec("cmake") is None:
        missing.append("cmake")
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing.append("a C++17 compiler (g++; on a Space add `build-essential` to packages.txt)")
    return missing


def native_install_command(root: Path) -> list[str]:
    # Editable, not a plain `pip install .`: Spaces runs `python app.py` in the checkout, whose own dart_core/
    # (no compiled module in it) comes first on sys.path and would hide a copy installed into site-packages. An
    # editable install leaves that package where it is and maps dart_core._native onto the built module.
    # --no-deps: requirements.txt already installed the runtime; --no-build-isolation: use its build tools
    # instead of fetching them (and never a second torch).
    return [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", str(root)]


def _reexec() -> None:
    """Restart this interpreter with the same command: the editable install's import hook (a .pth file) is
    read only at interpreter start."""
    if not sys.argv or not Path(sys.argv[0]).is_file():
        raise NativeBuildError(f"{NATIVE_MODULE} was built; restart the app to load it")
    os.environ[BOOTSTRAPPED_ENV] = "1"
    logging.getLogger(__name__).info("restarting %s to load the new extension", sys.argv[0])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.argv])


def bootstrap_native(*, root: Path = REPO_ROOT, env: Mapping[str, str] | None = None,
                     run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
                     importable: Callable[[], bool] = _native_importable,
                     restart: Callable[[], None] = _reexec) -> str:
    """Build the C++ extension on a Space when it is missing (Spaces installs requirements.txt before copying the
    repository, so it cannot list `.`). Returns what happened: "not-a-space", "present" or "built" (after
    ``restart``, which normally does not return). Raises NativeBuildError with the cause and the fix."""
    env = os.environ if env is None else env
    if not on_space(env):
        return "not-a-space"     # local runs: `pip install -e .` built it (or ngram.require_native says how)
    if importable():
        return "present"
    if env.get(BOOTSTRAPPED_ENV):
        raise NativeBuildError(f"{NATIVE_MODULE} was built but still does not import after a restart; see the pip "
                               "output above, and check that app.py runs from the repository root")
    missing = missing_build_tools()
    if missing:
        raise NativeBuildError(f"cannot build {NATIVE_MODULE} on this Space: missing {', '.join(missing)}. Add "
                               "them to requirements.txt (scikit-build-core, pybind11, cmake, ninja) and rebuild")
    cmd = native_install_command(root)
    if not logging.getLogger().handlers:  # app.py has not configured logging yet: make this build visible
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    log.info("Space: %s is not built; building it once: %s", NATIVE_MODULE, " ".join(cmd))
    t0 = time.monotonic()
    proc = run(cmd, cwd=str(root))     # pip's output goes straight to the Space's log
    if proc.returncode != 0:
        raise NativeBuildError(f"building {NATIVE_MODULE} failed (pip exit {proc.returncode}); the compiler "
                               f"output is in the log above. Command: {' '.join(cmd)}")
    log.info("Space: built %s in %.0f s", NATIVE_MODULE, time.monotonic() - t0)
    # A fresh interpreter in the checkout is what the app will be: check the import there before restarting.
    check = run([sys.executable, "-c", f"import {NATIVE_MODULE}"], cwd=str(root))
    if check.returncode != 0:
        raise NativeBuildError(f"{NATIVE_MODULE} was built but a fresh interpreter in {root} cannot import it; "
                               "see the traceback above")
    restart()
    return "built"


# ---------------------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dart_core.space", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    fm = sub.add_parser("front-matter", help="README.md's front matter from spaces_config.yaml")
    mode = fm.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite README.md's front matter")
    mode.add_argument("--check", action="store_true", help="exit 1 when README.md disagrees with the config")
    for sp in (fm, sub.add_parser("argv", help="print the app.py flags the Space runs with")):
        sp.add_argument("--config", type=Path, default=REPO_ROOT / CONFIG_NAME, help="default: %(default)s")
    fm.add_argument("--readme", type=Path, default=None, help="default: README.md next to the config")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except SpaceConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.cmd == "argv":
        print(" ".join(cfg.app_argv()))
        return 0
    readme = args.readme or cfg.path.parent / "README.md"
    if args.write:
        print(f"{readme}: {'front matter written' if write_front_matter(cfg, readme) else 'already up to date'}")
        return 0
    if args.check:
        problems = front_matter_problems(cfg, readme)
        for line in problems:
            print(f"{readme.name} disagrees with {CONFIG_NAME}: {line}", file=sys.stderr)
        if problems:
            print("fix: python -m dart_core.space front-matter --write", file=sys.stderr)
        return 1 if problems else 0
    sys.stdout.write(render_front_matter(cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
