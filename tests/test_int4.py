"""int4 weights (check 6): the canonical format, the torch kernels against a plain
numpy reference, and quality on real SmolLM2 weights."""
from __future__ import annotations

import numpy as np
import pytest

from qwen_serve.quant import int4

# --- the canonical format ---------------------------------------------------------------------


def test_relative_error_on_standard_normal_weights():
    w = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    assert 0.08 <= int4.relative_error(w, int4.quantize(w)) <= 0.10


def test_packed_shapes_and_dtypes():
    q = int4.quantize(np.random.default_rng(1).standard_normal((3072, 1024)).astype(np.float32))
    assert q.packed.shape == (3072, 512) and q.packed.dtype == np.uint8
    assert q.scale.shape == (3072, 16) and q.scale.dtype == np.float16
    assert q.zero.shape == (3072, 16) and q.zero.dtype == np.float16
    assert q.shape == (3072, 1024)
    assert q.nbytes() == int4.nbytes(q) == 3072 * 512 + 2 * (3072 * 16 * 2)  # 1,769,472 B


def test_nibble_order_and_zero_convention_by_hand():
    # One group holding 0..15 four times: min 0, max 15 -> scale 1, zero 0, codes = the values.
    w = np.tile(np.arange(16, dtype=np.float32), 4)[None, :]
    q = int4.quantize(w)
    assert q.scale[0, 0] == 1.0 and q.zero[0, 0] == 0.0
    assert q.packed[0, :3].tolist() == [0x10, 0x32, 0x54]  # column 2j low nibble, 2j + 1 high
    shifted = int4.quantize(w * 0.5 - 3.0)  # scale 0.5, zero -3 (the value of code 0)
    assert shifted.scale[0, 0] == 0.5 and shifted.zero[0, 0] == -3.0
    assert np.array_equal(shifted.packed, q.packed)
    assert np.array_equal(int4.dequantize(shifted), w * 0.5 - 3.0)


