"""Each packed projection's path per row class (path_plan.py), chosen by timing on this CPU.

Where the kernels and the dequantized tiles cross depends on the CPU, and no row count holds on
all of them: on a Zen 5 the AVX-512 kernels beat bf16 tiles at every size, while on a Sapphire
Rapids a fixed 64-row crossover sent 72-row prefills to tiles that took six times as long. So
the first time a model loads on a machine, each distinct projection shape times every path it
may take at both ends of each row class (a synthetic layer of its shape, random weights), and
each class takes the path whose worse end lags that end's fastest path least. The timings and
the choices are kept in the cache directory under a key of the CPU's model and flags, the
kernels' build, torch's version and the thread count, so this costs seconds once per machine.

The same goes for bf16 projections (on CPUs whose AVX-512 kernels run the blocked bf16 layout),
whose candidates also include oneDNN's prepacked weight: a layout of its own, so a plan takes it
for every row class or none, whichever's worst class lags least.

``QWEN_SERVE_KERNELS`` forces paths over the measured ones: ``int4=tiles_bf16``, or per row class
``int4:193-512=tiles_f32,int8=kernel,bf16=onednn`` (kinds int4, int6, int8 and bf16; onednn for bf16
only and for all its rows; a path the CPU runs slowly, such as bf16 tiles without native bf16, is
still correct).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch

from qwen_serve.cache_dir import cache_dir
from qwen_serve.cpu import cpu_model
from qwen_serve.errors import ModelLoadError
from qwen_serve.quant.int4 import GROUP, Int4Weight

from .int4_linear import Int4Linear, Int6Linear, Int8Linear
from .linear import DenseLinear, runs_bf16_column_kernel, runs_bf16_kernel
from .native import Kernels, build_key, cpu_features, has_fast_bf16_matmul
from .path_plan import CLASS_LABELS, ONEDNN, PATHS, ROW_CLASSES, PathPlan
from .tiles import Scratch

log = logging.getLogger("qwen_serve.torch")
ENV = "QWEN_SERVE_KERNELS"
KINDS = ("int4", "int6", "int8", "bf16")
PROBE_ROWS = sorted({rows for bounds in ROW_CLASSES for rows in bounds})
MAX_TIMED_WEIGHTS = 1 << 23  # a larger shape is timed on fewer of its output rows: cost is linear in them
REPEATS = 5


@dataclass(frozen=True)
class ShapeChoice:
    """One projection shape: the seconds each path took at each probe's rows, and the plan."""

    kind: str
    out_features: int
    in_features: int
    seconds: dict[str, dict[int, float]]  # path -> rows -> best of REPEATS
    plan: PathPlan
    forced: tuple[bool, ...]  # per row class: set by QWEN_SERVE_KERNELS

    @property
    def name(self) -> str:
        return shape_key(self.kind, self.out_features, self.in_features)


def shape_key(kind: str, out_features: int, in_features: int) -> str:
    """A shape's name, as the table prints it and the cache file keys it."""
    return f"{kind} {out_features}x{in_features}"


def kind_of(linear, kernels: Kernels | None) -> str | None:
    """The kind of plan a layer takes: quantized ones, and bf16 ones not yet packed (prepack()
    lays them out as their plan says) wherever the blocked bf16 kernel runs."""
    if type(linear) in (Int4Linear, Int6Linear, Int8Linear):
        return linear.kind
    if type(linear) is DenseLinear and linear.weight is not None and (
            runs_bf16_kernel(linear, kernels) or runs_bf16_column_kernel(linear, kernels)):
        return "bf16"
    return None


