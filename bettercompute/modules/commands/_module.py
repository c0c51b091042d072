"""The ``commands`` module object: its repositories and its two sweepers."""

from __future__ import annotations

from bettercompute._runtime.declarations import StaticModule
from bettercompute._version import __version__
from bettercompute.modules.commands._port import COMMANDS, SESSIONS
from bettercompute.modules.commands._service import COMMAND_SWEEPER, SESSION_SWEEPER

__all__ = ["CommandsModule"]


def CommandsModule() -> StaticModule:
    """The ``commands`` module: commands to node daemons and daemon sessions, with their sweepers (no group of
    methods yet)."""
    return StaticModule(
        name="commands",
        version=__version__,
        core_range=f"=={__version__}",
        jobs=(COMMAND_SWEEPER, SESSION_SWEEPER),
        repositories=(
            COMMANDS,
            SESSIONS,
        ),
    )
