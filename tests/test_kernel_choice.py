"""The packed layers' paths chosen by timing on this CPU (kernel_choice.py): every path of the int4,
int8 and bf16 layers agrees with the float reference at every row class, the choice is cached per
machine and build and measured again when either changes, a bf16 layer takes oneDNN's layout for
all its rows or none, and QWEN_SERVE_KERNELS forces paths or fails in one line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from qwen_serve.backends.torch_cpu import kernel_choice
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear, Int8Linear
from qwen_serve.backends.torch_cpu.kernel_choice import ENV, choose_paths, describe, forced_paths
from qwen_serve.backends.torch_cpu.linear import DenseLinear
from qwen_serve.backends.torch_cpu.native import has_fast_bf16_matmul, load_kernels
from qwen_serve.backends.torch_cpu.path_plan import ONEDNN, PATHS, ROW_CLASSES, PathPlan, row_class
from qwen_serve.backends.torch_cpu.tiles import Scratch
from qwen_serve.errors import ModelLoadError
from qwen_serve.quant import int4

KERNELS = load_kernels()
ROWS = [1, 5, 16, 40, 130]  # one per row class


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def tolerance(path: str, kernels, kind: str = "int4") -> float:
    """Per path: tiles in float32 are the reference's own arithmetic; bf16 tiles keep 8 bits of
    mantissa (~0.3% on a matmul); the quantized kernels quantize activations per group of 64, to
    int8 (VNNI; AVX2: ~2% with an outlier channel) or int16 (~1e-4); the bf16 kernel and oneDNN
    round x to bf16 where the CPU multiplies bf16 natively, else compute in float32."""
    if path == "tiles_f32":
        return 1e-5
    if path == "tiles_bf16":
        return 1e-2
    if kind == "bf16":
        native = kernels.bf16 if path == "kernel" else has_fast_bf16_matmul()
        return 1e-2 if native else 1e-5
    return 3e-2 if kernels.int8_activations else 1e-3


def _activations(rows: int, width: int, seed: int) -> torch.Tensor:
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32))
    x[:, 7] *= 50.0
    return x


def _paths(kind: str = "int4") -> list[str]:
    return [p for p in PATHS if (p != "kernel" or KERNELS is not None) and (p != ONEDNN or kind == "bf16")]


BLOCKED_BF16 = pytest.mark.skipif(KERNELS is None or KERNELS.isa not in ("avx512", "avx2"),
                                  reason="the blocked bf16 layouts need the AVX-512 or AVX2 kernels")


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


@BLOCKED_BF16
@pytest.mark.parametrize("path", _paths("bf16"))
@pytest.mark.parametrize("out_features", [40, 300])  # a partial last block; several tiles
def test_every_bf16_path_matches_the_float_reference_at_every_row_class(path, out_features):
    weight = torch.randn(out_features, 192, generator=torch.Generator().manual_seed(out_features)).bfloat16()
    layer = DenseLinear(weight, scratch=Scratch(floats=192 * 64))  # tiles of 64 rows
    layer.plan = PathPlan.fixed(path)
    layer.prepack(KERNELS)
    assert (layer.blocked is None) == (path == ONEDNN)  # oneDNN's layout, or the blocked one
    for rows in ROWS:
        x = _activations(rows, 192, seed=rows)
        assert _rel(layer(x), x @ weight.float().T) < tolerance(path, KERNELS, "bf16"), rows


@BLOCKED_BF16
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_unpacked_bf16_tile_holds_the_rows_transposed(dtype):
    weight = torch.randn(100, 256, generator=torch.Generator().manual_seed(3)).bfloat16()
    layer = DenseLinear(weight)
    layer.plan = PathPlan.fixed("kernel")
    layer.prepack(KERNELS)
    tile = torch.full((256, 7 * 16 + 5), float("nan"), dtype=dtype)  # wider than the blocks: a row stride
    layer._unpack(1, 7, tile)  # AVX-512's pairs through its kernel, AVX2's columns in torch
    assert torch.equal(tile[:, :84].T, weight[16:100].to(dtype))  # blocks 1..6: rows 16..111, 100 exist
    assert torch.equal(tile[:, 84:96], torch.zeros(256, 12, dtype=dtype))  # the padding rows of the last block
    assert tile[:, 96:].isnan().all()  # nothing written past the blocks asked for
    if KERNELS.isa == "avx512":
        with pytest.raises(RuntimeError, match="out of range"):
            KERNELS.ops.bf16b_unpack_avx512_(layer.blocked, 5, 8, tile)


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
    seconds = {  # at rows 1, 2, 8, 9, 16, 17, 64, 65, 192, 193, 512
        "kernel": dict(zip(kernel_choice.PROBE_ROWS, [1, 1, 2, 2, 3, 3, 9, 9, 25, 25, 80])),
        "tiles_f32": dict(zip(kernel_choice.PROBE_ROWS, [50, 50, 50, 50, 50, 50, 52, 14, 22, 22, 40])),
    }
    assert kernel_choice._fastest(seconds).paths == ("kernel",) * 5 + ("tiles_f32",)
    tied = {path: dict.fromkeys(kernel_choice.PROBE_ROWS, 1.0) for path in ("tiles_f32", "kernel")}
    assert kernel_choice._fastest(tied) == PathPlan.fixed("kernel")  # a tie goes to the kernel
    assert [row_class(n) for n in (1, 2, 8, 9, 16, 17, 64, 65, 192, 193, 512, 4096)] == \
        [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 5]


def test_onednn_takes_every_row_class_or_none():
    def timings(*per_probe):
        return dict(zip(kernel_choice.PROBE_ROWS, per_probe))

    # The kernel leads at 1 row, oneDNN elsewhere (an AMX CPU): the mix lags 1.5x at 8 rows
    # (tiles), oneDNN only 1.2x at 1 row, so oneDNN takes every class.
    amx = {"kernel": timings(4, 5, 6, 6, 11, 11, 40, 40, 110, 110, 290),
           "tiles_bf16": timings(9, 9, 9, 9, 9, 9, 12, 12, 18, 18, 40),
           ONEDNN: timings(4.8, 4, 4, 4, 4.2, 4.2, 7, 7, 14, 14, 34)}
    assert kernel_choice._fastest(amx) == PathPlan.fixed(ONEDNN)
    # The kernel leads to 16 rows, tiles beyond, oneDNN a little behind both: the mix.
    zen = {"kernel": timings(4, 4, 5, 5, 6, 6, 20, 20, 110, 110, 300),
           "tiles_f32": timings(20, 20, 20, 20, 20, 20, 21, 21, 45, 45, 100),
           ONEDNN: timings(6, 6, 7, 7, 8, 8, 22, 22, 50, 50, 110)}
    assert kernel_choice._fastest(zen).paths == ("kernel",) * 4 + ("tiles_f32",) * 2
    assert kernel_choice._with_forced(PathPlan.fixed(ONEDNN), {4: "tiles_f32", 5: "tiles_f32"}).paths == \
        ("kernel",) * 4 + ("tiles_f32",) * 2
    assert kernel_choice._with_forced(PathPlan.fixed("kernel"), {c: ONEDNN for c in range(6)}) == PathPlan.fixed(ONEDNN)


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
    for change in ({"cpu": "another CPU"}, {"kernels": "another build"}, {"rows": [1, 2, 300]}):
        monkeypatch.setattr(kernel_choice, "machine", lambda change=change: {**real_machine(), **change})
        assert kernel_choice.choices_file() != stored
        choose_paths(_layers(), KERNELS)
    assert measured == [("int4", 64, 128), ("int4", 96, 128), ("int8", 80, 64)] * 3


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
    assert layers[0].plan.paths == ("tiles_f32",) + ("tiles_bf16",) * (len(ROW_CLASSES) - 1)
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
    assert forced_paths("int8:193-512=tiles_f32") == {("int8", 5): "tiles_f32"}


@pytest.mark.parametrize("text", ["int4=onednn", "bf16:65-192=onednn"])
def test_onednn_is_forced_for_bf16_and_all_its_rows_only(text):
    with pytest.raises(ModelLoadError, match="onednn is a layout of bf16 weights") as error:
        forced_paths(text)
    assert "\n" not in str(error.value)


@BLOCKED_BF16
@pytest.mark.parametrize("forced, blocked", [("bf16=onednn", False), ("bf16=kernel,bf16:193-512=tiles_f32", True)])
def test_bf16_projections_are_laid_out_as_their_plan_says(choices_dir, monkeypatch, forced, blocked):
    layers = [DenseLinear(torch.randn(64, 128).bfloat16()), DenseLinear(torch.randn(64, 128).bfloat16())]
    head = DenseLinear(torch.randn(80, 128).bfloat16())
    head.as_head(KERNELS)  # blocked already: the head keeps its kernel, never a plan
    monkeypatch.setenv(ENV, forced)
    choices = choose_paths([*layers, head], KERNELS)
    assert [c.name for c in choices] == ["bf16 64x128"] and head.plan is None
    for layer in layers:
        layer.prepack(KERNELS)
        assert (layer.blocked is not None) == blocked
    x = _activations(100, 128, seed=1)
    assert _rel(layers[0](x), x @ layers[0].dequantize().T) < 1e-2
    monkeypatch.delenv(ENV)
    measured = choose_paths([DenseLinear(torch.randn(48, 128).bfloat16())], KERNELS)[0]
    assert set(measured.seconds) == {"kernel", "tiles_f32"} | ({"tiles_bf16", ONEDNN} if has_fast_bf16_matmul() else set())


def test_forcing_a_kernel_this_machine_cannot_run_is_an_error(choices_dir, monkeypatch):
    monkeypatch.setenv(ENV, "int4=kernel")
    with pytest.raises(ModelLoadError, match="cannot run"):
        choose_paths([Int4Linear(int4.quantize(np.ones((16, 64), np.float32)), kernels=None)], None)


@pytest.mark.parametrize("in_kernels", [False, True], ids=["torch solve", "C++ solve"])
def test_the_delta_rule_block_is_the_fastest_timed_and_kept_with_the_choices(choices_dir, monkeypatch, in_kernels):
    """Every candidate block is timed once per machine and solve; a layer takes the fastest, read
    back from the file after (synthetic timings there decide), and the kernel table shows them. The
    timings with torch's solve and with the C++ one are kept apart: the layers use one or the other."""
    from qwen_serve.backends.torch_cpu import delta_block

    kernels = KERNELS.ops if in_kernels else None
    block, seconds = delta_block.choose_block(2, 8, 16, kernels)
    assert set(seconds) == set(delta_block.CANDIDATES) and seconds[block] == min(seconds.values())
    stored = kernel_choice.read_timings(kernel_choice.choices_file())
    key, path = delta_block.shape_key(2, 8, 16), delta_block.PATHS[in_kernels]
    assert list(stored[key]) == [path] and stored[key][path] == seconds
    slowest = max(delta_block.CANDIDATES, key=seconds.get)
    stored[key][path] = {b: (0.001 if b == slowest else 0.002) for b in delta_block.CANDIDATES}
    kernel_choice.write_timings(kernel_choice.choices_file(), stored)
    monkeypatch.setattr(delta_block, "_time", lambda *args: pytest.fail("measured again"))
    again, _ = delta_block.choose_block(2, 8, 16, kernels)
    assert again == slowest
    line = delta_block.describe(2, 8, 16, stored[key][path], again)
    assert f"{slowest}: 1.0*" in line and line.count("*") == 1
