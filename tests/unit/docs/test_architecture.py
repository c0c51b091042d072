"""docs/architecture.md draws the floors of the core and of its built-in modules: the drawings are the import-linter
``layers`` contracts of pyproject.toml, floor by floor, so the page cannot drift from the rules ``make test`` keeps."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGE = (ROOT / "docs" / "architecture.md").read_text()


def _contract_layers(container: str) -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract.get("type") == "layers" and contract.get("containers") == [container]:
            return [" | ".join(part.strip() for part in layer.split("|")) for layer in contract["layers"]]
    raise AssertionError(f"no layers contract over {container}")


def _drawn_floors(heading: str) -> list[str]:
    """The floors of the first text block under ``heading``: the names that start a line (two spaces in), before
    the description; a description's continuation lines start further in."""
    section = PAGE.split(heading, 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S)
    assert block is not None, f"no drawing under {heading}"
    floors = []
    for line in block.group(1).splitlines():
        names = re.match(r"  ([A-Za-z_.]+(?: \| [A-Za-z_.]+)*)", line)
        if names:
            floors.append(" | ".join(n.strip() for n in names.group(1).split("|")))
    return floors


@pytest.mark.parametrize(
    ("container", "heading"),
    [("bettercompute", "## Inside the core"), ("bettercompute.modules", "### The built-in modules")],
)
def test_the_drawn_floors_are_the_contracts_layers(container: str, heading: str) -> None:
    assert _drawn_floors(heading) == _contract_layers(container)


def test_every_built_in_module_is_on_a_floor() -> None:
    drawn = {name for floor in _drawn_floors("### The built-in modules") for name in floor.split(" | ")}
    packages = {p.name for p in (ROOT / "bettercompute" / "modules").iterdir() if (p / "__init__.py").exists()}
    assert packages <= drawn
