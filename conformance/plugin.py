"""The conformance suite's pytest plugin (entry point ``pytest11``).

    python -m pytest --pyargs qwen_serve.conformance [--backend NAME] [--kv-cache NAME]

runs the seven acceptance checks for every installed backend x every KV cache, each
test printing its measured figure, and ends with a table of implementations x checks.
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

from qwen_serve.registry import load_registry

from .implementations import EngineCache, Implementation, discover

CHECKS = {1: "seed determinism", 2: "greedy = transformers", 3: "batching", 4: "prefix cache",
          5: "paged KV", 6: "int4 quality", 7: "speculative sampling"}
REGISTRY = pytest.StashKey[object]()  # loaded once per session: entry points are scanned once
IMPLEMENTATIONS = pytest.StashKey[list]()  # discovered (and their caches probed) once per session
RESULTS = pytest.StashKey[dict]()  # implementation id -> check number -> [(status, figures, reason)]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("qwen-serve conformance")
    group.addoption("--backend", action="append", default=None, help="only this backend (repeatable)")
    group.addoption("--kv-cache", action="append", default=None, help="only this KV cache (repeatable)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RESULTS] = defaultdict(lambda: defaultdict(list))
    config.addinivalue_line("markers", "conformance_check(number): one of the acceptance checks (1-7)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "implementation" not in metafunc.fixturenames:
        return
    params = [pytest.param(impl, id=impl.id, marks=[pytest.mark.skip(reason=reason)] if reason else [])
              for impl, reason in session_implementations(metafunc.config)]
    metafunc.parametrize("implementation", params, scope="session")


def session_registry(config: pytest.Config):
    if REGISTRY not in config.stash:
        config.stash[REGISTRY] = load_registry()
    return config.stash[REGISTRY]


def session_implementations(config: pytest.Config) -> list:
    if IMPLEMENTATIONS not in config.stash:
        config.stash[IMPLEMENTATIONS] = discover(session_registry(config), config.getoption("backend"),
                                                 config.getoption("kv_cache"))
    return config.stash[IMPLEMENTATIONS]


@pytest.fixture(scope="session")
def registry(pytestconfig):
    return session_registry(pytestconfig)


@pytest.fixture(scope="session")
def engines(registry):
    cache = EngineCache(registry)
    yield cache
    cache.clear()


@pytest.fixture
def figure(request):
    """figure("2.9x speedup") attaches the measured figure to this check's table cell."""

    def record(text: str) -> None:
        request.node.user_properties.append(("conformance_figure", text))
        print(f"[{request.node.name}] {text}")

    return record


@pytest.fixture(scope="session")
def smollm2() -> str:
    from .models import smollm2_gguf

    return str(smollm2_gguf())


@pytest.fixture(scope="session")
def random_qwen3(tmp_path_factory) -> str:
    from .models import Qwen3Geometry, make_qwen3_checkpoint

    return str(make_qwen3_checkpoint(tmp_path_factory.mktemp("conformance-qwen3"), Qwen3Geometry(), seed=11))


@pytest.fixture(scope="session")
def random_qwen3_windowed(tmp_path_factory) -> str:
    """random_qwen3's weights, every layer attending over the suite's window (for SlidingWindow caches)."""
    from .models import Qwen3Geometry, make_qwen3_checkpoint
    from .requirements import CONFORMANCE_WINDOW

    return str(make_qwen3_checkpoint(tmp_path_factory.mktemp("conformance-qwen3-window"), Qwen3Geometry(), seed=11,
                                     sliding_window=CONFORMANCE_WINDOW))


@pytest.fixture(scope="session")
def random_qwen3_moe(tmp_path_factory) -> str:
    """A random Qwen3-MoE (conformance.models.MoeRouting's defaults: 2 of 8 experts per token)."""
    from .models import make_qwen3_moe_checkpoint

    return str(make_qwen3_moe_checkpoint(tmp_path_factory.mktemp("conformance-qwen3-moe"), seed=11))


