"""Commands made from a server's OpenAPI document are the commands made from the registry: the same groups, methods,
options and kinds of option, so a host application's own modules get the commands the built-in ones have."""

from __future__ import annotations

import click

from bettercompute._runtime.openapi import openapi_document
from bettercompute_cli._apidoc import assemble
from bettercompute_cli._client import client_groups, served_groups


def _shape(groups: list[click.Group]) -> dict[tuple[str, str], dict[str, tuple[bool, bool, str]]]:
    """Per command: each option's name -> (repeatable, a flag, its type's name)."""
    return {
        (group.name or "", name): {
            str(p.name): (bool(getattr(p, "multiple", False)), bool(getattr(p, "is_flag", False)), p.type.name)
            for p in command.params
        }
        for group in groups
        for name, command in group.commands.items()
    }


def test_the_served_documents_commands_are_the_registrys() -> None:
    compute = assemble()
    served = _shape(served_groups(openapi_document(compute.registry, "/api/compute")))
    local = _shape(client_groups(set()))
    own = {("nodes", "watch"), ("capacity", "show"), ("audit", "export")}  # not methods: the command's own
    assert set(local) - own <= set(served)
    assert {group for group, _ in set(served) - set(local)} == {"authz"}  # for other processes, not people
    for key, options in local.items():
        assert key in own or options == served[key], key


def test_a_document_of_another_shape_makes_no_commands_rather_than_failing() -> None:
    assert served_groups({}) == []
    assert served_groups({"paths": {"/api/compute/x/y": {"post": {"requestBody": {}}}}})[0].name == "x"
    odd = {"paths": {"/api/compute/x/y": {"post": {"requestBody": {"content": {"application/json": {"schema": 3}}}}}}}
    assert [p.name for p in served_groups(odd)[0].commands["y"].params][:2] == ["whole", "input_file"]
