"""KV memory arithmetic and `qwen-serve kv-table`: the published figures exactly, a
config.json of another geometry (hybrid sliding window), budgets, and one-line errors. Every
expected number is worked out here from the formula by hand, not taken from the code."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from qwen_serve.kv.memory import blocks_spanned, format_bytes, kv_bytes_per_token
from qwen_serve.server.kv_table import FORMATS, main

KiB, MiB, GiB = 2**10, 2**20, 2**30


def kv_table(capsys, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    return {m["name"]: m for m in report["models"]}


def at(model: dict, context: int) -> dict:
    return next(row for row in model["contexts"] if row["context"] == context)


def markdown_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """(model, first data cell) -> the row's cells, for every table row of the markdown output."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| Qwen") or line.startswith("| my-"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0], cells[1])] = cells
    return rows


def test_the_formula():
    assert kv_bytes_per_token(28, 8, 128, 2) == 2 * 28 * 8 * 128 * 2 == 112 * KiB  # Qwen3-0.6B bf16
    assert kv_bytes_per_token(28, 8, 128, 1, scale_bytes=4) == 2 * 28 * 8 * 132
    assert blocks_spanned(8, 4) == 3 and blocks_spanned(4, 4) == 2 and blocks_spanned(1, 16) == 1
    assert (format_bytes(144 * KiB), format_bytes(4.5 * GiB), format_bytes(1.75 * MiB)) == ("144 KiB", "4.5 GiB", "1.75 MiB")


def test_spec_figures_for_qwen3_8b(capsys):
    m = kv_table(capsys, "Qwen3-8B", "--context", "4096", "32768")["Qwen3-8B"]
    per_token = 2 * 36 * 8 * 128 * 2  # L=36, H_kv=8, d=128, bf16
    assert m["bytes_per_token"]["bfloat16"] == per_token == 144 * KiB
    assert at(m, 4096)["bytes"]["bfloat16"] == 576 * MiB
    assert at(m, 32768)["bytes"]["bfloat16"] == 4.5 * GiB
    assert m["bytes_per_token"]["int8_without_scales"] * 2 == per_token  # "int8 exactly half"
    assert m["bytes_per_token"]["mha_bfloat16"] == 4 * per_token  # 32 kv heads instead of 8
    assert main(["Qwen3-8B", "--context", "4096", "32768"]) == 0
    rows = markdown_rows(capsys.readouterr().out)
    assert rows[("Qwen3-8B", "36")][5] == "144 KiB"  # the bf16 / token column
    assert rows[("Qwen3-8B", "4,096")][3] == "576 MiB" and rows[("Qwen3-8B", "32,768")][3] == "4.5 GiB"


