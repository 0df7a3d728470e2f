"""The streamed weights move into one mapping advised MADV_HUGEPAGE, unchanged and aligned."""
from __future__ import annotations

import mmap
import sys

import pytest
import torch

from qwen_serve.backends.torch_cpu.huge_pages import ALIGN, HUGE_PAGE, move_to_huge_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                                reason="MADV_HUGEPAGE is Linux's")


class Holder:
    def __init__(self, **tensors) -> None:
        self.names = tuple(tensors)
        for name, t in tensors.items():
            setattr(self, name, t)

    def streamed_tensors(self) -> tuple[str, ...]:
        return self.names


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping that holds address (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, stop = (int(x, 16) for x in head.split("-"))
            inside = start <= address < stop
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_tensors_keep_their_values_dtype_and_shape_in_one_advised_mapping():
    g = torch.Generator().manual_seed(0)
    a = Holder(codes=torch.randint(0, 256, (3, 5, 16, 16, 2), dtype=torch.uint8, generator=g),
               scale=torch.randn(3, 5, 16, generator=g).half(), zero=torch.randn(3, 5, 16, generator=g).half())
    b = Holder(blocked=torch.randn(7, 33, generator=g).bfloat16(), weight=None)
    want = {(id(h), n): getattr(h, n).clone() for h in (a, b) for n in h.names if getattr(h, n) is not None}
    moved = move_to_huge_pages([a, b, a])  # a layer listed twice (a tied table) moves once
    got = {(id(h), n): getattr(h, n) for h in (a, b) for n in h.names if getattr(h, n) is not None}
    assert moved == sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for t in want.values())
    assert b.weight is None
    pointers = sorted(t.data_ptr() for t in got.values())
    assert pointers[0] % HUGE_PAGE == 0 and all(p % ALIGN == 0 for p in pointers)
    assert pointers[-1] - pointers[0] < moved  # one run of memory
    for key, t in got.items():
        assert t.dtype == want[key].dtype and t.shape == want[key].shape and t.is_contiguous()
        assert torch.equal(t, want[key])
        assert "hg" in vm_flags(t.data_ptr())  # advised MADV_HUGEPAGE
    a.codes[0, 0, 0, 0, 0] = 7  # still writable, and the layer's own
    assert int(a.codes[0, 0, 0, 0, 0]) == 7


def test_a_loaded_model_streams_its_weights_from_the_advised_mapping(qwen3_tiny):
    from qwen_serve import LLM

    llm = LLM(str(qwen3_tiny), quant="int4", calibrate=False)
    model = llm.engine.executor
    tensors = [getattr(lin, n) for lin in model.linears() for n in lin.streamed_tensors() if getattr(lin, n) is not None]
    assert tensors and all("hg" in vm_flags(t.data_ptr()) for t in tensors)
