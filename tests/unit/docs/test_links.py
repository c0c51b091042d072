"""Every relative link of ``docs/``, the README, CONTRIBUTING.md and ``bench/`` points at a file that exists and, with a
``#fragment``, at a heading (or an ``<a id>``) of that file, as GitHub renders them.

The strict site build (``make check-site``) checks the pages of ``docs/`` as the site renders them; the pages outside
``docs/`` are read on GitHub only, so this test is what checks them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "bench").glob("*.md"), *(ROOT / "docs").glob("*.md")]
)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")


_SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::([a-z][-_0-9a-z]*))?"$', re.M)


def text_of(page: Path) -> str:
    """``page`` as the site renders it: a ``--8<-- "path:section"`` line (pymdownx.snippets, a path from the
    repository's root) is replaced by that section of that file, as the site includes it."""

    def include(match: re.Match[str]) -> str:
        included = (ROOT / match.group(1)).read_text(encoding="utf-8")
        if match.group(2) is None:
            return included
        start, end = f"--8<-- [start:{match.group(2)}]", f"--8<-- [end:{match.group(2)}]"
        return included.split(start, 1)[1].split("\n", 1)[1].split(end, 1)[0].rsplit("\n", 1)[0]

    return _SNIPPET.sub(include, page.read_text(encoding="utf-8"))


def prose(page: Path) -> str:
    """``page`` without its code blocks and code spans, where brackets are not links."""
    return _CODE.sub("", _FENCE.sub("", text_of(page)))


def anchors(page: Path) -> set[str]:
    """The fragments GitHub gives ``page``'s headings (lowercase, punctuation dropped, spaces to hyphens), and its
    explicit ``<a id="...">`` anchors."""
    text = _FENCE.sub("", text_of(page))
    found = set(re.findall(r'<a id="([^"]+)"></a>', text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = prose(page)
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # an outside address
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (fragment and linked.suffix == ".md" and fragment not in anchors(linked)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_docs_are_there() -> None:
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    pages = ("api", "cli", "concepts", "configuration", "embedding", "gateway", "iam", "index", "mcp", "modules")
    more = ("nodes", "operations", "quickstart", "reliability", "reservations", "security", "testing", "webhooks")
    assert {f"docs/{name}.md" for name in pages + more} <= names
    assert {"README.md", "CONTRIBUTING.md", "bench/README.md", "bench/RESULTS.md"} <= names
