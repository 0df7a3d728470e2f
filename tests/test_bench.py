"""The pure parts of `qwen-serve bench`: SSE timing, percentiles, summaries, prompts of an exact
length, metrics parsing, the JSON document and the PNG plots. (End to end: test_bench_end_to_end.py.)"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from qwen_serve.bench.endpoint import EndpointSpec
from qwen_serve.bench.machine import cpu_info
from qwen_serve.bench.occupancy import parse_occupancy
from qwen_serve.bench.report import SCHEMA, format_table, merge, new_document, read_json, write_json
from qwen_serve.bench.sse import SSEParser, content_of
from qwen_serve.bench.stats import RequestRecord, percentiles, repetition, summarize

# --- SSE timing ---------------------------------------------------------------------------------

def test_events_split_across_reads_are_stamped_with_the_read_that_completed_them():
    parser = SSEParser()
    assert list(parser.feed(b'data: {"a"', 1.0)) == []
    assert list(parser.feed(b': 1}\n', 2.0)) == []  # line complete, event not yet (no blank line)
    events = list(parser.feed(b"\ndata: [DO", 3.0))
    assert [(e.data, e.arrived) for e in events] == [('{"a": 1}', 3.0)]
    events = list(parser.feed(b"NE]\n\n", 4.0))
    assert [(e.data, e.arrived, e.done) for e in events] == [("[DONE]", 4.0, True)]


def test_several_events_in_one_read_crlf_comments_and_multiline_data():
    raw = b": keep-alive\r\n\r\nevent: chunk\r\ndata: one\r\n\r\ndata:two\ndata: more\n\nid: 7\nretry: 10\n\n"
    events = list(SSEParser().feed(raw, 5.0))
    assert [(e.data, e.arrived) for e in events] == [("one", 5.0), ("two\nmore", 5.0)]


def test_an_event_cut_off_by_the_end_of_the_stream_still_counts():
    parser = SSEParser()
    assert list(parser.feed(b"data: last", 1.0)) == []
    assert [(e.data, e.arrived) for e in parser.close(2.0)] == [("last", 2.0)]
    assert list(SSEParser().close(3.0)) == []


def test_content_of_chat_and_completions_chunks():
    assert content_of({"choices": [{"delta": {"role": "assistant"}}]}) == ""
    assert content_of({"choices": [{"delta": {"content": "Hi"}}]}) == "Hi"
    assert content_of({"choices": [{"delta": {"reasoning_content": "hmm", "content": None}}]}) == "hmm"
    assert content_of({"choices": [{"text": " x", "index": 0}]}) == " x"
    assert content_of({"choices": [], "usage": {"completion_tokens": 3}}) == ""


# --- figures ------------------------------------------------------------------------------------

def test_percentiles_interpolate_linearly_between_order_statistics():
    # 1..100: rank q*(n-1) -> p50 at 49.5 -> 50.5; p95 at 94.05 -> 95.05; p99 at 98.01 -> 99.01
    result = percentiles(list(range(1, 101)))
    assert result == pytest.approx({"p50": 50.5, "p95": 95.05, "p99": 99.01})
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


@pytest.mark.parametrize("size", [1, 2, 3, 7, 20, 101])
def test_every_percentile_in_the_repository_is_numpys_linear_interpolation(size):
    """The bench's (and with it every benchmark script's) and the server's /metrics figures."""
    from qwen_serve.server.metrics import percentiles as served_percentiles

    samples = np.random.default_rng(size).lognormal(size=size).tolist()
    quantiles = (50, 90, 95, 99)
    expected = np.percentile(samples, quantiles)  # method="linear", numpy's default
    assert percentiles(samples, quantiles) == pytest.approx({f"p{q}": float(e) for q, e in zip(quantiles, expected)})
    served = served_percentiles(iter(samples))  # the server keeps a deque; any iterable
    assert served == pytest.approx({"p50": expected[0], "p95": expected[2]}, abs=1e-3)
    if size == 2:  # halfway between the two, where the nearest rank would give the smaller one
        assert percentiles(samples, (50,))["p50"] == pytest.approx(sum(samples) / 2)


def record(sent: float, times: list[float], out: int, prompt: int = 64, asked: int = 4) -> RequestRecord:
    return RequestRecord(prompt, asked, sent=sent, chunk_times=times, prompt_tokens=prompt, output_tokens=out)