def choose_paths(linears: Iterable, kernels: Kernels | None) -> list[ShapeChoice]:
    """Set the plan of every packed layer among ``linears`` (measured or read from the cache,
    then overridden by QWEN_SERVE_KERNELS) and return the choices, one per distinct shape."""
    forced = forced_paths(os.environ.get(ENV, ""))
    by_shape: dict[tuple[str, int, int], list] = {}
    for linear in linears:
        kind = kind_of(linear, kernels)
        if kind is not None:
            by_shape.setdefault((kind, linear.out_features, linear.in_features), []).append(linear)
    if not by_shape:
        return []
    path = choices_file()
    stored = read_timings(path)
    choices, measured = [], False
    for (kind, n, k), layers in by_shape.items():
        # a quantized layer carries the kernels it was built with; a bf16 one gets them when prepacked
        layer_kernels = kernels if kind == "bf16" else layers[0].kernels
        runnable = layer_kernels is not None
        for (forced_kind, _), choice in forced.items():
            if forced_kind == kind and choice == "kernel" and not runnable:
                raise ModelLoadError(f"{ENV} asks for the {kind} kernel, which this machine cannot run "
                                     "(the kernels are not built here)")
        key = shape_key(kind, n, k)
        seconds = stored.get(key)
        forced_classes = tuple((kind, c) in forced for c in range(len(ROW_CLASSES)))
        if seconds is None and not all(forced_classes):
            seconds = stored[key] = _measure(kind, n, k, layer_kernels, _candidates(kind, runnable))
            measured = True
        plan = _fastest(seconds) if seconds else PathPlan.fixed("tiles_f32")
        plan = _with_forced(plan, {c: path for (forced_kind, c), path in forced.items() if forced_kind == kind})
        for layer in layers:
            layer.plan = plan
        choices.append(ShapeChoice(kind, n, k, seconds or {}, plan, forced_classes))
    if measured:
        write_timings(path, stored)
    return choices


def forced_paths(text: str) -> dict[tuple[str, int], str]:
    """QWEN_SERVE_KERNELS as {(kind, row class index): path}; a bad entry is a one-line error."""
    forced = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        target, sep, path = item.partition("=")
        kind, colon, rows = target.strip().partition(":")
        if not sep or kind not in KINDS or path.strip() not in PATHS or colon and rows.strip() not in CLASS_LABELS:
            raise ModelLoadError(f"{ENV}: {item!r} is not KIND[:ROWS]=PATH with KIND one of {', '.join(KINDS)}, "
                                 f"ROWS one of {', '.join(CLASS_LABELS)}, PATH one of {', '.join(PATHS)}")
        if path.strip() == ONEDNN and (kind != "bf16" or colon):
            raise ModelLoadError(f"{ENV}: {item!r}: onednn is a layout of bf16 weights, for all their rows: bf16=onednn")
        classes = [CLASS_LABELS.index(rows.strip())] if colon else range(len(ROW_CLASSES))
        forced.update({(kind, c): path.strip() for c in classes})
    return forced


def _with_forced(plan: PathPlan, forced: dict[int, str]) -> PathPlan:
    """The plan with the forced row classes replaced; forcing onednn takes every class, and
    forcing another path onto a onednn plan leaves the rest to the kernel."""
    if ONEDNN in forced.values():
        return PathPlan.fixed(ONEDNN)
    base = PathPlan.fixed("kernel") if forced and ONEDNN in plan.paths else plan
    return PathPlan(tuple(forced.get(c, p) for c, p in enumerate(base.paths)))


