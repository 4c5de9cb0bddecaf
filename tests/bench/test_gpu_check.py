"""benchmarks/gpu_check.py, the prepared GPU run, smoke-tested on the CPU with its tiny configuration:
the script a lent GPU machine would run must not be the first thing to break there."""
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_on_cpu_and_finds_every_answer_lossless(tmp_path, capsys):
    gpu_check = load_script()
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--configs", "tiny", "--reps", "1", "--prefix", "32",
                           "--max-new-tokens", "12", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["lossless"] and all(r["identical"] for r in report["lossless"])
    (row,) = report["timings"]
    assert row["config"] == "tiny" and row["dart_draft_ms"] > 0 and row["eagle3_draft_ms"] > 0
    assert "EAGLE-3 / DART" in capsys.readouterr().out


def test_gpu_check_refuses_unknown_configs_and_a_missing_gpu():
    gpu_check = load_script()
    with pytest.raises(SystemExit, match="unknown --configs"):
        gpu_check.main(["--device", "cpu", "--configs", "qwen3-999b"])
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no GPU is visible"):
            gpu_check.main(["--device", "cuda"])