def test_spec_figures_for_qwen3_0_6b(capsys):
    m = kv_table(capsys, "0.6b", "--context", "4k")["Qwen3-0.6B"]
    n = 4096
    bf16 = 2 * 28 * 8 * 128 * 2 * n
    int8 = 2 * 28 * 8 * (128 + 4) * n  # one float32 scale per (token, layer, kv head) for K and V
    mha = 2 * 28 * 16 * 128 * 2 * n  # 16 kv heads, as many as query heads
    row = at(m, n)["bytes"]
    assert (row["bfloat16"], row["int8"], row["int8_without_scales"], row["mha_bfloat16"]) == (bf16, int8, bf16 // 2, mha)
    assert (bf16, int8, bf16 // 2, mha) == (448 * MiB, 231 * MiB, 224 * MiB, 896 * MiB)
    assert round(m["bf16_over_int8"], 2) == 1.94
    assert m["bytes_per_block"]["bfloat16"] == 1.75 * MiB  # 16 tokens
    assert main(["0.6b", "--context", "4k"]) == 0
    cells = markdown_rows(capsys.readouterr().out)[("Qwen3-0.6B", "4,096")]
    assert cells[2:7] == ["896 MiB", "448 MiB", "231 MiB", "224 MiB", "896 MiB"]  # fp32, bf16, int8, no scales, MHA


def test_family_geometries_and_weights(capsys):
    models = kv_table(capsys)
    assert list(models) == ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B", "Qwen3-14B", "Qwen3-32B", "Qwen3-30B-A3B"]
    assert {name: (m["layers"], m["heads"], m["kv_heads"], m["head_dim"]) for name, m in models.items()} == {
        "Qwen3-0.6B": (28, 16, 8, 128), "Qwen3-1.7B": (28, 16, 8, 128), "Qwen3-4B": (36, 32, 8, 128),
        "Qwen3-8B": (36, 32, 8, 128), "Qwen3-14B": (40, 40, 8, 128), "Qwen3-32B": (64, 64, 8, 128),
        "Qwen3-30B-A3B": (48, 32, 4, 128)}
    assert models["Qwen3-4B"]["bytes_per_token"] == models["Qwen3-8B"]["bytes_per_token"]  # same layers, KV heads and head_dim
    # Qwen3-0.6B's parameters by hand: tied embedding, 28 layers, q/k norms
    h, v, layers = 1024, 151936, 28
    per_layer = h * 2048 + 2 * h * 1024 + 2048 * h + 3 * h * 3072 + 2 * h + 2 * 128
    params = v * h + layers * per_layer + h
    assert models["Qwen3-0.6B"]["parameters"] == params and params // 10**6 == 596  # Qwen3-0.6B: 596M parameters
    assert models["Qwen3-0.6B"]["active_parameters"] == params  # dense: a token reads every weight
    assert round(models["Qwen3-8B"]["parameters"] / 1e9, 1) == 8.2  # the model card's 8.2B


def test_sequences_that_fit_next_to_the_weights(capsys):
    m = kv_table(capsys, "Qwen3-0.6B", "--context", "4096", "--budget", "16GiB")["Qwen3-0.6B"]
    weights = m["parameters"] * 2  # bf16
    assert at(m, 4096)["sequences_in_budget"] == {
        "float32": (16 * GiB - weights) // (896 * MiB),
        "bfloat16": (16 * GiB - weights) // (448 * MiB),
        "int8": (16 * GiB - weights) // (231 * MiB),
    } == {"float32": 17, "bfloat16": 34, "int8": 66}
    m = kv_table(capsys, "Qwen3-8B", "--context", "32768", "--budget", "16GiB")["Qwen3-8B"]
    assert at(m, 32768)["sequences_in_budget"]["bfloat16"] == 0  # 15.3 GiB of bf16 weights leave < 4.5 GiB


def test_a_config_json_of_another_geometry(tmp_path, capsys):
    """Qwen2-style: 24 layers, 4 kv heads x 64, the upper 12 layers on a 1024-token window."""
    config = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=32000, hidden_size=512,
                  intermediate_size=1024, num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=4,
                  use_sliding_window=True, sliding_window=1024, max_window_layers=12, tie_word_embeddings=False)
    path = tmp_path / "my-model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    m = kv_table(capsys, str(path), "--context", "512", "8192")["my-model"]
    assert m["head_dim"] == 512 // 8 and m["full_cache_layers"] == 12 and m["window"] == 1024
    per_layer = 2 * 4 * 64 * 2  # bf16, one token, one layer
    assert m["bytes_per_token"]["bfloat16"] == 24 * per_layer
    assert at(m, 512)["bytes"]["bfloat16"] == 24 * per_layer * 512  # inside the window every layer holds all
    assert at(m, 8192)["bytes"]["bfloat16"] == per_layer * (12 * 8192 + 12 * 1024) == 108 * MiB
    assert main([str(path / "config.json"), "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "12/24 (50%); 12 keep the last 1024" in out and "| my-model | 8,192 |" in out
    # the sliding-window cache's view: every layer on a 256-token window
    m = kv_table(capsys, "Qwen3-0.6B", "--window", "256", "--context", "100", "32768")["Qwen3-0.6B (window 256)"]
    assert at(m, 32768)["bytes"]["bfloat16"] == 2 * 28 * 8 * 128 * 2 * 256 and m["full_cache_layers"] == 0
    assert at(m, 100)["bytes"]["bfloat16"] == 2 * 28 * 8 * 128 * 2 * 100


@pytest.mark.parametrize("args, needle", [
    (["--budget", "16 parsecs"], "not a size"),
    (["--context", "-5"], "not a positive token count"),
    (["Qwen3-9000B"], "unknown model 'Qwen3-9000B'"),
    (["/no/such/config.json"], "cannot read"),
])
def test_bad_input_is_a_one_line_error(args, needle):
    proc = subprocess.run([sys.executable, "-m", "qwen_serve", "kv-table", *args], capture_output=True, text=True,
                          timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


def test_is_a_subcommand_of_the_cli():
    proc = subprocess.run([sys.executable, "-m", "qwen_serve", "kv-table", "8B", "--context", "4k"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "| Qwen3-8B | 4,096 | 1.12 GiB | 576 MiB |" in proc.stdout, proc.stderr


def test_a_mixture_of_experts_reads_only_its_routed_experts(capsys):
    """Qwen3-30B-A3B as published: 30.5B parameters, 3.3B activated per token."""
    attention, router, norms = 2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128, 128 * 2048, 2 * 2048 + 2 * 128
    expert = 3 * 2048 * 768
    tables = 2 * 151936 * 2048  # untied
    total = 48 * (attention + 128 * expert + router + norms) + 2048 + tables
    active = 48 * (attention + 8 * expert + router + norms) + 2048 + tables
    m = kv_table(capsys, "Qwen3-30B-A3B", "--context", "4096", "--weights", "bfloat16")["Qwen3-30B-A3B"]
    assert (m["parameters"], m["active_parameters"]) == (total, active)
    assert round(total / 1e9, 1) == 30.5 and round(active / 1e9, 1) == 3.4  # Qwen's "3.3B activated" leaves out the tables' lookup side
    assert (m["weight_bytes"], m["active_weight_bytes"]) == (2 * total, 2 * active)
    assert m["bytes_per_token"]["bfloat16"] == 2 * 48 * 4 * 128 * 2 == 96 * KiB
    assert main(["Qwen3-30B-A3B", "--context", "4096"]) == 0
    assert "| Qwen3-30B-A3B | 30.53B | 3.35B |" in capsys.readouterr().out


def test_a_moe_config_json_counts_its_dense_and_sparse_layers(tmp_path, capsys):
    """4 layers, every second one sparse but layer 3 kept dense: only layer 1 has experts."""
    config = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=1000, hidden_size=64,
                  intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, decoder_sparse_step=2,
                  mlp_only_layers=[3], tie_word_embeddings=True)
    path = tmp_path / "my-moe"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    m = kv_table(capsys, str(path), "--context", "512", "--weights", "float32")["my-moe"]
    attention, dense, expert = 64 * 64 * 2 + 2 * 64 * 32, 3 * 64 * 256, 3 * 64 * 32
    fixed = 4 * attention + 3 * dense + 16 * 64 + 4 * (2 * 64 + 2 * 16) + 64 + 1000 * 64
    assert (m["parameters"], m["active_parameters"]) == (fixed + 16 * expert, fixed + 4 * expert)
    assert m["active_weight_bytes"] == 4 * (fixed + 4 * expert)


@pytest.mark.parametrize("family", ["dense", "moe", "next"])
def test_a_hybrid_keeps_kv_in_its_attention_layers_and_a_state_per_sequence(tmp_path, family):
    """Qwen3.5's geometry as kv-table reads it from config.json: KV bytes for the one attention
    layer in four, the linear-attention state beside it, and the parameters the checkpoint holds."""
    from safetensors import safe_open

    from qwen_serve.conformance.models import make_qwen3_5_checkpoint
    from qwen_serve.kv.geometry import KVGeometry

    path = make_qwen3_5_checkpoint(tmp_path / family, family=family)
    g = KVGeometry.from_config_file(path)
    assert (g.num_layers, g.linear_layers, g.full_layers) == (4, 3, 1)
    assert g.bytes_per_token(FORMATS["bfloat16"]) == 1 * 2 * 2 * 32 * 2  # 1 layer, k and v, 2 heads x 32, 2 B
    # per linear layer: a 3-input history of 2 x 2 x 16 + 4 x 16 channels and 4 states of 16 x 16, float32
    assert g.state_bytes == 3 * 4 * (3 * (2 * 2 * 16 + 4 * 16) + 4 * 16 * 16)
    assert g.bytes_at(100, FORMATS["bfloat16"]) == 100 * 256 + g.state_bytes
    with safe_open(path / "model.safetensors", "pt") as f:
        stored = sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    assert g.parameters() == stored
