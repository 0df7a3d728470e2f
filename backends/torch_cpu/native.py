"""Small-batch int4/int8 matmul kernels in C, compiled for this CPU on first use.

Why C: at decode (1..8 rows) a linear layer is bound by memory bandwidth, so it is only as fast
as the bytes it reads. torch has no fast kernel here that reads 4-bit weights (its int4 kernel
runs slower than float32 on CPUs without AMX), so these read the canonical packed layout as is:
each 64-weight group is unpacked into registers once and used by every row of x, so batch-8
decode pays the unpacking once, not eight times.

The library is built with the system C compiler (``-O3 -march=native -fopenmp``, AVX2 at least)
into ~/.cache/qwen_serve/kernels (or $QWEN_SERVE_CACHE) keyed by the source, flags and CPU, and
loaded with ctypes; it shares torch's OpenMP
runtime (same libgomp soname), so its threads are torch's threads. Without a compiler or AVX2
(or with QWEN_SERVE_NO_NATIVE=1) ``load_kernels()`` returns None and callers fall back to
dequantize-then-GEMM.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from qwen_serve.cache_dir import cache_dir

C_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <immintrin.h>
#ifndef __AVX2__
#error "these kernels need AVX2"
#endif

#define GROUP 64
#define HALF 32

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

/* Activations as int16 per group of 64 (relative error ~1e-5, so the result is the float one for
   all practical purposes), with each group's scale and exact sum. With `split`, each group's
   columns are reordered evens then odds, to meet the low and high nibbles of the packed bytes. */
typedef struct { int16_t *q; float *scale; float *sum; } Activations;

static Activations quantize_activations(const float *x, int64_t M, int64_t K, int split) {
    const int64_t groups = K / GROUP;
    Activations a = { aligned_alloc(64, (size_t)(M * K) * sizeof(int16_t)),
                      malloc(sizeof(float) * M * groups), malloc(sizeof(float) * M * groups) };
    for (int64_t i = 0; i < M * groups; i++) {
        const float *xg = x + i * GROUP;
        float amax = 0.f, sum = 0.f;
        for (int j = 0; j < GROUP; j++) { amax = fmaxf(amax, fabsf(xg[j])); sum += xg[j]; }
        const float inv = amax > 0.f ? 32767.f / amax : 0.f;
        int16_t *qg = a.q + i * GROUP;
        for (int j = 0; j < GROUP; j++)
            qg[split ? (j & 1) * HALF + (j >> 1) : j] = (int16_t)lrintf(xg[j] * inv);
        a.scale[i] = amax / 32767.f;
        a.sum[i] = sum;
    }
    return a;
}

static void free_activations(Activations a) { free(a.q); free(a.scale); free(a.sum); }

/* Sum of the 64 products of one group: four vectors of 16 int16 weights by the group's codes. */
static inline __m256i dot_group(const __m256i w[4], const int16_t *xg) {
    const __m256i *xv = (const __m256i *)xg;
    return _mm256_add_epi32(
        _mm256_add_epi32(_mm256_madd_epi16(w[0], _mm256_load_si256(xv)), _mm256_madd_epi16(w[1], _mm256_load_si256(xv + 1))),
        _mm256_add_epi32(_mm256_madd_epi16(w[2], _mm256_load_si256(xv + 2)), _mm256_madd_epi16(w[3], _mm256_load_si256(xv + 3))));
}

static inline void widen_u8(__m256i bytes, __m256i out[2]) {
    out[0] = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(bytes));
    out[1] = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(bytes, 1));
}

/* y [M, N] = x [M, K] @ W.T, W canonical int4: packed [N, K/2], fp16 scale and zero [N, K/64].
   Each group's codes are unpacked once, in registers, and used by up to 8 rows of x:
   y = sum over groups of scale * (codes . x) + zero * sum(x). */
void q4_matmul(const float *x, int64_t M, int64_t K, const uint8_t *packed, const uint16_t *scale,
               const uint16_t *zero, int64_t N, float *y) {
    const int64_t groups = K / GROUP;
    const Activations xq = quantize_activations(x, M, K, 1);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            const int rows = M - m0 < 8 ? (int)(M - m0) : 8;
            __m256 acc[8];
            float offset[8];
            for (int m = 0; m < rows; m++) { acc[m] = _mm256_setzero_ps(); offset[m] = 0.f; }
            for (int64_t g = 0; g < groups; g++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(packed + n * (K / 2) + g * HALF));
                __m256i codes[4];
                widen_u8(_mm256_and_si256(b, low4), codes);
                widen_u8(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4), codes + 2);
                const float s = _cvtsh_ss(scale[n * groups + g]), z = _cvtsh_ss(zero[n * groups + g]);
                for (int m = 0; m < rows; m++) {
                    const int64_t i = (m0 + m) * groups + g;
                    const __m256i p = dot_group(codes, xq.q + i * GROUP);
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(s * xq.scale[i]), acc[m]);
                    offset[m] += z * xq.sum[i];
                }
            }
            for (int m = 0; m < rows; m++) y[(m0 + m) * N + n] = hsum(acc[m]) + offset[m];
        }
    }
    free_activations(xq);
}

/* y [M, N] = x [M, K] @ (W * scale[:, None]).T for int8 W [N, K] with one float scale per row. */
void q8_matmul(const float *x, int64_t M, int64_t K, const int8_t *w, const float *scale,
               int64_t N, float *y) {
    const int64_t groups = K / GROUP;
    const Activations xq = quantize_activations(x, M, K, 0);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        for (int64_t m0 = 0; m0 < M; m0 += 8) {
            const int rows = M - m0 < 8 ? (int)(M - m0) : 8;
            __m256 acc[8];
            for (int m = 0; m < rows; m++) acc[m] = _mm256_setzero_ps();
            for (int64_t g = 0; g < groups; g++) {
                const __m128i *wv = (const __m128i *)(w + n * K + g * GROUP);
                __m256i codes[4];
                for (int i = 0; i < 4; i++) codes[i] = _mm256_cvtepi8_epi16(_mm_loadu_si128(wv + i));
                for (int m = 0; m < rows; m++) {
                    const int64_t i = (m0 + m) * groups + g;
                    const __m256i p = dot_group(codes, xq.q + i * GROUP);
                    acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(xq.scale[i]), acc[m]);
                }
            }
            for (int m = 0; m < rows; m++) y[(m0 + m) * N + n] = hsum(acc[m]) * scale[n];
        }
    }
    free_activations(xq);
}

/* float32 W [N, K] from canonical int4 with each group's columns ordered evens then odds (the
   order permute_groups gives x), for large-M matmuls through BLAS. */
void q4_dequant_split(const uint8_t *packed, const uint16_t *scale, const uint16_t *zero,
                      int64_t N, int64_t K, float *out) {
    const int64_t groups = K / GROUP;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < groups; g++) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)(packed + n * (K / 2) + g * HALF));
            const __m256i halves[2] = { _mm256_and_si256(b, low4), _mm256_and_si256(_mm256_srli_epi16(b, 4), low4) };
            const __m256 s = _mm256_set1_ps(_cvtsh_ss(scale[n * groups + g]));
            const __m256 z = _mm256_set1_ps(_cvtsh_ss(zero[n * groups + g]));
            float *dst = out + n * K + g * GROUP;
            for (int h = 0; h < 2; h++) {
                const __m128i parts[2] = { _mm256_castsi256_si128(halves[h]), _mm256_extracti128_si256(halves[h], 1) };
                for (int p = 0; p < 2; p++) {
                    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[p]));
                    const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(parts[p], 8)));
                    _mm256_storeu_ps(dst + h * HALF + p * 16, _mm256_fmadd_ps(a, s, z));
                    _mm256_storeu_ps(dst + h * HALF + p * 16 + 8, _mm256_fmadd_ps(c, s, z));
                }
            }
        }
}

/* x [M, K] -> xp with each group's columns reordered evens then odds. */
void permute_groups(const float *x, int64_t M, int64_t K, float *xp) {
    for (int64_t i = 0; i < M * K; i += GROUP)
        for (int j = 0; j < HALF; j++) {
            xp[i + j] = x[i + 2 * j];
            xp[i + HALF + j] = x[i + 2 * j + 1];
        }
}
"""

