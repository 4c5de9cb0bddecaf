"""One name per knob, one table of knobs (dart_core.presets), and one dtype name (dart_core.config.dtype_name)."""
from __future__ import annotations

import pytest
import torch

from dart_core.config import dtype_name
from dart_core.models.loader import DTYPE_ALIASES, resolve_dtype


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "bfloat16"), (torch.float16, "float16"),
                                        (torch.float32, "float32"), ("bfloat16", "bfloat16")])
def test_dtype_name(dtype, name):
    assert dtype_name(dtype) == name


def test_dtype_names_round_trip_through_the_one_alias_table():
    for alias, dtype in DTYPE_ALIASES.items():
        assert DTYPE_ALIASES[dtype_name(dtype)] is dtype
        assert resolve_dtype(alias, torch.device("cpu")) is dtype
    from dart_core.training import runner
    assert runner._save_dtype("bf16") is torch.bfloat16