def _min_max_error(w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Weighted squared error per group of the plain min-max grid with its scale and zero
    rounded to float16 as stored, written out independently."""
    groups = w.reshape(w.shape[0], -1, 64).astype(np.float64)
    low = groups.min(-1, keepdims=True).astype(np.float16).astype(np.float64)
    step = ((groups.max(-1, keepdims=True) - groups.min(-1, keepdims=True)) / 15).astype(np.float16).astype(np.float64)
    step = np.where(step > 0, step, 1.0)
    rounded = np.clip(np.rint((groups - low) / step), 0, 15) * step + low
    return (h.reshape(1, -1, 64) * (rounded - groups) ** 2).sum(-1)


def _weighted_error(w: np.ndarray, q: int4.Int4Weight, h: np.ndarray) -> np.ndarray:
    err = (int4.dequantize(q).astype(np.float64) - w).reshape(w.shape[0], -1, 64)
    return (h.reshape(1, -1, 64) * err ** 2).sum(-1)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_search_never_loses_to_the_min_max_grid(weighted):
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 3.0, size=(64, 1))).astype(np.float32)
    w[3, 64:128] += 40.0  # a group far from zero
    w[5, 10] = 25.0  # an outlier weight
    w[10:40] = 10.0 + 0.1 * rng.standard_normal((30, 256))  # narrow groups far from zero, where
    w[40:64] = -20.0 + 0.05 * rng.standard_normal((24, 256))  # float16 rounds zero coarsely
    h = rng.exponential(size=256).astype(np.float32) if weighted else np.ones(256, dtype=np.float32)
    q = int4.quantize(w, h if weighted else None)
    ours, plain = _weighted_error(w, q, h), _min_max_error(w, h)
    # min-max is the search's first candidate (the slack: float32 sums against float64 here)
    assert np.all(ours <= plain * (1 + 1e-3) + 1e-9)
    assert ours.sum() < 0.9 * plain.sum()  # and the search finds real gains


def test_importance_moves_precision_to_the_columns_that_matter():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((256, 128)).astype(np.float32)
    important = np.zeros(128, dtype=bool)
    important[rng.choice(128, 16, replace=False)] = True
    h = np.where(important, 100.0, 1.0).astype(np.float32)
    plain = np.abs(int4.dequantize(int4.quantize(w)) - w)
    weighted = np.abs(int4.dequantize(int4.quantize(w, h)) - w)
    assert weighted[:, important].mean() < 0.8 * plain[:, important].mean()
    assert _weighted_error(w, int4.quantize(w, h), h).sum() < _weighted_error(w, int4.quantize(w), h).sum()


@pytest.mark.parametrize("importance", [np.ones(64), -np.ones(128), np.full(128, np.nan)])
def test_bad_importance_is_refused(importance):
    with pytest.raises(ValueError, match="importance"):
        int4.quantize(np.zeros((4, 128), dtype=np.float32), importance)


def test_columns_the_calibration_left_silent_are_still_searched():
    w = np.random.default_rng(7).standard_normal((8, 128)).astype(np.float32)
    h = np.r_[np.zeros(64), np.ones(64)].astype(np.float32)
    q = int4.quantize(w, h)
    # a floor keeps them: within the silent group every column weighs the same, as without importance
    plain = int4.quantize(w)
    assert np.array_equal(q.packed[:, :32], plain.packed[:, :32])
    assert np.array_equal(q.scale[:, 0], plain.scale[:, 0]) and np.array_equal(q.zero[:, 0], plain.zero[:, 0])


def test_huge_importance_is_only_a_ratio():
    w = np.random.default_rng(8).standard_normal((16, 128)).astype(np.float32)
    h = np.random.default_rng(9).exponential(size=128).astype(np.float32)
    assert np.array_equal(int4.quantize(w, h * 1e30).packed, int4.quantize(w, h).packed)


def test_constant_groups_survive_exactly():
    w = np.full((2, 128), 0.75, dtype=np.float32)
    w[1, 64:] = 0.0
    assert np.array_equal(int4.dequantize(int4.quantize(w)), w)


def test_rejects_widths_that_are_not_whole_groups():
    assert not int4.can_quantize((8, 96))
    with pytest.raises(ValueError, match="multiple of 64"):
        int4.quantize(np.zeros((8, 96), dtype=np.float32))


# --- the torch layers, against x @ dequantize(W).T in numpy -------------------------------------

torch = pytest.importorskip("torch")
from float32_tiles import use_float32_tiles  # noqa: E402

from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear, Int6Linear, Int8Linear  # noqa: E402
from qwen_serve.backends.torch_cpu.native import load_kernels  # noqa: E402
from qwen_serve.backends.torch_cpu.path_plan import PathPlan  # noqa: E402
from qwen_serve.backends.torch_cpu.tiles import Scratch  # noqa: E402
from qwen_serve.conformance.reference import int6_rows_on_grid  # noqa: E402

ROW_COUNTS = [1, 3, 8, 9, 40, 130]  # decode sizes, a partial block of 8, then (past 16) the tile path


# The kernels carry activations as int16 per group of 64; an outlier 50x the rest leaves the
# other 63 values ~9 bits, a few 1e-4 of relative error: still 100x below int4's own ~9%. The
# VNNI kernels carry int8 (as llama.cpp's Q4_0 / Q8_0 dot products do): ~2% with that outlier.
TOLERANCE = 1e-3
INT8_ACTIVATIONS_TOLERANCE = 3e-2


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def _activations(rows: int, width: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    x[:, 7] *= 50.0  # an outlier channel, as real hidden states have
    return x


@pytest.fixture(params=["native", "fallback"])
def path(request, monkeypatch):
    if request.param == "native" and load_kernels() is None:
        pytest.skip("no C compiler: the native kernels are unavailable")
    return request.param


def _use(layer, path):
    if path == "fallback":
        layer.kernels = None
    return layer


def _planned(layer, gemm_dtype: torch.dtype):
    """The kernel up to 16 rows, tiles multiplied in gemm_dtype past them."""
    tiles = "tiles_bf16" if gemm_dtype == torch.bfloat16 else "tiles_f32"
    layer.plan = PathPlan(("kernel",) * 3 + (tiles,) * 3)
    return layer


def _tolerance(layer, rows: int, gemm_dtype: torch.dtype) -> float:
    """The kernels' for decode sizes, the tiles' GEMM's past them."""
    kernels = layer.kernels
    if kernels is not None and layer.plan.path(rows) == "kernel":
        return INT8_ACTIVATIONS_TOLERANCE if kernels.int8_activations else TOLERANCE
    return GEMM_TOLERANCE[gemm_dtype]


# Prefill-sized calls multiply dequantized tiles in bfloat16 where the CPU does that natively:
# bf16 keeps 8 bits of mantissa, ~0.3% of relative error on a matmul.
GEMM_TOLERANCE = {torch.float32: TOLERANCE, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("gemm_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_int4_linear_matches_dequantized_matmul(rows, path, gemm_dtype):
    w = np.random.default_rng(3).standard_normal((320, 192)).astype(np.float32)
    q = int4.quantize(w)
    bias = np.linspace(-1, 1, 320, dtype=np.float32)
    scratch = Scratch(floats=192 * 100)  # 4 tiles
    layer = _use(_planned(Int4Linear(q, torch.from_numpy(bias), scratch=scratch), gemm_dtype), path)
    x = _activations(rows, 192, seed=rows)
    expected = x @ int4.dequantize(q).T + bias
    assert _rel(layer(torch.from_numpy(x)).numpy(), expected) < _tolerance(layer, rows, gemm_dtype)


@pytest.mark.parametrize("gemm_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_int8_rows_match_numpy(rows, path, gemm_dtype):
    w = np.random.default_rng(4).standard_normal((200, 128)).astype(np.float32)
    layer = _use(_planned(Int8Linear(torch.from_numpy(w), scratch=Scratch(floats=128 * 64)), gemm_dtype), path)
    step = np.abs(w).max(axis=1, keepdims=True) / 127
    w8 = np.clip(np.rint(w / step), -127, 127) * step
    x = _activations(rows, 128, seed=rows + 1)
    assert _rel(layer(torch.from_numpy(x)).numpy(), x @ w8.T) < _tolerance(layer, rows, gemm_dtype)
    assert _rel(w8, w) < 0.01


@pytest.mark.parametrize("gemm_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", ROW_COUNTS)
def test_int6_rows_match_numpy(rows, path, gemm_dtype):
    w = np.random.default_rng(6).standard_normal((200, 192)).astype(np.float32)
    w[3, 64:128] = 0.0  # an all-zero group
    layer = _use(_planned(Int6Linear(torch.from_numpy(w), scratch=Scratch(floats=192 * 64)), gemm_dtype), path)
    w6 = int6_rows_on_grid(w)
    assert np.array_equal(layer.dequantize().numpy(), w6)  # the layout keeps every code and scale
    x = _activations(rows, 192, seed=rows + 2)
    assert _rel(layer(torch.from_numpy(x)).numpy(), x @ w6.T) < _tolerance(layer, rows, gemm_dtype)
    # 63 levels per group of 64: ~2.4% on normal weights (int8 rows: ~0.8%, int4 groups: ~9%)
    assert _rel(w6, w) < 0.03


def test_lookup_gives_dequantized_rows():
    w = np.random.default_rng(5).standard_normal((50, 128)).astype(np.float32)
    q = int4.quantize(w)
    ids = torch.tensor([0, 49, 7, 7])
    assert np.array_equal(Int4Linear(q).lookup(ids).numpy(), int4.dequantize(q)[[0, 49, 7, 7]])
    assert np.array_equal(Int4Linear(q).dequantize().numpy(), int4.dequantize(q))
    i8 = Int8Linear(torch.from_numpy(w))
    assert _rel(i8.lookup(ids).numpy(), w[[0, 49, 7, 7]]) < 0.01


def test_nbytes_are_the_stored_bytes():
    q = int4.quantize(np.zeros((256, 1024), dtype=np.float32))
    assert Int4Linear(q).nbytes() == 256 * 512 + 2 * 256 * 16 * 2
    int8 = Int8Linear(torch.zeros(1000, 64))
    rows = 1008 if int8.blocked else 1000  # the blocked layout fills its last block of 16 rows
    assert int8.nbytes() == rows * 64 + rows * 4
    assert Int6Linear(torch.zeros(1000, 128)).nbytes() == 1008 * 2 * (48 + 2)  # 6 bits + a float16 per 64


# --- loading a checkpoint with quant="int4" -----------------------------------------------------

from qwen_serve import LLM, SamplingParams  # noqa: E402
from qwen_serve.backends.torch_cpu.backend import TorchBackend  # noqa: E402
from qwen_serve.backends.torch_cpu.linear import DenseLinear  # noqa: E402
from qwen_serve.checkpoints.checkpoint import load_checkpoint  # noqa: E402
from qwen_serve.errors import ModelLoadError  # noqa: E402


def test_int4_load_quantizes_projections_and_keeps_one_int8_table(qwen3_tiny):
    model = TorchBackend(head_quant="int8").load_model(load_checkpoint(qwen3_tiny), "float32", "int4")
    assert all(isinstance(linear, Int4Linear) for layer in model.layers for linear in layer.linears())
    assert isinstance(model.embed, Int8Linear) and model.lm_head is model.embed  # tied: one table
    # By hand for the tiny geometry (hidden 64, 4 q / 2 kv heads of 16, intermediate 128, 2 layers):
    # 36,864 projection weights per layer at 0.5625 B (4 bits + fp16 scale and zero per 64),
    # 151,936 x 64 int8 + a float32 scale per row, and 384 float32 norm weights (2 x (64 + 64 + 16 + 16) + 64).
    assert model.weight_bytes() == 2 * 36_864 * 9 // 16 + 151_936 * (64 + 4) + 384 * 4
    assert TorchBackend().load_model(load_checkpoint(qwen3_tiny), "float32", "none").weight_bytes() == \
        2 * 36_864 * 4 + 151_936 * 64 * 4 + 384 * 4


@pytest.mark.parametrize("disabled", ["", "avx512_vnni"])
def test_the_table_is_int6_where_its_kernel_runs_and_int8_elsewhere(qwen3_tiny, monkeypatch, disabled):
    from qwen_serve.backends.torch_cpu import native

    monkeypatch.setenv(native.DISABLE_ENV, disabled)
    kernels = load_kernels()
    int6 = kernels is not None and kernels.isa == "avx512" and kernels.vnni
    model = TorchBackend().load_model(load_checkpoint(qwen3_tiny), "float32", "int4")
    assert type(model.embed) is (Int6Linear if int6 else Int8Linear) and model.lm_head is model.embed
    # 151,936 x 64: per row one group of 64 codes at 6 bits and its float16 scale, or 64 int8 + a float32
    table = 151_936 * (48 + 2) if int6 else 151_936 * (64 + 4)
    assert model.weight_bytes() == 2 * 36_864 * 9 // 16 + table + 384 * 4
    with pytest.raises(ValueError, match="head_quant must be one of"):
        TorchBackend(head_quant="int5")


def test_widths_that_are_not_whole_groups_stay_float(qwen3_untied):
    model = TorchBackend().load_model(load_checkpoint(qwen3_untied), "float32", "int4")
    layer = model.layers[0]
    assert isinstance(layer.mixer.qkv.linear, DenseLinear)  # input width 96
    assert isinstance(layer.mlp.down_proj, Int4Linear)  # input width 192 = 3 groups
    assert isinstance(model.lm_head, Int8Linear) and model.lm_head is not model.embed


def test_unknown_quantization_is_a_load_error(qwen3_tiny):
    with pytest.raises(ModelLoadError, match="int8"):
        TorchBackend().load_model(load_checkpoint(qwen3_tiny), "float32", "int8")


@pytest.mark.parametrize("disabled", ["", "avx512_vnni"])
def test_int4_model_equals_transformers_on_the_dequantized_weights(qwen3_tiny, monkeypatch, disabled):
    """The whole int4 path (loading, kernels, tied int6 or int8 table) against transformers' own forward
    on weights replaced by numpy's dequantization of the same quantization: with this CPU's
    kernels, and with VNNI's int8-activation kernels taken away (AVX-512 CPUs)."""
    from qwen_serve.backends.torch_cpu import native
    from qwen_serve.conformance.reference import assert_first_tokens_match, hf_model_on_int4_grid, table_kind

    monkeypatch.setenv(native.DISABLE_ENV, disabled)
    llm = LLM(str(qwen3_tiny), quant="int4", calibrate=False)  # the quantization below: no importance
    hf = hf_model_on_int4_grid(qwen3_tiny, table_kind(llm))
    use_float32_tiles(llm)
    kernels = llm.parts.executor.layers[0].mixer.qkv.linear.kernels
    # int8 activations: ~0.6% relative error per matmul (the kernels are exact otherwise: 6e-8 from
    # the same rounded activations), up to 0.047 on this model's top-5 logprobs with the int8 table,
    # 0.082 with the int6 one (the same rounding of slightly different hidden states)
    tolerance = 0.1 if kernels is not None and kernels.int8_activations else 1e-2
    assert_first_tokens_match(llm, hf, ("Hello, world!", "The quick brown fox", "1 2 3 4 5"), tolerance)


# --- check 6 on real weights: SmolLM2-135M-Instruct ---------------------------------------------

CHECK6_TEXTS = [
    "The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village,",
    "The mitochondria is the", "SELECT name FROM users WHERE", "1, 2, 3, 5, 8, 13,",
    "Water boils at a temperature of", "The best way to learn a new language is",
    "In 1969, Neil Armstrong", "import numpy as np\nx = np.", "Dear Sir or Madam, I am writing to",
    "The opposite of hot is", "My favourite fruit is the", "To make a cup of tea, first",
    "Photosynthesis converts sunlight into", "The quick brown fox jumps over the",
    "Il était une fois", "The largest planet in our solar system is", "A haiku about the sea:\n",
    "Q: What is 7 times 8?\nA:", "The French Revolution began in", "<html>\n<head>\n<title>",
    "Roses are red, violets are", "The chemical symbol for gold is",
]
CHECK6_CHATS = ["What is the capital of Japan?", "Write a haiku about autumn.", "Explain gravity in one sentence.",
                "List three primary colors.", "How do I reverse a list in Python?", "Who wrote Hamlet?"]


def _top5(llm) -> list[list[int]]:
    prompts = [llm.tokenizer.encode(t) for t in CHECK6_TEXTS]
    prompts += [llm.tokenizer.encode_chat([{"role": "user", "content": c}]) for c in CHECK6_CHATS]
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, logprobs=5))
    return [[t for t, _ in sorted(o.logprobs[0].items(), key=lambda kv: -kv[1])[:5]] for o in outs]


@pytest.fixture(scope="module")
def smollm2_int4(smollm2_path):
    return LLM(str(smollm2_path), quant="int4")


def _overlap(reference, got) -> float:
    return float(np.mean([len(set(ref) & set(q)) / 5 for ref, q in zip(reference, got)]))


def test_calibration_lifts_top5_agreement_with_float_on_smollm2(smollm2_path, smollm2_int4):
    reference = _top5(LLM(str(smollm2_path)))
    calibrated = _top5(smollm2_int4)
    plain = _top5(LLM(str(smollm2_path), quant="int4", calibrate=False))
    assert len(reference) >= 20
    # The float model's next token is among int4's top 5 (measured: 29 of 30 prompts).
    assert np.mean([ref[0] in q for ref, q in zip(reference, calibrated)]) > 0.8
    # Mean overlap of the two top-5 sets, measured 0.83 calibrated against 0.73 without
    # calibration (0.67 with the plain min-max grid). SmolLM2's float weights are themselves
    # dequantized Q4_1 in groups of 32, which groups of 64 cannot reproduce.
    assert _overlap(reference, calibrated) > 0.8
    assert _overlap(reference, calibrated) > _overlap(reference, plain) + 0.03


POEMS = ("Write a haiku about the sea.", "Write a short poem about mountains.", "Describe a cat in two sentences.")


def test_int4_greedy_text_on_smollm2_is_sensible(smollm2_int4):
    """Words, and not one phrase repeated, in most of three greedy poems: a 135M model's greedy
    text can fall into a loop at a near-tie that arithmetic as close as two SiLU implementations
    (4e-7 apart) tips either way, while a broken kernel loops or babbles in all of them."""
    params = SamplingParams(max_tokens=48)
    france, *poems = smollm2_int4.chat([[{"role": "user", "content": "What is the capital of France?"}]] +
                                       [[{"role": "user", "content": poem}] for poem in POEMS], params)
    assert "Paris" in france.text
    sensible = 0
    for poem in poems:
        words = poem.text.split()
        assert len(words) >= 8 and sum(w.strip(".,!?'\"").isalpha() for w in words) / len(words) > 0.8, poem.text
        sensible += len(set(words)) / len(words) > 0.5  # not one phrase repeated
    assert sensible >= 2, [poem.text for poem in poems]
