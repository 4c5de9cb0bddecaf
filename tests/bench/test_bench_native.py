"""benchmarks/bench_native.py --gemm: the row counts asked for, one table line per shape and row count, and the
refusals of a bad --rows (nothing is timed then)."""
import sys

import pytest

from dart_core import _native
from test_bench import _bench_script

bench_native = _bench_script("bench_native")


def _run(monkeypatch, *args):
    monkeypatch.setattr(sys, "argv", ["bench_native.py", "--gemm", *args])
    bench_native.main()


def test_gemm_times_the_row_counts_asked_for(monkeypatch, capsys):
    path = _native.small_gemm_path()
    _run(monkeypatch, "--rows", "1,3", "--reps", "1", "--threads", "1", "--paths", path)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "->" in line]
    shapes = [name for name, _, _ in bench_native.GEMM_SHAPES]
    assert [(line.split(" | ")[0][2:], line.split(" | ")[1]) for line in lines] == \
        [(name, m) for name in shapes for m in ("1", "3")]
    for line in lines:   # a positive rate for the path and for torch's large GEMM
        cells = line.strip("| ").split(" | ")
        assert float(cells[2]) > 0 and float(cells[3]) > 0
    assert _native.small_gemm_path() == path


@pytest.mark.parametrize("rows, says", [("0,3", "must be >= 1"), ("1,x", "comma-separated row counts")])
def test_gemm_refuses_bad_row_counts(monkeypatch, capsys, rows, says):
    with pytest.raises(SystemExit, match=says):
        _run(monkeypatch, "--rows", rows, "--reps", "1")
    assert "| shape |" not in capsys.readouterr().out
