"""The docs' links hold: every relative link and image in README.md and docs/*.md names a file
that exists, and every #fragment into a markdown file (or within one) names one of its headings
by GitHub's anchor rule. Also: README's test command is the one CI runs (.ci/run)."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTERNAL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:, ...
PARSER = MarkdownIt("commonmark").enable("table")


def link_targets(text: str) -> list[str]:
    """Every link href and image src in a markdown text, in order."""
    targets = []
    for block in PARSER.parse(text):
        for token in block.children or ():
            if token.type == "link_open":
                targets.append(token.attrGet("href"))
            elif token.type == "image":
                targets.append(token.attrGet("src"))
    return targets


def github_slug(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped (hyphens and underscores kept),
    spaces turned into hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a markdown text's headings; a repeated one gets -1, -2, ..."""
    anchors: set[str] = set()
    tokens = PARSER.parse(text)
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type != "heading_open":
            continue
        plain = "".join(child.content for child in inline.children or () if child.type in ("text", "code_inline"))
        slug, repeat = github_slug(plain), 0
        while (slug if repeat == 0 else f"{slug}-{repeat}") in anchors:
            repeat += 1
        anchors.add(slug if repeat == 0 else f"{slug}-{repeat}")
    return anchors


def broken_links(markdown_file: Path) -> list[str]:
    """The relative targets in markdown_file that do not resolve, each with the reason."""
    broken = []
    for target in link_targets(markdown_file.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (markdown_file.parent / unquote(path_part)).resolve() if path_part else markdown_file
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in heading_anchors(resolved.read_text()):
            broken.append(f"{target}: no heading with anchor #{fragment}")
    return broken


@pytest.mark.parametrize("markdown_file", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(markdown_file: Path) -> None:
    assert broken_links(markdown_file) == []


def test_the_docs_exist_and_link_somewhere() -> None:
    assert len(DOCS) >= 7
    assert sum(len(link_targets(p.read_text())) for p in DOCS) > 50


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# A heading, with `code`\n\ntext\n\n## A heading, with `code`\n")
    (tmp_path / "pic.png").write_bytes(b"")
    (tmp_path / "a.md").write_text(
        "# Top\n\n[fine](b.md) [anchor](b.md#a-heading-with-code) [second](b.md#a-heading-with-code-1)\n"
        "[here](#top) ![pic](pic.png) [web](https://example.com/x.md) [mail](mailto:a@b.c)\n\n"
        "[gone](missing.md) ![lost](lost.png) [bad anchor](b.md#no-such-heading) [bad here](#nowhere)\n\n"
        "[ref]\n\n[ref]: gone/too.md\n")
    assert broken_links(tmp_path / "a.md") == [
        "missing.md: no such file", "lost.png: no such file",
        "b.md#no-such-heading: no heading with anchor #no-such-heading", "#nowhere: no heading with anchor #nowhere",
        "gone/too.md: no such file"]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Serving under load", "serving-under-load"),
    ("`--kv-cache`: flags & more", "--kv-cache-flags--more"),
    ("KV memory: `qwen-serve kv-table`", "kv-memory-qwen-serve-kv-table"),
])
def test_github_slug(heading: str, anchor: str) -> None:
    assert github_slug(heading) == anchor


def test_readme_test_command_is_what_ci_runs() -> None:
    """README's second set-up command, one shell command per line joined by &&, is .ci/run's."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith(("python -m ", "npm ", "{ command -v "))]
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(python -m pip install -q -e .*?)```", readme, re.S)
    assert block, "README has no test command block starting with CI's install line"
    assert [line.removesuffix(" && \\") for line in block.group(1).splitlines()] == ci