def machine() -> dict:
    """What the timings depend on; a change in any of it means measuring again."""
    flags = sorted(f for f in cpu_features() if f.startswith(("avx", "amx", "fma", "f16c")))
    return {"cpu": cpu_model(), "flags": flags, "kernels": build_key(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "rows": PROBE_ROWS}


def choices_file() -> Path:
    key = hashlib.sha256(json.dumps(machine(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir("kernels") / "choices" / f"{key}.json"


def describe(choices: list[ShapeChoice]) -> list[str]:
    """The table the paths were chosen from: ms at each end of each row class, the chosen path
    marked * (or ! where QWEN_SERVE_KERNELS forced it)."""
    lines = [f"{'shape / path':28s}" + "".join(f"{'rows ' + label:>18s}" for label in CLASS_LABELS)]
    for choice in choices:
        lines.append(choice.name)
        for path in sorted(set(choice.seconds) | set(choice.plan.paths), key=PATHS.index):
            cells = []
            for c, (lo, hi) in enumerate(ROW_CLASSES):
                times = choice.seconds.get(path)
                cell = "-" if times is None else "/".join(f"{times[n] * 1e3:.2f}" for n in dict.fromkeys((lo, hi)))
                mark = ("!" if choice.forced[c] else "*") if choice.plan.paths[c] == path else " "
                cells.append(f"{cell}{mark}")
            lines.append(f"  {path:26s}" + "".join(f"{cell:>18s}" for cell in cells))
    return lines


def _candidates(kind: str, runnable: bool) -> list[str]:
    paths = ["kernel"] if runnable else []
    fast_bf16 = ["tiles_bf16"] + ([ONEDNN] if kind == "bf16" else []) if has_fast_bf16_matmul() else []
    return paths + ["tiles_f32"] + fast_bf16


def _fastest(seconds: dict[str, dict[int, float]]) -> PathPlan:
    """Per row class the path whose worse end lags that end's fastest path least (a tie goes to
    the kernel); onednn, a layout of its own, instead of that mix where its worst class lags less
    than the mix's worst."""
    if len(seconds) == 1:  # nothing to choose from: nothing was timed
        return PathPlan.fixed(next(iter(seconds)))

    def lag(path: str, lo: int, hi: int) -> float:
        return max(seconds[path][n] / min(times[n] for times in seconds.values()) for n in (lo, hi))

    mixable = sorted((p for p in seconds if p != ONEDNN), key=PATHS.index)
    mix = PathPlan(tuple(min(mixable, key=lambda p: lag(p, lo, hi)) for lo, hi in ROW_CLASSES))
    if ONEDNN not in seconds:
        return mix
    worst_of_mix = max(lag(p, *bounds) for p, bounds in zip(mix.paths, ROW_CLASSES))
    worst_of_onednn = max(lag(ONEDNN, *bounds) for bounds in ROW_CLASSES)
    return PathPlan.fixed(ONEDNN) if worst_of_onednn < worst_of_mix else mix


def _measure(kind: str, out_features: int, in_features: int, kernels: Kernels | None,
             paths: list[str]) -> dict[str, dict[int, float]]:
    if len(paths) == 1:
        return {paths[0]: {rows: 0.0 for rows in PROBE_ROWS}}
    rows = min(out_features, max(256, MAX_TIMED_WEIGHTS // in_features // 16 * 16))
    layers = {path: _synthetic(kind, rows, in_features, kernels, PathPlan.fixed(path)) for path in paths}
    started = time.perf_counter()
    seconds = {path: {} for path in paths}
    for n in PROBE_ROWS:
        x = torch.randn(n, in_features)
        for layer in layers.values():
            layer(x)  # scratch buffers, oneDNN's primitive for this shape
        for _ in range(REPEATS):  # the paths in turns: a moment of load elsewhere hits them alike
            for path, layer in layers.items():
                start = time.perf_counter()
                layer(x)
                seconds[path][n] = min(seconds[path].get(n, float("inf")), time.perf_counter() - start)
    log.info("timed %s %dx%d on %d rows in %.1f s", kind, out_features, in_features, rows,
             time.perf_counter() - started)
    return seconds


def _synthetic(kind: str, rows: int, cols: int, kernels: Kernels | None, plan: PathPlan):
    """A layer of the shape on random weights (one per path, so each path keeps its own scratch
    as a model's layers share theirs)."""
    rng = np.random.default_rng(0)
    if kind == "int4":
        groups = cols // GROUP
        weight = Int4Weight(rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8),
                            np.full((rows, groups), 0.01, np.float16), np.full((rows, groups), -0.08, np.float16))
        layer = Int4Linear(weight, scratch=Scratch(), kernels=kernels)
    elif kind == "int6":
        layer = Int6Linear(torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32)), scratch=Scratch(),
                           kernels=kernels)
    elif kind == "int8":
        layer = Int8Linear(torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32)), scratch=Scratch(),
                           kernels=kernels)
    else:  # bf16: laid out as the plan says
        layer = DenseLinear(torch.from_numpy(rng.standard_normal((rows, cols), dtype=np.float32)).bfloat16(),
                            scratch=Scratch())
        layer.plan = plan
        layer.prepack(kernels)
        return layer
    layer.plan = plan
    return layer


def read_timings(path: Path) -> dict[str, dict[str, dict[int, float]]]:
    try:
        shapes = json.loads(path.read_text())["shapes"]
        return {key: {p: {int(n): float(t) for n, t in times.items()} for p, times in paths.items()}
                for key, paths in shapes.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}  # none yet, or unreadable: measure again


def write_timings(path: Path, shapes: dict) -> None:
    """Atomically (a concurrent load reads the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"machine": machine(), "shapes": shapes}, indent=1))
    os.replace(temporary, path)
