"""``docs/api.md`` is generated from the registry: the committed page is what the generator makes now, a stale page
fails the check, and the page describes every method as it is declared."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bettercompute_cli import _apidoc


def test_the_committed_reference_is_what_the_registry_generates() -> None:
    assert _apidoc.check() == 0


def test_the_check_fails_on_a_page_that_no_longer_matches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "api.md"
    stale.write_text(_apidoc.TARGET.read_text().replace("compute:reservations:create", "compute:reservations:make", 1))
    assert _apidoc.check(stale) == 1
    assert "make docs" in capsys.readouterr().err
    assert _apidoc.check(tmp_path / "missing.md") == 1


def test_every_method_has_a_section_with_its_path_action_and_an_example() -> None:
    page = _apidoc.render()
    methods = list(_apidoc.assemble().registry.methods())
    assert len(methods) > 50  # dev's composition: the core, IAM, webhooks, secrets and node identity
    for method in methods:
        heading = f"### `{method.group}.{method.name}`"
        assert page.count(heading) == 1, heading
        section = page.split(heading, 1)[1].split("\n### ", 1)[0]
        assert f"`POST /api/compute/{method.group}/{method.name}`" in section
        assert f"`{method.action}`" in section
        assert ("**Mutates:** yes" in section) == method.mutates
        assert f"/api/compute/{method.group}/{method.name} -d '" in section


def test_a_method_lists_the_errors_its_handler_raises_beside_those_of_its_declaration() -> None:
    page = _apidoc.render()
    create = page.split("### `reservations.create`", 1)[1].split("\n### ", 1)[0]
    handler = re.search(r"raised by the handler: (.*)", create)
    assert handler is not None
    assert {"`NO_CAPACITY` (409)", "`QUOTA_EXCEEDED` (403)", "`NOT_FOUND` (404)"} <= set(handler[1].split(", "))
    assert "- `CONFLICT` (409): the idempotency key was used with another request" in create
    version = page.split("### `system.version`", 1)[1].split("\n### ", 1)[0]
    assert "CONFLICT" not in version and "raised by the handler" not in version
    # The CLI example of a command with required fields, and the input table's required column.
    assert "better-compute reservations create --tenant root --pool-id pool_... --gpus 1 --duration PT1H" in create
    assert "| `pool_id` | string | required |" in create