# No -ffast-math: with older gcc it links crtfastmath into the library, which would switch the
# whole process to flush-to-zero on load.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
_P, _I64 = ctypes.c_void_p, ctypes.c_int64
SIGNATURES = {
    "permute_groups": [_P, _I64, _I64, _P],
    "q4_matmul": [_P, _I64, _I64, _P, _P, _P, _I64, _P],
    "q4_dequant_split": [_P, _P, _P, _I64, _I64, _P],
    "q8_matmul": [_P, _I64, _I64, _P, _P, _I64, _P],
}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return os.uname().machine


def has_fast_bf16_matmul() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX): there a bf16 GEMM runs
    ~3x faster than float32; without them it runs ~100x slower, so float32 it is."""
    flags = _cpu_flags().split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # same filesystem: the rename is atomic
        source = Path(tmp) / "kernels.c"
        source.write_text(C_SOURCE)
        built = Path(tmp) / target.name
        subprocess.run([compiler, *FLAGS, str(source), "-o", str(built)], check=True, capture_output=True, timeout=120)
        os.replace(built, target)  # a concurrent loader sees no file or the whole one


@lru_cache(maxsize=1)
def load_kernels() -> ctypes.CDLL | None:
    """The compiled kernels, or None when this machine cannot build them."""
    if os.environ.get("QWEN_SERVE_NO_NATIVE"):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None
    key = hashlib.sha256("\0".join([C_SOURCE, *FLAGS, compiler, _cpu_flags()]).encode()).hexdigest()[:16]
    target = cache_dir("kernels") / f"int4_kernels-{key}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    for name, argtypes in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return lib
