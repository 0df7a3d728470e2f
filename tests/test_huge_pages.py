"""The streamed weights move into one mapping advised MADV_HUGEPAGE, unchanged and aligned; the KV
cache's pools are carved from one such mapping, each from a 2 MiB boundary, resident only where
written."""
from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest
import torch

from qwen_serve.backends.torch_cpu.huge_pages import ALIGN, HUGE_PAGE, move_to_huge_pages
from qwen_serve.backends.torch_cpu.kv_storage import TorchKVStorage

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                                reason="MADV_HUGEPAGE is Linux's")


class Holder:
    def __init__(self, **tensors) -> None:
        self.names = tuple(tensors)
        for name, t in tensors.items():
            setattr(self, name, t)

    def streamed_tensors(self) -> tuple[str, ...]:
        return self.names


def smaps_field(address: int, field: str) -> list[str]:
    """A field (VmFlags, Rss, ...) of the mapping that holds address (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, stop = (int(x, 16) for x in head.split("-"))
            inside = start <= address < stop
        elif inside and head == f"{field}:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def vm_flags(address: int) -> list[str]:
    return smaps_field(address, "VmFlags")


def resident_kib(address: int) -> int:
    return int(smaps_field(address, "Rss")[0])


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kv_pools_start_on_huge_pages_and_become_resident_where_written(dtype):
    storage = TorchKVStorage(3, 2, 64, dtype, block_size=16, slab_blocks=4, max_blocks=64)
    storage.ensure_blocks(4)
    pools = storage.keys + storage.values
    assert all(t.data_ptr() % HUGE_PAGE == 0 and "hg" in vm_flags(t.data_ptr()) for t in pools)
    assert len({t.data_ptr() for t in pools}) == 6
    assert resident_kib(pools[0].data_ptr()) == 0  # nothing resident before the first write
    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(5, 2, 64, generator=g), torch.randn(5, 2, 64, generator=g)
    slots = torch.tensor([0, 17, 3, 40, 63])
    storage.write(1, slots, keys, values)
    assert 0 < resident_kib(pools[0].data_ptr()) <= 2 * HUGE_PAGE // 1024  # layer 1's keys and values: a page each
    got_k, got_v = storage.read(1, slots)
    assert torch.equal(got_k, keys.to(dtype).float()) and torch.equal(got_v, values.to(dtype).float())
    before = [t.data_ptr() for t in storage.keys + storage.values]
    storage.ensure_blocks(8)  # a growth is a longer view of the same pools
    assert [t.data_ptr() for t in storage.keys + storage.values] == before
    assert storage.keys[1].shape[0] == 8 * 16 and torch.equal(storage.read(1, slots)[0], got_k)


def test_kv_pools_stay_in_small_pages_when_asked_even_where_the_heap_was_advised_huge():
    # numpy advises MADV_HUGEPAGE over its large arrays; the advice stays on the heap's addresses
    # after the array is freed, where torch's allocator hands them out again
    for _ in range(4):
        torch.empty(16 << 20, dtype=torch.uint8)  # freed at once; frees raise glibc's mmap threshold: big blocks from the heap
        np.ones(16 << 20, dtype=np.uint8)
    storage = TorchKVStorage(2, 2, 64, torch.float32, block_size=16, slab_blocks=4, max_blocks=64, huge_pages=False)
    storage.ensure_blocks(4)
    pools = storage.keys + storage.values
    assert all("nh" in vm_flags(t.data_ptr()) and "hg" not in vm_flags(t.data_ptr()) for t in pools)
    storage.write(0, torch.tensor([0, 63]), torch.ones(2, 2, 64), torch.ones(2, 2, 64))
    assert torch.equal(storage.read(0, torch.tensor([63]))[1], torch.ones(1, 2, 64))
