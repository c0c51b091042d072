"""A client command starts light: it builds its commands from the catalog, without the core, IAM, metal, VPS or
SQLAlchemy loaded (the reason for ``bettercompute_cli/catalog.json``). So does ``mcp``, which an agent starts for
every session and which only calls a served control plane."""

from __future__ import annotations

import json
import subprocess
import sys

from bettercompute_cli import _catalog
from tests._timing import deadline

_HEAVY = ("bettercompute._core", "bettercompute_iam", "bettercompute_metal", "bettercompute_vps", "sqlalchemy")


def _modules_after(*argv: str, stdin: str = "") -> tuple[int, str, set[str]]:
    code = (
        "import json, sys, bettercompute_cli\n"
        f"sys.argv = ['better-compute', *{list(argv)!r}]\n"
        "try:\n    bettercompute_cli.main()\nexcept SystemExit as exc:\n    status = exc.code\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\nsys.exit(status)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], input=stdin, capture_output=True, text=True, timeout=deadline(60), check=False
    )
    return ran.returncode, ran.stdout, set(json.loads(ran.stderr.strip().splitlines()[-1]))


def test_a_client_command_starts_without_the_core_or_the_siblings() -> None:
    status, out, modules = _modules_after("reservations", "create", "--help")
    assert status == 0 and "--pool-id" in out and "--idempotency-key" in out
    assert not [name for name in modules if name.startswith(_HEAVY)]


def test_a_usage_error_is_found_from_the_catalog_alone() -> None:
    # A choice field's values come from the catalog: a value outside them is refused before any call.
    choice = next(
        (g["name"], m["name"], f["name"], f["choices"])
        for g in _catalog.load()["groups"]
        for m in g["methods"]
        for f in m["fields"]
        if f["kind"] == "choice"
    )
    group, method, field, choices = choice
    status, _, modules = _modules_after(group, method, f"--{field.replace('_', '-')}", "not-a-choice")
    assert status == 2 and "not-a-choice" not in choices
    assert not [name for name in modules if name.startswith(_HEAVY)]


def test_mcp_serves_stdio_without_the_core_or_the_siblings() -> None:
    # stdin closes at once: the server starts, finds the session over and exits 0, having loaded what serving needs.
    status, _, modules = _modules_after("mcp", "--token", "t", "--server", "http://127.0.0.1:1")
    assert status == 0 and "bettercompute_cli._mcp" in modules and "mcp.server.mcpserver" in modules
    assert not [name for name in modules if name.startswith(_HEAVY)]
