"""The catalog of the client commands: every API group this command knows, its methods and each method's input
fields as options, kept in ``catalog.json`` next to this file.

A client command (``better-compute pools list ...``) reads the catalog rather than the method declarations, so it
starts without loading the core, its modules and the siblings (about a second of CPU saved on every call). The file
is generated from the declarations (``_groups``), never written by hand:

    python -m bettercompute_cli._catalog           # write catalog.json
    python -m bettercompute_cli._catalog --check   # exit 1, with a diff, when catalog.json is stale

``make docs`` writes it and ``make lint`` checks it, next to the API reference.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import sys
from pathlib import Path
from typing import Any

from ._argv import field_entries

__all__ = ["CATALOG", "build", "check", "load", "main", "render"]

CATALOG = Path(__file__).resolve().with_name("catalog.json")


def build() -> dict[str, Any]:
    """The catalog, from the declarations of the groups the command composes."""
    from ._groups import client_specs  # the declarations load only to write or check the file

    groups = []
    for spec in client_specs():
        methods = [
            {
                "name": method.name,
                "summary": method.summary,
                "mutates": method.mutates,
                "fields": field_entries(method.input),
            }
            for method in spec.methods.values()
        ]
        groups.append({"name": spec.name, "help": (spec.__doc__ or "").strip().split("\n")[0], "methods": methods})
    return {"groups": groups}


def render() -> str:
    return json.dumps(build(), indent=1, ensure_ascii=False) + "\n"


@functools.cache
def load() -> dict[str, Any]:
    """The checked-in catalog."""
    loaded: dict[str, Any] = json.loads(CATALOG.read_text(encoding="utf-8"))
    return loaded


def check() -> int:
    """0 when ``catalog.json`` is what ``render`` writes; else 1, with a diff on stderr."""
    want, have = render(), CATALOG.read_text(encoding="utf-8") if CATALOG.exists() else ""
    if want == have:
        return 0
    diff = difflib.unified_diff(have.splitlines(), want.splitlines(), "checked in", "generated", lineterm="")
    print("\n".join(diff), file=sys.stderr)
    print("bettercompute_cli/catalog.json is stale: run `make docs`", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Write ``catalog.json``, or with ``--check`` compare it with what would be written."""
    parser = argparse.ArgumentParser(prog="python -m bettercompute_cli._catalog", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when catalog.json is stale")
    if parser.parse_args(argv).check:
        return check()
    CATALOG.write_text(render(), encoding="utf-8")
    print(f"wrote {CATALOG.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
