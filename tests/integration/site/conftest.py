"""The site tests' fixtures: the CLI's (a command's environment on this test's schema, long-running commands)."""

from __future__ import annotations

from ..cli.conftest import cli_env, start_cli

__all__ = ["cli_env", "start_cli"]
