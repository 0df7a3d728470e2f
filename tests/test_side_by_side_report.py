"""The side-by-side's report (benchmarks/side_by_side_report.py) says which ratios come from servers measured in turns in
one sitting and which do not, and its --in-turns groups are checked before any server starts."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import side_by_side  # noqa: E402
import side_by_side_report  # noqa: E402

MACHINE = {"cpu": {"model_name": "a CPU", "family": "25", "model": "17", "usable_cpus": 2, "key_flags": ["avx2"]},
           "memory_bandwidth": {"read_gb_s": 30.0}}


def endpoint(name: str, tok_s: float, sitting: str | None) -> dict:
    results = [{"prompt_tokens": 64, "output_tokens": 128, "concurrency": c, "output_tok_s": tok_s * c,
                "ttft_s": {"p50": 0.1}, "decode_tok_s_per_stream": tok_s, "input_tok_s": 1.0,
                "output_length_honoured": 1.0} for c in (1, 8, 16)]
    record = {"name": name, "results": results, "machine": MACHINE}
    if sitting:
        record["in_turns"] = {"with": [], "started": sitting}
    return record


def test_ratio_rows_say_whether_their_two_servers_took_turns_in_one_sitting():
    doc = {"created": "now", "machine": MACHINE, "endpoints": [
        endpoint("qwen-int4", 40.0, "07:05"), endpoint("llama-q4_0", 20.0, "07:05"),
        endpoint("qwen-bf16", 30.0, "06:00"), endpoint("llama-bf16", 10.0, "07:05"), endpoint("vllm-bf16", 5.0, None)]}
    text = side_by_side_report.markdown(doc, torch_gb_s=30.0)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in text.splitlines()
            if line.startswith("| ") and "vs" in line}
    assert rows["single-stream decode, int4 vs Q4_0"] == ["40.0 tok/s", "20.0 tok/s", "2.00x", "in turns"]
    assert rows["single-stream decode, bf16 vs BF16"][2:] == ["3.00x", "apart"]  # another sitting
    assert rows["single-stream decode, int4 vs vLLM bf16"][3] == "apart"  # vLLM measured alone
    assert "in turns at 07:05: qwen-int4, llama-q4_0, llama-bf16" in text
    assert "in turns at 06:00: qwen-bf16" in text and "one at a time: vllm-bf16" in text
    assert rows["TTFT p50 at 8 streams, int4 vs llama-q4_0 (lower is better)"] == ["0.100 s", "0.100 s", "1.00x",
                                                                                   "in turns"]
    assert rows["512-token prefill, bf16 vs llama-bf16"] == ["— tok/s", "— tok/s", "—", "apart"]  # no prefill run
    assert "Plots: `side_by_side-throughput.png`" in text
    assert "`side_by_side-zen5-latency.png`" in side_by_side_report.markdown(doc, 30.0, "side_by_side-zen5")


def test_a_report_reads_its_own_sittings_folder_only(tmp_path):
    (tmp_path / "2026-12-01-side-by-side" / "raw").mkdir(parents=True)
    (tmp_path / "2026-12-01-side-by-side" / "raw" / "qwen-int4.json").write_text("{}")
    with pytest.raises(SystemExit, match="nothing measured in .*2026-12-03-side-by-side-zen5/raw"):
        side_by_side_report.report(side_by_side.SERVERS, tmp_path / "2026-12-03-side-by-side-zen5")


@pytest.mark.parametrize("argv, needle", [
    (["--in-turns", "qwen-int4"], "two or more"),
    (["--in-turns", "qwen-int4,qwen-int4"], "one --in-turns group only"),
    (["--in-turns", "qwen-int4,llama-q4_0", "--in-turns", "qwen-int4,vllm-bf16"], "one --in-turns group only"),
    (["--in-turns", "qwen-int4,nobody"], "unknown server"),
    (["--in-turns", "qwen-int4,llama-q4_0", "--only", "qwen-bf16"], "give one of them"),
])
def test_in_turns_groups_are_refused_before_any_server_starts(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        side_by_side.main([*argv, "--peers", "/nonexistent"])
    assert exc.value.code == 2 and needle in capsys.readouterr().err
