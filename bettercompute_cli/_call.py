"""Where a client command's calls go and how they are sent: the connection (``--server``, ``--token``,
``--profile``, the environment, the saved profiles), one ``POST`` per call, and an error answer as ``Failed``.

A call the server shed under load (503, ``Retry-After``) did not run: it is sent again after the server's delay, with
jitter, ``SHED_RETRIES`` times, as the typed client does, and then reported with how many times it was tried.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import click
import httpx

from bettercompute._runtime.shedding import retry_delay

from ._constants import ENDPOINT
from ._output import explain
from ._profiles import DEFAULT_SERVER, Connection, ProfileError, resolve

__all__ = [
    "EXIT_CODES",
    "SHED_RETRIES",
    "Failed",
    "all_pages",
    "argv_connection",
    "call_path",
    "connect",
    "connection_options",
]

EXIT_CODES: Mapping[str, int] = {
    "INVALID_INPUT": 3,
    "UNAUTHENTICATED": 4,
    "ACCESS_DENIED": 5,
    "NOT_FOUND": 6,
    "CONFLICT": 7,
    "FAILED_PRECONDITION": 8,
    "NO_CAPACITY": 9,
    "QUOTA_EXCEEDED": 10,
    "UNAVAILABLE": 11,
}
"""The exit status of a command answered with an error of that code (any other code: 1)."""

SHED_RETRIES = 2
"""How many times a call the server shed under load is sent again (after its ``Retry-After``)."""
_MAX_RETRY_AFTER = 30.0  # longer than this, a shed call is reported rather than waited for
_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


class Failed(click.ClickException):
    """An error answer or an unreachable server: one line on stderr, and its exit status."""

    def __init__(
        self, code: str, message: str, details: dict[str, Any] | None = None, *, status: int | None = None
    ) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.details = details or {}
        self.status = EXIT_CODES.get(code, 1) if status is None else status

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.message}", err=True)
        for line in explain(self.code, self.details):
            click.echo(f"  {line}", err=True)


def call_path(connection: Connection, path: str, body: dict[str, Any], key: str | None = None) -> Any:
    """``POST {server}/api/compute/{path}``: the answer's ``data``, or ``Failed`` with the error's code."""
    headers = {"content-type": "application/json", "accept": "application/json"}
    if connection.token:
        headers["authorization"] = f"Bearer {connection.token}"
    if key:
        headers["idempotency-key"] = key
    server = connection.server
    url = f"{server.rstrip('/')}{ENDPOINT}/{path}"
    for attempt in range(1, SHED_RETRIES + 2):
        try:
            response = httpx.post(url, json=body, headers=headers, timeout=_TIMEOUT)
        except httpx.HTTPError as exc:
            raise Failed("UNAVAILABLE", f"cannot reach {server} ({type(exc).__name__})") from None
        try:
            payload = response.json()
        except ValueError:
            payload = None
        delay = retry_delay(response.status_code, response.headers, payload)
        if delay is None or delay > _MAX_RETRY_AFTER or attempt > SHED_RETRIES:
            break
        time.sleep(delay * (1 + random.random() / 2))  # noqa: S311 - jitter, not a secret
    if isinstance(payload, dict) and response.status_code == 200 and "data" in payload:
        return payload["data"]
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        error = payload["error"]
        details = error.get("details")
        details = dict(details) if isinstance(details, dict) else None
        if details is not None and details.get("reason") == "overloaded":
            details["attempts"] = attempt
        raise Failed(str(error.get("code", "INTERNAL")), str(error.get("message", "")), details)
    raise Failed("UNAVAILABLE", f"the server answered HTTP {response.status_code} without an error envelope")


def all_pages(connection: Connection, path: str, body: dict[str, Any], key: str, *, pages: int = 50) -> list[Any]:
    """Every item of a paged list (at most ``pages`` pages)."""
    items: list[Any] = []
    cursor = None
    for _ in range(pages):
        page = call_path(connection, path, {**body, **({"cursor": cursor} if cursor else {})})
        items += page.get(key, [])
        cursor = page.get("next_cursor")
        if not cursor:
            break
    return items


def connection_options() -> list[click.Option]:
    """``--server``, ``--token`` and ``--profile``, as every command that calls the server takes them."""
    return [
        click.Option(["--server"], default=None, help=f"The control plane's URL [default: {DEFAULT_SERVER}]."),
        click.Option(["--token"], default=None, help="The credential."),
        click.Option(["--profile"], default=None, help="A profile saved by `better-compute login`."),
    ]


def connect(given: dict[str, Any]) -> Connection:
    """The connection for a command's ``--server``/``--token``/``--profile`` (popped), the environment and the
    saved profiles."""
    server, token, profile = given.pop("server"), given.pop("token"), given.pop("profile")
    try:
        return resolve(server=server, token=token, profile=profile, env=os.environ)
    except ProfileError as exc:
        raise click.UsageError(str(exc)) from None


def argv_connection(args: Sequence[str]) -> Connection | None:
    """The connection a command line names (``--server``, ``--token``, ``--profile``, as ``--x v`` or ``--x=v``),
    with the environment and saved profiles; ``None`` when they do not make one."""
    given: dict[str, str | None] = {"server": None, "token": None, "profile": None}
    for index, arg in enumerate(args):
        for name in given:
            if arg == f"--{name}" and index + 1 < len(args):
                given[name] = args[index + 1]
            elif arg.startswith(f"--{name}="):
                given[name] = arg.split("=", 1)[1]
    try:
        return resolve(server=given["server"], token=given["token"], profile=given["profile"], env=os.environ)
    except ProfileError:
        return None
