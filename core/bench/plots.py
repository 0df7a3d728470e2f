"""PNG plots of a result document, one line per endpoint: throughput vs concurrency, latency
percentiles vs concurrency, and batch occupancy over time where it was sampled. matplotlib is
the optional extra `bench` and is imported only here."""
from __future__ import annotations

from pathlib import Path
from typing import Any

PERCENTILE_STYLES = {"p50": "-", "p95": "--", "p99": ":"}


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("qwen-serve bench: plots need matplotlib: pip install 'qwen-serve[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def workloads(document: dict[str, Any]) -> list[tuple[int, Any]]:
    """The distinct (prompt tokens, output tokens) pairs, in the order they first appear."""
    seen: dict[tuple, None] = {}
    for endpoint in document["endpoints"]:
        for r in endpoint["results"]:
            seen.setdefault((r["prompt_tokens"], _key(r["output_tokens"])), None)
    return list(seen)


def _key(output_tokens: Any) -> Any:
    return tuple(output_tokens) if isinstance(output_tokens, list) else output_tokens


def _series(document: dict[str, Any], workload: tuple[int, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    out = []
    for endpoint in document["endpoints"]:
        rows = sorted((r for r in endpoint["results"] if (r["prompt_tokens"], _key(r["output_tokens"])) == workload),
                      key=lambda r: r["concurrency"])
        if rows:
            out.append((endpoint["name"], rows))
    return out


def _label(workload: tuple[int, Any]) -> str:
    prompt, output = workload
    output = f"{output[0]}-{output[1]}" if isinstance(output, tuple) else output
    return f"{prompt}-token prompts, {output} output tokens"


def _subtitle(document: dict[str, Any]) -> str:
    cpu = document["machine"]["cpu"]
    bandwidth = document["machine"].get("memory_bandwidth", {}).get("read_gb_s")
    return f"{cpu['model_name']}, {cpu['usable_cpus']} CPUs, {bandwidth} GB/s"


def plot_throughput(document: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    loads = workloads(document)
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, workload in zip(axes[0], loads):
        prefill = workload[1] == 1
        metric = "input_tok_s" if prefill else "output_tok_s"
        series = _series(document, workload)
        levels = sorted({r["concurrency"] for _, rows in series for r in rows})
        if len(levels) == 1:  # one level (e.g. prefill at 1 stream): bars read better than dots
            bars = ax.bar([name for name, _ in series], [rows[0][metric] for _, rows in series],
                          color=[colors[i % len(colors)] for i in range(len(series))])
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
            ax.set_xlabel(f"{levels[0]} concurrent stream{'s' if levels[0] > 1 else ''}")
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        else:
            for i, (name, rows) in enumerate(series):
                ax.plot([r["concurrency"] for r in rows], [r[metric] for r in rows], marker="o", label=name,
                        color=colors[i % len(colors)])
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent streams")
            ax.legend(fontsize=8)
        ax.set_ylabel("prompt tok/s (prefill)" if prefill else "output tok/s")
        ax.set_title(_label(workload), fontsize=10)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"Throughput vs concurrency — {_subtitle(document)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_latency(document: dict[str, Any], path: Path) -> Path:
    plt = _pyplot()
    loads = workloads(document)
    fig, axes = plt.subplots(len(loads), 2, figsize=(12, 4.2 * len(loads)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, workload in zip(axes, loads):
        for i, (name, rows) in enumerate(_series(document, workload)):
            xs = [r["concurrency"] for r in rows]
            for ax, metric in zip(row, ("ttft_s", "itl_s")):
                for q, style in PERCENTILE_STYLES.items():
                    points = [(x, r[metric][q] * 1e3) for x, r in zip(xs, rows) if r[metric][q]]
                    if points:
                        ax.plot(*zip(*points), style, marker="o", markersize=3, color=colors[i % len(colors)],
                                label=f"{name} {q}")
        for ax, what in zip(row, ("time to first token (ms)", "inter-token latency (ms)")):
            ax.set_xscale("log", base=2)
            if not ax.lines:  # e.g. inter-token latency of 1-token outputs
                ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
            else:
                ax.set_yscale("log")
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(what)
            ax.set_title(_label(workload), fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"Latency percentiles — {_subtitle(document)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_occupancy(document: dict[str, Any], path: Path) -> Path | None:
    panels = [(endpoint["name"], r) for endpoint in document["endpoints"] for r in endpoint["results"]
              if (r.get("occupancy") or {}).get("samples")]
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 2.8 * len(panels)), squeeze=False, sharex=True)
    for ax, (name, r) in zip(axes[:, 0], panels):
        t, running, waiting = zip(*r["occupancy"]["samples"])
        mean = sum(running) / len(running)
        ax.step(t, running, where="post", label=f"running (mean {mean:.1f})")
        ax.step(t, waiting, where="post", linestyle="--", alpha=0.7, label="waiting")
        ax.set_ylabel("sequences")
        ax.set_title(f"{name}: {r['concurrency']} streams, {_label((r['prompt_tokens'], _key(r['output_tokens'])))}; "
                     f"{r['output_tok_s']:.1f} output tok/s", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the first request (first repetition)")
    fig.suptitle(f"Batch occupancy over time — {_subtitle(document)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(document: dict[str, Any], out_dir: Path, prefix: str = "") -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [plot_throughput(document, out_dir / f"{prefix}throughput.png"),
             plot_latency(document, out_dir / f"{prefix}latency.png"),
             plot_occupancy(document, out_dir / f"{prefix}occupancy.png")]
    return [p for p in paths if p is not None]
