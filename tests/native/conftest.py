"""Fixtures the native tests share."""
import pytest

from dart_core import _native


@pytest.fixture(params=_native.small_gemm_paths())
def gemm_path(request):
    """Forces one kernel path for the test (the decoder's GEMMs included), then restores the previous one: every path
    this CPU runs is tested."""
    before = _native.small_gemm_path()
    _native.small_gemm_set_path(request.param)
    yield request.param
    _native.small_gemm_set_path(before)
