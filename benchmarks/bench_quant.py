"""float vs int4 on this machine: load time, resident memory, prefill and decode speed.

    python benchmarks/bench_quant.py                  # everything, a few minutes
    python benchmarks/bench_quant.py --only table     # or: kernels, quality

table    For Qwen3-0.6B's exact geometry (random weights) and SmolLM2-135M, each of float32 and
         int4 in a fresh subprocess: load time, resident memory after load, the anonymous peak
         while loading and RSS at the end (KV blocks and buffers included), prefill tokens/s of a
         512-token prompt, decode tokens/s at batch 1 and 8.
kernels  The candidate matmuls for one Qwen3-0.6B layer stack at 1, 8, 32 and 512 rows, side by
         side in one process (how the int4 path was chosen).
quality  Check 6 on SmolLM2 (top-5 next-token agreement with float) with and without calibration
         and for each way of storing the tied embedding / lm_head, with the bytes each costs.

Timings are the best of a few repeats: on a 2-core machine another busy process slows torch's
parallel regions by orders of magnitude, and a best-of keeps the quiet runs. The load average and
the CPU other processes used during the run are printed with the table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import engine_timing
import numpy as np

PREFILL_TOKENS = 512
DECODE_TOKENS = 24
REPEATS = 3


# --- one configuration, in its own process -----------------------------------------------------

def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class AnonPeak:
    """Highest anonymous resident memory while the block runs, sampled every 10 ms. (VmHWM would
    also count the checkpoint's pages that safetensors maps from the file, which are page cache.)"""

    def __enter__(self) -> "AnonPeak":
        import threading

        self.peak_kib, self._stop = _status_kib("RssAnon"), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak_kib = max(self.peak_kib, _status_kib("RssAnon"))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_one(model: str, quant: str) -> dict:
    from qwen_serve import LLM

    start = time.perf_counter()
    with AnonPeak() as peak:
        llm = LLM(model, quant=quant, prefix_cache=False, kv_blocks=256)
    result = {"load_s": time.perf_counter() - start, "rss_mib": _status_kib("VmRSS") / 1024,
              "peak_mib": peak.peak_kib / 1024, "weights_mib": llm.parts.executor.weight_bytes() / 2**20}
    engine = llm.engine
    vocab = llm.config.vocab_size
    rng = np.random.default_rng(0)

    def timed_run(prompts: list[list[int]], max_tokens: int) -> tuple[float, float, int]:
        return engine_timing.timed_run(engine, prompts, max_tokens)

    def prompt(n: int) -> list[int]:
        return rng.integers(100, min(vocab, 30000), size=n).tolist()

    timed_run([prompt(32)], 2)  # warm-up: first calls allocate
    prefill = min(timed_run([prompt(PREFILL_TOKENS)], 1)[0] for _ in range(REPEATS))
    result["prefill_tok_s"] = PREFILL_TOKENS / prefill
    for batch in (1, 8):
        best = 0.0
        for _ in range(REPEATS):
            _, decode_s, decoded = timed_run([prompt(16 + i) for i in range(batch)], DECODE_TOKENS)
            best = max(best, decoded / decode_s)
        result[f"decode_b{batch}_tok_s"] = best
    result["final_rss_mib"] = _status_kib("VmRSS") / 1024
    return result


def other_cpu_seconds() -> float:
    """CPU seconds used so far by processes that are neither this one nor its children."""
    own = {os.getpid()}
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(entry.name) in own or int(fields[1]) in own:  # fields[1] is the parent pid
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def table(qwen_dir: Path | None) -> None:
    from qwen_serve.conformance.models import QWEN3_0_6B, make_qwen3_checkpoint, smollm2_gguf

    with tempfile.TemporaryDirectory() as tmp:
        if qwen_dir is None or not (qwen_dir / "config.json").exists():
            qwen_dir = qwen_dir or Path(tmp) / "qwen3-0.6b"
            t = time.perf_counter()
            make_qwen3_checkpoint(qwen_dir, QWEN3_0_6B, seed=3, dtype="bfloat16", init_std=0.05)
            print(f"wrote the random Qwen3-0.6B checkpoint (bf16) in {time.perf_counter() - t:.0f} s", flush=True)
        models = {"Qwen3-0.6B geometry": str(qwen_dir), "SmolLM2-135M": str(smollm2_gguf())}
        print(f"\n{'model':22s} {'quant':6s} {'load s':>7s} {'weights MiB':>12s} {'RSS MiB':>8s} "
              f"{'load peak':>10s} {'RSS end':>8s} {'prefill tok/s':>14s} {'decode b1 tok/s':>16s} {'decode b8 tok/s':>16s}")
        load_start, cpu_start = os.getloadavg()[0], other_cpu_seconds()
        wall = time.perf_counter()
        for label, path in models.items():
            for quant in ("none", "int4"):
                out = subprocess.run([sys.executable, __file__, "--one", path, quant], capture_output=True, text=True)
                if out.returncode != 0:
                    print(f"{label:22s} {quant:6s} failed:\n{out.stderr[-2000:]}")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{label:22s} {quant:6s} {r['load_s']:7.1f} {r['weights_mib']:12.1f} {r['rss_mib']:8.0f} "
                      f"{r['peak_mib']:10.0f} {r['final_rss_mib']:8.0f} {r['prefill_tok_s']:14.1f} "
                      f"{r['decode_b1_tok_s']:16.1f} {r['decode_b8_tok_s']:16.1f}", flush=True)
        wall = time.perf_counter() - wall
        others = (other_cpu_seconds() - cpu_start) / wall
        print(f"conditions: {os.cpu_count()} CPUs, load average {load_start:.2f} before / {os.getloadavg()[0]:.2f} after, "
              f"other processes used {others:.2f} CPUs on average during the {wall:.0f} s table")


