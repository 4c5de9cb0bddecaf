"""Weights moved onto 2 MiB pages (dart_core/models/huge_pages.py): same values, tied stays tied, nothing moved
where the OS cannot, and the lean forward's outputs unchanged bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dart_core.engine.tree import DraftTree
from dart_core import hardware
from dart_core.models import huge_pages
from dart_core.hardware import transparent_huge_pages as thp_mode
from dart_core.models.huge_pages import HUGE_PAGE, huge_page_buffer, move_to_huge_pages
from dart_core.models.loader import load_target
from tiny_models import make_tiny_model_dir

THP_USABLE = thp_mode() in ("madvise", "always") and hasattr(__import__("mmap"), "MADV_HUGEPAGE")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(512, 768, bias=False)                        # 1.5 MB float32
        self.b = nn.Linear(768, 512, bias=False).to(torch.bfloat16)      # 0.75 MB bf16
        self.b.weight.requires_grad_(False)
        self.tied = nn.Linear(512, 768, bias=False)
        self.tied.weight = self.a.weight                                 # one parameter, two modules
        self.small = nn.Linear(16, 16)                                   # under MIN_BYTES: stays


@pytest.mark.skipif(not THP_USABLE, reason="no transparent huge pages in madvise/always mode here")
def test_parameters_move_with_their_values_and_ties():
    net = Net()
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    small_ptr = net.small.weight.data_ptr()
    placed = move_to_huge_pages(net)
    assert placed.reason is None and placed.nbytes >= (512 * 768 * 4 + 768 * 512 * 2)
    for name, p in net.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
        assert p.dtype == before[name].dtype and p.shape == before[name].shape
    assert net.tied.weight is net.a.weight and net.tied.weight.data_ptr() == net.a.weight.data_ptr()
    assert net.a.weight.data_ptr() % HUGE_PAGE == 0          # the arena starts on a 2 MiB boundary
    assert net.b.weight.data_ptr() % 64 == 0
    assert net.small.weight.data_ptr() == small_ptr
    assert net.a.weight.requires_grad and not net.b.weight.requires_grad
    # The kernel grants 2 MiB pages to the marked mapping (defrag compacts on fault in madvise mode).
    assert placed.huge is not None and placed.huge > 0, placed.describe()
    assert "on 2 MiB pages" in placed.describe()
    # Still a working module: autograd through the moved weight.
    y = net.a(torch.ones(1, 512)).sum()
    y.backward()
    assert net.a.weight.grad is not None and net.a.weight.grad.shape == (768, 512)


def test_nothing_moves_when_switched_off_or_unsupported(monkeypatch, tmp_path):
    net = Net()
    ptr = net.a.weight.data_ptr()
    monkeypatch.setenv("DART_HUGE_PAGES", "0")
    placed = move_to_huge_pages(net)
    assert placed.nbytes == 0 and placed.reason == "DART_HUGE_PAGES=0"
    assert net.a.weight.data_ptr() == ptr
    assert placed.describe() == "4 KiB pages (DART_HUGE_PAGES=0)"
    monkeypatch.delenv("DART_HUGE_PAGES")
    mode = tmp_path / "enabled"
    mode.write_text("always madvise [never]\n")
    monkeypatch.setattr(hardware, "THP_MODE_FILE", mode)
    assert thp_mode() == "never"
    assert "off (never)" in move_to_huge_pages(net).reason
    assert net.a.weight.data_ptr() == ptr
    monkeypatch.setattr(hardware, "THP_MODE_FILE", tmp_path / "missing")
    assert thp_mode() is None and "no transparent huge pages" in move_to_huge_pages(net).reason
    mode.write_text("always [madvise] never\n")
    monkeypatch.setattr(hardware, "THP_MODE_FILE", mode)
    assert thp_mode() == "madvise"
    assert move_to_huge_pages(nn.Linear(4, 4)).reason == "no large CPU parameters"


@pytest.mark.parametrize("nbytes", [1, 4096, HUGE_PAGE + 1])
def test_buffer_sizes(nbytes):
    buf, placed = huge_page_buffer(nbytes)
    assert buf.dtype == np.uint8 and buf.nbytes == nbytes and buf.flags.writeable
    buf[-1] = 3
    assert int(buf[-1]) == 3
    if placed.reason is None:
        assert buf.ctypes.data % HUGE_PAGE == 0 and placed.nbytes == nbytes


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_lean_forward_gives_the_same_bits_on_either_page_size(tmp_path, monkeypatch, model_type):
    """The same model loaded twice, its weights moved (MIN_BYTES lowered so the tiny model's matrices move) and
    not: prefill and a tree verify give bit-identical logits."""
    path = make_tiny_model_dir(tmp_path, model_type=model_type)
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 0)
    moved = load_target(str(path), dtype="float32", device="cpu")
    monkeypatch.setenv("DART_HUGE_PAGES", "0")
    kept = load_target(str(path), dtype="float32", device="cpu")
    assert kept.fast.weight_pages.reason == "DART_HUGE_PAGES=0"
    if THP_USABLE:
        assert moved.fast.weight_pages.reason is None and moved.fast.weight_pages.nbytes > 0
    prompt = list(range(3, 40))
    tree = DraftTree.from_parents([7, 8, 9, 10], [-1, 0, 0, 1])
    outs = []
    for target in (moved, kept):
        session = target.new_session(64)
        first = session.prefill(prompt).logits
        outs.append((first, session.verify(tree).logits.all()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
