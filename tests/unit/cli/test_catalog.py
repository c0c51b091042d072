"""The client commands' catalog is what the declarations say (a client command's start without the core is tested in
``tests/integration/cli/test_client_start.py``)."""

from __future__ import annotations

from bettercompute_cli import _catalog


def test_the_checked_in_catalog_is_what_the_declarations_give() -> None:
    # A method, field or group added or changed without `make docs` fails here (and in `make lint`).
    assert _catalog.load() == _catalog.build()
    assert _catalog.check() == 0


def test_every_group_and_method_of_the_declarations_is_listed() -> None:
    from bettercompute_cli._groups import client_specs

    listed = {(g["name"], m["name"]) for g in _catalog.load()["groups"] for m in g["methods"]}
    declared = {(spec.name, name) for spec in client_specs() for name in spec.methods}
    assert listed == declared and ("reservations", "create") in listed
