"""What some methods' commands do beyond one call and its printed answer: their own options, a change to the
request before it is sent, and what is done with the answer.

- ``images register --file PATH``: the file's SHA-256 and size, computed here, and its ``file://`` URL.
- ``join-tokens create``: the join command explained (or, with ``--script``, only the install script).
- ``reservations create --wait``: its progress followed until it is bound, ended, or ``--timeout`` passed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click

from ._call import Failed, call_path
from ._output import print_answer
from ._profiles import Connection

__all__ = ["EXTRAS", "WAIT_ENDED", "WAIT_TIMEOUT", "Extra"]

WAIT_ENDED = 12
"""``reservations create --wait``: the reservation failed, was cancelled or ended before it was bound."""
WAIT_TIMEOUT = 13
"""``reservations create --wait``: it was not bound within ``--timeout`` (it stays as it is)."""


@attrs.frozen
class Extra:
    """What a method's command adds: its own options, and what it does with the answer instead of printing it."""

    params: tuple[click.Option, ...]
    finish: Callable[[Connection, Any, str, dict[str, Any]], None]
    prepare: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    """Changes the request body from the command's own options, before the call."""


def _printed(connection: Connection, data: Any, output: str, extras: dict[str, Any]) -> None:
    print_answer(data, output)


def _local_image(body: dict[str, Any], extras: dict[str, Any]) -> None:
    """``images register --file PATH``: the file's SHA-256 and size, computed here, and its ``file://`` URL."""
    path: Path | None = extras["file"]
    if path is None:
        return
    if "url" in body:
        raise click.UsageError("--file: give the image by --file or by --url, not both")
    absolute = path.expanduser().resolve()
    digest = hashlib.sha256()
    size = 0
    try:
        with absolute.open("rb") as source:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise click.UsageError(f"--file: cannot read {path} ({type(exc).__name__})") from None
    for field, value in (("sha256", digest.hexdigest()), ("size", size)):
        if field in body and body[field] != value:
            raise click.UsageError(f"--file: its {field} is {value}, not the {body[field]} given")
        body[field] = value
    body["url"] = absolute.as_uri()


def _join_token_created(connection: Connection, data: Any, output: str, extras: dict[str, Any]) -> None:
    if extras["script"]:
        script = data.get("install_script") if isinstance(data, dict) else None
        if not script:
            raise Failed(
                "FAILED_PRECONDITION",
                "the server gave no install script: its deployment has no node CA and join service "
                f"(the token {data.get('id') if isinstance(data, dict) else ''} was made all the same)",
            )
        click.echo(script, nl=not script.endswith("\n"))
        return
    if output == "json" or not isinstance(data, dict):
        print_answer(data, output)
        return
    uses = data.get("uses_left")
    click.echo(
        f"Join token {data.get('id')} for pool {data.get('pool_id')}: {uses} use{'s' if uses != 1 else ''}, "
        f"until {data.get('expires_at')}."
    )
    click.echo("It is shown once, and the commands below hold it: keep them as secret as the token.")
    click.echo("")
    command = data.get("short_join_command") or data.get("join_command")
    click.echo("On the machine, as root, with bcd installed:")
    click.echo("")
    click.echo(f"    {command}")
    click.echo("")
    if data.get("install_script"):
        click.echo("To install bcd and its service, join and start in one go, make a token with --script and run")
        click.echo("what it prints on the machine as root (for example: ... --script | ssh root@host sh).")


def _wait_for_binding(connection: Connection, data: Any, output: str, extras: dict[str, Any]) -> None:
    if not extras["wait"] or not isinstance(data, dict):
        print_answer(data, output)
        return
    reservation_id = str(data.get("id"))
    timeout = float(extras["timeout"])
    deadline = time.monotonic() + timeout
    shown = 0
    interval = 0.5
    while True:
        history = data.get("history") or []
        for step in history[shown:]:  # every transition, even one that came and went between two looks
            reason = f" ({step['reason']})" if step.get("reason") else ""
            click.echo(f"{step.get('at')}  {reservation_id}: {step.get('state')}{reason}", err=True)
        shown = max(shown, len(history))
        state = data.get("state")
        if state in ("bound", "active"):
            print_answer(data, output)
            return
        if state in ("failed", "cancelled", "ended"):
            print_answer(data, output)
            raise Failed(
                "",
                f"{reservation_id} is {state} and was never bound"
                + (f": {data['reason']}" if data.get("reason") else ""),
                status=WAIT_ENDED,
            )
        if time.monotonic() >= deadline:
            print_answer(data, output)
            raise Failed(
                "",
                f"{reservation_id} is still {state} after {timeout:g} s (it stays; see: better-compute reservations "
                f"get --id {reservation_id})",
                status=WAIT_TIMEOUT,
            )
        time.sleep(min(interval, max(deadline - time.monotonic(), 0.0)))
        interval = min(interval * 1.5, 3.0)
        data = call_path(connection, "reservations/get", {"id": reservation_id})


EXTRAS: dict[tuple[str, str], Extra] = {
    ("images", "register"): Extra(
        params=(
            click.Option(
                ["--file"],
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                default=None,
                help="A local image file: its SHA-256 and size are computed here and it is registered as a file:// "
                "URL (the daemon that boots it reads it at that path, from a directory it serves images from).",
            ),
        ),
        finish=_printed,
        prepare=_local_image,
    ),
    ("join-tokens", "create"): Extra(
        params=(
            click.Option(
                ["--script"],
                is_flag=True,
                default=False,
                help="Print only the install script (run it on the machine as root: it installs bcd, joins, starts).",
            ),
        ),
        finish=_join_token_created,
    ),
    ("reservations", "create"): Extra(
        params=(
            click.Option(
                ["--wait"],
                is_flag=True,
                default=False,
                help=f"Show its progress until it is bound (exit {WAIT_ENDED} if it fails or ends first, "
                f"{WAIT_TIMEOUT} after --timeout).",
            ),
            click.Option(
                ["--timeout"],
                type=click.FloatRange(min=0.0, max=86400.0),
                default=600.0,
                show_default=True,
                help="Seconds --wait waits.",
            ),
        ),
        finish=_wait_for_binding,
    ),
}
"""The methods whose commands do more, by group and name."""
