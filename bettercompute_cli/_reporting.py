"""How the server commands speak to the person running them: an error is one line on stderr and an exit code
(never a traceback, SQL or a connection string), and an address is one they can paste. Light on purpose: ``mcp``
uses it without loading the control plane."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click
import typer

from bettercompute.errors import ComputeError

from ._config import ConfigError

__all__ = ["display_host", "err", "reported"]


def err(message: str) -> None:
    """Print ``message`` on stderr."""
    typer.echo(message, err=True)


def _unwrap(exc: BaseException) -> BaseException:
    """The error worth reporting inside task-group exception groups: ours first, else the first one."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = list(exc.exceptions)
        exc = next((e for e in leaves if isinstance(e, ComputeError | ConfigError)), leaves[0])
    return exc


def _report(exc: BaseException) -> int:
    """Print ``exc`` as one line; return the exit code."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            err(f"error: {problem}")
        return 2
    if isinstance(exc, ComputeError):
        err(f"error: {exc.code}: {exc.message}")
        return 1
    if isinstance(exc, KeyboardInterrupt):
        err("interrupted")
        return 130
    # A bug. Its text and traceback may hold SQL or a connection string, so only its type is shown.
    err(f"error: INTERNAL: an unexpected {type(exc).__name__}; please report it")
    return 1


@contextlib.contextmanager
def reported() -> Iterator[None]:
    """Turn every error into one line on stderr and an exit code."""
    try:
        yield
    except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
        raise
    except (Exception, KeyboardInterrupt, BaseExceptionGroup) as exc:
        raise typer.Exit(_report(_unwrap(exc))) from None


def display_host(host: str) -> str:
    """A host to put in a URL a person pastes: a wildcard address becomes the loopback one."""
    if host in ("0.0.0.0", "", "*"):  # noqa: S104 - comparing, not binding
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