# --- the candidate kernels, side by side ---------------------------------------------------------

def kernels() -> None:
    import torch
    import torch.nn.functional as F

    from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear, Int8Linear
    from qwen_serve.quant import int4

    torch.set_num_threads(os.cpu_count() or 1)
    rng = np.random.default_rng(0)
    layer = [(2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (3072, 1024), (3072, 1024), (1024, 3072)]
    shapes = layer * 2  # two layers of Qwen3-0.6B: 31M weights, 126 MB in float32
    floats = [rng.standard_normal(s, dtype=np.float32) * 0.05 for s in shapes]

    def int8_rows(w):
        step = np.abs(w).max(axis=1) / 127
        return torch.from_numpy(np.rint(w / step[:, None]).astype(np.int8)), torch.from_numpy(step).bfloat16()

    def int4_torch_pack(w):
        q = int4.quantize(w)
        codes = torch.from_numpy(int4.unpack_codes(q.packed)).to(torch.int32)
        s, z = torch.from_numpy(q.scale).float(), torch.from_numpy(q.zero).float()
        return (torch._convert_weight_to_int4pack_for_cpu(codes, 1),
                torch.stack([s, z + 8 * s], dim=-1).transpose(0, 1).contiguous())  # torch: (q - 8) * s + z'

    candidates = {
        "float32 F.linear (torch MKL)": (torch.from_numpy, lambda x, w: F.linear(x, w)),
        "float32 numpy x @ W.T (OpenBLAS)": (lambda w: w, lambda x, w: x.numpy() @ w.T),
        "bfloat16 F.linear": (lambda w: torch.from_numpy(w).bfloat16(), lambda x, w: F.linear(x.bfloat16(), w)),
        "int8 rows _weight_int8pack_mm, bf16 x": (int8_rows, lambda x, w: torch._weight_int8pack_mm(x.bfloat16(), *w)),
        "int4 torch _weight_int4pack_mm_for_cpu": (int4_torch_pack, lambda x, w: torch._weight_int4pack_mm_for_cpu(x, w[0], 64, w[1])),
        "int4 dequantize all + F.linear": (int4.quantize, lambda x, q: F.linear(x, torch.from_numpy(int4.dequantize(q)))),
        "int8 rows, ours (Int8Linear)": (lambda w: Int8Linear(torch.from_numpy(w)), lambda x, lin: lin(x)),
        "int4 canonical, ours (Int4Linear)": (lambda w: Int4Linear(int4.quantize(w)), lambda x, lin: lin(x)),
    }
    rows = (1, 8, 32, 512)
    print(f"\n{'ms per two Qwen3-0.6B layers (31M weights), best of 3':52s}" + "".join(f"{f'M={m}':>10s}" for m in rows))
    for name, (prepare, apply) in candidates.items():
        weights = [prepare(w) for w in floats]
        cells = []
        for m in rows:
            xs = {k: torch.randn(m, k) for k in (1024, 2048, 3072)}
            if "int4pack" in name and m > 8 or "dequantize all" in name and m == 1:
                cells.append(f"{'-':>10s}")  # seconds per call: skipped to keep the run short
                continue
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                for (out, inp), w in zip(shapes, weights):
                    apply(xs[inp], w)
                best = min(best, time.perf_counter() - t)
            cells.append(f"{best * 1e3:10.1f}")
        print(f"{name:52s}" + "".join(cells), flush=True)


# --- check 6 and the embedding / lm_head choice ------------------------------------------------

def quality() -> None:
    from qwen_serve import LLM, SamplingParams
    from qwen_serve.backends.torch_cpu.backend import TorchBackend
    from qwen_serve.conformance.agreement import top5_agreement
    from qwen_serve.conformance.prompts import CHAT_PROMPTS
    from qwen_serve.registry import BackendEntry, load_registry

    registry = load_registry()
    for head in ("none", "int8", "int6", "int4"):
        registry.backends[f"torch-head-{head}"] = BackendEntry(f"torch-head-{head}", lambda h=head: TorchBackend(head_quant=h))
    float_llm = LLM()
    prompts = [float_llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    print(f"\ncheck 6 on SmolLM2 ({len(prompts)} chat prompts of conformance.prompts), int4 projections;"
          f" float model weights {float_llm.parts.executor.weight_bytes() / 2**20:.1f} MiB")
    print(f"{'embedding / lm_head':20s} {'calibrated':>10s} {'weights MiB':>12s} {'top-5 agreement':>16s} "
          f"{'at prompt ends':>15s} {'float top-1 in int4 top-5':>26s}")
    for head, calibrate in (("int8", True), ("int8", False), ("int6", True), ("none", True), ("int4", True)):
        llm = LLM(quant="int4", backend=f"torch-head-{head}", registry=registry, calibrate=calibrate)
        r = top5_agreement(float_llm, llm, prompts)
        label = {"none": "float32", "int8": "int8 rows", "int6": "int6 rows", "int4": "int4 (canonical)"}[head]
        print(f"{label:20s} {'yes' if calibrate else 'no':>10s} {llm.parts.executor.weight_bytes() / 2**20:12.1f} "
              f"{r.overall:16.3f} {r.at_prompt_ends:15.3f} {r.float_top1_kept:26.3f}", flush=True)
    params = SamplingParams(max_tokens=64)
    sample = LLM(quant="int4")  # the default: calibrated, int6 embedding / lm_head where VNNI runs, else int8
    for question in ("What is the capital of France?", "Write a haiku about the sea."):
        print(f"int4 greedy, {question!r}: {sample.chat([[{'role': 'user', 'content': question}]], params)[0].text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("table", "kernels", "quality"))
    parser.add_argument("--qwen-dir", type=Path, help="reuse (or keep) the random Qwen3-0.6B checkpoint here")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "QUANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one)))
        return
    from qwen_serve.bench.machine import machine_header

    print(machine_header())
    if args.only in (None, "kernels"):
        kernels()
    if args.only in (None, "quality"):
        quality()
    if args.only in (None, "table"):
        table(args.qwen_dir)


if __name__ == "__main__":
    main()
