"""The quantized layers' paths chosen by timing on this CPU (kernel_choice.py): every path agrees
with the float reference at every row class, the choice is cached per machine and build and
measured again when either changes, and QWEN_SERVE_KERNELS forces paths or fails in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qwen_serve.backends.torch_cpu import kernel_choice
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear, Int8Linear, Scratch
from qwen_serve.backends.torch_cpu.kernel_choice import ENV, choose_paths, describe, forced_paths
from qwen_serve.backends.torch_cpu.native import load_kernels
from qwen_serve.backends.torch_cpu.path_plan import PATHS, ROW_CLASSES, PathPlan, row_class
from qwen_serve.errors import ModelLoadError
from qwen_serve.quant import int4

KERNELS = load_kernels()
ROWS = [1, 5, 16, 40, 130]  # one per row class


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def tolerance(path: str, kernels) -> float:
    """Per path: tiles in float32 are the reference's own arithmetic; bf16 tiles keep 8 bits of
    mantissa (~0.3% on a matmul); the kernels quantize activations per group of 64, to int8
    with VNNI (~2% with an outlier channel) or int16 (~1e-4)."""
    if path == "tiles_f32":
        return 1e-5
    if path == "tiles_bf16":
        return 1e-2
    return 3e-2 if kernels.isa == "avx512" and kernels.vnni else 1e-3


def _activations(rows: int, width: int, seed: int) -> torch.Tensor:
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32))
    x[:, 7] *= 50.0
    return x


def _paths() -> list[str]:
    return [p for p in PATHS if p != "kernel" or KERNELS is not None]


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("out_features", [40, 300])  # a partial last block; several tiles
def test_every_int4_path_matches_the_float_reference_at_every_row_class(path, out_features):
    q = int4.quantize(np.random.default_rng(out_features).standard_normal((out_features, 192)).astype(np.float32))
    layer = Int4Linear(q, scratch=Scratch(floats=192 * 64))  # tiles of 64 rows
    layer.plan = PathPlan.fixed(path)
    reference = torch.from_numpy(int4.dequantize(q))
    for rows in ROWS:
        x = _activations(rows, 192, seed=rows)
        assert _rel(layer(x), x @ reference.T) < tolerance(path, KERNELS), rows


@pytest.mark.parametrize("path", _paths())
def test_every_int8_path_matches_the_float_reference_at_every_row_class(path):
    layer = Int8Linear(torch.randn(300, 128, generator=torch.Generator().manual_seed(1)), scratch=Scratch(floats=128 * 64))
    layer.plan = PathPlan.fixed(path)
    reference = layer.dequantize()
    for rows in ROWS:
        x = _activations(rows, 128, seed=rows)
        assert _rel(layer(x), x @ reference.T) < tolerance(path, KERNELS), rows


@pytest.mark.skipif(KERNELS is None or KERNELS.isa != "avx512", reason="the blocked layout needs AVX-512")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_unpacked_tile_holds_the_dequantized_rows_transposed(dtype):
    q = int4.quantize(np.random.default_rng(2).standard_normal((100, 256)).astype(np.float32))
    layer = Int4Linear(q, kernels=KERNELS)
    tile = torch.full((256, 7 * 16 + 5), float("nan"), dtype=dtype)  # wider than the blocks: a row stride
    KERNELS.ops.q4b_unpack_avx512_(layer.codes, layer.scale, layer.zero, 1, 7, tile)
    rows = torch.from_numpy(int4.dequantize(q))[16:100]  # blocks 1..6: rows 16..111, of which 100 exist
    assert torch.equal(tile[:, :84].T, rows.to(dtype))
    assert torch.equal(tile[:, 84:96], torch.zeros(256, 12, dtype=dtype))  # the padding rows of the last block
    assert tile[:, 96:].isnan().all()  # nothing written past the blocks asked for
    with pytest.raises(RuntimeError, match="out of range"):
        KERNELS.ops.q4b_unpack_avx512_(layer.codes, layer.scale, layer.zero, 5, 8, tile)


def test_each_row_class_takes_the_path_whose_worse_end_lags_least():
    seconds = {  # at rows 1, 2, 8, 9, 16, 17, 64, 65, 512
        "kernel": dict(zip(kernel_choice.PROBE_ROWS, [1, 1, 2, 2, 3, 3, 9, 9, 80])),
        "tiles_f32": dict(zip(kernel_choice.PROBE_ROWS, [50, 50, 50, 50, 50, 50, 52, 8, 40])),
    }
    assert kernel_choice._fastest(seconds).paths == ("kernel", "kernel", "kernel", "kernel", "tiles_f32")
    tied = {path: dict.fromkeys(kernel_choice.PROBE_ROWS, 1.0) for path in ("tiles_f32", "kernel")}
    assert kernel_choice._fastest(tied) == PathPlan.fixed("kernel")  # a tie goes to the kernel
    assert [row_class(n) for n in (1, 2, 8, 9, 16, 17, 64, 65, 512, 4096)] == [0, 1, 1, 2, 2, 3, 3, 4, 4, 4]


@pytest.fixture
def choices_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_choice, "cache_dir", lambda kind: tmp_path / kind)
    monkeypatch.delenv(ENV, raising=False)
    return tmp_path


def _layers() -> list:
    rng = np.random.default_rng(0)
    q = [int4.quantize(rng.standard_normal((n, 128)).astype(np.float32)) for n in (64, 64, 96)]
    return [Int4Linear(w) for w in q] + [Int8Linear(torch.randn(80, 64))]


def test_choices_are_measured_once_and_cached_per_machine(choices_dir, monkeypatch):
    layers = _layers()
    choices = choose_paths(layers, KERNELS)
    assert [c.name for c in choices] == ["int4 64x128", "int4 96x128", "int8 80x64"]
    assert layers[0].plan is layers[1].plan  # one plan per shape
    assert all(set(c.plan.paths) <= set(c.seconds) for c in choices)
    stored = kernel_choice.choices_file()
    assert stored.exists() and stored.parent == choices_dir / "kernels" / "choices"

    def no_measuring(*args):
        raise AssertionError("measured again")

    with monkeypatch.context() as patch:
        patch.setattr(kernel_choice, "_measure", no_measuring)
        again = choose_paths(_layers(), KERNELS)  # read back from the file
    assert [c.plan for c in again] == [c.plan for c in choices]
    assert [c.seconds for c in again] == [c.seconds for c in choices]

    measured = []
    real = kernel_choice._measure
    monkeypatch.setattr(kernel_choice, "_measure", lambda *args: measured.append(args[:3]) or real(*args))
    real_machine = kernel_choice.machine
    for change in ({"cpu": "another CPU"}, {"kernels": "another build"}):
        monkeypatch.setattr(kernel_choice, "machine", lambda change=change: {**real_machine(), **change})
        assert kernel_choice.choices_file() != stored
        choose_paths(_layers(), KERNELS)
    assert measured == [("int4", 64, 128), ("int4", 96, 128), ("int8", 80, 64)] * 2


def test_an_unreadable_choices_file_is_measured_again(choices_dir):
    path = kernel_choice.choices_file()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    assert choose_paths(_layers()[:1], KERNELS)[0].seconds
    assert "int4 64x128" in path.read_text()


def test_the_environment_forces_paths_over_the_measured_ones(choices_dir, monkeypatch):
    monkeypatch.setenv(ENV, "int4=tiles_bf16, int4:1=tiles_f32")
    layers = _layers()
    choices = choose_paths(layers, KERNELS)
    assert layers[0].plan.paths == ("tiles_f32",) + ("tiles_bf16",) * 4
    assert choices[0].forced == (True,) * len(ROW_CLASSES)
    assert choices[0].seconds == {}  # every class forced: nothing timed for it
    assert not any(choices[2].forced)  # int8 keeps its measured paths
    table = "\n".join(describe(choices))
    assert "int4 64x128" in table and "!" in table and "*" in table
    x = _activations(3, 128, seed=0)
    assert _rel(layers[0](x), x @ layers[0].dequantize().T) < 1e-2  # bf16 tiles, correct on any CPU


@pytest.mark.parametrize("text", ["int4", "int5=kernel", "int4=fast", "int4:3-7=kernel", "int4=kernel;int8=kernel"])
def test_a_bad_forced_path_is_a_one_line_error(text):
    with pytest.raises(ModelLoadError, match="is not KIND\\[:ROWS\\]=PATH") as error:
        forced_paths(text)
    assert "\n" not in str(error.value)
    assert forced_paths("") == {}
    assert forced_paths("int8:65-512=tiles_f32") == {("int8", 4): "tiles_f32"}


def test_forcing_a_kernel_this_machine_cannot_run_is_an_error(choices_dir, monkeypatch):
    monkeypatch.setenv(ENV, "int4=kernel")
    with pytest.raises(ModelLoadError, match="cannot run"):
        choose_paths([Int4Linear(int4.quantize(np.ones((16, 64), np.float32)), kernels=None)], None)