@pytest.fixture(scope="session")
def random_qwen3_moe_windowed(tmp_path_factory) -> str:
    """random_qwen3_moe's weights, every layer attending over the suite's window."""
    from .models import make_qwen3_moe_checkpoint
    from .requirements import CONFORMANCE_WINDOW

    return str(make_qwen3_moe_checkpoint(tmp_path_factory.mktemp("conformance-qwen3-moe-window"), seed=11,
                                         use_sliding_window=True, sliding_window=CONFORMANCE_WINDOW))


@pytest.fixture(scope="session")
def random_qwen3_5(tmp_path_factory) -> str:
    """A random Qwen3.5 (Gated DeltaNet layers three to one with gated attention): prefix hits
    go through state snapshots, and every sequence holds a recurrent state beside its blocks."""
    from .models import QWEN3_5_TINY, make_qwen3_5_checkpoint

    return str(make_qwen3_5_checkpoint(tmp_path_factory.mktemp("conformance-qwen3.5"), QWEN3_5_TINY, seed=11))


@pytest.fixture(scope="session")
def random_qwen3_5_small(tmp_path_factory) -> str:
    """A random Qwen3.5 whose 200-token prefill takes longer than a step's fixed costs (check 4)."""
    from .models import QWEN3_5_SMALL, QWEN3_5_SMALL_LINEAR, make_qwen3_5_checkpoint

    return str(make_qwen3_5_checkpoint(tmp_path_factory.mktemp("conformance-qwen3.5-small"), QWEN3_5_SMALL,
                                       QWEN3_5_SMALL_LINEAR, seed=11, init_std=0.05))


@pytest.fixture(scope="session")
def speculation_qwen3(tmp_path_factory) -> str:
    """A 4-token random Qwen3 whose next-token distributions check 7 computes exactly."""
    from .speculation import write_model

    return str(write_model(tmp_path_factory.mktemp("conformance-qwen3-vocab4")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("conformance_check")
    callspec = getattr(item, "callspec", None)
    if marker is None or callspec is None or "implementation" not in callspec.params:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        if hasattr(report, "wasxfail"):
            status, reason = "xfail", report.wasxfail
        else:
            status = {"passed": "PASS", "failed": "FAIL", "skipped": "skip"}[report.outcome]
            reason = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
        figures = [v for k, v in item.user_properties if k == "conformance_figure"]
        impl: Implementation = callspec.params["implementation"]
        item.config.stash[RESULTS][impl.id][marker.args[0]].append((status, figures, reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    results = config.stash[RESULTS]
    if not results:
        return
    table = summary_table(results)
    terminalreporter.write_sep("=", "qwen-serve conformance summary")
    terminalreporter.write_line(table)
    target = os.environ.get("QWEN_SERVE_CONFORMANCE_SUMMARY")
    if target:
        Path(target).write_text(table + "\n", encoding="utf-8")


def _cell(outcomes: list[tuple[str, list[str], str]], notes: list[str]) -> str:
    """One check's tests combine: any FAIL fails it; else PASS if one passed; else xfail/skip."""
    statuses = [s for s, _, _ in outcomes]
    status = next((s for s in ("FAIL", "PASS", "xfail", "skip") if s in statuses), "-")
    figures = [f for _, fs, _ in outcomes for f in fs]
    # a check that passed on some of its models still names why it skipped the others
    reasons = sorted({r.removeprefix("Skipped: ") for s, _, r in outcomes if s in (status, "skip") and r})
    cell = status + (" " + "; ".join(figures) if figures else "")
    for reason in reasons:
        if reason not in notes:
            notes.append(reason)
        cell += f" [{notes.index(reason) + 1}]"
    return cell


def summary_table(results: dict[str, dict[int, list]]) -> str:
    notes: list[str] = []
    headers = ["implementation"] + [f"{n}. {name}" for n, name in CHECKS.items()]
    rows = [[impl] + [_cell(results[impl].get(n, []), notes) for n in CHECKS] for impl in sorted(results)]
    widths = [max(len(r[i]) for r in [headers] + rows) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    footnotes = [f"[{i}] {note}" for i, note in enumerate(notes, start=1)]
    return "\n".join([line(headers), sep] + [line(r) for r in rows] + footnotes)
