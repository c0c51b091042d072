"""The package's public names load on first use: each is the object of its home module, and a light part of the
package does not load the core."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import bettercompute


def test_every_public_name_is_its_home_modules_object() -> None:
    for name in bettercompute.__all__:
        value = getattr(bettercompute, name)
        if name == "__version__":
            continue
        module, there = bettercompute._HOMES[name]
        assert value is getattr(importlib.import_module(module), there), name
    assert set(bettercompute.__all__) == {*bettercompute._HOMES, "__version__"}
    assert set(bettercompute.__all__) <= set(dir(bettercompute))


def test_the_type_checkers_imports_name_the_same_homes() -> None:
    # mypy reads the `if TYPE_CHECKING:` imports; the lazy table must say the same, or a name means two things.
    tree = ast.parse(Path(bettercompute.__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    typed = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == bettercompute._HOMES


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = bettercompute.Nope  # type: ignore[attr-defined]
