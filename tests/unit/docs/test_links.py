"""Every relative link of ``docs/`` and the README points at a file that exists and, with a ``#fragment``, at a
heading (or an ``<a id>``) of that file, as GitHub renders them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")


def prose(page: Path) -> str:
    """``page`` without its code blocks and code spans, where brackets are not links."""
    return _CODE.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))


def anchors(page: Path) -> set[str]:
    """The fragments GitHub gives ``page``'s headings (lowercase, punctuation dropped, spaces to hyphens), and its
    explicit ``<a id="...">`` anchors."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
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
    names = {p.name for p in PAGES}
    assert {"api.md", "concepts.md", "operations.md", "quickstart.md", "security.md"} <= names
