"""The ``better-compute`` entry point, kept light: a client command (``better-compute pools list ...``) loads only
what client commands need, and the server commands (``dev``, ``serve``, ...) load the rest.

The first argument decides: one of ``OWN_COMMANDS`` (or an option, or nothing) goes to the server commands' typer
application; an API group, ``login``, ``logout`` or ``completion`` to the client commands; any other name is looked
up in the server's OpenAPI document (a group of its own modules) and, failing that, is typer's unknown command.
"""

from __future__ import annotations

import os
import re
import sys

from ._constants import COMPLETE_VAR, OWN_COMMANDS

__all__ = ["main"]


def main() -> None:
    """Run ``better-compute`` with ``sys.argv``."""
    argv = sys.argv[1:]
    if os.environ.get(COMPLETE_VAR):
        from ._client import client_root

        client_root(OWN_COMMANDS).main(prog_name="better-compute", complete_var=COMPLETE_VAR)
    if argv and argv[0] == "mcp":  # an agent starts it for every session: it loads no more than it needs
        from ._mcp_command import run_mcp

        run_mcp(argv[1:])
        return
    if argv and argv[0] not in OWN_COMMANDS and not argv[0].startswith("-"):
        from ._client import client_root, run_client, served_group

        commands = client_root(OWN_COMMANDS).commands
        if argv[0] in commands:
            raise SystemExit(run_client(commands[argv[0]], argv[1:]))
        if re.fullmatch(r"[a-z][a-z0-9-]{0,63}", argv[0]):  # a group of the server's own modules, perhaps
            served = served_group(argv[0], argv[1:])
            if served is not None:
                raise SystemExit(run_client(served, argv[1:]))
    from ._app import app

    app(prog_name="better-compute")