def test_summary_of_a_level():
    recs = [record(0.0, [0.5, 0.6, 0.7, 0.8], 4), record(0.0, [0.3, 0.5, 0.7, 0.9], 4),
            RequestRecord(64, 4, error="HTTP 500: boom")]
    rep = repetition(recs, wall_s=2.0)
    assert (rep.requests, rep.failed, rep.output_tokens, rep.prompt_tokens) == (3, 1, 8, 128)
    summary = summarize({"concurrency": 3}, [rep, repetition(recs[:2], wall_s=1.0)], recs)
    assert summary["output_tok_s"] == pytest.approx(6.0)  # median of 8/2 and 8/1
    assert summary["requests_s"] == pytest.approx(1.5)  # median of 2/2 and 2/1
    assert summary["ttft_s"]["p50"] == pytest.approx(0.4)
    assert summary["itl_s"]["p50"] == pytest.approx(0.15)  # gaps 0.1 x3 and 0.2 x3
    assert summary["tpot_s"]["p50"] == pytest.approx((0.1 + 0.2) / 2)
    assert summary["decode_tok_s_per_stream"] == pytest.approx(1 / 0.15)
    assert (summary["failed"], summary["errors"]) == (1, ["HTTP 500: boom"])
    assert summary["output_length_honoured"] == 1.0 and summary["tokens_per_chunk"] == 1.0


def test_tpot_counts_tokens_not_chunks():
    two_per_chunk = record(0.0, [1.0, 1.2, 1.4], out=5)  # 5 tokens in 3 events
    assert two_per_chunk.tpot() == pytest.approx(0.4 / 4)


# --- prompts ------------------------------------------------------------------------------------

def test_word_prompts_have_the_exact_token_count():
    from qwen_serve.bench.prompts import TokenIdPrompts, WordPrompts, load_tokenizer
    from qwen_serve.conformance.qwen_tokenizer import qwen_tokenizer_json_path

    tokenizer = load_tokenizer(qwen_tokenizer_json_path())
    words = WordPrompts(tokenizer, seed=1)
    texts = [words.make(n) for n in (1, 17, 64, 500)]
    assert [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts] == [1, 17, 64, 500]
    assert len({words.make(64) for _ in range(20)}) == 20  # a new prompt every time
    ids = TokenIdPrompts(seed=1)
    assert len(ids.make(64)) == 64 and ids.make(8) != ids.make(8)


# --- metrics, endpoints, machine ----------------------------------------------------------------

def test_occupancy_from_json_and_prometheus_metrics():
    assert parse_occupancy(json.dumps({"requests_active": 11, "queue_depth": 3})) == (8.0, 3.0)
    vllm = ('# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 5.0\n'
            '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n')
    assert parse_occupancy(vllm) == (5.0, 2.0)
    llama = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 4\n"
    assert parse_occupancy(llama) == (4.0, 0.0)
    assert parse_occupancy("# TYPE other gauge\nother 1\n") is None


def test_endpoint_spec():
    assert EndpointSpec.parse("ours=http://127.0.0.1:8000/v1/") == EndpointSpec("ours", "http://127.0.0.1:8000")
    assert EndpointSpec.parse("http://127.0.0.1:9") == EndpointSpec("127.0.0.1:9", "http://127.0.0.1:9")
    with pytest.raises(ValueError, match="NAME=http"):
        EndpointSpec.parse("ours=localhost:8000")


def test_cpu_info_reads_the_first_processor():
    text = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
            "model name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu avx2 avx512f amx_tile amx_bf16 sse\n\n"
            "processor\t: 1\nmodel name\t: other\n")
    info = cpu_info(text)
    assert info["model_name"] == "Intel(R) Xeon(R) Platinum 8488C" and info["model"] == "143"
    assert info["key_flags"] == ["avx2", "avx512f", "amx_tile", "amx_bf16"]
    assert "sse" in info["flags"]


def test_one_cpuinfo_parser_for_x86_and_arm():
    from qwen_serve.cpu import first_processor, flags_of, key_flags, model_name_of

    arm = first_processor("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\n\nprocessor\t: 1\n")
    assert flags_of(arm) == {"fp", "asimd", "sve"} and key_flags(flags_of(arm)) == []
    assert model_name_of(arm)  # the platform's name where /proc/cpuinfo gives none
    x86 = first_processor("model name\t: A CPU\nflags\t\t: avx512f fma avx2 amx_tile\n")
    assert model_name_of(x86) == "A CPU" and key_flags(flags_of(x86)) == ["avx2", "fma", "avx512f", "amx_tile"]


# --- JSON and plots -----------------------------------------------------------------------------

def result(concurrency: int, tok_s: float, prompt: int = 64, output=128, occupancy=None) -> dict:
    p = {"p50": 0.1 * concurrency, "p95": 0.2 * concurrency, "p99": 0.3 * concurrency}
    r = {"prompt_tokens": prompt, "output_tokens": output, "concurrency": concurrency, "output_tok_s": tok_s,
         "requests_s": tok_s / 128, "input_tok_s": tok_s / 2, "ttft_s": p, "failed": 0,
         "itl_s": p if output > 1 else {"p50": None, "p95": None, "p99": None}}  # 1 token: no gaps
    if occupancy:
        r["occupancy"] = {"interval_s": 0.05, "samples": occupancy}
    return r


MACHINE = {"cpu": {"model_name": "Test CPU", "usable_cpus": 2, "key_flags": ["avx2"]},
           "memory_bandwidth": {"read_gb_s": 30.0}}


def document(name: str, scale: float, occupancy=None) -> dict:
    results = [result(c, scale * c, occupancy=occupancy if c == 8 else None) for c in (1, 8, 16)]
    results.append(result(1, 400 * scale, prompt=512, output=1))
    return new_document(MACHINE, {"repetitions": 3}, [{"name": name, "results": results}])


def test_json_round_trip_merge_and_table(tmp_path):
    a, b = write_json(document("ours", 10.0), tmp_path / "a.json"), write_json(document("llama", 20.0), tmp_path / "b.json")
    merged = merge([read_json(a), read_json(b)], ["a.json", "b.json"])
    assert merged["schema"] == SCHEMA
    assert [(e["name"], e["source"]) for e in merged["endpoints"]] == [("ours", "a.json"), ("llama", "b.json")]
    assert merged["endpoints"][1]["results"][2]["output_tok_s"] == 320.0
    table = format_table(merged)
    assert "llama" in table and "320.0" in table and "Test CPU" in table and "30.0 GB/s" in table
    with pytest.raises(ValueError, match="more than one input: ours"):
        merge([read_json(a), read_json(a)], ["a.json", "a.json"])
    (tmp_path / "c.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="not a qwen-serve bench result"):
        read_json(tmp_path / "c.json")


def test_plots_are_png_images(tmp_path):
    pytest.importorskip("matplotlib", reason="the optional extra `bench` is not installed")
    from matplotlib.image import imread

    from qwen_serve.bench.plots import write_plots

    occupancy = [(0.0, 1, 7), (0.5, 8, 0), (1.0, 8, 0), (1.5, 3, 0)]
    doc = merge([document("ours", 10.0, occupancy), document("llama", 20.0)], ["a", "b"])
    paths = write_plots(doc, tmp_path, "x-")
    assert [p.name for p in paths] == ["x-throughput.png", "x-latency.png", "x-occupancy.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        height, width = imread(path).shape[:2]
        assert width >= 600 and height >= 300
    assert write_plots(document("ours", 1.0), tmp_path / "none")[-1].name == "latency.png"  # no occupancy: no plot


def test_cli_errors_are_one_line_with_exit_code_2():
    def bench(*args):
        return subprocess.run([sys.executable, "-m", "qwen_serve", "bench", *args], capture_output=True, text=True,
                              timeout=60)

    for args, needle in ((["--no-bandwidth"], "at least one --endpoint"),
                         (["--endpoint", "ours=localhost:1"], "NAME=http"),
                         (["--endpoint", "ours=http://127.0.0.1:9", "--no-bandwidth"], "does not answer"),
                         (["--endpoint", "a=http://127.0.0.1:9", "--endpoint", "a=http://127.0.0.1:8", "--no-bandwidth"],
                          "names must differ")):
        out = bench(*args)
        assert out.returncode == 2 and needle in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    out = bench("--concurrency", "0,x")
    assert out.returncode == 2 and "comma-separated integers" in out.stderr
